"""Simulated GPU memory: host buffers standing in for device allocations at fake addresses.

Each allocation is a :class:`Memory`: a numpy buffer (the simulated device memory), the
simulated GPU it lives on, and a fake device address. Arrays look at a ``Memory`` through
views, as cupy arrays look at a ``cupy.cuda.Memory``; ``ndarray.data`` is a
:class:`MemoryPointer` (``mem`` and ``ptr``) as in cupy.

The :class:`Allocator` hands out addresses and resolves an address back to the live
allocation holding it, which is how simulated NCCL reads buffers passed by pointer. It
holds allocations only weakly: an allocation whose last array is gone is *freed*, and its
addresses no longer resolve. Addresses are never reused, so a freed buffer is always seen
as freed (real allocators reuse memory, which is what turns such bugs into silently wrong
results on GPUs).

As in cupy, an allocation of zero bytes has address 0.
"""

from __future__ import annotations

import bisect
import functools
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from towerdist._src.testing.simulated_cuda import StreamKey

__all__ = ["Allocator", "Memory", "MemoryPointer"]

_ALIGNMENT = 512  # cupy's memory pool rounds allocations up to 512 bytes
_ARENA = 1 << 40  # address space per simulated GPU: device i allocates from (i + 1) * 2**40


class Memory:
    """One simulated device allocation (cupy's ``cupy.cuda.Memory``).

    Attributes:
      ptr: the fake device address of the first byte (0 for an empty allocation).
      size: the size in bytes.
      device_id: the simulated GPU holding it.
      host: the numpy buffer standing in for the device memory.
      pending: how many queued collectives still read or write it (guarded by the machine).
      writer: the stream that last wrote it (None: never written), ``write_seq`` that
        write's sequence number on that stream and ``written_by`` the operation (guarded by
        the machine; see ``Machine.check_order``).
    """

    __slots__ = ("__weakref__", "device_id", "host", "pending", "ptr", "size", "write_seq", "writer", "written_by")

    def __init__(self, host: np.ndarray, device_id: int, ptr: int) -> None:
        self.host = host
        self.device_id = device_id
        self.ptr = ptr
        self.size = int(host.nbytes)
        self.pending = 0
        self.writer: StreamKey | None = None
        self.write_seq = 0
        self.written_by = ""

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
    """Hands out fake device addresses and maps them back to live allocations."""

    def __init__(self) -> None:
        # Re-entrant: a weakref callback (a freed allocation) may run while the lock is held.
        self._lock = threading.RLock()
        self._next: dict[int, int] = {}
        self._starts: list[int] = []  # sorted starts of the live allocations
        self._live: dict[int, weakref.ref[Memory]] = {}

    def adopt(self, host: np.ndarray, device_id: int) -> Memory:
        """Registers ``host`` (a buffer owning its data) as a new allocation on ``device_id``."""
        size = int(host.nbytes)
        if size == 0:
            return Memory(host, device_id, 0)
        with self._lock:
            start = self._next.get(device_id, (device_id + 1) * _ARENA)
            self._next[device_id] = start + -(-size // _ALIGNMENT) * _ALIGNMENT
            memory = Memory(host, device_id, start)
            self._live[start] = weakref.ref(memory, functools.partial(self._forget, start))
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

    def _forget(self, start: int, _: object = None) -> None:
        with self._lock:
            if self._live.pop(start, None) is not None:
                index = bisect.bisect_left(self._starts, start)
                if index < len(self._starts) and self._starts[index] == start:
                    del self._starts[index]


def _host_address(array: Any) -> int:
    return int(array.__array_interface__["data"][0])
