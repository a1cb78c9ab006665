"""``HostWindow``: the ranks of one host meet in MPI-3 shared memory and wait for each other by blocking.

When every rank of the job runs on one host, the communicator's handshake (and a sum's
payload) need not travel as MPI messages: each rank owns a segment of one shared window
(``MPI.Win.Allocate_shared`` on the host's communicator) and writes its message (the
header, then the payload) there; its peers read it in place. MPI stays the control plane
(creating the window, the readable texts of a mismatch, leaving) and the transport between
hosts.

**Arriving.** A rank writes its message into its segment, then its *arrival* (the
collective's sequence number) in its control block; a peer has arrived at collective ``seq``
once its arrival is at least ``seq``. Messages alternate between two halves of a segment by
the parity of ``seq``: a rank writes collective ``seq + 2``'s message only after every peer
arrived at a collective after ``seq``, so by then every peer has read ``seq``'s.

**Waiting.** A rank whose peers have not all arrived polls their arrivals for a short
while, then *blocks*: it says it sleeps (its control block), checks once more and waits on
its doorbell, a named pipe (FIFO) that a peer rings with one byte after arriving. Blocked,
it takes no CPU from its peers or from other programs: this is what lets ranks share cores
(more ranks than cores, or a competing process) without the polling that MPI's own waits
need to make progress. The rank that says it sleeps and the rank that arrives each put a
memory barrier (``Win.Sync``) between their store and their load of the other's flag, so
one of them always sees the other: no ring is lost. A stale ring (a byte left from an
earlier wait) only makes a wait look once more.

Only where the ranks share one host, a POSIX system (named pipes, ``poll``) and an MPI with
shared windows; :func:`open_window` returns None elsewhere and the communicator uses MPI messages.
``TOWERDIST_HOST_WINDOW=0`` turns it off (on one rank: for all of them).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import tempfile
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # mpi4py is optional: the caller passes its module (MPI)
    from mpi4py.MPI import Comm, Win

__all__ = ["HostWindow", "open_window"]

_ENV = "TOWERDIST_HOST_WINDOW"
_CONTROL_BYTES = 64  # a segment's control block: arrival, sleeping (int64 each), padded to a cache line
_ARRIVED, _SLEEPING = 0, 1


class HostWindow:
    """This rank's segment of the host's shared window, its peers' segments, and the doorbells.

    Made by :func:`open_window` (collective over the host's ranks). ``capacity`` is the size of
    one message half; ``message(seq)`` is where this rank writes collective ``seq``'s message,
    ``row(r, seq)`` where rank ``r`` wrote its own.
    """

    def __init__(
        self, win: Win, segments: list[np.ndarray], rank: int, capacity: int, reads: int, rings: list[int]
    ) -> None:
        self._win = win
        self._rank = rank
        self.capacity = capacity
        self._controls = [segment[:_CONTROL_BYTES].view(np.int64) for segment in segments]
        self._halves = [
            (segment[_CONTROL_BYTES : _CONTROL_BYTES + capacity], segment[_CONTROL_BYTES + capacity :])
            for segment in segments
        ]
        self._own = self._controls[rank]
        self._peers = [r for r in range(len(segments)) if r != rank]
        self._read = reads  # this rank's doorbell (non-blocking read end)
        self._rings = rings  # every rank's doorbell (write ends), by rank; this rank's own is never rung
        self._sync: Callable[[], None] = win.Sync
        self._doorbell = select.poll()  # (not select.select: a process may hold more than 1024 files)
        self._doorbell.register(reads, select.POLLIN)

    def message(self, seq: int) -> np.ndarray:
        """The bytes this rank writes collective ``seq``'s message into."""
        return self._halves[self._rank][seq & 1]

    def row(self, rank: int, seq: int) -> np.ndarray:
        """The bytes rank ``rank`` wrote collective ``seq``'s message into (read them once it arrived)."""
        return self._halves[rank][seq & 1]

    def arrive(self, seq: int) -> None:
        """Says this rank's message for collective ``seq`` is written; rings the peers that sleep."""
        sync = self._sync
        sync()  # the message before the arrival
        self._own[_ARRIVED] = seq
        sync()  # the arrival before the peers' sleeping flags are read
        for r in self._peers:
            if self._controls[r][_SLEEPING]:
                self.ring(r)

    def acquire(self) -> None:
        """A memory barrier after seeing every peer's arrival, before reading their messages
        (needed on processors that reorder loads; free of cost on x86)."""
        self._sync()

    def ring(self, rank: int) -> None:
        """Wakes rank ``rank`` if it waits on its doorbell (a full pipe already rings)."""
        with contextlib.suppress(BlockingIOError, BrokenPipeError):  # a gone peer is found by the timeout
            os.write(self._rings[rank], b"\x01")

    def ring_all(self) -> None:
        """Wakes every peer (this rank is leaving: a waiting peer should look at once)."""
        for r in self._peers:
            self.ring(r)

    def missing(self, seq: int) -> list[int]:
        """The peers that have not arrived at collective ``seq``."""
        return [r for r in self._peers if self._controls[r][_ARRIVED] < seq]

    def wait(self, seq: int, seconds: float) -> bool:
        """Blocks until every peer arrived at ``seq`` or ``seconds`` passed; whether they all arrived."""
        if not self.missing(seq):
            return True
        own, sync = self._own, self._sync
        own[_SLEEPING] = 1
        try:
            sync()  # the sleeping flag before the arrivals are read again
            if not self.missing(seq):
                return True
            self._doorbell.poll(max(1, int(seconds * 1000)))
            with contextlib.suppress(BlockingIOError):
                os.read(self._read, 4096)  # this ring, and any stale one
        finally:
            own[_SLEEPING] = 0
        return not self.missing(seq)

    def close(self) -> None:
        """Closes the doorbells (at exit). The window itself goes with the process: freeing it is
        collective, and a rank leaving after a timeout would leave the others waiting in it."""
        for fd in [self._read, *(fd for fd in self._rings if fd >= 0)]:
            with contextlib.suppress(OSError):
                os.close(fd)


def open_window(
    MPI: ModuleType, local: Comm, capacity: int, allgather: Callable[[object], list[Any]]
) -> HostWindow | None:
    """The host's shared window (every rank of ``local``, the host's communicator), or None where it cannot be.

    Collective over ``local``; ``allgather(value)`` gathers a JSON value from every rank of
    the host (bounded, as the communicator's creation). None when turned off
    (``TOWERDIST_HOST_WINDOW=0``), without named pipes, or when MPI has no shared windows;
    every rank gets the same answer.
    """
    wanted = os.environ.get(_ENV, "1").strip() != "0" and hasattr(os, "mkfifo") and hasattr(select, "poll")
    rank, size = local.Get_rank(), local.Get_size()
    directory = tempfile.mkdtemp(prefix="towerdist-doorbells-") if rank == 0 and wanted else None
    answers = allgather([wanted, directory])  # one rank turning it off turns it off for all
    if not all(answer[0] for answer in answers):
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        return None
    directory = answers[0][1]
    reads, rings, ok = -1, [-1] * size, True
    try:
        path = os.path.join(directory, str(rank))
        os.mkfifo(path, 0o600)
        reads = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        ok = False
    if not all(allgather(ok)):  # every read end is open before anyone opens a write end
        _close(reads)
        _remove(directory, rank)
        return None
    try:
        for r in range(size):  # this rank's own write end too: a doorbell never reads end-of-file when peers exit
            rings[r] = os.open(os.path.join(directory, str(r)), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        ok = False
    ok = all(allgather(ok))
    _remove(directory, rank)  # every end is open: the names are no longer needed
    if not ok:
        for fd in (reads, *rings):
            _close(fd)
        return None
    segment_bytes = _CONTROL_BYTES + 2 * capacity
    try:
        win = MPI.Win.Allocate_shared(segment_bytes, 1, comm=local)
        win.Lock_all(MPI.MODE_NOCHECK)
        segments = []
        for r in range(size):
            memory, _ = win.Shared_query(r)
            segments.append(np.frombuffer(memory, np.uint8, count=segment_bytes))
    except Exception:  # an MPI without shared windows: every rank fails alike (collective calls)
        for fd in (reads, *rings):
            _close(fd)
        return None
    segments[rank][:_CONTROL_BYTES] = 0
    control = segments[rank][:_CONTROL_BYTES].view(np.int64)
    control[_ARRIVED] = -1
    win.Sync()
    allgather(True)  # every control block is set before anyone reads one
    return HostWindow(win, segments, rank, capacity, reads, rings)


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _remove(directory: str, rank: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, str(rank)))
    if rank == 0:
        deadline = time.monotonic() + 1.0  # the others unlink their own names at the same time
        while time.monotonic() < deadline and os.path.isdir(directory):
            try:
                os.rmdir(directory)
            except OSError:
                time.sleep(0.001)
        shutil.rmtree(directory, ignore_errors=True)
