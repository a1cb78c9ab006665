"""The seed documents' examples and the reference's conformance checks (section 6) in scope.

Seed 004 (DistributedValues) builds its values from ``from_tensor_slices([5., 6., 7., 8.])
.batch(2)`` distributed over two replicas: the first global batch [5., 6.] becomes
replica 0: [5.], replica 1: [6.] (reference D17). Until the input pipeline lands these
values are built with ``experimental_distribute_values_from_function``.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as tf

from conftest import mirrored


@pytest.fixture
def distributed_values(mirrored_2cpu):
    batch = np.array([5.0, 6.0], dtype=np.float32)
    return mirrored_2cpu.experimental_distribute_values_from_function(
        lambda ctx: batch[ctx.replica_id_in_sync_group : ctx.replica_id_in_sync_group + 1]
    )


def test_seed004_example1_repr(distributed_values):
    assert repr(distributed_values) == (
        "PerReplica:{\n  0: array([5.], dtype=float32),\n  1: array([6.], dtype=float32)\n}"
    )


def test_seed004_example2_returned_by_run(mirrored_2cpu):
    @tf.function
    def run():
        return tf.distribute.get_replica_context().replica_id_in_sync_group

    values = mirrored_2cpu.run(run)
    assert isinstance(values, tf.distribute.PerReplica)
    assert [(int(v), v.dtype) for v in values.values] == [(0, np.int32), (1, np.int32)]


def test_seed004_example3_as_input_into_run(mirrored_2cpu, distributed_values):
    updated = mirrored_2cpu.run(lambda value: value + 1.0, args=(distributed_values,))
    assert isinstance(updated, tf.distribute.PerReplica)
    np.testing.assert_array_equal(updated.values[0], np.array([6.0], np.float32))
    np.testing.assert_array_equal(updated.values[1], np.array([7.0], np.float32))


def test_seed004_example4_as_input_into_reduce(mirrored_2cpu, distributed_values):
    reduced = mirrored_2cpu.reduce(tf.distribute.ReduceOp.SUM, distributed_values, axis=0)
    assert reduced.shape == () and reduced.dtype == np.float32 and reduced == 11.0


def test_seed004_example5_local_results(mirrored_2cpu, distributed_values):
    parts = mirrored_2cpu.experimental_local_results(distributed_values)
    assert isinstance(parts, tuple) and len(parts) == 2
    np.testing.assert_array_equal(parts[0], [5.0])
    np.testing.assert_array_equal(parts[1], [6.0])


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4, 8])
def test_seed000_merge_call_example_in_run_form(num_replicas):
    """Reference D30: replica i returns s + 3 + i with s = sum over replicas of (3 + i)."""
    strategy = mirrored(num_replicas)

    def merge_fn(distribution, three_plus_replica_id):
        return sum(distribution.experimental_local_results(three_plus_replica_id))

    def fn(three):
        replica_ctx = tf.distribute.get_replica_context()
        v = three + replica_ctx.replica_id_in_sync_group
        s = replica_ctx.merge_call(merge_fn, args=(v,))
        return s + v

    with strategy.scope():
        merged = strategy.run(fn, args=[3])
    s = 3 * num_replicas + num_replicas * (num_replicas - 1) // 2
    assert [int(x) for x in strategy.experimental_local_results(merged)] == [s + 3 + i for i in range(num_replicas)]


def test_d5_all_reduce_of_replica_ids(mirrored_2cpu):
    values = mirrored_2cpu.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(ctx.replica_id_in_sync_group)
    )
    result = mirrored_2cpu.run(lambda x: tf.distribute.get_replica_context().all_reduce("sum", x), args=(values,))
    assert isinstance(result, tf.distribute.PerReplica)
    assert [(int(v), v.dtype) for v in result.values] == [(1, np.int32), (1, np.int32)]


def test_d6_reduce_of_identity_replica_ids(mirrored_2cpu):
    per_replica = mirrored_2cpu.run(lambda: tf.identity(tf.distribute.get_replica_context().replica_id_in_sync_group))
    reduced = mirrored_2cpu.reduce("SUM", per_replica, axis=None)
    assert reduced == 1 and reduced.dtype == np.int32


def test_d7_value_context_direct():
    ctx = tf.distribute.experimental.ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=4)
    assert ctx.replica_id_in_sync_group / ctx.num_replicas_in_sync == 0.5
