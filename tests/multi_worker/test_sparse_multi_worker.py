"""MultiWorkerMirroredStrategy reduces ``td.IndexedSlices`` across workers (``Workers.sparse_sum``).

Marked ``multi_worker``: the bodies run in the default suite (one worker, one and two local
replicas) and under ``mpiexec -n 2 python -m pytest -m multi_worker`` (two workers), the
expected values computed from the rank and the replica counts. Replica ``g`` (global id)
contributes ``rows_of(g)``: different counts per worker, repeats, and global replica 1 none.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
from towerdist.errors import InvalidArgumentError

from numpy_reference import numpy_reduce

pytestmark = pytest.mark.multi_worker

D = td.distribute
SUM, MEAN = D.ReduceOp.SUM, D.ReduceOp.MEAN
TABLE = (8, 3)


def _layout(strategy):
    extended = strategy.extended
    return extended._worker_index, extended._num_workers, len(extended.worker_devices), strategy.num_replicas_in_sync


def _replica_id() -> int:
    return int(D.get_replica_context().replica_id_in_sync_group)


def rows_of(replica: int, many: bool | None = False) -> list[int]:
    if many:  # almost every row of the table: the dense path across two workers
        return [r for r in range(TABLE[0]) if r != replica % TABLE[0]]
    if many is None:  # one row each: the rows path
        return [(3 * replica) % TABLE[0]]
    return [[0, 3, 3], [], [5, 0], [7, 1, 1, 6]][replica % 4]


def slices_of(replica: int, many: bool | None = False, dtype=np.float32) -> td.IndexedSlices:
    rows = rows_of(replica, many)
    values = (np.arange(len(rows) * TABLE[1]).reshape(len(rows), TABLE[1]) + 10 * replica + 1).astype(dtype)
    return td.IndexedSlices(values, np.array(rows, np.int64), list(TABLE))


def expected(op, n: int, many: bool | None = False, dtype=np.float32) -> np.ndarray:
    want = numpy_reduce(op, [np.asarray(slices_of(g, many, dtype)) for g in range(n)])
    # One replica in all: the MEAN of a value is the value itself, in its dtype (as for dense values).
    return want.astype(dtype) if n == 1 else want


def assert_slices(result, want: np.ndarray, canonical: bool = True) -> None:
    assert isinstance(result, td.IndexedSlices)
    indices = np.asarray(result.indices)
    if not canonical:  # a non-distributed value's MEAN on one replica is the value itself (TensorFlow)
        np.testing.assert_allclose(np.asarray(result), want, rtol=1e-6)
        return
    assert indices.dtype == np.int64 and np.all(np.diff(indices) > 0), indices
    dense = np.asarray(result)
    assert dense.dtype == want.dtype
    np.testing.assert_allclose(dense, want, rtol=1e-6)
    assert indices.tolist() == np.flatnonzero(np.any(want != 0, axis=1)).tolist()  # only the rows touched


@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_all_reduce_sums_every_workers_rows(multi_worker_strategy, op, dtype):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    result = strategy.run(lambda: D.get_replica_context().all_reduce(op, slices_of(_replica_id(), dtype=dtype)))
    for part in strategy.experimental_local_results(result):
        assert_slices(part, expected(op, n, dtype=dtype))


@pytest.mark.parametrize("op", [SUM, MEAN], ids=["sum", "mean"])
def test_strategy_reduce_divides_a_mean_by_every_replica_of_every_worker(multi_worker_strategy, op):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    per_replica = strategy.run(lambda: slices_of(_replica_id()))
    assert_slices(strategy.reduce(op, per_replica, axis=None), expected(op, n), canonical=n > 1 or op is SUM)


def test_an_empty_indexed_slices_on_one_worker(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, _, _, n = _layout(strategy)

    def fn():
        g = _replica_id()
        return slices_of(g) if rank == 0 else td.IndexedSlices(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), list(TABLE))

    result = strategy.run(lambda: D.get_replica_context().all_reduce(SUM, fn()))
    local = n // _layout(strategy)[1]
    want = numpy_reduce(SUM, [np.asarray(slices_of(g)) for g in range(local)] + [np.zeros(TABLE, np.float32)])
    for part in strategy.experimental_local_results(result):
        assert_slices(part, want)


@pytest.mark.parametrize("many", [None, True], ids=["few_rows", "almost_every_row"])
def test_the_rows_and_the_dense_paths_give_the_same_result(multi_worker_strategy, monkeypatch, many):
    strategy = multi_worker_strategy
    _, workers, _, n = _layout(strategy)
    workers_type = type(strategy.extended._workers)
    paths: list[str] = []
    original = workers_type.sparse_sum

    def spy(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        paths.append(result[2])
        return result

    monkeypatch.setattr(workers_type, "sparse_sum", spy)
    result = strategy.run(lambda: D.get_replica_context().all_reduce(SUM, slices_of(_replica_id(), many)))
    for part in strategy.experimental_local_results(result):
        assert_slices(part, expected(SUM, n, many))
    if workers == 2:  # a table of 8 rows of 12 bytes: 2 or 4 rows travel (rows path); 14 or 12 cost more (dense)
        assert paths and paths == [("dense" if many else "rows")] * len(paths)


def test_batch_reduce_to_mixes_dense_and_sparse_values(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    sparse_value = strategy.run(lambda: slices_of(_replica_id()))
    dense_value = strategy.run(lambda: np.full(2, _replica_id() + 1.0, np.float32))
    first, second, third = strategy.extended.batch_reduce_to(
        MEAN, [(sparse_value, sparse_value), (dense_value, dense_value), (sparse_value, dense_value)]
    )
    for part in strategy.experimental_local_results(first):
        assert_slices(part, expected(MEAN, n))
    for part in strategy.experimental_local_results(second):
        np.testing.assert_allclose(part, np.full(2, (n + 1) / 2))
    for part in strategy.experimental_local_results(third):
        assert_slices(part, expected(MEAN, n))


def test_a_dense_shape_mismatch_between_workers_raises_on_every_worker(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, workers, _, n = _layout(strategy)
    if workers < 2:
        pytest.skip("needs two workers (mpiexec -n 2): one worker has no other worker's shape to differ from")

    def fn():
        return D.get_replica_context().all_reduce(
            SUM, td.IndexedSlices(np.ones((1, 3), np.float32), np.array([0]), [8 + rank, 3])
        )

    with pytest.raises(InvalidArgumentError, match=r"IndexedSlices") as info:
        strategy.run(fn)
    text = str(info.value)
    assert "[8, 3]" in text and "[9, 3]" in text  # both workers' calls named
    result = strategy.run(lambda: D.get_replica_context().all_reduce(SUM, slices_of(_replica_id())))
    for part in strategy.experimental_local_results(result):
        assert_slices(part, expected(SUM, n))


OPTIMIZERS = {
    "sgd_momentum": lambda: td.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: td.optimizers.Adam(0.1),
    "adagrad": lambda: td.optimizers.Adagrad(0.1),
    "rmsprop": lambda: td.optimizers.RMSprop(0.1),
    "adamw": lambda: td.optimizers.AdamW(0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_with_sparse_gradients_match_one_process_with_every_replicas_slices(multi_worker_strategy, name):
    # TensorFlow's MirroredStrategy hands the optimizer the replicas' slices concatenated, so Keras 3's
    # numbers are those of one process applying every replica's slices at once (repeats kept: the
    # rules that square the gradient square each slice). Every worker computes that reference itself.
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    initial = np.linspace(-1.0, 1.0, TABLE[0] * TABLE[1], dtype=np.float32).reshape(TABLE)

    def step_slices(replica: int, step: int) -> td.IndexedSlices:
        base = slices_of(replica)
        return td.IndexedSlices(np.asarray(base.values) / 100.0 * (step + 1), base.indices, list(TABLE))

    with strategy.scope():
        v = td.Variable(initial)
        optimizer = OPTIMIZERS[name]()
    for step in range(3):
        strategy.run(lambda step=step: optimizer.apply_gradients([(step_slices(_replica_id(), step), v)]))

    reference = td.Variable(initial)
    reference_optimizer = OPTIMIZERS[name]()
    for step in range(3):
        parts = [step_slices(g, step) for g in range(n)]
        together = td.IndexedSlices(
            np.concatenate([np.asarray(p.values) for p in parts]).reshape(-1, TABLE[1]),
            np.concatenate([np.asarray(p.indices) for p in parts]),
            list(TABLE),
        )
        reference_optimizer.apply_gradients([(together, reference)])
    for component in strategy.experimental_local_results(v):
        np.testing.assert_allclose(np.asarray(component), reference.numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(reference.numpy(), initial)  # the steps moved it


def test_slices_without_dense_shape_are_reduced_across_workers(multi_worker_strategy):
    # TF 2.21 reduces IndexedSlices without dense_shape; across workers the rows travel (no table to densify).
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)

    def step():
        g = _replica_id()
        return D.get_replica_context().all_reduce(SUM, td.IndexedSlices(np.full((1, 3), g + 1.0, np.float32), np.array([g % 2])))

    result = strategy.experimental_local_results(strategy.run(step))[0]
    assert result.dense_shape is None
    want = np.zeros((2, 3), np.float32)
    for g in range(n):
        want[g % 2] += g + 1.0
    rows = sorted({g % 2 for g in range(n)})
    assert result.indices.tolist() == rows
    np.testing.assert_array_equal(result.values, want[rows])


@pytest.mark.parametrize("aggregation", ["SUM", "MEAN"])
def test_replica_scatter_mul_applies_every_replicas_row_in_turn_across_workers(multi_worker_strategy, aggregation):
    # TF 2.21 gathers the replicas' slices (its all-reduce of IndexedSlices concatenates them), so a
    # scatter_mul multiplies by each replica's row in turn: x * a * b (MEAN: each row divided by n).
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    with strategy.scope():
        v = td.Variable(np.full((3, 2), 4.0, np.float32), aggregation=getattr(td.VariableAggregation, aggregation))
    strategy.run(lambda: v.scatter_mul(td.IndexedSlices(np.float32([[2.0 + _replica_id(), 3.0 + _replica_id()]]), np.array([0]), [3, 2])))
    want = np.full((3, 2), 4.0)
    for g in range(n):
        row = np.array([2.0 + g, 3.0 + g]) / (n if aggregation == "MEAN" else 1)
        want[0] *= row
    for component in strategy.experimental_local_results(v):
        np.testing.assert_allclose(np.asarray(component), want, rtol=1e-6)
