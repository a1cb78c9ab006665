"""Reducing ``td.IndexedSlices`` across replicas (``cross_device_ops/sparse.py``).

Every API that reduces (``ReplicaContext.all_reduce``, ``Strategy.reduce``,
``extended.reduce_to``/``batch_reduce_to``, each ``CrossDeviceOps``'s public
``reduce``/``batch_reduce``) is checked against numpy: the densified result must equal the
sum (or mean) of the replicas' densified inputs, and the result must be in canonical form
(int64 indices, strictly increasing), a decided difference from TensorFlow, which
concatenates the replicas' slices (the densified value is identical).

The replicas' slices overlap on purpose: repeated rows within one replica, rows shared
between replicas, different row counts, and one replica with no row at all.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import towerdist as td
from towerdist._src.backend import cupy_backend
from towerdist._src.cross_device_ops import sparse
from towerdist._src.device import parse
from towerdist.errors import InvalidArgumentError

from conftest import cpus
from numpy_reference import numpy_reduce

D = td.distribute
SUM, MEAN = D.ReduceOp.SUM, D.ReduceOp.MEAN
TABLE = (8, 3)  # the dense shape of every replica's slices
# Replica r contributes rows ROWS[r % 4]: repeats within a replica (3, 5), rows shared between
# replicas (0, 1, 5), different counts, and replica 2 contributes none.
ROWS = [[0, 3, 3, 5], [1, 5], [], [5, 0, 7, 5, 1]]
CPU_OPS = {
    "shared_memory": D.SharedMemoryAllReduce,
    "reduction_to_one_device": D.ReductionToOneDevice,
    "hierarchical_copy": D.HierarchicalCopyAllReduce,
}
GPU_OPS = {"nccl": D.NcclAllReduce, "hierarchical_copy": D.HierarchicalCopyAllReduce, "reduction_to_one_device": D.ReductionToOneDevice}
DTYPES = [np.int32, np.float32, np.float64]
APIS = ["all_reduce", "strategy_reduce", "reduce_to", "batch_reduce_to", "ops_reduce", "ops_batch_reduce"]


# --- helpers --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def mirrored(ops: str, n: int, kind: str = "CPU") -> D.MirroredStrategy:
    """A cached MirroredStrategy over ``n`` devices of ``kind`` with the named cross-device ops."""
    table = CPU_OPS if kind == "CPU" else GPU_OPS
    names = cpus(n) if kind == "CPU" else [f"GPU:{i}" for i in range(n)]
    return D.MirroredStrategy(names, cross_device_ops=table[ops]())


def make_slices(replica: int, dtype=np.float32, rows=None) -> td.IndexedSlices:
    """Replica ``replica``'s slices of TABLE (values differ per replica and per slice)."""
    rows = ROWS[replica % len(ROWS)] if rows is None else rows
    values = (np.arange(len(rows) * TABLE[1]).reshape(len(rows), TABLE[1]) + 100 * replica + 1).astype(dtype)
    indices = np.array(rows, np.int32 if replica % 2 else np.int64)
    return td.IndexedSlices(td.constant(values), td.constant(indices), list(TABLE))


def replica_slices(dtype=np.float32):
    """A replica function: this replica's slices."""
    return make_slices(int(D.get_replica_context().replica_id_in_sync_group), dtype)


def dense_inputs(strategy, per_replica) -> list[np.ndarray]:
    return [np.asarray(s) for s in strategy.experimental_local_results(per_replica)]


def assert_slices(result, expected: np.ndarray, canonical: bool = True) -> None:
    """``result`` is an IndexedSlices whose densified value is ``expected`` (dtype too), canonical if asked."""
    assert isinstance(result, td.IndexedSlices), type(result)
    indices = cupy_backend.xp.asnumpy(result.indices) if cupy_backend.owns(result.indices) else np.asarray(result.indices)
    if canonical:
        assert indices.dtype == np.int64
        assert np.all(np.diff(indices) > 0), indices
    assert result.dense_shape.tolist() == list(expected.shape)
    dense = np.asarray(result)
    assert dense.dtype == expected.dtype
    if expected.dtype.kind in "iu":
        np.testing.assert_array_equal(dense, expected)
    else:
        np.testing.assert_allclose(dense, expected, rtol=1e-6, atol=1e-6)


def check_against_dense(strategy, api, op, dtype, canonical=True) -> None:
    """The sparse reduction through ``api`` densifies to the dense reduction of the densified inputs
    through the same API (value and dtype), and to numpy's sum (or mean) of them."""
    per_replica = strategy.run(replica_slices, args=(dtype,))
    inputs = dense_inputs(strategy, per_replica)
    dense_results = reduced_by(api, strategy, op, strategy.run(lambda: np.asarray(replica_slices(dtype))))
    results = reduced_by(api, strategy, op, per_replica)
    assert len(results) == len(dense_results) > 0
    for result, dense in zip(results, dense_results):
        assert_slices(result, np.asarray(dense), canonical)
        np.testing.assert_allclose(np.asarray(result), numpy_reduce(op, inputs), rtol=1e-6)


def reduced_by(api: str, strategy, op, per_replica):
    """The results of reducing ``per_replica`` with ``api``, one per place they land."""
    devices = ("CPU:0",) if strategy is D.get_strategy() else strategy.extended.worker_devices
    ops = strategy.extended._cross_device_ops if hasattr(strategy.extended, "_cross_device_ops") else None
    if api == "all_reduce":
        result = strategy.run(lambda v: D.get_replica_context().all_reduce(op, v), args=(per_replica,))
        return list(strategy.experimental_local_results(result))
    if api == "strategy_reduce":
        return [strategy.reduce(op, per_replica, axis=None)]
    if api == "reduce_to":
        return list(strategy.experimental_local_results(strategy.extended.reduce_to(op, per_replica, per_replica)))
    if api == "batch_reduce_to":
        first, second = strategy.extended.batch_reduce_to(op, [(per_replica, devices[0]), (per_replica, per_replica)])
        return [first, *strategy.experimental_local_results(second)]
    if ops is None:
        pytest.skip("this strategy has no CrossDeviceOps")
    value = per_replica if isinstance(per_replica, D.DistributedValues) else D.PerReplica([per_replica], tuple(parse(d) for d in devices))
    if api == "ops_reduce":
        return list(strategy.experimental_local_results(ops.reduce(op, value, destinations=value)))
    first, second = ops.batch_reduce(op, [(value, devices[-1]), (value, value)])
    return [first, *strategy.experimental_local_results(second)]


# --- every API, every library algorithm, 1/2/4 logical CPUs -----------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("n", [1, 2, 4], ids=lambda n: f"{n}cpu")
@pytest.mark.parametrize("ops", list(CPU_OPS))
def test_sparse_reduction_equals_the_sum_of_the_densified_inputs(ops, n, api, op, dtype):
    # With one replica strategy.run returns the value itself, and the MEAN of a non-distributed
    # value is that value (TensorFlow's rule, as for dense values): only SUMs must be canonical.
    check_against_dense(mirrored(ops, n), api, op, dtype, canonical=n > 1 or op is SUM or api == "all_reduce")


@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("api", APIS[:4])
@pytest.mark.parametrize("name", ["default", "one_device_cpu", "central_storage_2cpu"])
def test_other_strategies_reduce_sparse_values_too(request, name, api, op):
    # The default and one-device strategies return a non-distributed value itself (TensorFlow's
    # _reduce_to), so only their all_reduce (and CentralStorage's reductions) are canonical.
    strategy = request.getfixturevalue(name)
    check_against_dense(strategy, api, op, np.float64, canonical=name == "central_storage_2cpu" or api == "all_reduce")


@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
def test_every_replica_empty_gives_an_empty_result(op):
    strategy = mirrored("shared_memory", 2)
    empty = strategy.run(lambda: make_slices(0, rows=[]))
    result = strategy.reduce(op, empty, axis=None)
    assert_slices(result, np.zeros(TABLE, np.float32))
    assert result.values.shape == (0, TABLE[1])


def test_a_table_of_zero_rows_reduces_to_no_row():
    strategy = mirrored("shared_memory", 2)
    empty = strategy.run(lambda: td.IndexedSlices(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), [0, 3]))
    result = strategy.reduce(SUM, empty, axis=None)
    assert result.dense_shape.tolist() == [0, 3] and result.values.shape == (0, 3)


def test_values_of_higher_rank_reduce_row_by_row():
    strategy = mirrored("shared_memory", 2)

    def fn():
        r = int(D.get_replica_context().replica_id_in_sync_group)
        return td.IndexedSlices(np.full((2, 2, 3), r + 1.0), np.array([r, 3]), [4, 2, 3])

    per_replica = strategy.run(fn)
    result = strategy.run(lambda v: D.get_replica_context().all_reduce(SUM, v), args=(per_replica,))
    expected = np.zeros((4, 2, 3))
    expected[0], expected[1], expected[3] = 1, 2, 3
    for part in strategy.experimental_local_results(result):
        np.testing.assert_array_equal(np.asarray(part), expected)


@pytest.mark.parametrize("fraction", [0.0, 2.0], ids=["always_dense", "always_rows"])
@pytest.mark.parametrize("ops", list(CPU_OPS))
def test_the_dense_and_the_rows_merges_give_the_same_result(monkeypatch, ops, fraction):
    # DENSE_FRACTION 0 takes the dense accumulation for every reduction, 2 never.
    strategy = mirrored(ops, 4)
    per_replica = strategy.run(replica_slices, args=(np.float64,))
    expected = numpy_reduce(SUM, dense_inputs(strategy, per_replica))
    monkeypatch.setattr(sparse, "DENSE_FRACTION", fraction)
    result = strategy.reduce(SUM, per_replica, axis=None)
    assert_slices(result, expected)
    np.testing.assert_array_equal(result.indices, [0, 1, 3, 5, 7])  # the rows touched, no others


# --- nests, batches, a user's CrossDeviceOps -----------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4], ids=lambda n: f"{n}cpu")
def test_all_reduce_of_a_nest_mixing_dense_and_sparse_values(n):
    strategy = mirrored("shared_memory", n)

    def fn():
        r = int(D.get_replica_context().replica_id_in_sync_group)
        value = {"emb": make_slices(r), "bias": np.full(3, r + 1.0, np.float32), "more": [make_slices(r + 1, np.float64), np.float32(r)]}
        return value, D.get_replica_context().all_reduce(MEAN, value)

    inputs, result = strategy.run(fn)
    local_inputs = strategy.experimental_local_results(inputs)
    for part in strategy.experimental_local_results(result):
        assert_slices(part["emb"], numpy_reduce(MEAN, [np.asarray(i["emb"]) for i in local_inputs]))
        assert_slices(part["more"][0], numpy_reduce(MEAN, [np.asarray(i["more"][0]) for i in local_inputs]))
        np.testing.assert_allclose(part["bias"], np.full(3, (n + 1) / 2))
        np.testing.assert_allclose(part["more"][1], (n - 1) / 2)


@pytest.mark.parametrize("ops", list(CPU_OPS))
def test_batch_reduce_to_mixes_dense_and_sparse_pairs_in_order(ops):
    strategy = mirrored(ops, 2)
    sparse_value = strategy.run(replica_slices)
    dense_value = strategy.run(lambda: td.constant([1.0, 2.0]) * td.cast(D.get_replica_context().replica_id_in_sync_group + 1, td.float32))
    results = strategy.extended.batch_reduce_to(
        SUM, [(dense_value, "CPU:0"), (sparse_value, "CPU:1"), (dense_value, dense_value), (sparse_value, sparse_value)]
    )
    expected = numpy_reduce(SUM, dense_inputs(strategy, sparse_value))
    np.testing.assert_array_equal(results[0], [3.0, 6.0])
    assert_slices(results[1], expected)
    for part in strategy.experimental_local_results(results[2]):
        np.testing.assert_array_equal(part, [3.0, 6.0])
    for part in strategy.experimental_local_results(results[3]):
        assert_slices(part, expected)


class _RecordingOps(D.CrossDeviceOps):
    """A TF-style user subclass: densifies, sums, and hands back IndexedSlices of every row."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[type]] = []

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        components = list(per_replica_value.values)
        self.seen.append([type(c) for c in components])
        total = numpy_reduce(reduce_op, [np.asarray(c) for c in components])
        result = td.IndexedSlices(total, np.arange(total.shape[0]), list(total.shape))
        return D.Mirrored([result for _ in destinations], destinations)


@pytest.mark.parametrize("api", ["all_reduce", "strategy_reduce", "batch_reduce_to"])
def test_a_users_cross_device_ops_gets_the_indexed_slices_in_its_hook(api):
    ops = _RecordingOps()
    strategy = D.MirroredStrategy(cpus(2), cross_device_ops=ops)
    per_replica = strategy.run(replica_slices)
    expected = numpy_reduce(SUM, dense_inputs(strategy, per_replica))
    results = reduced_by(api, strategy, SUM, per_replica)
    assert ops.seen and all(kinds == [td.IndexedSlices, td.IndexedSlices] for kinds in ops.seen)
    for result in results:
        np.testing.assert_array_equal(np.asarray(result), expected)


# --- results: shared, read-only, never the caller's --------------------------------------------


def test_host_replicas_share_one_read_only_result():
    strategy = mirrored("shared_memory", 2)
    result = strategy.run(lambda: D.get_replica_context().all_reduce(SUM, replica_slices()))
    first, second = strategy.experimental_local_results(result)
    assert np.shares_memory(first.values, second.values)
    assert not first.values.flags.writeable and not first.indices.flags.writeable


@pytest.mark.parametrize("name", ["default", "one_device_cpu", "mirrored_1cpu"])
def test_a_one_replica_all_reduce_is_never_the_callers_arrays(request, name):
    strategy = mirrored("shared_memory", 1) if name == "mirrored_1cpu" else request.getfixturevalue(name)
    values, indices = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), np.array([4, 2])
    given_slices = td.IndexedSlices(values, indices, list(TABLE))
    result = strategy.experimental_local_results(strategy.run(lambda: D.get_replica_context().all_reduce(SUM, given_slices)))[0]
    assert result is not given_slices
    values[...], indices[...] = 0, 0  # the caller reuses its buffers
    expected = np.zeros(TABLE)
    expected[4], expected[2] = [1, 2, 3], [4, 5, 6]
    assert_slices(result, expected)


@pytest.mark.parametrize("api", ["strategy_reduce", "broadcast_to"])
def test_a_non_distributed_value_on_one_mirrored_replica_is_copied_as_a_dense_one_is(api):
    # A fixed bug: broadcast (and so the SUM of a non-distributed value on one replica) put read-only
    # views of the caller's own arrays in the result, while dense values are copied.
    strategy = mirrored("shared_memory", 1)
    values = np.array([[1.0, 2.0, 3.0]])
    given_slices = td.IndexedSlices(values, np.array([6]), list(TABLE))
    if api == "strategy_reduce":
        result = strategy.reduce(SUM, given_slices, axis=None)
    else:
        result = strategy.experimental_local_results(strategy.extended.broadcast_to(given_slices, "CPU:0"))[0]
    assert not np.shares_memory(result.values, values)
    values[...] = 0
    np.testing.assert_array_equal(np.asarray(result)[6], [1.0, 2.0, 3.0])


def test_an_indexed_slices_is_a_destination_as_in_tensorflow():
    # A fixed bug: TensorFlow's validate_destinations takes an IndexedSlices (its values' device);
    # resolve_destinations refused it.
    strategy = mirrored("shared_memory", 2)
    per_replica = strategy.run(replica_slices)
    result = strategy.extended.reduce_to(SUM, per_replica, destinations=make_slices(0))
    assert result.device.endswith("CPU:0")
    assert_slices(result, numpy_reduce(SUM, dense_inputs(strategy, per_replica)))


# --- errors, and the strategy works afterwards --------------------------------------------------


def assert_still_reduces(strategy) -> None:
    per_replica = strategy.run(replica_slices)
    assert_slices(strategy.reduce(SUM, per_replica, axis=None), numpy_reduce(SUM, dense_inputs(strategy, per_replica)))


def _by_replica(*choices):
    return choices[int(D.get_replica_context().replica_id_in_sync_group)]


MISMATCHES = {
    "dense_shape": (
        lambda: _by_replica(make_slices(0), td.IndexedSlices(np.ones((1, 3), np.float32), np.array([0]), [9, 3])),
        r"the replicas' IndexedSlices differ: replica 0 has dense_shape \[8, 3\] and dtype float32, replica 1 has dense_shape \[9, 3\]",
    ),
    "dtype": (
        lambda: _by_replica(make_slices(0), make_slices(1, np.float64)),
        r"the replicas' IndexedSlices differ: replica 0 has dense_shape \[8, 3\] and dtype float32, replica 1 has .* float64",
    ),
    "dense_and_sparse": (
        lambda: _by_replica(make_slices(0), np.ones(TABLE, np.float32)),
        r"needs every replica's value to be of one kind, but replica 0 has an IndexedSlices and replica 1 a dense ndarray",
    ),
    "dense_and_sparse_in_a_nest": (
        lambda: {"g": _by_replica(np.ones(TABLE, np.float32), make_slices(1))},
        r"needs every replica's value to be of one kind, but at \['g'\] replica 1 has an IndexedSlices and replica 0",
    ),
    "dense_shape_and_none": (
        lambda: _by_replica(
            td.IndexedSlices(np.ones((1, 3), np.float32), np.array([0]), [8, 3]),
            td.IndexedSlices(np.ones((1, 3), np.float32), np.array([0])),
        ),
        r"the replicas' IndexedSlices differ: replica 0 has dense_shape \[8, 3\] .* replica 1 has dense_shape \[None, 3\]",
    ),
    "two_dimensional_indices": (
        lambda: td.IndexedSlices(np.ones((1, 1, 3), np.float32), np.array([[0]]), [8, 3]),
        r"replica 0's IndexedSlices has indices of shape \(1, 1\); reducing across replicas needs 1-D indices",
    ),
    "bool_values": (
        lambda: td.IndexedSlices(np.ones((1, 3), bool), np.array([0]), [8, 3]),
        r"reducing IndexedSlices needs numeric values; got dtype bool",
    ),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_all_reduce_of_mismatched_values_raises_and_the_strategy_still_works(case):
    # dense_and_sparse was a fixed bug: a bare array against an IndexedSlices was reported as a
    # structure mismatch with an empty place ("replica 0 and replica 1 differ .").
    make, match = MISMATCHES[case]
    strategy = mirrored("shared_memory", 2)
    with pytest.raises(InvalidArgumentError, match=r"ReplicaContext\.all_reduce\(\)") as info:
        strategy.run(lambda: D.get_replica_context().all_reduce(SUM, make()))
    assert info.match(match)
    assert_still_reduces(strategy)


@pytest.mark.parametrize("case", ["dense_shape", "dtype", "dense_and_sparse"])
@pytest.mark.parametrize("ops", list(CPU_OPS))
def test_strategy_reduce_of_mismatched_values_raises_naming_both_replicas(ops, case):
    make, _ = MISMATCHES[case]
    strategy = mirrored(ops, 2)
    per_replica = strategy.run(make)
    with pytest.raises(InvalidArgumentError, match=r"Strategy\.reduce\(\)|Reducing across replicas") as info:
        strategy.reduce(SUM, per_replica, axis=None)
    assert "replica 0" in str(info.value) and "replica 1" in str(info.value)
    assert_still_reduces(strategy)


@pytest.mark.parametrize("n", [1, 2], ids=lambda n: f"{n}cpu")
@pytest.mark.parametrize("nested", [False, True], ids=["bare", "nested"])
def test_all_gather_refuses_indexed_slices_as_tensorflow(n, nested):
    # TF 2.21: NotImplementedError 'all_gather does not support IndexedSlices'
    strategy = mirrored("shared_memory", n)

    def fn():
        value = replica_slices()
        return D.get_replica_context().all_gather({"x": np.ones(2), "g": value} if nested else value, axis=0)

    with pytest.raises(NotImplementedError, match=r"^all_gather does not support IndexedSlices"):
        strategy.run(fn)
    assert_still_reduces(strategy)


@pytest.mark.parametrize("n", [1, 2, 4], ids=lambda n: f"{n}cpu")
def test_gather_refuses_a_bare_indexed_slices_and_densifies_a_per_replica_as_tensorflow(n):
    # TF 2.21: strategy.gather(IndexedSlices) raises NotImplementedError 'gather does not support
    # IndexedSlices'; a PerReplica of them is densified component by component and concatenated.
    strategy = mirrored("shared_memory", n)
    with pytest.raises(NotImplementedError, match=r"^gather does not support IndexedSlices"):
        strategy.gather(make_slices(0), axis=0)
    per_replica = strategy.run(replica_slices)
    if n == 1:  # one replica's run returns the bare IndexedSlices: refused, as TF refuses it
        with pytest.raises(NotImplementedError, match=r"^gather does not support IndexedSlices"):
            strategy.gather(per_replica, axis=0)
        return
    gathered = strategy.gather(per_replica, axis=0)
    want = np.concatenate([np.asarray(part) for part in strategy.experimental_local_results(per_replica)])
    np.testing.assert_array_equal(gathered, want)
    assert gathered.shape == (TABLE[0] * n, TABLE[1])
    assert_still_reduces(strategy)


def test_slices_without_dense_shape_are_reduced_as_tensorflow_reduces_them():
    # TF 2.21 reduces IndexedSlices without dense_shape (the result has none either).
    strategy = mirrored("shared_memory", 2)

    def step():
        r = int(D.get_replica_context().replica_id_in_sync_group)
        return D.get_replica_context().all_reduce(SUM, td.IndexedSlices(np.full((2, 3), r + 1.0, np.float32), np.array([r, 5])))

    result = strategy.experimental_local_results(strategy.run(step))[0]
    assert result.dense_shape is None
    assert result.indices.tolist() == [0, 1, 5]
    np.testing.assert_array_equal(result.values, [[1, 1, 1], [2, 2, 2], [3, 3, 3]])


# --- simulated (or real) GPUs ---------------------------------------------------------------------


def _gpu_slices(dtype=np.float32):
    replica = int(D.get_replica_context().replica_id_in_sync_group)
    return make_slices(replica, dtype)


def _check_on_gpus(n, ops, api, op):
    strategy = mirrored(ops, n, "GPU")
    per_replica = strategy.run(_gpu_slices)
    for i, part in enumerate(strategy.experimental_local_results(per_replica)):
        assert cupy_backend.owns(part.values) and part.device.endswith(f"GPU:{i}")
    expected = numpy_reduce(op, dense_inputs(strategy, per_replica))
    results = reduced_by(api, strategy, op, per_replica)
    for result in results:
        assert_slices(result, expected)
    if api == "all_reduce":  # each replica's result lives on its own GPU
        assert [r.device[-5:] for r in results] == [f"GPU:{i}" for i in range(n)]
        assert all(cupy_backend.owns(r.values) and cupy_backend.owns(r.indices) for r in results)


@pytest.mark.gpus(2)
@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("ops", list(GPU_OPS))
def test_sparse_reduction_on_two_gpus(ops, api, op):
    _check_on_gpus(2, ops, api, op)


@pytest.mark.gpus(3)
@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("ops", list(GPU_OPS))
def test_sparse_reduction_on_three_gpus(ops, api, op):
    _check_on_gpus(3, ops, api, op)


@pytest.mark.gpus(2)
def test_a_mismatch_on_gpus_raises_and_the_strategy_still_works():
    strategy = mirrored("nccl", 2, "GPU")
    make, match = MISMATCHES["dense_shape"]
    with pytest.raises(InvalidArgumentError, match=match):
        strategy.run(lambda: D.get_replica_context().all_reduce(SUM, make()))
    _check_on_gpus(2, "nccl", "all_reduce", SUM)


# --- a property: random row sets and duplicates ---------------------------------------------------


@st.composite
def replica_rows(draw):
    n = draw(st.sampled_from([1, 2, 4]))
    rows = draw(st.lists(st.lists(st.integers(0, TABLE[0] - 1), max_size=10), min_size=n, max_size=n))
    return rows


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=replica_rows(), op=st.sampled_from([SUM, MEAN]), dense_fraction=st.sampled_from([0.0, 0.5, 2.0]))
def test_property_the_reduction_is_the_sum_of_the_densified_inputs(rows, op, dense_fraction):
    strategy = mirrored("shared_memory", len(rows))
    original = sparse.DENSE_FRACTION
    sparse.DENSE_FRACTION = dense_fraction
    try:
        per_replica = strategy.run(lambda: make_slices(int(D.get_replica_context().replica_id_in_sync_group), np.float64, rows=rows[int(D.get_replica_context().replica_id_in_sync_group)]))
        result = strategy.run(lambda v: D.get_replica_context().all_reduce(op, v), args=(per_replica,))
    finally:
        sparse.DENSE_FRACTION = original
    expected = numpy_reduce(op, dense_inputs(strategy, per_replica))
    touched = sorted(set(r for replica in rows for r in replica))
    for part in strategy.experimental_local_results(result):
        assert_slices(part, expected)
        assert np.asarray(part.indices).tolist() == touched
