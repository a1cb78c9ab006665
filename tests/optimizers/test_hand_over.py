"""Handing an optimizer step over (replica_step.py, "Handing over"; update_fence.py).

A replica reaching ``apply_gradients`` before the others copies its gradients, goes on with
its function and lets the last replica apply the update; its next variable access waits for
that update. These tests order the replicas with events (never sleeps): replica 0 arrives
first and signals from *after* its ``apply_gradients`` returned, which it could not do if it
had parked there, and replica 1 arrives only once it has that signal.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import towerdist as td
from towerdist._src import update_fence
from towerdist._src.strategies.replica_step import Step

from conftest import cpus

WAIT = 10.0  # seconds a replica waits for an event the test guarantees will come
RATE = 0.5
FIRST = 1  # the replica made to arrive first (a replica thread: replica 0 never hands over)


def replica_id() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


@pytest.fixture
def strategy() -> td.distribute.MirroredStrategy:
    return td.distribute.MirroredStrategy(cpus(2))


def model(strategy: td.distribute.MirroredStrategy) -> tuple[list[td.Variable], td.optimizers.SGD]:
    with strategy.scope():
        variables = [td.Variable(np.arange(6, dtype=np.float32).reshape(2, 3)), td.Variable(np.ones(4, np.float32))]
        return variables, td.optimizers.SGD(RATE)


def gradients(replica: int) -> list[np.ndarray]:
    return [np.full((2, 3), replica + 1.0, np.float32), np.arange(4, dtype=np.float32) * (replica + 1)]


def warm_up(strategy, variables, opt) -> list[np.ndarray]:
    """Two steps of every replica applying its gradients (the second takes the steady path); the values after."""
    for _ in range(2):
        strategy.run(lambda: opt.apply_gradients(zip(gradients(replica_id()), variables)))
    return [v.numpy() for v in variables]


def expected_after_one_more(before: list[np.ndarray]) -> list[np.ndarray]:
    total = [a + b for a, b in zip(gradients(0), gradients(1))]
    return [b - np.float32(RATE) * g for b, g in zip(before, total)]


def handing_over(variables, opt, after_first, after_second=lambda: None):
    """A step function: replica ``FIRST`` applies its gradients first and returns ``after_first()``
    (its fence makes what that reads wait for the update); the other replica applies once
    ``FIRST`` has gone on (so it could not have parked) and returns ``after_second()``."""
    handed = threading.Event()

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(0), variables))
            handed.set()  # apply_gradients returned before the other replica arrived: it was handed over
            return after_first()
        assert handed.wait(WAIT), "replica 1 parked in apply_gradients instead of handing its gradients over"
        opt.apply_gradients(zip(gradients(1), variables))
        return after_second()

    return step


def test_the_first_replica_goes_on_and_its_read_waits_for_the_update(strategy):
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)

    def read():
        return [v.read_value().copy() for v in variables]  # (replica FIRST: waits at the fence for the update)

    results = strategy.experimental_local_results(strategy.run(handing_over(variables, opt, read, read)))
    for seen in results:
        for got, want in zip(seen, expected_after_one_more(before)):
            np.testing.assert_allclose(got, want, rtol=1e-6)
    assert int(opt.iterations.numpy()) == 3
    assert update_fence.up == 0


def test_writing_into_the_gradients_after_handing_them_over_changes_nothing(strategy):
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    written = threading.Event()

    def step():
        grads = gradients(replica_id())
        if replica_id() == FIRST:
            opt.apply_gradients(zip(grads, variables))
            for g in grads:
                g[...] = 1e6  # the user's arrays are theirs again: the update uses the copy
            written.set()
            return None
        assert written.wait(WAIT), "replica 1 parked in apply_gradients instead of handing its gradients over"
        opt.apply_gradients(zip(grads, variables))
        return None

    strategy.run(step)
    for var, want in zip(variables, expected_after_one_more(before)):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-6)


def test_a_replica_that_returns_before_the_others_arrive_counts_as_returned(strategy, monkeypatch):
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    returned = threading.Event()
    arrive_done = Step._arrive_done

    def arrive_done_and_tell(self, i, result):  # replica 1's return has been counted (in the next round)
        arrive_done(self, i, result)
        if i == FIRST:
            returned.set()

    monkeypatch.setattr(Step, "_arrive_done", arrive_done_and_tell)

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(1), variables))
            return "one"
        assert returned.wait(WAIT), "replica 1 parked in apply_gradients instead of handing its gradients over"
        opt.apply_gradients(zip(gradients(0), variables))
        return "zero"

    assert strategy.experimental_local_results(strategy.run(step)) == ("zero", "one")
    for var, want in zip(variables, expected_after_one_more(before)):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-6)


def test_a_second_collective_after_a_hand_over_sees_the_updated_variables(strategy):
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    handed = threading.Event()

    def step():
        ctx = td.distribute.get_replica_context()
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(0), variables))
            handed.set()
        else:
            assert handed.wait(WAIT)
            opt.apply_gradients(zip(gradients(1), variables))
        return ctx.all_reduce("sum", variables[1].read_value())

    total = strategy.experimental_local_results(strategy.run(step))
    want = expected_after_one_more(before)[1] * 2
    for got in total:
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_one_gradient_object_for_every_replica_is_still_refused_when_handed_over(strategy):
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    shared = gradients(0)

    with pytest.raises(ValueError, match="same object in all 2 replicas"):
        strategy.run(lambda: opt.apply_gradients(zip(shared, variables)))
    for var, value in zip(variables, before):  # nothing was applied
        np.testing.assert_array_equal(var.numpy(), value)
    after = warm_up(strategy, variables, opt)  # the strategy and the optimizer still work
    assert not np.array_equal(after[0], before[0])


def test_a_failing_settle_stops_the_replica_waiting_at_its_fence(strategy):
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    handed = threading.Event()
    reached_read: list[bool] = []

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(0), variables))
            handed.set()
            reached_read.append(True)
            return variables[0].read_value()  # the settle fails: this read stops the replica
        assert handed.wait(WAIT)
        bad = [np.ones((3, 3), np.float32), gradients(1)[1]]  # the wrong shape for the first variable
        opt.apply_gradients(zip(bad, variables))
        return None

    with pytest.raises(ValueError, match="shape"):
        strategy.run(step)
    assert reached_read == [True]
    for var, value in zip(variables, before):
        np.testing.assert_array_equal(var.numpy(), value)
    assert update_fence.up == 0
    after = warm_up(strategy, variables, opt)
    assert not np.array_equal(after[0], before[0])


def test_a_replica_skipping_apply_gradients_after_a_hand_over_is_a_merge_count_error(strategy):
    variables, opt = model(strategy)
    warm_up(strategy, variables, opt)

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(0), variables))
        return None

    with pytest.raises(td.errors.MergeCallCountError):
        strategy.run(step)
    warm_up(strategy, variables, opt)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_many_steps_with_reads_after_the_update_match_one_thread(strategy, seed):
    """Replicas arrive in random order (uneven busy work); every step reads after applying."""
    variables, opt = model(strategy)
    reference = [v.numpy() for v in variables]
    rng = np.random.default_rng(seed)
    work = rng.integers(0, 3, size=(60, 2))
    scratch = np.ones((64, 64))

    def step(t):
        r = replica_id()
        for _ in range(int(work[t, r])):
            scratch @ scratch  # uneven work: either replica may arrive first
        opt.apply_gradients(zip([g * (t + 1) for g in gradients(r)], variables))
        return variables[0].read_value().copy()

    for t in range(60):
        seen = strategy.experimental_local_results(strategy.run(step, args=(t,)))
        total = [(a + b) * (t + 1) for a, b in zip(gradients(0), gradients(1))]
        reference = [v - np.float32(RATE) * g for v, g in zip(reference, total)]
        for got in seen:
            np.testing.assert_allclose(got, reference[0], rtol=1e-5)
    for var, want in zip(variables, reference):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-5)


def test_variables_the_update_does_not_write_are_not_fenced(strategy):
    """A metric updated after apply_gradients (as the main job does) goes on before the update."""
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    with strategy.scope():
        seen = td.metrics.Sum("seen")
    counted = threading.Event()

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(0), variables))
            seen.update_state(np.float32(1.0))  # not written by the update: no wait
            counted.set()
            return None
        assert counted.wait(WAIT), "the metric update waited for the optimizer's update"
        opt.apply_gradients(zip(gradients(1), variables))
        seen.update_state(np.float32(1.0))
        return None

    strategy.run(step)
    assert float(seen.result()) == 2.0
    for var, want in zip(variables, expected_after_one_more(before)):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-6)


def test_the_step_count_and_slots_are_fenced(strategy):
    with strategy.scope():
        variables = [td.Variable(np.ones(3, np.float32))]
        opt = td.optimizers.SGD(RATE, momentum=0.5)
    for _ in range(2):
        strategy.run(lambda: opt.apply_gradients(zip([np.ones(3, np.float32)], variables)))
    handed = threading.Event()

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip([np.ones(3, np.float32)], variables))
            handed.set()
            return int(opt.iterations.numpy()), opt.get_slot(variables[0], "momentum").read_value().copy()
        assert handed.wait(WAIT)
        opt.apply_gradients(zip([np.ones(3, np.float32)], variables))
        return 0, np.zeros(3, np.float32)

    count, momentum = strategy.experimental_local_results(strategy.run(step))[FIRST]
    assert count == 3
    np.testing.assert_allclose(momentum, opt.get_slot(variables[0], "momentum").numpy())


def test_replica_0_never_hands_over(strategy, monkeypatch):
    """The caller's replica parks: run() waits for the update before returning anyway."""
    variables, opt = model(strategy)
    warm_up(strategy, variables, opt)
    handed: list[int] = []
    hand_over = Step._hand_over

    def record(self, i, request):
        handed.append(i)
        hand_over(self, i, request)

    monkeypatch.setattr(Step, "_hand_over", record)
    first_arrived = threading.Event()

    def step():
        if replica_id() == 0:  # replica 0 arrives first: it parks, so replica 1 settles
            opt.apply_gradients(zip(gradients(0), variables))
            return None
        assert first_arrived.wait(WAIT)
        opt.apply_gradients(zip(gradients(1), variables))
        return None

    arrive = Step._arrive

    def arrive_and_tell(self, i):
        outcome = arrive(self, i)
        if i == 0:
            first_arrived.set()
        return outcome

    monkeypatch.setattr(Step, "_arrive", arrive_and_tell)
    strategy.run(step)
    assert handed == []


def test_an_interrupt_in_the_settling_caller_still_releases_the_replica_awaiting_the_update(
    strategy, monkeypatch, replica_timeouts
):
    """Replica 0 (the caller's thread) settles a round whose hand-over replica 1 awaits; an
    interrupt landing just after the settle was marked (before replica 1 is resumed) must still
    stop replica 1, not leave it parked until the threads are given up."""
    variables, opt = model(strategy)
    warm_up(strategy, variables, opt)
    replica_timeouts(None, 5.0)  # a lost replica 1 is given up after 5 s (the bug), not at once
    awaiting = threading.Event()
    park = Step._park

    def park_and_tell(self, i):
        if i == FIRST:
            awaiting.set()  # replica 1 waits for the update it handed over
        return park(self, i)

    settled = Step._settled_hand_overs

    def settled_then_interrupted(self):
        found = settled(self)
        if self.on_caller_thread() and found:
            raise KeyboardInterrupt  # as a SIGINT landing between the bookkeeping and the wake-ups
        return found

    monkeypatch.setattr(Step, "_park", park_and_tell)
    monkeypatch.setattr(Step, "_settled_hand_overs", settled_then_interrupted)
    steps: list[Step] = []
    execute = Step.execute

    def record(self, i):
        if i == 0:
            steps.append(self)
        execute(self, i)

    monkeypatch.setattr(Step, "execute", record)

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(1), variables))
            return variables[0].read_value()  # the fence: parks until the update is settled
        assert awaiting.wait(WAIT)
        opt.apply_gradients(zip(gradients(0), variables))
        return None

    with pytest.raises(KeyboardInterrupt):
        strategy.run(step)
    assert not steps[-1].abandoned, "replica 1 was never woken: the caller gave up on it"
    monkeypatch.undo()
    warm_up(strategy, variables, opt)


def test_printing_a_variable_after_a_hand_over_shows_the_update(strategy):
    """repr()/str() read the value too: in the replica that handed over they wait for the update
    (as TensorFlow prints the updated variable), never show the value from before it."""
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    step = handing_over(
        variables, opt, lambda: (repr(variables[1].values[FIRST]), str(variables[1])), lambda: ("", "")
    )
    printed, shown = strategy.experimental_local_results(strategy.run(step))[FIRST]
    want = repr(expected_after_one_more(before)[1])
    assert want in printed
    assert want in shown


def test_copying_a_variable_after_a_hand_over_copies_the_updated_value(strategy):
    """copy.deepcopy reads the value: in the replica that handed over it waits for the update."""
    import copy

    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)

    def copies():
        return copy.deepcopy(variables[1].values[FIRST]).numpy(), copy.deepcopy(variables[0]).values[0].numpy()

    step = handing_over(variables, opt, copies, lambda: (np.zeros(4, np.float32), np.zeros((2, 3), np.float32)))
    component, distributed = strategy.experimental_local_results(strategy.run(step))[FIRST]
    want = expected_after_one_more(before)
    np.testing.assert_allclose(component, want[1], rtol=1e-6)
    np.testing.assert_allclose(distributed, want[0], rtol=1e-6)


def test_three_replicas_two_hand_over_one_returns_early_one_reads(monkeypatch):
    """Replicas 1 and 2 both hand over in one round; replica 1 returns before the round completes
    (counted in the next one) while replica 2 waits at its fence; replica 0 settles."""
    strategy = td.distribute.MirroredStrategy(cpus(3))
    with strategy.scope():
        var = td.Variable(np.ones(4, np.float32))
        opt = td.optimizers.SGD(RATE)

    def grad(r: int) -> np.ndarray:
        return np.full(4, r + 1.0, np.float32)

    for _ in range(2):
        strategy.run(lambda: opt.apply_gradients([(grad(replica_id()), var)]))
    before = var.numpy()
    want = before - np.float32(RATE) * (grad(0) + grad(1) + grad(2))
    first, second = threading.Event(), threading.Event()
    handed: list[int] = []
    hand_over = Step._hand_over

    def step():
        r = replica_id()
        if r == 1:
            opt.apply_gradients([(grad(1), var)])
            first.set()
            return None
        if r == 2:
            assert first.wait(WAIT)
            opt.apply_gradients([(grad(2), var)])
            second.set()
            return var.read_value().copy()  # waits for replica 0's settle
        assert second.wait(WAIT)
        opt.apply_gradients([(grad(0), var)])
        return var.read_value().copy()

    def record(self, i, request):
        handed.append(i)
        hand_over(self, i, request)

    monkeypatch.setattr(Step, "_hand_over", record)
    results = strategy.experimental_local_results(strategy.run(step))
    assert sorted(handed) == [1, 2]
    assert results[1] is None
    np.testing.assert_allclose(results[0], want, rtol=1e-6)
    np.testing.assert_allclose(results[2], want, rtol=1e-6)
    np.testing.assert_allclose(var.numpy(), want, rtol=1e-6)
    assert update_fence.up == 0


def test_a_learning_rate_set_after_a_hand_over_is_for_the_next_step(strategy, monkeypatch):
    """The update handed over uses the rate of its own apply_gradients call, as when the replica
    waited there: setting ``learning_rate`` afterwards waits for that update."""
    variables, opt = model(strategy)
    before = warm_up(strategy, variables, opt)
    go = threading.Event()  # replica 1 is waiting for the update, or has set the rate without waiting
    await_settled = Step.await_settled

    def tell_then_await(self, i):
        go.set()
        await_settled(self, i)

    monkeypatch.setattr(Step, "await_settled", tell_then_await)

    def step():
        if replica_id() == FIRST:
            opt.apply_gradients(zip(gradients(0), variables))
            opt.learning_rate = 0.0  # for the steps after this one
            go.set()
            return None
        assert go.wait(WAIT)
        opt.apply_gradients(zip(gradients(1), variables))
        return None

    strategy.run(step)
    for var, want in zip(variables, expected_after_one_more(before)):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-6)
    assert opt.learning_rate == 0.0


def test_a_replica_that_handed_over_and_left_still_warns_of_a_stall(strategy, replica_timeouts):
    """Replica 0 (your thread) does not come: replica 1, gone idle after handing over, still warns.

    The warning is read from the ``towerdist`` logger (which it reaches first, on replica 1's
    thread); the ``ReplicaStallWarning`` raised beside it is silenced here.
    """
    import logging
    import warnings

    variables, opt = model(strategy)
    warm_up(strategy, variables, opt)
    replica_timeouts(warning_seconds=0.05, timeout_seconds=None)
    warned = threading.Event()
    messages: list[str] = []

    class _Stalls(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "did not reach the barrier" in record.getMessage():
                messages.append(record.getMessage())
                warned.set()

    def step():
        if replica_id() == 0:
            assert warned.wait(WAIT), "nobody warned that replica 0 had not reached apply_gradients"
        opt.apply_gradients(zip(gradients(replica_id()), variables))
        return None

    handler = _Stalls(logging.WARNING)
    logging.getLogger("towerdist").addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", td.errors.ReplicaStallWarning)
            strategy.run(step)
            # Replica 1's thread warns just after it logs; it takes this step only once that is done,
            # so no warning of this test is raised after the filter is gone.
            strategy.run(lambda: None)
    finally:
        logging.getLogger("towerdist").removeHandler(handler)
    message = messages[0]
    assert message.startswith("replica 0 of MirroredStrategy"), message
    assert "replica 1 handed" in message and "over and went on" in message, message
