"""The strategies' one way into cross-device ops (``cross_device_ops/collectives.py``).

A library algorithm is its own ``Collectives``; a user's subclass is wrapped once, when the
strategy is built, and keeps TensorFlow's semantics: an overridden public method is called,
otherwise the hooks, with the helper threads lent to the user's code through this thread.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import towerdist as td
from towerdist._src import parallel
from towerdist._src.cross_device_ops.collectives import collectives_for

D = td.distribute
SUM = D.ReduceOp.SUM


def _strategy(ops, n=2):
    return D.MirroredStrategy([f"CPU:{i}" for i in range(n)], cross_device_ops=ops)


def _per_replica(strategy, fill=None):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full(3, float(ctx.replica_id_in_sync_group + 1) if fill is None else fill)
    )


@pytest.mark.parametrize(
    "make",
    [D.SharedMemoryAllReduce, D.ReductionToOneDevice, D.HierarchicalCopyAllReduce, D.NcclAllReduce],
)
def test_a_library_algorithm_is_its_own_collectives(make):
    ops = make()
    assert collectives_for(ops) is ops


def test_a_users_subclass_is_wrapped_once_when_the_strategy_is_built():
    class Mine(D.ReductionToOneDevice):
        pass

    ops = Mine()
    strategy = _strategy(ops)
    wrapped = strategy.extended._collectives
    assert wrapped is not ops and wrapped.ops is ops
    assert strategy.extended._cross_device_ops is ops
    value = _per_replica(strategy)
    strategy.reduce(SUM, value, axis=None)
    strategy.extended.batch_reduce_to(SUM, [(value, value)])
    assert strategy.extended._collectives is wrapped  # nothing decided again per call


def test_a_users_public_reduce_and_batch_reduce_are_called_as_tensorflow_calls_them():
    calls: list[str] = []

    class Mine(D.ReductionToOneDevice):
        def reduce(self, reduce_op, per_replica_value, destinations, options=None):
            calls.append("reduce")
            return super().reduce(reduce_op, per_replica_value, destinations, options)

        def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
            calls.append("batch_reduce")
            return super().batch_reduce(reduce_op, value_destination_pairs, options)

    strategy = _strategy(Mine())
    value = _per_replica(strategy)
    assert float(strategy.reduce(SUM, value, axis=None)[0]) == 3.0
    assert calls == ["reduce"]
    # A batch onto the values' own devices takes the user's batch_reduce, not the collective path.
    (batch,) = strategy.extended.batch_reduce_to(SUM, [(value, value)])
    assert [c.tolist() for c in batch.values] == [[3.0] * 3] * 2
    assert calls == ["reduce", "batch_reduce"]
    # ReplicaContext.all_reduce is the collective path: through the hooks.
    reduced = strategy.run(lambda x: D.get_replica_context().all_reduce(SUM, x), args=(value,))
    assert [r.tolist() for r in strategy.experimental_local_results(reduced)] == [[3.0] * 3] * 2
    assert calls == ["reduce", "batch_reduce"]


def test_a_users_hooks_get_the_idle_replica_threads_through_this_thread():
    seen: list[int] = []

    class Mine(D.SharedMemoryAllReduce):
        def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
            seen.append(parallel.max_parts())
            return super().reduce_implementation(reduce_op, per_replica_value, destinations, options)

    strategy = _strategy(Mine(), 4)
    strategy.run(lambda: None)  # the replica threads exist
    strategy.reduce(SUM, _per_replica(strategy), axis=None)
    assert seen == [min(4, os.cpu_count() or 1)]
    assert parallel.max_parts() == 1  # lent for the call only


def test_the_helpers_are_lent_only_when_a_job_runs_in_parts():
    asked: list[int] = []

    def provider():
        asked.append(1)
        return ()

    parallel.run_parts(lambda part: None, 1, provider)
    assert asked == []
    ran_on: list[int] = []
    parallel.run_parts(lambda part: ran_on.append(threading.get_ident()), 3, provider)
    assert asked == [1] and ran_on == [threading.get_ident()] * 3  # no helper: every part here
    assert parallel.max_parts(()) == 1


def test_a_large_reduction_runs_its_parts_on_the_helpers_it_is_given():
    ops = D.SharedMemoryAllReduce(chunk_bytes=4096, parallel_threshold_bytes=4096)
    strategy = _strategy(ops, 4)
    strategy.run(lambda: None)
    big = strategy.experimental_distribute_values_from_function(lambda ctx: np.ones(1 << 16, np.float32))
    given: list[int] = []
    scheduler = strategy.extended._scheduler
    lease = scheduler.lend_idle_helpers()

    def helpers():
        given.append(1)
        return lease()

    try:
        columns = [list(strategy.experimental_local_results(big))]
        reduced = ops._all_reduce(SUM, columns, strategy.extended._devices, D.experimental.CommunicationOptions(),
                                  None, helpers)  # fmt: skip
    finally:
        lease.release()
    assert given  # asked for its helpers (explicitly, not through this thread's state)
    np.testing.assert_array_equal(reduced[0][0], np.full(1 << 16, 4, np.float32))
