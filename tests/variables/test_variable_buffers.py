"""Large variable writes reuse the buffer of the previous value, and an aggregated write on
logical CPUs reduces and updates in one pass; no snapshot ever changes."""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from conftest import cpus

BIG = 1 << 16  # float32 elements: 256 KiB, above the size from which buffers are reused
HUGE = 3 << 20  # 12 MiB: the fused write runs in parallel parts


def owner(array: np.ndarray) -> int:
    return id(array if array.base is None else array.base)


def test_a_written_variable_reuses_its_previous_buffer_when_no_snapshot_needs_it():
    v = td.Variable(np.zeros(BIG, np.float32))
    buffers = set()
    for _ in range(6):
        v.assign_add(np.ones(BIG, np.float32), read_value=False)
        buffers.add(owner(v._array))
    assert len(buffers) == 2  # two buffers alternate: no fresh allocation per write
    np.testing.assert_array_equal(v.numpy(), np.full(BIG, 6, np.float32))


@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
def test_snapshots_keep_their_values_through_later_writes(op):
    v = td.Variable(np.zeros(BIG, np.float32))
    snapshots = []
    for k in range(1, 5):
        getattr(v, op)(np.full(BIG, k, np.float32), read_value=False)
        snapshots.append((v.value(), v.numpy().copy()))
        held = np.asarray(v)  # a view handed out by __array__
        snapshots.append((held, held.copy()))
    for snapshot, expected in snapshots:
        np.testing.assert_array_equal(snapshot, expected)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("size", [7, BIG, HUGE])
@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
@pytest.mark.parametrize("aggregation", ["SUM", "MEAN"])
def test_an_aggregated_write_gives_what_reducing_then_writing_gives(n, size, op, aggregation):
    strategy = mirrored_strategy_for(n)
    rng = np.random.default_rng(size + n)
    initial = rng.standard_normal(size).astype(np.float32)
    parts = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    with strategy.scope():
        v = td.Variable(initial, aggregation=getattr(td.VariableAggregation, aggregation))
    values = strategy.experimental_distribute_values_from_function(lambda ctx: parts[ctx.replica_id_in_sync_group])
    before = v.value()
    for _ in range(2):  # the second write goes into the first write's spare buffer
        results = strategy.run(lambda x: getattr(v, op)(x), args=(values,))
    total = parts[0].copy()
    for part in parts[1:]:
        total += part  # in replica order, as the all-reduce sums
    if aggregation == "MEAN":
        total /= np.float32(n)
    expected = {"assign": total, "assign_add": initial + total + total, "assign_sub": initial - total - total}[op]
    for component in v.values:
        np.testing.assert_array_equal(component.numpy(), expected)
    for result in strategy.experimental_local_results(results):
        np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(before, initial)  # a snapshot taken before is untouched


def test_the_same_object_from_every_replica_still_gets_the_sum_error():
    strategy = mirrored_strategy_for(2)
    with strategy.scope():
        v = td.Variable(np.zeros(BIG, np.float32), aggregation=td.VariableAggregation.SUM)
    shared = np.ones(BIG, np.float32)
    with pytest.raises(ValueError, match="cannot be reduced with the given reduce op ReduceOp.SUM"):
        strategy.run(lambda: v.assign_add(shared))
    np.testing.assert_array_equal(v.numpy(), np.zeros(BIG, np.float32))


def test_a_users_own_shared_memory_ops_still_reduce_aggregated_writes():
    """The one-pass write is for the library's own reduction: a subclass's reduce is called."""
    calls: list[str] = []

    class CountingOps(td.distribute.SharedMemoryAllReduce):
        def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
            calls.append("reduce_implementation")
            return super().reduce_implementation(reduce_op, per_replica_value, destinations, options)

    strategy = td.distribute.MirroredStrategy(cpus(2), cross_device_ops=CountingOps())
    with strategy.scope():
        v = td.Variable(np.zeros(BIG, np.float32), aggregation=td.VariableAggregation.SUM)
    values = strategy.experimental_distribute_values_from_function(lambda ctx: np.ones(BIG, np.float32))
    strategy.run(lambda x: v.assign_add(x), args=(values,))
    assert calls == ["reduce_implementation"]
    np.testing.assert_array_equal(v.numpy(), np.full(BIG, 2, np.float32))
