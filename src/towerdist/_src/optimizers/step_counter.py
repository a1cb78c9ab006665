"""The optimizer's step count, kept on the host and mirrored into ``iterations``.

Reading ``iterations`` every step would copy a scalar back from a device; instead the
count is an integer on the host, trusted while ``iterations`` still holds the array the
optimizer wrote last. Any other write (``assign``, a checkpoint restore) replaces that
array, and the next read takes the count from the variable once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from towerdist._src import backend
from towerdist._src.optimizers.update_plan import components
from towerdist._src.variables.variable import Variable

__all__ = ["HostStep"]

_HOST = backend.host()


class HostStep:
    """The number of steps applied, on the host, and the array it was last written as."""

    __slots__ = ("_count", "_every", "_written")

    def __init__(self) -> None:
        self._count = 0
        self._written: Any = None  # the array of ``iterations``'s first component last written here
        self._every: tuple[Any, ...] = ()  # the arrays of all its components last written here

    def read(self, iterations: Variable | None) -> int:
        """The number of steps applied so far, without reading a device (unless another wrote it)."""
        if iterations is None:
            return 0
        if self._written is None or components(iterations)[0]._array is not self._written:
            self._count = int(np.asarray(_HOST.to_device(iterations.numpy(), None)))
            self._written = None
        return self._count

    def advance(self, iterations: Variable, step: int) -> None:
        """Sets ``iterations`` to ``step`` on every device it lives on (no read-back).

        A GPU copy that still holds the previous step, as written here, is incremented by a
        kernel on its GPU: an upload of the new count would be a host-to-device copy every
        step (from pageable memory, one that can make the host wait for the GPU's queue).
        """
        members = components(iterations)
        every = self._every
        incremented = step == self._count + 1 and len(every) == len(members)
        host: Any = None
        for k, component in enumerate(members):
            impl = component._impl
            if impl is _HOST:  # host copies share one read-only array
                if host is None:
                    host = np.array(step, np.int64)
                    host.setflags(write=False)
                array = host
            elif incremented and component._array is every[k]:
                with impl.on_array_device(every[k]):
                    array = impl.freeze(every[k] + 1)
            else:
                array = impl.freeze(impl.asarray(np.int64(step), device=component._device))
            component._adopt(array)
        self._count = step
        self._written = members[0]._array
        self._every = tuple(component._array for component in members)
