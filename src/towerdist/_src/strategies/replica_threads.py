"""The replica scheduler: persistent replica threads that run ``strategy.run`` steps.

Each multi-replica strategy owns a :class:`ReplicaScheduler`. On first use it starts one
daemon thread for each replica but the first (``towerdist-replica-<i>``, i >= 1) that
lives as long as the strategy; the threads wait on their mailboxes for the messages of
``mailbox.py``.

**A step.** The caller builds a :class:`~towerdist._src.strategies.replica_step.Step`, posts
``(RUN, step)`` to the replica threads and then runs **replica 0 itself**, on its own
thread, in replica 0's context (its replica context and id, device scope, the timeline
track of the caller): a step of N replicas wakes N - 1 threads, not N. Replicas run
concurrently (numpy and cupy release the GIL in their kernels), or, for a sequential step
(TF 1.x's ``run_concurrently=False``), one at a time. Replicas meet at the barrier of the
step for ``merge_call`` and the internal collectives; the protocol (the last replica to
arrive settles the round) is documented in ``replica_step.py``. When replica 0 has returned,
the caller waits (``watchdog.wait_for``) only for replica threads still running, then
re-raises a failure (with a note naming the replica) or returns the results in replica
order. Every wait spins briefly when that pays on this machine (``waiting.py``).

**One replica.** A strategy with a single replica has nobody to wait for: its step runs
on the caller's own thread, with the same replica context, ``merge_call`` and failure
notes, and without any hand-off.

**Interrupts and forks.** A ``KeyboardInterrupt`` that lands in replica 0's code is that
replica's failure: the step stops and ``run`` re-raises it once the other replicas are
idle. One that lands while the caller waits (at a barrier as replica 0, or for the
replica threads) stops the step the same way and is re-raised as it is; a second gives
up on the replica threads at once (``watchdog.py``). One that lands while ``RUN`` is
being posted stops the replicas that started and gives up on the pool. A replica 0 that
never returns keeps ``run`` from returning, like any function the caller calls; the
waiting replicas still warn and time out, and the timeout is logged. A process forked
while the scheduler has threads inherits the pools but none of their threads: the child
forgets them and starts fresh threads on its first ``run``.

**Nesting.** ``run`` inside a ``merge_fn``, or two user threads calling ``run`` at once,
each get their own pool of threads; consecutive calls reuse the first pool.

**Sequential replicas.** ``td.config.run_replicas_sequentially(True)`` (or the
environment variable ``TOWERDIST_RUN_REPLICAS_SEQUENTIALLY=1``) makes every step of a
multi-replica strategy sequential, as TensorFlow's eager replicas run: replica 0 until
its first barrier or its return, then replica 1, ... (see "Turns" in ``replica_step.py``).
It is for porting and debugging code that keeps per-replica state on shared Python
objects; it gives up the replicas' parallelism.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from towerdist._src import intra_op_threads, waiting
from towerdist._src import profiler as _profiler
from towerdist._src.backend import cupy_streams
from towerdist._src.device import DeviceSpec
from towerdist._src.input import device_copies
from towerdist._src.mailbox import RUN, SHUTDOWN, TASK
from towerdist._src.strategies import watchdog
from towerdist._src.strategies.replica_step import Step, StopReplica
from towerdist._src.strategies.watchdog import name_of

if TYPE_CHECKING:  # mirrored.py builds a scheduler per strategy
    from towerdist._src.strategies.strategy import Strategy

__all__ = [
    "ReplicaScheduler",
    "StopReplica",
    "replicas_run_sequentially",
    "run_replicas_sequentially",
]

_SEQUENTIAL_VARIABLE = "TOWERDIST_RUN_REPLICAS_SEQUENTIALLY"


def _env_flag(name: str) -> bool:
    raw = os.environ.get(name, "")
    text = raw.strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise ValueError(
        f"The environment variable {name}={raw!r} is not a switch. Set it to 1, true, yes or on to run "
        f"replicas one after another, or to 0, false, no or off (or unset it) to run them at once."
    )


_run_sequentially = _env_flag(_SEQUENTIAL_VARIABLE)


def run_replicas_sequentially(run_sequentially: bool) -> None:
    """Runs the replicas of every ``strategy.run`` one after another (True) or at once (False, the default).

    TensorFlow's eager ``MirroredStrategy`` runs replica 0's function until it reaches a
    ``merge_call`` (or a collective such as ``all_reduce``) or returns, then replica 1's,
    and so on; towerdist runs the replicas at the same time, on their threads. Code that
    keeps per-replica state on a shared Python object (``self.last_input = x`` in a
    forward pass, read back in the backward pass) gives TensorFlow's results only when
    the replicas take turns. This switch makes them do so, for porting and debugging:
    ``merge_call``, ``all_reduce`` and the optimizers work as usual (after each barrier,
    replica 0 goes first again), but the replicas no longer run in parallel. Prefer
    keeping such state per replica (see docs/migrating-tf2.md).

    The default comes from the environment variable ``TOWERDIST_RUN_REPLICAS_SEQUENTIALLY``
    (1, true, yes or on; an invalid value fails the import with a ``ValueError`` naming the
    variable). A TF 1.x ``call_for_each_tower(..., run_concurrently=...)`` given explicitly
    overrides the switch for that call.

    Args:
      run_sequentially: True to run the replicas one after another, False to run them
        at once. It applies to the ``run`` calls that start after it.

    Raises:
      TypeError: ``run_sequentially`` is not a bool.

    Example:
      >>> import towerdist as td
      >>> td.config.run_replicas_sequentially(True)
      >>> td.config.replicas_run_sequentially()
      True
      >>> td.config.run_replicas_sequentially(False)
    """
    global _run_sequentially
    if not isinstance(run_sequentially, bool):
        raise TypeError(
            f"run_replicas_sequentially() takes a bool (True: one replica after another, False: at once). "
            f"Got run_sequentially={run_sequentially!r} of type {type(run_sequentially).__name__}."
        )
    _run_sequentially = run_sequentially


def replicas_run_sequentially() -> bool:
    """Whether ``strategy.run`` runs the replicas one after another (see :func:`run_replicas_sequentially`)."""
    return _run_sequentially


def _thread_main(mailbox: queue.SimpleQueue[Any], index: int, participants: int) -> None:
    # Holds no reference to the pool or strategy between messages, so that both can be
    # garbage-collected (which posts SHUTDOWN).
    site = waiting.Site("the next step")
    watched: Any = None  # a step this thread left after handing a request over, not settled yet
    while True:
        if watched is None:
            message = waiting.get(mailbox, site.budget(participants), None, site)
        else:  # keep the step's stall warnings and timeouts going: its other replicas may all be busy
            try:
                message = waiting.get(mailbox, site.budget(participants), watched.watch.poll_seconds(), site)
            except queue.Empty:
                if not watched.watch_after_exit(index):
                    watched = None
                continue
            watched = None
        kind = message[0]
        if kind is RUN:
            step = message[1]
            message = None
            step.execute(index)
            if step.hand_over_pending(index):
                watched = step
            step = None
        elif kind is TASK:
            job, part = message[1], message[2]
            message = None
            job.run_part(part)
            job = None
        elif kind is SHUTDOWN:
            return
        # A stale RESUME/STOP (from a step abandoned after a timeout) is dropped.


def _shutdown(mailboxes: Sequence[queue.SimpleQueue[Any]]) -> None:
    for mailbox in mailboxes:
        mailbox.put((SHUTDOWN,))


class _Pool:
    """One thread per replica but the first (the caller runs replica 0), with their mailboxes."""

    def __init__(self, num_replicas: int, participants: int) -> None:
        # ``participants``: the threads of this host that run replicas at once (spinning is
        # off when they outnumber the cores, waiting.py).
        self.participants = participants
        self.mailboxes: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(num_replicas - 1)]
        self.threads = [
            threading.Thread(
                target=_thread_main, args=(mailbox, i, participants), name=f"towerdist-replica-{i}", daemon=True
            )
            for i, mailbox in enumerate(self.mailboxes, start=1)
        ]
        # Where replica i waits at a barrier (sites[i]) and the caller for the threads (sites[-1]).
        self.sites = [*(waiting.Site("barrier") for _ in range(num_replicas)), waiting.Site("the end of the step")]
        self.busy = False
        for thread in self.threads:
            thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self.mailboxes)

    def alive(self) -> list[bool]:
        """Whether each replica's thread is still running (replica 0's is the caller's)."""
        return [True, *(thread.is_alive() for thread in self.threads)]

    def shutdown(self) -> None:
        self._finalizer()


# Every live scheduler, so that a forked child can drop the threads it did not inherit.
_schedulers: weakref.WeakSet[ReplicaScheduler] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for scheduler in list(_schedulers):
        scheduler._forget_threads_after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


class HelperLease:
    """An idle pool's threads lent for one collective (``parallel.Helpers``): taken on first ask."""

    __slots__ = ("_pool", "_scheduler")

    def __init__(self, scheduler: ReplicaScheduler) -> None:
        self._scheduler = scheduler
        self._pool: _Pool | None = None

    def __call__(self) -> Sequence[Any]:
        if self._pool is None:
            self._pool = self._scheduler._take_idle_pool()
            if self._pool is None:
                return ()
        return self._pool.mailboxes

    def release(self) -> None:
        """Gives the pool back (if it was taken)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            self._scheduler._release(pool)


class ReplicaScheduler:
    """Runs a function once per replica on persistent threads (one scheduler per strategy)."""

    def __init__(self, strategy: Strategy, devices: Sequence[DeviceSpec]) -> None:
        self._strategy_ref = weakref.ref(strategy)
        self._devices = tuple(devices)
        self._on_gpus = any(d.device_type == "GPU" for d in self._devices)
        self._pools: list[_Pool] = []
        self._local_workers = 1  # processes of the job on this host (set through local_workers)
        self._lock = threading.Lock()
        _schedulers.add(self)

    @property
    def local_workers(self) -> int:
        """How many processes of the job run this many replicas on this host (1 without MPI)."""
        return self._local_workers

    @local_workers.setter
    def local_workers(self, count: int) -> None:
        """Set by the strategy when it is made (before any step): prepares the replicas of this host.

        Limits the BLAS threads of concurrent CPU replicas and measures this machine's
        hand-off costs for the waits (both once per process, and here rather than in a step).
        """
        self._local_workers = count
        concurrent = len(self._devices) * count  # the replicas of this host running at once
        if not self._on_gpus and concurrent > 1:  # CPU replicas: BLAS threads must not oversubscribe the cores
            intra_op_threads.for_concurrent_replicas(concurrent)
        if 2 <= concurrent <= waiting.usable_cores():
            waiting.calibration()  # once per process (~40 ms), here rather than in a step

    @property
    def num_threads(self) -> int:
        """Replica threads alive for this strategy (for tests and diagnostics)."""
        return sum(thread.is_alive() for pool in self._pools for thread in pool.threads)

    def _forget_threads_after_fork(self) -> None:
        """In a forked child: the parent's threads do not exist here (nor may its lock be free)."""
        for pool in self._pools:
            pool._finalizer.detach()  # its mailboxes have no reader in this process
        self._pools = []
        self._lock = threading.Lock()

    def _acquire(self) -> _Pool:
        with self._lock:
            for pool in self._pools:
                if not pool.busy:
                    pool.busy = True
                    return pool
            pool = _Pool(len(self._devices), len(self._devices) * self._local_workers)
            self._pools.append(pool)
            pool.busy = True
            return pool

    def _release(self, pool: _Pool, abandon: bool = False) -> None:
        with self._lock:
            pool.busy = False
            if abandon:
                self._pools.remove(pool)
        if abandon:
            pool.shutdown()

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Sequence[dict[str, Any]],
        make_context: Callable[[int, Step], Any],
        sequential: bool | None = None,
    ) -> list[Any]:
        """Calls ``fn(*args[i], **kwargs[i])`` as replica ``i`` for every replica.

        Returns the results in replica order. Must be called in cross-replica context of
        the strategy (``merge_fn`` runs in a snapshot of the caller's context). With
        ``sequential``, the replicas take turns between barriers instead of running at once;
        None follows :func:`run_replicas_sequentially`.
        """
        strategy = self._strategy_ref()
        if self._on_gpus:  # inputs an iterator copied to the GPUs, whichever thread took them
            device_copies.follow_handed_out()
        if len(self._devices) == 1:
            return self._run_here(strategy, fn, args, kwargs, make_context)
        if sequential is None:
            sequential = _run_sequentially
        begin = _profiler.now() if _profiler.active else 0  # the caller's step, on its track
        pool = self._acquire()
        # Until the step is known to be over, the threads count as lost: an interrupt that
        # lands anywhere below must not hand busy threads to the next run (while no step was
        # handed to them, the pool is released as idle).
        abandon = True
        posted = 0
        step: Step | None = None
        try:
            mailboxes = (queue.SimpleQueue(), *pool.mailboxes)  # replica 0's: read by this thread
            step = Step(
                strategy, self._devices, mailboxes, fn, args, kwargs, make_context, sequential, pool.sites,
                pool.participants,
            )
            step.alive = pool.alive
            if step.orders_streams:  # what the caller launched for the replicas, before their streams read it
                step.caller_marks = cupy_streams.mark(step.gpu_ids)
            for mailbox in pool.mailboxes:
                mailbox.put((RUN, step))
                posted += 1
            step.execute(0)
            if step.remaining and not step.abandoned:
                watchdog.wait_for(step)
            abandon = step.abandoned
        except BaseException as interrupt:
            # Interrupted outside the waits' own handling: before or while posting RUN (some
            # replicas never start: stop the others at their first barrier), or between waits.
            if step is None:
                abandon = False  # no thread was handed anything: the pool is idle
            else:
                step.fail(interrupt, ("caller", None))
                if posted == len(pool.mailboxes) and step.caller_error is None and not step.abandoned:
                    step.caller_error = interrupt  # a further one gives up on the threads at once
                    watchdog.wait_for(step)
            raise
        finally:
            if abandon:
                self._release(pool, abandon=True)
            else:
                pool.busy = False  # first and one store: an interrupt here cannot leave the pool busy
            if step is not None:
                step.detach_contexts()
            if begin and _profiler.active:
                _profiler.record(f"strategy.run: {name_of(fn)}", begin, {"replicas": len(self._devices)})
        assert step is not None  # (made in the try, which re-raises otherwise)
        if step.orders_streams:  # what the replicas launched (even in a failed step), before the caller's streams
            step.follow_replicas()
        if step.caller_error is not None:
            raise step.caller_error
        step.raise_failure()
        return step.results

    def _run_here(
        self,
        # Any: a Strategy, alive while its run calls this, though the weak reference is typed Strategy | None.
        strategy: Any,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Sequence[dict[str, Any]],
        make_context: Callable[[int, Step], Any],
    ) -> list[Any]:
        """A one-replica step, on the caller's thread (its barrier settles at each arrival)."""
        step = Step(strategy, self._devices, (), fn, args, kwargs, make_context)
        try:
            step.execute(0)
        finally:
            step.detach_contexts()
        step.raise_failure()
        return step.results

    def lend_idle_helpers(self) -> HelperLease:
        """An idle pool's threads for this (cross-replica) thread's parallel parts: taken on first ask.

        Pass it as the ``helpers`` of a collective, then call its ``release()`` (in a ``finally``).
        """
        return HelperLease(self)

    def _take_idle_pool(self) -> _Pool | None:
        with self._lock:
            pool = next((p for p in self._pools if not p.busy), None)
            if pool is None and not self._pools:
                pool = _Pool(len(self._devices), len(self._devices) * self._local_workers)
                self._pools.append(pool)
            if pool is not None:
                pool.busy = True
        return pool
