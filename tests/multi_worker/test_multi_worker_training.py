"""MultiWorkerMirroredStrategy: training end to end and the collective surface, for any number of workers.

Every test here is marked ``multi_worker``: it runs in the default suite (one worker, with one and
with two local replicas) and again under ``mpiexec -n 2 python -m pytest -m multi_worker`` (two
workers). Expected values are computed from the worker's rank and the replica counts, so
the same body is right in every layout; every rank makes the same collective calls.

* Training: SGD (with momentum) and Adam on a small linear model whose data is split by
  global replica id match plain numpy taking the same full-batch steps; the variables and
  the optimizer's slots are bit-identical on every replica of every worker.
* Metrics aggregate every replica of every worker.
* The collective surface: ``experimental_distribute_values_from_function``,
  ``extended.broadcast_to``, ``batch_reduce_to`` (mixed dtypes, several packs),
  ``all_reduce`` of nests with small packs, ``gather`` along axis 1, variables created in
  ``run``, ``copy.deepcopy`` of a mirrored variable, ``td.function`` steps.

Tolerances: the replicas' float32 gradient shares are summed in a different order than
numpy's full-batch gradient (local replicas first, then the workers), so variables and
slots agree with numpy to ``rtol=1e-5, atol=1e-6`` after a few steps (float32 has 24 bits,
about 6e-8 relative per rounding). Across replicas and workers they agree *exactly*: every
replica applies the same summed gradient.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.multi_worker.workers import _packs

from numpy_reference import NumpyReference

pytestmark = pytest.mark.multi_worker

RTOL, ATOL = 1e-5, 1e-6
ROWS_PER_REPLICA = 4
FEATURES, OUTPUTS = 3, 2


# --- helpers ---------------------------------------------------------------------------------


def _layout(strategy: td.distribute.MultiWorkerMirroredStrategy) -> tuple[int, int, int, int]:
    """``(rank, workers, local replicas, num_replicas_in_sync)``."""
    extended = strategy.extended
    local = len(extended.worker_devices)
    return extended._worker_index, extended._num_workers, local, strategy.num_replicas_in_sync


def _replica_id() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def _local(strategy: td.distribute.Strategy, value: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in strategy.experimental_local_results(value)]


def _everywhere(strategy: td.distribute.Strategy, variable: Any) -> np.ndarray:
    """Every replica's copy of ``variable`` (of every worker), stacked in global replica order."""
    return strategy.gather(strategy.run(lambda: np.asarray(variable.read_value())[None]), axis=0)


def _assert_identical_everywhere(strategy: td.distribute.Strategy, variable: Any) -> np.ndarray:
    copies = _everywhere(strategy, variable)
    assert len(copies) == strategy.num_replicas_in_sync
    for copy_ in copies[1:]:
        np.testing.assert_array_equal(copy_, copies[0])  # bit for bit, not approximately
    return copies[0]


def _data(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A global batch of ``ROWS_PER_REPLICA * n`` rows for a linear model ``x @ kernel + bias``."""
    rng = np.random.default_rng(1234)
    x = rng.normal(size=(ROWS_PER_REPLICA * n, FEATURES)).astype(np.float32)
    true_kernel = np.array([[1.0, -2.0], [0.5, 0.0], [-1.5, 3.0]], np.float32)
    y = (x @ true_kernel + np.array([0.25, -0.75], np.float32)).astype(np.float32)
    return x, y


def _gradients(x: np.ndarray, y: np.ndarray, kernel: np.ndarray, bias: np.ndarray, global_rows: int):
    """This share's gradient of the global mean squared error ``sum(err**2) / global_rows``."""
    error = x @ kernel + bias - y
    return (2.0 / global_rows) * x.T @ error, (2.0 / global_rows) * error.sum(axis=0)


def _replica_rows(x: np.ndarray, y: np.ndarray, replica: int) -> tuple[np.ndarray, np.ndarray]:
    rows = slice(ROWS_PER_REPLICA * replica, ROWS_PER_REPLICA * (replica + 1))
    return x[rows], y[rows]


def _train(strategy, optimizer_fn, steps: int):
    """``steps`` distributed steps on the data split by global replica id; the model and optimizer."""
    _, _, _, n = _layout(strategy)
    x, y = _data(n)
    with strategy.scope():
        kernel = td.Variable(np.zeros((FEATURES, OUTPUTS), np.float32), name="kernel")
        bias = td.Variable(np.zeros(OUTPUTS, np.float32), name="bias")
        optimizer = optimizer_fn()
    shares = strategy.experimental_distribute_values_from_function(
        lambda ctx: _replica_rows(x, y, ctx.replica_id_in_sync_group)
    )

    def step(xs: np.ndarray, ys: np.ndarray) -> None:
        grad_kernel, grad_bias = _gradients(xs, ys, kernel.numpy(), bias.numpy(), len(x))
        optimizer.apply_gradients([(grad_kernel.astype(np.float32), kernel), (grad_bias.astype(np.float32), bias)])

    for _ in range(steps):
        strategy.run(step, args=shares)
    return x, y, kernel, bias, optimizer


def _numpy_training(reference: NumpyReference, x: np.ndarray, y: np.ndarray, steps: int):
    weights = [np.zeros((FEATURES, OUTPUTS), np.float32), np.zeros(OUTPUTS, np.float32)]
    for _ in range(steps):
        grads = _gradients(x.astype(np.float64), y.astype(np.float64), *weights, len(x))
        weights = reference.apply(weights, [g.astype(np.float32) for g in grads])
    return weights


# --- training ----------------------------------------------------------------------------------


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
def test_sgd_with_momentum_matches_numpy_full_batch_steps(multi_worker_strategy, nesterov):
    strategy = multi_worker_strategy
    steps = 3
    x, y, kernel, bias, optimizer = _train(
        strategy, lambda: td.optimizers.SGD(0.1, momentum=0.9, nesterov=nesterov), steps
    )
    reference = NumpyReference("SGD", learning_rate=0.1, momentum=0.9, nesterov=nesterov)
    expected = _numpy_training(reference, x, y, steps)
    for variable, want, k in ((kernel, expected[0], 0), (bias, expected[1], 1)):
        value = _assert_identical_everywhere(strategy, variable)
        np.testing.assert_allclose(value, want, rtol=RTOL, atol=ATOL)
        slot = optimizer.get_slot(variable, "momentum")
        velocity = _assert_identical_everywhere(strategy, slot)  # the same momentum on every worker
        np.testing.assert_allclose(velocity, reference.slots[k]["momentum"], rtol=RTOL, atol=ATOL)
        assert np.abs(velocity).max() > 1e-3  # the slot did accumulate
    assert int(_assert_identical_everywhere(strategy, optimizer.iterations)) == steps


def test_adam_matches_numpy_full_batch_steps_and_keeps_its_slots_in_step(multi_worker_strategy):
    strategy = multi_worker_strategy
    steps = 4
    x, y, kernel, bias, optimizer = _train(strategy, lambda: td.optimizers.Adam(0.05), steps)
    reference = NumpyReference("Adam", learning_rate=0.05)
    expected = _numpy_training(reference, x, y, steps)
    for variable, want, k in ((kernel, expected[0], 0), (bias, expected[1], 1)):
        np.testing.assert_allclose(_assert_identical_everywhere(strategy, variable), want, rtol=RTOL, atol=ATOL)
        for name in ("m", "v"):
            slot = _assert_identical_everywhere(strategy, optimizer.get_slot(variable, name))
            np.testing.assert_allclose(slot, reference.slots[k][name], rtol=RTOL, atol=ATOL)
    assert int(_assert_identical_everywhere(strategy, optimizer.iterations)) == steps


def test_a_td_function_training_loop_over_a_distributed_dataset_reduces_the_loss(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    x, y = _data(n)
    global_batch = len(x) // 2  # two global batches per epoch
    dataset = td.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    with strategy.scope():
        kernel = td.Variable(np.zeros((FEATURES, OUTPUTS), np.float32))
        bias = td.Variable(np.zeros(OUTPUTS, np.float32))
        optimizer = td.optimizers.SGD(0.2)

    def replica_step(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        error = xs @ kernel.numpy() + bias.numpy() - ys
        grads = _gradients(xs, ys, kernel.numpy(), bias.numpy(), global_batch)
        optimizer.apply_gradients([(g.astype(np.float32), v) for g, v in zip(grads, (kernel, bias))])
        return np.float64((error.astype(np.float64) ** 2).sum() / global_batch)  # this share of the loss

    @td.function
    def train_step(batch: Any) -> Any:
        losses = strategy.run(replica_step, args=batch)
        return strategy.reduce("SUM", losses, axis=None)

    losses = []
    reference = NumpyReference("SGD", learning_rate=0.2)
    weights = [np.zeros((FEATURES, OUTPUTS), np.float32), np.zeros(OUTPUTS, np.float32)]
    for epoch in range(3):
        for batch_index, batch in enumerate(strategy.experimental_distribute_dataset(dataset)):
            losses.append(float(train_step(batch)))
            rows = slice(batch_index * global_batch, (batch_index + 1) * global_batch)
            xb, yb = x[rows].astype(np.float64), y[rows].astype(np.float64)
            error = xb @ weights[0] + weights[1] - yb
            np.testing.assert_allclose(losses[-1], (error**2).sum() / global_batch, rtol=1e-5)
            grads = _gradients(xb, yb, *weights, global_batch)
            weights = reference.apply(weights, [g.astype(np.float32) for g in grads])
        assert batch_index == 1, epoch
    assert losses[-1] < 0.5 * losses[0]
    np.testing.assert_allclose(_assert_identical_everywhere(strategy, kernel), weights[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_assert_identical_everywhere(strategy, bias), weights[1], rtol=RTOL, atol=ATOL)


# --- metrics -----------------------------------------------------------------------------------


def _replica_batch(replica: int) -> dict[str, np.ndarray]:
    """Replica ``replica``'s labels, scores, values and weights (a different number of rows per replica).

    The highest score is the label's on rows where ``(row + replica) % 3 != 0``: about two
    thirds of the predictions are right, depending on the replica.
    """
    rng = np.random.default_rng(100 + replica)
    rows = 2 + replica % 3
    labels = np.arange(rows) % 3
    right = (np.arange(rows) + replica) % 3 != 0
    predicted = np.where(right, labels, (labels + 1) % 3)
    scores = (np.eye(3)[predicted] * 2.0 + rng.uniform(0.0, 1.0, size=(rows, 3))).astype(np.float32)
    return {
        "labels": labels,
        "scores": scores,
        "values": rng.normal(size=rows).astype(np.float32),
        "weights": rng.uniform(0.5, 2.0, size=rows).astype(np.float32),
    }


def test_metrics_aggregate_every_replica_of_every_worker(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    with strategy.scope():
        mean, total = td.metrics.Mean(), td.metrics.Sum()
        accuracy, mse = td.metrics.SparseCategoricalAccuracy(), td.metrics.MeanSquaredError()

    def update() -> Any:
        batch = _replica_batch(_replica_id())
        mean.update_state(batch["values"], sample_weight=batch["weights"])
        total.update_state(batch["values"])
        accuracy.update_state(batch["labels"], batch["scores"])
        mse.update_state(np.eye(3, dtype=np.float32)[batch["labels"]], batch["scores"])  # one value per row
        return accuracy.result()  # inside run: this replica's own accuracy (as TensorFlow)

    batches = [_replica_batch(i) for i in range(n)]
    values = np.concatenate([b["values"] for b in batches]).astype(np.float64)
    weights = np.concatenate([b["weights"] for b in batches]).astype(np.float64)
    labels = np.concatenate([b["labels"] for b in batches])
    scores = np.concatenate([b["scores"] for b in batches]).astype(np.float64)
    expected_accuracy = np.mean(scores.argmax(axis=1) == labels)
    assert 0.0 < expected_accuracy < 1.0
    in_run = _local(strategy, strategy.run(update))
    rank, _, local, _ = _layout(strategy)
    own = [batches[rank * local + i] for i in range(local)]
    assert [float(a) for a in in_run] == pytest.approx([np.mean(b["scores"].argmax(axis=1) == b["labels"]) for b in own])
    with strategy.scope():
        assert float(mean.result()) == pytest.approx((values * weights).sum() / weights.sum(), rel=1e-5)
        assert float(total.result()) == pytest.approx(values.sum(), rel=1e-5, abs=1e-5)
        assert float(accuracy.result()) == pytest.approx(expected_accuracy)
        per_row = np.mean((np.eye(3)[labels] - scores) ** 2, axis=1)
        assert float(mse.result()) == pytest.approx(per_row.mean(), rel=1e-5)  # every row of every replica
    for metric in (mean, total, accuracy, mse):
        metric.reset_state()
    with strategy.scope():
        assert [float(m.result()) for m in (mean, total, accuracy, mse)] == [0.0] * 4


# --- collectives -------------------------------------------------------------------------------


def test_distribute_values_from_function_gives_each_local_replica_its_global_context(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, _, local, n = _layout(strategy)
    calls: list[tuple[int, int]] = []

    def value_fn(ctx: td.distribute.experimental.ValueContext) -> dict[str, Any]:
        calls.append((int(ctx.replica_id_in_sync_group), int(ctx.num_replicas_in_sync)))
        i = ctx.replica_id_in_sync_group
        return {"rows": np.full((i + 1, 2), float(i)), "id": np.int64(i)}

    values = strategy.experimental_distribute_values_from_function(value_fn)
    ids = [rank * local + i for i in range(local)]
    assert calls == [(i, n) for i in ids]  # once per local replica, with global ids
    assert [int(v) for v in _local(strategy, values["id"])] == ids
    assert isinstance(values["id"], td.distribute.PerReplica)  # a PerReplica even with one local replica
    # Fed to run and reduced across workers.
    doubled = strategy.run(lambda v: {"rows": v["rows"] * 2, "id": v["id"]}, args=(values,))
    assert int(strategy.reduce("SUM", doubled["id"], axis=None)) == n * (n - 1) // 2
    everything = np.concatenate([np.full((i + 1, 2), 2.0 * i) for i in range(n)])
    np.testing.assert_array_equal(strategy.gather(doubled["rows"], axis=0), everything)
    np.testing.assert_array_equal(strategy.reduce("SUM", doubled["rows"], axis=0), everything.sum(axis=0))


def test_broadcast_to_copies_this_workers_value_to_its_devices(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, _, local, _ = _layout(strategy)
    with strategy.scope():
        v = td.Variable(np.zeros(3, np.float32))
    value = np.arange(3, dtype=np.float32) + 10.0 * rank
    # TF's broadcast_to copies a cross-replica value to this worker's devices (no exchange).
    everywhere = strategy.extended.broadcast_to(value, v)
    assert [c.tolist() for c in _local(strategy, everywhere)] == [value.tolist()] * local
    assert isinstance(everywhere, td.distribute.Mirrored) == (local > 1)
    one = strategy.extended.broadcast_to(value, "CPU:0")
    np.testing.assert_array_equal(one, value)
    # What a step computes from the broadcast value is combined across workers as usual.
    total = strategy.reduce("SUM", strategy.run(lambda b: b * 1.0, args=(everywhere,)), axis=None)
    n_per_rank = [local * (np.arange(3) + 10.0 * r) for r in range(strategy.extended._num_workers)]
    np.testing.assert_array_equal(total, np.sum(n_per_rank, axis=0))


def _mixed_values() -> list[Any]:
    """Per-replica values of several dtypes and sizes (functions of the global replica id)."""
    i = _replica_id()
    return [
        np.arange(5, dtype=np.float32) * (i + 1),
        np.array([1, -2, 3], np.int32) * (i + 1),
        np.full((2, 2), 0.5 + i, np.float64),
        np.int64(2**40 + i),
        np.arange(7, dtype=np.float32) - i,
    ]


def _expected_sums(n: int) -> list[np.ndarray]:
    ids = np.arange(n)
    return [
        np.arange(5, dtype=np.float32) * (ids + 1).sum(),
        np.array([1, -2, 3], np.int32) * (ids + 1).sum(),
        np.full((2, 2), 0.5 * n + ids.sum(), np.float64),
        np.int64(n * 2**40 + ids.sum()),
        np.arange(7, dtype=np.float32) * n - ids.sum(),
    ]


@pytest.mark.parametrize("reduce_op", ["SUM", "MEAN"])
def test_batch_reduce_to_mixed_dtypes_in_several_packs_equals_one_pack(multi_worker_strategy, reduce_op):
    strategy = multi_worker_strategy
    _, _, local, n = _layout(strategy)
    values = strategy.run(lambda: tuple(_mixed_values()))
    pairs = [(v, v) for v in values]
    arrays = [np.asarray(strategy.experimental_local_results(v)[0]) for v in values]
    tiny = td.distribute.experimental.CommunicationOptions(bytes_per_pack=16)
    assert len(_packs(arrays, 16)) > len(_packs(arrays, 0)) > 1  # the premise: several packs per dtype
    one_pack = strategy.extended.batch_reduce_to(reduce_op, pairs)
    several = strategy.extended.batch_reduce_to(reduce_op, pairs, options=tiny)
    expected = _expected_sums(n)
    for a, b, want, array in zip(one_pack, several, expected, arrays, strict=True):
        got_a, got_b = _local(strategy, a), _local(strategy, b)
        assert len(got_a) == len(got_b) == local
        for x, y in zip(got_a, got_b, strict=True):
            np.testing.assert_array_equal(x, y)  # packing never changes a result
            assert x.dtype == y.dtype
            if reduce_op == "SUM":
                assert x.dtype == array.dtype
                np.testing.assert_array_equal(x, want)
            else:  # integers average to float64, floats keep their dtype; one replica: its value unchanged
                assert x.dtype == (np.float64 if array.dtype.kind in "iu" and n > 1 else array.dtype)
                np.testing.assert_allclose(x, np.asarray(want, np.float64) / n, rtol=1e-7)


def test_all_reduce_of_a_nest_with_small_packs_keeps_structure_and_values(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, _, local, n = _layout(strategy)
    small = td.distribute.experimental.CommunicationOptions(bytes_per_pack=64)

    def nest() -> dict[str, Any]:
        a, b, c, d, e = _mixed_values()
        return {"floats": [a, e, np.ones(40, np.float32) * _replica_id()], "ints": (b, d), "matrix": c}

    def step() -> tuple[Any, Any]:
        ctx = td.distribute.get_replica_context()
        return ctx.all_reduce("sum", nest()), ctx.all_reduce("sum", nest(), options=small)

    default, packed = strategy.run(step)
    a, b, c, d, e = _expected_sums(n)
    results = strategy.experimental_local_results(default), strategy.experimental_local_results(packed)
    assert len(results[0]) == len(results[1]) == local
    for left, right in zip(*results, strict=True):
        for result in (left, right):
            assert isinstance(result, dict) and isinstance(result["floats"], list) and isinstance(result["ints"], tuple)
            np.testing.assert_array_equal(result["floats"][0], a)
            np.testing.assert_array_equal(result["floats"][1], e)
            np.testing.assert_array_equal(result["floats"][2], np.full(40, n * (n - 1) / 2, np.float32))
            np.testing.assert_array_equal(result["ints"][0], b)
            assert result["ints"][0].dtype == np.int32 and result["ints"][1].dtype == np.int64
            assert int(result["ints"][1]) == int(d)
            np.testing.assert_array_equal(result["matrix"], c)


def test_gather_along_axis_1_concatenates_every_replica_in_global_order(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)

    def columns(i: int) -> np.ndarray:
        return np.arange(2 * (i % 3) * 4, dtype=np.float32).reshape(2, i % 3, 4) + 100 * i  # replica 0: no columns

    gathered = strategy.gather(strategy.run(lambda: columns(_replica_id())), axis=1)
    np.testing.assert_array_equal(gathered, np.concatenate([columns(i) for i in range(n)], axis=1))
    plain = strategy.gather(strategy.run(lambda: np.full((3, 1), float(_replica_id()))), axis=1)
    np.testing.assert_array_equal(plain, np.tile(np.arange(n, dtype=np.float64), (3, 1)))


# --- variables ---------------------------------------------------------------------------------


def test_a_variable_created_in_run_starts_from_worker_0s_value_everywhere(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, _, _, n = _layout(strategy)
    created: list[Any] = []

    def make() -> Any:
        i = _replica_id()
        value = np.array([10.0, 20.0]) + 1000.0 * rank + i
        created.append(td.Variable(value, name="made_in_run", aggregation=td.VariableAggregation.MEAN))
        return i

    with strategy.scope():
        strategy.run(make)
    variable = created[0]
    assert all(v is variable for v in created)  # one variable per worker, shared by its replicas
    np.testing.assert_array_equal(_everywhere(strategy, variable), np.tile([10.0, 20.0], (n, 1)))

    # It trains like any mirrored variable: a MEAN write agrees on every worker.
    strategy.run(lambda: variable.assign_add(np.full(2, float(_replica_id()))))
    mean_id = (n - 1) / 2
    np.testing.assert_array_equal(_assert_identical_everywhere(strategy, variable), [10.0 + mean_id, 20.0 + mean_id])


def test_deepcopy_of_a_mirrored_variable_is_independent_and_still_synchronised(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, _, _, n = _layout(strategy)
    with strategy.scope():
        original = td.Variable(np.array([1.0, 2.0], np.float32) + rank, aggregation=td.VariableAggregation.SUM)
    duplicate = copy.deepcopy(original)
    assert duplicate is not original and duplicate.distribute_strategy is strategy
    assert duplicate.aggregation == td.VariableAggregation.SUM
    np.testing.assert_array_equal(_everywhere(strategy, duplicate), np.tile([1.0, 2.0], (n, 1)))
    strategy.run(lambda: duplicate.assign_add(np.full(2, float(_replica_id() + 1), np.float32)))
    total = n * (n + 1) / 2
    np.testing.assert_array_equal(_assert_identical_everywhere(strategy, duplicate), [1.0 + total, 2.0 + total])
    np.testing.assert_array_equal(_assert_identical_everywhere(strategy, original), [1.0, 2.0])  # untouched


def test_a_cross_replica_assign_is_local_to_the_worker_and_gather_shows_every_copy(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)
    with strategy.scope():
        v = td.Variable(np.array([1.0, 2.0]))
    mine = np.array([1.0, 2.0]) + 10.0 * rank
    v.assign(mine)  # TF: a cross-replica write to a mirrored variable does not communicate
    assert [c.numpy().tolist() for c in v.values] == [mine.tolist()] * local
    np.testing.assert_array_equal(np.asarray(strategy.reduce("MEAN", v, axis=None)), mine)  # MEAN of a mirror: itself
    every_copy = np.concatenate([np.tile(np.array([1.0, 2.0]) + 10.0 * r, local) for r in range(workers)])
    np.testing.assert_array_equal(strategy.gather(v, axis=0), every_copy)
