"""The TF 1.x tower dialect (``towerdist.compat.v1``): the examples of TF 1.x's ``DistributionStrategy`` docs, as written.

Expected values are computed independently in the tests (plain Python/numpy over the
per-tower inputs), never copied from a run.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import towerdist as td
import towerdist.compat.v1 as tf
from towerdist._src.variables.distributed_variable import SyncOnReadVariable

import compat_v1_helpers
from compat_v1_helpers import TOWER_COUNTS, current_device, tower

# The helpers' fixtures, by name (an import would read as unused)
fresh_warnings = compat_v1_helpers.fresh_warnings
strategy = compat_v1_helpers.strategy

# The tower-era names warn on purpose; the tests of the warnings record them explicitly.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# --- 1. the examples of TF 1.x's DistributionStrategy docs ---------------------------------


def test_tf1_docs_merge_call_example_prints_10_11(capsys):
    import towerdist.compat.v1 as tf

    distribution = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])

    # Called once in "cross-tower" context.
    def merge_fn(distribution, three_plus_tower_id):
        # sum the values across towers
        return sum(distribution.unwrap(three_plus_tower_id))

    # Called once per tower in `distribution`, in a "tower" context.
    def fn(three):
        tower_ctx = tf.get_tower_context()
        v = three + tower_ctx.tower_id
        # Computes the sum of the `v` values across all towers.
        s = tower_ctx.merge_call(merge_fn, v)
        return s + v

    with distribution.scope():
        # in "cross-tower" context
        merged_results = distribution.call_for_each_tower(fn, 3)
        # merged_results has the values from every tower execution of `fn`.
        print(distribution.unwrap(merged_results))  # Prints a list

    assert capsys.readouterr().out == "[10, 11]\n"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_tf1_docs_merge_call_example_on_n_towers_agrees_with_run(n):
    distribution = tower(n)

    def merge_fn(distribution, three_plus_tower_id):
        return sum(distribution.unwrap(three_plus_tower_id))

    def fn(three):
        tower_ctx = tf.get_tower_context()
        v = three + tower_ctx.tower_id
        s = tower_ctx.merge_call(merge_fn, v)
        return s + v

    with distribution.scope():
        merged_results = distribution.call_for_each_tower(fn, 3)
        results = distribution.unwrap(merged_results)

    s = sum(3 + i for i in range(n))
    assert s == 3 * n + n * (n - 1) // 2
    assert results == [s + 3 + i for i in range(n)]
    assert all(type(r) is int for r in results)

    # The TF 2 form of the same example (run and merge_call with args=) agrees.
    def fn_v2(three):
        ctx = td.distribute.get_replica_context()
        v = three + int(ctx.replica_id_in_sync_group)
        total = ctx.merge_call(lambda dist, x: sum(dist.experimental_local_results(x)), args=(v,))
        return total + v

    assert list(distribution.experimental_local_results(distribution.run(fn_v2, args=[3]))) == results


@pytest.mark.parametrize("n", TOWER_COUNTS)
def test_tf1_docs_worker_device_index_example_passes_each_tower_its_index(n):
    distribution_strategy = tower(n)
    received: dict[int, tuple[Any, str | None]] = {}
    lock = threading.Lock()

    def fn(device_id):
        # device_id is an integer. `fn` is being executed on device:
        #    distribution_strategy.worker_devices[device_id].
        with lock:
            received[tf.get_tower_context().tower_id] = (device_id, current_device())

    with distribution_strategy.scope():
        distribution_strategy.call_for_each_tower(fn, distribution_strategy.worker_device_index)

    workers = distribution_strategy.worker_devices
    assert received == {i: (i, workers[i]) for i in range(n)}
    assert all(type(device_id) is int for device_id, _ in received.values())
    if n == 1:
        index = distribution_strategy.worker_device_index
        assert index == 0 and type(index) is int


@pytest.mark.parametrize("n", TOWER_COUNTS)
def test_tf1_docs_colocate_vars_with_and_update_example(n):
    distribution_strategy = tower(n)
    calls: list[tuple[str | None, float, float]] = []
    lock = threading.Lock()

    with distribution_strategy.scope():
        var1 = tf.Variable(1.0)
        with distribution_strategy.colocate_vars_with(var1):
            # var2 and var3 will be created on the same device(s) as var1
            var2 = tf.Variable(2.0)
            var3 = tf.Variable(3.0)

        def fn(v1, v2, v3):
            # operates on v1 from var1, v2 from var2, and v3 from var3
            with lock:
                calls.append((td.distribute.get_update_device(), float(v2), float(v3)))
            return v1.assign_add(v2 + v3)

        # `fn` runs on every device `v1` is on, `v2` and `v3` will be there too.
        result = distribution_strategy.update(var1, fn, var2, var3)

    var1_devices = [c.device for c in distribution_strategy.unwrap(var1)]
    assert var1_devices == distribution_strategy.worker_devices
    assert [c.device for c in distribution_strategy.unwrap(var2)] == var1_devices
    assert [c.device for c in distribution_strategy.unwrap(var3)] == var1_devices
    assert sorted(device for device, _, _ in calls) == sorted(var1_devices)
    assert all((x2, x3) == (2.0, 3.0) for _, x2, x3 in calls)
    assert [float(c) for c in distribution_strategy.unwrap(var1)] == [1.0 + 2.0 + 3.0] * n
    assert [float(r) for r in distribution_strategy.unwrap(result)] == [6.0] * n


@pytest.mark.parametrize("n", TOWER_COUNTS)
def test_update_fn_updates_the_colocated_copies_on_its_device(n):
    """TF 1.x's update passes each call the copies of mirrored arguments on its device."""
    strategy = tower(n)
    with strategy.scope():
        var = tf.Variable(0.0)
        with strategy.colocate_vars_with(var):
            slot = tf.Variable(10.0)

    def fn(v, s):
        s.assign_add(np.float32(1.0))
        return v.assign_add(s)

    strategy.update(var, fn, slot)
    # Each call incremented its own copy of `slot` once, then added it to its copy of `var`.
    assert [float(c) for c in strategy.unwrap(slot)] == [11.0] * n
    assert [float(c) for c in strategy.unwrap(var)] == [11.0] * n


@pytest.mark.parametrize("n", TOWER_COUNTS)
def test_tf1_docs_distribute_dataset_example_feeds_call_for_each_tower(n):
    distribution_strategy = tower(n)
    dataset = tf.data.Dataset.range(3 * n)
    seen: dict[int, tuple[int, str | None]] = {}
    lock = threading.Lock()

    def tower_fn(x):
        with lock:
            seen[tf.get_tower_context().tower_id] = (int(x), current_device())
        return x * 10

    with distribution_strategy.scope():
        iterator = distribution_strategy.distribute_dataset(dataset)
        tower_results = distribution_strategy.call_for_each_tower(tower_fn, iterator.get_next())
        assert [int(r) for r in distribution_strategy.unwrap(tower_results)] == [10 * i for i in range(n)]
        assert seen == {i: (i, distribution_strategy.worker_devices[i]) for i in range(n)}
        # The next step gets the next n elements, element n + i on tower i.
        second = distribution_strategy.call_for_each_tower(tower_fn, iterator.get_next())
        assert [int(r) for r in distribution_strategy.unwrap(second)] == [10 * (n + i) for i in range(n)]


@pytest.mark.parametrize("n", TOWER_COUNTS)
def test_tf1_docs_tower_local_var_scope_example(n):
    strategy = tower(n)
    with strategy.scope():
        with strategy.tower_local_var_scope("sum"):
            total = tf.Variable(1.0, trainable=True)  # tower-local implies not trainable
        with strategy.tower_local_var_scope("mean"):
            average = tf.Variable(1.0)

    for var in (total, average):
        assert isinstance(var, SyncOnReadVariable)
        assert var.trainable is False
        assert var.synchronization is tf.VariableSynchronization.ON_READ
    assert total.aggregation is tf.VariableAggregation.SUM
    assert average.aggregation is tf.VariableAggregation.MEAN
    # Every tower's copy starts from the same initial value.
    assert [float(c) for c in strategy.unwrap(total)] == [1.0] * n

    def fn():
        i = tf.get_tower_context().tower_id
        total.assign_add(np.float32(i + 1))
        average.assign_add(np.float32(i + 1))

    strategy.call_for_each_tower(fn)
    components = [1.0 + i + 1 for i in range(n)]
    assert [float(c) for c in strategy.unwrap(total)] == components
    assert float(strategy.fetch(total)) == sum(components)
    assert float(strategy.fetch(average)) == pytest.approx(sum(components) / n)
    assert float(strategy.read_var(total)) == float(strategy.extended.read_var(total)) == sum(components)


@pytest.mark.parametrize("n", [2, 4])
def test_tower_local_variable_saves_its_aggregate_and_restores_it(n, tmp_path):
    """Saved like fetch() (the "sum" over towers); restoring a "sum" splits it evenly over the towers."""
    strategy = tower(n)
    with strategy.scope():
        with strategy.tower_local_var_scope("sum"):
            saved = tf.Variable(0.0)
            restored = tf.Variable(0.0)
    strategy.call_for_each_tower(lambda: saved.assign_add(np.float32(tf.get_tower_context().tower_id + 1)))
    aggregate = float(sum(range(1, n + 1)))
    path = td.train.Checkpoint(v=saved).save(str(tmp_path / "ckpt"))
    td.train.Checkpoint(v=restored).restore(path)
    assert float(strategy.fetch(restored)) == pytest.approx(aggregate)
    assert [float(c) for c in strategy.unwrap(restored)] == pytest.approx([aggregate / n] * n)


def test_default_tower_context_merge_call_runs_with_the_default_strategy():
    ctx = tf.get_tower_context()
    dist, total = ctx.merge_call(lambda dist, x, y=0: (dist, x + y), 5, y=1)
    assert dist is td.distribute.get_strategy()
    assert total == 6


def test_distribute_dataset_with_structured_elements():
    strategy = tower(2)
    dataset = td.data.Dataset.range(4).map(lambda x: (x, {"y": x * 2}))
    with strategy.scope():
        iterator = strategy.distribute_dataset(dataset)
        result = strategy.call_for_each_tower(lambda pair: int(pair[0]) * 100 + int(pair[1]["y"]), iterator.get_next())
    assert strategy.unwrap(result) == [0 * 100 + 0, 1 * 100 + 2]
