"""The watch over a step: stall warnings and hard timeouts (the bounds live in ``replica_timeouts.py``).

Every thread that waits in a ``strategy.run`` step — a replica parked at the barrier or
waiting for its turn, the caller waiting for the replica threads to finish — wakes at
least every ``_MAX_POLL_SECONDS`` and looks at the step (:meth:`Watch.check`; one
:class:`Watch` per step, so a stall is reported once, by whichever waiter sees it first):

* **a stalled round** — replicas parked at the barrier have waited longer than the
  warning bound for others: warn (``ReplicaStallWarning`` and the ``towerdist`` logger)
  naming the replicas that did not arrive and what the others wait in; past the hard
  timeout, fail the step with ``DeadlineExceededError``. Only parked replicas are timed: a
  replica computing longer than returned ones waits for nobody.
* **a slow request** — a ``merge_fn`` (or collective) running that long while every
  replica waits for it;
* **a stuck turn** — in a sequential step, the replica holding the turn;
* **a slow drain** — after a failure, replicas still in user code;
* **a lost thread** — a replica thread that ended without reporting fails the step.

Replica 0 runs on the caller's thread. While it computes, the replicas parked at the
barrier watch; if replica 0 itself never arrives, they warn and time out (the timeout is
also logged at once, since ``run`` can only raise it when replica 0's code returns).

An exception raised in the caller while it waits (``KeyboardInterrupt``, a warning turned
into an error, a test timeout) stops the step; ``run`` re-raises it once the replicas are
idle, wherever it landed (the wait trusts ``step.remaining``, never a wake-up the
interrupt may have consumed). A second one gives up on the threads at once.

The bounds are set with ``td.config.set_replica_timeouts`` or the environment variables
``TOWERDIST_REPLICA_WARNING_SECONDS`` and ``TOWERDIST_REPLICA_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, NamedTuple

from towerdist._src import replica_timeouts, waiting
from towerdist._src.errors import DeadlineExceededError, ReplicaStallWarning

if TYPE_CHECKING:
    from towerdist._src.strategies.replica_step import Step

__all__ = ["Status", "Watch", "name_of", "wait_for"]

logger = logging.getLogger("towerdist")

# The caller wakes up at least this often while it waits. A signal delivered to another
# thread (SIGINT to a replica thread) only runs its Python handler when the main thread
# next runs bytecode, so this bounds how late a KeyboardInterrupt can surface.
_MAX_POLL_SECONDS = 0.1


# --- watching a step -------------------------------------------------------------------------


class Status(NamedTuple):
    """What the watch reads of a step, taken under its lock."""

    failure: BaseException | None
    failure_origin: tuple[str, int | None] | None
    failure_time: float | None
    round: int
    round_started: float | None
    merge_started: float | None
    turn: int
    turn_started: float | None
    kinds: tuple[str | None, ...]
    merge_counts: tuple[int, ...]
    waiting_in: str | None  # what the parked replicas wait in, e.g. "merge_call() (merge_fn=f)"
    exited: tuple[bool, ...]
    handed: tuple[bool, ...] = ()  # replicas that handed their request of this round over and went on


class Watch:
    """What has been reported about one step, and the checks every waiting thread runs.

    Each step holds its own ``Watch``; the watch holds no reference back (the checks take
    the step), so that a finished step and its results are freed without the cycle collector.
    """

    __slots__ = ("_lock", "drain_warned", "lost_threads", "merge_warned", "round_warned", "turn_warned")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.round_warned = -1
        self.merge_warned = -1
        self.turn_warned: float | None = None
        self.drain_warned = float("-inf")
        self.lost_threads = False  # a replica thread ended without reporting

    @staticmethod
    def poll_seconds() -> float:
        """How long a waiting thread may block before it looks at the step again."""
        return _poll_interval(replica_timeouts.bounds["warning_seconds"], replica_timeouts.bounds["timeout_seconds"])

    def check(self, step: Step) -> None:
        """Warns about a stalled round, a slow request or a stuck turn; fails the step past the timeout.

        A replica thread that ended without reporting fails the step too. Does nothing while
        another thread is checking.
        """
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._check(step)
        finally:
            self._lock.release()

    def _check(self, step: Step) -> None:
        if not self._threads_alive(step):
            return
        warning_s = replica_timeouts.bounds["warning_seconds"]
        timeout_s = replica_timeouts.bounds["timeout_seconds"]
        now = time.monotonic()
        status = step.status()
        if status.failure_time is not None:
            return  # draining: the caller watches the replicas still in user code (wait_for)
        if status.merge_started is not None:
            waited = now - status.merge_started
            if warning_s is not None and waited >= warning_s and self.merge_warned != status.round:
                self.merge_warned = status.round
                _warn(_describe_slow_merge(step, waited))
            if timeout_s is not None and waited >= timeout_s:
                self._time_out(step, _describe_slow_merge(step, waited), timeout_s, missing=[])
        elif step.sequential and status.turn_started is not None:
            # One replica runs at a time: time the one holding the turn, not the round, and
            # only while another replica waits for it (after the others returned, nobody does).
            if all(status.exited[r] for r in range(step.num_replicas) if r != status.turn):
                return
            waited = now - status.turn_started
            if warning_s is not None and waited >= warning_s and self.turn_warned != status.turn_started:
                self.turn_warned = status.turn_started
                _warn(_describe_turn(step, status, waited))
            if timeout_s is not None and waited >= timeout_s:
                holder = [status.turn] if status.turn < step.num_replicas else []
                self._time_out(step, _describe_turn(step, status, waited), timeout_s, missing=holder)
        elif status.round_started is not None:
            waited = now - status.round_started
            if warning_s is not None and waited >= warning_s and self.round_warned != status.round:
                self.round_warned = status.round
                _warn(_describe_stall(step, status, waited))
            if timeout_s is not None and waited >= timeout_s:
                missing = [r for r, kind in enumerate(status.kinds) if kind is None and not status.exited[r]]
                self._time_out(step, _describe_stall(step, status, waited), timeout_s, missing=missing)

    def drain(self, step: Step) -> bool:
        """After a failure, the caller's look at replicas still in user code; True: give up on them."""
        status = step.status()
        if status.failure_time is None:
            return False
        warning_s = replica_timeouts.bounds["warning_seconds"]
        timeout_s = replica_timeouts.bounds["timeout_seconds"]
        now = time.monotonic()
        waited = now - status.failure_time
        if warning_s is not None and waited >= warning_s and now - self.drain_warned >= warning_s:
            self.drain_warned = now
            _warn(_describe_drain(step, status, waited))
        return timeout_s is not None and waited >= timeout_s

    def _threads_alive(self, step: Step) -> bool:
        """False when a replica thread is gone without reporting (reported as a failure)."""
        alive = step.alive()
        if all(alive):
            return True
        status = step.status()
        dead = [r for r, up in enumerate(alive) if not up and not status.exited[r]]
        if not dead:
            return True
        self.lost_threads = True
        step.fail(
            RuntimeError(
                f"The replica threads of {_replicas(dead)} of {step.strategy!r} ended without finishing "
                f"strategy.run({name_of(step.fn)}); the step cannot complete. The strategy starts new threads "
                f"for its next run."
            ),
            ("barrier", None),
        )
        return False

    def _time_out(self, step: Step, description: str, timeout_s: float, missing: list[int]) -> None:
        message = (
            f"{description} Raising because the replica timeout (td.config.set_replica_timeouts) is {timeout_s:g} s."
        )
        if not step.on_caller_thread():  # the caller may be busy as replica 0: run raises this only later
            logger.error(message)
        step.fail(DeadlineExceededError(message, missing=missing), ("barrier", None))


def wait_for(step: Step) -> None:
    """Waits (in the caller, after replica 0 returned) until every replica thread of ``step`` is idle.

    Sets ``step.abandoned`` when some threads never came back and must be given up. An
    exception raised meanwhile (see the module docstring) is kept in ``step.caller_error``.
    """
    watch = step.watch
    site = step.sites[-1]
    budget = site.budget(step.participants)
    while step.remaining and not step.abandoned:
        try:
            waiting.get(step.done, budget, watch.poll_seconds(), site)
        except queue.Empty:
            pass
        except BaseException as error:
            if step.caller_error is not None:
                step.abandoned = True  # interrupted again while draining: give up on the threads
                return
            step.caller_error = error
            step.fail(error, ("caller", None))
        budget = 0.0
        if not step.remaining:
            return
        try:
            watch.check(step)
            if watch.drain(step):
                step.abandoned = True
                return
        except BaseException as error:  # a stall warning turned into an error
            if step.caller_error is not None:
                step.abandoned = True
                return
            step.caller_error = error
            step.fail(error, ("caller", None))
        if watch.lost_threads:
            step.abandoned = True
            return


# --- what the warnings say --------------------------------------------------------------------


def _describe_stall(step: Step, status: Status, waited: float) -> str:
    kinds = status.kinds
    handed = status.handed or (False,) * len(kinds)
    missing = [r for r, kind in enumerate(kinds) if kind is None]
    waiting = [r for r, kind in enumerate(kinds) if kind == "merge" and not handed[r]]
    went_on = [r for r, kind in enumerate(kinds) if kind == "merge" and handed[r]]
    finished = [r for r, kind in enumerate(kinds) if kind == "done"]
    parts = [f"{_replicas(missing)} of {step.strategy!r} did not reach the barrier for {waited:.1f} s"]
    if waiting:
        number = max(status.merge_counts[r] for r in waiting)
        what = status.waiting_in or "merge_call()"
        if what.startswith("merge_call() "):  # "merge_call() (merge_fn=f)"
            what = f"merge_call() number {number} {what[len('merge_call() ') :]}"
        else:
            what = f"{what} (merge_call() number {number})"
        parts.append(f"{_replicas(waiting)} {'is' if len(waiting) == 1 else 'are'} waiting in {what}")
    if went_on:
        what = status.waiting_in or "apply_gradients()"
        parts.append(f"{_replicas(went_on)} handed {what} over and went on (it is applied when every replica is there)")
    if finished:
        parts.append(f"{_replicas(finished)} returned from {name_of(step.fn)}")
    return "; ".join(parts) + "."


def _describe_turn(step: Step, status: Status, waited: float) -> str:
    turn = status.turn
    waiting = [r for r in range(step.num_replicas) if r != turn and not status.exited[r]]
    return (
        f"Replica {turn} of {step.strategy!r} has run {name_of(step.fn)} for {waited:.1f} s without reaching "
        f"a merge_call() or returning, in a sequential step (td.config.run_replicas_sequentially(True) or "
        f"run_concurrently=False), while "
        f"{_replicas(waiting) if waiting else 'no other replica'} "
        f"{'waits for its' if len(waiting) <= 1 else 'wait for their'} turn. A replica that waits for "
        f"another replica deadlocks a sequential step."
    )


def _describe_slow_merge(step: Step, waited: float) -> str:
    return (
        f"A merge_fn of {step.strategy!r}.run({name_of(step.fn)}) has been running for {waited:.1f} s "
        f"while every replica waits for it in merge_call()."
    )


def _describe_drain(step: Step, status: Status, waited: float) -> str:
    running = [r for r in range(step.num_replicas) if not status.exited[r]]
    origin, error = status.failure_origin, status.failure
    what = f"{type(error).__name__}" if error is not None else "a failure"
    where = f" in replica {origin[1]}" if origin and origin[0] == "replica" else ""
    return (
        f"{step.strategy!r}.run({name_of(step.fn)}) stopped after {what}{where}, but "
        f"{_replicas(running)} {'has' if len(running) == 1 else 'have'} not returned for "
        f"{waited:.1f} s; waiting for {'it' if len(running) == 1 else 'them'} before re-raising."
    )


def _warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, ReplicaStallWarning, stacklevel=_user_stacklevel())


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by ``_warn`` point at user code.

    Counts frames from ``_warn`` (stacklevel 1) up to the first one outside towerdist,
    e.g. the line calling ``strategy.run``.
    """
    frame: FrameType | None = sys._getframe(2)  # 0: here, 1: _warn, 2: its caller
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def name_of(fn: object) -> str:
    """A function's qualified name, for messages."""
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _poll_interval(warning_s: float | None, timeout_s: float | None) -> float:
    bounds = [b for b in (warning_s, timeout_s) if b is not None]
    # Wake up often enough to notice a bound passing, never busy-wait.
    return min(max(min(bounds) / 4, 0.01), _MAX_POLL_SECONDS) if bounds else _MAX_POLL_SECONDS


def _replicas(ids: Sequence[int]) -> str:
    if len(ids) == 1:
        return f"replica {ids[0]}"
    return "replicas " + ", ".join(str(r) for r in ids)
