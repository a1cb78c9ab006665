"""Simulated NCCL (``cupy.cuda.nccl``): all-reduce across the simulated GPUs of one host.

Communicators of one *clique* (made together by ``NcclCommunicator.initAll``, or one per
rank with the same unique id) reduce buffers passed by device address, as NCCL does. The
simulation enforces NCCL's rules (``cupy/cuda/nccl.pyx``, NCCL's user guide) and raises
where real hardware would hang or silently compute garbage:

* **Unique ids are cupy 14's** (``cupy_backends/cuda/libs/nccl.pyx``): ``get_unique_id()``
  returns 128 ``bytes`` and ``NcclCommunicator(ndev, commId, rank)`` accepts only ``bytes``
  (``TypeError`` otherwise, ``ValueError`` for another length). The test hook
  ``Nccl.unique_id_format = "tuple"`` (``cupy.cuda.nccl._simulation``) simulates cupy 13:
  a tuple of 128 signed ints, and a constructor taking only such a tuple.
* **Creating a rank from a unique id blocks until every rank has joined**
  (``ncclCommInitRank``); inside ``groupStart()/groupEnd()`` the wait happens at
  ``groupEnd``. A rank that never joins is reported after ``Machine.hang_timeout``, naming
  it. The ranks meet through files (``nccl_files``), so they may live in other
  processes of the host; if they all live in this process and machine, they then run
  in-process.
* **One GPU per rank**: two ranks of one clique on the same GPU (of one host) raise
  ``NCCL_ERROR_INVALID_USAGE`` ("Duplicate GPU detected"), on every rank.
* **Group calls launch at ``groupEnd``.** Between ``groupStart()`` and ``groupEnd()`` calls
  are only queued. Every buffer must still be alive at ``groupEnd``: a buffer freed before
  then (its last array dropped) raises :class:`SimulatedGPUError`, because on a GPU the
  allocator may already have handed its memory to the next rank's temporary.
* **A buffer must live on its communicator's GPU**, within its allocation, and the stream
  must belong to that GPU; otherwise :class:`NcclError` (invalid argument).
* **No per-thread default stream with ``initAll`` communicators**: cupy keeps NCCL on the
  legacy null stream because the per-thread stream handle failed with communicators made
  by ``ncclCommInitAll`` (cupy issue 4322); an ``allReduce`` of such a communicator on
  stream pointer 2 raises ``NCCL_ERROR_INVALID_USAGE``.
* **A collective completes when every rank has called it**; until then it is queued on its
  stream (``stream.done`` is False, ``synchronize()`` waits). The k-th collectives of the
  ranks must match (same operation, count, type); a mismatch raises.
* **One thread, several ranks: use a group.** A thread that launches a collective on one
  rank while its earlier launch on another rank of the same clique still waits for the
  other ranks would deadlock on real hardware; it raises :class:`SimulatedGPUError`.
* **A communicator must not be used from two threads at once** (a thread holds it from its
  call, or from its first call in a group until ``groupEnd``); the second thread raises.
* **A collective runs on its stream** (``cupy.md``, "Streams"): when it is launched, its
  buffers must be ordered after their last uses on other streams (an event waited for, or
  a synchronisation), else :class:`~.cuda.UnorderedAccessError`; it then reads
  its send buffer and writes its receive buffer on that stream.
* ``abort()`` ends the communicator's queued work; ``check_async_error()`` then raises on
  every rank of the clique.

**Across processes** (ranks of other processes, or of another simulated machine of this
process), a rank writes its contribution to each collective into the clique's directory at
launch; the collective completes, on each rank, when the host next waits for or queries its
stream (or reads its buffers) and every rank's contribution exists: the result, reduced
in rank order, is written into the receive buffer. A rank that never contributes is
reported after ``Machine.hang_timeout``, naming it; contributions that do not match raise,
naming each rank's call; an abort is seen by the other ranks' ``check_async_error()`` and
ends their queued work. This stands in for NCCL's transport on one host; it proves the
calls and their order, not NCCL's networking.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import secrets
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from towerdist._src.backend.simulated.cuda import POLL_SECONDS, Machine, SimulatedGPUError, StreamKey, Work
from towerdist._src.backend.simulated.memory import Memory
from towerdist._src.backend.simulated.nccl_files import (
    Member,
    Rendezvous,
    Transport,
    clique_directory,
    host_name,
)

__all__ = ["NCCL_CONSTANTS", "UNIQUE_ID_BYTES", "Nccl", "NcclCommunicator", "NcclError", "UniqueIdFormat"]

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
UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES
_UNIQUE_ID_MAGIC = b"towerdist-simulated-nccl"
_TOKEN_BYTES = 16
_machine_ids = itertools.count(1)

UniqueIdFormat = Literal["bytes", "tuple"]
"""What ``get_unique_id()`` returns and the constructor takes: cupy 14's ``bytes``, or cupy 13's tuple of signed ints."""


class NcclError(RuntimeError):
    """An NCCL call failed (cupy's ``cupy.cuda.nccl.NcclError``)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class _Op:
    """One rank's part of a collective: its buffers (held weakly until posted) and its stream."""

    def __init__(
        self, comm: NcclCommunicator, buffers: list[tuple[Memory, int] | None], count: int, dtype: type[np.generic], op: int,
        stream_ptr: int, stream_key: StreamKey,
    ) -> None:  # fmt: skip
        self.comm, self.count, self.dtype, self.op, self.stream_ptr = comm, count, dtype, op, stream_ptr
        self.stream_key = stream_key
        self.thread = threading.get_ident()
        self.offsets = [None if b is None else b[1] for b in buffers]
        self.refs = [None if b is None else weakref.ref(b[0]) for b in buffers]
        self.memories: list[Memory] = []
        self.seq = -1  # the clique's k-th collective of this rank (across processes)
        self.work = Work(self.describe)

    def signature(self) -> str:
        return f"allReduce(count={self.count}, {np.dtype(self.dtype).name}, {_OPS[self.op]})"

    def describe(self) -> str:
        comm = self.comm
        clique = comm._joined()
        if clique.transport is None:
            waiting = [r for r in range(clique.nranks) if not clique.queues.get(r)]
            return (
                f"{self.signature()} on rank {comm._rank} of {clique.nranks} (GPU {comm._device}), waiting for "
                f"ranks {waiting} to call it"
            )
        return (
            f"{self.signature()} (collective #{self.seq}) on rank {comm._rank} of {clique.nranks} (GPU "
            f"{comm._device}, process {os.getpid()}), waiting for ranks {clique.transport.missing(self.seq)} to "
            f"contribute (simulated NCCL: through the files in {clique.transport.directory})"
        )

    def view(self, index: int) -> np.ndarray:
        memory, offset = self.memories[index], self.offsets[index] or 0  # resolved: count > 0
        size = self.count * np.dtype(self.dtype).itemsize
        return memory.byte_view()[offset : offset + size].view(self.dtype)


class _Clique:
    """The ranks of one communicator group in this machine, and their queued collectives.

    Attributes:
      nranks: the number of ranks (here and elsewhere).
      members, queues: this machine's ranks and their queued collectives.
      init_all: made by ``NcclCommunicator.initAll``.
      transport: for a clique with ranks elsewhere, the files its collectives go through.
      error: why the clique failed (a rank aborted, mismatched calls), or None.
    """

    def __init__(self, nranks: int, init_all: bool = False, transport: Transport | None = None) -> None:
        self.nranks = nranks
        self.init_all = init_all
        self.transport = transport
        self.members: dict[int, NcclCommunicator] = {}
        self.queues: dict[int, collections.deque[_Op]] = {}
        self.error: str | None = None


class Nccl:
    """The simulated NCCL library of one :class:`Machine` (the functions of ``cupy.cuda.nccl``).

    Attributes:
      unique_id_format: a test hook: ``"bytes"`` (cupy 14, the default) or ``"tuple"`` (cupy 13).
    """

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.machine_id = next(_machine_ids)
        self._format: UniqueIdFormat = "bytes"
        self._cliques: dict[bytes, _Clique] = {}
        self._local = threading.local()
        self.NcclCommunicator: type[NcclCommunicator] = type(
            "NcclCommunicator", (NcclCommunicator,), {"_nccl": self, "__module__": __name__}
        )

    @property
    def unique_id_format(self) -> UniqueIdFormat:
        """``"bytes"`` (cupy 14) or ``"tuple"`` (cupy 13): what ``get_unique_id()`` returns and the constructor takes."""
        return self._format

    @unique_id_format.setter
    def unique_id_format(self, value: UniqueIdFormat) -> None:
        if value not in ("bytes", "tuple"):
            raise ValueError(f"unique_id_format must be 'bytes' (cupy 14) or 'tuple' (cupy 13). Got {value!r}.")
        self._format = value

    # --- module functions ------------------------------------------------------------------

    def get_unique_id(self) -> bytes | tuple[int, ...]:
        """A new unique id for ``NcclCommunicator(nranks, uid, rank)``: 128 bytes (cupy 13: a tuple of signed ints)."""
        raw = _UNIQUE_ID_MAGIC + secrets.token_bytes(_TOKEN_BYTES)
        raw += os.getpid().to_bytes(8, "little") + self.machine_id.to_bytes(8, "little")
        raw = raw.ljust(UNIQUE_ID_BYTES, b"\0")
        if self._format == "tuple":
            return tuple(b - 256 if b > 127 else b for b in raw)  # signed chars, as cupy 13 returns them
        return raw

    def groupStart(self) -> None:  # noqa: N802  (NCCL's name)
        """Starts a group: communicator creations and collectives are queued until the matching ``groupEnd()``."""
        self._local.depth = self._depth() + 1
        if self._local.depth == 1:
            self._local.ops = []
            self._local.inits = []

    def groupEnd(self) -> None:  # noqa: N802  (NCCL's name)
        """Ends a group; at the outermost one, joins the created communicators, then launches the queued collectives."""
        depth = self._depth()
        if depth == 0:
            raise NcclError("NCCL_ERROR_INVALID_USAGE", "groupEnd() without groupStart() (simulated NCCL)")
        self._local.depth = depth - 1
        if depth > 1:
            return
        ops: list[_Op] = self._local.ops
        inits: list[NcclCommunicator] = self._local.inits
        self._local.ops, self._local.inits = [], []
        try:
            self._connect(inits)
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

    def _decode(self, unique_id: object) -> bytes:
        """The token of ``unique_id``, checked as cupy checks the constructor's argument."""
        if self._format == "bytes":
            if not isinstance(unique_id, bytes):
                raise TypeError(
                    f"Argument 'commId' has incorrect type (expected bytes, got {type(unique_id).__name__}) "
                    "(simulated NCCL: cupy 14's NcclCommunicator takes the unique id as the bytes that "
                    "nccl.get_unique_id() returns; pass it along as returned, not converted to a tuple or list)"
                )
            if len(unique_id) != UNIQUE_ID_BYTES:
                raise ValueError(
                    f"commId length {len(unique_id)} != {UNIQUE_ID_BYTES}. (simulated NCCL: pass the whole id that "
                    "nccl.get_unique_id() returned)"
                )
            raw = bytes(unique_id)
        else:
            if not isinstance(unique_id, tuple):
                raise TypeError(
                    f"Argument 'commId' has incorrect type (expected tuple, got {type(unique_id).__name__}) "
                    "(simulated NCCL: cupy 13's NcclCommunicator takes the unique id as the tuple that "
                    "nccl.get_unique_id() returns; pass it along as returned)"
                )
            if len(unique_id) != UNIQUE_ID_BYTES:
                raise AssertionError(f"commId has {len(unique_id)} entries, not {UNIQUE_ID_BYTES} (simulated NCCL)")
            for value in unique_id:
                if not isinstance(value, int):
                    raise TypeError(f"an integer is required (simulated NCCL: commId holds {value!r})")
                if not -128 <= value <= 127:
                    raise OverflowError(
                        f"value too large to convert to char (simulated NCCL: cupy 13 copies commId into signed "
                        f"chars, and it holds {value}; pass the tuple nccl.get_unique_id() returned, unchanged)"
                    )
            raw = bytes(v & 0xFF for v in unique_id)
        if not raw.startswith(_UNIQUE_ID_MAGIC):
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                "the unique id was not made by nccl.get_unique_id() of simulated NCCL (simulated NCCL)",
            )
        return raw[len(_UNIQUE_ID_MAGIC) : len(_UNIQUE_ID_MAGIC) + _TOKEN_BYTES]

    def _start_join(self, comm: NcclCommunicator, token: bytes) -> None:
        """Announces ``comm``'s rank in its clique's directory; joins now, or at ``groupEnd`` inside a group."""
        me = Member(comm._rank, comm._nranks, host_name(), comm._device, os.getpid(), self.machine_id)
        rendezvous = Rendezvous(clique_directory(token), me)
        if rendezvous.taken_by is not None:
            raise NcclError(
                "NCCL_ERROR_INVALID_USAGE",
                f"rank {comm._rank} of this unique id was already created, by {rendezvous.taken_by.describe()} "
                "(simulated NCCL: each rank of a communicator is created once; give every process its own rank)",
            )
        comm._pending = (token, rendezvous)
        if self.in_group():
            self._local.inits.append(comm)
        else:
            self._connect([comm])

    def _connect(self, comms: list[NcclCommunicator]) -> None:
        """Waits until every rank of each of ``comms``'s cliques has joined, then connects them."""
        deadline = time.monotonic() + self.machine.hang_timeout
        for comm in comms:
            if comm._pending is None:
                continue  # already joined
            token, rendezvous = comm._pending
            members = rendezvous.poll()
            while members is None:
                if time.monotonic() > deadline:
                    raise SimulatedGPUError(
                        f"NcclCommunicator({comm._nranks}, uid, {comm._rank}) on GPU {comm._device} would hang on a "
                        f"real GPU: creating a rank waits until every rank has joined (ncclCommInitRank), and after "
                        f"{self.machine.hang_timeout:g} s ranks {rendezvous.missing()} have not joined (the files are "
                        f"in {rendezvous.directory}). (simulated NCCL: create every rank with the "
                        "same unique id and nranks, one per process, or several in one thread between "
                        "nccl.groupStart() and nccl.groupEnd().)"
                    )
                time.sleep(POLL_SECONDS)
                members = rendezvous.poll()
            comm._pending = None
            _check_members(comm, members)
            local = all(m.pid == os.getpid() and m.machine == self.machine_id for m in members)
            transport = None if local else Transport(rendezvous.directory, comm._nranks)
            comm._clique = self._join(comm, comm._nranks, token, comm._rank, transport=transport)

    def _join(
        self, comm: NcclCommunicator, nranks: int, key: bytes, rank: int, init_all: bool = False,
        transport: Transport | None = None,
    ) -> _Clique:  # fmt: skip
        with self.machine.condition:
            clique = self._cliques.get(key)
            if clique is None:
                clique = self._cliques[key] = _Clique(nranks, init_all, transport)
            if rank in clique.members:
                raise NcclError("NCCL_ERROR_INVALID_ARGUMENT", f"rank {rank} was already created (simulated NCCL)")
            clique.members[rank] = comm
            clique.queues[rank] = collections.deque()
            return clique

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
                clique = op.comm._joined()
                clique.queues[op.comm._rank].append(op)
                op.work.memories = list(op.memories)
                if clique.transport is not None:
                    self._contribute(clique.transport, op)
                    op.work.poll = functools.partial(self._progress, clique)
                machine.enqueue(op.comm._device, op.stream_ptr, op.work)
                recv = self._recv_memory(op)
                machine.mark_accessed(
                    op.stream_key, op.memories, f"NCCL {op.signature()}", [] if recv is None else [recv]
                )
            for clique in {id(op.comm._clique): op.comm._joined() for op in ops}.values():
                self._progress(clique)

    @staticmethod
    def _recv_memory(op: _Op) -> Memory | None:
        ref = op.refs[1]
        return None if ref is None else ref()

    def _contribute(self, transport: Transport, op: _Op) -> None:
        comm = op.comm
        op.seq = comm._next_seq
        comm._next_seq += 1
        header = {
            "rank": comm._rank, "seq": op.seq, "signature": op.signature(), "device": comm._device,
            "pid": os.getpid(), "host": host_name(),
        }  # fmt: skip
        transport.contribute(comm._rank, op.seq, header, op.view(0).tobytes() if op.count else b"")

    def _check_no_deadlock(self, op: _Op) -> None:
        clique = op.comm._joined()
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
        if clique.transport is not None:
            self._progress_across_processes(clique, clique.transport)
            return
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
            if heads[0].count:  # NCCL accepts and discards empty collectives
                result = _reduce([op.view(0).copy() for op in heads], heads[0].op, heads[0].dtype)
                for op in heads:
                    op.view(1)[...] = result
            for op in heads:
                op.memories = []
                self.machine.complete(op.work)

    def _progress_across_processes(self, clique: _Clique, transport: Transport) -> None:
        """Completes this machine's queued collectives whose contributions have all arrived (condition held)."""
        if clique.error is None:
            clique.error = transport.error(set(clique.members))
        if clique.error is not None:  # a rank failed: the others' queued work ends (its results are garbage)
            for queue in clique.queues.values():
                for op in queue:
                    op.memories = []
                    self.machine.complete(op.work)
                queue.clear()
            return
        for rank, queue in clique.queues.items():
            while queue:
                op = queue[0]
                found = transport.collect(op.seq)
                if found is None:
                    break
                queue.popleft()
                if len({header["signature"] for header, _ in found}) > 1:
                    clique.error = f"collective #{op.seq} does not match across ranks: " + ", ".join(
                        f"rank {h['rank']} {h['signature']} (GPU {h['device']}, process {h['pid']})" for h, _ in found
                    )
                    op.memories = []
                    self.machine.complete(op.work)
                    raise SimulatedGPUError(
                        f"NCCL {clique.error}. On real GPUs the ranks would hang or compute garbage. (simulated "
                        "NCCL: every rank must issue the same collectives in the same order.)"
                    )
                if op.count:
                    inputs = [np.frombuffer(payload, dtype=op.dtype) for _, payload in found]
                    op.view(1)[...] = _reduce(inputs, op.op, op.dtype)
                op.memories = []
                transport.finished(rank, op.seq)
                self.machine.complete(op.work)


def _check_members(comm: NcclCommunicator, members: list[Member]) -> None:
    """Raises as NCCL's initialisation does when the ranks that joined cannot form one communicator."""
    for member in members:
        if member.nranks != comm._nranks:
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT",
                f"rank {comm._rank} was created with nranks={comm._nranks}, but {member.describe()} with "
                f"nranks={member.nranks} (simulated NCCL: every rank must pass the same nranks)",
            )
    seen: dict[tuple[str, int], Member] = {}
    for member in members:
        first = seen.setdefault((member.host, member.device), member)
        if first is not member:
            raise NcclError(
                "NCCL_ERROR_INVALID_USAGE",
                f"Duplicate GPU detected: {first.describe()} and {member.describe()} are both on GPU "
                f"{member.device} (simulated NCCL: as in NCCL, every rank of a communicator needs a GPU of its own; "
                "on a host with several processes, process k should make GPU k current, e.g. with "
                "cupy.cuda.Device(local_rank), before creating its communicator)",
            )


def _reduce(inputs: Sequence[np.ndarray], op: int, dtype: type[np.generic]) -> np.ndarray:
    """The reduction of ``inputs`` in rank order."""
    kind = _OPS[op]
    with np.errstate(all="ignore"):
        if kind == "avg":
            total = functools.reduce(np.add, inputs)
            return np.asarray(total / len(inputs)).astype(dtype)
        ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[kind]
        return np.asarray(functools.reduce(ufunc, inputs))


class NcclCommunicator:
    """One rank of an NCCL communicator on a simulated GPU (``cupy.cuda.nccl.NcclCommunicator``).

    Creating it blocks until every rank has joined (inside a group: at ``groupEnd``).

    Args:
      ndev: the number of ranks.
      commId: a unique id from ``nccl.get_unique_id()`` (in this process or another one of this host).
      rank: this communicator's rank; its GPU is the calling thread's current device.

    Raises:
      TypeError, ValueError: ``commId`` is not what this cupy version's ``get_unique_id`` returns.
      NcclError: the rank is out of range or taken, the ranks disagree on ``ndev``, or two
        ranks are on the same GPU.
      SimulatedGPUError: a rank did not join within the machine's ``hang_timeout``.
    """

    _nccl: ClassVar[Nccl]

    def __init__(self, ndev: int, commId: object, rank: int) -> None:  # noqa: N803  (cupy's name)
        nccl = self._nccl
        token = nccl._decode(commId)
        self._setup(nccl.machine.current_device(), int(rank), int(ndev))
        if self._nranks < 1 or not 0 <= self._rank < self._nranks:
            raise NcclError(
                "NCCL_ERROR_INVALID_ARGUMENT", f"rank {rank} is out of range for nranks={ndev} (simulated NCCL)"
            )
        nccl._start_join(self, token)

    def _setup(self, device: int, rank: int, nranks: int) -> None:
        self._nccl.machine.check_device(device)
        self._device = device
        self._rank = rank
        self._nranks = nranks
        self._owner: int | None = None
        self._aborted = False
        self._destroyed = False
        self._clique: _Clique | None = None  # set once every rank has joined
        self._pending: tuple[bytes, Rendezvous] | None = None  # a creation waiting for the other ranks
        self._next_seq = 0

    def _joined(self) -> _Clique:
        if self._clique is None:
            raise NcclError(
                "NCCL_ERROR_INVALID_USAGE",
                f"communicator rank {self._rank} is used before every rank has joined (simulated NCCL: inside a "
                "group, a communicator is ready after groupEnd())",
            )
        return self._clique

    @classmethod
    def initAll(cls, devices: int | Sequence[int]) -> list[NcclCommunicator]:  # noqa: N802  (cupy's name)
        """One communicator per device of ``devices`` (a list of ids, or a count), rank = position."""
        ids = list(range(devices)) if isinstance(devices, int) else [int(d) for d in devices]
        duplicates = sorted({d for d in ids if ids.count(d) > 1})
        if duplicates:
            raise NcclError(
                "NCCL_ERROR_INVALID_USAGE",
                f"Duplicate GPU detected: initAll({ids}) lists GPU {duplicates[0]} more than once (simulated NCCL: "
                "every rank needs a GPU of its own)",
            )
        nccl = cls._nccl
        key = secrets.token_bytes(_TOKEN_BYTES)
        comms = []
        for rank, device in enumerate(ids):
            comm = cls.__new__(cls)
            comm._setup(device, rank, len(ids))
            comm._clique = nccl._join(comm, len(ids), key, rank, init_all=True)
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
        return self._nranks

    def allReduce(  # noqa: N802  (cupy's name)
        self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int
    ) -> None:
        """Reduces ``count`` elements at device address ``sendbuf`` across the ranks into ``recvbuf``."""
        nccl = self._nccl
        machine = nccl.machine
        machine.stats.count_work("nccl_calls")
        if self._destroyed or self._aborted:
            state = "destroyed" if self._destroyed else "aborted"
            raise NcclError("NCCL_ERROR_INVALID_USAGE", f"allReduce on a {state} communicator (simulated NCCL)")
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
            if clique is None:
                return
            reason = f"rank {self._rank} (GPU {self._device}, process {os.getpid()}) was aborted"
            clique.error = clique.error or reason
            if clique.transport is not None:
                clique.transport.abort(self._rank, reason)
            for op in list(clique.queues.get(self._rank, ())):
                op.memories = []
                machine.complete(op.work)
            clique.queues[self._rank].clear()

    def destroy(self) -> None:
        """Frees the communicator; it cannot be used afterwards."""
        self._destroyed = True

    def check_async_error(self) -> None:
        """Raises :class:`NcclError` if a rank of this communicator failed or was aborted."""
        clique = self._clique
        if clique is None:
            return
        with self._nccl.machine.condition:
            if clique.error is None and clique.transport is not None:
                clique.error = clique.transport.error(set(clique.members))
            error = clique.error
        if error is not None:
            raise NcclError("NCCL_ERROR_REMOTE_ERROR", f"{error} (simulated NCCL)")

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
        if ptr == 2 and self._clique is not None and self._clique.init_all:
            raise NcclError(
                "NCCL_ERROR_INVALID_USAGE",
                f"allReduce of communicator rank {self._rank} (GPU {self._device}), made with "
                "NcclCommunicator.initAll, on the per-thread default stream (pointer 2, "
                "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1): the per-thread stream handle fails with communicators "
                "made by ncclCommInitAll, which is why cupy keeps NCCL on the legacy null stream (cupy issue "
                "4322). (simulated NCCL: launch the collective on an explicit stream the caller owns, "
                "cupy.cuda.Stream(non_blocking=True) made on the communicator's GPU, ordered after the buffers' "
                "producers with an event; or on the legacy null stream, pointer 0.)",
            )
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
        return f"<simulated NcclCommunicator rank {self._rank} of {self._nranks} on GPU {self._device}>"

    # Collectives towerdist does not use are not simulated.
    def _not_simulated(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError("This NCCL collective is not simulated; only allReduce is.")

    reduce = broadcast = bcast = reduceScatter = allGather = send = recv = _not_simulated  # noqa: N815


_MISSING: Any = object()
