"""The replica scheduler: persistent concurrent threads, the merge_call barrier, failures.

Synchronisation in these tests uses events with timeouts (never sleeps): a replica that
waits on an event that never comes makes the assertion fail, not hang.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import json
import logging
import multiprocessing
import os
import signal
import threading
import warnings
import weakref
from collections.abc import Iterator

import numpy as np
import pytest

import towerdist as td
from towerdist._src import device as device_lib
from towerdist._src import parallel, waiting
from towerdist._src.strategies.replica_step import Step

from conftest import TEST_REPLICA_TIMEOUT_SECONDS, TEST_REPLICA_WARNING_SECONDS, cpus

WAIT = 10.0  # seconds a replica waits for an event that the test guarantees will come


def replica_id() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


@pytest.fixture
def fresh2() -> td.distribute.MirroredStrategy:
    """A private 2-replica strategy, for tests that abandon or break its threads."""
    return td.distribute.MirroredStrategy(cpus(2))


# --- threads ------------------------------------------------------------------------------


@pytest.mark.replicas(4)
def test_replica_0_runs_on_the_callers_thread_and_the_others_on_named_threads(mirrored_strategy):
    names = mirrored_strategy.run(lambda: threading.current_thread().name)
    caller = threading.current_thread().name
    assert mirrored_strategy.experimental_local_results(names) == (caller, *(f"towerdist-replica-{i}" for i in range(1, 4)))
    idents = mirrored_strategy.experimental_local_results(mirrored_strategy.run(threading.get_ident))
    assert idents[0] == threading.get_ident()
    assert len(set(idents)) == 4


def test_threads_are_reused_between_runs(mirrored_strategy):
    first = mirrored_strategy.experimental_local_results(mirrored_strategy.run(threading.get_ident))
    second = mirrored_strategy.experimental_local_results(mirrored_strategy.run(threading.get_ident))
    assert first == second


def test_replicas_run_concurrently(mirrored_strategy):
    """Each replica waits for an event the other sets: only concurrent replicas finish."""
    events = [threading.Event(), threading.Event()]

    def fn():
        me = replica_id()
        events[me].set()
        return events[1 - me].wait(WAIT)

    # Both replicas return the same object (True), which regroup leaves unwrapped.
    assert mirrored_strategy.run(fn) is True


def test_ten_thousand_runs_leave_no_extra_threads(mirrored_strategy):
    mirrored_strategy.run(lambda: None)
    before = threading.active_count()
    for _ in range(10_000):
        mirrored_strategy.run(lambda: None)
    assert threading.active_count() == before
    assert mirrored_strategy.extended._scheduler.num_threads == 1  # replica 0 runs on the caller's thread


def test_collecting_a_strategy_stops_its_threads():
    strategy = td.distribute.MirroredStrategy(cpus(3))
    idents = strategy.experimental_local_results(strategy.run(threading.get_ident))[1:]  # replica 0: the caller
    threads = [t for t in threading.enumerate() if t.ident in idents]
    assert len(threads) == 2
    del strategy
    gc.collect()
    for thread in threads:
        thread.join(timeout=WAIT)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.replicas(4)
def test_each_replica_runs_under_its_device_scope(mirrored_strategy):
    devices = mirrored_strategy.run(lambda: device_lib.current().name)
    assert mirrored_strategy.experimental_local_results(devices) == mirrored_strategy.extended.worker_devices


def test_concurrent_runs_from_two_user_threads(mirrored_strategy):
    results: dict[int, object] = {}

    def user(k: int) -> None:
        results[k] = mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: k) + replica_id())

    threads = [threading.Thread(target=user, args=(k,)) for k in (10, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT)
    assert not any(t.is_alive() for t in threads)
    for k in (10, 20):
        assert mirrored_strategy.experimental_local_results(results[k]) == (k, k + 1)


# --- merge_call ---------------------------------------------------------------------------


@pytest.mark.replicas(4)
def test_merge_fn_runs_once_in_cross_replica_context_with_regrouped_args(mirrored_strategy):
    calls = []

    def merge_fn(strategy, value, *, scale):
        calls.append(
            (strategy, td.distribute.in_cross_replica_context(), td.distribute.get_replica_context(), scale)
        )
        return sum(strategy.experimental_local_results(value)) * scale

    def fn():
        return td.distribute.get_replica_context().merge_call(merge_fn, args=(replica_id(),), kwargs={"scale": 2})

    result = mirrored_strategy.run(fn)
    assert calls == [(mirrored_strategy, True, None, 2)]
    assert result == 2 * (0 + 1 + 2 + 3)  # the same int for every replica is not wrapped


@pytest.mark.replicas(4)
def test_each_replica_receives_its_component_of_a_distributed_merge_result(mirrored_strategy):
    def fn():
        return td.distribute.get_replica_context().merge_call(lambda s, v: v, args=(replica_id() * 10,))

    assert mirrored_strategy.experimental_local_results(mirrored_strategy.run(fn)) == (0, 10, 20, 30)


def test_merge_args_are_in_replica_order_whatever_the_arrival_order(mirrored_strategy):
    replica1_arrived = threading.Event()

    def fn():
        me = replica_id()
        if me == 0:
            assert replica1_arrived.wait(WAIT)  # replica 1 reaches merge_call first
        else:
            replica1_arrived.set()
        return td.distribute.get_replica_context().merge_call(
            lambda s, v: s.experimental_local_results(v), args=(f"from {me}",)
        )

    assert mirrored_strategy.run(fn) == ("from 0", "from 1")


def test_merge_fn_sees_the_callers_device_scope(mirrored_strategy):
    def fn():
        return td.distribute.get_replica_context().merge_call(lambda s: device_lib.current())

    with td.device("CPU:5"):
        seen = mirrored_strategy.run(fn)
    assert seen == device_lib.parse("CPU:5")


@pytest.mark.replicas(4)
def test_several_merge_calls_in_one_step(mirrored_strategy):
    def fn():
        ctx = td.distribute.get_replica_context()
        total = 0
        for k in range(5):
            total += ctx.merge_call(lambda s, v: sum(s.experimental_local_results(v)), args=(replica_id() + k,))
        return total

    expected = sum(sum(r + k for r in range(4)) for k in range(5))
    assert mirrored_strategy.run(fn) == expected


def test_run_inside_merge_fn_is_allowed(mirrored_strategy):
    def merge_fn(strategy):
        return strategy.experimental_local_results(strategy.run(replica_id))

    result = mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(merge_fn))
    assert result == (0, 1)


# --- failures -----------------------------------------------------------------------------


@pytest.mark.replicas(4)
@pytest.mark.parametrize("failing", [0, 1, 2, 3])
def test_exception_in_one_replica_reaches_the_caller_with_its_identity(mirrored_strategy, failing):
    def fn():
        if replica_id() == failing:
            raise KeyError(f"boom in replica {failing}")
        return td.distribute.get_replica_context().merge_call(lambda s: "merged")

    with pytest.raises(KeyError, match=f"boom in replica {failing}") as info:
        mirrored_strategy.run(fn)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"replica {failing} (on /cpu:{failing})" in notes
    assert mirrored_strategy.run(lambda: 7) == 7


def test_exception_in_merge_fn_reaches_the_caller(mirrored_strategy):
    def fn():
        return td.distribute.get_replica_context().merge_call(lambda s: 1 / 0)

    with pytest.raises(ZeroDivisionError) as info:
        mirrored_strategy.run(fn)
    assert "merge_fn" in "\n".join(getattr(info.value, "__notes__", []))
    assert mirrored_strategy.experimental_local_results(mirrored_strategy.run(replica_id)) == (0, 1)


def test_replicas_cannot_swallow_the_stop_of_a_failed_step(mirrored_strategy):
    """A replica catching Exception around merge_call does not hide replica 1's error."""

    def fn():
        if replica_id() == 1:
            raise ValueError("replica 1 failed")
        try:
            return td.distribute.get_replica_context().merge_call(lambda s: "merged")
        except Exception:
            return "swallowed"

    with pytest.raises(ValueError, match="replica 1 failed"):
        mirrored_strategy.run(fn)


def test_every_replica_failing_reports_one_error_and_mentions_the_others(mirrored_strategy):
    both_failing = threading.Barrier(2, timeout=WAIT)

    def fn():
        both_failing.wait()
        raise RuntimeError(f"failure {replica_id()}")

    with pytest.raises(RuntimeError, match="failure [01]") as info:
        mirrored_strategy.run(fn)
    assert "Other replicas also raised" in "\n".join(info.value.__notes__)


@pytest.mark.parametrize("extra", [0, 1])
def test_unequal_merge_call_counts_raise(mirrored_strategy, extra):
    def fn():
        ctx = td.distribute.get_replica_context()
        ctx.merge_call(lambda s: None)
        if replica_id() == extra:
            ctx.merge_call(lambda s: None)
        return "done"

    with pytest.raises(td.errors.MergeCallCountError, match="Some replicas made a different number of merge_call") as info:
        mirrored_strategy.run(fn)
    assert info.value.counts == {extra: 2, 1 - extra: 1}
    assert isinstance(info.value, RuntimeError)
    assert mirrored_strategy.run(lambda: "ok") == "ok"


@pytest.mark.replicas(4)
def test_merge_call_count_mismatch_when_one_replica_makes_none(mirrored_strategy):
    def fn():
        if replica_id() != 2:
            td.distribute.get_replica_context().merge_call(lambda s: None)

    with pytest.raises(td.errors.MergeCallCountError, match="replica 2 returned after 0 merge_call"):
        mirrored_strategy.run(fn)


def test_keyboard_interrupt_in_the_caller_stops_the_step(fresh2):
    """SIGINT reaches the caller while replica 0 is parked in merge_call and replica 1 is busy."""
    main = threading.main_thread()
    if threading.current_thread() is not main:
        pytest.skip("needs to run on the main thread to receive SIGINT")
    release = threading.Event()

    def on_sigint(signum, frame):
        release.set()  # let the busy replica finish, as a user's code eventually would
        raise KeyboardInterrupt

    def fn():
        if replica_id() == 1:
            signal.pthread_kill(main.ident, signal.SIGINT)
            assert release.wait(WAIT)
            return "finished"
        return td.distribute.get_replica_context().merge_call(lambda s: "merged")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            fresh2.run(fn)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)
    assert fresh2.extended._scheduler.num_threads == 1


# --- no silent hangs ----------------------------------------------------------------------


class _SetOnRecord(logging.Handler):
    def __init__(self, event: threading.Event, needle: str) -> None:
        super().__init__(logging.WARNING)
        self.event = event
        self.needle = needle

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.event.set()


@contextlib.contextmanager
def logged(needle: str) -> Iterator[threading.Event]:
    """An event set when the ``towerdist`` logger warns with a message containing ``needle``."""
    event = threading.Event()
    handler = _SetOnRecord(event, needle)
    logging.getLogger("towerdist").addHandler(handler)
    try:
        yield event
    finally:
        logging.getLogger("towerdist").removeHandler(handler)


def test_a_stalled_barrier_warns_naming_the_missing_replica(fresh2, replica_timeouts):
    replica_timeouts(warning_seconds=0.05, timeout_seconds=None)

    def fn():
        if replica_id() == 1:
            assert warned.wait(WAIT)  # arrive only after the caller has warned
        return td.distribute.get_replica_context().merge_call(lambda s: "merged")

    with logged("did not reach the barrier") as warned:
        with pytest.warns(td.errors.ReplicaStallWarning, match="replica 1 of MirroredStrategy") as record:
            assert fresh2.run(fn) == "merged"
    message = str(record[0].message)
    assert "replica 0 is waiting in merge_call() number 1" in message


def test_hard_timeout_raises_and_the_strategy_recovers(fresh2, replica_timeouts):
    replica_timeouts(warning_seconds=None, timeout_seconds=0.2)
    release = threading.Event()
    stuck: list[threading.Thread] = []

    def fn():
        if replica_id() == 1:
            stuck.append(threading.current_thread())
            release.wait(WAIT)  # never reaches merge_call in time
        return td.distribute.get_replica_context().merge_call(lambda s: "merged")

    try:
        with pytest.raises(td.errors.DeadlineExceededError, match="replica 1 of MirroredStrategy") as info:
            fresh2.run(fn)
    finally:
        release.set()
    assert info.value.missing == [1]
    assert isinstance(info.value, TimeoutError)
    replica_timeouts(warning_seconds=TEST_REPLICA_WARNING_SECONDS, timeout_seconds=TEST_REPLICA_TIMEOUT_SECONDS)
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)
    stuck[0].join(timeout=WAIT)  # the abandoned thread exits once its user code returns
    assert not stuck[0].is_alive()


@pytest.mark.replicas(4)
def test_large_reduction_inside_merge_fn_uses_parked_replica_threads(mirrored_strategy):
    """A multi-MiB all-reduce is split over the replica threads and stays exact."""
    size = 1 << 20  # 4 MiB of float32 per replica, above the parallel threshold

    def fn():
        value = np.full(size, replica_id() + 1, dtype=np.float32)
        return td.distribute.get_replica_context().all_reduce("sum", value)

    for result in mirrored_strategy.experimental_local_results(mirrored_strategy.run(fn)):
        np.testing.assert_array_equal(result, np.full(size, 10, dtype=np.float32))


def test_results_are_freed_without_the_cycle_collector(mirrored_strategy):
    """A run keeps no reference cycle to its results: dropping them frees the buffers at once."""

    def fn():
        return td.distribute.get_replica_context().all_reduce("sum", np.ones(1000))

    mirrored_strategy.run(fn)  # warm up
    gc.disable()
    try:
        result = mirrored_strategy.run(fn)
        refs = [weakref.ref(component) for component in result.values]
        del result
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


# --- parallel parts on replica threads ----------------------------------------------------


@pytest.mark.replicas(4)
def test_merge_fn_can_run_parts_on_the_parked_replica_threads(mirrored_strategy):
    """Inside merge_fn the other replicas are parked and accept parts of a parallel job."""

    def merge_fn(strategy):
        workers = parallel.max_parts()
        ran_on: list[int] = [0] * workers
        parallel.run_parts(lambda part: ran_on.__setitem__(part, threading.get_ident()), workers)
        return workers, ran_on

    workers, ran_on = mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(merge_fn))
    assert workers == min(4, os.cpu_count() or 1)
    assert len(set(ran_on)) == workers  # every part ran on a different thread


@pytest.mark.replicas(4)
def test_cross_replica_reductions_borrow_the_idle_replica_threads(mirrored_strategy):
    mirrored_strategy.run(lambda: None)  # the pool exists
    replica_threads = set(mirrored_strategy.experimental_local_results(mirrored_strategy.run(threading.get_ident))[1:])
    ran_on: list[int] = []
    lease = mirrored_strategy.extended._scheduler.lend_idle_helpers()
    try:
        workers = parallel.max_parts(lease)
        parallel.run_parts(lambda part: ran_on.append(threading.get_ident()), workers, lease)
    finally:
        lease.release()
    assert workers == min(3 + 1, os.cpu_count() or 1)  # the 3 replica threads and the caller
    assert threading.get_ident() in ran_on  # the caller does one part itself
    assert len(set(ran_on) & replica_threads) == workers - 1


@pytest.mark.replicas(4)
def test_an_error_in_a_parallel_part_reaches_the_caller(mirrored_strategy):
    def merge_fn(strategy):
        last = parallel.max_parts() - 1  # a helper thread's part when there are helpers

        def part(k: int) -> None:
            if k == last:
                raise ArithmeticError(f"part {k} failed")

        parallel.run_parts(part, last + 1)

    with pytest.raises(ArithmeticError, match="part .* failed"):
        mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(merge_fn))
    assert mirrored_strategy.run(lambda: "ok") == "ok"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_chunked_parallel_reduction_is_exact(dtype, op):
    """Tiny chunks and threshold force many chunks over several parts, in run and in reduce."""
    ops = td.distribute.SharedMemoryAllReduce(chunk_bytes=4096, parallel_threshold_bytes=4096)
    strategy = td.distribute.MirroredStrategy(cpus(4), cross_device_ops=ops)
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-1000, 1000, size=10_007).astype(dtype) for _ in range(4)]
    total = inputs[0] + inputs[1] + inputs[2] + inputs[3]
    expected = total if op == "sum" else total / 4
    values = strategy.experimental_distribute_values_from_function(lambda ctx: inputs[ctx.replica_id_in_sync_group])
    np.testing.assert_array_equal(strategy.reduce(op, values, axis=None), expected)
    in_run = strategy.run(lambda x: td.distribute.get_replica_context().all_reduce(op, x), args=(values,))
    for part in strategy.experimental_local_results(in_run):
        np.testing.assert_array_equal(part, expected)


@pytest.mark.replicas(4)
def test_the_barrier_makes_once_only_work_deterministic_under_random_timing(mirrored_strategy):
    """The hook for creating variables inside run: made once, from replica 0's value, whatever
    the order in which replicas arrive (delays are injected with events, not sleeps)."""
    created: list[object] = []

    def create_once(strategy, initial_values):
        value = strategy.experimental_local_results(initial_values)[0]
        created.append(value)
        return {"shared": value}

    def fn(order):
        me = replica_id()
        gates[me].wait(WAIT)  # arrive in the order the test chose
        if me != order[-1]:
            gates[order[order.index(me) + 1]].set()
        return td.distribute.get_replica_context()._merge_call(create_once, (me + 5,), {}, "create")

    rng = np.random.default_rng(1)
    for _ in range(5):
        order = [int(i) for i in rng.permutation(4)]
        gates = [threading.Event() for _ in range(4)]
        gates[order[0]].set()
        created.clear()
        result = mirrored_strategy.run(fn, args=(order,))
        assert created == [5]  # once, from replica 0's value, whatever the arrival order
        assert [part["shared"] for part in mirrored_strategy.experimental_local_results(result)] == [5, 5, 5, 5]


# --- stalls, interrupts and hung merge_fns: none may hang, leak threads or lose a release --


def _on_sigint(*events: threading.Event):
    """A SIGINT handler that sets the next event of ``events`` and raises KeyboardInterrupt."""
    pending = list(events)

    def handler(signum, frame):
        if pending:
            pending.pop(0).set()
        raise KeyboardInterrupt

    return handler


@pytest.fixture
def sigint():
    """Installs a SIGINT handler for one test (main thread only) and restores the old one."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs to run on the main thread to receive SIGINT")
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield lambda handler: signal.signal(signal.SIGINT, handler)
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupt_main() -> None:
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


@pytest.fixture
def caller_parks_first(monkeypatch) -> threading.Event:
    """An event set when replica 0 (the caller) parks at a barrier.

    A replica function whose other replicas wait for it before their ``merge_call`` makes
    the merge_fn run on a replica thread while the caller waits, as these tests need.
    """
    parked = threading.Event()
    park = Step._park

    def park_and_signal(self, i):
        if i == 0:
            parked.set()
        return park(self, i)

    monkeypatch.setattr(Step, "_park", park_and_signal)
    return parked


def merge_after_the_caller(merge_fn, parked: threading.Event):
    """A replica function: replica 0 calls merge_call at once, the others once it is parked."""

    def fn():
        if replica_id() != 0:
            assert parked.wait(WAIT)
        return td.distribute.get_replica_context().merge_call(merge_fn)

    return fn


def test_a_stall_warning_turned_into_an_error_stops_the_step_cleanly(fresh2, replica_timeouts):
    replica_timeouts(warning_seconds=0.05, timeout_seconds=None)

    def fn():
        if replica_id() == 1:
            assert warned.wait(WAIT)
        return td.distribute.get_replica_context().merge_call(lambda s: "merged")

    with logged("did not reach the barrier") as warned:
        with warnings.catch_warnings():
            warnings.simplefilter("error", td.errors.ReplicaStallWarning)
            with pytest.raises(td.errors.ReplicaStallWarning):
                fresh2.run(fn)
    assert fresh2.run(lambda: 2) == 2  # the pool is idle, not stuck with a parked replica


def test_an_interrupt_during_merge_fn_then_a_merge_fn_error_releases_everyone(fresh2, sigint, caller_parks_first):
    interrupted = threading.Event()
    sigint(_on_sigint(interrupted))

    def merge_fn(strategy):
        interrupt_main()
        assert interrupted.wait(WAIT)
        raise ValueError("merge_fn failed after the interrupt")

    threads_before = fresh2.experimental_local_results(fresh2.run(threading.get_ident))
    with pytest.raises(KeyboardInterrupt):
        fresh2.run(merge_after_the_caller(merge_fn, caller_parks_first))
    # Every replica was released and drained: the same threads serve the next run.
    assert fresh2.experimental_local_results(fresh2.run(threading.get_ident)) == threads_before


def test_a_second_interrupt_abandons_the_threads_which_then_exit(fresh2, sigint, monkeypatch, caller_parks_first):
    first, second, abandoned = threading.Event(), threading.Event(), threading.Event()
    sigint(_on_sigint(first, second))
    idents = fresh2.experimental_local_results(fresh2.run(threading.get_ident))[1:]  # replica 0: the caller
    old_threads = [t for t in threading.enumerate() if t.ident in idents]
    scheduler = fresh2.extended._scheduler
    release = scheduler._release

    def release_and_signal(pool, abandon=False):
        release(pool, abandon)
        if abandon:
            abandoned.set()  # SHUTDOWN is now in every mailbox, replica 1 still parked

    monkeypatch.setattr(scheduler, "_release", release_and_signal)

    def merge_fn(strategy):
        interrupt_main()
        assert first.wait(WAIT)
        interrupt_main()  # the caller, still draining, gives up on the threads
        assert second.wait(WAIT) and abandoned.wait(WAIT)
        return "merge_fn finished late"

    with pytest.raises(KeyboardInterrupt):
        fresh2.run(merge_after_the_caller(merge_fn, caller_parks_first))
    assert old_threads
    for thread in old_threads:
        thread.join(timeout=WAIT)
    assert not any(t.is_alive() for t in old_threads)
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)  # a fresh pool


def test_the_drain_after_an_interrupt_respects_the_hard_timeout(fresh2, sigint, replica_timeouts):
    replica_timeouts(warning_seconds=None, timeout_seconds=0.2)
    interrupted, release = threading.Event(), threading.Event()
    sigint(_on_sigint(interrupted))
    stuck: list[threading.Thread] = []
    released_by_test: list[bool] = []

    def fn():
        if replica_id() == 1:
            stuck.append(threading.current_thread())
            interrupt_main()
            # Busy in user code until the test releases it, which it does only after run()
            # has returned: had the caller waited for this replica, the wait would time out.
            released_by_test.append(release.wait(WAIT))
        return "done"

    try:
        with pytest.raises(KeyboardInterrupt):
            fresh2.run(fn)
        assert interrupted.is_set()
    finally:
        release.set()
    stuck[0].join(timeout=WAIT)
    assert not stuck[0].is_alive()
    assert released_by_test == [True]
    replica_timeouts(warning_seconds=TEST_REPLICA_WARNING_SECONDS, timeout_seconds=TEST_REPLICA_TIMEOUT_SECONDS)
    assert fresh2.run(lambda: "ok") == "ok"


def test_a_slow_merge_fn_warns(fresh2, replica_timeouts):
    replica_timeouts(warning_seconds=0.05, timeout_seconds=None)

    def merge_fn(strategy):
        assert warned.wait(WAIT)
        return "merged"

    with logged("has been running") as warned:
        with pytest.warns(td.errors.ReplicaStallWarning, match="A merge_fn of MirroredStrategy"):
            assert fresh2.run(lambda: td.distribute.get_replica_context().merge_call(merge_fn)) == "merged"


def test_a_hung_merge_fn_times_out_and_the_caller_gives_up_on_its_thread(fresh2, replica_timeouts, caller_parks_first):
    """The merge_fn hangs on replica 1's thread; the caller, parked as replica 0, times out and leaves."""
    replica_timeouts(warning_seconds=None, timeout_seconds=0.2)
    release = threading.Event()
    merge_fn_returned: list[bool] = []

    def merge_fn(strategy):
        release.wait(WAIT)
        merge_fn_returned.append(True)
        return "merged"

    try:
        with pytest.raises(td.errors.DeadlineExceededError, match="merge_fn .* has been running"):
            fresh2.run(merge_after_the_caller(merge_fn, caller_parks_first))
        assert merge_fn_returned == []  # run did not wait for the hung merge_fn
    finally:
        release.set()
    replica_timeouts(warning_seconds=TEST_REPLICA_WARNING_SECONDS, timeout_seconds=TEST_REPLICA_TIMEOUT_SECONDS)
    assert fresh2.run(lambda: "ok") == "ok"


def test_a_merge_fn_hung_on_the_callers_thread_times_out_when_it_returns(fresh2, replica_timeouts):
    """Replica 0 arrives last and runs the merge_fn itself: the parked replica times out, the
    timeout is logged at once, and run raises it when the merge_fn returns."""
    replica_timeouts(warning_seconds=None, timeout_seconds=0.2)

    def fn():
        if replica_id() == 0:
            assert parked.wait(WAIT)  # replica 1 is at the barrier first
        else:
            parked.set()
        return td.distribute.get_replica_context().merge_call(merge_fn)

    def merge_fn(strategy):
        assert threading.get_ident() == caller  # replica 0 arrived last: the merge_fn runs on its thread
        assert timed_out.wait(WAIT)  # hung until the timeout is logged
        return "merged"

    caller = threading.get_ident()
    parked = threading.Event()
    with logged("Raising because the replica timeout") as timed_out:
        with pytest.raises(td.errors.DeadlineExceededError, match="merge_fn .* has been running"):
            fresh2.run(fn)
    replica_timeouts(warning_seconds=TEST_REPLICA_WARNING_SECONDS, timeout_seconds=TEST_REPLICA_TIMEOUT_SECONDS)
    assert fresh2.run(lambda: "ok") == "ok"


def test_stall_warnings_point_at_the_users_line(fresh2, replica_timeouts):
    replica_timeouts(warning_seconds=0.05, timeout_seconds=None)

    def fn():
        if replica_id() == 1:
            assert warned.wait(WAIT)
        return td.distribute.get_replica_context().merge_call(lambda s: None)

    with logged("did not reach the barrier") as warned:
        with pytest.warns(td.errors.ReplicaStallWarning) as record:
            fresh2.run(fn)
    assert record[0].filename == __file__


def test_the_default_strategy_is_one_object_in_every_thread():
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(td.distribute.get_strategy())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT)
    assert len(seen) == 8 and all(s is td.distribute.get_strategy() for s in seen)


@pytest.mark.replicas(4)
def test_a_parallel_jobs_owner_keeps_its_own_error(mirrored_strategy):
    def merge_fn(strategy):
        workers = parallel.max_parts()

        def part(k: int) -> None:
            raise LookupError("owner") if k == 0 else ArithmeticError("helper")

        parallel.run_parts(part, workers)

    with pytest.raises(LookupError, match="owner"):
        mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(merge_fn))


# --- interrupts wherever they land, forked children, slow replicas, broken exceptions -------


@pytest.mark.parametrize("how", ["interrupt_main", "SIGINT to the replica thread"])
def test_an_interrupt_landing_as_the_last_replica_finishes_is_raised(fresh2, sigint, replica_timeouts, how):
    """The interrupt reaches the caller only after the last replica reported it is done.

    A caller that lost the "done" signal to the interrupt would wait for it until the hard
    timeout and then give up on the (idle) threads: the same threads must serve the next run.
    """
    replica_timeouts(warning_seconds=None, timeout_seconds=5.0)
    sigint(signal.default_int_handler)
    threads_before = fresh2.experimental_local_results(fresh2.run(threading.get_ident))
    replica_0_returned = threading.Event()

    def fn():
        if replica_id() == 0:
            replica_0_returned.set()
            return 0
        assert replica_0_returned.wait(WAIT)
        if how == "interrupt_main":
            _thread.interrupt_main()  # flags the main thread without waking it
        else:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # the handler runs on the main thread
        return 1

    with pytest.raises(KeyboardInterrupt):
        fresh2.run(fn)
    assert fresh2.experimental_local_results(fresh2.run(threading.get_ident)) == threads_before


def _run_in_forked_child(strategy, fn, timeout: float = 30.0):
    """Runs ``fn(strategy)`` in a child forked from this process; returns what it sent back."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child():
        try:
            sender.send(("ok", fn(strategy)))
        except BaseException as error:  # reported to the parent, which fails the test with it
            sender.send(("error", f"{type(error).__name__}: {error}"))

    process = context.Process(target=child, daemon=True)
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join(WAIT)
        pytest.fail(f"the forked child did not finish within {timeout} s (it hung)")
    assert process.exitcode == 0
    assert receiver.poll(WAIT)
    return receiver.recv()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_a_strategy_used_after_fork_starts_fresh_threads(fresh2):
    parent_threads = fresh2.experimental_local_results(fresh2.run(threading.get_ident))

    def in_child(strategy):
        reduced = strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", float(replica_id() + 1)))
        idents = strategy.experimental_local_results(strategy.run(threading.get_ident))
        return [float(x) for x in strategy.experimental_local_results(reduced)], idents

    status, payload = _run_in_forked_child(fresh2, in_child)
    assert status == "ok", payload
    values, child_threads = payload
    assert values == [3.0, 3.0]
    assert len(set(child_threads)) == 2
    # The parent keeps its own threads.
    assert fresh2.experimental_local_results(fresh2.run(threading.get_ident)) == parent_threads


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_variables_and_optimizers_work_after_fork(fresh2):
    with fresh2.scope():
        w = td.Variable(np.zeros(2, np.float32))
        opt = td.optimizers.SGD(1.0)
    fresh2.run(lambda: opt.apply_gradients([(np.ones(2, np.float32), w)]))

    def in_child(strategy):
        strategy.run(lambda: opt.apply_gradients([(np.ones(2, np.float32), w)]))
        return [c.numpy().tolist() for c in w.values]

    status, payload = _run_in_forked_child(fresh2, in_child)
    assert status == "ok", payload
    assert payload == [[-4.0, -4.0], [-4.0, -4.0]]
    assert [c.numpy().tolist() for c in w.values] == [[-2.0, -2.0], [-2.0, -2.0]]  # the parent's are its own


def test_a_replica_computing_longer_than_the_others_is_not_timed(fresh2, replica_timeouts):
    """Nobody waits at a barrier for replica 0: its longer computation is neither warned about nor timed out."""
    replica_timeouts(warning_seconds=0.05, timeout_seconds=0.2)
    never = threading.Event()

    def fn():
        if replica_id() == 0:
            never.wait(0.6)  # computes for longer than both bounds (chief-only work)
        return replica_id()

    with warnings.catch_warnings():
        warnings.simplefilter("error", td.errors.ReplicaStallWarning)
        assert fresh2.experimental_local_results(fresh2.run(fn)) == (0, 1)


def test_a_replica_waiting_at_a_barrier_is_still_timed(fresh2, replica_timeouts):
    replica_timeouts(warning_seconds=None, timeout_seconds=0.2)

    def fn():
        if replica_id() == 0:
            assert timed_out.wait(WAIT)  # replica 1 waits for it in merge_call until the timeout
        return td.distribute.get_replica_context().merge_call(lambda s: "merged")

    with logged("Raising because the replica timeout") as timed_out:
        with pytest.raises(td.errors.DeadlineExceededError, match="replica 0 of MirroredStrategy") as info:
            fresh2.run(fn)
    assert info.value.missing == [0]
    replica_timeouts(warning_seconds=TEST_REPLICA_WARNING_SECONDS, timeout_seconds=TEST_REPLICA_TIMEOUT_SECONDS)
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


class _OtherUnprintableError(_UnprintableError):
    pass


def test_an_exception_whose_str_raises_never_replaces_the_original(mirrored_strategy):
    both_failing = threading.Barrier(2, timeout=WAIT)

    def fn():
        both_failing.wait()
        raise (_UnprintableError if replica_id() == 0 else _OtherUnprintableError)()

    with pytest.raises(_UnprintableError) as info:
        mirrored_strategy.run(fn)
    other = "_OtherUnprintableError" if type(info.value) is _UnprintableError else "_UnprintableError"
    notes = "\n".join(info.value.__notes__)
    assert f"Other replicas also raised: replica {1 if other.startswith('_Other') else 0}: {other}(<{other}.__str__ raised>)" in notes
    assert mirrored_strategy.run(lambda: 5) == 5


# --- replica 0 runs on the caller's thread ----------------------------------------------------


def test_replica_0_sees_its_own_context_and_device_and_the_caller_gets_its_own_back(fresh2):
    seen: dict[int, tuple[object, ...]] = {}

    def fn():
        ctx = td.distribute.get_replica_context()
        seen[replica_id()] = (
            threading.get_ident(),
            ctx.replica_id_in_sync_group,
            device_lib.current().short_name,
            td.distribute.in_cross_replica_context(),
            td.distribute.get_strategy() is fresh2,
        )

    with td.device("CPU:5"):
        fresh2.run(fn)
        assert device_lib.current().short_name == "/cpu:5"  # the caller's own device scope, restored
    assert seen[0] == (threading.get_ident(), 0, "/cpu:0", False, True)
    assert seen[1][1:] == (1, "/cpu:1", False, True) and seen[1][0] != threading.get_ident()
    assert td.distribute.get_replica_context() is not None  # the default replica context again
    assert not td.distribute.has_strategy()
    with fresh2.scope():
        fresh2.run(fn)
        assert td.distribute.in_cross_replica_context() and td.distribute.get_strategy() is fresh2


def test_an_exception_in_replica_0_names_replica_0_and_the_strategy_stays_usable(fresh2):
    def fn():
        if replica_id() == 0:
            raise LookupError("replica 0's own error")
        return td.distribute.get_replica_context().merge_call(lambda s: "never merged")

    with pytest.raises(LookupError, match="replica 0's own error") as info:
        fresh2.run(fn)
    assert any("Raised in replica 0 (on /cpu:0)" in note for note in info.value.__notes__)
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)


def test_run_inside_run_from_replica_0_raises_the_context_error(fresh2):
    def fn():
        if replica_id() == 0:
            fresh2.run(lambda: None)

    with pytest.raises(td.errors.ContextError, match="Strategy.run\\(\\) must be called in cross-replica context"):
        fresh2.run(fn)
    assert fresh2.run(lambda: 3) == 3


def test_run_inside_a_merge_fn_that_replica_0_runs_on_the_callers_thread(fresh2):
    """Replica 1 parks first, so replica 0 settles the round on the caller's thread; its
    merge_fn runs a nested step, whose replica 0 is that same thread."""
    caller = threading.get_ident()
    parked = threading.Event()

    def merge_fn(strategy):
        assert threading.get_ident() == caller
        inner = strategy.run(lambda: (threading.get_ident(), replica_id()))
        return strategy.experimental_local_results(inner)

    def fn():
        if replica_id() == 1:
            parked.set()
        else:
            assert parked.wait(WAIT)
        return td.distribute.get_replica_context().merge_call(merge_fn)

    result = fresh2.run(fn)
    parts = fresh2.experimental_local_results(result)
    assert parts[0] == parts[1]  # the merge result, the same object for both replicas
    (ident_0, id_0), (ident_1, id_1) = parts[0]
    assert (ident_0, id_0, id_1) == (caller, 0, 1) and ident_1 != caller
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)


@pytest.fixture
def replica_1_parks(monkeypatch) -> threading.Event:
    """An event set when replica 1 parks at a barrier (it waits there for replica 0)."""
    parked = threading.Event()
    park = Step._park

    def park_and_signal(self, i):
        if i == 1:
            parked.set()
        return park(self, i)

    monkeypatch.setattr(Step, "_park", park_and_signal)
    return parked


def test_a_keyboard_interrupt_in_replica_0s_code_stops_the_step(fresh2, sigint, replica_1_parks):
    """Ctrl-C lands while replica 0 (on the caller's thread) is in user code and replica 1 is parked."""
    sigint(signal.default_int_handler)
    reached: list[str] = []

    def fn():
        if replica_id() == 1:
            return td.distribute.get_replica_context().merge_call(lambda s: "merged")
        assert replica_1_parks.wait(WAIT)
        interrupt_main()
        threading.Event().wait(WAIT)  # user code, busy when the interrupt lands (it ends this wait)
        reached.append("after the interrupt")
        return td.distribute.get_replica_context().merge_call(lambda s: "merged")

    with pytest.raises(KeyboardInterrupt):
        fresh2.run(fn)
    assert reached == []
    # Replica 1 was released from the barrier and its thread serves the next step.
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)
    assert fresh2.extended._scheduler.num_threads == 1


def test_the_timeline_shows_each_wake_up(fresh2, tmp_path, replica_1_parks, monkeypatch):
    """With spinning off, a replica parked at the barrier blocks: one ``blocked: barrier`` span per wake-up."""
    monkeypatch.setattr(waiting, "_override", 0.0)  # no spinning (restored afterwards)

    def fn():
        if replica_id() == 0:
            assert replica_1_parks.wait(WAIT)  # replica 1 waits for replica 0 at the barrier
        return td.distribute.get_replica_context().merge_call(lambda s: None)

    fresh2.run(fn)  # threads started before recording
    replica_1_parks.clear()
    td.profiler.experimental.start(str(tmp_path))
    try:
        fresh2.run(fn)
    finally:
        path = td.profiler.experimental.stop()
    with open(path, encoding="utf-8") as file:
        events = json.load(file)["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    blocked = [(tracks[e["tid"]], e["name"]) for e in events if e["ph"] == "X" and e["name"].startswith("blocked: ")]
    assert ("replica 1 (/cpu:1)", "blocked: barrier") in blocked
    assert all(not name.startswith("main") for name, what in blocked if what == "blocked: barrier")


# --- signals while the caller waits at the barrier ---------------------------------------------


@pytest.mark.parametrize("size", [4, 4 << 20], ids=["RESUME to the caller", "a parallel part for the caller"])
def test_a_sigint_while_the_caller_waits_never_loses_its_message(
    fresh2, sigint, caller_parks_first, monkeypatch, replica_timeouts, size
):
    """Ctrl-C lands on replica 1's thread while it settles the round: the caller, parked as
    replica 0, gets its RESUME (or a part of the 16 MiB reduction) and then the interrupt,
    instead of losing the message to it and waiting until the hard timeout gives up on the
    replica thread (which would then be a new one in the next run)."""
    monkeypatch.setattr(waiting, "_override", 0.0)  # the plain blocking wait
    replica_timeouts(warning_seconds=None, timeout_seconds=5.0)
    sigint(signal.default_int_handler)
    value = np.ones(size, np.float32)
    threads_before = fresh2.experimental_local_results(fresh2.run(threading.get_ident))
    caller_parks_first.clear()

    def fn():
        if replica_id() == 1:
            assert caller_parks_first.wait(WAIT)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # as a terminal's Ctrl-C may land
        return td.distribute.get_replica_context().all_reduce("sum", value)

    with pytest.raises(KeyboardInterrupt):
        fresh2.run(fn)
    assert fresh2.experimental_local_results(fresh2.run(threading.get_ident)) == threads_before  # not given up
    result = fresh2.run(lambda: td.distribute.get_replica_context().all_reduce("sum", value))
    for part in fresh2.experimental_local_results(result):
        np.testing.assert_array_equal(part, 2 * value)


def test_an_interrupt_before_the_step_is_handed_out_leaves_the_pool_idle(fresh2, monkeypatch):
    fresh2.run(lambda: None)
    threads = fresh2.extended._scheduler.num_threads

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Step, "__init__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fresh2.run(lambda: None)
    monkeypatch.undo()
    pools = fresh2.extended._scheduler._pools
    assert len(pools) == 1 and not pools[0].busy  # released, not leaked
    assert fresh2.experimental_local_results(fresh2.run(replica_id)) == (0, 1)
    assert fresh2.extended._scheduler.num_threads == threads


def test_the_callers_default_scope_does_not_leak_into_replica_0(fresh2):
    """Inside the default strategy's scope, replica 0 (the caller's thread) creates a variable
    like every other replica does."""
    with td.distribute.get_strategy().scope():
        v = fresh2.run(lambda: td.Variable(1.0))
    assert isinstance(v, td.distribute.DistributedValues)
    assert [float(c.numpy()) for c in v.values] == [1.0, 1.0]


def test_a_sequential_replica_running_after_the_others_returned_is_not_timed(replica_timeouts):
    """Nobody waits for the last replica of a TF 1.x sequential step: it is not a stall."""
    replica_timeouts(warning_seconds=0.05, timeout_seconds=0.2)
    strategy = td.compat.v1.distribute.MirroredStrategy(cpus(2))

    def fn():
        if td.compat.v1.get_tower_context().tower_id == 1:
            threading.Event().wait(0.6)  # computes longer than both bounds, after replica 0 returned
        return 1.0

    with warnings.catch_warnings():
        warnings.simplefilter("error", td.errors.ReplicaStallWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        assert strategy.call_for_each_tower(fn, run_concurrently=False) == 1.0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_a_forked_child_runs_replica_0_on_its_own_calling_thread(fresh2):
    fresh2.run(lambda: None)  # the parent's replica thread exists

    def in_child(strategy):
        idents = strategy.experimental_local_results(strategy.run(threading.get_ident))
        return idents[0] == threading.get_ident(), idents[1] != threading.get_ident(), strategy.extended._scheduler.num_threads

    status, payload = _run_in_forked_child(fresh2, in_child)
    assert status == "ok", payload
    assert payload == (True, True, 1)  # replica 0 on the child's caller, replica 1 on a fresh thread of its own
