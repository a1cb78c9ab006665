"""How towerdist's threads wait for a peer: a short spin when the peer is about to arrive, else a block.

**What a wait costs.** A thread that blocks (on a queue, a lock) is descheduled. Waking it
costs twice: the peer's ``put`` becomes a futex wake-up system call, and the blocked thread
reacts only once its CPU is running again, which on a virtual machine whose idle vCPU
halted means waking that vCPU. On the 2-vCPU VMs this project meets, a hand-off to a
thread idle for ~0.5 ms cost ~90 µs on one kind (a 35 µs ``put`` plus a 55 µs reaction)
and more on another (~135 µs reaction). A thread that *spins* instead (polls while
yielding the CPU with ``os.sched_yield()``, which releases the GIL) reacts in ~13 µs and
makes the ``put`` cheap, but it is not free either: it takes the GIL between yields, and
a peer running numpy with Python between the calls then waits for it: on the same VM a
spinning thread slowed such a peer by ~95% while it spun.

**The budget.** So spinning for ``t`` seconds costs the peer about ``slowdown * t`` and
saves ``W - L`` when the peer arrives within it (``W`` and ``L``: the blocking and spinning
hand-off costs). A wait spins for at most ``(W - L) / slowdown`` (the point where spinning
stops paying), all three measured on this machine once per process (:func:`calibration`,
~40 ms, when the first strategy whose replica threads could spin is made: not inside a
step, where it would cost the user's training loop); a machine with cheap wake-ups gets a
small budget or none.

**Is the peer about to arrive?** Spinning only pays for waits shorter than the budget.
Each kind of wait (a :class:`Site`: a replica thread waiting for the next step, a replica
parked at a barrier, the caller waiting for the replica threads, the consumer of a
``prefetch`` waiting for its next element) remembers how long
its recent waits took, and spins only while at least half of them were short enough.

**When not to spin.** Never when the threads taking part exceed the usable cores
(``os.sched_getaffinity``): a spinner would take a core a peer needs. Nor while the
machine is oversubscribed: a spinning thread that got less than half of the wall time on
the CPU (``time.thread_time``) shared its core with another runnable thread, and spinning
stops everywhere for :data:`_BACK_OFF_SECONDS`.

The environment variable ``TOWERDIST_SPIN_MICROSECONDS`` (or :func:`set_spin_budget`)
replaces the measured budget; ``0`` turns spinning off.

**Waits only a poll can watch** (an MPI request progresses only while its process calls
MPI) have no blocking form: :class:`Poller` paces them, yielding the core between polls,
or sleeping briefly when other programs keep more tasks runnable than there are cores.
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import numpy as np

from towerdist._src import profiler as _profiler

__all__ = [
    "Calibration",
    "Poller",
    "Site",
    "calibration",
    "get",
    "set_spin_budget",
    "spin_budget",
    "usable_cores",
]

T = TypeVar("T")

_MAX_SPIN_SECONDS = 0.001  # a wait longer than this is not "a peer about to arrive"
_BACK_OFF_SECONDS = 0.5  # no spinning for this long after a spinner found its core shared
_MIN_SAVING_SECONDS = 5e-6  # a spinning hand-off must save at least this to be worth it
_SHARED_CORE_RATIO = 0.5  # a spinner on the CPU for less than this share of the time shared its core
_ENV = "TOWERDIST_SPIN_MICROSECONDS"


class Calibration(NamedTuple):
    """What this machine's hand-offs cost, measured once per process (seconds; ratio)."""

    blocking: float  # a put to a thread blocked for ~0.5 ms, until that thread runs (put included)
    spinning: float  # the same hand-off to a thread spinning with os.sched_yield()
    slowdown: float  # how much a spinning thread slows numpy-and-Python work on another core (0.9 = 90%)
    budget: float  # the longest spin that can pay: (blocking - spinning) / slowdown, or 0


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


_CORES = usable_cores()
_lock = threading.Lock()
_calibration: Calibration | None = None
_shared_until = 0.0  # monotonic time until which spinning is off (a spinner found its core shared)


def _env_override() -> float | None:
    raw = os.environ.get(_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError(
            f"The environment variable {_ENV}={raw!r} is not a number of microseconds. Set it to a number >= 0 "
            f"(0 turns spinning off), or unset it to let towerdist measure this machine."
        )
    return min(value * 1e-6, _MAX_SPIN_SECONDS)


_override: float | None = _env_override()


def set_spin_budget(microseconds: float | None) -> None:
    """Sets how long a waiting thread may spin before it blocks; None: measure this machine (the default).

    ``0`` turns spinning off; values above 1000 µs are capped at 1000 µs.

    Raises:
      ValueError: a negative, NaN or infinite value.
    """
    global _override
    if microseconds is None:
        _override = None
        return
    value = float(microseconds)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"set_spin_budget() takes microseconds >= 0, or None. Got {microseconds!r}.")
    _override = min(value * 1e-6, _MAX_SPIN_SECONDS)


def spin_budget(participants: int) -> float:
    """Seconds a thread waiting for one of ``participants`` busy threads may spin (0: block at once).

    ``participants`` counts every thread taking part in the wait, the waiter included.
    """
    if participants > _CORES or participants < 2:
        return 0.0
    budget = _override
    if budget is None:
        budget = (_calibration or calibration()).budget
    if budget and time.monotonic() < _shared_until:
        return 0.0
    return budget


class Site:
    """One kind of wait, with what its recent waits say about the next (is the peer usually quick?).

    ``short`` is an exponential average of "the wait ended within the spin budget": a wait
    spins only while it is at least one half. A wait that spun in vain counts as long.
    Waits are only timed while spinning is possible at all (``learning``).
    """

    __slots__ = ("learning", "name", "short")

    _WEIGHT = 0.2  # of the latest wait in the average

    def __init__(self, name: str) -> None:
        self.name = name
        self.short = 1.0  # optimistic until waits say otherwise
        self.learning = False

    def budget(self, participants: int) -> float:
        """The spin budget for this site's next wait (0: block at once)."""
        budget = spin_budget(participants)
        self.learning = budget > 0
        return budget if self.short >= 0.5 else 0.0

    def record(self, waited: float, budget: float) -> None:
        """Remembers how long a wait took (seconds), judged against ``budget`` (or the current one)."""
        limit = budget or (_override if _override is not None else (_calibration.budget if _calibration else 0.0))
        self.short += self._WEIGHT * ((1.0 if waited <= limit else 0.0) - self.short)


def get(mailbox: queue.SimpleQueue[T] | queue.Queue[T], budget: float, timeout: float | None, site: Site) -> T:
    """The next item of ``mailbox``: spins up to ``budget`` seconds, then blocks up to ``timeout``.

    While a timeline is recorded, a wait that blocks (and so needs a wake-up) appears on the
    thread's track as ``blocked: <site>``.

    Raises:
      queue.Empty: nothing arrived within ``budget + timeout``.
    """
    if not (budget or site.learning or _profiler.active):
        return mailbox.get(timeout=timeout)  # no spinning possible here: the plain wait
    try:
        return mailbox.get_nowait()
    except queue.Empty:
        pass
    start = time.perf_counter()
    if budget:
        found = _spin(mailbox.get_nowait, budget)
        if found is not _NOTHING:
            site.record(time.perf_counter() - start, budget)
            return found
    try:
        if _profiler.active:
            with _profiler.Span(f"blocked: {site.name}"):
                return mailbox.get(timeout=timeout)
        return mailbox.get(timeout=timeout)
    finally:
        if site.learning:
            site.record(time.perf_counter() - start, budget)


_NOTHING: Any = object()


def _spin(poll: Callable[[], T], budget: float) -> T | Any:
    """Polls ``poll`` (which raises queue.Empty) with yields for up to ``budget`` seconds."""
    global _shared_until
    clock, yield_ = time.perf_counter, os.sched_yield
    start, start_cpu = clock(), time.thread_time()
    end = start + budget
    result = _NOTHING
    while True:
        yield_()
        try:
            result = poll()
            break
        except queue.Empty:
            if clock() > end:
                break
    wall = clock() - start
    if wall > 20e-6 and time.thread_time() - start_cpu < _SHARED_CORE_RATIO * wall:
        _shared_until = time.monotonic() + _BACK_OFF_SECONDS  # another thread wanted this core
    return result


class Poller:
    """Paces a loop that can only poll for what it waits for (an MPI request: MPI progresses
    only while the waiting process calls it).

    Between two polls it yields the core (``os.sched_yield()``): that costs nothing while no
    other task wants the core, and hands the core at once to one that does. Two cases differ:

    * ``crowded`` (more ranks of the job on this host than cores): the tasks waiting for the
      core are the job's own ranks, which the waiter needs to make progress; it yields.
    * otherwise, while more tasks are runnable than there are cores (``/proc/loadavg``, read
      at most every :data:`_LOAD_CHECK_SECONDS`; the count includes this job's own busy ranks
      and threads, and the waiter itself), it sleeps
      :data:`_SHARED_POLL_SECONDS` between polls instead: a rank that stays runnable holds a
      core the kernel would otherwise give the foreign work, which then shares the core of
      the rank still computing. Measured with one competing process on 2 cores: 2 ranks ran
      at 0.20x their own speed polling with yields for 5 ms per wait, ~0.4x with this.
    """

    __slots__ = ("_crowded", "_free")

    _FREE_POLLS = 16  # polls back to back first: a small transfer completes within them (~10 µs)

    def __init__(self, crowded: bool) -> None:
        self._crowded = crowded
        self._free = self._FREE_POLLS

    def pause(self) -> None:
        """Waits between two polls."""
        if self._free:
            self._free -= 1
            return
        if not self._crowded and _foreign_load():
            time.sleep(_SHARED_POLL_SECONDS)
        else:
            _yield()


_SHARED_POLL_SECONDS = 50e-6
_LOAD_CHECK_SECONDS = 0.05
_load = [float("-inf"), False]  # when /proc/loadavg was last read, and whether it said "oversubscribed"
_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))  # (POSIX; elsewhere a zero sleep)


def _foreign_load() -> bool:
    """Whether more tasks are runnable than there are cores (Linux; elsewhere never)."""
    now = time.monotonic()
    if now - _load[0] > _LOAD_CHECK_SECONDS:
        try:
            with open("/proc/loadavg", encoding="ascii") as file:
                running = int(file.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):  # not Linux, or an unexpected format
            running = 0
        _load[0], _load[1] = now, running > _CORES
    return bool(_load[1])


# --- calibration --------------------------------------------------------------------------------


def calibration() -> Calibration:
    """This machine's hand-off costs and spin budget, measured on first call (~30 ms), then cached."""
    global _calibration
    with _lock:
        if _calibration is None:
            try:
                _calibration = _calibrate() if _CORES >= 2 else _NO_SPINNING
            except queue.Empty:  # a hand-off took over a second: the machine is far too busy to spin on
                _calibration = _NO_SPINNING
        return _calibration


_NO_SPINNING = Calibration(0.0, 0.0, 0.0, 0.0)


def _calibrate() -> Calibration:
    # A replica's kind of work: a small MLP's forward pass, numpy calls of 5-50 µs with
    # Python between them (a spinner costs such work more than one long call).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 64), np.float32)
    weights = [rng.standard_normal(shape, np.float32) for shape in ((64, 256), (256, 256), (256, 10))]

    def work() -> None:
        h = x
        for w in weights:
            h = h @ w
            h = h * (h > 0)

    blocking = _handoff(work, spin=False)
    spinning = _handoff(work, spin=True)
    slowdown = _spinner_slowdown(work)
    saving = blocking - spinning
    budget = 0.0 if saving < _MIN_SAVING_SECONDS else min(saving / max(slowdown, 0.1), _MAX_SPIN_SECONDS)
    return Calibration(blocking, spinning, slowdown, budget)


def _handoff(work: Callable[[], None], spin: bool, trials: int = 15) -> float:
    """Median seconds from starting a ``put`` until the waiter runs, after it waited ~0.5 ms."""
    inbox: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    outbox: queue.SimpleQueue[float] = queue.SimpleQueue()

    def waiter() -> None:
        while True:
            if spin:
                while True:
                    try:
                        sent = inbox.get_nowait()
                        break
                    except queue.Empty:
                        os.sched_yield()
            else:
                sent = inbox.get()
            if sent is None:
                return
            outbox.put(time.perf_counter() - sent)

    thread = threading.Thread(target=waiter, name="towerdist-calibration", daemon=True)
    thread.start()
    latencies = []
    try:
        for _ in range(trials):
            end = time.perf_counter() + 0.0005
            while time.perf_counter() < end:
                work()
            inbox.put(time.perf_counter())
            latencies.append(outbox.get(timeout=1.0))
    finally:
        inbox.put(None)
        thread.join(timeout=1.0)
    return statistics.median(latencies)


def _spinner_slowdown(work: Callable[[], None], rounds: int = 5) -> float:
    """How much a spinning thread slows ``work`` running on another core (0.3: 30% longer)."""

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(4):
            work()
        return time.perf_counter() - start

    stop = threading.Event()

    def spinner() -> None:
        while not stop.is_set():
            os.sched_yield()

    alone, shared = [], []
    for _ in range(rounds):
        alone.append(timed())
        stop.clear()
        thread = threading.Thread(target=spinner, name="towerdist-calibration", daemon=True)
        thread.start()
        try:
            shared.append(timed())
        finally:
            stop.set()
            thread.join(timeout=1.0)
    return max(0.0, statistics.median(shared) / statistics.median(alone) - 1.0)
