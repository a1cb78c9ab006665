"""Ordering GPU work across threads and streams with CUDA events, without blocking the host.

Each thread launches cupy work on its *current stream* of each GPU: by default the legacy
null stream (one per GPU, shared by every thread, so work of all threads is ordered on
it), or with ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` a stream per thread, or whatever
stream the user made current. Work on different streams is unordered: where data produced
on one stream is used on another (a replica's gradients read by the thread that runs the
merge, an NCCL collective on towerdist's own stream, an input copy made on a copy stream),
the consumer's stream must wait for an event recorded on the producer's stream after the
producing work. The host never waits for the GPU here; it blocks only where it reads a
value (``.get()``).

* :func:`mark` records, on the calling thread, where its streams of some GPUs stand;
  :func:`follow` makes the calling thread's streams wait for such a mark. Nothing is
  recorded for the legacy null stream: CUDA orders it with every blocking stream of its
  GPU, so a consumer on the null stream or on a per-thread default stream needs nothing;
  any other consumer stream waits for an event recorded then on the null stream (which
  covers everything launched on it before).
* :func:`wait_for_stream` orders one stream after another of the same GPU (the NCCL and
  copy streams after the calling thread's stream, and back).
* :func:`keep_alive` holds arrays until work on another stream that uses them has
  finished: cupy's memory pool hands a freed block straight back to the stream that
  allocated it, whose next allocation could overwrite it while the other stream still
  reads it. Entries are released once their event has completed (checked with
  non-blocking queries whenever one is added, and at the end of every multi-GPU step).

Everything here runs on the calling thread, in any context; it is a no-op for devices
that are not GPUs. cupy is imported only through ``cupy_backend``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from towerdist._src.backend import cupy_backend
from towerdist._src.backend.gpu_module import GpuArray

__all__ = ["CudaEvent", "CudaStream", "Marks", "follow", "keep_alive", "mark", "record", "release_finished", "wait_for_stream"]

class CudaStream(Protocol):
    """What is used of a CUDA stream (``cupy.cuda.Stream``, or a simulated GPU's)."""

    @property
    def ptr(self) -> int: ...

    def wait_event(self, event: CudaEvent) -> None: ...


class CudaEvent(Protocol):
    """What is used of a CUDA event (``cupy.cuda.Event``, or a simulated GPU's)."""

    @property
    def done(self) -> bool: ...

    def synchronize(self) -> None: ...


_LEGACY = 0  # the legacy null stream's pointer, as cupy passes it
_PER_THREAD = 2  # cudaStreamPerThread: every thread's own default stream (a blocking stream)


class Marks:
    """Where one thread's current streams of some GPUs stood when :func:`mark` was called.

    Attributes:
      thread: the id of the thread that recorded the marks.
      points: GPU index -> ``(stream pointer, event)``; the event is None for the legacy
        null stream (nothing to record: CUDA orders it with the blocking streams).
    """

    __slots__ = ("points", "thread")

    def __init__(self, thread: int, points: dict[int, tuple[int, CudaEvent | None]]) -> None:
        self.thread = thread
        self.points = points

    def __repr__(self) -> str:
        where = ", ".join(f"GPU {d}: {'null stream' if e is None else f'stream 0x{p:x}'}" for d, (p, e) in self.points.items())
        return f"<Marks of thread {self.thread}: {where}>"


def mark(device_ids: Iterable[int], own: int | None = None) -> Marks:
    """Records where the calling thread's current stream of each GPU in ``device_ids`` stands.

    A stream with nothing left to run needs no mark (whatever it ran has finished), except
    on ``own`` (a replica's GPU), where a mark is recorded without asking: a thread has
    work there almost always, and the query would cost as much as the event.
    """
    cupy = cupy_backend.cupy_module()
    cuda = cupy.cuda
    points: dict[int, tuple[int, CudaEvent | None]] = {}
    for device_id in device_ids:
        stream = cuda.get_current_stream(device_id)
        ptr = int(stream.ptr)
        if ptr == _LEGACY:
            points[device_id] = (ptr, None)
            continue
        with cuda.Device(device_id):
            if device_id != own and stream.done:
                continue
            event = cuda.Event(disable_timing=True)
            event.record(stream)
        points[device_id] = (ptr, event)
    return Marks(threading.get_ident(), points)


def follow(marks: Marks | None, device_ids: Iterable[int] | None = None) -> None:
    """Makes the calling thread's current streams wait for ``marks`` (of ``device_ids``, default all).

    Nothing is waited for where the two are the same stream (the legacy null stream, or the
    same thread's stream), or where CUDA already orders them.
    """
    if marks is None:
        return
    cuda = cupy_backend.cupy_module().cuda
    same_thread = marks.thread == threading.get_ident()
    points = marks.points
    for device_id in points if device_ids is None else device_ids:
        point = points.get(device_id)
        if point is None:
            continue
        ptr, event = point
        stream = cuda.get_current_stream(device_id)
        mine = int(stream.ptr)
        if event is None:  # the producer used the legacy null stream
            if mine in (_LEGACY, _PER_THREAD):
                continue  # the null stream itself, or a blocking stream CUDA orders after it
            with cuda.Device(device_id):
                event = cuda.Event(disable_timing=True)
                event.record(cuda.Stream.null)
        elif mine == ptr and (same_thread or ptr != _PER_THREAD):
            continue  # the very stream that recorded the mark
        with cuda.Device(device_id):
            stream.wait_event(event)


def record(stream: CudaStream, device_id: int) -> CudaEvent:
    """A new event recorded on ``stream`` (a stream of GPU ``device_id``) after the work queued so far."""
    cuda = cupy_backend.cupy_module().cuda
    with cuda.Device(device_id):
        event = cuda.Event(disable_timing=True)
        event.record(stream)
    recorded: CudaEvent = event
    return recorded


def wait_for_stream(consumer: CudaStream, consumer_device: int, producer: CudaStream, producer_device: int) -> CudaEvent | None:
    """Orders later work on ``consumer`` (a stream of GPU ``consumer_device``) after the work queued so far on
    ``producer`` (a stream of GPU ``producer_device``; the GPUs may differ).

    Returns the event recorded on ``producer``, or None when the two are one stream.
    """
    if consumer_device == producer_device and int(consumer.ptr) == int(producer.ptr):
        return None  # one stream (seen from the calling thread, a per-thread stream is its own)
    event = record(producer, producer_device)
    with cupy_backend.cupy_module().cuda.Device(consumer_device):  # a default stream means the current GPU's
        consumer.wait_event(event)
    return event


class _Held:
    """Arrays kept referenced until events complete (see :func:`keep_alive`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: collections.deque[tuple[CudaEvent, Sequence[GpuArray]]] = collections.deque()

    def add(self, event: CudaEvent, arrays: Sequence[GpuArray]) -> None:
        with self._lock:
            self._entries.append((event, arrays))
            self._release_finished(_SWEEP)

    def release_finished(self) -> int:
        """Lets go of every entry whose event has completed; returns how many are still held."""
        with self._lock:
            self._release_finished(len(self._entries))
            return len(self._entries)

    def _release_finished(self, looks: int) -> None:
        # Events complete in the order their streams run, not in the order they were added:
        # look at up to ``looks`` entries from the front, keeping those still running.
        entries = self._entries
        for _ in range(min(len(entries), looks)):
            event, arrays = entries[0]
            if event.done:
                entries.popleft()
            else:
                entries.rotate(-1)


_SWEEP = 8  # entries looked at each time one is added: the list stays short without scanning it all
_held = _Held()


def keep_alive(event: CudaEvent, arrays: Sequence[GpuArray]) -> None:
    """Keeps ``arrays`` referenced until ``event`` has completed.

    Use it when arrays allocated on one stream are read or written by work on another
    stream that the allocating stream is not ordered after: cupy's pool would otherwise
    hand their memory to the allocating stream's next allocation while that work runs.
    The arrays are let go at the next ``keep_alive`` or :func:`release_finished` after the
    event completed (the end of every multi-GPU ``strategy.run`` sweeps).
    """
    if arrays:
        _held.add(event, list(arrays))


def release_finished() -> int:
    """Lets go of the arrays whose events have completed; returns how many groups are still held."""
    return _held.release_finished()
