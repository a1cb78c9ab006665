"""Variables created inside ``strategy.run``, as in TensorFlow 2.21.

Every replica executes ``td.Variable(...)``; one variable is made for all of them, from
replica 0's initial value, at the replica barrier, so the result does not depend on the
order in which replica threads get there. Replicas creating different variables at the
same point raise ``RuntimeError``.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import towerdist as td
from towerdist._src.variables.aggregating_variable import AggregatingVariable
from towerdist._src.variables.distributed_variable import MirroredVariable, SyncOnReadVariable
from towerdist._src.variables.variable import ResourceVariable

A = td.VariableAggregation
WAIT = 30.0  # seconds a gate may stay closed before the test fails (a bound, not a sleep)


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def assert_strategy_works(strategy):
    result = strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    assert [int(x) for x in strategy.experimental_local_results(result)] == list(range(strategy.num_replicas_in_sync))


@pytest.mark.replicas(1, 2, 4)
def test_run_makes_one_mirrored_variable_from_replica_0s_initial_value(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    created = mirrored_strategy.run(lambda: td.Variable(float(rid() + 5)))
    assert isinstance(created, MirroredVariable)
    assert [float(c.numpy()) for c in created.values] == [5.0] * n  # the other replicas' values are ignored
    assert created.distribute_strategy is mirrored_strategy
    assert mirrored_strategy.extended.variable_created_in_scope(created)


@pytest.mark.replicas(4)
def test_every_replica_gets_the_same_object(mirrored_strategy):
    seen = []
    lock = threading.Lock()

    def fn():
        v = td.Variable(1.0)
        with lock:
            seen.append(v)
        return v

    result = mirrored_strategy.run(fn)
    assert len(seen) == 4 and all(v is result for v in seen)


@pytest.mark.replicas(4)
def test_only_replica_0_calls_its_initial_value_function(mirrored_strategy):
    calls = []
    lock = threading.Lock()

    def fn():
        me = rid()

        def init():
            with lock:
                calls.append(me)
            return np.full(2, me + 1.0, np.float32)

        return td.Variable(init)

    v = mirrored_strategy.run(fn)
    assert calls == [0]
    for c in v.values:
        np.testing.assert_array_equal(c.numpy(), [1.0, 1.0])


def test_several_variables_in_order(mirrored_strategy):
    def fn():
        a = td.Variable(float(rid()), name="a")
        b = td.Variable(np.ones(3, np.int32) * rid(), name="b", aggregation=A.SUM)
        c = td.Variable(0.0, synchronization=td.VariableSynchronization.ON_READ, aggregation=A.SUM, name="c")
        return a, b, c

    a, b, c = mirrored_strategy.run(fn)
    assert [x.name for x in (a, b, c)] == ["a:0", "b:0", "c:0"]
    assert isinstance(c, SyncOnReadVariable)
    assert b.dtype == td.int32 and [list(x.numpy()) for x in b.values] == [[0, 0, 0]] * 2


@pytest.mark.replicas(1, 2, 4)
def test_a_variable_created_in_run_can_be_used_in_the_same_run(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync

    def fn():
        v = td.Variable(0.0, aggregation=A.SUM)
        v.assign_add(td.constant(1.0))
        counter = td.Variable(0.0, synchronization=td.VariableSynchronization.ON_READ, aggregation=A.SUM)
        counter.assign_add(td.constant(float(rid())))
        return v, counter

    v, counter = mirrored_strategy.run(fn)
    assert [float(c.numpy()) for c in v.values] == [float(n)] * n
    assert float(counter.read_value()) == sum(range(n))


def test_mismatching_names_raise(mirrored_strategy):
    with pytest.raises(RuntimeError, match="Tried to create variable 'x1' with mismatching name on device 1"):
        mirrored_strategy.run(lambda: td.Variable(1.0, name=f"x{rid()}"))
    assert_strategy_works(mirrored_strategy)


def test_names_match_after_canonicalisation_as_in_tensorflow(mirrored_strategy):
    # TensorFlow compares names with ``_<n>`` suffixes stripped: "w_1" and "w_2" are the same variable.
    v = mirrored_strategy.run(lambda: td.Variable(1.0, name=f"w_{rid() + 1}"))
    assert v.name == "w_1:0"


def test_mismatching_synchronization_or_shape_raise(mirrored_strategy):
    sync = [td.VariableSynchronization.ON_WRITE, td.VariableSynchronization.ON_READ]
    with pytest.raises(RuntimeError, match="mismatching synchronization"):
        mirrored_strategy.run(lambda: td.Variable(1.0, synchronization=sync[rid()]))
    with pytest.raises(RuntimeError, match=r"mismatching initial value shape \(\(2,\) vs \(3,\)\)"):
        mirrored_strategy.run(lambda: td.Variable(np.zeros(2 + rid(), np.float32)))
    assert_strategy_works(mirrored_strategy)


def test_one_replica_creating_while_another_merges_raises(mirrored_strategy):
    def fn():
        if rid() == 0:
            return td.Variable(1.0)
        return td.distribute.get_replica_context().merge_call(lambda strategy: 1)

    with pytest.raises(RuntimeError, match="different collective calls") as info:
        mirrored_strategy.run(fn)
    assert "replica 0 called td.Variable()" in str(info.value) and "replica 1 called merge_call()" in str(info.value)
    assert_strategy_works(mirrored_strategy)


def test_one_replica_creating_more_variables_raises(mirrored_strategy):
    def fn():
        v = td.Variable(1.0)
        if rid() == 1:
            td.Variable(2.0)
        return v

    with pytest.raises(td.errors.MergeCallCountError):
        mirrored_strategy.run(fn)
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(4)
@pytest.mark.timeout(120)
def test_creation_is_deterministic_under_random_arrival_orders(mirrored_strategy):
    """Replicas are made to reach td.Variable() in random orders (events, not sleeps)."""
    rng = np.random.default_rng(3)
    for _ in range(8):
        order = [int(i) for i in rng.permutation(4)]
        gates = [threading.Event() for _ in range(4)]
        calls = []
        lock = threading.Lock()

        def fn(order=order, gates=gates, calls=calls, lock=lock):
            me = rid()
            assert gates[me].wait(WAIT), f"replica {me} was never let through"
            if me != order[-1]:
                gates[order[order.index(me) + 1]].set()

            def init():
                with lock:
                    calls.append(me)
                return np.float32(10 * (me + 1))

            return td.Variable(init, aggregation=A.MEAN), td.Variable(float(me), name="second")

        gates[order[0]].set()
        first, second = mirrored_strategy.run(fn)
        assert calls == [0], f"arrival order {order}"
        assert [float(c.numpy()) for c in first.values] == [10.0] * 4
        assert [float(c.numpy()) for c in second.values] == [0.0] * 4


def test_colocation_is_taken_from_the_creating_replica(mirrored_strategy):
    with mirrored_strategy.scope():
        primary = td.Variable(1.0)

    def fn():
        with mirrored_strategy.extended.colocate_vars_with(primary):
            return td.Variable(0.0, name="slot")

    slot = mirrored_strategy.run(fn)
    assert slot._devices == primary._devices


@pytest.mark.replicas(1)
def test_single_replica_strategies(default, one_device_cpu, mirrored_strategy, central_storage_2cpu):
    assert type(default.run(lambda: td.Variable(1.0))) is ResourceVariable
    assert type(one_device_cpu.run(lambda: td.Variable(1.0))) is ResourceVariable
    v = mirrored_strategy.run(lambda: td.Variable(1.0))
    assert isinstance(v, MirroredVariable) and len(v.values) == 1
    shared = central_storage_2cpu.run(lambda: td.Variable(float(rid() + 5)))
    assert isinstance(shared, AggregatingVariable) and float(shared.numpy()) == 5.0


def test_created_in_merge_fn_is_made_once(mirrored_strategy):
    def fn():
        return td.distribute.get_replica_context().merge_call(lambda strategy: td.Variable(3.0))

    v = mirrored_strategy.run(fn)
    assert isinstance(v, MirroredVariable) and [float(c.numpy()) for c in v.values] == [3.0, 3.0]


def test_the_initial_value_is_computed_in_replica_0s_context(mirrored_strategy):
    with mirrored_strategy.scope():
        local = td.Variable(0.0, synchronization=td.VariableSynchronization.ON_READ, aggregation=A.SUM)
    mirrored_strategy.run(lambda: local.assign(td.constant(float(rid() + 2))))  # components [2, 3]
    from_read = mirrored_strategy.run(lambda: td.Variable(lambda: local.read_value()))
    from_variable = mirrored_strategy.run(lambda: td.Variable(local))
    from_id = mirrored_strategy.run(lambda: td.Variable(lambda: td.cast(rid() + 7, td.float32)))
    assert [float(c.numpy()) for c in from_read.values] == [2.0, 2.0]  # TF 2.21: replica 0's local value
    assert [float(c.numpy()) for c in from_variable.values] == [2.0, 2.0]
    assert [float(c.numpy()) for c in from_id.values] == [7.0, 7.0]
