"""``CentralStorageStrategy``: replicated compute, one copy of each variable.

Replicas run as in MirroredStrategy (one thread per compute device, merge_call, reductions
through the host). Variables live once, on the parameter device; with more than one replica
they are ``AggregatingVariable``\\ s: replica-context writes are aggregated by the variable's
``aggregation`` first, cross-replica writes go to the one copy (a distributed value
contributes its first component). With one replica variables are plain. The observations
pinned here were made with TensorFlow 2.21.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import towerdist as td

from conftest import cpus

CentralStorageStrategy = td.distribute.experimental.CentralStorageStrategy
PerReplica = td.distribute.PerReplica
Mirrored = td.distribute.Mirrored
ContextError = td.errors.ContextError
ValidationError = td.errors.ValidationError
Agg = td.VariableAggregation
ON_READ = td.VariableSynchronization.ON_READ
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"
COLOCATE_ERROR = "^`colocate_vars_with` must only be passed a variable created in this"


@pytest.fixture(scope="module")
def css(central_storage_2cpu) -> CentralStorageStrategy:
    """2 compute CPUs, parameter device "CPU:0"."""
    return central_storage_2cpu


@pytest.fixture(scope="module")
def css_default() -> CentralStorageStrategy:
    """``CentralStorageStrategy()`` on a machine without GPUs: one replica on the host CPU."""
    return CentralStorageStrategy()


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def replica_value() -> np.ndarray:
    """1.0 on replica 0, 2.0 on replica 1 (a new array per replica)."""
    return td.constant(1.0 + rid())


def assert_strategy_works(strategy) -> None:
    result = strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    expected = list(range(strategy.num_replicas_in_sync))
    assert [int(v) for v in strategy.experimental_local_results(result)] == expected


def per_replica(*values: float) -> PerReplica:
    return PerReplica([td.constant(v) for v in values])


# --- devices --------------------------------------------------------------------------------


def test_worker_devices_are_the_canonical_compute_devices(css):
    assert tuple(css.extended.worker_devices) == (CPU0, CPU1)
    assert css.num_replicas_in_sync == 2


def test_parameter_devices_are_reported_as_given(css):
    assert tuple(css.extended.parameter_devices) == ("CPU:0",)


def test_parameter_device_spelling_is_kept():
    strategy = CentralStorageStrategy(compute_devices=cpus(2), parameter_device="/cpu:0")
    assert tuple(strategy.extended.parameter_devices) == ("/cpu:0",)


def test_default_parameter_device_with_several_compute_devices_is_the_host():
    strategy = CentralStorageStrategy(compute_devices=["CPU:1", "CPU:2"])
    assert tuple(strategy.extended.parameter_devices) == ("/device:CPU:0",)
    assert tuple(strategy.extended.worker_devices) == (
        "/job:localhost/replica:0/task:0/device:CPU:1",
        "/job:localhost/replica:0/task:0/device:CPU:2",
    )
    with strategy.scope():
        v = td.Variable(1.0)
    assert v.device == CPU0


def test_bad_parameter_device_raises():
    with pytest.raises(ValueError, match="CPU:99"):
        CentralStorageStrategy(compute_devices=cpus(2), parameter_device="CPU:99")


def test_bad_compute_device_raises():
    with pytest.raises(ValueError):
        CentralStorageStrategy(compute_devices=["CPU:0", "CPU:99"], parameter_device="CPU:0")


# --- the default CentralStorageStrategy(): one replica, plain variables ----------------------


def test_default_has_one_replica_on_the_host_cpu(css_default):
    assert css_default.num_replicas_in_sync == 1
    assert tuple(css_default.extended.worker_devices) == (CPU0,)
    assert tuple(css_default.extended.parameter_devices) == (CPU0,)


def test_default_creates_plain_variables(css_default):
    with css_default.scope():
        v = td.Variable(1.0)
        r = td.Variable(1.0, synchronization=ON_READ, aggregation=Agg.SUM)
    assert type(v).__name__ == "ResourceVariable"
    assert type(r).__name__ == "ResourceVariable"
    assert v.device == CPU0
    assert css_default.extended.variable_created_in_scope(v) is True
    assert css_default.experimental_local_results(v) == (v,)


def test_default_run_reduce_and_update(css_default):
    with css_default.scope():
        v = td.Variable(1.0)
    result = css_default.run(lambda: td.constant(3.0))
    assert not isinstance(result, td.distribute.DistributedValues)
    assert float(result) == 3.0
    assert float(css_default.reduce("SUM", result, axis=None)) == 3.0
    new = css_default.extended.update(v, lambda c, x: c.assign(x), args=(5.0,))
    assert float(new) == 5.0 and float(v) == 5.0


# --- AggregatingVariable: one copy on the parameter device --------------------------------------


def test_variables_are_aggregating_variables(css):
    with css.scope():
        v = td.Variable(1.0)
    assert type(v).__name__ == "AggregatingVariable"
    assert isinstance(v, td.Variable)
    assert not isinstance(v, td.distribute.DistributedValues)
    assert v.device == CPU0
    assert v.distribute_strategy is css
    assert v.trainable is True
    assert repr(v) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"
    assert css.extended.variable_created_in_scope(v) is True
    assert css.extended.variable_created_in_scope(td.Variable(1.0)) is False


def test_one_copy_local_results_is_the_variable_itself(css):
    with css.scope():
        v = td.Variable(np.arange(3, dtype=np.float32), name="w")
    results = css.experimental_local_results(v)
    assert len(results) == 1 and results[0] is v
    assert repr(v) == "<tf.Variable 'w:0' shape=(3,) dtype=float32, numpy=array([0., 1., 2.], dtype=float32)>"


def test_on_read_variables_are_aggregating_variables_too(css):
    with css.scope():
        v = td.Variable(1.0, synchronization=ON_READ, aggregation=Agg.SUM)
    assert type(v).__name__ == "AggregatingVariable"
    assert v.trainable is False
    assert v.synchronization is ON_READ
    assert v.device == CPU0


def test_every_replica_reads_the_one_copy(css):
    with css.scope():
        v = td.Variable(4.0)
    result = css.run(lambda: (v.read_value(), v.device))
    values, devices = result
    assert [float(x) for x in css.experimental_local_results(values)] == [4.0, 4.0]
    assert list(css.experimental_local_results(devices)) == [CPU0, CPU0]


def test_returning_the_variable_from_run_gives_the_variable(css):
    with css.scope():
        v = td.Variable(1.0)
    assert css.run(lambda: v) is v
    assert css.run(lambda x: x is v, args=(v,)) is True


def test_variable_created_inside_run_is_one_aggregating_variable(css):
    v = css.run(lambda: td.Variable(2.0, name="in_run"))
    assert type(v).__name__ == "AggregatingVariable"
    assert v.device == CPU0
    assert float(v) == 2.0
    assert css.extended.variable_created_in_scope(v) is True


# --- writes in replica context: aggregated first ------------------------------------------------


@pytest.mark.parametrize(
    "aggregation, expected",
    [(Agg.SUM, 3.0), (Agg.MEAN, 1.5), (Agg.ONLY_FIRST_REPLICA, 1.0)],
    ids=["sum", "mean", "only_first_replica"],
)
def test_replica_context_assign_is_aggregated(css, aggregation, expected):
    with css.scope():
        v = td.Variable(0.0, aggregation=aggregation)
    css.run(lambda: v.assign(replica_value()))
    assert float(v) == expected
    assert v.get().device == CPU0


def test_replica_context_assign_add_docstring_example(css):
    with css.scope():
        v = td.Variable(1.0, aggregation=Agg.SUM)
    css.run(lambda: v.assign_add(td.constant(1.0)))  # each replica adds 1.0
    assert repr(v) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=3.0>"
    css.run(lambda: v.assign_sub(replica_value()))
    assert float(v) == 0.0


def test_replica_context_write_with_read_value_false_returns_none(css):
    with css.scope():
        v = td.Variable(0.0, aggregation=Agg.MEAN)
    assert css.run(lambda: v.assign(replica_value(), read_value=False)) is None
    assert float(v) == 1.5


def test_on_read_variable_write_in_replica_context_is_aggregated(css):
    with css.scope():
        v = td.Variable(1.0, synchronization=ON_READ, aggregation=Agg.SUM)
    css.run(lambda: v.assign_add(replica_value()))
    assert float(v) == 4.0
    assert float(css.extended.read_var(v)) == 4.0


def test_on_read_variable_cross_replica_writes_go_to_the_one_copy(css):
    # TF 2.21: unlike a SyncOnReadVariable, no division by the replica count and assign_add is allowed.
    with css.scope():
        v = td.Variable(1.0, synchronization=ON_READ, aggregation=Agg.SUM)
    v.assign(6.0)
    assert float(v) == 6.0
    v.assign_add(1.0)
    assert float(v) == 7.0


def test_replica_context_write_with_aggregation_none_raises(css):
    with css.scope():
        v = td.Variable(5.0)
    with pytest.raises(ValueError, match="^You must specify an aggregation method to update a AggregatingVariable"):
        css.run(lambda: v.assign(replica_value()))
    assert float(v) == 5.0
    assert_strategy_works(css)


def test_same_python_float_from_every_replica_with_sum_raises(css):
    with css.scope():
        v = td.Variable(5.0, aggregation=Agg.SUM)
    with pytest.raises(ValueError, match="^A non-DistributedValues value"):
        css.run(lambda: v.assign(1.0))
    assert float(v) == 5.0
    assert_strategy_works(css)


def test_same_python_float_from_every_replica_with_mean_is_that_value(css):
    with css.scope():
        v = td.Variable(5.0, aggregation=Agg.MEAN)
    css.run(lambda: v.assign(1.0))
    assert float(v) == 1.0


def test_distributed_value_in_replica_context_write_raises(css):
    with css.scope():
        v = td.Variable(5.0, aggregation=Agg.SUM)
    with pytest.raises(TypeError, match="DistributedValues"):
        css.run(lambda: v.assign(per_replica(1.0, 2.0)))
    assert float(v) == 5.0
    assert_strategy_works(css)


# --- writes in cross-replica context: the one copy ---------------------------------------------


def test_cross_replica_assign_writes_the_one_copy(css):
    with css.scope():
        v = td.Variable(1.0)
    result = v.assign(9.0)
    assert float(result) == 9.0
    assert float(v) == 9.0 and float(v.get().value()) == 9.0
    assert css.experimental_local_results(v) == (v,)
    assert v.assign_add(1.0, read_value=False) is None
    assert float(v) == 10.0


def test_cross_replica_assign_of_distributed_value_uses_the_first_component(css):
    with css.scope():
        v = td.Variable(1.0)
    assert float(v.assign(Mirrored([td.constant(4.0), td.constant(5.0)]))) == 4.0
    assert float(v.assign_add(per_replica(1.0, 7.0))) == 5.0
    assert float(v) == 5.0


def test_cross_replica_write_inside_another_strategys_scope_raises(css, mirrored_strategy):
    with css.scope():
        v = td.Variable(1.0)
    with mirrored_strategy.scope():
        with pytest.raises(ContextError):
            v.assign(2.0)
    assert float(v) == 1.0


# --- extended.update ---------------------------------------------------------------------------


def test_update_uses_the_first_component_of_distributed_args(css):
    with css.scope():
        v = td.Variable(0.0)
    seen = []

    def fn(component, x, y=None):
        seen.append((component, td.distribute.get_update_device(), float(x), float(y)))
        return component.assign(x + y)

    result = css.extended.update(v, fn, args=(per_replica(1.0, 2.0),), kwargs={"y": per_replica(10.0, 20.0)})
    assert len(seen) == 1
    component, device, x, y = seen[0]
    assert component is v.get() and type(component).__name__ == "ResourceVariable"
    assert device == CPU0
    assert (x, y) == (1.0, 10.0)
    assert not isinstance(result, td.distribute.DistributedValues)
    assert float(result) == 11.0 and float(v) == 11.0
    assert td.distribute.get_update_device() is None


def test_update_group_false_gives_a_one_tuple(css):
    with css.scope():
        v = td.Variable(0.0)
    result = css.extended.update(v, lambda c: c.assign(2.0), group=False)
    assert type(result) is tuple and len(result) == 1
    assert float(result[0]) == 2.0
    assert css.extended.update(v, lambda c: None) is None


def test_update_in_replica_context_uses_replica_0s_argument(css):
    with css.scope():
        v = td.Variable(0.0)
    css.run(lambda: css.extended.update(v, lambda c, x: c.assign(x), args=(replica_value() * 10.0,)))
    assert float(v) == 10.0
    css.run(lambda: td.distribute.get_replica_context()._update(v, lambda c, x: c.assign(x), args=(replica_value(),)))
    assert float(v) == 1.0


def test_update_of_a_variable_created_elsewhere_raises(css, mirrored_strategy):
    plain = td.Variable(1.0)
    with mirrored_strategy.scope():
        mirrored = td.Variable(1.0)
    for var in (plain, mirrored):
        with pytest.raises(ValidationError):
            css.extended.update(var, lambda c: c.assign(2.0))
    assert float(plain) == 1.0
    assert [float(c) for c in mirrored.values] == [1.0, 1.0]
    assert_strategy_works(css)


def test_read_var_and_value_container(css):
    with css.scope():
        v = td.Variable(3.0)
    value = css.extended.read_var(v)
    assert float(value) == 3.0 and not isinstance(value, td.Variable)
    assert css.extended.value_container(v.get()) is v
    array = np.ones(2)
    assert css.extended.value_container(array) is array


# --- reductions ---------------------------------------------------------------------------------


def test_reduce_to_the_variable_gives_a_plain_array(css):
    with css.scope():
        v = td.Variable(0.0)
    values = css.run(replica_value)
    assert isinstance(values, PerReplica)
    summed = css.extended.reduce_to(td.distribute.ReduceOp.SUM, values, v)
    assert not isinstance(summed, td.distribute.DistributedValues)
    assert float(summed) == 3.0
    assert float(css.extended.reduce_to("mean", values, v)) == 1.5
    batched = css.extended.batch_reduce_to("sum", [(values, v), (values, v)])
    assert [float(x) for x in batched] == [3.0, 3.0]
    assert not any(isinstance(x, td.distribute.DistributedValues) for x in batched)


def test_reduce_to_of_a_non_distributed_value(css):
    with css.scope():
        v = td.Variable(0.0)
    assert css.extended.reduce_to("mean", 3.0, v) == 3.0
    with pytest.raises(ValueError, match="^A non-DistributedValues value"):
        css.extended.reduce_to("sum", 3.0, v)


def test_run_and_reduce_work_as_in_mirrored(css):
    assert float(css.reduce("SUM", css.run(lambda: td.constant(1.0)), axis=None)) == 2.0
    assert float(css.reduce("MEAN", css.run(replica_value), axis=None)) == 1.5
    result = css.run(lambda: td.distribute.get_replica_context().all_reduce("sum", replica_value()))
    assert [float(x) for x in css.experimental_local_results(result)] == [3.0, 3.0]
    ids = css.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)
    assert css.run(lambda x: x * 10, args=(ids,)).values == (0, 10)


def test_reduce_to_then_update_from_merge_call_writes_the_sum(css):
    with css.scope():
        v = td.Variable(5.0)

    def merge_fn(strategy, value, var):
        reduced = strategy.extended.reduce_to(td.distribute.ReduceOp.SUM, value, destinations=var)
        return strategy.extended.update(var, lambda c, x: c.assign(x), args=(reduced,))

    css.run(lambda: td.distribute.get_replica_context().merge_call(merge_fn, args=(td.identity(1.0), v)))
    assert repr(v) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=2.0>"


# --- non-slot variables and colocation -----------------------------------------------------------


def test_non_slot_devices_is_the_variable_with_the_smaller_name(css):
    with css.scope():
        b = td.Variable(1.0, name="b")
        a = td.Variable(1.0, name="a")
    assert css.extended.non_slot_devices([a, b]) is a
    assert css.extended.non_slot_devices([b, a]) is a


def test_update_non_slot_returns_a_plain_value(css):
    with css.scope():
        v = td.Variable(1.0)
    result = css.extended.update_non_slot(v, lambda: td.constant(1.0))
    assert not isinstance(result, td.distribute.DistributedValues)
    assert float(result) == 1.0
    ungrouped = css.extended.update_non_slot(v, lambda: td.constant(1.0), group=False)
    assert type(ungrouped) is tuple and [float(x) for x in ungrouped] == [1.0]
    assert css.extended.update_non_slot(v, td.distribute.get_update_device) == CPU0


def test_update_non_slot_in_replica_context_raises(css):
    with css.scope():
        v = td.Variable(1.0)
    with pytest.raises(ContextError):
        css.run(lambda: css.extended.update_non_slot(v, lambda: 1))
    assert_strategy_works(css)


def test_step_counter_colocated_with_non_slot_devices(css):
    with css.scope():
        w = td.Variable(1.0, name="w")
        with css.extended.colocate_vars_with(css.extended.non_slot_devices([w])):
            step = td.Variable(0, name="step")
    for _ in range(3):
        css.extended.update_non_slot(css.extended.non_slot_devices([w]), lambda: step.assign_add(1))
    assert type(step).__name__ == "AggregatingVariable"
    assert int(step) == 3


def test_colocate_vars_with_places_variables_on_the_parameter_device(css):
    with css.scope():
        v = td.Variable(1.0)
        with css.extended.colocate_vars_with(v):
            slot = td.Variable(0.0, name="slot")
    assert type(slot).__name__ == "AggregatingVariable"
    assert slot.device == v.device == CPU0
    css.extended.update(v, lambda c, s: s.assign(c.read_value() + 1.0), args=(slot,))
    assert float(slot) == 2.0


def test_colocate_vars_with_rejects_foreign_variables(css, mirrored_strategy):
    other = CentralStorageStrategy(compute_devices=cpus(2), parameter_device="CPU:0")
    with other.scope():
        other_var = td.Variable(1.0)
    with mirrored_strategy.scope():
        mirrored = td.Variable(1.0)
    plain = td.Variable(1.0)
    with css.scope():
        for foreign in (other_var, mirrored, plain, 3.0):
            with pytest.raises(ValueError, match=COLOCATE_ERROR):
                css.extended.colocate_vars_with(foreign)
        still_ok = td.Variable(1.0)
    assert type(still_ok).__name__ == "AggregatingVariable"
    assert_strategy_works(css)


def test_colocate_vars_with_outside_the_scope_raises(css):
    with css.scope():
        v = td.Variable(1.0)
    with pytest.raises(ContextError):
        css.extended.colocate_vars_with(v)


# --- copying ------------------------------------------------------------------------------------


def test_deepcopy_gives_a_new_working_strategy(css):
    with css.scope():
        v = td.Variable(1.0)
    clone = copy.deepcopy(css)
    assert clone is not css
    assert type(clone) is CentralStorageStrategy
    assert tuple(clone.extended.worker_devices) == tuple(css.extended.worker_devices)
    assert tuple(clone.extended.parameter_devices) == ("CPU:0",)
    assert float(clone.reduce("SUM", clone.run(lambda: td.constant(1.0)), axis=None)) == 2.0
    with clone.scope():
        w = td.Variable(0.0, aggregation=Agg.SUM)
    clone.run(lambda: w.assign(replica_value()))
    assert float(w) == 3.0
    assert clone.extended.variable_created_in_scope(v) is False
    with pytest.raises(ValidationError):
        clone.extended.update(v, lambda c: c.assign(2.0))
    assert float(v) == 1.0
    assert_strategy_works(css)


def test_shallow_copy_is_refused(css):
    with pytest.raises(RuntimeError, match="deepcopy"):
        copy.copy(css)
    assert_strategy_works(css)


# --- copy.deepcopy ---------------------------------------------------------------------------


def test_deepcopy_of_an_aggregating_variable_is_independent(css):
    with css.scope():
        v = td.Variable(np.array([1.0, 2.0], np.float32), aggregation=td.VariableAggregation.SUM)
    copied = copy.deepcopy(v)
    assert type(copied) is type(v) and copied is not v
    assert copied.distribute_strategy is css and copied.device == v.device
    assert copied.aggregation is v.aggregation and copied.dtype == v.dtype
    copied.assign([5.0, 6.0])
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(copied.numpy(), [5.0, 6.0])
    css.run(lambda: copied.assign_add(np.ones(2, np.float32)))
    np.testing.assert_array_equal(copied.numpy(), [7.0, 8.0])  # SUM of the 2 replicas' ones
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
