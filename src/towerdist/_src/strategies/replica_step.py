"""One ``strategy.run`` step: the replicas' barrier, their turns, and failure bookkeeping.

A :class:`Step` is shared by the caller of ``run``, which runs replica 0 itself, and the
replica threads of replicas 1..n-1 (see ``replica_threads.py`` for who posts what). Each
replica has a mailbox: a thread's own, and for replica 0 one the caller reads while it
waits at the barrier. Its protocol:

**Rounds.** Replicas meet at the barrier in *rounds*. A replica arrives either with a
request (``merge_call``, or an internal collective such as ``all_reduce``) or because it
returned from the replica function. The *last* replica to arrive settles the round, on
its own thread, without waking anyone first:

* every replica brought a request: it runs replica 0's request once, in the caller's
  context made cross-replica, with the parked replicas lent as helpers for parallel
  parts, and posts ``(RESUME, part)`` to each parked replica;
* requests and returns are mixed: the counts of ``merge_call`` differ, which fails the
  step (``MergeCallCountError``);
* requests of different kinds (a ``merge_call`` against an ``all_reduce``) fail the step.

Parked replicas wait on their mailbox (``waiting.get``: a short calibrated spin, then a
blocking wait that wakes up now and then to watch the step, ``watchdog.py``); they run
``TASK`` messages meanwhile. Requests come in two kinds (``round_requests.py``): a *merge*
request (``merge_call``: the arguments are regrouped into distributed values and the result
is split with ``select_replica``) and a *collective* request (towerdist's own
``all_reduce``/``all_gather``/optimizer steps: the function gets the replicas' payloads as
a list and returns one part per replica, with no regrouping).

**Handing over.** A collective request may say it needs nothing back from the round (an
optimizer step on CPU replicas: the settler updates the variables, every replica's part is
None). A replica thread bringing one that is not the last to arrive need not park: it *hands
the request over* (replica 0 always parks: the caller must wait for the update before
``run`` returns anyway, and parked it wakes no later than it would at the end of the step). It copies its payload (``request.snapshot``: its gradients may be written
once the replica goes on; the settler waits for the copy), raises its fence around the
variables the request's function writes (``update_fence.py``: its next access to one of
them, or its next request, waits until the round is settled) and goes on with its function. If it returns before the round completes, its
return counts in the next round, as if it had arrived after the settle. The settler
releases nobody for it, and after the round's function marks the hand-over settled,
resuming the replica if it waits. A replica thread that left the step with its request not
settled yet goes on watching the step from its idle loop (``watch_after_exit``): the other
replicas may all be busy in your code, and the stall warnings and timeouts must not stop. A failed step stops a replica waiting for a settle like a
parked one. A step whose replica threads arrive first thus ends without waking them (on a
2-core VM a wake-up costs 0.05-0.15 ms). Sequential steps and steps on GPUs never hand over.

**The end of a step.** A replica thread that returns reports its result and leaves; the
last one to leave posts to ``done``. The caller, once replica 0 has returned, waits for
``done`` only if some replica thread is still running: when replica 0 is the last to
finish, the step ends without any hand-off.

**Turns.** A sequential step (TF 1.x ``run_concurrently=False``) runs one replica at a
time: replica 0 until its next barrier or its return, then replica 1, and so on; after a
round settles the turn goes back to replica 0.

**Failure.** The first exception (in a replica, in a request's function, or the caller's
interrupt) is recorded; parked replicas are released with ``STOP``, replicas arriving
later stop at once (:class:`StopReplica`), and :meth:`raise_failure` re-raises the
original exception in the caller with a note naming where it happened. Replica 0 runs on
the caller's thread, where a ``KeyboardInterrupt`` may land between any two bytecodes:
once a round is complete, the replica settling it releases every parked replica whatever
happens (``_release_unreleased``); and while the caller waits at the barrier (on the main
thread), signal handlers are held until the message in hand has been acted on
(``held_signals.py``), so an interrupt cannot take away a ``RESUME`` or a ``TASK``.

**Streams.** On GPUs, work changes threads at four points, and each is ordered on the GPU
by CUDA events (``backend/cupy_streams.py``), never by a host wait: the caller marks its
streams before posting ``RUN`` and each replica's streams follow that mark
(``caller_marks``); a replica marks its streams as it arrives at the barrier and the
settler's streams follow every replica's marks before the round's function runs; the
settler marks its streams after it and the released replicas follow (``_round_marks``);
each replica thread marks its streams as it leaves and the caller's streams follow all of
them before ``run`` returns (``follow_replicas``, also after a failure). Marks cover every
GPU of the step (a replica may work on another GPU in a ``td.device`` scope, a caller's
argument or a ``merge_fn``'s result may live on another GPU): a stream of another GPU with
nothing left to run needs no event. A mark on the legacy null stream records nothing:
CUDA orders that stream with every blocking stream.

**Timing.** ``round_started`` is set when the first replica *parks* in a round (a replica
that returned waits for nobody, so a replica computing longer than returned ones is never
timed); ``merge_started`` while a request's function runs; ``turn_started`` in a
sequential step. Every waiting thread watches the step through :meth:`status`.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from towerdist._src import context, thread_state, update_fence, waiting
from towerdist._src import device as device_lib
from towerdist._src import profiler as _profiler
from towerdist._src.backend import cupy_streams
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import MergeCallCountError
from towerdist._src.failures import name_api
from towerdist._src.mailbox import INTERRUPTED, RESUME, SHUTDOWN, STOP, TASK
from towerdist._src.strategies import held_signals
from towerdist._src.strategies.error_notes import add_note, describe_error
from towerdist._src.strategies.round_requests import CollectiveRequest, MergeRequest
from towerdist._src.strategies.watchdog import Status, Watch, name_of
from towerdist._src.thread_state import Mode
from towerdist._src.type_aliases import Nest

__all__ = ["Step", "StopReplica"]

_MERGE = "merge"  # a replica's kind in the current round: parked with a request
_DONE = "done"  # returned from the replica function
# How long a settler spins for the copies of handed-over payloads before it blocks (they are
# copies of at most a few MiB already in memory: ~0.1 ms).
_SNAPSHOT_SPIN_SECONDS = 0.002


class StopReplica(BaseException):
    """Unwinds a replica function whose step failed elsewhere (never seen by users)."""


class _NoTurns:
    """Stands for the turn condition of a concurrent step, which nobody waits on."""

    def notify_all(self) -> None:
        pass


_NO_TURNS: Any = _NoTurns()


_NOTHING_HANDED: dict[int, Any] = {}


def _nothing_handed(n: int) -> Any:
    """A read-only row of ``n`` Nones: the hand-over state of a step in which nobody hands over."""
    row = _NOTHING_HANDED.get(n)
    if row is None:
        row = _NOTHING_HANDED[n] = (None,) * n
    return row


class Step:
    """The state of one ``strategy.run`` call shared by the caller and the replica threads.

    ``mailboxes[0]`` is read by the caller while replica 0 waits at the barrier;
    ``mailboxes[i]`` for ``i >= 1`` belong to the threads running the other replicas.
    """

    def __init__(
        self,
        # Any: a Strategy, alive while its run lasts, from the scheduler's weak reference (typed Strategy | None).
        strategy: Any,
        devices: Sequence[DeviceSpec],
        mailboxes: Sequence[queue.SimpleQueue[Any]],
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Sequence[dict[str, Any]],
        make_context: Callable[[int, Step], Any],
        sequential: bool = False,
        sites: Sequence[waiting.Site] = (),
        participants: int = 0,
    ) -> None:
        n = len(devices)
        self.strategy = strategy
        self.devices = devices
        self.on_gpus = devices[0].device_type == "GPU" or any(d.device_type == "GPU" for d in devices)
        # GPU work changes threads at the start of the step, at each round and at the end:
        # the consumer's streams wait for events recorded on the producer's (see "Streams").
        self.orders_streams = self.on_gpus and n > 1
        self.caller_marks: cupy_streams.Marks | None = None  # the caller's streams as it started the step
        self._round_marks: cupy_streams.Marks | None = None  # the settler's streams after the round's function
        if self.orders_streams:
            self.gpu_ids = tuple(sorted({d.device_index for d in devices if d.device_type == "GPU"}))
            self._own_gpu: list[int | None] = [d.device_index if d.device_type == "GPU" else None for d in devices]
            self._arrival_marks: list[cupy_streams.Marks | None] = [None] * n
            self._end_marks: list[cupy_streams.Marks | None] = [None] * n
        self.fn = fn
        self.num_replicas = n
        self.results: list[Any] = [None] * n
        self.sequential = sequential
        self.abandoned = False  # set when the caller gave up on threads that never returned
        # The first exception raised in the caller while it waited (an interrupt, a stall
        # warning turned into an error); it wins over the step's own failure.
        self.caller_error: BaseException | None = None
        # The last replica *thread* to exit posts to ``done``; ``remaining == 0`` is the
        # truth (the post may have been consumed by a wait that an interrupt cut short).
        # Replica 0 runs on the caller's thread and is not counted.
        self.done: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self.remaining = n - 1
        self.alive: Callable[[], list[bool]] = lambda: [True] * n
        self.watch = Watch()
        self._mailboxes = mailboxes
        self._args = args
        self._kwargs = kwargs
        self._make_context = make_context  # each replica builds its context on its own thread
        self._contexts: list[Any] = [None] * n
        self._caller = thread_state.snapshot()
        self._caller_thread = threading.get_ident()
        self._cross_replica = context.cross_replica_mode(strategy)
        # Where each replica waits at the barrier (replica i: sites[i]), and the caller for the
        # replica threads (sites[n]): they remember how long recent waits took (waiting.py).
        self.sites = sites
        self.participants = participants or n  # threads of this host running replicas at once
        self._lock = threading.Lock()
        self._exited = [False] * n
        # The current round.
        self._arrived = 0
        self._kinds: list[str | None] = [None] * n
        self._requests: list[Any] = [None] * n
        self._round = 0
        self._round_started: float | None = None
        self._merge_started: float | None = None
        self._merge_counts = [0] * n
        # Replicas parked in a completed round that its settler has not released yet.
        self._unreleased: list[int] = []
        # Replicas awaiting the settle of a hand-over that the settler marked settled and has not
        # resumed yet (like ``_unreleased``: only the settler posts to them, stopped on a failure).
        self._resuming: list[int] = []
        self._settler: int | None = None  # the thread that completed the latest round
        # Handing over (see the module's docstring): per replica, the round it handed a request
        # over in and whose settle it has not seen finish (None: nothing pending); whether the
        # private copy of its payload is still being taken; whether it returned from its
        # function before that round completed (its return counts in the next round); whether
        # it is parked, waiting for the settle.
        self._may_hand_over = n > 1 and not sequential and not self.on_gpus
        self._handed: list[int | None]
        self._snapshotting: list[bool]
        self._returned_early: list[bool]
        self._awaiting_settle: list[bool]
        if self._may_hand_over:
            self._handed, self._snapshotting = [None] * n, [False] * n
            self._returned_early, self._awaiting_settle = [False] * n, [False] * n
        else:  # nobody hands over: one shared row of Nones (never written) answers every question
            self._handed = self._snapshotting = self._returned_early = self._awaiting_settle = _nothing_handed(n)
        self._snapshots_taken: threading.Condition | None = None  # made by a settler that must wait for a copy
        # Sequential steps: the replica whose turn it is.
        self._turn = 0
        self._turn_changed = threading.Condition(self._lock) if sequential else _NO_TURNS
        self._turn_started = time.monotonic() if sequential else None
        # Failure.
        self._failure: BaseException | None = None
        self._failure_origin: tuple[str, int | None] | None = None
        self._failure_time: float | None = None
        self._failed_collective: str | None = None  # the collective whose function failed
        self._other_failures: list[tuple[int | None, BaseException]] = []

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def status(self) -> Status:
        """A consistent copy of what the watch needs."""
        with self._lock:
            first = next((r for r in self._requests if r is not None), None)
            return Status(
                self._failure,
                self._failure_origin,
                self._failure_time,
                self._round,
                self._round_started,
                self._merge_started,
                self._turn,
                self._turn_started,
                tuple(self._kinds),
                tuple(self._merge_counts),
                None if first is None else first.describe(),
                tuple(self._exited),
                tuple(handed == self._round for handed in self._handed),
            )

    def hand_over_pending(self, i: int) -> bool:
        """Whether replica ``i`` handed a request over that is not settled yet (in a step not failed)."""
        return self._handed[i] is not None and self._failure is None and not self.abandoned

    def watch_after_exit(self, i: int) -> bool:
        """Watches the step once more from replica thread ``i``, which left it after handing a request over.

        Nobody else may be waiting in the step then (replica 0 computing, or stuck, in your
        code): the idle thread keeps the stall warnings and timeouts going until the request
        is settled. Returns whether to go on watching (False once settled or failed).
        """
        if not self.hand_over_pending(i):
            return False
        self._watch()
        return self.hand_over_pending(i)

    def detach_contexts(self) -> None:
        """Cuts the contexts' link to this step once it is over.

        Contexts may outlive the step (users keep them); without this the step, and every
        result it holds, would live as long as they do or until the cycle collector runs.
        """
        for ctx in self._contexts:
            if ctx is not None:
                ctx._step = None
        self._contexts = []

    # --- replicas ---------------------------------------------------------------------------

    def execute(self, i: int) -> None:
        """Runs replica ``i`` on this thread (a replica thread, or the caller for replica 0)."""
        state = thread_state.state
        saved = state.save()
        try:
            ctx = self._contexts[i] = self._make_context(i, self)
            # As on a fresh replica thread, whichever thread this is (replica 0: the caller's).
            state.modes = [Mode(self.strategy, None, ctx)]
            state.devices = [self.devices[i]]
            state.updates = []
            state.sync_on_read = list(self._caller.sync_on_read)
            state.helpers = None
            state.colocations = []
            state.global_scope = None
            state.default_scopes = 0
            if self.sequential:
                self._await_turn(i)
            with device_lib.activate(self.devices[i]):  # a GPU replica launches on its own GPU
                if self.orders_streams:
                    cupy_streams.follow(self.caller_marks)  # what the caller made for it, on any GPU
                if _profiler.active:
                    _profiler.name_replica_thread(i, self.devices[i])
                    with _profiler.Span(f"run: {name_of(self.fn)}", {"replica": i}):
                        result = self.fn(*self._args[i], **self._kwargs[i])
                else:
                    result = self.fn(*self._args[i], **self._kwargs[i])
        except StopReplica:
            pass
        except Exception as error:  # reported to the caller, who re-raises it
            self.fail(error, ("replica", i))
        except BaseException as error:  # KeyboardInterrupt, SystemExit: on the caller's thread, an interrupt
            if self.on_caller_thread():
                self._interrupted_in_replica_0(error)
            else:
                self.fail(error, ("replica", i))
        else:
            self._arrive_done(i, result)
        finally:
            if update_fence.up:
                update_fence.lower()  # a hand-over still being settled is the step's: run returns after it
            state.restore(saved)
            if self.orders_streams:  # whatever this replica launched, before the caller reads it
                try:
                    self._end_marks[i] = cupy_streams.mark(self.gpu_ids, self._own_gpu[i])
                except Exception as error:  # a CUDA error (e.g. a sticky one): the step's, not the thread's
                    self.fail(error, ("replica", i))
            self._exit(i)

    def meet(self, i: int, request: MergeRequest | CollectiveRequest) -> Nest:
        """Replica ``i`` brings ``request`` to the barrier; returns its part of the result.

        ``request.collective`` names the call (``"merge_call()"``, ``"ReplicaContext.all_reduce()"``,
        ...): replicas meeting in different calls fail the step instead of running replica
        0's function on arguments meant for something else.
        """
        try:
            if self._handed[i] is not None:  # its previous request is being settled: wait for that first
                self.await_settled(i)
            if self.orders_streams:  # what this replica launched, before the settler's streams read it
                self._arrival_marks[i] = cupy_streams.mark(self.gpu_ids, self._own_gpu[i])
            with self._lock:
                if self._failure is not None:
                    raise StopReplica
                self._merge_counts[i] += 1
                self._kinds[i] = _MERGE
                self._requests[i] = request
                if self.sequential:
                    self._pass_turn(i)
                outcome = self._arrive(i)
                # Replica 0 parks instead: the caller waits for the update anyway before run returns.
                hand_over = outcome is None and request.snapshot is not None and self._may_hand_over and i != 0
                if hand_over:
                    self._handed[i] = self._round
                    self._snapshotting[i] = True
                pending = [r for r, kind in enumerate(self._kinds) if kind is None] if _profiler.active else None
            if hand_over:
                self._hand_over(i, request)
                return None
            if outcome is None:
                if pending is None:
                    part = self._park(i)
                else:
                    with _profiler.Span("wait at merge_call", {"api": request.collective, "waiting_for": pending}):
                        part = self._park(i)
                if self.orders_streams:  # what the round's function launched, before this replica reads it
                    cupy_streams.follow(self._round_marks)
            else:
                error, requests = outcome
                if error is not None:
                    self.fail(error, ("barrier", None))
                    raise StopReplica
                part = self._settle(i, requests)
        except StopReplica:
            raise
        except BaseException as error:
            # Only the caller's thread gets here (an interrupt landing in this bookkeeping):
            # release anyone this replica was about to, then unwind.
            self._interrupted_in_replica_0(error)
            raise StopReplica from None
        if self.sequential:
            self._await_turn(i)
        return part

    def _hand_over(self, i: int, request: MergeRequest | CollectiveRequest) -> None:
        """Replica ``i``, not the last to arrive, hands ``request`` over and goes on (see "Handing over").

        The payload is replaced by the private copy ``request.snapshot`` takes (the settler
        waits for it), and the replica's fence goes up: its next variable access waits for
        the settle (``update_fence``).
        """
        try:
            assert type(request) is CollectiveRequest and request.snapshot is not None
            if _profiler.active:
                with _profiler.Span(f"hand over: {request.collective}", {"replica": i}):
                    request.payload, fenced = request.snapshot(request.payload, i)
            else:
                request.payload, fenced = request.snapshot(request.payload, i)
        finally:
            with self._lock:
                self._snapshotting[i] = False
                if self._snapshots_taken is not None:
                    self._snapshots_taken.notify_all()
        update_fence.raise_fence(lambda: self.await_settled(i), fenced)

    def await_settled(self, i: int) -> None:
        """Blocks replica ``i`` until the request it handed over is settled (at once if it is).

        Raises :class:`StopReplica` when the step failed meanwhile.
        """
        update_fence.lower()
        with self._lock:
            if self._handed[i] is None:
                return
            if self._failure is not None:
                raise StopReplica
            self._awaiting_settle[i] = True
        if _profiler.active:
            with _profiler.Span("wait for the update handed over", {"replica": i}):
                self._park(i)
        else:
            self._park(i)

    def _await_snapshots(self) -> None:
        """Waits (as the settler) until every replica handing a request over has copied its payload.

        The copies are of gradients already in memory, bounded by what may be handed over:
        a short spin covers them, then a blocking wait.
        """
        start = time.perf_counter()
        while True in self._snapshotting and time.perf_counter() - start < _SNAPSHOT_SPIN_SECONDS:
            os.sched_yield()
        with self._lock:
            if True in self._snapshotting:
                taken = self._snapshots_taken = self._snapshots_taken or threading.Condition(self._lock)
                while True in self._snapshotting:
                    taken.wait(self.watch.poll_seconds())

    def _arrive_done(self, i: int, result: Nest) -> None:
        self.results[i] = result
        with self._lock:
            if self._failure is not None:
                return
            if self._handed[i] == self._round:  # its hand-over's round is incomplete: this return counts in the next
                self._returned_early[i] = True
                return
            self._kinds[i] = _DONE
            if self.sequential:
                self._pass_turn(i)
            outcome = self._arrive(i)
        if outcome is not None and outcome[0] is not None:
            self.fail(outcome[0], ("barrier", None))

    def _arrive(self, i: int) -> tuple[Exception | None, list[Any]] | None:
        """Records replica ``i``'s arrival (lock held). None while the round is incomplete.

        When ``i`` completes the round, the replicas parked in it become ``_unreleased``
        (``i`` alone may release them) and this returns ``(error, requests)``: the
        unequal-count or mixed-call error, or the requests when every replica brought one.
        """
        n = self.num_replicas
        self._arrived += 1
        if self._arrived < n:
            if self._round_started is None and self._kinds[i] is _MERGE:
                self._round_started = time.monotonic()
            return None
        kinds, requests = self._kinds, self._requests
        handed = self._handed
        self._unreleased = [r for r, kind in enumerate(kinds) if kind is _MERGE and r != i and handed[r] is None]
        self._settler = threading.get_ident()
        self._kinds = [None] * n
        self._requests = [None] * n
        self._arrived = 0
        self._round += 1
        self._round_started = None
        if True in self._returned_early:  # replicas that handed over, then returned: they arrive in the new round
            for r, early in enumerate(self._returned_early):
                if early:
                    self._returned_early[r] = False
                    self._kinds[r] = _DONE
                    self._arrived += 1
        if n == 1:  # a one-replica step: nothing to compare
            return (None, requests) if kinds[0] is _MERGE else (None, [])
        if _DONE in kinds:
            if _MERGE not in kinds:
                return None, []
            return self._count_error(kinds), []
        first = requests[0]
        for request in requests:
            if request.collective != first.collective or type(request) is not type(first):
                return self._mixed_calls_error([r.collective for r in requests]), []
        self._merge_started = time.monotonic()
        return None, requests

    def _park(self, i: int) -> Nest:
        """Waits at the barrier for this replica's part; runs parts of parallel jobs meanwhile."""
        if i == 0 and self.on_caller_thread() and threading.current_thread() is threading.main_thread():
            with held_signals.interrupts_held(self._mailboxes[0]) as held:
                return self._park_loop(i, held)
        return self._park_loop(i, None)

    def _park_loop(self, i: int, held: list[Any] | None) -> Nest:
        mailbox = self._mailboxes[i]
        site = self.sites[i]
        budget = site.budget(self.participants)
        while True:
            try:
                message = waiting.get(mailbox, budget, self.watch.poll_seconds(), site)
            except queue.Empty:
                self._watch()
                continue
            except BaseException as error:  # an interrupt of the caller waiting as replica 0
                self._caller_interrupted(error)
                continue
            finally:
                budget = 0.0  # spin once per wait: past the budget the peer is not "about to arrive"
            kind = message[0]
            if kind is RESUME:
                return message[1]
            if kind is TASK:
                message[1].run_part(message[2])
                continue
            if kind is STOP:
                raise StopReplica
            if kind is INTERRUPTED and held is not None:
                try:
                    held_signals.run_held_handler(held)  # the SIGINT handler, now that no message is in flight
                except BaseException as error:
                    self._caller_interrupted(error)
                continue
            # SHUTDOWN (the pool was abandoned) is for the thread loop: hand it back.
            mailbox.put(message)
            raise StopReplica

    def _settle(self, i: int, requests: list[Any]) -> Nest:
        """Runs the round's request once (replica ``i`` arrived last) and releases the others."""
        if True in self._snapshotting:
            self._await_snapshots()
        others = self._unreleased
        state = thread_state.state
        saved = state.save()
        caller = self._caller
        # As if on the caller's thread, made cross-replica (whichever thread settles the round).
        state.modes = [*caller.modes, self._cross_replica]
        state.devices = list(caller.devices)
        state.updates = list(caller.updates)
        state.sync_on_read = list(caller.sync_on_read)
        state.colocations = []
        state.global_scope = None
        state.default_scopes = 0
        if state.helpers is None and others:  # the parked replicas may run parts of parallel jobs
            state.helpers = [self._mailboxes[r] for r in others]
        extended = self.strategy.extended
        seq = extended._collective_seq()  # other workers (MultiWorkerMirroredStrategy) meet in this round's collective
        try:
            with device_lib.activate(state.devices[-1] if state.devices else None):
                if self.orders_streams:  # what each replica launched before it arrived
                    for marks in self._arrival_marks:
                        cupy_streams.follow(marks)
                if _profiler.active:
                    first = requests[0]
                    with _profiler.Span(f"merge_fn: {first.collective}", {"call": first.describe(), "replica": i}):
                        parts = requests[0].settle(self, requests)
                else:
                    parts = requests[0].settle(self, requests)
                if self.orders_streams:  # read by the parked replicas once released (``meet``)
                    self._round_marks = cupy_streams.mark(self.gpu_ids)
        except BaseException as error:
            name_api(error, requests[0].collective)  # a failure raised unworded (e.g. a collective's check): named by its API
            if isinstance(error, Exception):
                _add_call_site(error)
                # Failed before the workers met (a check, a merge_fn): the other workers raise too, not wait.
                extended._failed_before(seq, requests[0].collective, error)
            with self._lock:
                self._merge_started = None
                if self._failure is None:
                    self._failed_collective = requests[0].collective
            if not isinstance(error, Exception) and self.on_caller_thread() and self.caller_error is None:
                self.caller_error = error  # Ctrl-C while the caller ran the merge: an interrupt of the caller
            self.fail(error, ("merge_fn", i))
            raise StopReplica from None
        finally:
            state.restore(saved)
        with self._lock:
            self._merge_started = None
            failed = self._failure is not None
            if self.sequential:
                self._turn = 0
                self._turn_started = time.monotonic()
                self._turn_changed.notify_all()
            if not failed:
                self._settled_hand_overs()
        if failed:
            self._release_unreleased()
            raise StopReplica
        mailboxes = self._mailboxes
        resuming = self._resuming
        while resuming:
            mailboxes[resuming[0]].put((RESUME, None))
            del resuming[0]
        while others:
            r = others[0]
            mailboxes[r].put((RESUME, parts[r]))
            del others[0]
        return parts[i]

    def _settled_hand_overs(self) -> list[int]:
        """Marks the hand-overs of completed rounds settled (lock held); who waits for that goes to ``_resuming``.

        Kept on the step, not in a local, so that an interrupt landing before they are resumed
        still stops them (``_release_unreleased``).
        """
        awaiting = self._resuming
        for r, handed in enumerate(self._handed):
            if handed is not None and handed < self._round:
                self._handed[r] = None
                if self._awaiting_settle[r]:
                    self._awaiting_settle[r] = False
                    awaiting.append(r)
        return awaiting

    def _release_unreleased(self) -> None:
        """Stops the replicas parked in the round this thread settles (after a failure)."""
        others = self._unreleased
        while others:
            self._mailboxes[others.pop()].put((STOP,))
        resuming = self._resuming
        while resuming:
            self._mailboxes[resuming.pop()].put((STOP,))

    def _exit(self, i: int) -> None:
        with self._lock:
            self._exited[i] = True
            if i == 0:  # the caller's own replica: nobody waits for it
                return
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            self.done.put(True)

    def follow_replicas(self) -> None:
        """Orders the calling thread's streams after what every replica thread launched (the caller, at the end).

        Also lets go of arrays kept alive for other streams' work that has finished since.
        """
        for marks in self._end_marks:
            cupy_streams.follow(marks)
        cupy_streams.release_finished()

    # --- waiting and watching -----------------------------------------------------------------

    def on_caller_thread(self) -> bool:
        return threading.get_ident() == self._caller_thread

    def _watch(self) -> None:
        """One look at the step by a waiting thread (warnings, timeouts, lost threads).

        The caller, waiting as replica 0, also gives up on the replica threads when the step
        has failed and some of them have not come back within the timeout (they are stuck
        in user code or in a hung ``merge_fn``).
        """
        on_caller = self.on_caller_thread()
        try:
            self.watch.check(self)
            give_up = on_caller and (self.watch.drain(self) or self.watch.lost_threads)
        except BaseException as error:  # a stall warning turned into an error, or an interrupt
            if on_caller:
                self._caller_interrupted(error)
            else:
                self.fail(error, ("barrier", None))
            return
        if give_up:
            self.abandoned = True
            raise StopReplica

    def _caller_interrupted(self, error: BaseException) -> None:
        """An exception raised asynchronously in the caller's thread: stop the step, then drain.

        The first one (``caller_error``) is re-raised once every replica is idle; a second
        gives up on the replica threads at once.
        """
        if not self.on_caller_thread():
            raise error
        if self.caller_error is not None:
            self.abandoned = True
            raise StopReplica from None
        self.caller_error = error
        self.fail(error, ("caller", None))

    def _interrupted_in_replica_0(self, error: BaseException) -> None:
        """An interrupt that landed while the caller ran replica 0 (not while it waited)."""
        try:
            self._caller_interrupted(error)
        except StopReplica:  # the second one: the threads are given up
            pass
        if (self._unreleased or self._resuming) and self._settler == threading.get_ident():
            self._release_unreleased()

    # --- turns (sequential steps) ---------------------------------------------------------

    def _await_turn(self, i: int) -> None:
        """Blocks replica ``i`` until it is its turn (or the step failed).

        The wait ends when the replica before it reaches a barrier or returns, or when the
        step fails (``fail`` wakes every waiter). The waiters watch the replica holding the
        turn, so a stuck turn warns and can time out like a stuck barrier.
        """
        while True:
            try:
                with self._lock:
                    if self._failure is not None:
                        raise StopReplica
                    if self._turn == i:
                        return
                    if self._turn_changed.wait(self.watch.poll_seconds()):
                        continue
            except StopReplica:
                raise
            except BaseException as error:  # an interrupt of the caller waiting as replica 0
                self._caller_interrupted(error)
                continue
            self._watch()

    def _pass_turn(self, i: int) -> None:
        """Replica ``i`` reached a barrier or returned: the next replica may run (lock held)."""
        self._turn = i + 1
        self._turn_started = time.monotonic()
        self._turn_changed.notify_all()

    # --- failure --------------------------------------------------------------------------

    def fail(self, error: BaseException, origin: tuple[str, int | None]) -> None:
        """Records a failure (the first one wins) and releases replicas parked at the barrier.

        The replicas parked in the current round are released at once; those parked in a
        round being settled are released by the thread settling it: here when that is the
        calling thread (its request failed, or it was interrupted), else when it finishes.
        """
        with self._lock:
            if self._failure is None:
                self._failure = error
                self._failure_origin = origin
                self._failure_time = time.monotonic()
                handed = self._handed
                stop = [r for r, kind in enumerate(self._kinds) if kind is _MERGE and handed[r] is None]
            else:
                self._other_failures.append((origin[1], error))
                stop = []
            for r, awaiting in enumerate(self._awaiting_settle):  # parked for a hand-over's settle
                if awaiting:
                    self._awaiting_settle[r] = False
                    stop.append(r)
            self._turn_changed.notify_all()
        for r in stop:
            self._mailboxes[r].put((STOP,))
        if (self._unreleased or self._resuming) and self._settler == threading.get_ident():
            self._release_unreleased()

    def raise_failure(self) -> None:
        """Re-raises the step's failure in the caller, annotated with where it happened."""
        error = self._failure
        if error is None:
            return
        kind, replica = self._failure_origin or ("barrier", None)
        if kind == "replica" and replica is not None:
            add_note(
                error,
                f"Raised in replica {replica} (on {self.devices[replica].short_name}) of "
                f"{self.strategy!r} during strategy.run({name_of(self.fn)}).",
            )
        elif kind == "merge_fn" and replica is not None:
            collective = self._failed_collective or "merge_call()"
            if collective == "merge_call()":
                add_note(
                    error,
                    f"Raised in the merge_fn of a merge_call() in {self.strategy!r} "
                    f"(merge_fn ran on replica {replica}'s thread in cross-replica context).",
                )
            else:
                add_note(error, f"Raised in {collective} of {self.strategy!r} during strategy.run({name_of(self.fn)}).")
        others = [(r, e) for r, e in self._other_failures if not isinstance(e, StopReplica)]
        listed = ", ".join(f"replica {r}: {describe_error(e)}" for r, e in others if r is not None)
        if listed:
            add_note(error, f"Other replicas also raised: {listed}.")
        raise error.with_traceback(error.__traceback__)

    def _count_error(self, kinds: Sequence[str | None]) -> MergeCallCountError:
        counts = {r: self._merge_counts[r] for r in range(self.num_replicas)}
        parts = []
        for r, kind in enumerate(kinds):
            if kind is _DONE:
                parts.append(f"replica {r} returned after {counts[r]} merge_call() calls")
            else:
                parts.append(f"replica {r} is waiting in merge_call() number {counts[r]}")
        return MergeCallCountError(
            f"Some replicas made a different number of merge_call() calls in "
            f"{self.strategy!r}.run({name_of(self.fn)}): {'; '.join(parts)}. Every replica must "
            f"make the same merge_call() calls, including those made for it by all_reduce(), "
            f"all_gather(), optimizers and variable assignments; check for data-dependent "
            f"branches around them.",
            counts=counts,
        )

    def _mixed_calls_error(self, collectives: Sequence[str]) -> RuntimeError:
        calls = "; ".join(f"replica {r} called {name}" for r, name in enumerate(collectives))
        return RuntimeError(
            f"The replicas of {self.strategy!r}.run({name_of(self.fn)}) met at a barrier in different "
            f"collective calls: {calls}. Every replica must make the same sequence of merge_call(), "
            f"all_reduce(), all_gather(), variable creations and aggregated variable writes; check for "
            f"replica-dependent branches around them."
        )


def _add_call_site(error: Exception) -> None:
    """Puts the settling replica's own frames on top of ``error``'s traceback (called by ``_settle``).

    A round's function fails on the thread of the replica that arrived last, and ``_settle``
    catches the exception, so its traceback starts at ``_settle``: printed, it would show
    towerdist's internals but not the user's ``all_reduce``/``merge_call`` line. This
    prepends the frames from ``Step.execute`` (the replica function's caller) down to
    ``meet``, as if the exception had propagated through them. Only the failure path pays.
    """
    frames: list[types.FrameType] = []
    frame: types.FrameType | None = sys._getframe(2)  # 0: here, 1: _settle, 2: meet
    while frame is not None:
        frames.append(frame)
        if frame.f_code is _EXECUTE_CODE:
            break
        frame = frame.f_back
    else:
        return  # not under a replica's execute (never expected): leave the traceback alone
    tb = error.__traceback__
    for frame in frames:  # innermost first: each new entry goes on top
        tb = types.TracebackType(tb, frame, frame.f_lasti, frame.f_lineno)
    error.__traceback__ = tb


_EXECUTE_CODE = Step.execute.__code__


_ = SHUTDOWN  # the thread loop's message, handed back by _park
