"""The TF 1.x tower dialect: ``towerdist.compat.v1`` / ``towerdist.contrib.distribute``.

Covers the examples of TF 1.x's ``DistributionStrategy`` docs (``tf.contrib.distribute``) as
written (with ``import towerdist.compat.v1 as tf``), each tower-era member against its TF 2
equivalent on 1, 2 and 4 towers, ``call_for_each_tower(..., run_concurrently=False)``, the one-time
``DeprecationWarning`` of every old name (the alias table ``towerdist._src.aliases``) and
the errors of the dialect, each followed by a successful step on the same strategy.

Expected values are computed independently in the tests (plain Python/numpy over the
per-tower inputs), never copied from a run.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import numpy as np
import pytest

import towerdist as td
import towerdist.compat.v1 as tf
from towerdist._src import aliases
from towerdist._src import device as device_lib
from towerdist._src.compat.tower_context import TowerContext
from towerdist._src.variables.distributed_variable import MirroredVariable, SyncOnReadVariable

from conftest import cpus, mirrored

# The tower-era names warn on purpose; the tests of the warnings record them explicitly.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOWER_COUNTS = [1, 2, 4]
ReduceOp = td.distribute.ReduceOp


@lru_cache(maxsize=None)
def tower(n: int) -> Any:
    """A cached ``compat.v1`` MirroredStrategy over ``n`` logical CPUs."""
    return tf.distribute.MirroredStrategy(cpus(n))


@pytest.fixture(params=TOWER_COUNTS, ids=lambda n: f"{n}towers")
def strategy(request: pytest.FixtureRequest) -> Any:
    return tower(request.param)


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    """Every old name warns again in each test (the warning is once per process)."""
    aliases.reset_warnings()
    yield


def canonical(device: Any) -> str:
    return device_lib.canonicalize(device)


def current_device() -> str | None:
    spec = device_lib.current()
    return None if spec is None else spec.name


def tower_values(n: int) -> list[np.ndarray]:
    """What tower ``i`` contributes in the reduce tests: ``arange(3) * (i + 1)`` as float32."""
    return [np.arange(3, dtype=np.float32) * (i + 1) for i in range(n)]


def per_tower_arrays(strategy: Any) -> Any:
    """``tower_values`` produced by ``call_for_each_tower`` (a PerReplica, or the array for one tower)."""
    return strategy.call_for_each_tower(lambda: np.arange(3, dtype=np.float32) * (tf.get_tower_context().tower_id + 1))


def assert_usable(strategy: Any) -> None:
    """A full step with a merge_call still works on ``strategy``."""
    n = strategy.num_replicas_in_sync

    def fn() -> int:
        ctx = tf.get_tower_context()
        total = ctx.merge_call(lambda dist, v: sum(dist.unwrap(v)), ctx.tower_id)
        return total + ctx.tower_id

    expected_total = sum(range(n))
    assert strategy.unwrap(strategy.call_for_each_tower(fn)) == [expected_total + i for i in range(n)]


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


# --- 2. tower-era members against their TF 2 equivalents ------------------------------------


def test_call_for_each_tower_matches_run(strategy):
    n = strategy.num_replicas_in_sync
    inputs = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.arange(3.0) * (ctx.replica_id_in_sync_group + 1)
    )

    def fn(x, scale=1.0, offset=0.0):
        replica = int(td.distribute.get_replica_context().replica_id_in_sync_group)
        return x * scale + offset + replica

    old = strategy.call_for_each_tower(fn, inputs, scale=2.0, offset=np.float64(0.5))
    new = strategy.run(fn, args=(inputs,), kwargs={"scale": 2.0, "offset": np.float64(0.5)})
    assert type(old) is type(new)
    expected = [np.arange(3.0) * (i + 1) * 2.0 + 0.5 + i for i in range(n)]
    for got_old, got_new, want in zip(strategy.unwrap(old), strategy.experimental_local_results(new), expected):
        np.testing.assert_array_equal(got_old, want)
        np.testing.assert_array_equal(got_new, want)
    assert len(strategy.unwrap(old)) == n


def test_call_for_each_tower_does_not_pass_run_concurrently_to_fn(strategy):
    received = []
    lock = threading.Lock()

    def fn(**kwargs):
        with lock:
            received.append(dict(kwargs))

    strategy.call_for_each_tower(fn, a=1, run_concurrently=True)
    strategy.call_for_each_tower(fn, run_concurrently=False, b=2)
    n = strategy.num_replicas_in_sync
    assert sorted(received, key=lambda d: sorted(d)) == [{"a": 1}] * n + [{"b": 2}] * n


def test_call_for_each_tower_runs_towers_concurrently_by_default():
    strategy = tower(4)
    barrier = threading.Barrier(4, timeout=30)
    # Every tower waits for all the others: this completes only if they run at once.
    result = strategy.call_for_each_tower(lambda: barrier.wait() >= 0)
    assert result is True


def test_unwrap_is_a_list_local_results_a_tuple(strategy):
    n = strategy.num_replicas_in_sync
    per_tower = strategy.call_for_each_tower(lambda: tf.get_tower_context().tower_id * 10)
    old = strategy.unwrap(per_tower)
    new = strategy.experimental_local_results(per_tower)
    assert type(old) is list and type(new) is tuple
    assert old == list(new) == [10 * i for i in range(n)]
    with strategy.scope():
        var = tf.Variable(2.0)
    assert type(strategy.unwrap(var)) is list
    assert strategy.unwrap(var) == list(strategy.experimental_local_results(var))
    assert len(strategy.unwrap(var)) == n
    plain = object()
    assert strategy.unwrap(plain) == [plain]


@pytest.mark.parametrize("method", ["sum", "mean"])
def test_reduce_matches_reduce_to_and_strategy_reduce(strategy, method):
    n = strategy.num_replicas_in_sync
    op = ReduceOp.SUM if method == "sum" else ReduceOp.MEAN
    value = per_tower_arrays(strategy)
    expected = np.sum(tower_values(n), axis=0)
    if method == "mean":
        expected = expected / n

    with strategy.scope():
        old = strategy.reduce(method, value)
        new = strategy.extended.reduce_to(op, value, value)
    assert type(old) is type(new)
    assert len(strategy.unwrap(old)) == n
    for got_old, got_new in zip(strategy.unwrap(old), strategy.unwrap(new)):
        np.testing.assert_allclose(got_old, expected)
        np.testing.assert_allclose(got_new, expected)
    if n > 1:
        assert isinstance(old, td.distribute.Mirrored)
        assert old._devices == value._devices  # the devices the value lives on
    # TF 2's Strategy.reduce(op, value, axis=None) (to the host) agrees.
    np.testing.assert_allclose(td.distribute.MirroredStrategy.reduce(strategy, op, value, axis=None), expected)


@pytest.mark.parametrize("method", ["sum", "mean"])
def test_reduce_honours_destinations(strategy, method):
    n = strategy.num_replicas_in_sync
    op = ReduceOp.SUM if method == "sum" else ReduceOp.MEAN
    value = per_tower_arrays(strategy)
    expected = np.sum(tower_values(n), axis=0) / (n if method == "mean" else 1)

    # One device string: the same as reduce_to onto it.
    old = strategy.reduce(method, value, "CPU:5")
    new = strategy.extended.reduce_to(op, value, "CPU:5")
    np.testing.assert_allclose(old, expected)
    np.testing.assert_allclose(new, expected)

    # A list of device strings: mirrored on exactly those devices.
    old = strategy.reduce(method, value, destinations=["CPU:6", "CPU:7"])
    assert isinstance(old, td.distribute.Mirrored)
    assert [d.name for d in old._devices] == [canonical("CPU:6"), canonical("CPU:7")]
    for component in strategy.unwrap(old):
        np.testing.assert_allclose(component, expected)

    # A mirrored variable: its devices.
    with strategy.scope():
        var = tf.Variable(np.zeros(3, np.float32))
    old = strategy.reduce(method, value, var)
    new = strategy.extended.reduce_to(op, value, var)
    assert len(strategy.unwrap(old)) == len(strategy.unwrap(new)) == n
    for got_old, got_new in zip(strategy.unwrap(old), strategy.unwrap(new)):
        np.testing.assert_allclose(got_old, expected)
        np.testing.assert_allclose(got_new, expected)


def test_reduce_only_first_tower_takes_tower_0(strategy):
    value = per_tower_arrays(strategy)
    assert tf.VariableAggregation.ONLY_FIRST_TOWER is tf.VariableAggregation.ONLY_FIRST_REPLICA
    result = strategy.reduce(tf.VariableAggregation.ONLY_FIRST_TOWER, value)
    for component in strategy.unwrap(result):
        np.testing.assert_array_equal(component, tower_values(1)[0])


@pytest.mark.parametrize("method", ["sum", "mean"])
def test_batch_reduce_matches_batch_reduce_to(strategy, method):
    n = strategy.num_replicas_in_sync
    op = ReduceOp.SUM if method == "sum" else ReduceOp.MEAN
    a = per_tower_arrays(strategy)
    b = strategy.call_for_each_tower(lambda: np.float64(tf.get_tower_context().tower_id + 1) ** 2)
    divisor = n if method == "mean" else 1
    expected_a = np.sum(tower_values(n), axis=0) / divisor
    expected_b = sum(float(i + 1) ** 2 for i in range(n)) / divisor

    old = strategy.batch_reduce(method, [(a, None), (b, "CPU:3")])
    new = strategy.extended.batch_reduce_to(op, [(a, a), (b, "CPU:3")])
    assert type(old) is list and len(old) == len(new) == 2
    assert len(strategy.unwrap(old[0])) == n
    for got_old, got_new in zip(strategy.unwrap(old[0]), strategy.unwrap(new[0])):
        np.testing.assert_allclose(got_old, expected_a)
        np.testing.assert_allclose(got_new, expected_a)
    assert float(old[1]) == pytest.approx(expected_b)
    assert float(new[1]) == pytest.approx(expected_b)


def test_broadcast_matches_broadcast_to(strategy):
    n = strategy.num_replicas_in_sync
    x = np.array([1.0, 2.0], np.float32)
    old = strategy.broadcast(x)
    with strategy.scope():
        var = tf.Variable(np.zeros(2, np.float32))
    new = strategy.extended.broadcast_to(x, var)
    assert len(strategy.unwrap(old)) == len(strategy.unwrap(new)) == n
    for got_old, got_new in zip(strategy.unwrap(old), strategy.unwrap(new)):
        np.testing.assert_array_equal(got_old, x)
        np.testing.assert_array_equal(got_new, x)
    if n > 1:
        assert [d.name for d in old._devices] == strategy.worker_devices
    np.testing.assert_array_equal(strategy.broadcast(x, "CPU:2"), strategy.extended.broadcast_to(x, "CPU:2"))
    both = strategy.broadcast(x, ["CPU:6", "CPU:7"])
    assert [d.name for d in both._devices] == [canonical("CPU:6"), canonical("CPU:7")]


def test_update_matches_extended_update(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        v_old = tf.Variable(1.0)
        v_new = tf.Variable(1.0)
    devices: dict[str, list[str | None]] = {"old": [], "new": []}
    lock = threading.Lock()

    def fn(which, v, a, k=1.0):
        with lock:
            devices[which].append(td.distribute.get_update_device())
        return v.assign_add(np.float32(a * k))

    old = strategy.update(v_old, lambda v, a, k: fn("old", v, a, k=k), 2.0, k=3.0)
    new = strategy.extended.update(v_new, lambda v, a, k: fn("new", v, a, k=k), args=(2.0,), kwargs={"k": 3.0})
    assert [float(c) for c in strategy.unwrap(v_old)] == [float(c) for c in strategy.unwrap(v_new)] == [7.0] * n
    assert [float(r) for r in strategy.unwrap(old)] == [float(r) for r in strategy.unwrap(new)] == [7.0] * n
    assert sorted(devices["old"]) == sorted(devices["new"]) == sorted(strategy.worker_devices)


def test_non_slot_devices_and_update_non_slot(strategy):
    with strategy.scope():
        var = tf.Variable(1.0)
    old_devices = strategy.non_slot_devices([var])
    new_devices = strategy.extended.non_slot_devices([var])
    assert type(old_devices) is list
    assert old_devices == [canonical(d) for d in new_devices]

    def fn(a, k):
        return f"{td.distribute.get_update_device()}|{a + k}"

    old = strategy.update_non_slot(old_devices, fn, 5, k=1)
    new = strategy.extended.update_non_slot(new_devices, fn, args=(5,), kwargs={"k": 1})
    assert strategy.unwrap(old) == strategy.unwrap(new) == [f"{d}|6" for d in old_devices]


def test_read_var(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        mirrored_var = tf.Variable(1.5)
        with strategy.tower_local_var_scope("sum"):
            local = tf.Variable(0.0)
    strategy.call_for_each_tower(lambda: local.assign_add(np.float32(tf.get_tower_context().tower_id + 1)))
    assert float(strategy.read_var(mirrored_var)) == float(strategy.extended.read_var(mirrored_var)) == 1.5
    expected = sum(i + 1 for i in range(n))
    assert float(strategy.read_var(local)) == float(strategy.extended.read_var(local)) == expected


def test_fetch(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        with strategy.tower_local_var_scope("sum"):
            local = tf.Variable(0.0)
        mirrored_var = tf.Variable(3.0)
    strategy.call_for_each_tower(lambda: local.assign_add(np.float32(tf.get_tower_context().tower_id + 1)))
    aggregate = sum(i + 1 for i in range(n))
    ran_on: list[str | None] = []

    def doubled(x):
        ran_on.append(current_device())
        return x * 2

    # Tower-local: the aggregate over the towers ("sum"); fn runs on the destination.
    assert float(strategy.fetch(local)) == aggregate
    assert float(strategy.fetch(local, "CPU:3", doubled)) == 2 * aggregate
    assert ran_on == [canonical("CPU:3")]

    # Mirrored: its value; fn runs on the destination's copy when there is one ...
    ran_on.clear()
    assert float(strategy.fetch(mirrored_var)) == 3.0
    last = strategy.worker_devices[-1]
    assert float(strategy.fetch(mirrored_var, last, doubled)) == 6.0
    assert ran_on == [last]
    # ... else on the first device holding it.
    ran_on.clear()
    assert float(strategy.fetch(mirrored_var, "CPU:7", doubled)) == 6.0
    assert ran_on == [strategy.worker_devices[0]]
    if n > 1:
        ran_on.clear()
        assert float(strategy.fetch(strategy.broadcast(np.float32(4.0)), "CPU:7", doubled)) == 8.0
        assert ran_on == [strategy.worker_devices[0]]
    # A plain value: fn applied.
    assert float(strategy.fetch(np.float32(1.25), fn=lambda x: x + 1)) == 2.25


MAP_REDUCE_COUNTS = [pytest.param(1, id="1towers"), pytest.param(2, id="2towers"), pytest.param(4, id="4towers")]


@pytest.mark.parametrize("method", ["sum", "mean"])
@pytest.mark.parametrize("n", MAP_REDUCE_COUNTS)
def test_map_then_reduce_with_default_destinations(n, method):
    strategy = tower(n)
    elements = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    mapped = strategy.map(elements, lambda x: np.float64(x) * 3)
    expected = sum(x * 3 for x in elements) / (len(elements) if method == "mean" else 1)
    result = strategy.reduce(method, mapped)
    assert [float(c) for c in strategy.unwrap(result)] == pytest.approx([expected] * n)


@pytest.mark.parametrize("method", ["sum", "mean"])
def test_map_spreads_elements_and_reduce_combines_all_outputs(strategy, method):
    n = strategy.num_replicas_in_sync
    elements = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    placed: dict[float, str | None] = {}
    offset = strategy.broadcast(np.float64(100.0))
    offsets_seen = []

    def fn(x, off):
        placed[x] = current_device()
        offsets_seen.append(off)
        return np.float64(x) + off

    mapped = strategy.map(elements, fn, offset)
    for i, x in enumerate(elements):
        assert placed[x] == strategy.worker_devices[i % n]
    # Mirrored arguments arrive as the copy on the element's device, not as the mirrored value.
    assert not any(isinstance(off, td.distribute.DistributedValues) for off in offsets_seen)
    outputs = strategy.unwrap(mapped)
    assert [list(map(float, part)) for part in outputs] == [
        [x + 100.0 for i, x in enumerate(elements) if i % n == t] for t in range(n)
    ]
    total = sum(x + 100.0 for x in elements)
    expected = total / len(elements) if method == "mean" else total
    result = strategy.reduce(method, mapped, destinations=strategy.worker_devices)
    assert [float(c) for c in strategy.unwrap(result)] == pytest.approx([expected] * n)


def test_map_over_fewer_elements_than_towers():
    """Towers without elements contribute nothing; "mean" divides by the number of elements (as TF 1.x)."""
    strategy = tower(4)
    mapped = strategy.map([1.0, 2.0], lambda x: np.float64(x) * 2)
    assert [list(map(float, part)) for part in strategy.unwrap(mapped)] == [[2.0], [4.0], [], []]
    assert [float(c) for c in strategy.unwrap(strategy.reduce("sum", mapped))] == [6.0] * 4
    assert [float(c) for c in strategy.unwrap(strategy.reduce("mean", mapped))] == [3.0] * 4
    batched = strategy.batch_reduce("mean", [(mapped, None)])
    assert [float(c) for c in strategy.unwrap(batched[0])] == [3.0] * 4
    with pytest.raises(ValueError, match="no elements"):
        strategy.reduce("sum", strategy.map([], lambda x: x))
    assert_usable(strategy)


def test_worker_and_parameter_devices(strategy):
    n = strategy.num_replicas_in_sync
    workers = strategy.worker_devices
    params = strategy.parameter_devices
    assert type(workers) is list and type(params) is list
    assert type(strategy.extended.worker_devices) is tuple
    assert workers == list(strategy.extended.worker_devices) == [canonical(d) for d in cpus(n)]
    assert params == list(strategy.extended.parameter_devices)
    workers.append("mutated")
    assert strategy.worker_devices == [canonical(d) for d in cpus(n)]  # a new list each time


def test_num_towers_and_is_single_tower(strategy):
    n = strategy.num_replicas_in_sync
    assert strategy.num_towers == n == len(cpus(n))
    assert strategy.is_single_tower is (n == 1)


def test_old_properties_are_read_only():
    strategy = tower(2)
    with pytest.raises(AttributeError, match="read-only"):
        strategy.num_towers = 3
    assert strategy.num_towers == 2


def test_tower_context_members_match_replica_context(strategy):
    n = strategy.num_replicas_in_sync
    seen: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    def merge_fn(dist, x, scale=1):
        return sum(dist.unwrap(x)) * scale

    def fn():
        ctx = tf.get_tower_context()
        rc = td.distribute.get_replica_context()
        old = ctx.merge_call(merge_fn, ctx.tower_id + 1, scale=10)
        new = rc.merge_call(merge_fn, args=(ctx.tower_id + 1,), kwargs={"scale": 10})
        with lock:
            seen[ctx.tower_id] = {
                "id_type": type(ctx.tower_id),
                "replica_id": int(rc.replica_id_in_sync_group),
                "num_towers": ctx.num_towers,
                "num_replicas": rc.num_replicas_in_sync,
                "single": ctx.is_single_tower,
                "device": ctx.device,
                "strategy": ctx.distribution_strategy,
                "merged": (old, new),
                "same": tf.get_tower_context() == ctx,
            }

    strategy.call_for_each_tower(fn)
    expected_merge = sum(i + 1 for i in range(n)) * 10
    assert sorted(seen) == list(range(n))
    for i, info in seen.items():
        assert info["id_type"] is int and info["replica_id"] == i
        assert info["num_towers"] == info["num_replicas"] == n
        assert info["single"] is (n == 1)
        assert info["device"] == strategy.worker_devices[i]
        assert info["strategy"] is strategy
        assert info["merged"] == (expected_merge, expected_merge)
        assert info["same"] is True


def test_merge_fn_results_are_unwrapped_for_each_tower(strategy):
    n = strategy.num_replicas_in_sync
    received: dict[int, Any] = {}
    lock = threading.Lock()

    def fn():
        ctx = tf.get_tower_context()
        reduced = ctx.merge_call(lambda dist, v: dist.reduce("sum", v), np.float32(ctx.tower_id + 1))
        with lock:
            received[ctx.tower_id] = reduced

    strategy.call_for_each_tower(fn)
    assert sorted(received) == list(range(n))
    for part in received.values():
        assert not isinstance(part, td.distribute.DistributedValues)
        assert float(part) == sum(range(1, n + 1))


def test_a_tower_local_scope_in_a_tower_does_not_reach_its_merge_fn():
    strategy = tower(2)
    made = []

    def merge_fn(distribution):
        made.append(tf.Variable(1.0, aggregation=tf.VariableAggregation.MEAN))

    def fn():
        ctx = tf.get_tower_context()
        with ctx.tower_local_var_scope("sum"):
            local = tf.Variable(0.0)
            ctx.merge_call(merge_fn)
        return local

    with strategy.scope():
        local = strategy.call_for_each_tower(fn)
    assert isinstance(local, SyncOnReadVariable)
    assert isinstance(made[0], MirroredVariable) and made[0].trainable


def test_get_tower_context_and_friends_in_every_context(strategy):
    checks: dict[str, tuple[Any, ...]] = {}
    lock = threading.Lock()

    def snapshot() -> tuple[Any, ...]:
        return (
            tf.get_tower_context(),
            tf.get_cross_tower_context(),
            td.distribute.get_cross_replica_context(),
            tf.get_distribution_strategy(),
            td.distribute.get_strategy(),
            tf.has_distribution_strategy(),
            td.distribute.has_strategy(),
        )

    outside = snapshot()
    default = outside[0]
    assert isinstance(default, TowerContext)
    assert default.tower_id == 0 and default.num_towers == 1 and default.is_single_tower is True
    assert outside[1] is None and outside[2] is None
    assert outside[3] is outside[4] is td.distribute.get_strategy()
    assert outside[5] is outside[6] is False

    def merge_fn(dist):
        with lock:
            checks["merge"] = snapshot()

    def fn():
        tower_ctx, *rest = snapshot()
        tower_view = (tower_ctx.tower_id, *rest)  # the context itself is only usable in its tower
        tf.get_tower_context().merge_call(merge_fn)
        with lock:
            checks[f"tower {tf.get_tower_context().tower_id}"] = tower_view

    with strategy.scope():
        checks["scope"] = snapshot()
        strategy.call_for_each_tower(fn)

    for where in ("scope", "merge"):
        tower_ctx, cross, cross_v2, dist, dist_v2, has, has_v2 = checks[where]
        assert tower_ctx is None, where
        assert cross is cross_v2 is strategy, where
        assert dist is dist_v2 is strategy and has is has_v2 is True, where
    for i in range(strategy.num_replicas_in_sync):
        tower_id, cross, cross_v2, dist, dist_v2, has, has_v2 = checks[f"tower {i}"]
        assert tower_id == i
        assert cross is cross_v2 is None
        assert dist is dist_v2 is strategy and has is has_v2 is True


def test_distribute_dataset_gives_one_element_per_tower_and_drops_the_remainder(strategy):
    n = strategy.num_replicas_in_sync
    steps = 3
    remainder = n - 1  # too few to feed every tower (none for one tower)
    dataset = td.data.Dataset.range(steps * n + remainder)
    expected = [[step * n + i for i in range(n)] for step in range(steps)]

    distributed = strategy.distribute_dataset(dataset)
    got = [[int(x) for x in strategy.unwrap(distributed.get_next())] for _ in range(steps)]
    assert got == expected
    with pytest.raises(td.errors.OutOfRangeError):
        distributed.get_next()

    assert [[int(x) for x in strategy.unwrap(group)] for group in strategy.distribute_dataset(dataset)] == expected
    iterator = iter(strategy.distribute_dataset(dataset))
    for _ in range(steps):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)

    if n > 1:
        first = strategy.distribute_dataset(dataset).get_next()
        assert isinstance(first, td.distribute.PerReplica)
        assert [d.name for d in first._devices] == strategy.worker_devices


def test_distribute_dataset_iterators(strategy):
    n = strategy.num_replicas_in_sync
    dataset = td.data.Dataset.range(2 * n)
    distributed = strategy.distribute_dataset(dataset)

    one_shot = distributed.make_one_shot_iterator()
    assert [int(x) for x in strategy.unwrap(one_shot.get_next())] == list(range(n))
    assert [int(x) for x in strategy.unwrap(one_shot.get_next())] == list(range(n, 2 * n))
    with pytest.raises(td.errors.OutOfRangeError):
        one_shot.get_next()

    initializable = distributed.make_initializable_iterator()
    first = [int(x) for x in strategy.unwrap(initializable.get_next())]
    initializable.get_next()
    initializable.initialize()
    assert [int(x) for x in strategy.unwrap(initializable.get_next())] == first == list(range(n))
    initializable.initializer()  # TF 1.x runs iterator.initializer; here it is called
    assert [int(x) for x in strategy.unwrap(initializable.get_next())] == list(range(n))


def test_distribute_dataset_accepts_a_dataset_fn(strategy):
    n = strategy.num_replicas_in_sync
    calls = []

    def dataset_fn():
        calls.append(1)
        return td.data.Dataset.range(n)

    distributed = strategy.distribute_dataset(dataset_fn)
    assert [int(x) for x in strategy.unwrap(distributed.get_next())] == list(range(n))
    assert calls == [1]


def test_distribute_dataset_fn_returning_a_non_dataset_raises(strategy):
    with pytest.raises(ValueError, match="must return a tf.data.Dataset"):
        strategy.distribute_dataset(lambda: [1, 2, 3])
    assert_usable(strategy)


def test_the_dialect_names_are_the_same_objects():
    assert td.compat.v1.distribute.MirroredStrategy is td.contrib.distribute.MirroredStrategy
    assert td.contrib.distribute.get_tower_context is td.compat.v1.get_tower_context
    assert td.compat.v1.distribute.get_tower_context is td.compat.v1.get_tower_context
    assert issubclass(td.compat.v1.distribute.MirroredStrategy, td.distribute.MirroredStrategy)
    assert td.contrib.distribute.DistributionStrategy is td.distribute.Strategy
    assert td.contrib.distribute.OneDeviceStrategy is td.distribute.OneDeviceStrategy
    assert td.contrib.distribute.ReductionToOneDeviceCrossTowerOps is td.distribute.ReductionToOneDevice
    assert td.contrib.distribute.CrossTowerOps is td.distribute.CrossDeviceOps
    assert td.contrib.distribute.get_update_device is td.distribute.get_update_device
    assert td.contrib.distribute.get_loss_reduction() is ReduceOp.SUM
    assert tf.VariableAggregation.ONLY_FIRST_TOWER is tf.VariableAggregation.ONLY_FIRST_REPLICA


def test_compat_v1_reaches_contrib_so_mixed_spellings_run():
    assert tf.contrib.distribute.MirroredStrategy is tf.distribute.MirroredStrategy


def test_contrib_update_context_takes_a_device_string():
    with td.contrib.distribute.UpdateContext("/cpu:1"):
        assert td.distribute.get_update_device() == canonical("/cpu:1")
    assert td.distribute.get_update_device() is None


def test_constructor_rejects_devices_and_num_gpus_together():
    with pytest.raises(ValueError, match="only specify one of `devices` and `num_gpus`"):
        tf.distribute.MirroredStrategy(["CPU:0"], num_gpus=1)


def test_constructor_rejects_an_empty_device_list():
    with pytest.raises(ValueError, match="at least one device"):
        tf.distribute.MirroredStrategy([])


def test_constructor_num_gpus_without_a_gpu_names_the_device():
    if td.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match=r"(?i)gpu:0"):
        tf.distribute.MirroredStrategy(num_gpus=1)


def test_constructor_rejects_duplicate_devices_and_zero_gpus():
    with pytest.raises(ValueError, match="No duplicates allowed"):
        tf.distribute.MirroredStrategy(["CPU:0", "/cpu:0"])
    with pytest.raises(ValueError, match="at least one device"):
        tf.distribute.MirroredStrategy(num_gpus=0)


def test_constructor_without_devices_uses_every_logical_cpu_when_there_is_no_gpu():
    if td.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    strategy = tf.distribute.MirroredStrategy()
    expected = [canonical(d.name) for d in td.config.list_logical_devices("CPU")]
    assert strategy.worker_devices == expected
    assert strategy.num_towers == len(expected)


def test_tower_order_follows_the_devices_argument():
    strategy = tf.distribute.MirroredStrategy(["CPU:1", "CPU:0"])
    assert strategy.worker_devices == [canonical("CPU:1"), canonical("CPU:0")]
    received: dict[int, tuple[int, str | None]] = {}
    lock = threading.Lock()

    def fn(device_id):
        with lock:
            received[tf.get_tower_context().tower_id] = (device_id, current_device())

    strategy.call_for_each_tower(fn, strategy.worker_device_index)
    assert received == {0: (0, canonical("CPU:1")), 1: (1, canonical("CPU:0"))}


class CountingReduction(td.distribute.ReductionToOneDevice):
    """ReductionToOneDevice that records each reduction it performs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[ReduceOp] = []

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        self.calls.append(reduce_op)
        return super().reduce_implementation(reduce_op, per_replica_value, destinations, options)


def test_cross_tower_ops_is_used_as_the_cross_device_ops():
    ops = CountingReduction()
    strategy = tf.distribute.MirroredStrategy(cpus(2), cross_tower_ops=ops)
    value = per_tower_arrays(strategy)
    result = strategy.reduce("mean", value)
    assert ops.calls == [ReduceOp.MEAN]
    for component in strategy.unwrap(result):
        np.testing.assert_allclose(component, np.sum(tower_values(2), axis=0) / 2)
    # And by the TF 2 API of the same strategy.
    strategy.extended.reduce_to(ReduceOp.SUM, value, value)
    assert ops.calls == [ReduceOp.MEAN, ReduceOp.SUM]


def test_prefetch_on_device_yields_the_same_elements():
    plain = tower(2)
    prefetching = tf.distribute.MirroredStrategy(cpus(2), prefetch_on_device=True)
    dataset = td.data.Dataset.range(9)
    got = [[int(x) for x in prefetching.unwrap(group)] for group in prefetching.distribute_dataset(dataset)]
    want = [[int(x) for x in plain.unwrap(group)] for group in plain.distribute_dataset(dataset)]
    assert got == want == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_deepcopy_gives_the_tower_class_with_the_same_devices():
    original = tower(2)
    duplicate = copy.deepcopy(original)
    assert duplicate is not original
    assert type(duplicate) is tf.distribute.MirroredStrategy
    assert duplicate.worker_devices == original.worker_devices
    assert duplicate.num_towers == 2
    assert duplicate.unwrap(duplicate.call_for_each_tower(lambda: tf.get_tower_context().tower_id)) == [0, 1]


def test_group_and_configure(strategy):
    value = per_tower_arrays(strategy)
    assert strategy.group(value) is None
    assert strategy.group(value, name="grouped") is None
    assert strategy.configure() is None
    assert strategy.configure(session_config={"allow_soft_placement": True}) is None
    assert_usable(strategy)


# --- 3. run_concurrently=False -------------------------------------------------------------


def test_run_concurrently_false_runs_towers_one_at_a_time_in_tower_order():
    strategy = tower(4)
    events: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def record(*event: Any) -> None:
        with lock:
            events.append(event)

    def merge_fn(dist, value, round_number):
        record("merge", round_number)
        return sum(dist.unwrap(value))

    def fn(x):
        ctx = tf.get_tower_context()
        t = ctx.tower_id
        record(t, "start")
        record(t, "before merge 1")
        a = ctx.merge_call(merge_fn, x + t, round_number=1)
        record(t, "after merge 1")
        record(t, "before merge 2")
        b = ctx.merge_call(merge_fn, a * (t + 1), round_number=2)
        record(t, "after merge 2")
        record(t, "end")
        return b + t

    sequential = strategy.unwrap(strategy.call_for_each_tower(fn, 1, run_concurrently=False))
    towers = range(4)
    expected_events = (
        [e for t in towers for e in ((t, "start"), (t, "before merge 1"))]
        + [("merge", 1)]
        + [e for t in towers for e in ((t, "after merge 1"), (t, "before merge 2"))]
        + [("merge", 2)]
        + [e for t in towers for e in ((t, "after merge 2"), (t, "end"))]
    )
    assert events == expected_events

    a = sum(1 + t for t in towers)
    b = sum(a * (t + 1) for t in towers)
    assert sequential == [b + t for t in towers]
    concurrent = strategy.unwrap(strategy.call_for_each_tower(fn, 1))
    assert concurrent == sequential


def test_run_concurrently_false_exception_propagates_and_strategy_recovers():
    strategy = tower(4)
    started = []
    lock = threading.Lock()

    def fn():
        ctx = tf.get_tower_context()
        with lock:
            started.append(ctx.tower_id)
        if ctx.tower_id == 2:
            raise KeyError("tower two failed")
        ctx.merge_call(lambda dist: None)
        return ctx.tower_id

    with pytest.raises(KeyError, match="tower two failed") as info:
        strategy.call_for_each_tower(fn, run_concurrently=False)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert re.search(r"\b(replica|tower) 2\b", notes), notes
    # Towers ran in order, and tower 3 never started once tower 2 had failed.
    assert started == [0, 1, 2]

    assert strategy.unwrap(
        strategy.call_for_each_tower(lambda: tf.get_tower_context().tower_id, run_concurrently=False)
    ) == [0, 1, 2, 3]
    assert_usable(strategy)


@pytest.mark.parametrize("value", [0, 1, "False", None])
def test_run_concurrently_must_be_a_bool(value):
    strategy = tower(2)
    with pytest.raises(TypeError, match="run_concurrently"):
        strategy.call_for_each_tower(lambda: 1, run_concurrently=value)
    assert_usable(strategy)


def test_a_sequential_tower_waiting_for_a_later_tower_times_out_instead_of_hanging(replica_timeouts):
    # Tower 0 waits for tower 1, which only runs after tower 0's turn: a deadlock that the
    # watch must turn into DeadlineExceededError naming tower 0 (no barrier is ever reached).
    strategy = tf.distribute.MirroredStrategy(cpus(2))
    released = threading.Event()

    def fn():
        if tf.get_tower_context().tower_id == 0:
            released.wait(30.0)
        else:
            released.set()

    replica_timeouts(warning_seconds=None, timeout_seconds=1.0)
    try:
        with pytest.raises(td.errors.DeadlineExceededError, match="Replica 0 .*sequential step") as caught:
            strategy.call_for_each_tower(fn, run_concurrently=False)
    finally:
        released.set()  # let the abandoned thread finish
    assert caught.value.missing == [0]
    assert strategy.unwrap(strategy.call_for_each_tower(lambda: tf.get_tower_context().tower_id)) == [0, 1]
    # Concurrently the same function completes.
    released.clear()
    strategy.call_for_each_tower(fn)
    assert released.is_set()


def test_a_slow_sequential_step_is_timed_per_turn_not_per_round(replica_timeouts):
    # Each tower's turn stays under the timeout while the whole round exceeds it.
    # 6 turns of 0.3 s: the round lasts 1.5 s after the first arrival, each turn 0.3 s.
    strategy = tf.distribute.MirroredStrategy(cpus(6))
    per_turn_s = 0.3

    def fn():
        deadline = time.monotonic() + per_turn_s
        while time.monotonic() < deadline:  # work, not synchronisation
            pass
        ctx = tf.get_tower_context()
        return ctx.merge_call(lambda s, x: sum(s.unwrap(x)), ctx.tower_id) + ctx.tower_id

    replica_timeouts(warning_seconds=None, timeout_seconds=1.2)
    result = strategy.call_for_each_tower(fn, run_concurrently=False)
    assert strategy.unwrap(result) == [15 + i for i in range(6)]


# --- 4. deprecation warnings ---------------------------------------------------------------


@contextmanager
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def deprecations(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, DeprecationWarning)]


def here() -> int:
    """The line number of the caller's current line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def assert_one_warning_at(caught: list[warnings.WarningMessage], line: int, old: str, new: str) -> None:
    found = deprecations(caught)
    assert len(found) == 1, [str(w.message) for w in found]
    (w,) = found
    assert w.filename == __file__
    assert w.lineno == line
    assert old in str(w.message)
    assert new in str(w.message)


def test_module_attribute_warns_once_at_the_users_line():
    import towerdist.compat.v1 as tf

    with recorded() as caught:
        first = tf.get_tower_context; line = here()
    assert_one_warning_at(caught, line, "towerdist.compat.v1.get_tower_context", "get_replica_context()")
    with recorded() as caught:
        second = tf.get_tower_context
    assert deprecations(caught) == []
    assert first is second


def test_import_form_warns_once_at_the_import_line():
    with recorded() as caught:
        line = here() + 1  # the import on the next line
        from towerdist.compat.v1 import get_tower_context
    assert_one_warning_at(caught, line, "towerdist.compat.v1.get_tower_context", "get_replica_context()")
    assert get_tower_context().tower_id == 0
    with recorded() as caught:
        from towerdist.compat.v1 import get_tower_context as again
    assert deprecations(caught) == []
    assert again is get_tower_context


def test_contrib_class_warns_once_at_the_users_line():
    with recorded() as caught:
        cls = td.contrib.distribute.MirroredStrategy; line = here()
    assert_one_warning_at(
        caught, line, "towerdist.contrib.distribute.MirroredStrategy", "towerdist.compat.v1.distribute.MirroredStrategy"
    )
    with recorded() as caught:
        assert td.contrib.distribute.MirroredStrategy is cls
    assert deprecations(caught) == []


def test_collective_hints_warns_once_at_the_users_line():
    with recorded() as caught:
        hints = td.distribute.experimental.CollectiveHints; line = here()
    assert_one_warning_at(
        caught,
        line,
        "towerdist.distribute.experimental.CollectiveHints",
        "towerdist.distribute.experimental.CommunicationOptions",
    )
    with recorded() as caught:
        options = hints(bytes_per_pack=1024)
        assert td.distribute.experimental.CollectiveHints is hints
    assert deprecations(caught) == []
    assert isinstance(options, td.distribute.experimental.CommunicationOptions)
    assert options.bytes_per_pack == 1024


def test_strategy_methods_warn_once_at_the_users_line():
    strategy = mirrored(2)
    with recorded() as caught:
        run_v2 = strategy.experimental_run_v2; line = here()
    assert_one_warning_at(caught, line, "Strategy.experimental_run_v2", "Strategy.run()")
    with recorded() as caught:
        unwrap = strategy.unwrap; line = here()
    assert_one_warning_at(caught, line, "Strategy.unwrap", "Strategy.experimental_local_results()")
    with recorded() as caught:
        assert strategy.experimental_run_v2(lambda: 1) == run_v2(lambda: 1) == 1
        assert strategy.unwrap(5) == unwrap(5) == (5,)
    assert deprecations(caught) == []


def test_tower_method_warns_once_where_it_is_called_and_property_where_it_is_read():
    strategy = tower(2)
    with recorded() as caught:
        call = strategy.call_for_each_tower
    assert deprecations(caught) == []  # a method defined in the class body warns when called
    with recorded() as caught:
        assert call(lambda: 7) == 7; line = here()
    assert_one_warning_at(caught, line, "compat.v1.MirroredStrategy.call_for_each_tower", "Strategy.run(")
    with recorded() as caught:
        count = strategy.num_towers; line = here()
    assert_one_warning_at(caught, line, "compat.v1.MirroredStrategy.num_towers", "Strategy.num_replicas_in_sync")
    assert count == 2
    with recorded() as caught:
        assert strategy.num_towers == 2
        assert call(lambda: 7) == 7
    assert deprecations(caught) == []


def test_enum_alias_warns_once_at_the_users_line():
    with recorded() as caught:
        member = tf.VariableAggregation.ONLY_FIRST_TOWER; line = here()
    assert_one_warning_at(caught, line, "VariableAggregation.ONLY_FIRST_TOWER", "VariableAggregation.ONLY_FIRST_REPLICA")
    assert member is tf.VariableAggregation.ONLY_FIRST_REPLICA
    with recorded() as caught:
        assert tf.VariableAggregation.ONLY_FIRST_TOWER is member
    assert deprecations(caught) == []


def test_an_old_name_used_by_every_tower_warns_once_at_the_users_line():
    strategy = tower(4)
    lines = []

    def fn():
        ctx = tf.get_tower_context(); lines.append(here())
        return ctx.tower_id

    with recorded() as caught:
        assert strategy.run(fn) is not None
    found = deprecations(caught)
    assert len(found) == 1, [str(w.message) for w in found]
    assert found[0].filename == __file__ and found[0].lineno == lines[0]
    assert "get_tower_context" in str(found[0].message)


def test_class_level_access_does_not_warn_and_has_a_signature():
    with recorded() as caught:
        run_v2 = td.distribute.Strategy.experimental_run_v2
        call = tf.distribute.MirroredStrategy.call_for_each_tower
        num_towers = tf.distribute.MirroredStrategy.num_towers
    assert deprecations(caught) == []
    assert list(inspect.signature(run_v2).parameters) == ["self", "fn", "args", "kwargs", "options"]
    assert list(inspect.signature(call).parameters) == ["self", "fn", "args", "kwargs"]
    assert isinstance(num_towers, property)
    assert num_towers.fget(tower(2)) == 2


def _owner_object(alias: aliases.Alias) -> Any:
    if alias.owner == aliases.STRATEGY:
        return mirrored(2)
    if alias.owner == aliases.TOWER_STRATEGY:
        return tower(2)
    if alias.owner == aliases.AGGREGATION:
        return td.VariableAggregation
    if alias.owner == getattr(aliases, "EXTENDED", None):
        return mirrored(2).extended
    if alias.owner == aliases.METRIC:
        return td.metrics.Mean()
    assert alias.owner.startswith("towerdist."), f"no test object for the owner of {alias.old}"
    return importlib.import_module(alias.owner)


def _tower_variable(strategy: Any) -> Any:
    with strategy.scope():
        return tf.Variable(1.0)


# One call of each tower-era method, with the plain result it must give on 2 towers.
_TOWER_CALLS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, Any], bool]]] = {
    "call_for_each_tower": (lambda s: s.call_for_each_tower(lambda: 3), lambda s, r: r == 3),
    "tower_local_var_scope": (lambda s: s.tower_local_var_scope("sum"), lambda s, r: hasattr(r, "__enter__")),
    "unwrap": (lambda s: s.unwrap(5), lambda s, r: r == [5]),
    "fetch": (lambda s: s.fetch(2.0), lambda s, r: float(r) == 2.0),
    "map": (lambda s: s.map([1, 2, 3], lambda x: x * 10), lambda s, r: s.reduce("sum", r) is not None),
    "distribute_dataset": (
        lambda s: s.distribute_dataset(tf.data.Dataset.range(4)),
        lambda s, r: [list(s.unwrap(x)) for x in r] == [[0, 1], [2, 3]],
    ),
    "batch_reduce": (lambda s: s.batch_reduce("mean", [(1.0, None)]), lambda s, r: len(r) == 1),
    "broadcast": (
        lambda s: s.broadcast(np.ones(2)),
        lambda s, r: len(s.unwrap(r)) == 2 and all((x == 1.0).all() for x in s.unwrap(r)),
    ),
    "update": (
        lambda s: s.update(_tower_variable(s), lambda v: v.assign_add(1.0)),
        lambda s, r: [float(np.asarray(x)) for x in s.unwrap(r)] == [2.0, 2.0],
    ),
    "update_non_slot": (
        lambda s: s.update_non_slot(s.extended.non_slot_devices([]), lambda: 4),
        lambda s, r: r == 4,
    ),
    "non_slot_devices": (lambda s: s.non_slot_devices([]), lambda s, r: len(r) == 2),
    "read_var": (lambda s: s.read_var(_tower_variable(s)), lambda s, r: float(np.asarray(r)) == 1.0),
}


def test_every_tower_method_has_a_sample_call():
    names = {a.name for a in aliases.all_aliases() if a.owner == aliases.TOWER_STRATEGY and a.kind == "method"}
    assert names == set(_TOWER_CALLS)


@pytest.mark.parametrize(
    "alias",
    [a for a in aliases.all_aliases() if a.owner == aliases.TOWER_STRATEGY and a.kind == "method"],
    ids=lambda a: a.old,
)
def test_every_tower_method_warns_once_when_called_and_then_works(alias):
    strategy = tower(2)
    call, check = _TOWER_CALLS[alias.name]
    method = getattr(strategy, alias.name)
    assert method.__func__ is alias.resolve() and method.__self__ is strategy
    with recorded() as caught:
        result = call(strategy)
    # The warning points at the caller's line: the sample call in _TOWER_CALLS.
    assert_one_warning_at(caught, call.__code__.co_firstlineno, alias.old, alias.new)
    assert check(strategy, result)
    with recorded() as caught:
        assert check(strategy, call(strategy))
    assert deprecations(caught) == []


@pytest.mark.parametrize(
    "alias",
    [a for a in aliases.all_aliases() if not (a.owner == aliases.TOWER_STRATEGY and a.kind == "method")],
    ids=lambda a: a.old,
)
def test_every_alias_resolves_and_warns_once_naming_its_replacement(alias):
    owner = _owner_object(alias)
    target = alias.resolve()
    with recorded() as caught:
        value = getattr(owner, alias.name); line = here()
    assert_one_warning_at(caught, line, alias.old, alias.new)

    if alias.kind == "method":
        assert value.__func__ is target and value.__self__ is owner
    elif alias.kind == "property":
        expected = target.fget(owner) if isinstance(target, property) else target(owner)
        if isinstance(expected, td.distribute.DistributedValues):
            assert type(value) is type(expected) and value.values == expected.values
        else:
            assert value == expected
    else:
        assert value is target

    with recorded() as caught:
        getattr(owner, alias.name)
    assert deprecations(caught) == []


@pytest.mark.parametrize(
    "module_name", ["towerdist.compat.v1", "towerdist.compat.v1.distribute", "towerdist.contrib.distribute"]
)
def test_dir_lists_the_old_names(module_name):
    module = importlib.import_module(module_name)
    old_names = {a.name for a in aliases.all_aliases() if a.owner == module_name}
    assert old_names and old_names <= set(dir(module))
    assert "get_tower_context" in dir(module)


def test_dir_of_compat_v1_keeps_its_own_names():
    listing = dir(tf)
    assert {"distribute", "Variable", "VariableAggregation", "get_tower_context", "get_cross_tower_context"} <= set(
        listing
    )


@pytest.mark.parametrize(
    "module_name",
    [
        "towerdist.compat.v1",
        "towerdist.compat.v1.distribute",
        "towerdist.contrib.distribute",
        "towerdist.distribute.experimental",
    ],
)
def test_unknown_attributes_raise_attribute_error_naming_the_module(module_name):
    module = importlib.import_module(module_name)
    with recorded() as caught:
        with pytest.raises(AttributeError, match=re.escape(module_name)) as info:
            module.get_tower_contxt  # noqa: B018
    assert "get_tower_contxt" in str(info.value)
    assert deprecations(caught) == []


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
