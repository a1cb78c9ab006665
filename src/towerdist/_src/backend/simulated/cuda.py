"""Simulated CUDA: GPUs, the per-thread current device, streams and events (``cupy.cuda``).

A :class:`Machine` is one simulated host with ``num_gpus`` GPUs. It enforces the rules of
real CUDA that towerdist depends on:

* **The current device is per thread** and starts at 0 in every thread
  (``cupy/cuda/device.pyx``). ``with Device(i):`` switches it for the calling thread only
  and restores it on exit; using a device id that does not exist raises
  :class:`CUDARuntimeError` (``cudaErrorInvalidDevice``), as cupy does.
* **Streams and events.** Kernels run eagerly in the simulation, so a stream only holds
  queued work that cannot run yet: an NCCL collective waiting for the other ranks. ``done``
  and ``synchronize()`` report and wait for that work; ``Event.record`` captures the work
  queued on a stream so far. A wait that real hardware would never finish (a collective
  whose ranks never arrive) raises :class:`SimulatedGPUError` after
  ``Machine.hang_timeout`` seconds instead of hanging.
* **Work on different streams is unordered** (``reference/cupy.md``, "Streams"). Every
  stream counts its operations (kernels, copies, host transfers, NCCL calls), and every
  allocation records its last write (stream, position, operation) and, per stream, its last
  read since (an :class:`~.memory.Access`). Work on stream B that *reads* data last
  written on another stream A, or *writes* data last written or read on another stream A,
  raises :class:`UnorderedAccessError` (read-after-write, write-after-write,
  write-after-read), unless something orders B after that use of A: the host synchronised
  A since (``stream.synchronize()``, ``Device(d).synchronize()``, a blocking ``get``, an event
  recorded after the use and synchronised, or a ``done`` that returned True), or B waited
  for an event recorded on A after the use (``event.record(A)``; ``B.wait_event(event)``,
  transitively). Streams: the legacy null stream (pointer 0) is one stream per device,
  shared by all threads; with ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` each thread's
  default stream (pointer 2) is a stream of its own; every ``Stream()`` is a stream of its
  own. As in CUDA, the legacy null stream is ordered with the blocking streams (all but
  ``non_blocking=True``) of its device, and a copy on it between two devices with the
  blocking streams of both, before and after it ("Peer-to-Peer Memory Copy" in CUDA's
  programming guide); a copy on any other stream (a per-thread default stream included) is
  ordered on its own stream only. Simplifications: the host is one timeline (a synchronisation in one thread orders
  later work of every thread); and only the writes of cupy functions that write an operand
  in place (``out=``, ``x[...] = v``, ``fill``, ``copyto``, ``ufunc.at``...) count as writes of
  that operand.
* **cupy's memory pool reuses freed blocks on their stream** (``cupy/cuda/memory.pyx``: one
  arena per stream): an allocation on stream S that cupy would serve from a block freed in
  S's arena raises :class:`UnorderedAccessError` if another stream used that block and
  nothing orders S after that use (``Machine.allocate``; ``memory`` has the pool).
* **A stream belongs to its device** (``cupy/cuda/stream.pyx``, ``check_stream_device_match``):
  making a stream of GPU X current while GPU Y is current raises ``RuntimeError``. An event
  belongs to the device current when it was made; recording it on a stream of another
  device raises :class:`CUDARuntimeError` (``cudaErrorInvalidResourceHandle``), while a
  stream may wait for an event of any device, as in CUDA.
* **Host synchronisations are counted** per device, call and call site
  (``stats``), since the simulation makes them free.

Each machine has its own ``Device``, ``Stream`` and ``Event`` classes (subclasses bound to
it), so several simulated machines can coexist in one process (tests build their own).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple

import numpy as np

from towerdist._src.backend.simulated.memory import Access, Allocator, Memory
from towerdist._src.backend.simulated.stats import SyncStats

__all__ = [
    "CUDARuntimeError", "Device", "Event", "Machine", "SimulatedGPUError", "Stream", "StreamKey",
    "UnorderedAccessError", "Work",
]  # fmt: skip

HANG_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.001  # how often a wait polls work that completes through the host (NCCL across processes)


class CUDARuntimeError(RuntimeError):
    """A CUDA runtime call failed (cupy's ``cupy_backends.cuda.api.runtime.CUDARuntimeError``)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class SimulatedGPUError(RuntimeError):
    """A rule of real GPUs was broken that real hardware would not report: it would hang or compute garbage."""


class UnorderedAccessError(SimulatedGPUError):
    """Work on one stream touched data another stream wrote or read (or the pool reused it), unordered."""


class StreamKey(NamedTuple):
    """The identity of one simulated stream, for ordering (see ``Machine.check_order``).

    Attributes:
      device: the GPU the stream's work runs on.
      ptr: the stream's pointer (0: the legacy null stream; 2: a per-thread default stream).
      thread: for a per-thread default stream, the thread it belongs to (else "").
      blocking: whether it synchronises with the legacy null stream (not ``non_blocking``).
    """

    device: int
    ptr: int
    thread: str
    blocking: bool

    def describe(self) -> str:
        if self.ptr == 0:
            return f"the legacy null stream of GPU {self.device}"
        if self.ptr == 2:
            return f"the per-thread default stream of thread {self.thread} on GPU {self.device}"
        return f"stream 0x{self.ptr:x} on GPU {self.device}"


Clock = dict[StreamKey, int]
"""For each stream, the position (operation count) on it that something is ordered after."""


class Work:
    """Queued device work that has not run yet (a collective waiting for other ranks).

    Attributes:
      done: whether it has completed.
      describe: a function naming the work and what it waits for, for hang messages.
      memories: the allocations it uses (kept alive until it completes).
      poll: for work that completes through the host (NCCL across processes), a function
        that completes it if it can; waits call it every ``POLL_SECONDS`` with the machine's
        condition held. None: the work is completed by another thread, which notifies.
    """

    def __init__(
        self, describe: Callable[[], str], memories: Iterable[Memory] = (), poll: Callable[[], None] | None = None
    ) -> None:
        self.done = False
        self.describe = describe
        self.memories = list(memories)
        self.poll = poll


class Machine:
    """One simulated host with ``num_gpus`` GPUs: devices, threads' current devices, queued work.

    Attributes:
      num_gpus: the number of simulated GPUs.
      allocator: the simulated device memory.
      hang_timeout: seconds a wait may last before it is reported as a hang.
      stats: the counts of host synchronisations.
      Device, Stream, Event: this machine's classes (``cupy.cuda.Device`` ...).
    """

    def __init__(self, num_gpus: int) -> None:
        if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 1:
            raise ValueError(f"A simulated machine needs at least one GPU. Got num_gpus={num_gpus!r}.")
        self.num_gpus = num_gpus
        self.allocator = Allocator()
        self.hang_timeout = HANG_TIMEOUT_SECONDS
        self.stats = SyncStats(num_gpus)
        self.condition = threading.Condition()  # guards queued work; notified when work completes
        self._queued: dict[tuple[int, int], list[Work]] = {}  # (device, stream ptr) -> queued work
        self._local = threading.local()
        self._handles = itertools.count(0x5000)
        self.streams: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
        self.Device: type[Device] = type("Device", (Device,), {"_machine": self, "__module__": __name__})
        self.Event: type[Event] = type("Event", (Event,), {"_machine": self, "__module__": __name__})
        stream: type[Stream] = type("Stream", (Stream,), {"_machine": self, "__module__": __name__})
        stream.null = stream(null=True)
        stream.ptds = stream(ptds=True)
        self.Stream = stream
        self.ndarray: type[Any] | None = None  # set by array.array_type()
        # Ordering between streams (guarded by ``condition``): operations per stream, what each
        # stream waited for (events), and what the host waited for (synchronisations).
        self._seq: dict[StreamKey, int] = {}
        self._clocks: dict[StreamKey, Clock] = {}
        self._host_clock: Clock = {}
        self._threads = itertools.count(1)

    # --- devices -------------------------------------------------------------------------

    def current_device(self) -> int:
        """The calling thread's current device (0 until the thread sets another)."""
        return int(getattr(self._local, "device", 0))

    def set_device(self, device_id: int) -> None:
        """Makes ``device_id`` current for the calling thread (``cudaSetDevice``)."""
        self.check_device(device_id)
        self._local.device = device_id

    def check_device(self, device_id: int) -> None:
        """Raises like CUDA for a device id this machine does not have."""
        if not 0 <= device_id < self.num_gpus:
            raise CUDARuntimeError(
                "cudaErrorInvalidDevice",
                f"invalid device ordinal (simulated GPU: device {device_id} does not exist; "
                f"the simulation has {self.num_gpus} GPUs, 0 to {self.num_gpus - 1})",
            )

    def push_device(self, device_id: int) -> None:
        stack = self._thread_list("device_stack")
        previous = self.current_device()
        self.set_device(device_id)
        stack.append(previous)
        if previous != device_id:
            self.stats.count_work("device_switches")  # cupy calls cudaSetDevice only for another device

    def pop_device(self) -> None:
        previous = self.current_device()
        self._local.device = self._thread_list("device_stack").pop()
        if previous != self._local.device:
            self.stats.count_work("device_switches")

    # --- streams -------------------------------------------------------------------------

    def new_handle(self) -> int:
        """A fresh fake handle (stream and event pointers)."""
        return next(self._handles) * 0x100

    def current_stream(self, device_id: int | None = None) -> Stream:
        """The calling thread's current stream on ``device_id`` (default: the current device)."""
        device = self.current_device() if device_id is None or device_id < 0 else device_id
        streams: dict[int, Stream] = self._thread_dict("streams")
        if device in streams:
            return streams[device]
        per_thread = os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
        return self.Stream.ptds if per_thread else self.Stream.null

    def set_current_stream(self, stream: Stream, check: bool = True) -> Stream:
        """Makes ``stream`` current on its device for the calling thread; returns the previous one.

        Raises:
          RuntimeError: ``stream`` belongs to another device than the current one (``check``).
        """
        current = self.current_device()
        if check and stream.device_id >= 0 and stream.device_id != current:
            raise RuntimeError(
                f"The device that the stream is created on ({stream.device_id}) does not match with the current "
                f"device ({current}) (simulated GPU: {stream!r} belongs to GPU {stream.device_id}, as every cupy "
                f"stream belongs to the device current when it was made; enter cupy.cuda.Device({stream.device_id}) "
                f"before `with stream:` or stream.use(), or make a stream under cupy.cuda.Device({current}).)"
            )
        device = stream.device_for_work()
        previous = self.current_stream(device)
        self._thread_dict("streams")[device] = stream
        return previous

    # --- ordering between streams ----------------------------------------------------------

    def stream_key(self, stream: Stream | None = None, device_id: int | None = None) -> StreamKey:
        """The identity of ``stream`` (default: the calling thread's current stream of ``device_id``).

        A default stream (null or per-thread) belongs to ``device_id`` if given, else to the
        current device; a per-thread default stream is the calling thread's.
        """
        stream = self.current_stream(device_id) if stream is None else stream
        if stream.device_id >= 0:
            device = stream.device_id
        else:
            device = self.current_device() if device_id is None or device_id < 0 else device_id
        return self.key_for_ptr(device, stream.ptr)

    def key_for_ptr(self, device_id: int, ptr: int) -> StreamKey:
        """The identity of the stream with pointer ``ptr`` on ``device_id``, seen from the calling thread."""
        if ptr == 0:
            return StreamKey(device_id, 0, "", True)
        if ptr == 2:
            return StreamKey(device_id, 2, self._thread_tag(), True)
        stream = self.streams.get(ptr)
        return StreamKey(device_id, ptr, "", stream is None or not stream.non_blocking)

    def check_order(self, key: StreamKey, memories: Iterable[Memory], what: str, writes: Iterable[Memory] = ()) -> None:
        """Raises :class:`UnorderedAccessError` unless work on ``key`` may touch ``memories`` now.

        Work on stream B may read data last written on stream A (A != B), and write data last
        written or read on A, only if something orders it after that use of A: the host
        synchronised A since (``synchronize``), or B waited for an event recorded on A since
        (``wait_event``), or one of them is the legacy null stream and both are blocking
        streams (CUDA's implicit synchronisation). ``writes`` are the memories among
        ``memories`` that the work writes; the others it reads.
        """
        written = {id(m) for m in writes}
        with self.condition:
            for memory in memories:
                access = memory.access
                writer = access.writer
                if memory.size == 0:
                    continue
                kind = "write" if id(memory) in written else "read"
                device = memory.device_id
                if writer is not None and writer != key and not self._ordered(writer, access.write_seq, key, device):
                    raise UnorderedAccessError(
                        f"unordered {kind} on {key.describe()} of data written on {writer.describe()}: {what} "
                        f"touches {memory!r}, last written by {access.written_by} on the other stream, and nothing "
                        "orders the two. (simulated GPU: work on different streams is unordered; record an Event "
                        "on the producer's stream and wait for it (event.record(producer); "
                        "consumer.wait_event(event)), or synchronize (stream.synchronize(), "
                        "cupy.cuda.Device(i).synchronize()) before using the data on another stream.)"
                    )
                if kind == "read":
                    continue
                for reader, (seq, read_by) in access.reads.items():
                    if reader != key and not self._ordered(reader, seq, key, device):
                        raise UnorderedAccessError(
                            f"unordered write on {key.describe()} of data read on {reader.describe()} "
                            f"(write-after-read): {what} writes {memory!r}, last read by {read_by} on the other "
                            "stream, and nothing orders the two, so the write may land before the read. "
                            "(simulated GPU: work on different streams is unordered; after the read, record an "
                            "Event on the reader's stream and make the writer wait for it (event.record(reader); "
                            "writer.wait_event(event)), or synchronize the reader's stream before writing.)"
                        )

    def mark_accessed(
        self, key: StreamKey, memories: Iterable[Memory], what: str, writes: Iterable[Memory] = ()
    ) -> None:
        """Records that one operation ``what`` on stream ``key`` reads ``memories`` and writes ``writes`` among them."""
        written = {id(m) for m in writes}
        with self.condition:
            seq = self._seq[key] = self._seq.get(key, 0) + 1
            for memory in memories:
                if not memory.size:
                    continue
                access = memory.access
                if id(memory) in written:
                    # Whatever is ordered after this write is ordered after the reads it was checked
                    # to follow (clocks are transitive), so those reads need no more checks.
                    access.writer, access.write_seq, access.written_by = key, seq, what
                    access.reads.clear()
                else:
                    access.reads[key] = (seq, what)

    def mark_written(self, key: StreamKey, memories: Iterable[Memory], what: str) -> None:
        """Records that work on stream ``key`` (the operation ``what``) writes ``memories``."""
        memories = list(memories)
        self.mark_accessed(key, memories, what, writes=memories)

    # --- allocation (cupy's memory pool) -----------------------------------------------------

    def allocate(self, host: np.ndarray, device_id: int, what: str, written: bool = True) -> Memory:
        """Adopts ``host`` as a new allocation on ``device_id``, from the calling thread's current stream's arena.

        If cupy's pool would hand the allocation a block freed in that arena, the block's uses
        by other streams must be ordered before the stream (:meth:`check_reuse`). ``written``:
        the operation ``what`` writes the new memory (a kernel's output, an upload), on that
        stream.
        """
        key = self.stream_key(device_id=device_id)
        if host.nbytes:
            block = self.allocator.take_freed(key, int(host.nbytes))
            if block is not None:
                try:
                    self.check_reuse(key, block, what)
                except UnorderedAccessError:
                    self.allocator.give_back(block)
                    raise
        memory = self.allocator.adopt(host, device_id, key)
        if written:
            self.mark_written(key, [memory], what)
        return memory

    def check_reuse(self, key: StreamKey, block: Access, what: str) -> None:
        """Raises :class:`UnorderedAccessError` unless every use of the freed ``block`` by another stream is ordered before ``key``."""
        with self.condition:
            for stream, seq, used_by in block.uses():
                if stream == key or self._ordered(stream, seq, key, block.device_id):
                    continue
                raise UnorderedAccessError(
                    f"unordered reuse of freed memory on {key.describe()}: memory last used by {used_by} on "
                    f"{stream.describe()} was freed, and cupy's memory pool handed it ({block.describe()}) to a new "
                    f"allocation by {what} on {key.describe()}, while the work on {stream.describe()} may still use "
                    "it. (simulated GPU: cupy's pool keeps one arena per stream and gives a freed block straight to "
                    "the next allocation on the stream that allocated it (cupy/cuda/memory.pyx). Keep the array "
                    "referenced until the other stream's work has completed (e.g. until an event recorded on that "
                    "stream after the use is done), or make the allocating stream wait for such an event "
                    "(stream.wait_event(event)) before allocating.)"
                )

    def stream_clock(self, key: StreamKey) -> Clock:
        """What work queued on ``key`` so far is ordered after: its own writes and what it waited for."""
        with self.condition:
            return {**self._clocks.get(key, {}), key: self._seq.get(key, 0)}

    def stream_waits(self, key: StreamKey, clock: Clock) -> None:
        """Orders later work on ``key`` after ``clock`` (``wait_event``)."""
        with self.condition:
            _merge(self._clocks.setdefault(key, {}), clock)

    def host_waited(self, clock: Clock) -> None:
        """The host has waited for ``clock``: later work on every stream is ordered after it."""
        with self.condition:
            _merge(self._host_clock, clock)

    def stream_synchronized(self, key: StreamKey) -> None:
        """The host has waited for all work queued on ``key``."""
        self.host_waited(self.stream_clock(key))

    def device_synchronized(self, device_id: int) -> None:
        """The host has waited for all work queued on ``device_id``, on every stream."""
        with self.condition:
            for key in [k for k in {*self._seq, *self._clocks} if k.device == device_id]:
                self.stream_synchronized(key)

    def _ordered(self, earlier: StreamKey, seq: int, key: StreamKey, device: int) -> bool:
        """Whether work on ``key`` now is ordered after operation ``seq`` of stream ``earlier``.

        ``device`` is the GPU whose memory both touch (a stream of another GPU touches it only
        through a copy between devices).
        """
        if self._host_clock.get(earlier, 0) >= seq or self._clocks.get(key, {}).get(earlier, 0) >= seq:
            return True
        if not (earlier.blocking and key.blocking):
            return False
        # CUDA's legacy null stream waits for, and is waited for by, the blocking streams of its
        # device. A copy on it between two devices' memories starts after the earlier work of
        # both devices and finishes before their later work (CUDA C++ Programming Guide,
        # "Peer-to-Peer Memory Copy"); a copy on any other stream is ordered on its stream only.
        if earlier.device == key.device:
            return key.ptr == 0 or earlier.ptr == 0
        later_is_null_copy = key.ptr == 0 and key.device != device
        earlier_was_null_copy = earlier.ptr == 0 and earlier.device != device
        return later_is_null_copy or earlier_was_null_copy

    def _thread_tag(self) -> str:
        tag: str | None = getattr(self._local, "tag", None)
        if tag is None:
            tag = self._local.tag = f"{threading.current_thread().name!r} (#{next(self._threads)})"
        return tag

    # --- queued work ---------------------------------------------------------------------

    def enqueue(self, device_id: int, stream_ptr: int, work: Work) -> None:
        """Queues ``work`` on a stream (the caller holds ``condition``)."""
        self._queued.setdefault((device_id, stream_ptr), []).append(work)
        for memory in work.memories:
            memory.pending += 1

    def complete(self, work: Work) -> None:
        """Marks ``work`` done and wakes its waiters (the caller holds ``condition``)."""
        if work.done:
            return
        work.done = True
        for memory in work.memories:
            memory.pending -= 1
        for key, queue in list(self._queued.items()):
            if work in queue:
                queue.remove(work)
                if not queue:
                    del self._queued[key]
        self.condition.notify_all()

    def queued(self, device_id: int, stream_ptr: int | None = None, poll: bool = False) -> list[Work]:
        """The work still queued on one stream of a device (or on all its streams).

        ``poll``: first let work that completes through the host complete if it can.
        """
        with self.condition:
            works = [
                work
                for (device, ptr), queue in self._queued.items()
                if device == device_id and (stream_ptr is None or ptr == stream_ptr)
                for work in queue
            ]
            return self._poll(works) if poll else works

    def wait(self, works: list[Work], what: str) -> None:
        """Waits until ``works`` are done; raises :class:`SimulatedGPUError` where real hardware would hang.

        Work completed by another thread wakes the wait; work that completes through the host
        (``Work.poll``) is polled every ``POLL_SECONDS``.
        """
        deadline = time.monotonic() + self.hang_timeout
        with self.condition:
            while True:
                pending = self._poll(works)
                if not pending:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting = "; ".join(work.describe() for work in pending)
                    raise SimulatedGPUError(
                        f"{what} would hang on a real GPU (simulated GPU: still waiting after "
                        f"{self.hang_timeout:g} s for {waiting})."
                    )
                polled = any(work.poll is not None for work in pending)
                self.condition.wait(min(left, POLL_SECONDS) if polled else left)

    def wait_for_memory(self, memories: Iterable[Memory], what: str) -> None:
        """Waits for queued collectives that use ``memories`` (work on a stream runs in order)."""
        busy = [memory for memory in memories if memory.pending]
        if not busy:
            return
        with self.condition:
            works = [work for queue in self._queued.values() for work in queue if any(m in work.memories for m in busy)]
        self.wait(works, what)

    def _poll(self, works: list[Work]) -> list[Work]:
        """Polls the pollable ``works``; returns those not done (the caller holds ``condition``)."""
        for work in works:
            if not work.done and work.poll is not None:
                work.poll()
        return [work for work in works if not work.done]

    # --- helpers -------------------------------------------------------------------------

    def _thread_list(self, name: str) -> list[Any]:
        value: list[Any] | None = getattr(self._local, name, None)
        if value is None:
            value = []
            setattr(self._local, name, value)
        return value

    def _thread_dict(self, name: str) -> dict[Any, Any]:
        value: dict[Any, Any] | None = getattr(self._local, name, None)
        if value is None:
            value = {}
            setattr(self._local, name, value)
        return value


class Device:
    """A simulated GPU (``cupy.cuda.Device``); a context manager making it current for this thread.

    Args:
      device: the device id; None means the calling thread's current device.
    """

    _machine: ClassVar[Machine]

    def __init__(self, device: int | None = None) -> None:
        self.id = self._machine.current_device() if device is None else int(device)

    def __enter__(self) -> Device:
        self._machine.push_device(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        self._machine.pop_device()

    def use(self) -> None:
        """Makes this device current for the calling thread."""
        self._machine.set_device(self.id)

    def synchronize(self) -> None:
        """Waits for all queued work of this device, on every stream (a counted host synchronisation)."""
        self._synchronize("Device.synchronize")

    def _synchronize(self, call: str) -> None:
        machine = self._machine
        machine.check_device(self.id)
        machine.stats.count_sync(self.id, call)
        machine.wait(machine.queued(self.id), f"Device({self.id}).synchronize()")
        machine.device_synchronized(self.id)

    @property
    def compute_capability(self) -> str:
        """A plausible compute capability ('80'); the simulation has no real one."""
        return "80"

    def __int__(self) -> int:
        return self.id

    def __index__(self) -> int:
        return self.id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("simulated GPU", self.id))

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id} (simulated GPU)>"


class Stream:
    """A simulated CUDA stream (``cupy.cuda.Stream``), created on the current device.

    Args:
      null: the legacy default stream (``Stream.null``, pointer 0).
      non_blocking: whether it does not synchronise with the legacy default stream.
      ptds: the per-thread default stream (``Stream.ptds``, pointer 2).
    """

    _machine: ClassVar[Machine]
    null: ClassVar[Stream]
    ptds: ClassVar[Stream]

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False) -> None:
        if null and ptds:
            raise ValueError("A stream cannot be both the null stream and the per-thread default stream.")
        self.non_blocking = non_blocking
        if null or ptds:
            self.ptr = 0 if null else 2
            self.device_id = -1  # the default stream of whichever device is current
        else:
            self.ptr = self._machine.new_handle()
            self.device_id = self._machine.current_device()
            self._machine.streams[self.ptr] = self

    def device_for_work(self) -> int:
        """The device this stream's work runs on (the current device for the default streams)."""
        return self.device_id if self.device_id >= 0 else self._machine.current_device()

    @property
    def done(self) -> bool:
        """True if all work queued on this stream has completed (then later work is ordered after it)."""
        machine = self._machine
        device = self.device_for_work()
        machine.stats.count_query(device)
        done = not machine.queued(device, self.ptr, poll=True)
        if done:
            machine.stream_synchronized(machine.stream_key(self))
        return done

    def synchronize(self) -> None:
        """Waits until all work queued on this stream has completed (a counted host synchronisation)."""
        machine = self._machine
        device = self.device_for_work()
        machine.stats.count_sync(device, "Stream.synchronize")
        machine.wait(machine.queued(device, self.ptr), f"{self!r}.synchronize()")
        machine.stream_synchronized(machine.stream_key(self))

    def record(self, event: Event | None = None) -> Event:
        """Records ``event`` (a new one if None) on this stream and returns it."""
        event = self._machine.Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """Orders later work on this stream after ``event`` (work runs eagerly in the simulation)."""
        if not isinstance(event, Event):
            raise TypeError(f"wait_event() needs a cupy.cuda.Event. Got {type(event).__name__}.")
        self._machine.stats.count_work("event_waits")
        self._machine.stream_waits(self._machine.stream_key(self), event._clock)

    def use(self) -> Stream:
        """Makes this stream current on its device for the calling thread.

        Raises:
          RuntimeError: the stream belongs to another device than the current one.
        """
        self._machine.set_current_stream(self)
        return self

    def __enter__(self) -> Stream:
        self._machine._thread_list("stream_stack").append(self._machine.set_current_stream(self))
        return self

    def __exit__(self, *exc: object) -> None:
        self._machine.set_current_stream(self._machine._thread_list("stream_stack").pop(), check=False)

    def __repr__(self) -> str:
        kind = "null" if self.ptr == 0 else "per-thread default" if self.ptr == 2 else f"0x{self.ptr:x}"
        where = "current device" if self.device_id < 0 else f"GPU {self.device_id}"
        return f"<simulated CUDA Stream {kind} on {where}>"


class Event:
    """A simulated CUDA event (``cupy.cuda.Event``): marks the work queued on a stream so far.

    It belongs to the device current when it is made.
    """

    _machine: ClassVar[Machine]

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self._machine.stats.count_work("events_created")
        self.ptr = self._machine.new_handle()
        self.device_id = self._machine.current_device()
        self._works: list[Work] = []
        self._clock: Clock = {}  # what the recorded work is ordered after (its stream's operations so far)

    def record(self, stream: Stream | None = None) -> None:
        """Captures the work queued so far on ``stream`` (default: the current stream).

        Raises:
          CUDARuntimeError: ``stream`` belongs to another device than the event
            (``cudaErrorInvalidResourceHandle``, as ``cudaEventRecord``).
        """
        machine = self._machine
        machine.stats.count_work("event_records")
        stream = machine.current_stream() if stream is None else stream
        device = stream.device_for_work()
        if device != self.device_id:
            raise CUDARuntimeError(
                "cudaErrorInvalidResourceHandle",
                f"invalid resource handle (simulated GPU: {self!r} was made on GPU {self.device_id} and recorded on "
                f"{machine.stream_key(stream).describe()}; CUDA records an event only on a stream of the event's "
                f"device. Make the event while GPU {device} is current (e.g. under cupy.cuda.Device({device}), or "
                "with stream.record()); another device's stream may still wait for it.)",
            )
        self._works = machine.queued(device, stream.ptr)
        self._clock = machine.stream_clock(machine.stream_key(stream))

    @property
    def done(self) -> bool:
        """True if the work captured by the last ``record`` has completed (then later work is ordered after it)."""
        machine = self._machine
        machine.stats.count_query(self.device_id)
        with machine.condition:
            done = not machine._poll(self._works)
        if done:
            machine.host_waited(self._clock)
        return done

    def synchronize(self) -> None:
        """Waits for the work captured by the last ``record`` (a counted host synchronisation)."""
        self._machine.stats.count_sync(self.device_id, "Event.synchronize")
        self._machine.wait(self._works, "Event.synchronize()")
        self._machine.host_waited(self._clock)

    def __repr__(self) -> str:
        return f"<simulated CUDA Event 0x{self.ptr:x} of GPU {self.device_id}>"


def _merge(into: Clock, clock: Clock) -> None:
    for key, seq in clock.items():
        if seq > into.get(key, 0):
            into[key] = seq
