"""The TF 1.x tower dialect: its errors, each followed by a successful step on the same strategy."""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
import towerdist.compat.v1 as tf
from towerdist._src.variables.distributed_variable import MirroredVariable

import compat_v1_helpers
from compat_v1_helpers import TOWER_COUNTS, assert_usable, per_tower_arrays, tower, tower_values

# The helpers' fixtures, by name (an import would read as unused)
fresh_warnings = compat_v1_helpers.fresh_warnings
strategy = compat_v1_helpers.strategy

# The tower-era names warn on purpose; the tests of the warnings record them explicitly.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# --- 6. errors leave the strategy usable ---------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_reduce_inside_a_tower_is_a_context_error(n):
    strategy = tower(n)

    def fn():
        return strategy.reduce("sum", np.float32(1.0))

    with pytest.raises(td.errors.ContextError, match="merge_call") as info:
        strategy.call_for_each_tower(fn)
    assert isinstance(info.value, RuntimeError)
    assert_usable(strategy)


def test_call_for_each_tower_inside_a_tower_is_a_context_error():
    strategy = tower(2)
    with pytest.raises(td.errors.ContextError):
        strategy.call_for_each_tower(lambda: strategy.call_for_each_tower(lambda: 1))
    assert_usable(strategy)


@pytest.mark.parametrize("as_keyword", [False, True])
def test_a_per_replica_argument_of_the_wrong_size_is_named_as_runs_error(as_keyword):
    strategy = tower(2)
    wrong = td.distribute.PerReplica([np.float32(1.0), np.float32(2.0), np.float32(3.0)])
    where = "kwargs['x']" if as_keyword else "args[0]"
    with pytest.raises(ValueError) as info:
        if as_keyword:
            strategy.call_for_each_tower(lambda x: x, x=wrong)
        else:
            strategy.call_for_each_tower(lambda x: x, wrong)
    assert str(info.value).startswith(f"Strategy.run() got a PerReplica with 3 components at {where}, but ")
    assert_usable(strategy)


@pytest.mark.parametrize("api", ["reduce", "batch_reduce", "tower_local_var_scope"])
def test_unknown_method_string_is_a_value_error_naming_it(api):
    strategy = tower(2)
    value = per_tower_arrays(strategy)
    with strategy.scope():
        with pytest.raises(ValueError, match="'max'"):
            if api == "reduce":
                strategy.reduce("max", value)
            elif api == "batch_reduce":
                strategy.batch_reduce("max", [(value, None)])
            else:
                with strategy.tower_local_var_scope("max"):
                    pass
    assert_usable(strategy)


def test_update_with_a_per_tower_argument_is_a_type_error():
    strategy = tower(2)
    with strategy.scope():
        var = tf.Variable(1.0)
    per_tower = per_tower_arrays(strategy)
    with pytest.raises(TypeError, match="mirrored"):
        strategy.update(var, lambda v, x: v.assign_add(x), per_tower)
    assert [float(c) for c in strategy.unwrap(var)] == [1.0, 1.0]
    with pytest.raises(TypeError, match="mirrored"):
        strategy.map([1, 2], lambda x, y: x, per_tower)
    assert_usable(strategy)


def test_tower_local_var_scope_outside_the_scope_is_a_context_error():
    strategy = tower(2)
    with pytest.raises(td.errors.ContextError, match="scope"):
        with strategy.tower_local_var_scope("sum"):
            pass
    # Nothing leaked: a variable created afterwards in the scope is mirrored.
    with strategy.scope():
        var = tf.Variable(1.0)
    assert isinstance(var, MirroredVariable)
    assert_usable(strategy)


@pytest.mark.parametrize("pair", ["single", "triple", "bare"])
def test_batch_reduce_with_a_malformed_pair_is_a_value_error(pair):
    strategy = tower(2)
    value = per_tower_arrays(strategy)
    malformed = {"single": (value,), "triple": (value, None, None), "bare": value}[pair]
    with pytest.raises(ValueError, match="value_destination_pairs"):
        strategy.batch_reduce("sum", [(value, None), malformed])
    assert_usable(strategy)


def test_reduce_refuses_an_axis_passed_as_destinations():
    strategy = tower(2)
    value = per_tower_arrays(strategy)
    with pytest.raises(ValueError, match="destinations must be one of.*axis="):
        strategy.reduce("sum", value, destinations=0)
    with pytest.raises(ValueError, match="destinations must be one of"):
        strategy.reduce("sum", value, destinations=object())
    with pytest.raises(ValueError, match="not both"):
        strategy.reduce("sum", value, 0, destinations="/cpu:0")
    np.testing.assert_array_equal(strategy.unwrap(strategy.reduce("sum", value))[0], sum(tower_values(2)))


@pytest.mark.parametrize("n", TOWER_COUNTS)
def test_reduce_takes_tf2s_axis_form_as_its_parent_does(n):
    # The subclass keeps td.distribute.Strategy.reduce's contract: reduce(op, value, axis).
    strategy = tower(n)
    value = per_tower_arrays(strategy)
    parent = td.distribute.MirroredStrategy.reduce
    for op in (td.distribute.ReduceOp.SUM, td.distribute.ReduceOp.MEAN, "SUM", "sum"):
        for axis in (0, (0,), np.int64(0)):
            np.testing.assert_allclose(strategy.reduce(op, value, axis), parent(strategy, op, value, axis))
            np.testing.assert_allclose(strategy.reduce(op, value, axis=axis), parent(strategy, op, value, axis))
    for op in (td.distribute.ReduceOp.SUM, "SUM", "MEAN"):
        expected = parent(strategy, op, value, None)
        np.testing.assert_allclose(strategy.reduce(op, value, axis=None), expected)
        assert not isinstance(strategy.reduce(op, value, axis=None), td.distribute.DistributedValues)
    # None with a ReduceOp is TF 2's axis=None; with a TF 1.x method string, TF 1.x's destinations.
    np.testing.assert_allclose(strategy.reduce(td.distribute.ReduceOp.SUM, value, None), sum(tower_values(n)))
    tf1 = strategy.reduce("sum", value, None)
    assert strategy.unwrap(tf1) and all(np.allclose(x, sum(tower_values(n))) for x in strategy.unwrap(tf1))
    assert_usable(strategy)


def test_fetch_refuses_a_per_tower_value():
    strategy = tower(2)
    value = per_tower_arrays(strategy)
    with pytest.raises(TypeError, match="(?s)per-tower value.*Reduce it first"):
        strategy.fetch(value)
    np.testing.assert_array_equal(strategy.fetch(strategy.reduce("sum", value)), sum(tower_values(2)))
