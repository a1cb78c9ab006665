"""TF 2.0-2.3 names and TF 1.x leftovers on the modern strategies (``legacy_names``, alias table).

Each old member must behave exactly as the modern API it forwards to, on the default
strategy, ``OneDeviceStrategy`` and ``MirroredStrategy`` over 1 and 2 replicas. Their
one-time ``DeprecationWarning`` is tested in ``tests/compat/test_compat_v1_deprecations.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src import aliases
from towerdist._src import device as device_lib

from conftest import cpus, mirrored_param

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LEGACY_STRATEGIES = ["default", "one_device_cpu", mirrored_param(1), mirrored_param(2)]


@pytest.fixture(params=LEGACY_STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> td.distribute.Strategy:
    return request.getfixturevalue(request.param)


@pytest.fixture(autouse=True)
def fresh_warnings() -> None:
    aliases.reset_warnings()


def local(strategy: td.distribute.Strategy, value: Any) -> list[Any]:
    return list(strategy.experimental_local_results(value))


def as_lists(strategy: td.distribute.Strategy, values: Any) -> list[list[list[int]]]:
    """Each element of an iteration as a list (per replica) of int lists."""
    return [[np.asarray(part).tolist() for part in local(strategy, element)] for element in values]


def test_experimental_run_v2_is_run(strategy):
    n = strategy.num_replicas_in_sync
    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.float64(ctx.replica_id_in_sync_group + 1)
    )

    def fn(x, scale=1.0):
        return x * scale + int(td.distribute.get_replica_context().replica_id_in_sync_group)

    old = strategy.experimental_run_v2(fn, args=(inputs,), kwargs={"scale": 3.0})
    new = strategy.run(fn, args=(inputs,), kwargs={"scale": 3.0})
    expected = [(i + 1) * 3.0 + i for i in range(n)]
    assert [float(x) for x in local(strategy, old)] == [float(x) for x in local(strategy, new)] == expected
    assert type(old) is type(new)
    # Positional options argument too, as in TF 2.0's signature.
    assert strategy.experimental_run_v2(lambda: 4, (), None, None) == strategy.run(lambda: 4) == 4


def test_experimental_distribute_datasets_from_function_is_distribute_datasets_from_function(strategy):
    contexts: dict[str, list[tuple[int, int, int]]] = {"old": [], "new": []}
    lock = threading.Lock()

    def make_dataset_fn(which):
        def dataset_fn(ctx):
            with lock:
                contexts[which].append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
            return td.data.Dataset.range(12).batch(2).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

        return dataset_fn

    old = as_lists(strategy, strategy.experimental_distribute_datasets_from_function(make_dataset_fn("old")))
    new = as_lists(strategy, strategy.distribute_datasets_from_function(make_dataset_fn("new")))
    n = strategy.num_replicas_in_sync
    batches = [[2 * k, 2 * k + 1] for k in range(6)]
    assert old == new == [batches[step * n : step * n + n] for step in range(6 // n)]
    assert contexts["old"] == contexts["new"] != []


def test_experimental_make_numpy_dataset(strategy):
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    labels = np.array([0, 1, 0, 1])
    dataset = strategy.experimental_make_numpy_dataset((rows, labels), session=object())
    assert isinstance(dataset, td.data.Dataset)
    elements = list(dataset)
    assert len(elements) == 4
    for k, (x, y) in enumerate(elements):
        np.testing.assert_array_equal(x, rows[k])
        assert int(y) == labels[k]
    reference = list(td.data.Dataset.from_tensor_slices((rows, labels)))
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(elements, reference))
    # Distributed like any dataset.
    distributed = as_lists(strategy, strategy.experimental_distribute_dataset(dataset.batch(2).map(lambda x, y: y)))
    assert [label for step in distributed for part in step for label in part] == labels.tolist()


def test_extended_experimental_make_numpy_dataset(strategy):
    if getattr(aliases, "EXTENDED", None) is None:
        pytest.skip("no StrategyExtended aliases in this version")
    dataset = strategy.extended.experimental_make_numpy_dataset(np.arange(3))
    assert [int(x) for x in dataset] == [0, 1, 2]


def test_unwrap_is_experimental_local_results(strategy):
    n = strategy.num_replicas_in_sync
    per_replica = strategy.run(lambda: np.float32(td.distribute.get_replica_context().replica_id_in_sync_group))
    old = strategy.unwrap(per_replica)
    assert type(old) is tuple
    assert old == strategy.experimental_local_results(per_replica)
    assert [float(x) for x in old] == [float(i) for i in range(n)]
    with strategy.scope():
        var = td.Variable(1.0)
    assert strategy.unwrap(var) == strategy.experimental_local_results(var)
    assert len(strategy.unwrap(var)) == n
    assert strategy.unwrap("plain") == ("plain",)


def test_colocate_vars_with_places_new_variables_with_the_given_one(strategy):
    with strategy.scope():
        with td.device("CPU:3"):
            anchor = td.Variable(1.0)
        with strategy.colocate_vars_with(anchor):
            colocated = td.Variable(2.0)
        with strategy.extended.colocate_vars_with(anchor):
            reference = td.Variable(2.0)
    anchor_devices = [c.device for c in local(strategy, anchor)]
    assert [c.device for c in local(strategy, colocated)] == anchor_devices
    assert [c.device for c in local(strategy, reference)] == anchor_devices
    assert float(local(strategy, colocated)[0]) == 2.0


def test_colocate_vars_with_follows_a_device_scoped_variable_on_the_default_strategy(default):
    with td.device("CPU:3"):
        anchor = td.Variable(1.0)
    with default.colocate_vars_with(anchor):
        colocated = td.Variable(2.0)
    free = td.Variable(3.0)
    assert anchor.device == colocated.device == device_lib.canonicalize("CPU:3")
    assert free.device != anchor.device


def test_configure_accepts_a_session_config_and_rejects_cluster_settings(strategy):
    assert strategy.configure() is None
    assert strategy.configure(session_config={"allow_soft_placement": True}) is None
    for kwargs in ({"cluster_spec": {"worker": ["host:2222"]}}, {"task_type": "worker"}, {"task_id": 1}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            strategy.configure(**kwargs)
    assert strategy.run(lambda: 5) == 5


def test_update_config_proto_returns_an_equal_copy(strategy):
    config = {"device_count": {"CPU": 8}, "options": [1, 2]}
    updated = strategy.update_config_proto(config)
    assert updated == config
    assert updated is not config
    updated["device_count"]["CPU"] = 1
    assert config["device_count"]["CPU"] == 8  # a deep copy


def test_make_dataset_iterator(strategy):
    dataset = td.data.Dataset.range(8).batch(4)
    old = as_lists(strategy, strategy.make_dataset_iterator(dataset))
    new = as_lists(strategy, iter(strategy.experimental_distribute_dataset(dataset)))
    n = strategy.num_replicas_in_sync
    per_replica = 4 // n
    expected = [[list(range(b * 4 + r * per_replica, b * 4 + (r + 1) * per_replica)) for r in range(n)] for b in range(2)]
    assert old == new == expected


def test_make_input_fn_iterator(strategy):
    def input_fn(ctx):
        return td.data.Dataset.range(8).batch(2).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

    old = as_lists(strategy, strategy.make_input_fn_iterator(input_fn))
    new = as_lists(strategy, strategy.distribute_datasets_from_function(input_fn))
    assert old == new
    assert sum(old, []) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    same = as_lists(
        strategy, strategy.make_input_fn_iterator(input_fn, td.distribute.InputReplicationMode.PER_WORKER)
    )
    assert same == old


def test_make_input_fn_iterator_rejects_per_replica(strategy):
    with pytest.raises(ValueError, match="PER_REPLICA"):
        strategy.make_input_fn_iterator(
            lambda ctx: td.data.Dataset.range(4), td.distribute.InputReplicationMode.PER_REPLICA
        )
    assert strategy.run(lambda: 6) == 6


def _input_fn(ctx):
    return td.data.Dataset.range(4).batch(2)


def test_make_input_fn_iterator_under_another_strategys_scope_raises(strategy):
    # TensorFlow 2.21: RuntimeError "Mixing different tf.distribute.Strategy objects".
    with td.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(RuntimeError, match="^Mixing different strategies: Strategy.make_input_fn_iterator"):
            strategy.make_input_fn_iterator(_input_fn)
    assert strategy.run(lambda: 6) == 6


def test_make_input_fn_iterator_in_a_replica_raises(strategy):
    # TensorFlow 2.21: RuntimeError "Method requires being in cross-replica context".
    def replica_fn():
        with pytest.raises(RuntimeError, match="^Strategy.make_input_fn_iterator\\(\\) must be called in cross-replica"):
            strategy.make_input_fn_iterator(_input_fn)
        return 6

    assert strategy.run(replica_fn) == 6


def test_experimental_run_with_an_iterator(strategy):
    dataset = td.data.Dataset.range(8).batch(4)
    old_iterator = strategy.make_dataset_iterator(dataset)
    new_iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for _ in range(2):
        old = strategy.experimental_run(lambda x: x * 10, old_iterator)
        new = strategy.run(lambda x: x * 10, args=(next(new_iterator),))
        assert [np.asarray(a).tolist() for a in local(strategy, old)] == [
            np.asarray(b).tolist() for b in local(strategy, new)
        ]
    n = strategy.num_replicas_in_sync
    assert sum(([int(v) for v in np.asarray(a)] for a in local(strategy, old)), []) == [40, 50, 60, 70]
    assert len(local(strategy, old)) == n


def test_experimental_run_without_an_iterator(strategy):
    n = strategy.num_replicas_in_sync
    old = strategy.experimental_run(lambda: np.int32(td.distribute.get_replica_context().replica_id_in_sync_group))
    new = strategy.run(lambda: np.int32(td.distribute.get_replica_context().replica_id_in_sync_group))
    assert [int(x) for x in local(strategy, old)] == [int(x) for x in local(strategy, new)] == list(range(n))


def test_group_returns_none(strategy):
    per_replica = strategy.run(lambda: np.ones(2))
    with strategy.scope():
        var = td.Variable(1.0)
    assert strategy.group(per_replica) is None
    assert strategy.group([per_replica, var], name="step") is None
    assert strategy.group(np.zeros(3)) is None


def test_collective_hints_returns_communication_options():
    options = td.distribute.experimental.CollectiveHints(bytes_per_pack=4096, timeout_seconds=2.5)
    assert isinstance(options, td.distribute.experimental.CommunicationOptions)
    assert options.bytes_per_pack == 4096
    assert options.timeout_seconds == 2.5
    defaults = td.distribute.experimental.CollectiveHints()
    reference = td.distribute.experimental.CommunicationOptions()
    assert (defaults.bytes_per_pack, defaults.timeout_seconds, defaults.implementation) == (
        reference.bytes_per_pack,
        reference.timeout_seconds,
        reference.implementation,
    )
    with pytest.raises(ValueError):
        td.distribute.experimental.CollectiveHints(bytes_per_pack=-1)


def test_legacy_names_work_on_the_tower_strategy_too():
    import towerdist.compat.v1 as tf

    strategy = tf.distribute.MirroredStrategy(cpus(2))
    assert strategy.experimental_run_v2(lambda x: x + 1, args=(1,)) == 2
    assert as_lists(strategy, strategy.make_dataset_iterator(td.data.Dataset.range(4).batch(2))) == [[[0], [1]], [[2], [3]]]
    assert strategy.update_config_proto({"a": 1}) == {"a": 1}
    # The tower strategy's unwrap is TF 1.x's (a list).
    assert strategy.unwrap(strategy.run(lambda: 3)) == [3]
