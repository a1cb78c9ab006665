"""Reusing an optimizer's host buffers from step to step, without ever changing a snapshot.

A variable never writes into an array it has handed out (reads are snapshots). An
optimizer step that computed every new value into freshly allocated arrays would pay for
the allocation, and for fresh pages: numpy arrays of 128 KiB and more come from ``mmap``
or from whichever glibc arena the thread running ``merge_fn`` uses, so each step touched
new memory (measured on the digits MLP: the update's arithmetic took about twice as long
as with ``MALLOC_ARENA_MAX=1``).

:class:`UpdateBuffers` keeps, per variable (and per group of components sharing one host
buffer), a *spare* for the variable and each slot: the buffer the previous step replaced.
A spare is reused only when nothing but this object refers to it: a snapshot taken by a
read (``v.value()``, ``np.asarray(v)``, ...) is a view holding a reference to its buffer,
so a spare that any snapshot still looks at is left alone and a fresh buffer is used
instead. The check is exact (CPython reference counts, taken under the GIL), and a
reader can only ever obtain a view of the *published* buffer, never of a spare.

Scratch buffers (temporaries of the update rule, the summed gradient) are private and
reused every step. Device (cupy) arrays are not reused: cupy's memory pool already makes
allocation cheap.
"""

from __future__ import annotations

import sys

import numpy as np

from towerdist._src.type_aliases import HostArray, TensorLike

__all__ = ["UpdateBuffers"]

# sys.getrefcount of a buffer referenced only by one attribute or dict entry: that
# reference plus getrefcount's own argument.
_ONLY_OURS = 2


class UpdateBuffers:
    """The reusable output and scratch buffers of one variable's update (host arrays only).

    The update rule asks for an output with :meth:`out` (the new value of the variable,
    ``"var"``, or of a slot) and for temporaries with :meth:`scratch`; after the new values
    are published, :meth:`retire` makes the replaced buffers the next step's spares.
    """

    __slots__ = ("_scratch", "_spares")

    def __init__(self) -> None:
        self._spares: dict[str, HostArray] = {}
        self._scratch: dict[str, HostArray] = {}

    def out(self, name: str, like: TensorLike) -> HostArray | None:
        """A private, writable buffer shaped like ``like`` for the new value ``name``."""
        if type(like) is not np.ndarray:
            return None  # device arrays: let the rule allocate (cupy pools its memory)
        spare = self._spares.pop(name, None)
        if (
            spare is not None
            and sys.getrefcount(spare) == _ONLY_OURS  # the local name and the argument: no snapshot
            and spare.shape == like.shape
            and spare.dtype == like.dtype
        ):
            spare.setflags(write=True)
            return spare
        return np.empty_like(like)

    def scratch(self, name: str, like: TensorLike) -> HostArray | None:
        """A private temporary shaped like ``like``, reused every step (None on a device)."""
        if type(like) is not np.ndarray:
            return None
        buffer = self._scratch.get(name)
        if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
            buffer = self._scratch[name] = np.empty_like(like)
        elif not buffer.flags.writeable:  # it was handed out read-only (e.g. as a collective's result)
            if sys.getrefcount(buffer) == _ONLY_OURS + 1:  # the dict entry, the local name, the argument
                buffer.setflags(write=True)
            else:  # a view of it is still alive somewhere
                buffer = self._scratch[name] = np.empty_like(like)
        return buffer

    def retire(self, name: str, replaced: TensorLike) -> None:
        """Keeps ``replaced`` (the buffer a new value of ``name`` replaced) as the next spare.

        Only buffers this object allocated qualify (numpy arrays owning their memory); a
        snapshot may still look at one, which :meth:`out` checks before reusing it.
        """
        if type(replaced) is np.ndarray and replaced.base is None:  # it owns its memory
            self._spares[name] = replaced
