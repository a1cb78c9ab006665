"""Input pieces copied to their GPUs on a stream of the iterator's own, ahead of the step that reads them.

A distributed iterator prepares steps ahead (``InputOptions.experimental_fetch_to_device``):
the host-to-GPU copies of step k+1 are queued while step k computes. They run on a
non-blocking *copy stream* per GPU, so they do not wait behind the step's kernels, and
they are ordered by CUDA events (``cupy_streams``), never by a host wait:

* numeric host arrays go up through pinned (page-locked) staging buffers reused across
  steps (``pinned_staging``): each upload is an asynchronous DMA queued on the copy stream,
  so the host returns at once and the next step's upload overlaps the current step's
  kernels; a staging buffer is written again only after the event recorded after its
  copy has completed;
* before it allocates, the copy stream waits for the calling thread's stream: every step
  before has finished reading the inputs whose memory cupy's pool may now hand back to
  the copy stream (the caller's stream follows the replicas' at the end of each
  ``strategy.run``);
* a "ready" event is recorded after the copies; the thread that takes the step from the
  iterator makes its streams wait for it (:meth:`Placed.hand_out`), and so does the thread
  that calls ``strategy.run`` (:func:`follow_handed_out`); the replicas follow that
  thread's streams at the start of the step.

CPU devices need nothing: host memory serves every CPU replica.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from towerdist._src import backend, nest
from towerdist._src.backend import cupy_backend, cupy_streams
from towerdist._src.backend.pinned_staging import PinnedStaging
from towerdist._src.device import DeviceSpec
from towerdist._src.type_aliases import HostArray, Nest, TensorLike

__all__ = ["DeviceCopier", "Placed", "follow_handed_out", "place_on_device"]


class Placed:
    """One step's pieces, placed on their devices, and the events marking the copies' end."""

    __slots__ = ("copier", "pieces", "ready")

    def __init__(self, pieces: list[Any], ready: cupy_streams.Marks | None, copier: DeviceCopier | None = None) -> None:
        self.pieces = pieces
        self.ready = ready
        self.copier = copier

    def hand_out(self) -> list[Any]:
        """The pieces, once the calling thread's streams are ordered after their copies.

        The copier remembers the marks too: ``strategy.run`` on another thread follows them
        (:func:`follow_handed_out`).
        """
        if self.ready is not None:
            cupy_streams.follow(self.ready)
            if self.copier is not None:
                self.copier.handed_out = self.ready
        return self.pieces


_copiers: weakref.WeakSet[DeviceCopier] = weakref.WeakSet()


def follow_handed_out() -> None:
    """Orders the calling thread's streams after the copies of the latest step each iterator handed out.

    ``strategy.run`` calls it: a step taken from the iterator on one thread may run on
    another, whose streams the hand-out did not order (with a stream per thread). A copy
    stream runs its copies in order, so the latest step's marks cover every earlier one.
    """
    for copier in list(_copiers):
        cupy_streams.follow(copier.handed_out)


class DeviceCopier:
    """Places pieces on their devices, GPU copies on a copy stream per GPU (created on first use)."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}
        self._staging: dict[int, PinnedStaging] = {}
        self.handed_out: cupy_streams.Marks | None = None  # the marks of the latest step handed out
        _copiers.add(self)

    def place(self, pieces: Sequence[Nest], devices: Sequence[DeviceSpec], skip: object) -> Placed:
        """Every piece but ``skip`` on its device (:func:`place_on_device`); GPU pieces through the
        staging buffers, on the copy streams."""
        gpus = sorted({d.device_index for p, d in zip(pieces, devices) if d.device_type == "GPU" and p is not skip})
        if not gpus:
            return Placed([p if p is skip else place_on_device(p, d) for p, d in zip(pieces, devices)], None)
        cuda = cupy_backend.cupy_module().cuda
        caller = cupy_streams.mark(gpus)
        placed = list(pieces)
        points: dict[int, tuple[int, Any]] = {}
        for index in gpus:
            with cuda.Device(index):
                stream = self._streams.get(index)
                if stream is None:
                    stream = self._streams[index] = cuda.Stream(non_blocking=True)
                staging = self._staging.get(index)
                if staging is None:
                    staging = self._staging[index] = PinnedStaging(index)
                with stream:
                    cupy_streams.follow(caller, (index,))  # the copy stream after the caller's (see the module doc)
                    upload = functools.partial(staging.upload, stream=stream)
                    for k, (piece, device) in enumerate(zip(pieces, devices)):
                        if piece is not skip and device.device_type == "GPU" and device.device_index == index:
                            placed[k] = place_on_device(piece, device, upload)
                ready = cupy_streams.record(stream, index)
                staging.uploaded(ready)  # the staging buffers are free again once the copies are done
                points[index] = (int(stream.ptr), ready)
        for k, (piece, device) in enumerate(zip(pieces, devices)):
            if piece is not skip and device.device_type != "GPU":
                placed[k] = place_on_device(piece, device)
        return Placed(placed, cupy_streams.Marks(threading.get_ident(), points), self)


def place_on_device(
    piece: Nest, device: DeviceSpec, upload: Callable[[HostArray], TensorLike] | None = None
) -> Nest:
    """``piece`` (a nest of arrays) with its numeric arrays on ``device``; host memory serves every CPU.

    ``upload``: how a numeric numpy array goes to the GPU (``device_copies`` passes its pinned
    staging, with ``device`` and the copy stream current); default ``to_device``.
    """
    if device.device_type != "GPU":
        return piece  # host memory serves every CPU device
    impl = backend.for_device(device)

    def leaf_on_device(leaf: TensorLike) -> TensorLike:
        if _stays_on_host(leaf):
            return leaf
        if upload is not None and type(leaf) is np.ndarray:
            return upload(leaf)
        return impl.to_device(leaf, device)

    return nest.map_structure(leaf_on_device, piece)


def _stays_on_host(leaf: object) -> bool:
    """Strings, bytes, objects and datetimes stay in host memory (cupy holds numbers only), as in TensorFlow."""
    if isinstance(leaf, (bytes, str)):
        return True
    kind = getattr(getattr(leaf, "dtype", None), "kind", "f")
    return kind in "OSUVMm"
