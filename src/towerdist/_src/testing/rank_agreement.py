"""``RankAgreement``: every rank's value of one step of a test session under MPI, within a bound.

towerdist's pytest plugin keeps the ranks of ``mpiexec -n N python -m pytest`` in step: after
collection and after each phase (setup, call, teardown) of each test, every rank learns every
other rank's outcome. Each such step is an :meth:`RankAgreement.exchange`:

* every rank sends ``(what, value)`` to rank 0 (``what`` names the step, e.g. a test's node
  id and phase), which answers every rank with the table of all of them; rank 0 alone knows
  who has arrived;
* the wait is bounded: past ``timeout`` seconds rank 0 tells the ranks that arrived which
  ones did not, and every waiting rank raises :class:`AgreementError` naming them (a rank
  that hears nothing from rank 0 for ``timeout`` plus a grace raises naming rank 0);
* ranks at different steps (a test one rank collected and another did not) raise
  :class:`AgreementError` on every rank, naming each rank's step.

After a timeout the agreement is *broken* (a late rank's message would pair with the wrong
step): later exchanges raise at once, and the MPI job is aborted when the process exits, so
the ranks still stuck are torn down by the launcher instead of hanging.

Messages go over a duplicate of ``COMM_WORLD`` (a user's own MPI calls never match them) as
pickled Python objects; a wait polls back to back for 2 ms (yielding the core), then every
millisecond (a test session's pace, not a training step's).
"""

from __future__ import annotations

import os
import time
from typing import Any, TypeVar

from towerdist._src.mpi_runtime import World

__all__ = ["AgreementError", "RankAgreement"]

_TAG_UP, _TAG_DOWN = 41, 42
_T = TypeVar("_T")  # what each rank brings to an exchange (pickled by mpi4py)
_POLL_SECONDS = 0.001
_YIELD_SECONDS = 0.002  # a wait first polls, yielding the core, this long (a peer about to arrive), then sleeps
_ROOT_GRACE_SECONDS = 2.0  # the other ranks give rank 0 this much longer, since it reports first


class AgreementError(RuntimeError):
    """The ranks could not agree on a step of the session: one did not arrive in time, or they are out of step.

    Attributes:
      missing: the ranks that did not arrive (empty when the ranks are out of step).
    """

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


class RankAgreement:
    """This rank's part in the session's agreements, over a duplicate of ``COMM_WORLD``.

    Args:
      world: the MPI job (``mpi_runtime.world()``).
      timeout: seconds a rank waits for the others at one step (None: no bound).
    """

    def __init__(self, world: World, timeout: float | None) -> None:
        self._world = world
        self.rank, self.size = world.rank, world.size
        self.timeout = timeout
        self._comm = world.MPI.COMM_WORLD.Dup()
        self.broken: str | None = None

    def exchange(self, what: str, value: _T) -> list[_T]:
        """Every rank's ``value`` for step ``what``, in rank order.

        Raises:
          AgreementError: a rank did not reach the step within the timeout, a rank is at
            another step, or an earlier exchange failed (the agreement is broken).
        """
        if self.broken is not None:
            raise AgreementError(f"the ranks can no longer agree: {self.broken}", missing=[])
        if self.rank == 0:
            table = self._gather(what, value)
        else:
            table = self._await_table(what, value)
        steps = [step for step, _ in table]
        if any(step != what for step in steps):
            listing = "; ".join(f"rank {r} is at {step}" for r, step in enumerate(steps))
            raise AgreementError(
                f"the ranks are out of step: {listing}. Every rank must collect the same tests, in the same order.",
                missing=[],
            )
        return [item for _, item in table]

    def _gather(self, what: str, value: object) -> list[tuple[str, Any]]:
        comm = self._comm
        table: list[Any] = [(what, value)] + [None] * (self.size - 1)
        waiting = set(range(1, self.size))
        start = time.monotonic()
        while waiting:
            for r in sorted(waiting):
                if comm.iprobe(source=r, tag=_TAG_UP):
                    table[r] = comm.recv(source=r, tag=_TAG_UP)
                    waiting.discard(r)
            if waiting and self.timeout is not None and time.monotonic() - start > self.timeout:
                missing = sorted(waiting)
                for r in range(1, self.size):
                    if r not in waiting:
                        comm.isend(("timed out", missing), dest=r, tag=_TAG_DOWN)
                raise self._timed_out(what, missing)
            if waiting:
                _pause(start)
        requests = [comm.isend(("ok", table), dest=r, tag=_TAG_DOWN) for r in range(1, self.size)]
        self._complete(requests, what)
        return table

    def _await_table(self, what: str, value: object) -> list[tuple[str, Any]]:
        comm = self._comm
        sent = comm.isend((what, value), dest=0, tag=_TAG_UP)
        bound = None if self.timeout is None else self.timeout + _ROOT_GRACE_SECONDS
        start = time.monotonic()
        while not comm.iprobe(source=0, tag=_TAG_DOWN):
            if bound is not None and time.monotonic() - start > bound:
                raise self._timed_out(what, [0])
            _pause(start)
        status, content = comm.recv(source=0, tag=_TAG_DOWN)
        self._complete([sent], what)
        if status == "timed out":
            raise self._timed_out(what, list(content))
        table: list[tuple[str, Any]] = content
        return table

    def _complete(self, requests: list[Any], what: str) -> None:
        """Waits for sends a peer is receiving (it has arrived), within the bound."""
        start = time.monotonic()
        while not all(request.Test() for request in requests):
            if self.timeout is not None and time.monotonic() - start > self.timeout:
                raise self._timed_out(what, [])
            _pause(start)

    def _timed_out(self, what: str, missing: list[int]) -> AgreementError:
        who = ", ".join(str(r) for r in missing) or "some rank"
        reason = f"rank(s) {who} did not reach {what} within {self.timeout:g} s"
        self.broken = reason
        self._world.mark_broken(f"towerdist's pytest plugin: {reason}")
        hint = (
            " (rank 0 coordinates the agreement and did not answer: it is stuck, busy or dead)"
            if missing == [0]
            else ""
        )
        return AgreementError(
            f"Rank {self.rank}: {reason}{hint}. The ranks are out of step (a rank hangs in a test, crashed, or runs "
            f"other tests); the session stops and the MPI job is aborted when this process exits "
            f"(towerdist_mpi_agreement_timeout sets the bound).",
            missing=missing,
        )


def _pause(start: float) -> None:
    """Between two polls of a wait begun at ``start``: yield the core at first, then sleep."""
    if time.monotonic() - start < _YIELD_SECONDS:
        os.sched_yield()
    else:
        time.sleep(_POLL_SECONDS)
