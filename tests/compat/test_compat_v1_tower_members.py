"""The TF 1.x tower dialect: each tower-era member against its TF 2 equivalent on 1, 2 and 4 towers.

Expected values are computed independently in the tests (plain Python/numpy over the
per-tower inputs), never copied from a run.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np
import pytest

import towerdist as td
import towerdist.compat.v1 as tf
from towerdist._src.compat.tower_context import TowerContext
from towerdist._src.variables.distributed_variable import MirroredVariable, SyncOnReadVariable

import compat_v1_helpers
from compat_v1_helpers import ReduceOp, assert_usable, canonical, current_device, per_tower_arrays, tower, tower_values
from conftest import cpus

# The helpers' fixtures, by name (an import would read as unused)
fresh_warnings = compat_v1_helpers.fresh_warnings
strategy = compat_v1_helpers.strategy

# The tower-era names warn on purpose; the tests of the warnings record them explicitly.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


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
