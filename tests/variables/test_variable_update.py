"""Updating variables by hand: ``StrategyExtended.update`` and its companions.

The pattern of TensorFlow's ``tf.distribute.StrategyExtended`` docs ("How to update a
variable"), as observed in TensorFlow 2.21: replicas compute updates, meet at a
``merge_call``, reduce them onto the variables (``reduce_to`` / ``batch_reduce_to``) and
apply them with ``extended.update``.

``update(var, fn, args, kwargs, group)`` calls ``fn(component, ...)`` once per component of
``var``, each in an update context naming the component's device; distributed arguments are
split per component, distributed variables are passed whole. ``group=True`` merges the
results into ``Mirrored`` values, ``group=False`` gives one tuple entry per component.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import towerdist as td
from towerdist.testing.pytest_plugin import mirrored_strategy_for

Mirrored = td.distribute.Mirrored
PerReplica = td.distribute.PerReplica
ReduceOp = td.distribute.ReduceOp
ContextError = td.errors.ContextError
ValidationError = td.errors.ValidationError
SUM = td.VariableAggregation.SUM
ON_READ = td.VariableSynchronization.ON_READ
COLOCATE_ERROR = "^`colocate_vars_with` must only be passed a variable created in this"



def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def values_of(var) -> list[float]:
    """The components of a distributed variable (or the one value of a plain one) as floats."""
    if hasattr(var, "values"):
        return [float(np.asarray(c.value())) for c in var.values]
    return [float(np.asarray(var.value()))]


def local_floats(strategy, value) -> list[float]:
    return [float(np.asarray(x)) for x in strategy.experimental_local_results(value)]


def assert_strategy_works(strategy) -> None:
    result = strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    expected = list(range(strategy.num_replicas_in_sync))
    assert [int(v) for v in strategy.experimental_local_results(result)] == expected


def device_index() -> int:
    """The index of the device being updated (``.../device:CPU:<i>``)."""
    return int(td.distribute.get_update_device().rsplit(":", 1)[1])


def maybe_scope(strategy, in_scope: bool):
    return strategy.scope() if in_scope else contextlib.nullcontext()


# --- update in cross-replica context -----------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("in_scope", [True, False], ids=["in_scope", "outside_scope"])
def test_update_calls_fn_once_per_component(mirrored_strategy, in_scope):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    seen = []

    def fn(component):
        seen.append(component)
        return component.assign(1.0)

    with maybe_scope(mirrored_strategy, in_scope):
        result = mirrored_strategy.extended.update(v, fn)
    assert len(seen) == n
    assert all(a is b for a, b in zip(seen, v.values))
    assert values_of(v) == [1.0] * n
    if n == 1:
        assert not isinstance(result, td.distribute.DistributedValues)
        assert float(result) == 1.0
    else:
        assert type(result) is Mirrored
        assert [float(x) for x in result.values] == [1.0] * n


@pytest.mark.replicas(1, 2, 4)
def test_update_returns_none_when_fn_returns_none(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    calls = []
    assert mirrored_strategy.extended.update(v, lambda c: calls.append(c)) is None
    assert len(calls) == mirrored_strategy.num_replicas_in_sync


@pytest.mark.replicas(1, 2, 4)
def test_update_group_false_gives_one_entry_per_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    result = mirrored_strategy.extended.update(v, lambda c: c.assign(2.0), group=False)
    assert type(result) is tuple
    assert len(result) == n
    assert [float(x) for x in result] == [2.0] * n
    assert values_of(v) == [2.0] * n


@pytest.mark.replicas(1, 2, 4)
def test_update_group_false_of_none_is_a_one_tuple(mirrored_strategy):
    # TF 2.21: the per-component Nones regroup to one None, whose local results are (None,).
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    assert mirrored_strategy.extended.update(v, lambda c: None, group=False) == (None,)


@pytest.mark.replicas(1, 2, 4)
def test_update_result_structure_is_regrouped_leaf_by_leaf(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(3.0)
    result = mirrored_strategy.extended.update(v, lambda c: (c.read_value(), 1))
    assert type(result) is tuple and len(result) == 2
    assert result[1] == 1 and type(result[1]) is int
    if n == 1:
        assert float(result[0]) == 3.0
    else:
        assert type(result[0]) is Mirrored
        assert [float(x) for x in result[0].values] == [3.0] * n
    ungrouped = mirrored_strategy.extended.update(v, lambda c: (c.read_value(), 1), group=False)
    assert [float(x) for x in ungrouped[0]] == [3.0] * n
    assert ungrouped[1] == (1,)


@pytest.mark.replicas(2, 4)
def test_update_result_dict_is_regrouped(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(4.0)
    result = mirrored_strategy.extended.update(v, lambda c: {"value": c.read_value(), "tag": "x"})
    assert set(result) == {"value", "tag"}
    assert result["tag"] == "x"
    assert type(result["value"]) is Mirrored
    assert [float(x) for x in result["value"].values] == [4.0] * n


def test_update_returns_a_mirrored_of_the_new_values(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(5.0, aggregation=SUM)
    result = mirrored_strategy.extended.update(v, lambda c: c.assign(1.0))
    assert type(result) is Mirrored
    assert [float(x) for x in result.values] == [1.0, 1.0]
    assert str(result) == "Mirrored:{\n  0: 1.0,\n  1: 1.0\n}"
    assert values_of(v) == [1.0, 1.0]


@pytest.mark.replicas(1, 2, 4)
def test_update_returns_the_new_values_on_every_replica_count(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(5.0, aggregation=SUM)
    result = mirrored_strategy.extended.update(v, lambda c: c.assign(1.0))
    assert local_floats(mirrored_strategy, result) == [1.0] * n
    assert values_of(v) == [1.0] * n


# --- the update context --------------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("in_scope", [True, False], ids=["in_scope", "outside_scope"])
def test_get_update_device_names_each_components_device(mirrored_strategy, in_scope):
    with mirrored_strategy.scope():
        v = td.Variable(0.0)
    seen = []

    def fn(component):
        seen.append((td.distribute.get_update_device(), component.device, td.distribute.in_cross_replica_context()))

    assert td.distribute.get_update_device() is None
    with maybe_scope(mirrored_strategy, in_scope):
        mirrored_strategy.extended.update(v, fn)
    assert td.distribute.get_update_device() is None
    workers = mirrored_strategy.extended.worker_devices
    assert [s[0] for s in seen] == list(workers)
    assert [s[1] for s in seen] == list(workers)
    assert all(s[2] for s in seen)
    assert all(name.startswith("/job:localhost/replica:0/task:0/device:CPU:") for name in workers)


@pytest.mark.replicas(2, 4)
def test_update_context_is_left_when_fn_raises(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(5.0)

    def fn(component):
        if device_index() == 1:
            raise KeyError("boom")
        return component.assign(7.0)

    with pytest.raises(KeyError, match="boom"):
        mirrored_strategy.extended.update(v, fn)
    assert td.distribute.get_update_device() is None
    assert td.distribute.in_cross_replica_context() is False
    assert values_of(v)[0] == 7.0  # component 0 was updated before component 1 raised
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(1, 2, 4)
def test_per_replica_args_and_kwargs_are_split_per_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(0.0)
    value = PerReplica([td.constant(float(i)) for i in range(n)])
    offset = PerReplica([td.constant(100.0 * i) for i in range(n)])
    seen = []

    def fn(component, x, scale, offset=None):
        seen.append((device_index(), float(x), scale, float(offset)))
        return component.assign(x * scale + offset)

    result = mirrored_strategy.extended.update(v, fn, args=[value, 10.0], kwargs={"offset": offset})
    assert seen == [(i, float(i), 10.0, 100.0 * i) for i in range(n)]
    assert values_of(v) == [110.0 * i for i in range(n)]
    assert local_floats(mirrored_strategy, result) == [110.0 * i for i in range(n)]


@pytest.mark.replicas(1, 2, 4)
def test_mirrored_args_are_split_per_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(0.0)
    value = Mirrored([td.constant(2.0 + i) for i in range(n)])
    mirrored_strategy.extended.update(v, lambda c, x: c.assign(x), args=(value,))
    assert values_of(v) == [2.0 + i for i in range(n)]


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("where", ["args", "kwargs"])
def test_per_replica_with_wrong_component_count_raises(mirrored_strategy, where):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    wrong = PerReplica([td.constant(float(i)) for i in range(n + 1)])
    args, kwargs = ((wrong,), None) if where == "args" else ((), {"x": wrong})
    with pytest.raises(ValueError, match="components"):
        mirrored_strategy.extended.update(v, lambda c, x: c.assign(x), args=args, kwargs=kwargs)
    assert values_of(v) == [5.0] * n
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(1, 2, 4)
def test_distributed_variable_args_are_passed_whole_and_write_their_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(0.0)
        other = td.Variable(0.0)
    received = []

    def fn(component, o):
        received.append(o)
        o.assign(10.0 * device_index())  # only this update context's component
        return o.read_value()

    result = mirrored_strategy.extended.update(v, fn, args=(other,))
    assert all(o is other for o in received) and len(received) == n
    assert values_of(other) == [10.0 * i for i in range(n)]
    assert values_of(v) == [0.0] * n
    assert local_floats(mirrored_strategy, result) == [10.0 * i for i in range(n)]


@pytest.mark.replicas(2, 4)
def test_distributed_variable_args_read_their_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(0.0)
        other = td.Variable(0.0)
    # A PerReplica assigned in cross-replica context desynchronises the copies (as in TensorFlow).
    other.assign(PerReplica([td.constant(float(i)) for i in range(n)]))
    assert values_of(other) == [float(i) for i in range(n)]

    def fn(component, o):
        assert o.device == td.distribute.get_update_device()
        return component.assign(o.read_value() * 2.0 + float(o))

    mirrored_strategy.extended.update(v, fn, args=(other,))
    assert values_of(v) == [3.0 * i for i in range(n)]


# --- update in replica context (through merge_call) -------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_update_in_replica_context_uses_each_replicas_argument(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(5.0)

    def step():
        value = td.constant(3.0 * rid())
        return mirrored_strategy.extended.update(
            v,
            lambda c, x: (c.assign(x), td.distribute.get_update_device(), td.distribute.in_cross_replica_context()),
            args=(value,),
        )

    result = mirrored_strategy.run(step)
    assert values_of(v) == [3.0 * i for i in range(n)]
    new_values, devices, cross_replica = result
    assert cross_replica is True  # fn runs once per component, in cross-replica context
    assert local_floats(mirrored_strategy, new_values) == [3.0 * i for i in range(n)]
    assert list(mirrored_strategy.experimental_local_results(devices)) == list(
        mirrored_strategy.extended.worker_devices
    )


@pytest.mark.replicas(2, 4)
def test_update_in_replica_context_splits_kwargs(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(0.0)

    def step():
        return mirrored_strategy.extended.update(v, lambda c, x=None: c.assign(x), kwargs={"x": td.constant(rid() + 10.0)})

    mirrored_strategy.run(step)
    assert values_of(v) == [10.0 + i for i in range(n)]


@pytest.mark.replicas(1, 2, 4)
def test_replica_context_update_writes_every_component(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(5.0)

    def replica_fn(var):
        value = td.identity(1.0)
        ctx = td.distribute.get_replica_context()
        ctx._update(var, lambda c, x: c.assign(x), args=(value,))

    assert mirrored_strategy.run(replica_fn, args=(v,)) is None
    assert values_of(v) == [1.0] * n


@pytest.mark.replicas(2, 4)
def test_replica_context_update_returns_this_replicas_part(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(0.0)

    def step():
        ctx = td.distribute.get_replica_context()
        return ctx._update(v, lambda c, x: c.assign(x), args=(td.constant(rid() + 0.5),))

    result = mirrored_strategy.run(step)
    assert local_floats(mirrored_strategy, result) == [i + 0.5 for i in range(n)]
    assert values_of(v) == [i + 0.5 for i in range(n)]


def test_update_in_one_device_run_goes_through_merge_call(one_device_cpu):
    with one_device_cpu.scope():
        v = td.Variable(1.0)

    def fn(component, x):
        return component.assign(x), td.distribute.get_update_device(), td.distribute.in_cross_replica_context()

    value, device, cross_replica = one_device_cpu.run(lambda: one_device_cpu.extended.update(v, fn, args=(5.0,)))
    assert float(value) == 5.0 and float(v) == 5.0
    assert device == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert cross_replica is True


def test_update_in_default_replica_context_runs_directly(default):
    var = td.Variable(1.0)
    ctx = td.distribute.get_replica_context()
    result = ctx._update(var, lambda c, x: (c.assign(x), td.distribute.get_update_device()), args=(7.0,))
    assert float(result[0]) == 7.0 and float(var) == 7.0
    assert result[1] == var.device


def test_update_inside_default_strategy_run(default):
    var = td.Variable(1.0)
    result = default.run(lambda: default.extended.update(var, lambda c, x: c.assign(x), args=(5.0,)))
    assert float(result) == 5.0
    assert float(var) == 5.0


def test_replica_context_update_inside_default_strategy_run(default):
    var = td.Variable(1.0)

    def step():
        td.distribute.get_replica_context()._update(var, lambda c, x: c.assign(x), args=(7.0,))

    assert default.run(step) is None
    assert float(var) == 7.0


def test_merge_call_inside_default_strategy_run_works(default):
    # merge_call, which update uses there, works in the default strategy's run too.
    assert default.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: 3)) == 3


# --- reduce_to then update, from a merge_call ----------------------------------------------


def _reduce_then_update(strategy, value, var):
    reduced = strategy.extended.reduce_to(ReduceOp.SUM, value, destinations=var)
    return strategy.extended.update(var, lambda v, x: v.assign(x), args=(reduced,))


def _merge_call_reduce_then_update(var):
    return td.distribute.get_replica_context().merge_call(_reduce_then_update, args=(td.identity(1.0), var))


@pytest.mark.replicas(1, 2, 4)
def test_reduce_to_then_update_sets_every_component_to_the_sum(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    result = mirrored_strategy.run(_merge_call_reduce_then_update, args=(v,))
    assert values_of(v) == [float(n)] * n
    assert local_floats(mirrored_strategy, result) == [float(n)] * n


def test_reduce_to_then_update_repr_on_two_replicas(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(5.0)
    mirrored_strategy.run(_merge_call_reduce_then_update, args=(v,))
    assert repr(v) == (
        "MirroredVariable:{\n"
        "  0: <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=2.0>,\n"
        "  1: <tf.Variable 'Variable/replica_1:0' shape=() dtype=float32, numpy=2.0>\n"
        "}"
    )


def test_reduce_to_then_update_on_one_device_writes_the_one_value():
    strategy = td.distribute.OneDeviceStrategy("CPU:0")
    with strategy.scope():
        v = td.Variable(5.0)
    strategy.run(_merge_call_reduce_then_update, args=(v,))
    assert repr(v) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"


def test_reduce_to_then_update_on_central_storage_writes_the_one_copy(central_storage_2cpu):
    with central_storage_2cpu.scope():
        v = td.Variable(5.0)
    central_storage_2cpu.run(_merge_call_reduce_then_update, args=(v,))
    assert repr(v) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=2.0>"
    assert central_storage_2cpu.experimental_local_results(v) == (v,)


# --- variable_created_in_scope --------------------------------------------------------------


def test_variable_created_in_scope_inside_and_outside_the_scope(any_strategy, default):
    with any_strategy.scope():
        inside = td.Variable(1.0)
    outside = td.Variable(1.0)
    assert any_strategy.extended.variable_created_in_scope(inside) is True
    if any_strategy is default:
        assert any_strategy.extended.variable_created_in_scope(outside) is True
    else:
        assert any_strategy.extended.variable_created_in_scope(outside) is False


def test_default_strategy_owns_only_variables_created_outside_any_scope(default, one_device_cpu, mirrored_strategy):
    plain = td.Variable(1.0)
    with default.scope():
        in_default_scope = td.Variable(1.0)
    with one_device_cpu.scope():
        one_device_var = td.Variable(1.0)
    with mirrored_strategy.scope():
        mirrored_var = td.Variable(1.0)
    created_in = default.extended.variable_created_in_scope
    assert [created_in(x) for x in (plain, in_default_scope, one_device_var, mirrored_var)] == [
        True,
        True,
        False,
        False,
    ]
    assert one_device_cpu.extended.variable_created_in_scope(mirrored_var) is False
    assert mirrored_strategy.extended.variable_created_in_scope(one_device_var) is False


@pytest.mark.replicas(2, 4)
def test_variable_created_inside_run_is_created_in_scope(mirrored_strategy, other_mirrored_strategy):
    v = mirrored_strategy.run(lambda: td.Variable(1.0, name="made_in_run"))
    assert mirrored_strategy.extended.variable_created_in_scope(v) is True
    assert other_mirrored_strategy.extended.variable_created_in_scope(v) is False


# --- non_slot_devices / update_non_slot -----------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_non_slot_devices_of_mirrored_are_its_worker_devices(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    assert mirrored_strategy.extended.non_slot_devices([v]) == mirrored_strategy.extended.worker_devices


def test_non_slot_devices_of_default_is_the_variable_with_the_smallest_name(default):
    b = td.Variable(1.0, name="b")
    a = td.Variable(2.0, name="a")
    c = td.Variable(3.0, name="c")
    assert default.extended.non_slot_devices([b, a, c]) is a
    assert default.extended.non_slot_devices([c, b]) is b
    with pytest.raises(ValueError):
        default.extended.non_slot_devices([])


def test_non_slot_devices_of_one_device_is_its_device(one_device_cpu):
    with one_device_cpu.scope():
        v = td.Variable(1.0)
    assert one_device_cpu.extended.non_slot_devices([v]) == ("/job:localhost/replica:0/task:0/device:CPU:0",)


@pytest.mark.replicas(1, 2, 4)
def test_update_non_slot_returns_mirrored_per_device(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    colocate_with = mirrored_strategy.extended.non_slot_devices([v])
    result = mirrored_strategy.extended.update_non_slot(colocate_with, lambda: td.constant(1.0))
    if n == 1:
        assert not isinstance(result, td.distribute.DistributedValues)
        assert float(result) == 1.0
    else:
        assert type(result) is Mirrored
        assert [float(x) for x in result.values] == [1.0] * n
    ungrouped = mirrored_strategy.extended.update_non_slot(colocate_with, lambda: td.constant(1.0), group=False)
    assert type(ungrouped) is tuple and [float(x) for x in ungrouped] == [1.0] * n
    devices = mirrored_strategy.extended.update_non_slot(colocate_with, td.distribute.get_update_device, group=False)
    assert devices == mirrored_strategy.extended.worker_devices


@pytest.mark.replicas(2, 4)
def test_update_non_slot_splits_per_replica_args(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    colocate_with = mirrored_strategy.extended.non_slot_devices([v])
    value = PerReplica([td.constant(float(i)) for i in range(n)])
    result = mirrored_strategy.extended.update_non_slot(
        colocate_with, lambda x, k=0.0: x * 2.0 + k, args=(value,), kwargs={"k": 1.0}
    )
    assert local_floats(mirrored_strategy, result) == [2.0 * i + 1.0 for i in range(n)]


@pytest.mark.replicas(1, 2, 4)
def test_update_non_slot_in_replica_context_raises(mirrored_strategy):
    colocate_with = mirrored_strategy.extended.non_slot_devices([])
    calls = []

    def step():
        return mirrored_strategy.extended.update_non_slot(colocate_with, lambda: calls.append(1))

    with pytest.raises(ContextError, match="cross-replica context") as info:
        mirrored_strategy.run(step)
    assert isinstance(info.value, RuntimeError)
    assert calls == []
    assert_strategy_works(mirrored_strategy)


def test_update_non_slot_on_default_and_one_device(default, one_device_cpu):
    plain = td.Variable(1.0)
    assert (
        default.extended.update_non_slot(default.extended.non_slot_devices([plain]), td.distribute.get_update_device)
        == plain.device
    )
    with one_device_cpu.scope():
        v = td.Variable(1.0)
    colocate_with = one_device_cpu.extended.non_slot_devices([v])
    assert one_device_cpu.extended.update_non_slot(colocate_with, lambda: td.constant(4.0)) == 4.0
    assert one_device_cpu.extended.update_non_slot(colocate_with, td.distribute.get_update_device, group=False) == (
        "/job:localhost/replica:0/task:0/device:CPU:0",
    )


@pytest.mark.parametrize("colocate_with", [np.array(1.0), np.zeros((2, 3), np.float32), 7, None],
                         ids=["0-d array", "array", "int", "None"])
def test_default_update_non_slot_calls_fn_once_for_any_colocate_with(default, colocate_with):
    calls = []
    assert default.extended.update_non_slot(colocate_with, lambda: calls.append(1) or 5) == 5
    assert calls == [1]


def test_default_update_non_slot_of_an_array_names_the_host(default):
    device = default.extended.update_non_slot(np.array(1.0), td.distribute.get_update_device)
    assert device == "/job:localhost/replica:0/task:0/device:CPU:0"


def test_non_slot_step_counter_pattern(any_strategy):
    """A step counter colocated with non_slot_devices() and advanced by update_non_slot()."""
    with any_strategy.scope():
        w = td.Variable(1.0, name="w")
        colocate_with = any_strategy.extended.non_slot_devices([w])
        with any_strategy.extended.colocate_vars_with(colocate_with):
            step = td.Variable(0, name="step")
    for _ in range(3):
        any_strategy.extended.update_non_slot(colocate_with, lambda: step.assign_add(1))
    expected = [3] * any_strategy.num_replicas_in_sync
    assert [int(x) for x in values_of(step)] == expected
    assert np.asarray(step.value()).dtype == np.int32


# --- colocate_vars_with -----------------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_colocate_vars_with_places_variables_with_the_given_one(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
        with mirrored_strategy.extended.colocate_vars_with(v):
            slot = td.Variable(0.0, name="slot")
            slot2 = td.Variable(0.0, name="slot2")
    for s in (slot, slot2):
        assert type(s) is type(v)
        assert s._devices == v._devices
        assert [c.device for c in s.values] == [c.device for c in v.values]
    # the docstring's use: update(var1, fn, args=(var2,)) finds each slot component next to var1's
    mirrored_strategy.extended.update(v, lambda c, s: s.assign(c.read_value() + float(device_index())), args=(slot,))
    assert values_of(slot) == [1.0 + i for i in range(mirrored_strategy.num_replicas_in_sync)]


@pytest.mark.replicas(1, 2, 4)
def test_colocate_vars_with_accepts_non_slot_devices(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
        with mirrored_strategy.extended.colocate_vars_with(mirrored_strategy.extended.non_slot_devices([v])):
            counter = td.Variable(0, name="counter")
    assert counter._devices == v._devices


@pytest.mark.replicas(2, 4)
def test_colocate_vars_with_inside_run(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)

    def step():
        with mirrored_strategy.extended.colocate_vars_with(v):
            return td.Variable(2.0, name="made_in_run")

    slot = mirrored_strategy.run(step)
    assert slot._devices == v._devices
    assert values_of(slot) == [2.0] * mirrored_strategy.num_replicas_in_sync


def test_colocate_vars_with_on_default_strategy_follows_the_variables_device(default):
    with td.device("CPU:3"):
        target = td.Variable(1.0)
    assert target.device == "/job:localhost/replica:0/task:0/device:CPU:3"
    with default.extended.colocate_vars_with(target):
        slot = td.Variable(0.0)
    after = td.Variable(0.0)
    assert slot.device == target.device
    assert after.device != target.device


@pytest.mark.replicas(2, 4)
def test_colocate_vars_with_rejects_variables_of_another_strategy(mirrored_strategy, other_mirrored_strategy):
    with other_mirrored_strategy.scope():
        foreign = td.Variable(1.0)
    plain = td.Variable(1.0)
    with mirrored_strategy.scope():
        with pytest.raises(ValueError, match=COLOCATE_ERROR):
            mirrored_strategy.extended.colocate_vars_with(foreign)
        with pytest.raises(ValueError, match=COLOCATE_ERROR):
            mirrored_strategy.extended.colocate_vars_with(plain)
        with pytest.raises(ValueError, match=COLOCATE_ERROR):
            mirrored_strategy.extended.colocate_vars_with(foreign.values[0])
        ok = td.Variable(1.0)  # the scope is still usable
    assert type(ok).__name__ == "MirroredVariable"
    assert_strategy_works(mirrored_strategy)


def test_colocate_vars_with_rejects_non_slot_devices_of_another_strategy(mirrored_strategy):
    four_replicas = mirrored_strategy_for(4)
    with four_replicas.scope():
        with pytest.raises(ValueError, match=COLOCATE_ERROR):
            four_replicas.extended.colocate_vars_with(mirrored_strategy.extended.non_slot_devices([]))


@pytest.mark.replicas(1, 2, 4)
def test_colocate_vars_with_outside_the_scope_raises(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    with pytest.raises(ContextError):
        mirrored_strategy.extended.colocate_vars_with(v)


def test_colocation_does_not_leak_to_another_strategy(default, one_device_cpu, mirrored_strategy):
    with td.device("CPU:3"):
        target = td.Variable(1.0)
    with default.extended.colocate_vars_with(target):
        with mirrored_strategy.scope():
            mirrored = td.Variable(1.0)
        with one_device_cpu.scope():
            single = td.Variable(1.0)
        colocated = td.Variable(1.0)
    assert [c.device for c in mirrored.values] == list(mirrored_strategy.extended.worker_devices)
    assert single.device == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert colocated.device == target.device


def test_colocation_block_exits_cleanly_on_exception(default):
    with td.device("CPU:3"):
        target = td.Variable(1.0)
    with pytest.raises(KeyError):
        with default.extended.colocate_vars_with(target):
            raise KeyError("inside")
    after = td.Variable(0.0)
    assert after.device != target.device
    with default.extended.colocate_vars_with(target):
        again = td.Variable(0.0)
    assert again.device == target.device


# --- value_container / read_var ----------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_value_container_gives_the_distributed_variable(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    extended = mirrored_strategy.extended
    assert all(extended.value_container(c) is v for c in v.values)
    assert extended.value_container(v) is v
    array = np.ones(3, np.float32)
    assert extended.value_container(array) is array
    plain = td.Variable(1.0)
    assert extended.value_container(plain) is plain


def test_value_container_d_3_11(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    assert mirrored_strategy.extended.value_container(v.values[1]) is v
    tensor = td.constant(2.0)
    assert mirrored_strategy.extended.value_container(tensor) is tensor


@pytest.mark.replicas(1, 2, 4)
def test_read_var_of_mirrored_variable_is_a_copy(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(np.array([1.0, 2.0], np.float32))
    value = mirrored_strategy.extended.read_var(v)
    np.testing.assert_array_equal(value, [1.0, 2.0])
    assert value.dtype == np.float32
    assert not isinstance(value, td.Variable)
    assert all(value is not c._array for c in v.values)
    v.assign([5.0, 6.0])
    np.testing.assert_array_equal(value, [1.0, 2.0])


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize(
    "aggregation, expected",
    [
        (td.VariableAggregation.SUM, lambda n: sum(1.0 + i for i in range(n))),
        (td.VariableAggregation.MEAN, lambda n: sum(1.0 + i for i in range(n)) / n),
        (td.VariableAggregation.ONLY_FIRST_REPLICA, lambda n: 1.0),
    ],
    ids=["sum", "mean", "only_first"],
)
def test_read_var_of_sync_on_read_variable_is_the_aggregate(mirrored_strategy, aggregation, expected):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(0.0, synchronization=ON_READ, aggregation=aggregation)
    mirrored_strategy.run(lambda: v.assign(td.constant(1.0 + rid())))
    assert float(mirrored_strategy.extended.read_var(v)) == pytest.approx(expected(n))


def test_read_var_of_a_mirrored_variable_in_a_replica_is_its_copy(mirrored_strategy):
    # TensorFlow 2.21, 2 CPU replicas, tf.Variable(1.0) in scope: read_var in run gives [1.0, 1.0].
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
        plain_in_scope = td.Variable([1.0, 2.0], synchronization=td.VariableSynchronization.ON_WRITE)
    result = mirrored_strategy.run(lambda: mirrored_strategy.extended.read_var(v))
    assert [float(x) for x in mirrored_strategy.experimental_local_results(result)] == [1.0, 1.0]
    result = mirrored_strategy.run(lambda: mirrored_strategy.extended.read_var(plain_in_scope) * (1.0 + rid()))
    assert [x.tolist() for x in mirrored_strategy.experimental_local_results(result)] == [[1.0, 2.0], [2.0, 4.0]]


def test_read_var_of_a_mirrored_variable_under_another_scope_is_its_value(mirrored_strategy):
    # TensorFlow 2.21: 1.0 under a OneDeviceStrategy's scope.
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    with td.distribute.OneDeviceStrategy("/cpu:0").scope():
        assert float(mirrored_strategy.extended.read_var(v)) == 1.0


@pytest.mark.parametrize("aggregation", [td.VariableAggregation.SUM, td.VariableAggregation.MEAN], ids=["sum", "mean"])
def test_read_var_of_a_sync_on_read_variable_in_a_replica_raises(mirrored_strategy, aggregation):
    # TensorFlow 2.21: RuntimeError "Method requires being in cross-replica context".
    with mirrored_strategy.scope():
        v = td.Variable(2.0, synchronization=ON_READ, aggregation=aggregation)

    def replica_fn():
        with pytest.raises(td.errors.ContextError, match="^StrategyExtended.read_var\\(\\) must be called in cross-replica"):
            mirrored_strategy.extended.read_var(v)

    mirrored_strategy.run(replica_fn)


def test_read_var_of_a_sync_on_read_variable_under_another_scope_raises(mirrored_strategy):
    # TensorFlow 2.21: RuntimeError "Mixing different tf.distribute.Strategy objects".
    with mirrored_strategy.scope():
        v = td.Variable(2.0, synchronization=ON_READ, aggregation=td.VariableAggregation.SUM)
    with td.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(RuntimeError, match="^Mixing different strategies: StrategyExtended.read_var"):
            mirrored_strategy.extended.read_var(v)
    assert float(mirrored_strategy.extended.read_var(v)) == 4.0  # TF: 2.0 on each of 2 replicas, summed


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("in_scope", [True, False], ids=["in_scope", "outside_scope"])
def test_update_of_a_plain_variable_raises_validation_error(mirrored_strategy, in_scope):
    plain = td.Variable(1.0)
    calls = []
    with maybe_scope(mirrored_strategy, in_scope):
        with pytest.raises(ValidationError) as info:
            mirrored_strategy.extended.update(plain, lambda c: calls.append(c))
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)
    assert calls == [] and float(plain) == 1.0
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(1, 2, 4)
def test_update_of_another_strategys_variable_raises(mirrored_strategy, other_mirrored_strategy):
    with other_mirrored_strategy.scope():
        foreign = td.Variable(1.0)
    with pytest.raises(ValidationError):
        mirrored_strategy.extended.update(foreign, lambda c: c.assign(2.0))
    with mirrored_strategy.scope():
        with pytest.raises(ValidationError):
            mirrored_strategy.extended.update(foreign, lambda c: c.assign(2.0))
    assert values_of(foreign) == [1.0, 1.0]
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(2, 4)
def test_update_of_another_strategys_variable_in_replica_context_raises(mirrored_strategy, other_mirrored_strategy):
    with other_mirrored_strategy.scope():
        foreign = td.Variable(1.0, aggregation=SUM)
    with pytest.raises(ValidationError):
        mirrored_strategy.run(lambda: mirrored_strategy.extended.update(foreign, lambda c: c.assign(2.0)))
    assert values_of(foreign) == [1.0, 1.0]
    assert_strategy_works(mirrored_strategy)


def test_update_inside_another_strategys_scope_raises(mirrored_strategy, other_mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    with other_mirrored_strategy.scope():
        with pytest.raises(ContextError):
            mirrored_strategy.extended.update(v, lambda c: c.assign(2.0))
    assert values_of(v) == [1.0, 1.0]
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(1, 2, 4)
def test_update_args_must_be_a_list_or_tuple(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    with pytest.raises(ValueError, match="list or tuple"):
        mirrored_strategy.extended.update(v, lambda c, x: c.assign(x), args=td.constant(2.0))
    with pytest.raises(ValueError, match="list or tuple"):
        mirrored_strategy.extended.update_non_slot(
            mirrored_strategy.extended.non_slot_devices([v]), lambda x: x, args=2.0
        )
    assert values_of(v) == [1.0] * mirrored_strategy.num_replicas_in_sync
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(1, 2, 4)
def test_update_kwargs_must_be_a_dict(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    with pytest.raises(TypeError, match="dict"):
        mirrored_strategy.extended.update(v, lambda c, x=None: c.assign(x), kwargs=[("x", 2.0)])
    with pytest.raises(TypeError, match="dict"):
        mirrored_strategy.extended.update_non_slot(
            mirrored_strategy.extended.non_slot_devices([v]), lambda x=None: x, kwargs=[("x", 2.0)]
        )
    assert values_of(v) == [1.0] * mirrored_strategy.num_replicas_in_sync
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(2, 4)
def test_bad_update_arguments_in_replica_context_raise(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)
    with pytest.raises(ValueError, match="list or tuple"):
        mirrored_strategy.run(lambda: mirrored_strategy.extended.update(v, lambda c, x: c.assign(x), args=td.constant(2.0)))
    with pytest.raises(TypeError, match="dict"):
        mirrored_strategy.run(lambda: mirrored_strategy.extended.update(v, lambda c: c, kwargs=["x"]))
    assert values_of(v) == [1.0] * mirrored_strategy.num_replicas_in_sync
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(2, 4)
def test_error_inside_fn_in_replica_context_propagates(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0)

    def step():
        return mirrored_strategy.extended.update(v, lambda c: 1 / 0)

    with pytest.raises(ZeroDivisionError):
        mirrored_strategy.run(step)
    assert td.distribute.get_update_device() is None
    assert_strategy_works(mirrored_strategy)


# --- the full "How to update a variable" pattern of the StrategyExtended docs ---------------


@pytest.mark.replicas(2, 4)
def test_batch_reduce_to_then_update_in_merge_call_matches_numpy_gradient_descent(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal(3).astype(np.float32)
    b0 = np.float32(0.5)
    steps = [rng.standard_normal((n, 3)).astype(np.float32) for _ in range(3)]
    lr = np.float32(0.05)
    with mirrored_strategy.scope():
        w = td.Variable(w0)
        b = td.Variable(b0)

    def apply_gradients(strategy, grads_and_vars):
        reduced = strategy.extended.batch_reduce_to(ReduceOp.SUM, grads_and_vars)
        for grad, (_, var) in zip(reduced, grads_and_vars):
            strategy.extended.update(var, lambda c, g: c.assign_sub(lr * g), args=(grad,))

    def step(x):
        grad_w = w * x  # d/dw of 0.5 * sum(w**2 * x)
        grad_b = td.reduce_sum(x)
        td.distribute.get_replica_context().merge_call(apply_gradients, args=([(grad_w, w), (grad_b, b)],))

    ref_w, ref_b = w0.copy(), b0
    for xs in steps:
        mirrored_strategy.run(step, args=(PerReplica([td.constant(x) for x in xs]),))
        ref_w = ref_w - lr * np.sum(ref_w * xs, axis=0, dtype=np.float32)
        ref_b = ref_b - lr * np.sum(xs, dtype=np.float32)
    w_parts = [np.asarray(c.value()) for c in w.values]
    b_parts = [float(np.asarray(c.value())) for c in b.values]
    for part in w_parts[1:]:
        np.testing.assert_array_equal(part, w_parts[0])
    assert len(set(b_parts)) == 1
    np.testing.assert_allclose(w_parts[0], ref_w, rtol=1e-5)
    assert b_parts[0] == pytest.approx(float(ref_b), rel=1e-5)


@pytest.mark.replicas(1, 2, 4)
def test_reduce_to_then_assign_add_in_merge_call_adds_the_summed_update(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    with mirrored_strategy.scope():
        v = td.Variable(np.zeros(2, np.float32))

    def merge_fn(strategy, update, var):
        reduced = strategy.extended.reduce_to("sum", update, var)
        return strategy.extended.update(var, lambda c, u: c.assign_add(u), args=(reduced,))

    def step():
        update = td.constant(np.array([1.0, float(rid())], np.float32))
        return td.distribute.get_replica_context().merge_call(merge_fn, args=(update, v))

    mirrored_strategy.run(step)
    expected = [float(n), float(sum(range(n)))]
    for c in v.values:
        np.testing.assert_array_equal(np.asarray(c.value()), expected)


def test_one_device_update_names_the_strategys_device(one_device_cpu):
    strategy = td.distribute.OneDeviceStrategy("CPU:1")
    var = td.Variable(1.0)  # made outside the scope, on CPU:0
    assert strategy.extended.update(var, lambda c: td.distribute.get_update_device()).endswith("CPU:1")


def test_update_non_slot_checks_per_replica_component_counts(mirrored_strategy):
    devices = mirrored_strategy.extended.non_slot_devices([])
    with pytest.raises(ValueError, match="PerReplica with 3 components"):
        mirrored_strategy.extended.update_non_slot(devices, lambda x: x, args=(td.distribute.PerReplica([1, 2, 3]),))


def test_replicas_updating_different_variables_raise(mirrored_strategy):
    with mirrored_strategy.scope():
        v, w = td.Variable(0.0, name="v"), td.Variable(0.0, name="w")

    def step():
        ctx = td.distribute.get_replica_context()
        target = v if int(ctx.replica_id_in_sync_group) == 0 else w
        mirrored_strategy.extended.update(target, lambda c, x: c.assign(x), args=(1.0,))

    with pytest.raises(ValueError, match=r"called by the replicas with different variables \(v:0, w:0"):
        mirrored_strategy.run(step)
    assert [float(c.numpy()) for c in v.values] == [0.0, 0.0] and [float(c.numpy()) for c in w.values] == [0.0, 0.0]


def test_read_var_of_a_sync_on_read_variable_needs_cross_replica_context(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(1.0, synchronization=ON_READ, aggregation=td.VariableAggregation.SUM)
    with pytest.raises(ContextError, match=r"StrategyExtended.read_var\(\) must be called in cross-replica context"):
        mirrored_strategy.run(lambda: mirrored_strategy.extended.read_var(v))
    assert float(mirrored_strategy.extended.read_var(v)) == 2.0
