"""``Communicator``: the workers' collectives over MPI, checked before any result is used.

Every collective begins with **the handshake**: each rank describes its call in a fixed
header (sequence number, API, reduce op, a digest of the dtypes and shapes, one free per-rank
number, its status, its notice, the bytes of payload it sends along) and sends it to every
other rank; every rank then holds the same table of headers and checks it itself, so every
rank reaches the same verdict. A mismatch raises ``InvalidArgumentError`` on every rank,
naming each rank's call (the readable descriptions are exchanged only then), and the next
collective works. A rank whose peers' headers do not arrive within the timeout raises
``DeadlineExceededError`` naming the missing ranks.

**The payload** of a small sum rides in the same message, after the header (``allreduce``
up to ``_EXCHANGE_BYTES``): each rank sends it to every other rank at once, without waiting
for a verdict. Every rank posts its receives first, each with room for any message a peer may
send (a row of ``_inbox``), so a receive never truncates whatever a mismatched peer sent, and
every message sent is received in the same collective: the ranks stay in step even when they
raise. Once every message arrived and the table matched, each rank sums the buffers in rank
order straight into the output (the same sum, bit for bit, on every rank): one message latency
in all, as a raw ``Allreduce`` of small buffers between 2 ranks. Larger payloads move only
after the check: between 2 ranks each sums one half and sends it to the other (``_sum_halves``,
from the input straight into the output), else one ``Iallreduce``; ``Iallgatherv`` and
``Ibcast`` for the other collectives. These are non-blocking and polled with the deadline.

**Ranks of one host** meet in the host's shared window instead (``host_window.py``): each
rank writes its message (header, then a sum's payload up to ``_WINDOW_PAYLOAD_BYTES``) into
its own segment and says it arrived; the others read it in place, and a rank waiting for its
peers blocks on its doorbell after a short poll. Only larger payloads, gathers and broadcasts
then move as MPI messages.

Waiting for MPI: MPI makes progress only while a rank calls it, so a waiting rank polls
(``Testall``); between two polls it *yields its core* (``os.sched_yield()``): a rank that
polled without yielding kept its core while the peer it waited for, or another program,
needed it (4 ranks on 2 cores trained at 0.09x the speed of 2 ranks, and one competing
process cut 2 ranks to 0.33x). A yield costs nothing when nobody else wants the core; once
the waiting rank sees that it shares its core, it sleeps briefly between polls instead
(``waiting.Poller``). The handshake (a peer may still be computing) polls that way for
``_POLL_SECONDS`` (0.2 ms), then sleeps between polls (50 µs, 1 ms once it has waited
50 ms); the payload (every rank is in it, and a sleeping one would hold up the others)
polls with yields until done. After a timeout the communicator is
*broken*: a late peer's call would match the stale request, so later collectives raise
``UnavailableError`` at once and the job is aborted at exit (``mpi_runtime``).

Calls are serialised by a lock: one collective at a time per communicator, from whichever
thread runs the cross-replica part (the caller or a ``merge_fn``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
import warnings
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import profiler as _profiler
from towerdist._src import waiting
from towerdist._src.errors import (
    AbortedError,
    DeadlineExceededError,
    InvalidArgumentError,
    OpError,
    ReplicaStallWarning,
    UnavailableError,
)
from towerdist._src.mpi_runtime import World
from towerdist._src.multi_worker.host_window import HostWindow, open_window

if TYPE_CHECKING:  # mpi4py is optional: mpi_runtime imports it when a job has several processes
    from mpi4py import MPI

__all__ = ["Call", "Communicator"]

_LOCAL_BYTES = 4096  # what one rank may contribute to ``local_allgather``

logger = logging.getLogger("towerdist")

# Header fields (int64), compared up to ``_EXTRA``. ``_NOTICE`` carries ``Communicator.notice``;
# ``_BYTES`` the size of the payload sent after the header in its message (``_NO_PAYLOAD``: none).
_MAGIC, _SEQ, _API, _OP, _DIGEST, _EXTRA, _STATUS, _NOTICE, _BYTES = range(9)
_HEADER = 9
_MAGIC_VALUE = 0x7D157_0002
_OK, _FAILED = 0, 3  # _FAILED: the rank failed before it could take part
_NO_PAYLOAD = -1
_HEADER_BYTES = _HEADER * 8
_PAYLOAD_AT = 128  # where a payload starts in a message: after the header, 64-byte aligned

_TAG_MESSAGE, _TAG_BYE, _TAG_HALVES = 17, 19, 21

# A sum whose payload, times the peers it goes to, is at most this many bytes travels with
# the header (one message latency); a larger one after the check, where each rank sends and
# adds only part of it. 2 ranks, AMD EPYC VM: the exchange matched a raw ``Allreduce`` at 4 and
# 64 KiB; above that the halves (``_sum_halves``) move and add half the bytes per rank.
_EXCHANGE_BYTES = 64 << 10

# Ranks of one host meet in a shared window (``host_window.py``): a sum whose payload is at
# most this many bytes travels in it, with the header; a larger one after the check, as above.
_WINDOW_PAYLOAD_BYTES = 1 << 20
_WAIT_SLICE_SECONDS = 0.05  # a rank blocked in the window looks at the clock (timeouts, warnings, leavers) this often

_POLL_SECONDS = 0.0002  # a handshake polls back to back this long (a peer about to arrive), then sleeps between polls
_SHORT_SLEEP_SECONDS = 0.00005  # between polls after that ...
_SLOW_SECONDS = 0.05  # ... until the wait has lasted this long (a slow peer): then longer sleeps
_MAX_SLEEP_SECONDS = 0.001
_SPIN_SECONDS = 0.005  # a wait this long checks whether a rank has ended its program (leavers)


@functools.lru_cache(maxsize=4096)
def _code(text: str) -> int:
    """A signed 63-bit digest of ``text``."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


class Call:
    """What one rank says about a collective before it moves data.

    Args:
      collective: the collective's name, which the ranks compare (a rank making another call at
        the same point is a mismatch on every rank) and the messages show: the API the user
        called, e.g. ``"ReplicaContext.all_reduce()"``, or what the library does
        (``"td.Variable() creation"``). It is part of the protocol, not only of the wording.
      op: the reduce op or kind of exchange (``"SUM"``, ``"gather"``, ``"broadcast"``).
      signature: what must be equal on every rank (dtypes and shapes), as readable text.
      extra: a per-rank number every rank learns from the handshake (e.g. rows to gather).
      detail: shown in error messages but not compared across ranks (e.g. a variable's name).
    """

    __slots__ = ("collective", "detail", "extra", "op", "signature")

    def __init__(self, collective: str, op: str, signature: str, extra: int = 0, detail: str = "") -> None:
        self.collective = collective
        self.op = op
        self.signature = signature
        self.extra = extra
        self.detail = detail  # shown in messages, not compared (e.g. a variable's name)

    def describe(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.collective}{detail} {self.op} of {self.signature}"


class Communicator:
    """This process's collectives with the other workers, on a duplicate of ``COMM_WORLD``.

    One per process, shared by every ``MultiWorkerMirroredStrategy`` (``workers.py``), so the
    collectives of all of them are numbered in one sequence. Creating it is collective,
    bounded by ``timeout`` (stall warnings every ``warning`` seconds).

    When the program ends, :meth:`close` tells the other ranks this one is leaving, and
    waits for every rank to leave: a rank still waiting in a collective this one will never
    join learns it (``AbortedError``) instead of waiting forever.

    Every handshake also carries each rank's ``notice`` (a number a rank announces, e.g. the
    step at which ``PreemptionCheckpointHandler`` saves): ``agreed_notice`` is the largest
    notice any rank has sent so far, learnt by every rank at the same collective, at no
    extra cost.

    Args:
      world: the MPI job (``mpi_runtime.world()``).
      timeout, warning: bounds in seconds for creating the duplicate (None: no bound).
    """

    def __init__(self, world: World, timeout: float | None = None, warning: float | None = None) -> None:
        self._world = world
        self._MPI = world.MPI
        self._Testall = world.MPI.Request.Testall
        self._comm = self._duplicate(world, timeout, warning)
        self._left: set[int] = set()  # ranks that said they are leaving (their program ended)
        self._bye = np.zeros(1, np.int64)
        self.rank = world.rank
        self.size = world.size
        self._seq = 0
        self._lock = threading.Lock()
        self._broken: str | None = None
        # One message per peer and collective: the header, then (small sums) the payload. A
        # peer's message never exceeds a row of the inbox, so its receive is posted at once.
        capacity = -(-(_PAYLOAD_AT + _EXCHANGE_BYTES // max(1, self.size - 1)) // 64) * 64
        self._outbox = np.zeros(capacity, np.uint8)
        self._header = self._outbox[:_HEADER_BYTES].view(np.int64)
        self._inbox = np.zeros((self.size, capacity), np.uint8)  # row r: rank r's latest message
        self._rows = list(self._inbox)
        self._table = self._inbox[:, :_HEADER_BYTES].view(np.int64)  # a view: every rank's header
        self._own = self._table[self.rank]
        self._peers = [r for r in range(self.size) if r != self.rank]
        self._scratch = np.empty(0, np.uint8)  # _sum_halves' receive buffer for an in-place sum
        self._notices = self._table[:, _NOTICE]  # a view: every rank's notice in the latest handshake
        self.notice = 0
        self.agreed_notice = 0
        self._status = world.MPI.Status()
        # The ranks of this host (MPI's shared-memory split): they share its cores and GPUs.
        # Every rank has created the duplicate above (a bounded wait), so this finds them all.
        self._local = self._comm.Split_type(world.MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank: int = self._local.Get_rank()
        self.local_size: int = self._local.Get_size()
        # More ranks on this host than cores: the ranks take turns on the cores, and a waiting
        # rank must hand its core to a peer at once (waiting.Poller).
        self._crowded = self.local_size > waiting.usable_cores()
        # Every rank on this host: the handshake and small sums go through shared memory, and a
        # waiting rank blocks (host_window.py). The same answer on every rank.
        self._window: HostWindow | None = None
        if self.size > 1 and self.local_size == self.size:
            self._window = open_window(
                world.MPI,
                self._local,
                -(-(_PAYLOAD_AT + _WINDOW_PAYLOAD_BYTES) // 64) * 64,
                lambda value: self.local_allgather(value, timeout, warning),
            )
        self._message_rows: list[np.ndarray] = self._rows  # where the latest handshake's messages are

    def _duplicate(self, world: World, timeout: float | None, warning: float | None) -> MPI.Intracomm:
        comm: MPI.Intracomm  # (world.MPI is the module, typed ModuleType: its members read as Any)
        comm, request = world.MPI.COMM_WORLD.Idup()
        self._await_creation(world, request, timeout, warning)
        return comm

    def _await_creation(self, world: World, request: MPI.Request, timeout: float | None, warning: float | None) -> None:
        start = time.monotonic()
        warned_at = 0.0
        while not request.Test():
            waited = time.monotonic() - start
            if timeout is not None and waited > timeout:
                reason = f"not every rank created a MultiWorkerMirroredStrategy within {timeout:g} s"
                world.mark_broken(reason)
                raise DeadlineExceededError(
                    f"Rank {world.rank}: {reason} (creating the strategy is collective: every process must create "
                    f"it). The job is aborted when this process exits.",
                    missing=[],
                )
            if warning is not None and waited - warned_at > warning:
                warned_at = waited
                message = (
                    f"Rank {world.rank} has waited {waited:.0f} s for the other ranks to create their "
                    f"MultiWorkerMirroredStrategy (every process must create it, at the same point)."
                )
                logger.warning(message)
                warnings.warn(message, ReplicaStallWarning, stacklevel=4)
            time.sleep(_MAX_SLEEP_SECONDS if waited > _SPIN_SECONDS else _SHORT_SLEEP_SECONDS)

    def local_allgather(self, value: object, timeout: float | None, warning: float | None) -> list[Any]:
        """Every rank of this host's ``value`` (JSON-able, at most 4 KiB), in local rank order; for set-up only.

        Bounded by ``timeout`` like the communicator's creation: a rank of this host that
        never comes fails every other one with ``DeadlineExceededError``.
        """
        data = json.dumps(value).encode()
        if len(data) > _LOCAL_BYTES:
            raise ValueError(f"local_allgather() takes at most {_LOCAL_BYTES} bytes of JSON; got {len(data)}.")
        mine = np.zeros(_LOCAL_BYTES, np.uint8)
        mine[: len(data)] = np.frombuffer(data, np.uint8)
        gathered = np.zeros((self.local_size, _LOCAL_BYTES), np.uint8)
        self._await_creation(self._world, self._local.Iallgather(mine, gathered), timeout, warning)
        return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in gathered]

    @property
    def seq(self) -> int:
        """How many collectives this communicator has begun (the same on every rank between collectives)."""
        return self._seq

    @property
    def broken(self) -> str | None:
        """Why the communicator can no longer be used, or None."""
        return self._broken

    # --- the collectives ---------------------------------------------------------------------

    def agree(self, call: Call, timeout: float | None, warning: float | None) -> list[int]:
        """Runs the handshake alone (no payload) and returns every rank's ``call.extra``."""
        with self._guarded(call):
            table = self._handshake(call, timeout, warning)
            return [int(x) for x in table[:, _EXTRA]]

    def fail(self, collective: str, description: str, timeout: float | None, warning: float | None) -> None:
        """Joins the collective the other ranks are in, to tell them this rank failed preparing it.

        The other ranks raise ``AbortedError`` naming this rank and ``description``; this
        one returns, for its caller to raise its own error. Every rank stays in step: the
        next collective works.
        """
        call = Call(collective, "failed before the collective", "")
        with self._guarded(call):
            self._handshake(call, timeout, warning, failure=description)

    def window_fits(self, nbytes: int) -> bool:
        """Whether a sum of ``nbytes`` travels in the host's shared window: its parts may then be
        given apart (:meth:`allreduce_parts`), without being packed into one buffer first."""
        return self._window is not None and nbytes <= _WINDOW_PAYLOAD_BYTES

    def allreduce_parts(
        self,
        parts: Sequence[Sequence[np.ndarray]],
        outs: Sequence[np.ndarray],
        call: Call,
        timeout: float | None,
        warning: float | None,
    ) -> None:
        """:meth:`allreduce` of ``outs[k]``-sized sends given as parts: ``parts[k]`` (1-D, contiguous, of
        ``outs[k]``'s dtype) one after another. Only where :meth:`window_fits` the total.

        The parts are written into this rank's segment of the host's window as they are, and
        the segments summed in rank order into ``outs`` (which may overlap the parts).
        """
        window = self._window
        assert window is not None
        flat = [part for group in parts for part in group]
        with self._guarded(call, "in the host's shared window", flat):
            self._handshake(call, timeout, warning, payload=flat)
            self._sum_inbox(outs)  # this rank's parts too from its segment, where the handshake wrote them

    def allreduce(
        self,
        sends: Sequence[np.ndarray],
        outs: Sequence[np.ndarray],
        call: Call,
        timeout: float | None,
        warning: float | None,
    ) -> None:
        """Writes the sum over the ranks of each 1-D contiguous ``sends[k]`` into ``outs[k]`` (same dtype and size).

        ``outs[k]`` may be ``sends[k]`` itself (an in-place sum), but must not overlap it
        otherwise. Small payloads travel in the handshake's message, after the header (one
        message latency; summed in rank order by numpy). Larger ones move after it: between 2 ranks each
        sums one half and sends it to the other (``_sum_halves``), else one ``Iallreduce``
        per buffer. Integer sums are exact (wrapping as MPI's do) on every path.
        """
        nbytes = sends[0].nbytes if len(sends) == 1 else sum(send.nbytes for send in sends)
        if self._window is not None:
            large = nbytes > _WINDOW_PAYLOAD_BYTES
        else:
            large = nbytes * (self.size - 1) > _EXCHANGE_BYTES
        if large:
            algorithm = "halves (Isend/Irecv)" if self.size == 2 else "MPI_Iallreduce"
            with self._guarded(call, algorithm, sends):
                self._handshake(call, timeout, warning)
                deadline = _deadline(timeout)
                for send, out in zip(sends, outs):
                    if self.size == 2:
                        self._sum_halves(send, out, call, deadline)
                        continue
                    source = self._MPI.IN_PLACE if send is out else send
                    request = self._comm.Iallreduce(source, out, op=self._MPI.SUM)
                    self._spin([request], deadline, call)
            return
        algorithm = "in the host's shared window" if self._window is not None else "exchange with the handshake"
        with self._guarded(call, algorithm, sends):
            self._handshake(call, timeout, warning, payload=sends)
            self._sum_inbox(outs, sends)

    def _sum_halves(self, send: np.ndarray, out: np.ndarray, call: Call, deadline: float | None) -> None:
        """2 ranks: each rank sums one half of the buffer and sends it to the other; nothing is copied first.

        A reduce-scatter then an all-gather, as MPI's large all-reduce, written for two ranks
        with the result received straight into ``out``: 2 ranks, AMD EPYC VM, 1 MiB in 93 µs
        and 16 MiB in 1.40 ms against 115 µs and 1.91 ms for MPICH's in-place ``Allreduce``
        (which would also need the input copied first, 137 µs and 3.0 ms).
        """
        comm, peer, half = self._comm, self._peers[0], send.size // 2
        mine, theirs = (slice(0, half), slice(half, None)) if self.rank == 0 else (slice(half, None), slice(0, half))
        received = out[mine]
        if send is out:  # an in-place sum: the peer's half must not land on this rank's own values
            size = received.nbytes
            if self._scratch.size < size:
                self._scratch = np.empty(size, np.uint8)
            received = self._scratch[:size].view(send.dtype)
        tag = _TAG_HALVES
        self._spin([comm.Isend(send[theirs], dest=peer, tag=tag), comm.Irecv(received, source=peer, tag=tag)], deadline, call)
        np.add(send[mine], received, out=out[mine])  # each half is summed once, on one rank: the same bits everywhere
        self._spin([comm.Isend(out[mine], dest=peer, tag=tag), comm.Irecv(out[theirs], source=peer, tag=tag)], deadline, call)

    def _sum_inbox(self, outs: Sequence[np.ndarray], sends: Sequence[np.ndarray] | None = None) -> None:
        """Each ``outs[k]``: every rank's part ``k`` of the latest messages, summed in rank order.

        With ``sends``, this rank's own part is ``sends[k]`` (its message went to the others
        only); without, it is read from this rank's message too (the host's window).
        """
        rows, rank = self._message_rows, self.rank
        offset = _PAYLOAD_AT
        for k, out in enumerate(outs):
            end = offset + out.nbytes
            parts = [rows[r][offset:end].view(out.dtype) for r in range(self.size)]
            if sends is not None:
                send = sends[k]
                parts[rank] = send.copy() if send is out and rank > 1 else send  # out is written before rank 2's turn
            np.add(parts[0], parts[1], out=out)
            for part in parts[2:]:
                np.add(out, part, out=out)
            offset = end

    def allgatherv(
        self, send: np.ndarray, unit: int, call: Call, timeout: float | None, warning: float | None
    ) -> tuple[np.ndarray, list[int]]:
        """Concatenates every rank's 1-D ``send`` in rank order.

        ``send`` holds ``call.extra`` rows of ``unit`` elements. Returns the concatenation
        and every rank's number of rows.
        """
        with self._guarded(call, "MPI_Iallgatherv", (send,)):
            table = self._handshake(call, timeout, warning)
            rows = [int(x) for x in table[:, _EXTRA]]
            counts = [r * unit for r in rows]
            received = np.empty(sum(counts), send.dtype)
            displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
            request = self._comm.Iallgatherv(send, [received, (counts, displacements)])
            self._spin([request], _deadline(timeout), call)
            return received, rows

    def broadcast(self, buffer: np.ndarray, call: Call, timeout: float | None, warning: float | None) -> None:
        """Overwrites ``buffer`` on every rank with rank 0's (one ``Ibcast``)."""
        with self._guarded(call, "MPI_Ibcast", (buffer,)):
            self._handshake(call, timeout, warning)
            request = self._comm.Ibcast(buffer, root=0)
            self._spin([request], _deadline(timeout), call)

    # --- the handshake ----------------------------------------------------------------------

    def _handshake(
        self,
        call: Call,
        timeout: float | None,
        warning: float | None,
        failure: str | None = None,
        payload: Sequence[np.ndarray] | None = None,
    ) -> np.ndarray:
        """Sends this rank's header (and ``payload`` after it) to every peer, receives theirs, checks; returns the table.

        Every rank's message lands in its row of ``self._inbox``. The receives are posted
        before anything is known, with room for any message a peer may send, so whatever a
        mismatched peer sent is received whole and nothing is left over for the next collective.
        """
        if self._broken is not None:
            raise UnavailableError(
                f"{call.collective} cannot run: the workers' communicator is broken ({self._broken}). Collectives "
                f"after a failed one could match the wrong peers' calls, so the job must be restarted; it is "
                f"aborted when this process exits."
            )
        seq = self._seq
        self._seq = seq + 1
        window = self._window
        outbox = self._outbox if window is None else window.message(seq)
        end = _HEADER_BYTES
        nbytes = _NO_PAYLOAD
        if payload is not None:
            end = _PAYLOAD_AT
            for part in payload:
                start = end
                end += part.nbytes
                outbox[start:end] = part.view(np.uint8)
            nbytes = end - _PAYLOAD_AT
        header = outbox[:_HEADER_BYTES].view(np.int64)
        header[:] = (
            _MAGIC_VALUE, seq, _code(call.collective), _code(call.op), _code(call.signature), call.extra,
            _OK if failure is None else _FAILED, self.notice, nbytes,
        )  # fmt: skip
        self._own[:] = header
        if window is not None:
            window.arrive(seq)
            missing = self._await_window(window, seq, call, timeout, warning)
            if missing:
                raise self._timed_out(call, seq, missing, timeout)
            window.acquire()  # the peers' messages are read after their arrivals were seen
            rows = self._message_rows = [window.row(r, seq) for r in range(self.size)]
            for r in self._peers:
                self._table[r] = rows[r][:_HEADER_BYTES].view(np.int64)
        else:
            comm, rows, peers = self._comm, self._rows, self._peers
            self._message_rows = rows
            message = outbox[:end]
            requests = [comm.Irecv(rows[r], source=r, tag=_TAG_MESSAGE) for r in peers]
            requests += [comm.Isend(message, dest=r, tag=_TAG_MESSAGE) for r in peers]
            missing = self._poll(requests, peers, call, seq, timeout, warning)
            if missing:
                raise self._timed_out(call, seq, missing, timeout)
        table = self._table
        headers = table.tolist()
        if any(row[_STATUS] for row in headers):  # a status other than _OK is _FAILED
            self._failed_elsewhere(table, call, seq, timeout, failure)
            return table  # this rank failed: its caller raises its own error
        first = headers[0][:_EXTRA]
        if any(row[:_EXTRA] != first for row in headers):
            self._mismatch(call, seq, timeout)
        if any(row[_NOTICE] for row in headers):  # a notice is rare
            self.agreed_notice = max(self.agreed_notice, max(row[_NOTICE] for row in headers))
        return table

    def _poll(
        self,
        requests: list[Any],
        ranks: list[int],
        call: Call,
        seq: int,
        timeout: float | None,
        warning: float | None,
    ) -> list[int]:
        """Waits for ``requests`` (``ranks``' messages first, then this rank's); returns the ranks missing at the timeout.

        For ``_POLL_SECONDS`` it polls paced by ``waiting.Poller`` (a peer that is about to
        arrive is seen at once), then sleeps ``_SHORT_SLEEP_SECONDS`` between polls: a rank
        that keeps its core while waiting for a slow peer takes that core from other work.
        """
        testall = self._Testall
        if testall(requests):  # the peers were there first: nothing to set up
            return []
        start = time.monotonic()
        warned_at = 0.0
        poller = waiting.Poller(self._crowded)
        while True:
            if testall(requests):
                return []
            waited = time.monotonic() - start
            if timeout is not None and waited > timeout:
                missing = [r for r, request in zip(ranks, requests) if not request.Test()]
                if not missing:  # every peer is here, only this rank's own sends are still under way
                    self._spin(requests, _deadline(timeout), call)
                return missing
            if warning is not None and waited > warning and waited - warned_at > warning:
                warned_at = waited
                self._warn_stall(call, seq, waited, [r for r, request in zip(ranks, requests) if not request.Test()])
            if waited < _POLL_SECONDS:
                poller.pause()
                continue
            if waited > _SPIN_SECONDS:
                self._check_leavers(call, seq)
                time.sleep(_MAX_SLEEP_SECONDS if waited > _SLOW_SECONDS else _SHORT_SLEEP_SECONDS)
            else:
                time.sleep(_SHORT_SLEEP_SECONDS)

    def _await_window(
        self, window: HostWindow, seq: int, call: Call, timeout: float | None, warning: float | None
    ) -> list[int]:
        """Waits until every peer wrote its message for ``seq`` in the host's window; the ranks missing at the timeout.

        Polls for ``_POLL_SECONDS`` (not when the host has more ranks than cores), then blocks
        on this rank's doorbell in slices of at most ``_WAIT_SLICE_SECONDS``, looking at the
        clock (the timeout, stall warnings) and for ranks that ended their program between them.
        """
        if not window.missing(seq):
            return []
        start = time.monotonic()
        warned_at = 0.0
        poller = waiting.Poller(self._crowded)
        while True:
            waited = time.monotonic() - start
            if timeout is not None and waited > timeout:
                return window.missing(seq)
            if warning is not None and waited > warning and waited - warned_at > warning:
                warned_at = waited
                self._warn_stall(call, seq, waited, window.missing(seq))
            if waited < _POLL_SECONDS and not self._crowded:
                poller.pause()
                if not window.missing(seq):
                    return []
                continue
            if waited > _SPIN_SECONDS:
                self._check_leavers(call, seq)
            slice_seconds = _WAIT_SLICE_SECONDS
            if timeout is not None:
                slice_seconds = min(slice_seconds, max(timeout - waited, 0.0) + 1e-3)
            if warning is not None:
                slice_seconds = min(slice_seconds, max(warning - (waited - warned_at), 0.0) + 1e-3)
            if window.wait(seq, slice_seconds):
                return []

    def _mismatch(self, call: Call, seq: int, timeout: float | None) -> None:
        # Every rank sees the same table, so every rank is here: exchange readable descriptions.
        texts = self._exchange_text(f"{call.describe()} (collective #{seq})", call, timeout)
        lines = "; ".join(f"rank {r} called {text}" for r, text in enumerate(texts))
        raise InvalidArgumentError(
            f"{call.collective}: the workers' collective calls do not match: {lines}. Every worker must make the same "
            f"collective calls (all_reduce, reduce, gather, variable creation, ...) in the same order, with "
            f"the same shapes and dtypes; a variable created on one worker only, or a step skipped on one "
            f"worker, puts the workers out of step.",
            ranks=list(range(self.size)),
            descriptions=texts,
        )

    def _failed_elsewhere(self, table: np.ndarray, call: Call, seq: int, timeout: float | None, mine: str | None) -> None:
        """Some rank failed before this collective: every rank learns who and why; the others raise."""
        failed = [r for r in range(self.size) if table[r, _STATUS] == _FAILED]
        texts = self._exchange_text(mine or "", call, timeout)
        if mine is not None:
            return
        reasons = "; ".join(f"rank {r}: {texts[r]}" for r in failed)
        raise AbortedError(
            f"{call.collective} (collective #{seq}) cannot run: rank(s) {', '.join(map(str, failed))} failed while preparing "
            f"it ({reasons}), so rank {self.rank} raises too. Every worker raises at this collective and they stay "
            f"in step: the next collective works. See the failing rank's error for the cause.",
            ranks=failed,
        )

    def _exchange_text(self, text: str, call: Call, timeout: float | None) -> list[str]:
        data = np.frombuffer(text.encode(), np.uint8)
        lengths = np.zeros(self.size, np.int64)
        request = self._comm.Iallgather(np.array([data.size], np.int64), lengths)
        self._spin([request], _deadline(timeout), call)
        counts = lengths.tolist()
        received = np.empty(sum(counts), np.uint8)
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        request = self._comm.Iallgatherv(data, [received, (counts, displacements)])
        self._spin([request], _deadline(timeout), call)
        return [received[d : d + c].tobytes().decode(errors="replace") for d, c in zip(displacements, counts)]

    # --- phase 2: the payload ----------------------------------------------------------------

    def _spin(self, pending: list[Any], deadline: float | None, call: Call) -> None:
        testall = self._Testall
        # Every rank is in this transfer: each must keep polling for it to progress, so a
        # waiting rank yields (a sleeping one would hold up its peers) even under foreign load.
        poller = waiting.Poller(crowded=True)
        while True:
            if testall(pending):
                return
            poller.pause()
            if deadline is not None and time.monotonic() > deadline:
                reason = f"{call.collective} timed out while moving its data between the ranks"
                self.mark_broken(reason)
                raise DeadlineExceededError(
                    f"{reason}: every rank had arrived, but the transfer did not complete in time (a rank died "
                    f"or stalled inside MPI). The job is aborted at exit; restart it.",
                    missing=[],
                )

    # --- leaving ----------------------------------------------------------------------------------

    def close(self, timeout: float | None, warning: float | None) -> None:
        """Tells the other ranks this one is leaving, then waits until every rank has (at exit).

        A rank still computing is waited for (with stall warnings); one waiting in a
        collective sees the notice and raises ``AbortedError``. Past ``timeout`` (if any),
        the job is marked for abort.
        """
        if self._broken is not None:
            return  # the job is aborted at exit anyway
        with self._lock:
            sends = [self._comm.Isend(self._bye, dest=r, tag=_TAG_BYE) for r in range(self.size) if r != self.rank]
            if self._window is not None:
                self._window.ring_all()  # a peer blocked in the window looks for the notice at once
            barrier = self._comm.Ibarrier()
            start = time.monotonic()
            warned_at = 0.0
            while not self._Testall([barrier, *sends]):
                waited = time.monotonic() - start
                if timeout is not None and waited > timeout:
                    self.mark_broken(f"rank {self.rank} ended, but other ranks had not ended {timeout:g} s later")
                    return
                if warning is not None and waited - warned_at > warning:
                    warned_at = waited
                    logger.warning(
                        f"Rank {self.rank} has ended and waited {waited:.0f} s for the other ranks to end (they are "
                        f"still computing, or stuck outside towerdist's collectives)."
                    )
                time.sleep(_MAX_SLEEP_SECONDS if waited > _SPIN_SECONDS else _SHORT_SLEEP_SECONDS)

    def _check_leavers(self, call: Call, seq: int) -> None:
        """Raises ``AbortedError`` if a rank has ended its program while this one waits in a collective."""
        while self._comm.Iprobe(source=self._MPI.ANY_SOURCE, tag=_TAG_BYE, status=self._status):
            source = self._status.Get_source()
            self._comm.Recv(self._bye, source=source, tag=_TAG_BYE)
            self._left.add(source)
        if self._left:
            who = ", ".join(str(r) for r in sorted(self._left))
            reason = f"rank(s) {who} ended their program without reaching {call.collective} (collective #{seq})"
            self.mark_broken(reason)
            raise AbortedError(
                f"Rank {self.rank}: {reason}, so it can never complete. Every worker must make the same collective "
                f"calls: a worker that returns early, calls sys.exit() or catches an error the others do not see "
                f"leaves them waiting. The job is aborted when this process exits.",
                ranks=sorted(self._left),
            )

    # --- failures ----------------------------------------------------------------------------

    def mark_broken(self, reason: str) -> None:
        """Records that this communicator can no longer be trusted; the job aborts at exit."""
        if self._broken is None:
            self._broken = reason
            self._world.mark_broken(reason)

    def _guarded(self, call: Call, algorithm: str = "handshake", payload: Sequence[np.ndarray] = ()) -> _Guarded:
        """One collective at a time; an interruption mid-way (Ctrl-C, a warning turned error) breaks it.

        The posted requests of an interrupted collective would pair with the next one's
        messages, so the ranks could never agree again. ``algorithm`` and ``payload`` (the
        buffers sent) are for the timeline.
        """
        return _Guarded(self, call, algorithm, payload)

    def _timed_out(self, call: Call, seq: int, missing: list[int], timeout: float | None) -> DeadlineExceededError:
        who = ", ".join(str(r) for r in missing)
        reason = f"rank(s) {who} did not reach {call.collective} (collective #{seq}) within {timeout:g} s"
        self.mark_broken(reason)
        return DeadlineExceededError(
            f"Rank {self.rank}: {reason}, so the collective cannot complete (CommunicationOptions.timeout_seconds). "
            f"The ranks that did arrive all raise this error; the communicator is now broken (later "
            f"collectives raise UnavailableError) and the job is aborted when this process exits.",
            missing=missing,
        )

    def _warn_stall(self, call: Call, seq: int, waited: float, missing: list[int]) -> None:
        who = f"rank(s) {', '.join(str(r) for r in missing)} have not reached it"
        message = (
            f"Rank {self.rank} has waited {waited:.0f} s in {call.collective} (collective #{seq}): {who}. A rank that "
            f"skipped a collective, runs a different code path, or is stuck, makes the others wait; set "
            f"CommunicationOptions(timeout_seconds=...) to fail instead of waiting."
        )
        logger.warning(message)
        warnings.warn(message, ReplicaStallWarning, stacklevel=2)


class _Guarded:
    """``Communicator._guarded``'s context: a class, as a generator-based one cost ~2 µs per collective."""

    __slots__ = ("_algorithm", "_begin", "_call", "_communicator", "_payload")

    def __init__(self, communicator: Communicator, call: Call, algorithm: str, payload: Sequence[np.ndarray]) -> None:
        self._communicator = communicator
        self._call = call
        self._algorithm = algorithm
        self._payload = payload
        self._begin = 0

    def __enter__(self) -> None:
        self._communicator._lock.acquire()
        self._begin = _profiler.now() if _profiler.active else 0

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        communicator, call = self._communicator, self._call
        try:
            if error is not None and not isinstance(error, OpError):
                # A mismatch leaves the communicator usable; timeouts have broken it already.
                communicator.mark_broken(
                    f"{call.collective} was interrupted on rank {communicator.rank} by {type(error).__name__}"
                )
            if self._begin and _profiler.active:
                _record_collective(call, self._algorithm, self._payload, self._begin, error is not None)
        finally:
            communicator._lock.release()


def _record_collective(call: Call, algorithm: str, payload: Sequence[np.ndarray], begin: int, failed: bool) -> None:
    """Adds a collective to the timeline (a profiler is running)."""
    args: dict[str, Any] = {
        "api": call.collective,
        "op": call.op,
        "signature": call.signature,
        "algorithm": algorithm,
        "bytes": sum(int(b.nbytes) for b in payload),
        "packs": len(payload),
    }
    if failed:
        args["error"] = True
    _profiler.record(f"MPI {call.op}: {call.collective}", begin, args)


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout
