"""``Strategy.reduce`` and ``Strategy.gather``, as observed in TensorFlow 2.21.

Expected values are computed with numpy from the same per-replica data, so every
replica count checks the rule, not a remembered number.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td


def per_replica(strategy, make):
    """A PerReplica whose component i is ``make(i)``."""
    return strategy.experimental_distribute_values_from_function(lambda ctx: make(ctx.replica_id_in_sync_group))


def scaled(i: int) -> np.ndarray:
    """Replica r holds [1, 2] * (r + 1)."""
    return np.array([1.0, 2.0], dtype=np.float32) * (i + 1)


def partial_batch(i: int) -> np.ndarray:
    """range(6.) batched by 6 over 4 replicas: [[0,1],[2,3],[4,5],[]]."""
    return np.arange(6, dtype=np.float32)[2 * i : 2 * i + 2]


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_reduce_axis_none_is_element_wise(mirrored_strategy, op):
    n = mirrored_strategy.num_replicas_in_sync
    stacked = np.stack([scaled(i) for i in range(n)])
    expected = stacked.sum(axis=0) if op == "SUM" else stacked.mean(axis=0)
    result = mirrored_strategy.reduce(op, per_replica(mirrored_strategy, scaled), axis=None)
    np.testing.assert_allclose(result, expected, rtol=1e-6)
    assert result.dtype == np.float32


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_reduce_along_axis_is_global(mirrored_strategy, op):
    n = mirrored_strategy.num_replicas_in_sync
    everything = np.concatenate([scaled(i) for i in range(n)])
    expected = everything.sum() if op == "SUM" else everything.mean()
    result = mirrored_strategy.reduce(op, per_replica(mirrored_strategy, scaled), axis=0)
    np.testing.assert_allclose(result, expected, rtol=1e-6)


@pytest.mark.replicas(4)
def test_sum_and_mean_with_and_without_axis_on_four_replicas(mirrored_strategy):
    value = per_replica(mirrored_strategy, scaled)
    np.testing.assert_array_equal(mirrored_strategy.reduce("SUM", value, None), [10.0, 20.0])
    np.testing.assert_array_equal(mirrored_strategy.reduce("MEAN", value, None), [2.5, 5.0])
    assert mirrored_strategy.reduce("SUM", value, 0) == 30.0
    assert mirrored_strategy.reduce("MEAN", value, 0) == 3.75


@pytest.mark.replicas(4)
@pytest.mark.parametrize("axis", [0, -1, (0,), [0]])
def test_partial_batch_mean_divides_by_the_global_count(mirrored_strategy, axis):
    value = per_replica(mirrored_strategy, partial_batch)
    assert mirrored_strategy.reduce("MEAN", value, axis=axis) == 2.5  # 15 / 6, the empty replica adds nothing
    assert mirrored_strategy.reduce("SUM", value, axis=axis) == 15.0


@pytest.mark.replicas(4)
def test_partial_batch_with_axis_none_is_a_shape_error(mirrored_strategy):
    value = per_replica(mirrored_strategy, partial_batch)
    with pytest.raises(td.errors.InvalidArgumentError, match="same shape and dtype") as info:
        mirrored_strategy.reduce("MEAN", value, axis=None)
    assert "replica 3 has shape (0,)" in str(info.value)
    assert mirrored_strategy.reduce("SUM", value, axis=0) == 15.0


def test_reduce_over_several_axes(mirrored_strategy):
    value = per_replica(mirrored_strategy, lambda i: np.arange(6, dtype=np.float64).reshape(2, 3) + 10 * i)
    everything = np.stack([np.arange(6.0).reshape(2, 3) + 10 * i for i in range(2)])
    assert mirrored_strategy.reduce("SUM", value, axis=(0, 1)) == everything.sum()
    np.testing.assert_allclose(mirrored_strategy.reduce("MEAN", value, axis=1), everything.sum(axis=(0, 2)) / 6)


@pytest.mark.parametrize("spelling", ["sum", "Sum", "SUM", td.distribute.ReduceOp.SUM])
def test_reduce_op_spellings(mirrored_strategy, spelling):
    value = per_replica(mirrored_strategy, scaled)
    np.testing.assert_array_equal(mirrored_strategy.reduce(spelling, value, None), scaled(0) + scaled(1))


@pytest.mark.replicas(4)
def test_integer_sum_stays_integer_and_mean_is_float64(mirrored_strategy):
    ids = mirrored_strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    total = mirrored_strategy.reduce("SUM", ids, axis=None)
    assert total == 6 and total.dtype == np.int32
    mean = mirrored_strategy.reduce("MEAN", ids, axis=None)
    assert mean == 1.5 and mean.dtype == np.float64
    batch = per_replica(mirrored_strategy, lambda i: np.array([i, i + 1], dtype=np.int32))
    axis_mean = mirrored_strategy.reduce("MEAN", batch, axis=0)
    assert axis_mean == np.mean([0, 1, 1, 2, 2, 3, 3, 4]) and axis_mean.dtype == np.float64


def test_reduce_of_identity_of_replica_ids_is_an_int32_sum(mirrored_strategy):
    per_replica = mirrored_strategy.run(lambda: td.identity(td.distribute.get_replica_context().replica_id_in_sync_group))
    reduced = mirrored_strategy.reduce("SUM", per_replica, axis=None)
    assert reduced == 1 and reduced.dtype == np.int32


def test_integer_sum_is_exact_beyond_float_precision(mirrored_strategy):
    big = 2**53 + 1
    value = per_replica(mirrored_strategy, lambda i: np.array([big], dtype=np.int64))
    assert mirrored_strategy.reduce("SUM", value, None)[0] == 2 * big


@pytest.mark.replicas(2, 4)
def test_non_distributed_mean_returns_the_value(mirrored_strategy):
    value = td.constant(3.0)
    assert mirrored_strategy.reduce("MEAN", value, axis=None) is value


@pytest.mark.replicas(2, 4)
def test_non_distributed_sum_is_ambiguous(mirrored_strategy):
    with pytest.raises(ValueError, match="A non-DistributedValues value"):
        mirrored_strategy.reduce("SUM", td.constant(3.0), axis=None)
    with pytest.raises(ValueError, match="A non-DistributedValues value"):
        mirrored_strategy.reduce("SUM", np.zeros(2), axis=None)


@pytest.mark.replicas(1)
def test_non_distributed_sum_on_one_replica_is_the_value(mirrored_strategy):
    assert mirrored_strategy.reduce("SUM", td.constant(3.0), axis=None) == 3.0


@pytest.mark.replicas(4)
def test_non_distributed_value_along_axis_counts_once_per_replica(mirrored_strategy):
    """As TensorFlow: reduce('SUM', [3, 4], axis=0) on 4 replicas is 28."""
    assert mirrored_strategy.reduce("SUM", td.constant([3.0, 4.0]), axis=0) == 28.0
    assert mirrored_strategy.reduce("MEAN", td.constant([3.0, 4.0]), axis=0) == 3.5


def test_nested_structures_are_reduced_leaf_by_leaf(mirrored_strategy):
    value = per_replica(mirrored_strategy, scaled)
    result = mirrored_strategy.reduce("SUM", (value, {"b": value}), axis=None)
    assert isinstance(result, tuple) and set(result[1]) == {"b"}
    np.testing.assert_array_equal(result[1]["b"], scaled(0) + scaled(1))


# With an axis, TensorFlow 2.21 reduces one tensor per replica (tf.reduce_sum of the replica's
# value): a tuple or list is stacked, a dict raises TypeError. Goldens: MirroredStrategy over
# 2 CPUs, the default strategy, OneDeviceStrategy and a one-worker MultiWorkerMirroredStrategy.
def _pair(i: int) -> tuple:
    return (np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32))


def _ragged(i: int) -> tuple:
    return (np.array([1.0, 2.0], np.float32), np.array([3.0], np.float32))


def _as_given(strategy, make, kind):
    if kind == "per_replica":
        return per_replica(strategy, make)
    if kind == "run":
        return strategy.run(lambda: make(0))
    return make(0)


@pytest.mark.replicas(2)
@pytest.mark.parametrize("kind", ["per_replica", "run", "plain"])
@pytest.mark.parametrize(("make", "golden"), [(_pair, [8.0, 12.0]), (lambda i: [np.array([1.0, 2.0], np.float32)], [2.0, 4.0])])
def test_a_tuple_along_an_axis_is_stacked_as_in_tensorflow(mirrored_strategy, kind, make, golden):
    result = mirrored_strategy.reduce("SUM", _as_given(mirrored_strategy, make, kind), axis=0)
    np.testing.assert_array_equal(result, golden)


@pytest.mark.parametrize("name", ["default", "one_device_cpu"])
@pytest.mark.parametrize("kind", ["per_replica", "run", "plain"])
def test_a_tuple_along_an_axis_on_one_replica(request, name, kind):
    strategy = request.getfixturevalue(name)
    np.testing.assert_array_equal(strategy.reduce("SUM", _as_given(strategy, _pair, kind), axis=0), [4.0, 6.0])


@pytest.mark.replicas(2)
@pytest.mark.parametrize("kind", ["per_replica", "run", "plain"])
def test_a_ragged_tuple_along_an_axis_is_a_value_error(mirrored_strategy, kind):
    with pytest.raises(ValueError, match="non-rectangular"):
        mirrored_strategy.reduce("SUM", _as_given(mirrored_strategy, _ragged, kind), axis=0)


@pytest.mark.replicas(2)
@pytest.mark.parametrize("kind", ["per_replica", "run", "plain"])
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_a_dict_along_an_axis_is_a_type_error(mirrored_strategy, kind, op):
    value = _as_given(mirrored_strategy, lambda i: {"a": np.array([1.0, 2.0], np.float32)}, kind)
    with pytest.raises(TypeError, match=r"Strategy.reduce\(\) with axis=0 reduces one tensor per replica and cannot take a dict"):
        mirrored_strategy.reduce(op, value, axis=0)
    # axis=None keeps the structure (TensorFlow: {'a': [2.0, 4.0]})
    if kind != "plain":
        np.testing.assert_array_equal(mirrored_strategy.reduce("SUM", value, axis=None)["a"], [2.0, 4.0])


@pytest.mark.parametrize("name", ["default", "one_device_cpu"])
def test_a_dict_along_an_axis_is_a_type_error_on_one_replica(request, name):
    strategy = request.getfixturevalue(name)
    with pytest.raises(TypeError, match="cannot take a dict"):
        strategy.reduce("SUM", {"a": np.ones(2), "b": np.ones(2)}, axis=0)


def test_mean_of_a_mirrored_value_is_its_value(mirrored_strategy):
    mirrored = mirrored_strategy.extended.reduce_to("SUM", per_replica(mirrored_strategy, scaled), per_replica(mirrored_strategy, scaled))
    assert isinstance(mirrored, td.distribute.Mirrored)
    np.testing.assert_array_equal(mirrored_strategy.reduce("MEAN", mirrored, axis=None), scaled(0) + scaled(1))
    assert mirrored_strategy.extended.reduce_to("MEAN", mirrored, "/cpu:0") is mirrored


def test_sum_of_a_mirrored_value_raises(mirrored_strategy):
    mirrored = mirrored_strategy.extended.broadcast_to(td.constant([1.0]), per_replica(mirrored_strategy, scaled))
    with pytest.raises(td.errors.ValidationError, match="cannot SUM a Mirrored:"):
        mirrored_strategy.reduce("SUM", mirrored, axis=None)


def test_default_strategy_reduce(default):
    value = td.constant([1.0, 2.0])
    assert default.reduce("SUM", value, axis=None) is value
    assert default.reduce("SUM", value, axis=0) == 3.0
    assert default.reduce("MEAN", value, axis=0) == 1.5


def test_one_device_reduce_of_a_plain_value(one_device_cpu):
    value = td.range(10)
    np.testing.assert_array_equal(one_device_cpu.reduce("SUM", value, axis=None), np.arange(10))
    assert one_device_cpu.reduce("SUM", value, axis=0) == 45


def test_reduce_with_an_out_of_range_axis(mirrored_strategy):
    with pytest.raises(td.errors.InvalidArgumentError, match=r"Strategy.reduce\(\) got axis=1, which is out of range"):
        mirrored_strategy.reduce("SUM", per_replica(mirrored_strategy, scaled), axis=1)


def test_reduce_with_a_float_axis(mirrored_strategy):
    with pytest.raises(TypeError, match="needs an integer axis"):
        mirrored_strategy.reduce("SUM", per_replica(mirrored_strategy, scaled), axis=0.0)


def test_reduce_in_a_replica_context_raises(mirrored_strategy):
    with pytest.raises(td.errors.ContextError, match=r"Strategy.reduce\(\) must be called in cross-replica context"):
        mirrored_strategy.run(lambda: mirrored_strategy.reduce("SUM", 1.0, axis=None))


# --- gather -------------------------------------------------------------------------------


def test_gather_on_two_replicas_concatenates_the_components(mirrored_strategy):
    value = per_replica(mirrored_strategy, lambda i: np.array([[1], [2]], dtype=np.int32))
    np.testing.assert_array_equal(mirrored_strategy.gather(value, axis=0), [[1], [2], [1], [2]])


@pytest.mark.replicas(4)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_on_four_replicas_concatenates_along_the_axis(mirrored_strategy, axis):
    block = np.arange(6).reshape(1, 2, 3)
    value = per_replica(mirrored_strategy, lambda i: block)
    np.testing.assert_array_equal(mirrored_strategy.gather(value, axis=axis), np.concatenate([block] * 4, axis=axis))


@pytest.mark.replicas(4)
def test_gather_of_a_partial_batch(mirrored_strategy):
    np.testing.assert_array_equal(mirrored_strategy.gather(per_replica(mirrored_strategy, partial_batch), axis=0), np.arange(6))


def test_gather_of_a_non_distributed_value_returns_it(mirrored_strategy):
    value = td.constant([1.0])
    assert mirrored_strategy.gather(value, axis=0) is value


def test_gather_in_a_replica_context_points_to_all_gather(mirrored_strategy):
    with pytest.raises(td.errors.ContextError, match="all_gather"):
        mirrored_strategy.run(lambda: mirrored_strategy.gather(1.0, axis=0))


def test_sum_of_the_same_object_returned_by_every_replica_says_so(mirrored_strategy):
    # Every replica returned the same Python object: run() gives it back as it is, and the
    # message must not tell the user to reduce run()'s result, which is what they did.
    result = mirrored_strategy.run(lambda: 50)
    assert result == 50
    with pytest.raises(ValueError, match="^A non-DistributedValues value 50 ") as info:
        mirrored_strategy.reduce("SUM", result, axis=None)
    message = str(info.value)
    assert "every replica produced the very same Python object" in message
    assert "Reduce the result of strategy.run()" not in message
    assert "td.constant(...)" in message and "num_replicas_in_sync" in message
    # The fix it names works: a value made in each replica is per-replica.
    per_replica = mirrored_strategy.run(lambda: td.constant(50))
    assert mirrored_strategy.reduce("SUM", per_replica, axis=None) == 100
