"""Distributed variables: creation in a scope, reads and writes in every context.

Pins, as observed in TensorFlow 2.21: creation in a scope (component names and repr), reads
of the local component, MirroredVariable writes in replica context (aggregated by the
variable's ``aggregation``; with aggregation NONE each replica writes its own component),
writes in cross-replica context (every component), sync-on-read variables (replica writes
stay local, cross-replica reads aggregate), ``run`` returning variables, and copying, plus
the scope examples of the TensorFlow docs. The tables TensorFlow gives on 2 replicas are
checked literally; the same rules are checked on 1, 2 and 4 replicas through their formulas.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td
from towerdist._src.variables.distributed_variable import MirroredVariable, SyncOnReadVariable
from towerdist._src.variables.variable import ResourceVariable
from towerdist.testing.pytest_plugin import mirrored_strategy_for

A = td.VariableAggregation
S = td.VariableSynchronization
ON_READ = S.ON_READ
ContextError = td.errors.ContextError


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def components(v) -> list[float]:
    return [float(c.numpy()) for c in v.values]


def assert_strategy_works(strategy):
    result = strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    assert [int(x) for x in strategy.experimental_local_results(result)] == list(range(strategy.num_replicas_in_sync))


def make(strategy, initial=1.0, **kwargs):
    with strategy.scope():
        return td.Variable(initial, **kwargs)


# --- creation --------------------------------------------------------------------------------


def test_scope_docs_example_mirrored_variable_repr(mirrored_strategy):
    with mirrored_strategy.scope():
        mirrored_variable = td.Variable(1.0)
    assert repr(mirrored_variable) == (
        "MirroredVariable:{\n"
        "  0: <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>,\n"
        "  1: <tf.Variable 'Variable/replica_1:0' shape=() dtype=float32, numpy=1.0>\n"
        "}"
    )
    assert repr(td.Variable(1.0)) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"


def test_sync_on_read_repr_has_the_same_layout(mirrored_strategy):
    v = make(mirrored_strategy, 1.0, synchronization=ON_READ, aggregation=A.SUM)
    assert repr(v).startswith("SyncOnReadVariable:{\n  0: <tf.Variable 'Variable:0' shape=()")


@pytest.mark.replicas(1, 2, 4)
def test_creation_makes_one_component_per_device(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    v = make(mirrored_strategy, [1.0, 2.0], name="w")
    assert isinstance(v, MirroredVariable) and isinstance(v, td.Variable)
    assert isinstance(v, td.distribute.DistributedValues)
    assert len(v.values) == n
    assert [c.name for c in v.values] == ["w:0"] + [f"w/replica_{i}:0" for i in range(1, n)]
    assert tuple(c.device for c in v.values) == mirrored_strategy.extended.worker_devices
    assert v.name == "w:0" and v.dtype == td.float32 and v.shape == (2,)
    for c in v.values:
        assert isinstance(c, ResourceVariable)
        np.testing.assert_array_equal(c.numpy(), [1.0, 2.0])
    reads = [c.value() for c in v.values]
    assert len({id(r) for r in reads}) == n  # distinct objects for each replica


def test_synchronization_picks_the_class(mirrored_strategy):
    assert isinstance(make(mirrored_strategy, synchronization=S.AUTO), MirroredVariable)
    assert isinstance(make(mirrored_strategy, synchronization=S.ON_WRITE), MirroredVariable)
    assert make(mirrored_strategy, synchronization=S.AUTO).synchronization is S.ON_WRITE
    sync_on_read = make(mirrored_strategy, synchronization=ON_READ, aggregation=A.SUM)
    assert isinstance(sync_on_read, SyncOnReadVariable)
    assert sync_on_read.synchronization is ON_READ and sync_on_read.aggregation is A.SUM


def test_trainable_defaults(mirrored_strategy):
    assert make(mirrored_strategy).trainable is True
    assert make(mirrored_strategy, trainable=False).trainable is False
    assert make(mirrored_strategy, synchronization=ON_READ).trainable is False
    assert make(mirrored_strategy, synchronization=ON_READ, trainable=True).trainable is True  # TF 2.21


@pytest.mark.replicas(4)
def test_initial_value_callable_is_called_once(mirrored_strategy):
    calls = []

    def init():
        calls.append(td.distribute.in_cross_replica_context())
        return np.arange(3, dtype=np.float32)

    v = make(mirrored_strategy, init)
    assert calls == [True]
    for c in v.values:
        np.testing.assert_array_equal(c.numpy(), [0.0, 1.0, 2.0])


def test_sync_none_raises(mirrored_strategy):
    with pytest.raises(ValueError, match="`NONE` variable synchronization mode is not supported") as info:
        make(mirrored_strategy, synchronization=S.NONE, name="bad")
    assert "bad" in str(info.value)
    assert_strategy_works(mirrored_strategy)


@pytest.mark.parametrize("aggregation", [7, "sum"])
def test_invalid_aggregation_raises(mirrored_strategy, aggregation):
    with pytest.raises(ValueError, match="Invalid variable aggregation mode"):
        make(mirrored_strategy, aggregation=aggregation)


def test_aggregation_none_is_the_default_aggregation_in_a_scope(mirrored_strategy):
    v = make(mirrored_strategy, 1.0, aggregation=None, synchronization=None)
    assert isinstance(v, MirroredVariable)
    assert v.aggregation is A.NONE and v.synchronization is S.ON_WRITE


def test_aggregation_none_is_the_default_aggregation_in_run(mirrored_strategy):
    created = mirrored_strategy.run(lambda: td.Variable(1.0, aggregation=None))
    assert isinstance(created, MirroredVariable) and created.aggregation is A.NONE


def test_variable_creation_in_a_scope_entered_inside_the_default_scope_raises(default, mirrored_strategy):
    with default.scope(), mirrored_strategy.scope():
        with pytest.raises(ContextError, match="Mixing different strategies: td.Variable()") as info:
            td.Variable(1.0)
    assert "default strategy's scope()" in str(info.value)
    assert isinstance(info.value, RuntimeError)  # TensorFlow raises RuntimeError here
    assert isinstance(make(mirrored_strategy, 1.0), MirroredVariable)  # the scopes left nothing behind
    assert_strategy_works(mirrored_strategy)


def test_mean_with_an_integer_dtype_raises_but_sum_is_fine(mirrored_strategy):
    with pytest.raises(ValueError, match="creating distributed tf.Variable with aggregation=MEAN and a non-floating"):
        make(mirrored_strategy, 1, aggregation=A.MEAN)
    assert components(make(mirrored_strategy, 1, aggregation=A.SUM)) == [1, 1]
    assert_strategy_works(mirrored_strategy)


def test_single_device_strategies_make_plain_variables(default, one_device_cpu):
    for strategy in (default, one_device_cpu):
        with strategy.scope():
            v = td.Variable(1.0, synchronization=ON_READ, aggregation=A.SUM)
        assert type(v) is ResourceVariable
        assert v.device == "/job:localhost/replica:0/task:0/device:CPU:0"
    with one_device_cpu.scope():
        assert td.Variable(1.0).distribute_strategy is one_device_cpu


def test_variable_created_by_a_tf_function_called_in_scope_is_mirrored(mirrored_strategy):
    x = []

    @td.function
    def create_variable():
        if not x:
            x.append(td.Variable(1.0))
        return x[0]

    with mirrored_strategy.scope():
        create_variable()
        assert isinstance(x[0], MirroredVariable)
    assert components(x[0]) == [1.0, 1.0]


# --- reads -----------------------------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_replica_reads_its_own_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    v = make(mirrored_strategy, 0.0)
    v.assign(mirrored_strategy.experimental_distribute_values_from_function(
        lambda ctx: np.float32(ctx.replica_id_in_sync_group)))
    result = mirrored_strategy.run(lambda: (v.read_value(), v.value(), v.numpy(), v + 0.0, v.device))
    parts = mirrored_strategy.experimental_local_results(result) if n > 1 else (result,)
    for i, (read, value, host, total, device) in enumerate(parts):
        assert float(read) == float(value) == float(host) == float(total) == i
        assert device == mirrored_strategy.extended.worker_devices[i]


def test_cross_replica_read_is_the_component_on_the_current_device(mirrored_strategy):
    v = make(mirrored_strategy, 0.0)
    v.assign(mirrored_strategy.experimental_distribute_values_from_function(
        lambda ctx: np.float32(ctx.replica_id_in_sync_group)))
    assert components(v) == [0.0, 1.0]  # a PerReplica value desynchronises (as in TensorFlow)
    assert float(v.read_value()) == 0.0
    with td.device("/cpu:1"):
        assert float(v.read_value()) == 1.0
        assert v.device.endswith("CPU:1")
    with mirrored_strategy.scope():
        assert float(v) == 0.0


def test_variable_of_another_strategy_raises(mirrored_strategy):
    four_replicas = mirrored_strategy_for(4)
    v = make(mirrored_strategy, 1.0, aggregation=A.SUM)
    with four_replicas.scope():
        with pytest.raises(ContextError, match="Mixing different strategies"):
            v.read_value()
        with pytest.raises(ContextError, match="Mixing different strategies"):
            v.assign(2.0)
        with pytest.raises(td.errors.ValidationError, match="was created in the scope of"):
            four_replicas.extended.update(v, lambda c: c.assign(3.0))
    with pytest.raises(ContextError, match="Mixing different strategies"):
        four_replicas.run(lambda: v.assign_add(1.0))
    assert components(v) == [1.0, 1.0]
    assert_strategy_works(mirrored_strategy)
    assert_strategy_works(four_replicas)


# --- MirroredVariable writes in replica context ---------------------------------------------

# TensorFlow 2.21, 2 replicas, initial 1.0, replica r writes 10 * (r + 1):
REPLICA_WRITES_ON_2_REPLICAS = {
    (A.SUM, "assign"): [30, 30],
    (A.SUM, "assign_add"): [31, 31],
    (A.MEAN, "assign"): [15, 15],
    (A.MEAN, "assign_add"): [16, 16],
    (A.ONLY_FIRST_REPLICA, "assign"): [10, 10],
    (A.ONLY_FIRST_REPLICA, "assign_add"): [11, 11],
}


@pytest.mark.parametrize(("aggregation", "method"), list(REPLICA_WRITES_ON_2_REPLICAS))
def test_replica_writes_on_2_replicas_give_tensorflows_values(mirrored_strategy, aggregation, method):
    v = make(mirrored_strategy, 1.0, aggregation=aggregation)
    mirrored_strategy.run(lambda: getattr(v, method)(td.constant(10.0 * (rid() + 1))))
    assert components(v) == REPLICA_WRITES_ON_2_REPLICAS[(aggregation, method)]


SHARED = np.array(4.0, dtype=np.float32)  # like ``shared = tf.constant(4.)`` made once outside run


@pytest.mark.parametrize("value", [5.0, SHARED], ids=["python_float", "shared_array"])
@pytest.mark.parametrize("aggregation", [A.MEAN, A.ONLY_FIRST_REPLICA])
def test_replica_writes_of_the_same_object_from_every_replica_write_it(mirrored_strategy, aggregation, value):
    v = make(mirrored_strategy, 1.0, aggregation=aggregation)
    mirrored_strategy.run(lambda: v.assign(value))
    assert components(v) == [float(value)] * 2


@pytest.mark.parametrize("value", [5.0, SHARED], ids=["python_float", "shared_array"])
def test_replica_writes_of_the_same_object_with_sum_aggregation_raise(mirrored_strategy, value):
    v = make(mirrored_strategy, 1.0, aggregation=A.SUM)
    with pytest.raises(ValueError, match="A non-DistributedValues value .* cannot be reduced with the given reduce op"):
        mirrored_strategy.run(lambda: v.assign(value))
    assert components(v) == [1.0, 1.0]
    assert_strategy_works(mirrored_strategy)


# Aggregation NONE: each replica writes its own component (as TensorFlow 2.21 does).


@pytest.mark.parametrize(
    "method, expected", [("assign", [10.0, 20.0]), ("assign_add", [11.0, 21.0]), ("assign_sub", [-9.0, -19.0])]
)
def test_aggregation_none_replica_write_changes_only_the_replicas_component(mirrored_strategy, method, expected):
    v = make(mirrored_strategy, 1.0)
    result = mirrored_strategy.run(lambda: getattr(v, method)(td.constant(10.0 * (rid() + 1))))
    assert components(v) == expected
    assert [float(r) for r in mirrored_strategy.experimental_local_results(result)] == expected


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("value", [5.0, SHARED], ids=["python_float", "shared_array"])
def test_aggregation_none_same_value_from_every_replica_keeps_the_copies_equal(mirrored_strategy, value):
    v = make(mirrored_strategy, 1.0)
    mirrored_strategy.run(lambda: v.assign(value, read_value=False))
    assert components(v) == [float(np.asarray(value))] * mirrored_strategy.num_replicas_in_sync


@pytest.mark.replicas(1, 2, 4)
def test_aggregation_none_training_step_all_reduce_then_assign_sub(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    w = make(mirrored_strategy, np.array([1.0, -2.0, 3.0], np.float32))

    def step():
        grad = np.full(3, rid() + 1.0, np.float32)  # each replica's own gradient
        total = td.distribute.get_replica_context().all_reduce("sum", grad)
        w.assign_sub(0.1 * total)

    for _ in range(3):
        mirrored_strategy.run(step)
    expected = np.array([1.0, -2.0, 3.0], np.float32) - 3 * np.float32(0.1) * np.float32(n * (n + 1) / 2)
    for component in w.values:
        np.testing.assert_allclose(component.numpy(), expected, rtol=1e-6)


def test_aggregation_none_replica_write_unshares_only_its_component(mirrored_strategy):
    v = make(mirrored_strategy, np.zeros(4, np.float32))
    first, second = (c._array for c in v.values)
    assert np.shares_memory(first, second)  # logical CPUs: one buffer for both copies
    mirrored_strategy.run(lambda: v.assign_add(np.ones(4, np.float32)) if rid() == 1 else None)
    assert v.values[0]._array is first  # replica 0's copy is untouched
    np.testing.assert_array_equal(first, np.zeros(4))
    np.testing.assert_array_equal(v.values[1].numpy(), np.ones(4))
    assert not np.shares_memory(v.values[0]._array, v.values[1]._array)


def test_aggregation_none_cross_replica_read_after_replica_writes_is_the_first_component(mirrored_strategy):
    v = make(mirrored_strategy, 1.0)
    mirrored_strategy.run(lambda: v.assign(td.constant(10.0 * (rid() + 1))))
    assert float(v.read_value()) == 10.0
    with mirrored_strategy.scope():
        assert float(v.numpy()) == 10.0
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("method", ["assign", "assign_add", "assign_sub"])
@pytest.mark.parametrize("aggregation", [A.SUM, A.MEAN, A.ONLY_FIRST_REPLICA])
def test_replica_writes_follow_the_aggregation_on_1_2_4_replicas(mirrored_strategy, aggregation, method):
    n = mirrored_strategy.num_replicas_in_sync
    v = make(mirrored_strategy, 1.0, aggregation=aggregation)
    mirrored_strategy.run(lambda: getattr(v, method)(td.constant(10.0 * (rid() + 1))))
    written = {
        A.SUM: sum(10.0 * (r + 1) for r in range(n)),
        A.MEAN: sum(10.0 * (r + 1) for r in range(n)) / n,
        A.ONLY_FIRST_REPLICA: 10.0,
    }[aggregation]
    expected = {"assign": written, "assign_add": 1.0 + written, "assign_sub": 1.0 - written}[method]
    assert components(v) == pytest.approx([expected] * n)


@pytest.mark.replicas(1, 2, 4)
def test_replica_write_returns_each_replica_its_new_value(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    v = make(mirrored_strategy, 1.0, aggregation=A.SUM)
    result = mirrored_strategy.run(lambda: v.assign_add(td.constant(1.0)))
    parts = mirrored_strategy.experimental_local_results(result)
    assert [float(p) for p in parts] == [1.0 + n] * n
    if n > 1:
        assert isinstance(result, td.distribute.PerReplica)  # as TensorFlow: one new value per replica
    assert mirrored_strategy.run(lambda: v.assign(td.constant(2.0), read_value=False)) is None


def test_replicas_writing_with_different_methods_raise(mirrored_strategy):
    v = make(mirrored_strategy, 1.0, aggregation=A.SUM)

    def fn():
        return v.assign(td.constant(1.0)) if rid() == 0 else v.assign_add(td.constant(1.0))

    with pytest.raises(RuntimeError, match="different collective calls") as info:
        mirrored_strategy.run(fn)
    assert "MirroredVariable.assign()" in str(info.value) and "MirroredVariable.assign_add()" in str(info.value)
    assert components(v) == [1.0, 1.0]
    assert_strategy_works(mirrored_strategy)


def test_replicas_writing_different_variables_raise(mirrored_strategy):
    a = make(mirrored_strategy, 1.0, aggregation=A.SUM, name="a")
    b = make(mirrored_strategy, 1.0, aggregation=A.SUM, name="b")
    with pytest.raises(ValueError, match="different variables or methods"):
        mirrored_strategy.run(lambda: (a if rid() == 0 else b).assign(td.constant(1.0)))
    assert components(a) == components(b) == [1.0, 1.0]
    assert_strategy_works(mirrored_strategy)


def test_a_distributed_value_cannot_update_in_replica_context(mirrored_strategy):
    v = make(mirrored_strategy, 1.0, aggregation=A.SUM)
    per_replica = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: np.float32(1.0))
    with pytest.raises(TypeError, match="Cannot use DistributedValues to update variables in replica context"):
        mirrored_strategy.run(lambda: v.assign(per_replica))
    assert_strategy_works(mirrored_strategy)


def test_replica_write_with_mismatched_shapes_raises_and_changes_nothing(mirrored_strategy):
    v = make(mirrored_strategy, [1.0, 2.0], aggregation=A.SUM)
    with pytest.raises(td.errors.InvalidArgumentError, match="replica 0 has shape"):
        mirrored_strategy.run(lambda: v.assign(td.ones([2 + rid()])))
    with pytest.raises(ValueError, match="Cannot assign a value of shape"):
        mirrored_strategy.run(lambda: v.assign(td.ones([3])))
    assert [list(c.numpy()) for c in v.values] == [[1.0, 2.0]] * 2
    assert_strategy_works(mirrored_strategy)


# --- MirroredVariable writes in cross-replica context ----------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_cross_replica_write_goes_to_every_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    v = make(mirrored_strategy, 1.0)  # aggregation NONE is fine in cross-replica context
    result = v.assign(5.0)
    if n > 1:
        assert isinstance(result, td.distribute.Mirrored)
    assert [float(x) for x in mirrored_strategy.experimental_local_results(result)] == [5.0] * n
    assert components(v) == [5.0] * n
    assert v.assign_add(1.0, read_value=False) is None
    with mirrored_strategy.scope():
        v.assign_sub(2.0)
    assert components(v) == [4.0] * n


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("method", ["assign", "assign_add", "assign_sub"])
def test_cross_replica_write_of_an_array(mirrored_strategy, method):
    v = make(mirrored_strategy, np.zeros(3, np.float32), aggregation=A.SUM)
    getattr(v, method)(np.array([1.0, 2.0, 3.0], np.float32))
    sign = -1.0 if method == "assign_sub" else 1.0
    for c in v.values:
        np.testing.assert_array_equal(c.numpy(), sign * np.array([1.0, 2.0, 3.0]))


@pytest.mark.replicas(4)
def test_cross_replica_write_with_a_bad_value_changes_no_component(mirrored_strategy):
    v = make(mirrored_strategy, [1.0, 2.0])
    bad = mirrored_strategy.experimental_distribute_values_from_function(
        lambda ctx: np.ones(2 if ctx.replica_id_in_sync_group < 3 else 3, np.float32))
    with pytest.raises(ValueError, match="Cannot assign a value of shape"):
        v.assign(bad)  # components 0..2 would be fine, component 3 is not: nothing is written
    with pytest.raises(ValueError, match="PerReplica with 2 components"):
        v.assign(mirrored_strategy_for(2).experimental_distribute_values_from_function(lambda ctx: np.ones(2, np.float32)))
    assert [list(c.numpy()) for c in v.values] == [[1.0, 2.0]] * 4


def test_reduce_of_a_mirrored_variable(mirrored_strategy):
    v = make(mirrored_strategy, 3.0)
    assert float(mirrored_strategy.reduce("MEAN", v, axis=None)) == 3.0
    with pytest.raises(td.errors.ValidationError, match="cannot SUM a MirroredVariable"):
        mirrored_strategy.reduce("SUM", v, axis=None)


# --- sync-on-read ----------------------------------------------------------------------------


def sync_on_read(strategy, aggregation, initial=1.0):
    """A sync-on-read variable after replica r did ``assign_add(r + 1)``."""
    v = make(strategy, initial, synchronization=ON_READ, aggregation=aggregation)
    strategy.run(lambda: v.assign_add(td.constant(float(rid() + 1))))
    return v


def test_sync_on_read_reads_on_2_replicas_give_tensorflows_values(mirrored_strategy):
    for aggregation in A:
        v = sync_on_read(mirrored_strategy, aggregation)
        assert components(v) == [2.0, 3.0]
        replica_reads = mirrored_strategy.run(lambda v=v: v.read_value())
        assert [float(x) for x in mirrored_strategy.experimental_local_results(replica_reads)] == [2.0, 3.0]
    cross_replica_reads = {A.SUM: 5.0, A.MEAN: 2.5, A.ONLY_FIRST_REPLICA: 2.0}
    for aggregation, expected in cross_replica_reads.items():
        v = sync_on_read(mirrored_strategy, aggregation)
        assert float(v.read_value()) == expected
        with mirrored_strategy.scope():
            assert float(v.value()) == expected and float(v.numpy()) == expected and float(v + 0.0) == expected


def test_sync_on_read_none_aggregation_cannot_be_read_across_replicas(mirrored_strategy):
    v = sync_on_read(mirrored_strategy, A.NONE)
    with pytest.raises(ValueError, match="Could not convert from `tf.VariableAggregation` VariableAggregationV2.NONE"):
        v.read_value()
    assert float(mirrored_strategy.reduce("SUM", v, axis=None)) == 5.0  # reduce treats it as PerReplica
    with pytest.raises(ValueError, match="Could not convert from"):
        v.assign(10.0)  # written, then the read-back raises (as in TensorFlow 2.21)
    assert components(v) == [10.0, 10.0]
    assert v.assign(7.0, read_value=False) is None
    assert components(v) == [7.0, 7.0]


@pytest.mark.parametrize(
    ("aggregation", "after_assign", "after_add", "after_sub"),
    [(A.MEAN, [10, 10], [11, 11], [10, 10]), (A.ONLY_FIRST_REPLICA, [10, 10], [11, 11], [10, 10])],
)
def test_sync_on_read_cross_replica_writes_set_every_component(mirrored_strategy, aggregation, after_assign, after_add, after_sub):
    v = sync_on_read(mirrored_strategy, aggregation)
    v.assign(10.0)
    assert components(v) == after_assign
    v.assign_add(1.0)
    assert components(v) == after_add
    v.assign_sub(1.0)
    assert components(v) == after_sub


@pytest.mark.parametrize("method", ["assign_add", "assign_sub"])
def test_sync_on_read_sum_cross_replica_assign_add_and_assign_sub_raise(mirrored_strategy, method):
    v = sync_on_read(mirrored_strategy, A.SUM)
    v.assign(10.0)
    assert components(v) == [5.0, 5.0]
    with pytest.raises(ValueError, match=f"SyncOnReadVariable does not support `{method}` in cross-replica context"):
        getattr(v, method)(1.0)
    assert components(v) == [5.0, 5.0]
    assert_strategy_works(mirrored_strategy)


def test_sync_on_read_assign_outside_the_scope_divides_only_a_sum(mirrored_strategy):
    assert components(_assigned_outside(mirrored_strategy, A.SUM)) == [3.5, 3.5]
    assert components(_assigned_outside(mirrored_strategy, A.MEAN)) == [7.0, 7.0]
    assert components(_assigned_outside(mirrored_strategy, A.ONLY_FIRST_REPLICA)) == [7.0, 7.0]


def _assigned_outside(strategy, aggregation):
    v = make(strategy, 1.0, synchronization=ON_READ, aggregation=aggregation)
    v.assign(7.0)
    return v


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("aggregation", [A.SUM, A.MEAN, A.ONLY_FIRST_REPLICA])
def test_sync_on_read_rules_on_1_2_4_replicas(mirrored_strategy, aggregation):
    n = mirrored_strategy.num_replicas_in_sync
    v = sync_on_read(mirrored_strategy, aggregation, initial=0.0)
    assert components(v) == [float(r + 1) for r in range(n)]  # replica writes stay local
    total = n * (n + 1) / 2
    expected = {A.SUM: total, A.MEAN: total / n, A.ONLY_FIRST_REPLICA: 1.0}[aggregation]
    assert float(v.read_value()) == pytest.approx(expected)
    v.assign(12.0)
    assert float(v.read_value()) == pytest.approx(12.0)  # assign(x) reads back as x for every aggregation
    assert components(v) == pytest.approx([12.0 / n if aggregation is A.SUM else 12.0] * n)


def test_sync_on_read_sum_assign_of_an_integer_keeps_the_exact_sum(mirrored_strategy):
    # Deliberate difference: TensorFlow stores cast(5 / 2, int32) == 2 in both copies and reads back 4.
    v = make(mirrored_strategy, 0, synchronization=ON_READ, aggregation=A.SUM)
    v.assign(5)
    assert [int(c.numpy()) for c in v.values] == [3, 2]
    assert int(v.read_value()) == 5
    v.assign(-7)
    assert int(v.read_value()) == -7
    assert v.dtype == td.int32


@pytest.mark.parametrize(
    "initial, value, error",
    [
        (0, np.array(3.7), td.errors.InvalidArgumentError),  # a float array into an int variable
        (0, 3.7, TypeError),  # a Python float into an int variable
        (0.0, np.array(3 + 1j, np.complex64), td.errors.InvalidArgumentError),  # complex into real
        (0.0, "3", TypeError),
    ],
    ids=["float array into int", "python float into int", "complex into float", "string into float"],
)
def test_sync_on_read_sum_cross_replica_assign_checks_the_dtype(mirrored_strategy, initial, value, error):
    v = make(mirrored_strategy, initial, synchronization=ON_READ, aggregation=A.SUM)
    v.assign(2)
    before = components(v)
    with pytest.raises(error, match=r"SyncOnReadVariable\.assign\(\) of Variable:0: cannot convert"):
        v.assign(value)
    assert components(v) == before
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(4)
def test_sync_on_read_local_writes_do_not_leak_between_replicas(mirrored_strategy):
    # Components start out sharing one immutable host buffer; a local write replaces only its own.
    v = make(mirrored_strategy, np.zeros(3, np.float32), synchronization=ON_READ, aggregation=A.SUM)
    mirrored_strategy.run(lambda: v.assign(np.full(3, rid(), np.float32)))
    for i, c in enumerate(v.values):
        np.testing.assert_array_equal(c.numpy(), [i, i, i])
    np.testing.assert_array_equal(v.read_value(), [6.0, 6.0, 6.0])


# --- run returns variables ------------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_run_returns_the_variable_or_its_container(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    v = make(mirrored_strategy, 1.0)
    assert mirrored_strategy.run(lambda: v) is v
    assert mirrored_strategy.run(lambda: v.values[rid()]) is v
    nested = mirrored_strategy.run(lambda: {"var": v, "component": v.values[rid()], "id": rid()})
    assert nested["var"] is v and nested["component"] is v
    assert mirrored_strategy.experimental_local_results(v) == tuple(v.values)
    assert len(mirrored_strategy.experimental_local_results(v)) == n


def test_run_returning_components_of_different_variables_raises(mirrored_strategy):
    a, b = make(mirrored_strategy, 1.0), make(mirrored_strategy, 2.0)
    with pytest.raises(td.errors.ValidationError, match="components of different distributed variables"):
        mirrored_strategy.run(lambda: (a if rid() == 0 else b).values[rid()])
    assert_strategy_works(mirrored_strategy)


def test_variables_are_passed_whole_to_replicas(mirrored_strategy):
    v = make(mirrored_strategy, 1.0)
    seen = mirrored_strategy.run(lambda x: x is v, args=(v,))
    assert seen is True


# --- snapshots -------------------------------------------------------------------------------


def test_reads_are_snapshots(mirrored_strategy):
    v = make(mirrored_strategy, [1.0, 2.0], aggregation=A.MEAN)
    before = v.read_value()
    in_replicas = mirrored_strategy.experimental_local_results(mirrored_strategy.run(lambda: v.value()))
    written = v.assign([5.0, 6.0])
    mirrored_strategy.run(lambda: v.assign_add(td.ones([2])))
    np.testing.assert_array_equal(before, [1.0, 2.0])
    for part in in_replicas:
        np.testing.assert_array_equal(part, [1.0, 2.0])
    for part in written.values:
        np.testing.assert_array_equal(part, [5.0, 6.0])
    with pytest.raises(ValueError, match="read-only"):
        before[0] = 9.0  # handed-out arrays cannot be used to corrupt the variable
    np.testing.assert_array_equal(v.numpy(), [6.0, 7.0])


@settings(max_examples=25, deadline=None)
@given(
    n=st.sampled_from([1, 2, 3, 4]),
    values=st.lists(st.floats(-1e3, 1e3, width=32), min_size=4, max_size=4),
    aggregation=st.sampled_from([A.SUM, A.MEAN, A.ONLY_FIRST_REPLICA]),
)
def test_replica_assign_matches_numpy(n, values, aggregation):
    strategy = mirrored_strategy_for(n)
    v = make(strategy, 0.0, aggregation=aggregation)
    strategy.run(lambda: v.assign(np.float32(values[rid()])))
    own = np.array(values[:n], dtype=np.float32)
    expected = {A.SUM: own.sum(dtype=np.float32), A.MEAN: own.sum(dtype=np.float32) / n, A.ONLY_FIRST_REPLICA: own[0]}
    for component in v.values:
        np.testing.assert_allclose(component.numpy(), expected[aggregation], rtol=1e-6, atol=1e-6)


# --- copy.deepcopy (as TensorFlow's DistributedVariable.__deepcopy__) --------------------------


@pytest.mark.parametrize("synchronization", [S.ON_WRITE, ON_READ])
@pytest.mark.parametrize("aggregation", [A.NONE, A.SUM, A.MEAN, A.ONLY_FIRST_REPLICA])
def test_deepcopy_keeps_the_kind_strategy_devices_and_attributes(mirrored_strategy, synchronization, aggregation):
    v = make(mirrored_strategy, np.array([1.0, 2.0], np.float32), name="w", synchronization=synchronization,
             aggregation=aggregation)
    copied = copy.deepcopy(v)
    assert type(copied) is type(v) and copied is not v
    assert (copied.dtype, copied.shape, copied.aggregation, copied.synchronization, copied.trainable) == (
        v.dtype, v.shape, v.aggregation, v.synchronization, v.trainable
    )
    assert copied.distribute_strategy is mirrored_strategy
    assert [c.device for c in copied.values] == [c.device for c in v.values]
    assert [c.name for c in copied.values] == [c.name for c in v.values]
    for original, twin in zip(v.values, copied.values):
        np.testing.assert_array_equal(twin.numpy(), original.numpy())
        assert not np.shares_memory(twin._array, original._array)


def test_deepcopy_components_are_independent_of_the_original(mirrored_strategy):
    v = make(mirrored_strategy, np.array([1.0, 2.0], np.float32))
    copied = copy.deepcopy(v)
    copied.assign([5.0, 6.0])
    mirrored_strategy.run(lambda: copied.assign_add(np.full(2, rid() + 1.0, np.float32)))
    assert [c.numpy().tolist() for c in v.values] == [[1.0, 2.0], [1.0, 2.0]]
    assert [c.numpy().tolist() for c in copied.values] == [[6.0, 7.0], [7.0, 8.0]]


def test_deepcopy_of_sync_on_read_keeps_each_replicas_value(mirrored_strategy):
    v = make(mirrored_strategy, 0.0, synchronization=ON_READ, aggregation=A.SUM)
    mirrored_strategy.run(lambda: v.assign_add(td.constant(rid() + 1.0)))
    copied = copy.deepcopy(v)
    assert components(copied) == [1.0, 2.0]
    assert float(copied.read_value()) == 3.0
    copied.assign(10.0)
    assert components(v) == [1.0, 2.0]


def test_deepcopy_of_a_structure_keeps_sharing(mirrored_strategy):
    v = make(mirrored_strategy, 1.0)
    pair = copy.deepcopy([v, v])
    assert pair[0] is pair[1] and pair[0] is not v


def test_deepcopy_under_another_strategy_raises(mirrored_strategy):
    four_replicas = mirrored_strategy_for(4)
    v = make(mirrored_strategy, 1.0)
    with four_replicas.scope(), pytest.raises(ContextError, match="Mixing different strategies: copy.deepcopy()"):
        copy.deepcopy(v)
    with mirrored_strategy.scope():
        assert components(copy.deepcopy(v)) == [1.0, 1.0]


def test_each_replica_gets_the_write_result_it_asked_for(mirrored_strategy):
    v = make(mirrored_strategy, 1.0, aggregation=A.SUM)
    results = mirrored_strategy.run(lambda: v.assign_add(td.constant(2.0), read_value=rid() == 1))
    first, second = mirrored_strategy.experimental_local_results(results)
    assert first is None
    assert float(second) == 5.0  # 1 + 2 + 2: the replicas' values are summed, then written once
    assert components(v) == [5.0, 5.0]


# --- what writes return, by context (TF 2.21 observed, 2 logical CPUs) ----------------------


def _rid():
    return np.float32(td.distribute.get_replica_context().replica_id_in_sync_group)


@pytest.mark.parametrize("aggregation", [A.NONE, A.SUM])
def test_a_cross_replica_write_of_a_mirrored_variable_returns_the_new_values(mirrored_strategy, aggregation):
    # TF: mv.assign(3.0) -> Mirrored:{0: tf.Tensor(3.0), 1: tf.Tensor(3.0)}.
    with mirrored_strategy.scope():
        v = td.Variable(1.0, aggregation=aggregation)
    result = v.assign(3.0)
    assert type(result).__name__ == "Mirrored"
    assert [float(x) for x in result.values] == [3.0, 3.0]


def test_a_cross_replica_write_of_a_sync_on_read_variable_returns_the_value(mirrored_strategy):
    # TF: sv.assign(3.0) (MEAN) -> tf.Tensor(3.0).
    with mirrored_strategy.scope():
        v = td.Variable(1.0, synchronization=ON_READ, aggregation=A.MEAN)
    result = v.assign(3.0)
    assert isinstance(result, np.ndarray) and float(result) == 3.0


@pytest.mark.parametrize(("synchronization", "aggregation"), [(S.ON_WRITE, A.NONE), (ON_READ, A.MEAN)])
def test_a_replica_local_write_returns_the_component_read_when_used(mirrored_strategy, synchronization, aggregation):
    # TF: replica r does var.assign_add(r + 1.) on 1.0 -> PerReplica of _UnreadVariable, numpy 2.0 and 3.0.
    with mirrored_strategy.scope():
        v = td.Variable(1.0, synchronization=synchronization, aggregation=aggregation)
    out = mirrored_strategy.run(lambda: v.assign_add(_rid() + 1.0))
    assert type(out).__name__ == "PerReplica"
    assert [type(x).__name__ for x in out.values] == ["UnreadVariable", "UnreadVariable"]
    assert [x.numpy() for x in out.values] == [2.0, 3.0]
    assert mirrored_strategy.run(lambda: v.assign_add(1.0, read_value=False)) is None


def test_a_replica_local_write_chains_on_the_component(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    mirrored_strategy.run(lambda: v.assign(_rid()).assign_add(10.0))
    assert [c.numpy() for c in v.values] == [10.0, 11.0]


def test_an_aggregated_replica_write_returns_the_new_value(mirrored_strategy):
    # TF: SUM, replica r assign_add(r + 1.) on 3.0 -> PerReplica of tf.Tensor(6.0).
    with mirrored_strategy.scope():
        v = td.Variable(3.0, aggregation=A.SUM)
    out = mirrored_strategy.run(lambda: v.assign_add(_rid() + 1.0))
    assert [type(x).__name__ for x in out.values] == ["ndarray", "ndarray"]
    assert [float(x) for x in out.values] == [6.0, 6.0]


def test_update_returns_read_values_grouped_and_the_components_ungrouped(mirrored_strategy):
    # TF: update(mv, lambda v, d: v.assign_sub(d), args=(1.,)) -> Mirrored of tf.Tensor;
    # group=False -> a tuple of _UnreadVariable.
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    grouped = mirrored_strategy.extended.update(v, lambda c, d: c.assign_sub(d), args=(1.0,))
    assert type(grouped).__name__ == "Mirrored"
    assert [type(x).__name__ for x in grouped.values] == ["ndarray", "ndarray"]
    assert [float(x) for x in grouped.values] == [4.0, 4.0]
    ungrouped = mirrored_strategy.extended.update(v, lambda c: c.assign(5.0), group=False)
    assert [type(x).__name__ for x in ungrouped] == ["UnreadVariable", "UnreadVariable"]
    assert [x.numpy() for x in ungrouped] == [5.0, 5.0]


def test_single_device_strategies_return_the_variable_read_when_used(one_device_cpu, default):
    # TF: OneDeviceStrategy and default strategy: assign, update and a write in run give _UnreadVariable.
    for strategy in (one_device_cpu, default):
        with strategy.scope():
            v = td.Variable(1.0)
        assert type(v.assign(2.0)).__name__ == "UnreadVariable"
        assert type(strategy.extended.update(v, lambda c: c.assign(5.0))).__name__ == "UnreadVariable"
        assert strategy.run(lambda v=v: type(v.assign_add(1.0)).__name__) == "UnreadVariable"
        assert v.numpy() == 6.0


def test_central_storage_writes_return_the_variable_read_when_used(central_storage_2cpu):
    # TF: CentralStorageStrategy assign, run(assign_add) and update -> _UnreadVariable.
    with central_storage_2cpu.scope():
        v = td.Variable(1.0, aggregation=A.MEAN)
    assert type(v.assign(2.0)).__name__ == "UnreadVariable"
    out = central_storage_2cpu.run(lambda: v.assign_add(1.0))
    assert type(out).__name__ == "UnreadVariable" and out.numpy() == 3.0


# --- slice assignment of distributed variables (DESIGN 10.21) ----------------------------------


def test_a_cross_replica_slice_assign_writes_every_component(mirrored_strategy):
    # TF 2.21 writes only component 0 ([9, 2, 3] and [1, 2, 3]); towerdist writes both.
    with mirrored_strategy.scope():
        v = td.Variable([1.0, 2.0, 3.0], name="mw")
    v[0].assign(9.0)
    v[1:].assign([5.0, 6.0])
    assert [c.numpy().tolist() for c in v.values] == [[9.0, 5.0, 6.0], [9.0, 5.0, 6.0]]


def test_a_replica_slice_assign_with_aggregation_none_writes_the_own_component(mirrored_strategy):
    # TF: replica r does mv[0].assign(r + 10.) -> components [10, 2, 3] and [11, 2, 3].
    with mirrored_strategy.scope():
        v = td.Variable([1.0, 2.0, 3.0])
    out = mirrored_strategy.run(lambda: v[0].assign(_rid() + 10.0))
    assert [type(x).__name__ for x in out.values] == ["UnreadVariable", "UnreadVariable"]
    assert [c.numpy().tolist() for c in v.values] == [[10.0, 2.0, 3.0], [11.0, 2.0, 3.0]]


def test_a_replica_slice_assign_of_a_sync_on_read_variable_writes_the_own_component(mirrored_strategy):
    # TF: sync-on-read SUM, replica r does sv[0].assign(r + 10.) -> [10, 2] and [11, 2].
    with mirrored_strategy.scope():
        v = td.Variable([1.0, 2.0], synchronization=ON_READ, aggregation=A.SUM)
    mirrored_strategy.run(lambda: v[0].assign(_rid() + 10.0))
    assert [c.numpy().tolist() for c in v.values] == [[10.0, 2.0], [11.0, 2.0]]


def test_a_replica_slice_assign_with_aggregation_is_aggregated_into_every_component(mirrored_strategy):
    # TF 2.21 writes each replica's own component ([10, 2] and [11, 2]): the copies diverge.
    # towerdist aggregates it as any replica-context write (SUM: 10 + 11).
    with mirrored_strategy.scope():
        v = td.Variable([1.0, 2.0], aggregation=A.SUM)
    mirrored_strategy.run(lambda: v[0].assign(_rid() + 10.0))
    assert [c.numpy().tolist() for c in v.values] == [[21.0, 2.0], [21.0, 2.0]]


def test_replicas_assigning_different_slices_of_an_aggregated_variable_raise(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable([1.0, 2.0], aggregation=A.SUM)

    def step():
        return v[td.distribute.get_replica_context().replica_id_in_sync_group].assign(np.float32(1.0))

    with pytest.raises(RuntimeError, match=r"replica 0 called MirroredVariable\[0\].assign\(\); replica 1 called"):
        mirrored_strategy.run(step)
    assert [c.numpy().tolist() for c in v.values] == [[1.0, 2.0], [1.0, 2.0]]


def test_a_cross_replica_slice_assign_of_a_sum_sync_on_read_variable_splits_the_value(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable([1.0, 2.0], synchronization=ON_READ, aggregation=A.SUM)
    v[0].assign(9.0)
    assert [c.numpy().tolist() for c in v.values] == [[4.5, 2.0], [4.5, 2.0]]
    np.testing.assert_array_equal(v.read_value(), [9.0, 4.0])


def test_a_bad_distributed_slice_assign_changes_no_component(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable([1.0, 2.0, 3.0], name="mw")
    with pytest.raises(td.errors.InvalidArgumentError, match=r"elements \[1:\] of variable mw:0"):
        v[1:].assign([1.0, 2.0, 3.0])
    assert [c.numpy().tolist() for c in v.values] == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
