"""Simulated NCCL between processes: the ranks of a clique meet, and all-reduce, through files on one host.

Real NCCL bootstraps a communicator over TCP from the unique id (``ncclCommInitRank``
blocks until every rank has joined) and then moves data over NVLink, PCIe or the network.
Simulated GPUs are numpy arrays in each process, so processes on one host (each
simulating the host's GPUs: GPU i of process A *is* GPU i of process B) stand in for that
transport with files in a directory on the local disk, one directory per clique:
``<tempfile.gettempdir()>/towerdist-simulated-nccl-<token hex>`` (or under
``TOWERDIST_SIMULATED_NCCL_DIR``), the token being the random part of the unique id.

* **Joining** (:class:`Rendezvous`): each rank writes ``join-r<rank>`` (its host, GPU,
  process, machine and ``nranks``), exclusively, so a rank created twice is seen; the
  clique is complete when all ``nranks`` join files exist.
* **All-reduce** (:class:`Transport`): at launch a rank writes its contribution for the
  clique's k-th collective, ``c<k>-r<rank>`` (a JSON header with the call's signature, a
  newline, the send buffer's bytes); the collective completes on a rank once every rank's
  contribution for k exists. A rank records the last collective it completed in
  ``progress-r<rank>``; a collective's contributions are removed once every rank has
  completed it.
* **Abort**: ``abort-r<rank>`` holds the reason; the other ranks see it.

Every file is written atomically (a temporary file, then a rename or a link), so a reader
sees a whole file or none. At interpreter exit a process marks its ranks gone
(``gone-r<rank>``), and the process that leaves every joined rank gone removes the
directory: a process that finished first must not take away a file a slower rank has yet
to read. This module only moves bytes; the rules (and their errors) are ``nccl``'s.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import tempfile
import threading
from typing import Any, NamedTuple

from towerdist._src.atomic_file import AtomicFile

__all__ = ["DIR_ENV_VAR", "Member", "Rendezvous", "Transport", "clique_directory", "host_name"]

DIR_ENV_VAR = "TOWERDIST_SIMULATED_NCCL_DIR"
_DIR_PREFIX = "towerdist-simulated-nccl-"


def clique_directory(token: bytes) -> str:
    """The directory where the ranks of the clique with ``token`` meet."""
    root = os.environ.get(DIR_ENV_VAR, "").strip() or tempfile.gettempdir()
    return os.path.join(root, _DIR_PREFIX + token.hex())


class Member(NamedTuple):
    """One rank that joined a clique, as its join file says."""

    rank: int
    nranks: int
    host: str
    device: int
    pid: int
    machine: int

    def describe(self) -> str:
        return f"rank {self.rank} (GPU {self.device} of host {self.host}, process {self.pid})"


def _write(path: str, data: bytes, exclusive: bool = False) -> bool:
    """Writes ``path`` atomically; with ``exclusive``, returns False (and writes nothing) if it exists."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        # Not durable: the files live as long as the clique, and nothing reads them after a crash.
        with AtomicFile(path, durable=False, exclusive=exclusive) as file:
            file.write(data)
    except FileExistsError:
        if not exclusive:
            raise
        return False
    return True


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Cleanup:
    """The clique directories this process's ranks joined, cleaned up at interpreter exit.

    A process must not remove a file another rank may still read (a join record it has not
    polled yet, a contribution it has not collected), so at exit each process only marks its
    ranks gone (``gone-r<rank>``); the process whose exit leaves every rank that joined gone
    removes the directory with everything in it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: dict[str, set[tuple[int, int]]] = {}  # directory -> (pid, rank) of this process's ranks

    def register(self, directory: str, rank: int) -> None:
        with self._lock:
            self._ranks.setdefault(directory, set()).add((os.getpid(), rank))

    def at_exit(self) -> None:
        """Marks this process's ranks gone; removes each directory all of whose joined ranks are gone."""
        with self._lock:
            # A forked child inherits the table: it leaves its parent's ranks alone.
            mine = {d: {r for pid, r in ranks if pid == os.getpid()} for d, ranks in self._ranks.items()}
            self._ranks.clear()
        for directory, ranks in mine.items():
            try:
                for rank in ranks:
                    _write(os.path.join(directory, f"gone-r{rank}"), b"")
                names = set(os.listdir(directory))
            except OSError:
                continue  # already removed by the last rank to leave
            joined = {name[len("join-") :] for name in names if name.startswith("join-r")}
            if all(f"gone-{rank}" in names for rank in joined):
                shutil.rmtree(directory, ignore_errors=True)


_CLEANUP = _Cleanup()
atexit.register(_CLEANUP.at_exit)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


class Rendezvous:
    """One rank's joining of a clique (``ncclCommInitRank``'s bootstrap), through its directory.

    Args:
      directory: the clique's directory (:func:`clique_directory`).
      me: the joining rank.

    Attributes:
      taken_by: if another rank already wrote this rank's join file, that rank (then nothing
        was written); else None.
    """

    def __init__(self, directory: str, me: Member) -> None:
        self.directory = directory
        self.me = me
        path = os.path.join(directory, f"join-r{me.rank}")
        self.taken_by: Member | None = None
        if _write(path, json.dumps(me._asdict()).encode(), exclusive=True):
            _CLEANUP.register(directory, me.rank)
        else:
            self.taken_by = self._member(me.rank)

    def poll(self) -> list[Member] | None:
        """Every rank's join record once all ``nranks`` have joined, else None."""
        members = [self._member(rank) for rank in range(self.me.nranks)]
        if any(member is None for member in members):
            return None
        return [m for m in members if m is not None]

    def missing(self) -> list[int]:
        """The ranks that have not joined yet."""
        return [rank for rank in range(self.me.nranks) if self._member(rank) is None]

    def _member(self, rank: int) -> Member | None:
        data = _read(os.path.join(self.directory, f"join-r{rank}"))
        return None if data is None else Member(**json.loads(data))


class Transport:
    """The collectives of one clique's ranks in this process, exchanged through the clique's directory.

    Args:
      directory: the clique's directory.
      nranks: the number of ranks.
    """

    def __init__(self, directory: str, nranks: int) -> None:
        self.directory = directory
        self.nranks = nranks
        self._uncollected: set[int] = set()  # collectives of local ranks whose files may still exist

    def contribute(self, rank: int, seq: int, header: dict[str, Any], data: bytes) -> None:
        """Writes ``rank``'s contribution to collective ``seq``: ``header`` (JSON) and the send buffer's bytes."""
        _write(self._path(seq, rank), json.dumps(header).encode() + b"\n" + data)
        self._uncollected.add(seq)

    def collect(self, seq: int) -> list[tuple[dict[str, Any], bytes]] | None:
        """Every rank's (header, bytes) for collective ``seq``, in rank order; None until all exist."""
        found = []
        for rank in range(self.nranks):
            data = _read(self._path(seq, rank))
            if data is None:
                return None
            header, _, payload = data.partition(b"\n")
            found.append((json.loads(header), payload))
        return found

    def missing(self, seq: int) -> list[int]:
        """The ranks whose contribution to collective ``seq`` does not exist (yet)."""
        return [rank for rank in range(self.nranks) if not os.path.exists(self._path(seq, rank))]

    def finished(self, rank: int, seq: int) -> None:
        """Records that local ``rank`` completed collective ``seq``; removes the contributions every rank has collected."""
        _write(os.path.join(self.directory, f"progress-r{rank}"), str(seq).encode())
        done = min(self._progress(r) for r in range(self.nranks))
        for old in [s for s in self._uncollected if s <= done]:
            for owner in range(self.nranks):
                _remove(self._path(old, owner))
            self._uncollected.discard(old)

    def abort(self, rank: int, reason: str) -> None:
        """Tells the other ranks that ``rank`` was aborted (``reason``)."""
        _write(os.path.join(self.directory, f"abort-r{rank}"), reason.encode())

    def error(self, local_ranks: set[int]) -> str | None:
        """The reason another rank (not among ``local_ranks``) was aborted, or None."""
        for rank in range(self.nranks):
            if rank in local_ranks:
                continue
            data = _read(os.path.join(self.directory, f"abort-r{rank}"))
            if data is not None:
                return data.decode(errors="replace")
        return None

    def _progress(self, rank: int) -> int:
        data = _read(os.path.join(self.directory, f"progress-r{rank}"))
        return -1 if not data else int(data)

    def _path(self, seq: int, rank: int) -> str:
        return os.path.join(self.directory, f"c{seq}-r{rank}")


def host_name() -> str:
    """This host's name, as the join records give it."""
    return socket.gethostname()
