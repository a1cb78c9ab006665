"""Simulated NCCL (``cupy.cuda.nccl``): all-reduce across the simulated GPUs of one process.

Communicators of one *clique* (made together by ``NcclCommunicator.initAll``, or one per
rank with the same unique id) sum buffers passed by device address, as NCCL does. The
simulation enforces NCCL's rules (``cupy/cuda/nccl.pyx``, NCCL's user guide) and raises
where real hardware would hang or silently compute garbage:

* **Group calls launch at ``groupEnd``.** Between ``groupStart()`` and ``groupEnd()`` calls
  are only queued. Every buffer must still be alive at ``groupEnd``: a buffer freed before
  then (its last array dropped) raises :class:`SimulatedGPUError`, because on a GPU the
  allocator may already have handed its memory to the next rank's temporary.
* **A buffer must live on its communicator's GPU**, within its allocation, and the stream
  must belong to that GPU; otherwise :class:`NcclError` (invalid argument).
* **A collective completes when every rank has called it**; until then it is queued on its
  stream (``stream.done`` is False, ``synchronize()`` waits). The k-th collectives of the
  ranks must match (same operation, count, type); a mismatch raises.
* **One thread, several ranks: use a group.** A thread that launches a collective on one
  rank while its earlier launch on another rank of the same clique still waits for the
  other ranks would deadlock on real hardware; it raises :class:`SimulatedGPUError`.
* **One thread creating several ranks of a unique id must do it in a group** (creation
  blocks until every rank has joined); otherwise :class:`SimulatedGPUError`.
* **A communicator must not be used from two threads at once** (a thread holds it from its
  call, or from its first call in a group until ``groupEnd``); the second thread raises.
* **A collective runs on its stream** (``cupy.md``, "Streams"): when it is launched, its
  buffers must be ordered after their last writes on other streams (an event waited for, or
  a synchronisation), else :class:`~.simulated_cuda.UnorderedAccessError`; its receive
  buffer is then written on that stream.
* ``abort()`` ends the communicator's queued work; ``check_async_error()`` then raises on
  every rank of the clique.

Ranks in other processes cannot be simulated (nothing moves data between processes): a
unique id made by another process raises ``NotImplementedError``.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from towerdist._src.testing.simulated_cuda import Machine, SimulatedGPUError, StreamKey, Work
from towerdist._src.testing.simulated_memory import Memory

__all__ = ["NCCL_CONSTANTS", "Nccl", "NcclCommunicator", "NcclError"]

NCCL_CONSTANTS = {
    "NCCL_INT8": 0, "NCCL_CHAR": 0, "NCCL_UINT8": 1, "NCCL_INT32": 2, "NCCL_INT": 2, "NCCL_UINT32": 3,
    "NCCL_INT64": 4, "NCCL_UINT64": 5, "NCCL_FLOAT16": 6, "NCCL_HALF": 6, "NCCL_FLOAT32": 7, "NCCL_FLOAT": 7,
    "NCCL_FLOAT64": 8, "NCCL_DOUBLE": 8, "NCCL_BFLOAT16": 9,
    "NCCL_SUM": 0, "NCCL_PROD": 1, "NCCL_MAX": 2, "NCCL_MIN": 3, "NCCL_AVG": 4,
}  # fmt: skip
_DTYPES: dict[int, Any] = {
    0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
    6: np.float16, 7: np.float32, 8: np.float64, 9: None,
}  # fmt: skip
_OPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
_UNIQUE_ID_MAGIC = b"towerdist-simulated-nccl"
_UNIQUE_ID_BYTES = 128
_machine_ids = itertools.count(1)


class NcclError(RuntimeError):
    """An NCCL call failed (cupy's ``cupy.cuda.nccl.NcclError``)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class _Op:
    """One rank's part of a collective: its buffers (held weakly until posted) and its stream."""

    def __init__(
        self, comm: NcclCommunicator, buffers: list[tuple[Memory, int] | None], count: int, dtype: Any, op: int,
        stream_ptr: int, stream_key: StreamKey,
    ) -> None:  # fmt: skip
        self.comm, self.count, self.dtype, self.op, self.stream_ptr = comm, count, dtype, op, stream_ptr
        self.stream_key = stream_key
        self.thread = threading.get_ident()
        self.offsets = [None if b is None else b[1] for b in buffers]
        self.refs = [None if b is None else weakref.ref(b[0]) for b in buffers]
        self.memories: list[Memory] = []
        self.work = Work(self.describe)

    def signature(self) -> str:
        return f"allReduce(count={self.count}, {np.dtype(self.dtype).name}, {_OPS[self.op]})"

    def describe(self) -> str:
        comm = self.comm
        clique = comm._clique
        waiting = [r for r in range(clique.nranks) if not clique.queues.get(r)]
        return (
            f"{self.signature()} on rank {comm._rank} of {clique.nranks} (GPU {comm._device}), waiting for "
            f"ranks {waiting} to call it"
        )

    def view(self, index: int) -> np.ndarray:
        memory, offset = self.memories[index], self.offsets[index] or 0  # resolved: count > 0
        size = self.count * np.dtype(self.dtype).itemsize
        return memory.byte_view()[offset : offset + size].view(self.dtype)


class _Clique:
    """The ranks of one communicator group and their queued collectives."""

    def __init__(self, nranks: int) -> None:
        self.nranks = nranks
        self.members: dict[int, NcclCommunicator] = {}
        self.ungrouped_creators: dict[int, int] = {}  # rank -> thread that created it outside a group
        self.queues: dict[int, collections.deque[_Op]] = {}
        self.error: str | None = None


class Nccl:
    """The simulated NCCL library of one :class:`Machine` (the functions of ``cupy.cuda.nccl``)."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.machine_id = next(_machine_ids)
        self._ids = itertools.count(1)
        self._cliques: dict[bytes, _Clique] = {}
        self._local = threading.local()
        self.NcclCommunicator: type[NcclCommunicator] = type(
            "NcclCommunicator", (NcclCommunicator,), {"_nccl": self, "__module__": __name__}
        )

    # --- module functions ------------------------------------------------------------------

    def get_unique_id(self) -> tuple[int, ...]:
        """A new unique id for ``NcclCommunicator(nranks, uid, rank)``, valid in this process only."""
        raw = _UNIQUE_ID_MAGIC + b"".join(
            int(v).to_bytes(8, "little") for v in (os.getpid(), self.machine_id, next(self._ids))
        )
        raw = raw.ljust(_UNIQUE_ID_BYTES, b"\0")
        return tuple(int(b) - 256 if b > 127 else int(b) for b in raw)  # signed chars, as cupy returns

    def groupStart(self) -> None:  # noqa: N802  (NCCL's name)
        """Starts a group: collectives are queued until the matching ``groupEnd()``."""
        self._local.depth = self._depth() + 1
        if self._local.depth == 1:
            self._local.ops = []

    def groupEnd(self) -> None:  # noqa: N802  (NCCL's name)
        """Ends a group; at the outermost one, launches the queued collectives."""
        depth = self._depth()
        if depth == 0:
            raise NcclError("NCCL_ERROR_INVALID_USAGE", "groupEnd() without groupStart() (simulated NCCL)")
        self._local.depth = depth - 1
        if depth > 1:
            return
        ops: list[_Op] = self._local.ops
        self._local.ops = []
        try:
            self._post(ops)
        finally:
            with self.machine.condition:
                for op in ops:
                    if op.comm._owner == op.thread:
                        op.comm._owner = None

    def in_group(self) -> bool:
        return self._depth() > 0

    def _depth(self) -> int:
        return int(getattr(self._local, "depth", 0))

    # --- cliques -----------------------------------------------------------------------------

    def _join(self, comm: NcclCommunicator, nranks: int, key: bytes, rank: int, together: bool = False) -> _Clique:
        with self.machine.condition:
            clique = self._cliques.get(key)
            if clique is None:
                clique = self._cliques[key] = _Clique(nranks)
            if clique.nranks != nranks:
                raise NcclError(
                    "NCCL_ERROR_INVALID_ARGUMENT",
                    f"rank {rank} was created with nranks={nranks}, but its unique id was first used with "
                    f"nranks={clique.nranks} (simulated NCCL)",
                )
            if not 0 <= rank < nranks or rank in clique.members:
                raise NcclError(
                    "NCCL_ERROR_INVALID_ARGUMENT",
                    f"rank {rank} is out of range for nranks={nranks} or was already created (simulated NCCL)",
                )
            me = threading.get_ident()
            if not together and not self.in_group():
                blocked = [r for r, thread in clique.ungrouped_creators.items() if thread == me]
                if blocked:
                    raise SimulatedGPUError(
                        f"One thread created rank {rank} after creating rank {blocked[0]} of the same NCCL "
                        "communicator outside a group: on real GPUs that first creation blocks until every rank "
                        "has joined, so this deadlocks. (simulated NCCL: a thread creating several ranks must "
                        "do it between nccl.groupStart() and nccl.groupEnd(), or use NcclCommunicator.initAll.)"
                    )
                if len(clique.members) + 1 < nranks:
                    clique.ungrouped_creators[rank] = me  # this creation would block for the others
            clique.members[rank] = comm
            clique.queues[rank] = collections.deque()
            return clique

    def _decode(self, unique_id: Sequence[int]) -> bytes:
        raw = bytes(int(v) & 0xFF for v in unique_id)
        if len(raw) != _UNIQUE_ID_BYTES or not raw.startswith(_UNIQUE_ID_MAGIC):
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                "the unique id was not made by this simulation's nccl.get_unique_id() (simulated NCCL)",
            )
        start = len(_UNIQUE_ID_MAGIC)
        pid, machine_id = (int.from_bytes(raw[start + 8 * i : start + 8 * i + 8], "little") for i in range(2))
        if pid != os.getpid() or machine_id != self.machine_id:
            where = f"process {pid}" if pid != os.getpid() else "another simulated machine"
            raise NotImplementedError(
                f"Simulated NCCL connects the ranks of one process only: this unique id was made by {where} "
                f"(this is process {os.getpid()}). Simulated GPUs cannot exchange data between processes; "
                "run multi-worker GPU code on real GPUs, or test it with one worker per simulated machine."
            )
        return raw

    # --- posting and running collectives ----------------------------------------------------

    def _post(self, ops: list[_Op]) -> None:
        """Launches ``ops`` (the caller's group, or one call): checks them, queues them, runs what is complete."""
        machine = self.machine
        with machine.condition:
            for op in ops:
                for index, ref in enumerate(op.refs):
                    memory = None if ref is None else ref()
                    if ref is not None and memory is None:
                        role = "send" if index == 0 else "receive"
                        raise SimulatedGPUError(
                            f"NCCL group launched with a freed buffer: the {role} buffer of "
                            f"{op.signature()} on rank {op.comm._rank} (GPU {op.comm._device}) was freed before "
                            "groupEnd(). (simulated GPU: NCCL launches group calls only at groupEnd(); on a GPU "
                            "the allocator may have reused that memory, e.g. for the next rank's temporary, "
                            "and the sum would be silently wrong. Keep every buffer referenced until the "
                            "collective has completed.)"
                        )
                    if memory is not None:
                        op.memories.append(memory)  # held until the collective ran (stream-ordered frees)
            for op in ops:
                self._check_no_deadlock(op)  # against work queued before this launch
            for op in ops:
                recv = self._recv_memory(op)
                machine.check_order(op.stream_key, op.memories, op.signature(), [] if recv is None else [recv])
            for op in ops:
                op.comm._clique.queues[op.comm._rank].append(op)
                op.work.memories = list(op.memories)
                machine.enqueue(op.comm._device, op.stream_ptr, op.work)
                recv = self._recv_memory(op)
                if recv is not None:
                    machine.mark_written(op.stream_key, [recv], f"NCCL {op.signature()}")
            for clique in {id(op.comm._clique): op.comm._clique for op in ops}.values():
                self._progress(clique)

    @staticmethod
    def _recv_memory(op: _Op) -> Memory | None:
        ref = op.refs[1]
        return None if ref is None else ref()

    def _check_no_deadlock(self, op: _Op) -> None:
        clique = op.comm._clique
        for rank, queue in clique.queues.items():
            if rank != op.comm._rank and any(other.thread == op.thread for other in queue):
                raise SimulatedGPUError(
                    f"One thread called {op.signature()} on rank {op.comm._rank} while its call on rank {rank} of "
                    "the same communicators is still waiting for the other ranks: on real GPUs this deadlocks. "
                    "(simulated NCCL: a thread driving several ranks must put their calls between "
                    "nccl.groupStart() and nccl.groupEnd().)"
                )

    def _progress(self, clique: _Clique) -> None:
        """Runs the collectives every rank has called (the caller holds the machine's condition)."""
        while len(clique.members) == clique.nranks and all(clique.queues[r] for r in range(clique.nranks)):
            heads = [clique.queues[r][0] for r in range(clique.nranks)]
            signatures = {op.signature() for op in heads}
            if len(signatures) > 1:
                clique.error = "collectives do not match across ranks: " + ", ".join(
                    f"rank {r} {op.signature()}" for r, op in enumerate(heads)
                )
                raise SimulatedGPUError(
                    f"NCCL {clique.error}. On real GPUs the ranks would hang or compute garbage. (simulated NCCL: "
                    "every rank must issue the same collectives in the same order.)"
                )
            for r in range(clique.nranks):
                clique.queues[r].popleft()
            _run_all_reduce(heads)
            for op in heads:
                op.memories = []
                self.machine.complete(op.work)


def _run_all_reduce(ops: list[_Op]) -> None:
    if ops[0].count == 0:
        return  # NCCL accepts and discards empty collectives
    inputs = [op.view(0).copy() for op in ops]
    kind = _OPS[ops[0].op]
    with np.errstate(all="ignore"):
        if kind == "avg":
            total = functools.reduce(np.add, inputs)
            result = (total / len(inputs)).astype(ops[0].dtype)
        else:
            ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[kind]
            result = functools.reduce(ufunc, inputs)
    for op in ops:
        op.view(1)[...] = result


class NcclCommunicator:
    """One rank of an NCCL communicator on a simulated GPU (``cupy.cuda.nccl.NcclCommunicator``).

    Args:
      ndev: the number of ranks.
      commId: a unique id from ``nccl.get_unique_id()`` (made in this process).
      rank: this communicator's rank; its GPU is the calling thread's current device.
    """

    _nccl: ClassVar[Nccl]

    def __init__(self, ndev: int, commId: Sequence[int], rank: int) -> None:  # noqa: N803  (cupy's name)
        nccl = self._nccl
        key = nccl._decode(commId)
        self._setup(nccl.machine.current_device(), rank)
        self._clique = nccl._join(self, int(ndev), key, int(rank))

    def _setup(self, device: int, rank: int) -> None:
        self._nccl.machine.check_device(device)
        self._device = device
        self._rank = rank
        self._owner: int | None = None
        self._aborted = False
        self._destroyed = False

    @classmethod
    def initAll(cls, devices: int | Sequence[int]) -> list[NcclCommunicator]:  # noqa: N802  (cupy's name)
        """One communicator per device of ``devices`` (a list of ids, or a count), rank = position."""
        ids = list(range(devices)) if isinstance(devices, int) else [int(d) for d in devices]
        if len(set(ids)) != len(ids):
            raise NcclError("NCCL_ERROR_INVALID_USAGE", f"duplicate GPU in initAll({ids}) (simulated NCCL)")
        nccl = cls._nccl
        key = bytes(nccl.get_unique_id()[i] & 0xFF for i in range(_UNIQUE_ID_BYTES))
        comms = []
        for rank, device in enumerate(ids):
            comm = cls.__new__(cls)
            comm._setup(device, rank)
            comm._clique = nccl._join(comm, len(ids), key, rank, together=True)
            comms.append(comm)
        return comms

    def device_id(self) -> int:
        """The communicator's GPU."""
        return self._device

    def rank_id(self) -> int:
        """The communicator's rank."""
        return self._rank

    def size(self) -> int:
        """The number of ranks."""
        return self._clique.nranks

    def allReduce(  # noqa: N802  (cupy's name)
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int
    ) -> None:
        """Reduces ``count`` elements at device address ``sendbuf`` across the ranks into ``recvbuf``."""
        nccl = self._nccl
        machine = nccl.machine
        self._check_usable("allReduce")
        dtype = _DTYPES.get(int(datatype), _MISSING)
        if dtype is _MISSING or int(op) not in _OPS or int(count) < 0:
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                f"allReduce with datatype={datatype}, op={op}, count={count} (simulated NCCL)",
            )
        if dtype is None:
            raise NotImplementedError("Simulated NCCL has no bfloat16 (numpy has no such dtype).")
        count = int(count)
        size = count * np.dtype(dtype).itemsize
        buffers = [self._resolve(int(ptr), size, role) for ptr, role in ((sendbuf, "send"), (recvbuf, "receive"))]
        self._check_stream(int(stream))
        key = machine.key_for_ptr(self._device, int(stream))  # the calling thread's, for a per-thread stream
        pending = _Op(self, buffers, count, dtype, int(op), int(stream), key)
        me = threading.get_ident()
        with machine.condition:
            if self._owner is not None and self._owner != me:
                raise SimulatedGPUError(
                    f"NCCL communicator rank {self._rank} (GPU {self._device}) used from two threads at once. "
                    "(simulated NCCL: a communicator is not thread-safe; serialise its calls, and its group "
                    "calls up to groupEnd(), with a lock.)"
                )
            self._owner = me
        if nccl.in_group():
            nccl._local.ops.append(pending)  # held by this thread until groupEnd()
            return
        try:
            nccl._post([pending])
        finally:
            with machine.condition:
                self._owner = None

    def abort(self) -> None:
        """Aborts the communicator: its queued work ends, and the other ranks see an error."""
        machine = self._nccl.machine
        with machine.condition:
            self._aborted = True
            clique = self._clique
            clique.error = clique.error or f"rank {self._rank} (GPU {self._device}) was aborted"
            for op in list(clique.queues.get(self._rank, ())):
                machine.complete(op.work)
            clique.queues[self._rank].clear()

    def destroy(self) -> None:
        """Frees the communicator; it cannot be used afterwards."""
        self._destroyed = True

    def check_async_error(self) -> None:
        """Raises :class:`NcclError` if a rank of this communicator failed or was aborted."""
        error = self._clique.error
        if error is not None:
            raise NcclError("NCCL_ERROR_REMOTE_ERROR", f"{error} (simulated NCCL)")

    def _check_usable(self, api: str) -> None:
        if self._destroyed or self._aborted:
            state = "destroyed" if self._destroyed else "aborted"
            raise NcclError("NCCL_ERROR_INVALID_USAGE", f"{api} on a {state} communicator (simulated NCCL)")

    def _resolve(self, ptr: int, size: int, role: str) -> tuple[Memory, int] | None:
        if size == 0:
            return None
        found = self._nccl.machine.allocator.resolve(ptr)
        if found is None:
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                f"the {role} buffer 0x{ptr:x} is not a live allocation of a simulated GPU (freed, or never "
                "allocated) (simulated NCCL)",
            )
        memory, offset = found
        if memory.device_id != self._device:
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                f"the {role} buffer lives on GPU {memory.device_id}, but communicator rank {self._rank} is on "
                f"GPU {self._device} (simulated NCCL: buffers must live on the communicator's GPU)",
            )
        if offset + size > memory.size:
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                f"the {role} buffer 0x{ptr:x} holds {memory.size - offset} bytes, but the call needs {size} "
                "(simulated NCCL)",
            )
        return found

    def _check_stream(self, ptr: int) -> None:
        if ptr in (0, 2):
            return  # the default streams of the communicator's device
        stream = self._nccl.machine.streams.get(ptr)
        if stream is None:
            raise NcclError("NCCL_ERROR_INVALID_ARGUMENT", f"unknown stream 0x{ptr:x} (simulated NCCL)")
        if stream.device_id != self._device:
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                f"the stream belongs to GPU {stream.device_id}, but communicator rank {self._rank} is on GPU "
                f"{self._device} (simulated NCCL)",
            )

    def __repr__(self) -> str:
        return f"<simulated NcclCommunicator rank {self._rank} of {self._clique.nranks} on GPU {self._device}>"

    # Collectives towerdist does not use are not simulated.
    def _not_simulated(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("This NCCL collective is not simulated; only allReduce is.")

    reduce = broadcast = bcast = reduceScatter = allGather = send = recv = _not_simulated  # noqa: N815


_MISSING: Any = object()
