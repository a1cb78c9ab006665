"""Simulated GPU memory: allocations at fake addresses, and cupy's memory pool reusing them.

Each allocation is a :class:`Memory`: a numpy buffer (the simulated device memory), the
simulated GPU it lives on, a fake device address, and an :class:`Access` record of the
streams that touched it. Arrays look at a ``Memory`` through views, as cupy arrays look at
a ``cupy.cuda.Memory``; ``ndarray.data`` is a :class:`MemoryPointer` (``mem`` and ``ptr``)
as in cupy.

The :class:`Allocator` hands out addresses and resolves an address back to the live
allocation holding it, which is how simulated NCCL reads buffers passed by pointer. It
holds allocations only weakly: an allocation whose last array is gone is *freed*, and its
addresses no longer resolve (addresses are never reused, so a stale pointer is always
seen as stale).

**The pool.** cupy's default allocator (``cupy/cuda/memory.pyx``, ``SingleDeviceMemoryPool``)
keeps one arena per stream (``_get_stream_identifier``: the stream pointer; with
``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` one per thread for the per-thread default
stream). A freed block goes back to the arena of the stream it was *allocated* on and is
handed, at once and without any synchronisation, to the next allocation on that stream
whose size (rounded up to 512 bytes) it fits, the best fit first. If another stream still
has work queued that uses the block, that work and the new owner's race. The simulation
models the hazard, not the bytes: a new allocation keeps a fresh buffer and address, but
it takes over the :class:`Access` record of the freed block it would have been given, and
the machine checks that every use of that block by another stream is ordered before the
allocating stream (``Machine.allocate``).

As in cupy, an allocation of zero bytes has address 0 and comes from no pool.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from towerdist._src.backend.simulated.cuda import StreamKey

__all__ = ["Access", "Allocator", "Memory", "MemoryPointer", "PinnedMemoryPointer", "pinned_base", "rounded_size"]

ALIGNMENT = 512  # cupy's memory pool rounds allocations up to 512 bytes (ALLOCATION_UNIT_SIZE)
FREE_BLOCKS_PER_ARENA = 64  # freed blocks remembered per (device, stream); older ones are forgotten
MAX_ARENAS = 256  # arenas remembered (per-thread default streams make one per thread)
_ARENA = 1 << 40  # address space per simulated GPU: device i allocates from (i + 1) * 2**40


def rounded_size(size: int) -> int:
    """``size`` rounded up to cupy's allocation unit (512 bytes)."""
    return -(-size // ALIGNMENT) * ALIGNMENT


class Access:
    """Which streams touched one block of device memory, and how (guarded by the machine).

    It outlives its :class:`Memory`: when the memory is freed, the record goes to the pool's
    free list, and the allocation that reuses the block is checked against it.

    Attributes:
      device_id: the simulated GPU.
      ptr: the block's address when it was allocated (for messages).
      size: its size in bytes.
      stream: the stream it was allocated on (its pool arena); None outside the pool.
      writer: the stream that last wrote it (None: never written), ``write_seq`` that write's
        position on its stream and ``written_by`` the operation.
      reads: for each stream that read it since the last write, the position of its last
        read on that stream and the operation.
    """

    __slots__ = ("device_id", "ptr", "reads", "size", "stream", "write_seq", "writer", "written_by")

    def __init__(self, device_id: int, ptr: int, size: int, stream: StreamKey | None) -> None:
        self.device_id = device_id
        self.ptr = ptr
        self.size = size
        self.stream = stream
        self.writer: StreamKey | None = None
        self.write_seq = 0
        self.written_by = ""
        self.reads: dict[StreamKey, tuple[int, str]] = {}

    def uses(self) -> list[tuple[StreamKey, int, str]]:
        """Every recorded use: (stream, position on it, operation), the last write first."""
        found = [] if self.writer is None else [(self.writer, self.write_seq, self.written_by)]
        return found + [(stream, seq, what) for stream, (seq, what) in self.reads.items()]

    def split(self, size: int) -> Access:
        """A record of the last ``size`` bytes of this block, with the same uses (a pool split)."""
        rest = Access(self.device_id, self.ptr + self.size - size, size, self.stream)
        rest.writer, rest.write_seq, rest.written_by = self.writer, self.write_seq, self.written_by
        rest.reads = dict(self.reads)
        return rest

    def describe(self) -> str:
        return f"the block at 0x{self.ptr:x} ({self.size} bytes) on GPU {self.device_id}"


class Memory:
    """One simulated device allocation (cupy's ``cupy.cuda.Memory``).

    Attributes:
      ptr: the fake device address of the first byte (0 for an empty allocation).
      size: the size in bytes.
      device_id: the simulated GPU holding it.
      host: the numpy buffer standing in for the device memory.
      pending: how many queued collectives still read or write it (guarded by the machine).
      access: the streams that touched it (see :class:`Access`).
    """

    __slots__ = ("__weakref__", "access", "device_id", "host", "pending", "ptr", "size")

    def __init__(self, host: np.ndarray, device_id: int, ptr: int, stream: StreamKey | None = None) -> None:
        self.host = host
        self.device_id = device_id
        self.ptr = ptr
        self.size = int(host.nbytes)
        self.pending = 0
        self.access = Access(device_id, ptr, self.size, stream)

    def address_of(self, view: np.ndarray) -> int:
        """The fake device address of ``view``'s first element (``view`` looks at this memory)."""
        if self.size == 0:
            return 0
        return self.ptr + (_host_address(view) - _host_address(self.host))

    def byte_view(self) -> np.ndarray:
        """The whole allocation as a writable 1-D uint8 array."""
        host = self.host
        flat = host.T.reshape(-1) if host.flags.f_contiguous and not host.flags.c_contiguous else host.reshape(-1)
        return flat.view(np.uint8)

    def __repr__(self) -> str:
        return f"<simulated GPU memory at 0x{self.ptr:x} ({self.size} bytes) on GPU {self.device_id}>"


class PinnedMemoryPointer(bytearray):
    """Page-locked host memory (``cupy.cuda.alloc_pinned_memory``): a buffer numpy can view.

    As with cupy's, ``numpy.frombuffer(mem, dtype, count)`` gives a host array over it, and
    an upload from such an array with a stream (``ndarray.set(view, stream)``) is
    *asynchronous*: the device reads the bytes some time before the copy completes, so the
    host must not write them again until it knows the copy has finished (an event recorded
    after it is done or synchronised, or the stream synchronised). ``copies`` holds the
    uploads from this memory not yet known to have finished (the simulation checks, when
    each completes, that the bytes are still those it was issued with).

    Attributes:
      ptr: a fake host address.
      size: the size in bytes.
    """

    _addresses = itertools.count(0x7F00_0000_0000, 1 << 24)

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.ptr = next(self._addresses)
        self.size = size
        self.copies: list[Any] = []  # the machine's Work of each upload in flight

    def __hash__(self) -> int:  # type: ignore[override]  # identity, as cupy's pointers (bytearrays are unhashable)
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"<simulated pinned host memory at 0x{self.ptr:x} ({self.size} bytes)>"


def pinned_base(array: np.ndarray) -> PinnedMemoryPointer | None:
    """The pinned memory ``array`` views, if it views one (its ``base`` chain reaches it)."""
    base: Any = array
    while base is not None:
        if isinstance(base, PinnedMemoryPointer):
            return base
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(base, "obj", None)
    return None


class MemoryPointer:
    """An address inside a :class:`Memory` (cupy's ``cupy.cuda.MemoryPointer``, ``ndarray.data``).

    Holding it keeps the memory alive, as in cupy.
    """

    __slots__ = ("mem", "ptr")

    def __init__(self, mem: Memory, ptr: int) -> None:
        self.mem = mem
        self.ptr = ptr

    @property
    def device_id(self) -> int:
        """The simulated GPU holding the memory."""
        return self.mem.device_id

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"<simulated MemoryPointer 0x{self.ptr:x} on GPU {self.mem.device_id}>"


class Allocator:
    """Hands out fake device addresses, maps them back to live allocations, and keeps the pool's free lists."""

    def __init__(self) -> None:
        # Re-entrant: a weakref callback (a freed allocation) may run while the lock is held.
        # Callbacks run in whichever thread drops the last reference, so this lock is never held
        # while waiting for another lock.
        self._lock = threading.RLock()
        self._next: dict[int, int] = {}
        self._starts: list[int] = []  # sorted starts of the live allocations
        self._live: dict[int, weakref.ref[Memory]] = {}
        self._free: dict[StreamKey, collections.deque[Access]] = {}  # arena -> freed blocks, oldest first
        # Blocks freed by weakref callbacks, which may run in the middle of any code (a garbage
        # collection) of any thread: appended here atomically, moved to the arenas under the lock
        # (cupy's arenas stage frees the same way, ``_Arena._pending_free``).
        self._pending_free: list[Access] = []

    def adopt(self, host: np.ndarray, device_id: int, stream: StreamKey | None = None) -> Memory:
        """Registers ``host`` (a buffer owning its data) as a new allocation on ``device_id``.

        ``stream`` is the stream it is allocated on: when the memory is freed, its block goes
        back to that stream's arena (None: to no arena).
        """
        size = int(host.nbytes)
        if size == 0:
            return Memory(host, device_id, 0)
        with self._lock:
            start = self._next.get(device_id, (device_id + 1) * _ARENA)
            self._next[device_id] = start + rounded_size(size)
            memory = Memory(host, device_id, start, stream)
            self._live[start] = weakref.ref(memory, functools.partial(self._forget, start, memory.access))
            bisect.insort(self._starts, start)
        return memory

    def resolve(self, ptr: int) -> tuple[Memory, int] | None:
        """The live allocation holding address ``ptr`` and the byte offset in it, or None."""
        with self._lock:
            index = bisect.bisect_right(self._starts, ptr) - 1
            if index < 0:
                return None
            start = self._starts[index]
            memory = self._live[start]()
        if memory is None or ptr >= start + memory.size:
            return None
        return memory, ptr - start

    def live_count(self) -> int:
        """How many allocations are alive (for tests)."""
        with self._lock:
            return len(self._live)

    def take_freed(self, stream: StreamKey, size: int) -> Access | None:
        """The freed block cupy's pool would give an allocation of ``size`` bytes on ``stream``, or None.

        The best fit among the blocks of that stream's arena at least as large as the rounded
        size (the most recently freed among equals); a larger block is split, and its rest
        stays free.
        """
        needed = rounded_size(size)
        with self._lock:
            self._commit_pending_free()
            arena = self._free.get(stream)
            if not arena:
                return None
            fitting = [block for block in arena if rounded_size(block.size) >= needed]
            if not fitting:
                return None
            # Among equally good fits cupy's order is arbitrary (chunk addresses); the most recently
            # freed block is the one another stream is most likely still using, so it goes first.
            block = min(reversed(fitting), key=lambda b: rounded_size(b.size))
            arena.remove(block)
            if rounded_size(block.size) > needed:
                arena.append(block.split(rounded_size(block.size) - needed))
                block.size = needed
            return block

    def give_back(self, block: Access) -> None:
        """Returns ``block`` to its arena's free list (an allocation that took it failed)."""
        if block.stream is not None:
            with self._lock:
                self._arena(block.stream).append(block)

    def free_count(self, stream: StreamKey) -> int:
        """How many freed blocks the arena of ``stream`` holds (for tests)."""
        with self._lock:
            self._commit_pending_free()
            return len(self._free.get(stream, ()))

    def _forget(self, start: int, access: Access, _: object = None) -> None:
        with self._lock:
            if self._live.pop(start, None) is not None:
                index = bisect.bisect_left(self._starts, start)
                if index < len(self._starts) and self._starts[index] == start:
                    del self._starts[index]
        if access.stream is not None:
            self._pending_free.append(access)

    def _commit_pending_free(self) -> None:
        while self._pending_free:
            block = self._pending_free.pop(0)
            if block.stream is not None:
                self._arena(block.stream).append(block)

    def _arena(self, stream: StreamKey) -> collections.deque[Access]:
        arena = self._free.get(stream)
        if arena is None:
            while len(self._free) >= MAX_ARENAS:
                del self._free[next(iter(self._free))]  # the oldest arena
            arena = self._free[stream] = collections.deque(maxlen=FREE_BLOCKS_PER_ARENA)
        return arena


def _host_address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])
