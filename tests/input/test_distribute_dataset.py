"""Distributing datasets: ``experimental_distribute_dataset``, ``distribute_datasets_from_function``,
``DistributedDataset``/``DistributedIterator``, ``InputContext`` and ``InputOptions``.

The expected values are TensorFlow 2.21's observed behaviour, including the examples of
TensorFlow's ``tf.distribute`` documentation:

* default auto-shard policy, one worker: the *legacy* rule, each global batch of ``b`` rows becomes
  ``N`` consecutive pieces of ``ceil(b / N)`` rows, the trailing ones short or empty;
* ``AutoShardPolicy.OFF``: the *cycling* rule, the rows are re-cut into pieces of
  ``batch_sizes_for_worker(B, 1, N, 0)`` rows across global-batch boundaries;
* ``distribute_datasets_from_function``: no splitting, replica ``j`` of a step takes the next whole
  element; replicas left without one get empty dummies (unless the element spec is fully static).
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
from towerdist._src.values.per_replica_spec import PerReplicaSpec

from conftest import mirrored_param

pytestmark = pytest.mark.timeout(60)

PER_REPLICA = td.distribute.InputOptions(experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA)


def _off(dataset: td.data.Dataset) -> td.data.Dataset:
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = td.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def _lists(strategy, value) -> list:
    """The per-replica pieces of one step as Python lists."""
    return [np.asarray(piece).tolist() for piece in strategy.experimental_local_results(value)]


def _steps(strategy, dist) -> list:
    """Every step of one pass over ``dist``, each as a list of per-replica lists."""
    return [_lists(strategy, value) for value in dist]


# --- legacy split (default auto-shard policy), 4 replicas ---------------------------------------


@pytest.mark.replicas(4)
@pytest.mark.parametrize(
    ("global_batch", "n", "expected"),
    [
        (6, 12, [[[0, 1], [2, 3], [4, 5], []], [[6, 7], [8, 9], [10, 11], []]]),
        (3, 3, [[[0], [1], [2], []]]),
        (8, 10, [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8], [9], [], []]]),
        (6, 10, [[[0, 1], [2, 3], [4, 5], []], [[6], [7], [8], [9]]]),
        (7, 7, [[[0, 1], [2, 3], [4, 5], [6]]]),
        (5, 5, [[[0, 1], [2, 3], [4], []]]),
        (2, 2, [[[0], [1], [], []]]),
        (1, 1, [[[0], [], [], []]]),
        (6, 14, [[[0, 1], [2, 3], [4, 5], []], [[6, 7], [8, 9], [10, 11], []], [[12], [13], [], []]]),
    ],
    ids=lambda v: str(v) if isinstance(v, int) else "",
)
def test_legacy_split_on_four_replicas(mirrored_strategy, global_batch, n, expected):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(n).batch(global_batch))
    assert _steps(mirrored_strategy, dist) == expected


@pytest.mark.replicas(4)
def test_legacy_split_pieces_are_per_replica_int64_arrays(mirrored_strategy):
    value = next(iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(6).batch(6))))
    assert isinstance(value, td.distribute.PerReplica)
    pieces = mirrored_strategy.experimental_local_results(value)
    assert [p.shape for p in pieces] == [(2,), (2,), (2,), (0,)]
    assert all(p.dtype == np.int64 for p in pieces)


@pytest.mark.replicas(4)
def test_auto_shard_off_uses_cycling_rule_on_four_replicas(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(_off(td.data.Dataset.range(14).batch(6)))
    assert _steps(mirrored_strategy, dist) == [
        [[0, 1], [2, 3], [4], [5]],
        [[6, 7], [8, 9], [10], [11]],
        [[12, 13], [], [], []],
    ]


@pytest.mark.parametrize(
    ("policy_off", "expected"),
    [
        (False, [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10], [11, 12, 13]]]),
        (True, [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13]]]),
    ],
    ids=["auto", "off"],
)
def test_two_replicas_range14_batch8_split(mirrored_strategy, policy_off, expected):
    dataset = td.data.Dataset.range(14).batch(8)
    dist = mirrored_strategy.experimental_distribute_dataset(_off(dataset) if policy_off else dataset)
    assert _steps(mirrored_strategy, dist) == expected


@pytest.mark.parametrize("policy_off", [False, True], ids=["auto", "off"])
def test_two_replicas_range14_batch8_mean_uses_global_element_count(mirrored_strategy, policy_off):
    # The partial global batch of 6 is averaged over 6 elements, not 8.
    dataset = td.data.Dataset.range(14).batch(8)
    dist = mirrored_strategy.experimental_distribute_dataset(_off(dataset) if policy_off else dataset)
    means = [float(mirrored_strategy.reduce("MEAN", x, axis=0)) for x in dist]
    assert means == [3.5, 10.5]


@pytest.mark.parametrize(
    ("global_batch", "expected"),
    [
        (4, [[[0, 1], [2, 3]], [[4], []]]),
        (3, [[[0, 1], [2]], [[3], [4]]]),
        (5, [[[0, 1, 2], [3, 4]]]),
    ],
    ids=["batch4", "batch3", "batch5"],
)
def test_two_replicas_range5(mirrored_strategy, global_batch, expected):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(5).batch(global_batch))
    assert _steps(mirrored_strategy, dist) == expected


@pytest.mark.replicas(4)
def test_drop_remainder_divisible_batch_has_static_per_replica_spec(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(16).batch(8, drop_remainder=True))
    assert dist.element_spec == PerReplicaSpec(*[td.TensorSpec((2,), np.int64)] * 4)
    assert _steps(mirrored_strategy, dist) == [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12, 13], [14, 15]]]


@pytest.mark.replicas(4)
def test_drop_remainder_indivisible_batch_has_unknown_per_replica_spec(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2, drop_remainder=True))
    assert dist.element_spec == PerReplicaSpec(*[td.TensorSpec((None,), np.int64)] * 4)
    assert _steps(mirrored_strategy, dist) == [[[0], [1], [], []], [[2], [3], [], []]]


@pytest.mark.replicas(4)
def test_empty_pieces_keep_the_other_dimensions(mirrored_strategy):
    dataset = td.data.Dataset.from_tensor_slices(np.ones([3, 2])).batch(3)
    value = next(iter(mirrored_strategy.experimental_distribute_dataset(dataset)))
    pieces = mirrored_strategy.experimental_local_results(value)
    assert [p.shape for p in pieces] == [(1, 2), (1, 2), (1, 2), (0, 2)]
    assert all(p.dtype == np.float64 for p in pieces)


@pytest.mark.replicas(4)
def test_tuple_elements_split_componentwise(mirrored_strategy):
    dataset = td.data.Dataset.from_tensor_slices((np.arange(5.0), np.arange(5) * 10)).batch(4)
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(dataset))
    next(iterator)
    features, labels = next(iterator)
    assert isinstance(features, td.distribute.PerReplica) and isinstance(labels, td.distribute.PerReplica)
    f = mirrored_strategy.experimental_local_results(features)
    lab = mirrored_strategy.experimental_local_results(labels)
    np.testing.assert_array_equal(f[0], [4.0])
    np.testing.assert_array_equal(lab[0], [40])
    assert [p.shape for p in f[1:]] == [(0,)] * 3 and [p.shape for p in lab[1:]] == [(0,)] * 3
    assert all(p.dtype == np.float64 for p in f) and all(p.dtype == np.int64 for p in lab)


@pytest.mark.replicas(4)
def test_dict_elements_give_a_dict_of_per_replica_values(mirrored_strategy):
    dataset = td.data.Dataset.from_tensor_slices({"a": np.arange(6.0), "b": np.arange(12).reshape(6, 2)}).batch(6)
    dist = mirrored_strategy.experimental_distribute_dataset(dataset)
    assert dist.element_spec == {
        "a": PerReplicaSpec(*[td.TensorSpec((None,), np.float64)] * 4),
        "b": PerReplicaSpec(*[td.TensorSpec((None, 2), np.int64)] * 4),
    }
    value = next(iter(dist))
    assert sorted(value) == ["a", "b"]
    assert _lists(mirrored_strategy, value["a"]) == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], []]
    assert [p.shape for p in mirrored_strategy.experimental_local_results(value["b"])] == [(2, 2)] * 3 + [(0, 2)]


@pytest.mark.parametrize("strategy_name", [mirrored_param(2), mirrored_param(4), "central_storage_2cpu"])
def test_unbatched_scalar_dataset_asks_for_batch(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    with pytest.raises(ValueError, match="Call the `batch` method"):
        strategy.experimental_distribute_dataset(td.data.Dataset.range(10))
    # the strategy is still usable
    n = strategy.num_replicas_in_sync
    dist = strategy.experimental_distribute_dataset(td.data.Dataset.range(n).batch(n))
    assert _steps(strategy, dist) == [[[i] for i in range(n)]]


def test_unbatched_rows_are_split_by_rows(mirrored_strategy):
    dataset = td.data.Dataset.from_tensor_slices(np.arange(8).reshape(2, 4))
    dist = mirrored_strategy.experimental_distribute_dataset(dataset)
    assert _steps(mirrored_strategy, dist) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


# TF 2.21 [RUN]: batch_sizes_for_worker may contain 0 (global batch < replicas); the zero-row piece is still
# emitted, so no step is lost even when the statically shaped (drop_remainder) input disables padding.
@pytest.mark.parametrize(
    ("replicas", "global_batch", "n", "expected"),
    [
        (4, 3, 3, [[[0], [1], [2], []]]),
        (2, 1, 3, [[[0], []], [[1], []], [[2], []]]),
        (4, 2, 5, [[[0], [1], [], []], [[2], [3], [], []]]),
    ],
    ids=["4rep-gb3-n3", "2rep-gb1-n3", "4rep-gb2-n5"],
)
def test_auto_shard_off_drop_remainder_with_zero_row_pieces(mirrored_strategy, global_batch, n, expected):
    strategy = mirrored_strategy
    dataset = _off(td.data.Dataset.range(n).batch(global_batch, drop_remainder=True))
    assert _steps(strategy, strategy.experimental_distribute_dataset(dataset)) == expected


# --- other strategies ------------------------------------------------------------------------------


def test_central_storage_splits_like_mirrored(central_storage_2cpu):
    dist = central_storage_2cpu.experimental_distribute_dataset(td.data.Dataset.range(5).batch(4))
    values = list(dist)
    assert all(isinstance(v, td.distribute.PerReplica) for v in values)
    assert [_lists(central_storage_2cpu, v) for v in values] == [[[0, 1], [2, 3]], [[4], []]]


@pytest.mark.parametrize("strategy_name", ["one_device_cpu", mirrored_param(1)])
def test_single_replica_strategies_yield_unsplit_arrays(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    dist = strategy.experimental_distribute_dataset(td.data.Dataset.range(5).batch(4))
    values = list(dist)
    assert all(isinstance(v, np.ndarray) and not isinstance(v, td.distribute.PerReplica) for v in values)
    assert [v.tolist() for v in values] == [[0, 1, 2, 3], [4]]
    assert dist.element_spec == td.TensorSpec((None,), np.int64)
    assert iter(dist).element_spec == td.TensorSpec((None,), np.int64)


def test_default_strategy_returns_the_dataset_itself(default):
    assert td.distribute.get_strategy() is default
    dataset = td.data.Dataset.range(5).batch(4)
    dist = default.experimental_distribute_dataset(dataset)
    assert dist is dataset
    assert [np.asarray(x).tolist() for x in dist] == [[0, 1, 2, 3], [4]]


def test_default_strategy_calls_dataset_fn_with_a_default_input_context(default):
    calls = []
    result = object()

    def dataset_fn(ctx):
        calls.append((type(ctx), ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return result

    assert default.distribute_datasets_from_function(dataset_fn) is result
    assert calls == [(td.distribute.InputContext, 1, 0, 1)]


def test_default_strategy_ignores_per_replica_in_distribute_dataset(default):
    dataset = td.data.Dataset.range(4).batch(2)
    assert default.experimental_distribute_dataset(dataset, PER_REPLICA) is dataset


def test_default_strategy_ignores_input_options_in_datasets_from_function(default):
    dataset = td.data.Dataset.range(4).batch(2)
    options = td.distribute.InputOptions(experimental_place_dataset_on_device=True)
    assert default.distribute_datasets_from_function(lambda ctx: dataset, options) is dataset


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # an old name, used on purpose
def test_experimental_make_numpy_dataset_then_batch_and_distribute(mirrored_strategy):
    dataset = mirrored_strategy.experimental_make_numpy_dataset(np.ones([10]))
    assert isinstance(dataset, td.data.Dataset)
    values = list(mirrored_strategy.experimental_distribute_dataset(dataset.batch(4)))
    pieces = [mirrored_strategy.experimental_local_results(v) for v in values]
    assert [[p.shape for p in step] for step in pieces] == [[(2,), (2,)], [(2,), (2,)], [(1,), (1,)]]
    assert all(p.dtype == np.float64 and np.all(p == 1.0) for step in pieces for p in step)


# --- distribute_datasets_from_function -------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_datasets_from_function_called_once_per_worker(mirrored_strategy, replicas):
    strategy = mirrored_strategy
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return td.data.Dataset.range(4).batch(2)

    strategy.distribute_datasets_from_function(dataset_fn)
    assert calls == [(1, 0, replicas)]


def test_datasets_from_function_gives_each_replica_the_next_element(mirrored_strategy):
    dist = mirrored_strategy.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(10).batch(2))
    values = list(dist)
    assert all(isinstance(v, td.distribute.PerReplica) for v in values)
    assert [_lists(mirrored_strategy, v) for v in values] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], []]]
    dummy = mirrored_strategy.experimental_local_results(values[-1])[1]
    assert dummy.shape == (0,) and dummy.dtype == np.int64
    assert dist.element_spec == PerReplicaSpec(*[td.TensorSpec((None,), np.int64)] * 2)


def test_datasets_from_function_static_spec_drops_partial_step(mirrored_strategy):
    dist = mirrored_strategy.distribute_datasets_from_function(
        lambda ctx: td.data.Dataset.range(6).batch(2, drop_remainder=True)
    )
    assert dist.element_spec == PerReplicaSpec(*[td.TensorSpec((2,), np.int64)] * 2)
    assert _steps(mirrored_strategy, dist) == [[[0, 1], [2, 3]]]


def test_datasets_from_function_static_spec_optional_pads_partial_step(mirrored_strategy):
    dist = mirrored_strategy.distribute_datasets_from_function(
        lambda ctx: td.data.Dataset.range(6).batch(2, drop_remainder=True)
    )
    iterator = iter(dist)
    first, second, third = (iterator.get_next_as_optional() for _ in range(3))
    assert first.has_value() and second.has_value() and not third.has_value()
    assert _lists(mirrored_strategy, first.get_value()) == [[0, 1], [2, 3]]
    pieces = mirrored_strategy.experimental_local_results(second.get_value())
    assert pieces[0].tolist() == [4, 5] and pieces[1].shape == (0,) and pieces[1].dtype == np.int64


def test_datasets_from_function_per_replica_mode(mirrored_strategy):
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return td.data.Dataset.range(8).batch(2).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

    dist = mirrored_strategy.distribute_datasets_from_function(dataset_fn, PER_REPLICA)
    assert calls == [(2, 0, 2), (2, 1, 2)]
    assert _steps(mirrored_strategy, dist) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # an old name, used on purpose
def test_experimental_datasets_from_function_alias(mirrored_strategy):
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return td.data.Dataset.range(10).batch(2)

    dist = mirrored_strategy.experimental_distribute_datasets_from_function(dataset_fn)
    assert calls == [(1, 0, 2)]
    assert _steps(mirrored_strategy, dist) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], []]]


def test_datasets_from_function_per_replica_on_one_device_strategy_raises(one_device_cpu):
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        one_device_cpu.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(4).batch(2), PER_REPLICA)


@pytest.mark.parametrize("strategy_name", ["one_device_cpu", mirrored_param(1), mirrored_param(2), "central_storage_2cpu"])
def test_distribute_dataset_per_replica_raises(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2), PER_REPLICA)


@pytest.mark.parametrize("strategy_name", ["one_device_cpu", mirrored_param(2)])
def test_place_dataset_on_device_needs_per_replica(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    options = td.distribute.InputOptions(experimental_place_dataset_on_device=True)
    with pytest.raises(ValueError, match="experimental_place_dataset_on_device"):
        strategy.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(4).batch(2), options)


def test_place_dataset_on_device_with_fetch_to_device_raises(mirrored_strategy):
    options = td.distribute.InputOptions(
        experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=True,
        experimental_fetch_to_device=True,
    )
    with pytest.raises(ValueError, match="experimental_place_dataset_on_device"):
        mirrored_strategy.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(4).batch(2), options)


@pytest.mark.parametrize(("place", "fetch"), [(True, True), (True, False), (False, True), (False, False)])
def test_one_device_per_replica_input_is_not_implemented_whatever_the_placement(one_device_cpu, place, fetch):
    # TensorFlow 2.21's OneDeviceStrategy: NotImplementedError for PER_REPLICA before it looks at the
    # placement options (so also with place_dataset_on_device and fetch_to_device, which MirroredStrategy
    # refuses with ValueError).
    options = td.distribute.InputOptions(
        experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=place,
        experimental_fetch_to_device=fetch,
    )
    with pytest.raises(NotImplementedError, match="InputReplicationMode.PER_REPLICA is only supported"):
        one_device_cpu.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(4).batch(2), options)


def test_place_dataset_on_device_per_replica_without_fetch_works(mirrored_strategy):
    options = td.distribute.InputOptions(
        experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=True,
        experimental_fetch_to_device=False,
    )
    dist = mirrored_strategy.distribute_datasets_from_function(
        lambda ctx: td.data.Dataset.range(4).batch(1).shard(ctx.num_input_pipelines, ctx.input_pipeline_id), options
    )
    assert _steps(mirrored_strategy, dist) == [[[0], [1]], [[2], [3]]]


def test_input_context_per_replica_batch_size_and_shard(mirrored_strategy):
    # The dataset_fn of the tf.distribute.InputContext documentation.
    contexts = []

    def dataset_fn(input_context):
        contexts.append(input_context)
        batch = input_context.get_per_replica_batch_size(4)
        dataset = td.data.Dataset.range(8).batch(batch)
        return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

    dist = mirrored_strategy.distribute_datasets_from_function(dataset_fn)
    assert len(contexts) == 1
    ctx = contexts[0]
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 2)
    assert _steps(mirrored_strategy, dist) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


# --- InputOptions / InputContext / InputReplicationMode ---------------------------------------------


def test_input_options_repr():
    assert repr(td.distribute.InputOptions()) == (
        "InputOptions(experimental_fetch_to_device=True, "
        "experimental_replication_mode=<InputReplicationMode.PER_WORKER: 'PER_WORKER'>, "
        "experimental_place_dataset_on_device=False, experimental_per_replica_buffer_size=1)"
    )


def test_input_options_defaults_and_fields():
    options = td.distribute.InputOptions()
    assert options.experimental_fetch_to_device is True
    assert options.experimental_replication_mode is td.distribute.InputReplicationMode.PER_WORKER
    assert options.experimental_place_dataset_on_device is False
    assert options.experimental_per_replica_buffer_size == 1
    assert td.distribute.InputOptions(experimental_fetch_to_device=None).experimental_fetch_to_device is True
    assert td.distribute.InputOptions(experimental_fetch_to_device=False).experimental_fetch_to_device is False
    assert PER_REPLICA.experimental_replication_mode is td.distribute.InputReplicationMode.PER_REPLICA
    assert isinstance(options, tuple) and len(options) == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"experimental_fetch_to_device": "yes"},
        {"experimental_place_dataset_on_device": 1},
        {"experimental_replication_mode": "bogus"},
        {"experimental_replication_mode": 3},
        {"experimental_per_replica_buffer_size": -1},
        {"experimental_per_replica_buffer_size": 1.5},
    ],
    ids=["fetch-str", "place-int", "mode-str", "mode-int", "buffer-negative", "buffer-float"],
)
def test_input_options_rejects_bad_fields(kwargs):
    with pytest.raises((TypeError, ValueError)):
        td.distribute.InputOptions(**kwargs)


def test_input_replication_mode_values():
    assert td.distribute.InputReplicationMode.PER_WORKER.value == "PER_WORKER"
    assert td.distribute.InputReplicationMode.PER_REPLICA.value == "PER_REPLICA"


def test_input_context_defaults_and_str():
    ctx = td.distribute.InputContext()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
    assert str(ctx) == "tf.distribute.InputContext(input pipeline id 0, total: 1)"
    assert str(td.distribute.InputContext(3, 2, 6)) == "tf.distribute.InputContext(input pipeline id 2, total: 3)"


@pytest.mark.parametrize(("global_batch", "replicas", "expected"), [(8, 2, 4), (6, 3, 2), (4, 1, 4), (0, 4, 0)])
def test_input_context_per_replica_batch_size(global_batch, replicas, expected):
    ctx = td.distribute.InputContext(1, 0, replicas)
    assert ctx.get_per_replica_batch_size(global_batch) == expected


def test_input_context_indivisible_global_batch_raises():
    ctx = td.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2)
    with pytest.raises(ValueError, match="The `global_batch_size` 5 is not divisible by `num_replicas_in_sync` 2"):
        ctx.get_per_replica_batch_size(5)


# --- iterators ----------------------------------------------------------------------------------


def test_next_raises_stop_iteration_at_the_end(mirrored_strategy):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2)))
    assert isinstance(iterator, td.distribute.DistributedIterator)
    assert iter(iterator) is iterator
    assert _lists(mirrored_strategy, next(iterator)) == [[0], [1]]
    assert _lists(mirrored_strategy, next(iterator)) == [[2], [3]]
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)


def test_get_next_raises_out_of_range_at_the_end(mirrored_strategy):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2)))
    iterator.get_next()
    iterator.get_next()
    with pytest.raises(td.errors.OutOfRangeError):
        iterator.get_next()


def test_get_next_as_optional_pads_partial_step_then_is_empty(mirrored_strategy):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(5).batch(4)))
    first = iterator.get_next_as_optional()
    assert isinstance(first, td.experimental.Optional)
    assert first.has_value() and _lists(mirrored_strategy, first.get_value()) == [[0, 1], [2, 3]]
    second = iterator.get_next_as_optional()
    pieces = mirrored_strategy.experimental_local_results(second.get_value())
    assert pieces[0].tolist() == [4] and pieces[1].shape == (0,) and pieces[1].dtype == np.int64
    assert not iterator.get_next_as_optional().has_value()


@pytest.mark.parametrize("strategy_name", ["one_device_cpu", mirrored_param(2)])
@pytest.mark.parametrize(("size", "expected"), [(4, True), (0, False)], ids=["value", "end"])
def test_has_value_is_a_boolean_scalar_array(request, strategy_name, size, expected):
    strategy = request.getfixturevalue(strategy_name)
    iterator = iter(strategy.experimental_distribute_dataset(td.data.Dataset.range(size).batch(2)))
    flag = iterator.get_next_as_optional().has_value()
    # TensorFlow returns a scalar bool tensor: tf.Tensor(True, shape=(), dtype=bool).
    assert isinstance(flag, np.ndarray) and flag.shape == () and flag.dtype == np.bool_
    assert bool(flag) is expected and flag.item() is expected


def test_get_next_as_optional_drives_a_while_loop_over_the_data(mirrored_strategy):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(6).batch(2)))
    seen = []
    optional = iterator.get_next_as_optional()
    while optional.has_value():
        seen.append(_lists(mirrored_strategy, optional.get_value()))
        optional = iterator.get_next_as_optional()
    assert seen == [[[0], [1]], [[2], [3]], [[4], [5]]]


def _spec(shape: tuple[int | None, ...], dtype: str) -> td.TensorSpec:
    return td.TensorSpec(shape, getattr(td, dtype))


def _per_replica(*shapes: tuple[int | None, ...], dtype: str) -> PerReplicaSpec:
    return PerReplicaSpec(*(_spec(shape, dtype) for shape in shapes))


# TF 2.21, ({"a": [1, 2, 3, 4, 5]}, [5., 6., 7., 8., 9.]).batch(4): get_next_as_optional().element_spec
# of the first step, the partial second step, and the empty third.
TF_OPTIONAL_SPECS = {  # by replica count: 2 (mirrored_strategy), 1 (one_device_cpu)
    2: [
        ({"a": _per_replica((2,), (2,), dtype="int32")}, _per_replica((2,), (2,), dtype="float32")),
        ({"a": _per_replica((1,), (0,), dtype="int32")}, _per_replica((1,), (0,), dtype="float32")),
        ({"a": _per_replica((None,), (None,), dtype="int32")}, _per_replica((None,), (None,), dtype="float32")),
    ],
    1: [
        ({"a": _spec((4,), "int32")}, _spec((4,), "float32")),
        ({"a": _spec((1,), "int32")}, _spec((1,), "float32")),
        ({"a": _spec((None,), "int32")}, _spec((None,), "float32")),
    ],
}


@pytest.mark.parametrize("strategy_name", [mirrored_param(2), "one_device_cpu"])
def test_get_next_as_optional_element_spec_describes_the_pieces(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    features = {"a": np.array([1, 2, 3, 4, 5], np.int32)}
    labels = np.array([5.0, 6.0, 7.0, 8.0, 9.0], np.float32)
    dataset = td.data.Dataset.from_tensor_slices((features, labels)).batch(4)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    optionals = [iterator.get_next_as_optional() for _ in range(3)]

    assert [bool(o.has_value()) for o in optionals] == [True, True, False]
    assert [o.element_spec for o in optionals] == TF_OPTIONAL_SPECS[strategy.num_replicas_in_sync]
    assert optionals[2].element_spec == iterator.element_spec  # an empty one: the iterator's


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        # TF 2.21 on 2 replicas: batch 3 of range(8), and batch 4 with drop_remainder.
        (lambda: td.data.Dataset.range(8).batch(3), _per_replica((2,), (1,), dtype="int64")),
        (lambda: td.data.Dataset.range(8).batch(4, drop_remainder=True), _per_replica((2,), (2,), dtype="int64")),
    ],
    ids=["batch3", "drop_remainder"],
)
def test_get_next_as_optional_element_spec_has_each_pieces_shape(mirrored_strategy, make, expected):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(make()))
    assert iterator.get_next_as_optional().element_spec == expected


def test_get_next_as_optional_element_spec_from_a_function(mirrored_strategy):
    # TF 2.21: whole batches of 3 per replica; the empty dataset's optional has the iterator's spec.
    dist = mirrored_strategy.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(8).batch(3))
    assert iter(dist).get_next_as_optional().element_spec == _per_replica((3,), (3,), dtype="int64")
    empty = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(0).batch(3))
    assert iter(empty).get_next_as_optional().element_spec == _per_replica((None,), (None,), dtype="int64")


def test_empty_dataset_optional_is_empty_and_get_next_raises(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(0).batch(2))
    assert list(dist) == []
    assert not iter(dist).get_next_as_optional().has_value()
    with pytest.raises(td.errors.OutOfRangeError):
        iter(dist).get_next()


def test_element_spec_of_dataset_and_iterator(mirrored_strategy):
    dataset = td.data.Dataset.from_tensors(([1.0], [2])).repeat(100).batch(16)
    dist = mirrored_strategy.experimental_distribute_dataset(dataset)
    expected = (
        "(PerReplicaSpec(TensorSpec(shape=(None, 1), dtype=tf.float32, name=None), "
        "TensorSpec(shape=(None, 1), dtype=tf.float32, name=None)), "
        "PerReplicaSpec(TensorSpec(shape=(None, 1), dtype=tf.int32, name=None), "
        "TensorSpec(shape=(None, 1), dtype=tf.int32, name=None)))"
    )
    assert repr(dist.element_spec) == expected
    assert repr(iter(dist).element_spec) == expected


def test_distributed_dataset_reduce(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(6).batch(2))
    total = dist.reduce(0, lambda state, x: state + mirrored_strategy.reduce("SUM", x, axis=0))
    assert total == 15


def test_distributed_dataset_reduce_includes_padded_partial_step(mirrored_strategy):
    dist = mirrored_strategy.distribute_datasets_from_function(
        lambda ctx: td.data.Dataset.range(6).batch(2, drop_remainder=True)
    )
    total = dist.reduce(0, lambda state, x: state + mirrored_strategy.reduce("SUM", x, axis=0))
    assert total == 15


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: td.data.Dataset.range(5).batch(2), 3),
        (lambda: td.data.Dataset.range(5).batch(2).repeat(), -1),
        (lambda: td.data.Dataset.range(4).batch(2).repeat(3), 6),
    ],
    ids=["finite", "infinite", "repeat3"],
)
def test_cardinality_counts_global_batches(mirrored_strategy, make, expected):
    assert mirrored_strategy.experimental_distribute_dataset(make()).cardinality == expected


def test_infinite_cardinality_constant(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(5).batch(2).repeat())
    assert dist.cardinality == td.data.INFINITE_CARDINALITY


def test_datasets_from_function_cardinality(mirrored_strategy):
    dist = mirrored_strategy.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(6).batch(2))
    assert dist.cardinality == 3


def test_distributed_dataset_has_no_len(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2))
    with pytest.raises(TypeError):
        len(dist)


def test_reiterating_starts_a_new_epoch(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(20).batch(4).prefetch(2))
    iterator = iter(dist)
    next(iterator)
    next(iterator)
    expected = [[[4 * i, 4 * i + 1], [4 * i + 2, 4 * i + 3]] for i in range(5)]
    assert _steps(mirrored_strategy, dist) == expected
    assert _steps(mirrored_strategy, dist) == expected


def test_shuffled_epochs_differ_and_each_is_a_permutation(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(8).shuffle(8, seed=1).batch(4))
    first = _steps(mirrored_strategy, dist)
    second = _steps(mirrored_strategy, dist)
    assert first != second
    for epoch in (first, second):
        assert [len(piece) for step in epoch for piece in step] == [2, 2, 2, 2]
        assert sorted(v for step in epoch for piece in step for v in piece) == list(range(8))


@pytest.mark.parametrize("method", ["__next__", "get_next", "get_next_as_optional"])
def test_next_inside_replica_fn_raises_and_strategy_still_works(mirrored_strategy, method):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2)))
    with pytest.raises(ValueError, match=r"next\(iterator\) should be called from outside of replica_fn"):
        mirrored_strategy.run(lambda: getattr(iterator, method)())
    result = mirrored_strategy.run(lambda x: x * 2, args=(next(iterator),))
    assert _lists(mirrored_strategy, result) == [[0], [2]]


def test_next_inside_another_strategys_scope_raises_context_error(mirrored_strategy, one_device_cpu):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2)))
    with one_device_cpu.scope(), pytest.raises(td.errors.ContextError):
        next(iterator)
    assert issubclass(td.errors.ContextError, RuntimeError)
    assert _lists(mirrored_strategy, next(iterator)) == [[0], [1]]


def test_next_inside_own_scope_works(mirrored_strategy):
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2)))
    with mirrored_strategy.scope():
        assert _lists(mirrored_strategy, next(iterator)) == [[0], [1]]


def test_iter_inside_run_returns_per_replica_iterators(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2))
    iterators = mirrored_strategy.run(lambda: iter(dist))
    assert isinstance(iterators, td.distribute.PerReplica)
    parts = mirrored_strategy.experimental_local_results(iterators)
    assert len(parts) == 2 and all(isinstance(p, td.distribute.DistributedIterator) for p in parts)


def test_iterating_inside_function_sums_all_elements(mirrored_strategy):
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(7).batch(4))

    @td.function
    def total():
        result = 0
        for x in dist:
            result += mirrored_strategy.reduce("SUM", x, axis=0)
        return result

    assert total() == 21


# --- examples of TensorFlow's tf.distribute documentation -------------------------------------------


def test_run_on_each_distributed_element(mirrored_strategy):
    # tf.distribute.Strategy.experimental_distribute_dataset: iterate, then strategy.run.
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2))

    @td.function
    def replica_fn(x):
        return x * 2

    results = [mirrored_strategy.run(replica_fn, args=(x,)) for x in dist]
    assert all(isinstance(r, td.distribute.PerReplica) for r in results)
    assert [_lists(mirrored_strategy, r) for r in results] == [[[0], [2]], [[4], [6]]]
    pieces = [p for r in results for p in mirrored_strategy.experimental_local_results(r)]
    assert all(p.shape == (1,) and p.dtype == np.int64 for p in pieces)


# A variable created once inside a td.function in the scope is mirrored: see
# test_distributed_variables.py.


@pytest.fixture
def first_step(mirrored_strategy):
    """The first element of the tf.distribute.DistributedValues documentation's dataset."""
    dataset = td.data.Dataset.from_tensor_slices([5.0, 6.0, 7.0, 8.0]).batch(2)
    return next(iter(mirrored_strategy.experimental_distribute_dataset(dataset)))


def test_distributed_values_pieces(mirrored_strategy, first_step):
    assert isinstance(first_step, td.distribute.PerReplica)
    parts = mirrored_strategy.experimental_local_results(first_step)
    assert isinstance(parts, tuple) and len(parts) == 2
    np.testing.assert_array_equal(parts[0], [5.0])
    np.testing.assert_array_equal(parts[1], [6.0])
    assert all(p.shape == (1,) and p.dtype == np.float32 for p in parts)


def test_run_returns_the_replica_ids(mirrored_strategy):
    ids = mirrored_strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    assert [int(v) for v in mirrored_strategy.experimental_local_results(ids)] == [0, 1]


def test_distributed_values_as_run_input(mirrored_strategy, first_step):
    updated = mirrored_strategy.run(lambda x: x + 1.0, args=(first_step,))
    parts = mirrored_strategy.experimental_local_results(updated)
    np.testing.assert_array_equal(parts[0], [6.0])
    np.testing.assert_array_equal(parts[1], [7.0])
    assert all(p.dtype == np.float32 for p in parts)


def test_distributed_values_reduced(mirrored_strategy, first_step):
    reduced = mirrored_strategy.reduce(td.distribute.ReduceOp.SUM, first_step, axis=0)
    assert np.shape(reduced) == () and np.asarray(reduced).dtype == np.float32 and reduced == 11.0


def test_get_next_after_five_steps(mirrored_strategy):
    # tf.distribute.DistributedIterator.get_next.
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(100).batch(2)))
    for _ in range(5):
        iterator.get_next()
    parts = mirrored_strategy.experimental_local_results(iterator.get_next())
    assert [p.tolist() for p in parts] == [[10], [11]]
    assert all(p.shape == (1,) and p.dtype == np.int64 for p in parts)


def test_get_next_as_optional_in_a_loop_of_steps(mirrored_strategy):
    # tf.distribute.DistributedIterator.get_next_as_optional: `if not has_value(): break`.
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(10).batch(2)))
    seen = []
    for _ in range(2):
        optional = iterator.get_next_as_optional()
        assert optional.has_value()
        seen.append(_lists(mirrored_strategy, optional.get_value()))
    assert seen == [[[0], [1]], [[2], [3]]]


def test_train_step_over_a_distributed_dataset(mirrored_strategy):
    # tf.distribute.DistributedDataset: a `for` loop of train steps.
    dataset = td.data.Dataset.from_tensors(([1.0], [1.0])).repeat(4).batch(4)
    dist = mirrored_strategy.experimental_distribute_dataset(dataset)

    def train_step(inputs):
        features, labels = inputs
        return labels - 0.3 * features

    losses = [mirrored_strategy.run(train_step, args=(inputs,)) for inputs in dist]
    assert len(losses) == 1 and isinstance(losses[0], td.distribute.PerReplica)
    for part in mirrored_strategy.experimental_local_results(losses[0]):
        assert part.shape == (2, 1) and part.dtype == np.float32
        np.testing.assert_allclose(part, [[0.7], [0.7]], rtol=1e-6)


def test_explicit_iterator_per_epoch(mirrored_strategy):
    # tf.distribute.DistributedDataset: `iter()` once per epoch, `next()` per step.
    dataset = td.data.Dataset.from_tensors(([1.0], [1.0])).repeat(50).batch(4)
    dist = mirrored_strategy.experimental_distribute_dataset(dataset)

    def train_step(inputs):
        return np.asarray(0.1, dtype=np.float32)

    lines = []
    for epoch in range(2):
        iterator = iter(dist)
        total = 0.0
        for _ in range(3):
            per_replica_losses = mirrored_strategy.run(train_step, args=(next(iterator),))
            total += float(mirrored_strategy.reduce("SUM", per_replica_losses, axis=None))
        lines.append(f"Epoch {epoch + 1}, Loss: {total / 3:.4f}")
    assert lines == ["Epoch 1, Loss: 0.2000", "Epoch 2, Loss: 0.2000"]


def test_element_spec_as_function_input_signature(mirrored_strategy):
    # tf.distribute.DistributedDataset.element_spec.
    dist = mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.from_tensors([2.0]).repeat(100).batch(4))
    spec = dist.element_spec
    assert spec == PerReplicaSpec(*[td.TensorSpec((None, 1), np.float32)] * 2)

    @td.function(input_signature=[spec])
    def process_inputs(inputs):
        return mirrored_strategy.run(np.square, args=(inputs,))

    inputs = next(iter(dist))
    for replica_spec, piece in zip(spec.value_specs, mirrored_strategy.experimental_local_results(inputs), strict=True):
        assert replica_spec.is_compatible_with(piece)
    result = process_inputs(inputs)
    for part in mirrored_strategy.experimental_local_results(result):
        assert part.shape == (2, 1) and part.dtype == np.float32
        np.testing.assert_array_equal(part, [[4.0], [4.0]])


def test_per_replica_element_repr(mirrored_strategy):
    dataset = td.data.Dataset.from_tensor_slices([1, 2, 3, 4]).repeat().batch(4)
    iterator = iter(mirrored_strategy.experimental_distribute_dataset(dataset))
    assert repr(next(iterator)) == "PerReplica:{\n  0: array([1, 2], dtype=int32),\n  1: array([3, 4], dtype=int32)\n}"


def test_one_device_strategy_run_and_reduce(one_device_cpu):
    # tf.distribute.OneDeviceStrategy.
    result = 0
    for i in range(10):
        result += one_device_cpu.run(lambda x: x * 2, args=(i,))
    assert result == 90
    np.testing.assert_array_equal(one_device_cpu.reduce("SUM", np.arange(10), axis=None), np.arange(10))
    assert one_device_cpu.reduce("SUM", np.arange(10), axis=0) == 45


def test_central_storage_reduce_of_the_last_step(central_storage_2cpu):
    # tf.distribute.experimental.CentralStorageStrategy.
    dist = central_storage_2cpu.experimental_distribute_dataset(td.data.Dataset.range(10).batch(2))
    values = list(dist)
    assert len(values) == 5
    last = values[-1]
    assert _lists(central_storage_2cpu, last) == [[8], [9]]
    np.testing.assert_array_equal(central_storage_2cpu.reduce("SUM", last, axis=None), [17])
    assert central_storage_2cpu.reduce("SUM", last, axis=0) == 17


def test_global_batch_of_8_on_two_replicas_then_reduce(mirrored_strategy):
    value = next(iter(mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(8).batch(8))))
    assert _lists(mirrored_strategy, value) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    np.testing.assert_array_equal(mirrored_strategy.reduce("SUM", value, axis=None), [4, 6, 8, 10])
    assert mirrored_strategy.reduce("SUM", value, axis=0) == 28
