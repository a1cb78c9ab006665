"""td.metrics: streaming metrics whose state lives in SUM sync-on-read variables (DESIGN section 7).

Semantics follow Keras 3 (reduction_metrics.py, accuracy_metrics.py, regression_metrics.py):
a sample's values are averaged (Mean) or summed (Sum) over its trailing axes; a per-sample
weight weighs samples; a scalar weight weighs the whole batch (Mean counts the batch as that
weight, not as n samples); a weight of the values' rank weighs elements. Every expected value
below is computed here with numpy, in the distributed tests over the concatenation of the
replicas' batches (each replica sees a different batch, of a different size, sometimes empty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td
from towerdist._src import aliases
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from conftest import mirrored_param

# An empty batch or an empty slice must never produce a numpy warning (nor a NaN) in these tests.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

A = td.VariableAggregation
S = td.VariableSynchronization
F32 = np.float32
TOL = {"rtol": 1e-5, "atol": 1e-5}

METRIC_CLASSES = [td.metrics.Mean, td.metrics.Sum, td.metrics.SparseCategoricalAccuracy, td.metrics.MeanSquaredError]
STATE_NAMES = {
    td.metrics.Mean: ["total", "count"],
    td.metrics.Sum: ["total"],
    td.metrics.SparseCategoricalAccuracy: ["total", "count"],
    td.metrics.MeanSquaredError: ["total", "count"],
}
DEFAULT_NAMES = {
    td.metrics.Mean: "mean",
    td.metrics.Sum: "sum",
    td.metrics.SparseCategoricalAccuracy: "sparse_categorical_accuracy",
    td.metrics.MeanSquaredError: "mean_squared_error",
}


# --- helpers -----------------------------------------------------------------------------------


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def distribute(strategy, per_replica: list[Any]):
    """One value per replica (replica i gets ``per_replica[i]``)."""
    return strategy.experimental_distribute_values_from_function(lambda ctx: per_replica[ctx.replica_id_in_sync_group])


def components(strategy, variable) -> list[np.ndarray]:
    return [np.asarray(c.numpy()) for c in strategy.experimental_local_results(variable)]


def create(strategy, factory: Callable[[], td.metrics.Metric]) -> td.metrics.Metric:
    if strategy is None:
        return factory()
    with strategy.scope():
        return factory()


def assert_strategy_works(strategy) -> None:
    ids = strategy.experimental_local_results(strategy.run(rid))
    assert [int(i) for i in ids] == list(range(strategy.num_replicas_in_sync))


def run_and_collect(strategy, fn, *args) -> dict[int, np.ndarray]:
    """Runs ``fn`` on every replica; returns what each replica's call returned, by replica id."""
    seen: dict[int, np.ndarray] = {}

    def step(*replica_args):
        out = fn(*replica_args)
        seen[rid()] = np.asarray(out)
        return out

    strategy.run(step, args=args)
    return seen


def weighted_mean(per_sample: np.ndarray, weights: np.ndarray | None) -> float:
    """Keras's Mean over one concatenated batch of per-sample values (0 when there is no weight)."""
    if weights is None:
        return float(per_sample.mean()) if per_sample.size else 0.0
    denominator = float(weights.sum())
    return float((per_sample * weights).sum() / denominator) if denominator != 0 else 0.0


# --- metric cases: each makes a batch and its per-sample values in numpy ------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    make_metric: Callable[..., td.metrics.Metric]
    reduction: str  # "mean" or "sum"
    make_batch: Callable[[np.random.Generator, int], tuple[tuple[np.ndarray, ...], np.ndarray]]

    def __repr__(self) -> str:
        return self.name


def _mean_rank1(rng, n):
    v = rng.normal(size=n).astype(F32)
    return (v,), v.astype(np.float64)


def _mean_rank2(rng, n):
    v = rng.normal(size=(n, 3)).astype(F32)
    return (v,), v.astype(np.float64).mean(axis=1)


def _sum_rank2(rng, n):
    v = rng.normal(size=(n, 3)).astype(F32)
    return (v,), v.astype(np.float64).sum(axis=1)


def _classification(rng, n):
    y_pred = rng.random((n, 4)).astype(F32)
    best = np.argmax(y_pred, axis=1)
    # About two thirds right, so accuracies are neither 0 nor 1.
    labels = np.where(rng.random(n) < 0.6, best, rng.integers(0, 4, size=n))
    return labels, y_pred, (best == labels).astype(np.float64)


def _sca_labels_n(rng, n):
    labels, y_pred, hits = _classification(rng, n)
    return (labels, y_pred), hits


def _sca_labels_n1(rng, n):
    labels, y_pred, hits = _classification(rng, n)
    return (labels.reshape(n, 1), y_pred), hits


def _mse_rank2(rng, n):
    y_true = rng.normal(size=(n, 5)).astype(F32)
    y_pred = rng.normal(size=(n, 5)).astype(F32)
    return (y_true, y_pred), ((y_true.astype(np.float64) - y_pred) ** 2).mean(axis=1)


CASES = [
    Case("mean_rank1", td.metrics.Mean, "mean", _mean_rank1),
    Case("mean_rank2", td.metrics.Mean, "mean", _mean_rank2),
    Case("sum_rank1", td.metrics.Sum, "sum", _mean_rank1),
    Case("sum_rank2", td.metrics.Sum, "sum", _sum_rank2),
    Case("sca_labels_n", td.metrics.SparseCategoricalAccuracy, "mean", _sca_labels_n),
    Case("sca_labels_n1", td.metrics.SparseCategoricalAccuracy, "mean", _sca_labels_n1),
    Case("mse_rank2", td.metrics.MeanSquaredError, "mean", _mse_rank2),
]
CASES_BY_NAME = {case.name: case for case in CASES}

# (replicas, batch size of each replica): different sizes, and an empty batch on one replica.
LAYOUTS = [
    pytest.param((1, (4,)), id="1r-4"),
    pytest.param((2, (3, 5)), id="2r-3-5"),
    pytest.param((2, (0, 4)), id="2r-0-4"),
    pytest.param((4, (2, 0, 5, 1)), id="4r-2-0-5-1"),
    pytest.param((4, (1, 1, 1, 1)), id="4r-1-1-1-1"),
]


def make_weights(rng, n: int, weighting: str) -> np.ndarray | None:
    if weighting == "none":
        return None
    w = rng.uniform(0.5, 2.0, size=n).astype(F32)
    return w if weighting == "per_sample" else w.reshape(n, 1)


# --- each metric against numpy on 1, 2 and 4 replicas -------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("weighting", ["none", "per_sample", "column"])
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_distributed_result_matches_numpy_over_the_concatenated_batch(case, weighting, layout):
    n_replicas, sizes = layout
    strategy = mirrored_strategy_for(n_replicas)
    rng = np.random.default_rng(sum(sizes) * 10 + n_replicas)
    batches = [case.make_batch(rng, size) for size in sizes]
    weights = [make_weights(rng, size, weighting) for size in sizes]
    metric = create(strategy, case.make_metric)

    args = [distribute(strategy, [b[0][k] for b in batches]) for k in range(len(batches[0][0]))]
    if weighting == "none":
        seen = run_and_collect(strategy, lambda *a: metric(*a), *args)
    else:
        seen = run_and_collect(
            strategy, lambda *a: metric(*a[:-1], sample_weight=a[-1]), *args, distribute(strategy, weights)
        )

    per_sample = [b[1] for b in batches]
    flat_w = [None if w is None else w.reshape(-1).astype(np.float64) for w in weights]
    all_samples = np.concatenate(per_sample)
    all_w = None if weighting == "none" else np.concatenate(flat_w)
    if case.reduction == "mean":
        expected = weighted_mean(all_samples, all_w)
    else:
        expected = float(all_samples.sum() if all_w is None else (all_samples * all_w).sum())

    # In cross-replica context, result() aggregates over the replicas.
    np.testing.assert_allclose(metric.result(), expected, **TOL)

    # Replica i's copy holds only replica i's contributions, and inside run, replica i's result
    # is computed from its own copies (as in TensorFlow).
    own_totals = [float(s.sum() if w is None else (s * w).sum()) for s, w in zip(per_sample, flat_w, strict=True)]
    if case.reduction == "mean":
        own_results = [weighted_mean(s, w) for s, w in zip(per_sample, flat_w, strict=True)]
    else:
        own_results = own_totals
    assert sorted(seen) == list(range(n_replicas))
    for replica, replica_result in seen.items():
        np.testing.assert_allclose(replica_result, own_results[replica], **TOL)
        assert replica_result.shape == () and replica_result.dtype == F32
    np.testing.assert_allclose(components(strategy, metric.total), own_totals, **TOL)
    if case.reduction == "mean":
        own_counts = [float(len(s) if w is None else w.sum()) for s, w in zip(per_sample, flat_w, strict=True)]
        np.testing.assert_allclose(components(strategy, metric.count), own_counts, **TOL)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("metric_cls", [td.metrics.Mean, td.metrics.Sum], ids=lambda c: c.__name__)
def test_rank2_weights_for_rank2_values_across_replicas(metric_cls, layout):
    """A weight per element: Mean is sum_i mean_j(v*w) / sum_i mean_j(w); Sum is sum(v*w)."""
    n_replicas, sizes = layout
    strategy = mirrored_strategy_for(n_replicas)
    rng = np.random.default_rng(7 + sum(sizes))
    values = [rng.normal(size=(size, 3)).astype(F32) for size in sizes]
    weights = [rng.uniform(0.0, 2.0, size=(size, 3)).astype(F32) for size in sizes]
    metric = create(strategy, metric_cls)
    strategy.run(
        lambda v, w: metric.update_state(v, sample_weight=w),
        args=(distribute(strategy, values), distribute(strategy, weights)),
    )

    v = np.concatenate(values).astype(np.float64)
    w = np.concatenate(weights).astype(np.float64)
    if metric_cls is td.metrics.Mean:
        expected = (v * w).mean(axis=1).sum() / w.mean(axis=1).sum()
        np.testing.assert_allclose(components(strategy, metric.count), [x.mean(axis=1).sum() for x in weights], **TOL)
    else:
        expected = (v * w).sum()
    np.testing.assert_allclose(metric.result(), expected, **TOL)


@pytest.mark.parametrize("n_replicas", [2, 4])
@pytest.mark.parametrize("metric_cls", [td.metrics.Mean, td.metrics.Sum], ids=lambda c: c.__name__)
def test_scalar_weight_weighs_each_replicas_batch(metric_cls, n_replicas):
    """Keras: a scalar weight w makes Mean count the batch as w (total += mean(batch) * w)."""
    strategy = mirrored_strategy_for(n_replicas)
    rng = np.random.default_rng(n_replicas)
    values = [rng.normal(size=size).astype(F32) for size in (3, 1, 4, 2)[:n_replicas]]
    weights = [F32(w) for w in (0.5, 2.0, 1.0, 3.0)[:n_replicas]]
    metric = create(strategy, metric_cls)
    strategy.run(
        lambda v, w: metric.update_state(v, sample_weight=w),
        args=(distribute(strategy, values), distribute(strategy, weights)),
    )

    w = np.array(weights, dtype=np.float64)
    if metric_cls is td.metrics.Mean:
        means = np.array([v.astype(np.float64).mean() for v in values])
        expected = (means * w).sum() / w.sum()
        np.testing.assert_allclose(components(strategy, metric.count), w, **TOL)
    else:
        expected = (np.array([v.astype(np.float64).sum() for v in values]) * w).sum()
    np.testing.assert_allclose(metric.result(), expected, **TOL)


@settings(max_examples=30, deadline=None)
@given(
    n_replicas=st.sampled_from([1, 2, 4]),
    case_name=st.sampled_from(sorted(CASES_BY_NAME)),
    sizes=st.lists(st.integers(0, 6), min_size=4, max_size=4),
    weighted=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_distributed_metric_equals_numpy_metric(n_replicas, case_name, sizes, weighted, seed):
    case = CASES_BY_NAME[case_name]
    strategy = mirrored_strategy_for(n_replicas)
    rng = np.random.default_rng(seed)
    sizes = sizes[:n_replicas]
    batches = [case.make_batch(rng, size) for size in sizes]
    weights = [make_weights(rng, size, "per_sample" if weighted else "none") for size in sizes]
    metric = create(strategy, case.make_metric)
    args = [distribute(strategy, [b[0][k] for b in batches]) for k in range(len(batches[0][0]))]
    if weighted:
        strategy.run(
            lambda *a: metric.update_state(*a[:-1], sample_weight=a[-1]), args=(*args, distribute(strategy, weights))
        )
    else:
        strategy.run(metric.update_state, args=tuple(args))

    samples = np.concatenate([b[1] for b in batches])
    w = np.concatenate(weights).astype(np.float64) if weighted else None
    if case.reduction == "mean":
        expected = weighted_mean(samples, w)
    else:
        expected = samples.sum() if w is None else (samples * w).sum()
    np.testing.assert_allclose(metric.result(), expected, **TOL)


# --- sample_weight shapes (Keras 3 semantics), one batch ----------------------------------------

V1 = np.array([1.0, 3.0, 5.0, 7.0], dtype=F32)
V2 = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F32)
V3 = np.array([[1.0], [3.0], [5.0]], dtype=F32)
W1 = np.array([1.0, 1.0, 0.0, 2.0], dtype=F32)
W2 = np.array([1.0, 3.0], dtype=F32)
WE = np.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]], dtype=F32)
WROW = np.array([[1.0, 2.0, 3.0]], dtype=F32)
W3 = np.array([1.0, 0.0, 2.0], dtype=F32)


def _row_mean(x):
    return np.asarray(x, np.float64).reshape(len(x), -1).mean(axis=1)


def _row_sum(x):
    return np.asarray(x, np.float64).reshape(len(x), -1).sum(axis=1)


# (values, sample_weight, expected Mean, expected Mean count, expected Sum), all from numpy.
WEIGHT_SHAPES = [
    pytest.param(V1, None, V1.mean(), 4.0, V1.sum(), id="rank1-none"),
    pytest.param(V1, 2.0, V1.mean(), 2.0, 2.0 * V1.sum(), id="rank1-scalar"),
    pytest.param(V1, W1, (V1 * W1).sum() / W1.sum(), W1.sum(), (V1 * W1).sum(), id="rank1-per_sample"),
    pytest.param(V1, W1.reshape(4, 1), (V1 * W1).sum() / W1.sum(), W1.sum(), (V1 * W1).sum(), id="rank1-column"),
    pytest.param(V1, [[0.5]], V1.mean(), 4 * 0.5, 0.5 * V1.sum(), id="rank1-1x1"),
    pytest.param(V2, None, V2.mean(), 2.0, V2.sum(), id="rank2-none"),
    pytest.param(V2, 2.0, V2.mean(), 2.0, 2.0 * V2.sum(), id="rank2-scalar"),
    pytest.param(
        V2, W2, (_row_mean(V2) * W2).sum() / W2.sum(), W2.sum(), (_row_sum(V2) * W2).sum(), id="rank2-per_sample"
    ),
    pytest.param(
        V2,
        W2.reshape(2, 1),
        (_row_mean(V2) * W2).sum() / W2.sum(),
        W2.sum(),
        (_row_sum(V2) * W2).sum(),
        id="rank2-column",
    ),
    pytest.param(
        V2,
        WE,
        _row_mean(V2 * WE).sum() / _row_mean(WE).sum(),
        _row_mean(WE).sum(),
        (V2 * WE).sum(),
        id="rank2-elementwise",
    ),
    pytest.param(
        V2,
        WROW,
        _row_mean(V2 * WROW).sum() / (2 * WROW.mean()),
        2 * WROW.mean(),
        (V2 * WROW).sum(),
        id="rank2-broadcast_row",
    ),
    pytest.param(V3, None, V3.mean(), 3.0, V3.sum(), id="n1-none"),
    pytest.param(V3, W3, (V3[:, 0] * W3).sum() / W3.sum(), W3.sum(), (V3[:, 0] * W3).sum(), id="n1-per_sample"),
    pytest.param(
        V3, W3.reshape(3, 1), (V3[:, 0] * W3).sum() / W3.sum(), W3.sum(), (V3[:, 0] * W3).sum(), id="n1-column"
    ),
]


@pytest.mark.parametrize("n_replicas", [0, 2, 4], ids=["no_strategy", "2r", "4r"])
@pytest.mark.parametrize(("values", "weight", "mean", "count", "total"), WEIGHT_SHAPES)
def test_mean_sample_weight_shapes(values, weight, mean, count, total, n_replicas):
    """Every replica sees the same batch: the mean is unchanged, the count scales with the replicas."""
    strategy = mirrored_strategy_for(n_replicas) if n_replicas else None
    metric = create(strategy, td.metrics.Mean)
    if strategy is None:
        metric.update_state(values, sample_weight=weight)
    else:
        strategy.run(lambda: metric.update_state(values, sample_weight=weight))
    np.testing.assert_allclose(metric.result(), mean, **TOL)
    np.testing.assert_allclose(metric.count.numpy(), count * max(n_replicas, 1), **TOL)


@pytest.mark.parametrize("n_replicas", [0, 2, 4], ids=["no_strategy", "2r", "4r"])
@pytest.mark.parametrize(("values", "weight", "mean", "count", "total"), WEIGHT_SHAPES)
def test_sum_sample_weight_shapes(values, weight, mean, count, total, n_replicas):
    strategy = mirrored_strategy_for(n_replicas) if n_replicas else None
    metric = create(strategy, td.metrics.Sum)
    if strategy is None:
        metric.update_state(values, sample_weight=weight)
    else:
        strategy.run(lambda: metric.update_state(values, sample_weight=weight))
    np.testing.assert_allclose(metric.result(), total * max(n_replicas, 1), **TOL)


def test_zero_weights_give_zero_not_nan():
    metric = td.metrics.Mean()
    metric.update_state([1.0, 2.0], sample_weight=[0.0, 0.0])
    assert float(metric.result()) == 0.0


def test_docstring_examples():
    m = td.metrics.Sum()
    m.update_state([1.0, 3.0, 5.0, 7.0])
    np.testing.assert_array_equal(m.result(), np.array(16.0, F32))
    m = td.metrics.Mean()
    m.update_state([1.0, 3.0, 5.0, 7.0], sample_weight=[1, 1, 0, 0])
    np.testing.assert_array_equal(m.result(), np.array(2.0, F32))
    m = td.metrics.SparseCategoricalAccuracy()
    m.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]])
    np.testing.assert_array_equal(m.result(), np.array(0.5, F32))
    m = td.metrics.MeanSquaredError()
    m.update_state([[0, 1], [0, 0]], [[1, 1], [0, 0]])
    np.testing.assert_array_equal(m.result(), np.array(0.25, F32))


# --- SparseCategoricalAccuracy and MeanSquaredError specifics -----------------------------------


@pytest.mark.parametrize("label_shape", ["n", "n1"])
def test_sparse_categorical_accuracy_weighted_by_sample(label_shape):
    y_pred = np.array([[0.1, 0.6, 0.3], [0.05, 0.95, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]], F32)
    labels = np.array([2, 1, 0, 0])
    weights = np.array([1.0, 2.0, 0.5, 4.0], F32)
    hits = (np.argmax(y_pred, axis=1) == labels).astype(np.float64)
    metric = td.metrics.SparseCategoricalAccuracy()
    y_true = labels if label_shape == "n" else labels.reshape(-1, 1)
    metric.update_state(y_true, y_pred, sample_weight=weights)
    np.testing.assert_allclose(metric.result(), (hits * weights).sum() / weights.sum(), **TOL)


def test_sparse_categorical_accuracy_function_per_sample():
    y_pred = np.array([[0.1, 0.6, 0.3], [0.05, 0.95, 0.0], [0.7, 0.2, 0.1]], F32)
    out = td.metrics.sparse_categorical_accuracy(np.array([1, 1, 2]), y_pred)
    assert out.shape == (3,) and out.dtype == F32
    np.testing.assert_array_equal(out, [1.0, 1.0, 0.0])


def test_sparse_categorical_accuracy_function_squeezes_column_labels_like_keras():
    y_pred = np.array([[0.1, 0.6, 0.3], [0.05, 0.95, 0.0], [0.7, 0.2, 0.1]], F32)
    out = td.metrics.sparse_categorical_accuracy(np.array([[1], [1], [2]]), y_pred)
    assert out.shape == (3,)


def test_mean_squared_error_function_shapes():
    y_true = np.array([[0.0, 1.0], [2.0, 2.0], [1.0, -1.0]], F32)
    y_pred = np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]], F32)
    out = td.metrics.mean_squared_error(y_true, y_pred)
    assert out.shape == (3,)
    np.testing.assert_allclose(out, ((y_true - y_pred) ** 2).mean(axis=1), **TOL)
    flat = td.metrics.mean_squared_error(y_true[:, 0], y_pred[:, 0])
    assert flat.shape == ()
    np.testing.assert_allclose(flat, ((y_true[:, 0] - y_pred[:, 0]) ** 2).mean(), **TOL)


def test_mean_squared_error_rank1_counts_each_batch_as_one_sample():
    """Keras: with rank-1 inputs the mean is over the last (only) axis, so a batch is one value."""
    metric = td.metrics.MeanSquaredError()
    first = metric([1.0, 2.0], [0.0, 0.0])
    np.testing.assert_allclose(first, (1.0 + 4.0) / 2, **TOL)
    second = metric([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(second, (2.5 + 1.0) / 2, **TOL)
    assert float(metric.count.numpy()) == 2.0


@pytest.mark.parametrize("n_replicas", [1, 2, 4])
def test_mean_squared_error_rank1_across_replicas(n_replicas):
    strategy = mirrored_strategy_for(n_replicas)
    rng = np.random.default_rng(3)
    sizes = (3, 1, 5, 2)[:n_replicas]
    y_true = [rng.normal(size=size).astype(F32) for size in sizes]
    y_pred = [rng.normal(size=size).astype(F32) for size in sizes]
    metric = create(strategy, td.metrics.MeanSquaredError)
    strategy.run(metric.update_state, args=(distribute(strategy, y_true), distribute(strategy, y_pred)))
    batch_errors = [((t.astype(np.float64) - p) ** 2).mean() for t, p in zip(y_true, y_pred, strict=True)]
    np.testing.assert_allclose(metric.result(), np.mean(batch_errors), **TOL)
    np.testing.assert_allclose(components(strategy, metric.count), [1.0] * n_replicas)


@pytest.mark.parametrize(
    ("y_true", "y_pred"),
    [
        pytest.param(np.array([[1.0], [2.0]], F32), np.array([1.0, 0.0], F32), id="true_n1-pred_n"),
        pytest.param(np.array([1.0, 2.0], F32), np.array([[1.0], [0.0]], F32), id="true_n-pred_n1"),
    ],
)
def test_mean_squared_error_column_against_vector_is_per_sample(y_true, y_pred):
    metric = td.metrics.MeanSquaredError()
    metric.update_state(y_true, y_pred)
    np.testing.assert_allclose(metric.result(), ((y_true.reshape(-1) - y_pred.reshape(-1)) ** 2).mean(), **TOL)
    assert float(metric.count.numpy()) == 2.0


# --- state variables ---------------------------------------------------------------------------


def _metric_ids(cls):
    return cls.__name__


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_state_is_sum_sync_on_read_under_mirrored(mirrored_strategy, metric_cls):
    metric = create(mirrored_strategy, metric_cls)
    assert [v.name for v in metric.variables] == [f"{metric.name}/{s}:0" for s in STATE_NAMES[metric_cls]]
    for variable in metric.variables:
        assert type(variable).__name__ == "SyncOnReadVariable"
        assert variable.aggregation == A.SUM
        assert variable.synchronization == S.ON_READ
        assert not variable.trainable
        assert len(mirrored_strategy.experimental_local_results(variable)) == mirrored_strategy.num_replicas_in_sync
        np.testing.assert_array_equal(components(mirrored_strategy, variable), 0.0)


@pytest.mark.parametrize("where", ["no_strategy", "default", "one_device_cpu"])
@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_state_is_plain_without_a_multi_device_strategy(request, where, metric_cls):
    strategy = None if where == "no_strategy" else request.getfixturevalue(where)
    metric = create(strategy, metric_cls)
    assert len(metric.variables) == len(STATE_NAMES[metric_cls])
    for variable in metric.variables:
        assert type(variable).__name__ == "ResourceVariable"
        assert not isinstance(variable, td.distribute.DistributedValues)
        assert float(variable.numpy()) == 0.0


@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_variables_names_and_checkpoint_dependencies(mirrored_strategy, metric_cls):
    metric = create(mirrored_strategy, lambda: metric_cls(name="acc"))
    assert metric.name == "acc"
    names = STATE_NAMES[metric_cls]
    deps = metric._checkpoint_dependencies()
    assert [name for name, _ in deps] == names
    assert all(v is getattr(metric, name) for name, v in deps)
    assert [id(v) for v in metric.variables] == [id(v) for _, v in deps]
    assert [c.name for c in metric.total.values] == ["acc/total:0", "acc/total/replica_1:0"]


@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_default_name_config_and_repr(metric_cls):
    metric = metric_cls()
    assert metric.name == DEFAULT_NAMES[metric_cls]
    assert metric.get_config() == {"name": DEFAULT_NAMES[metric_cls], "dtype": "float32"}
    clone = metric_cls(**metric_cls(name="m", dtype="float64").get_config())
    assert clone.name == "m" and clone.dtype == np.float64
    assert repr(metric) == f"<{metric_cls.__name__} name={DEFAULT_NAMES[metric_cls]!r} dtype=float32>"


def test_mean_metric_wrapper_with_a_custom_function(mirrored_strategy):
    def absolute_error(y_true, y_pred):
        return np.abs(np.asarray(y_true, F32) - y_pred).max(axis=-1)

    metric = create(mirrored_strategy, lambda: td.metrics.MeanMetricWrapper(absolute_error, name="max_abs"))
    y_true = [np.array([[0.0, 1.0]], F32), np.array([[2.0, 2.0], [0.0, 0.0]], F32)]
    y_pred = [np.array([[1.0, 4.0]], F32), np.array([[0.0, 1.0], [0.5, 0.0]], F32)]
    mirrored_strategy.run(metric.update_state, args=(distribute(mirrored_strategy, y_true), distribute(mirrored_strategy, y_pred)))
    per_sample = np.abs(np.concatenate(y_true) - np.concatenate(y_pred)).max(axis=1)
    np.testing.assert_allclose(metric.result(), per_sample.mean(), **TOL)
    assert metric.name == "max_abs"


def test_mean_metric_wrapper_name_is_optional_like_keras():
    metric = td.metrics.MeanMetricWrapper(td.metrics.mean_squared_error)
    assert metric.name == "mean_metric_wrapper"


def test_mean_metric_wrapper_passes_its_keyword_arguments_to_fn():
    def scaled_error(y_true, y_pred, scale):
        return scale * np.abs(y_true - y_pred).mean(axis=-1)

    metric = td.metrics.MeanMetricWrapper(scaled_error, name="scaled", scale=10.0)
    metric.update_state(np.array([[1.0, 2.0]], F32), np.array([[2.0, 4.0]], F32))
    np.testing.assert_allclose(metric.result(), 15.0)


class Histogram(td.metrics.Metric):
    """A custom metric: the share of each of 3 classes (a vector state and a float64 state)."""

    def __init__(self, name=None, dtype=None):
        super().__init__(name, dtype)
        self.counts = self.add_variable("counts", shape=(3,))
        self.n = self.add_variable("n", dtype="float64")

    def update_state(self, labels):
        labels = np.asarray(labels)
        self._accumulate(self.counts, np.bincount(labels, minlength=3).astype(self.dtype))
        self._accumulate(self.n, np.float64(labels.size))

    def _result(self):
        return np.asarray(self.counts.value()) / np.asarray(self.n.value())


@pytest.mark.replicas(4)
def test_custom_metric_subclass_across_replicas(mirrored_strategy):
    metric = create(mirrored_strategy, Histogram)
    assert metric.name == "histogram"
    assert [v.shape for v in metric.variables] == [(3,), ()]
    assert metric.n.numpy().dtype == np.float64
    labels = [np.array([0, 1, 1]), np.array([], dtype=np.int64), np.array([2]), np.array([2, 2, 0, 1])]
    mirrored_strategy.run(metric.update_state, args=(distribute(mirrored_strategy, labels),))
    expected = np.bincount(np.concatenate(labels), minlength=3) / sum(len(x) for x in labels)
    np.testing.assert_allclose(metric.result(), expected, **TOL)
    np.testing.assert_allclose(components(mirrored_strategy, metric.counts), [np.bincount(x, minlength=3) for x in labels])


def test_add_variable_rejects_a_duplicate_name():
    metric = Histogram()
    with pytest.raises(ValueError, match="already has a state variable named 'n'"):
        metric.add_variable("n")
    assert len(metric.variables) == 2


def test_base_metric_methods_are_abstract():
    metric = td.metrics.Metric()
    assert metric.name == "metric" and metric.variables == []
    with pytest.raises(NotImplementedError):
        metric.update_state(1.0)
    with pytest.raises(NotImplementedError):
        metric.result()


# --- contexts: cross-replica updates, results inside run, reset --------------------------------

ALL_WITH_CENTRAL = [
    "default",
    "one_device_cpu",
    mirrored_param(1),
    mirrored_param(2),
    mirrored_param(4),
    "central_storage_2cpu",
]


@pytest.mark.parametrize("strategy_name", ALL_WITH_CENTRAL)
def test_update_in_cross_replica_context_counts_once(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    metric = create(strategy, td.metrics.Mean)
    with strategy.scope():
        metric.update_state([2.0, 4.0, 9.0])
    metric.update_state([5.0])  # outside the scope: no strategy, also once
    expected_total, expected_count = 2.0 + 4.0 + 9.0 + 5.0, 4.0
    np.testing.assert_allclose(metric.result(), expected_total / expected_count, **TOL)
    np.testing.assert_allclose(sum(components(strategy, metric.count)), expected_count)
    np.testing.assert_allclose(sum(components(strategy, metric.total)), expected_total)


@pytest.mark.replicas(2, 4)
def test_update_inside_merge_call_counts_once(mirrored_strategy):
    metric = create(mirrored_strategy, td.metrics.Sum)

    def step():
        td.distribute.get_replica_context().merge_call(lambda strategy: metric.update_state([5.0, 1.0]))
        return metric.result()

    seen = run_and_collect(mirrored_strategy, step)
    n = mirrored_strategy.num_replicas_in_sync
    assert sorted(seen) == list(range(n))
    # Counted once, in the first replica's copy; inside run each replica reads its own copy.
    assert [float(seen[r]) for r in range(n)] == [6.0] + [0.0] * (n - 1)
    np.testing.assert_allclose(metric.result(), 6.0)


@pytest.mark.parametrize("strategy_name", ALL_WITH_CENTRAL)
def test_result_inside_run_is_the_replicas_own_and_accumulates_over_steps(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    n = strategy.num_replicas_in_sync
    metric = create(strategy, td.metrics.Mean)
    steps = [[np.arange(r + 1, dtype=F32) * (s + 1) for r in range(n)] for s in range(2)]
    seen_first = run_and_collect(strategy, metric, distribute(strategy, steps[0]))
    seen_second = run_and_collect(strategy, metric, distribute(strategy, steps[1]))
    assert len(seen_first) == len(seen_second) == n
    for r in range(n):
        if strategy_name.startswith("central_storage"):
            # One copy of the state, written by every replica together: each reads the aggregate
            # (TensorFlow 2.21's CentralStorageStrategy: [4.5, 4.5] for a Mean of [4.0] and [5.0]).
            mine_first, mine_second = steps[0], steps[0] + steps[1]
        else:
            mine_first, mine_second = [steps[0][r]], [steps[0][r], steps[1][r]]
        np.testing.assert_allclose(seen_first[r], np.concatenate(mine_first).mean(), **TOL)
        np.testing.assert_allclose(seen_second[r], np.concatenate(mine_second).mean(), **TOL)
    np.testing.assert_allclose(metric.result(), np.concatenate(steps[0] + steps[1]).mean(), **TOL)


@pytest.mark.parametrize(
    ("make_metric", "local", "aggregate"),
    [
        (td.metrics.Mean, [4.0, 5.0], 5.0),
        (td.metrics.Sum, [4.0, 5.0], 9.0),
        (td.metrics.SparseCategoricalAccuracy, [0.6666667, 1.0], 0.8333333),
        (td.metrics.MeanSquaredError, [1.0, 2.5], 1.75),
    ],
    ids=["Mean", "Sum", "SparseCategoricalAccuracy", "MeanSquaredError"],
)
def test_result_inside_run_matches_tensorflow(mirrored_strategy, make_metric, local, aggregate):
    # TensorFlow 2.21 (Keras 3.15), MirroredStrategy on 2 CPUs: result() inside run reads each
    # replica's own copies (Mean/Sum of [4.0] and [5.0]: [4.0, 5.0]); cross-replica code reads the
    # aggregate over everything both replicas saw (the Mean of a second update of x + 1: 5.0).
    strategy = mirrored_strategy
    metric = create(strategy, make_metric)

    def step():
        r = float(td.distribute.get_replica_context().replica_id_in_sync_group)
        if make_metric in (td.metrics.Mean, td.metrics.Sum):
            metric.update_state([r + 4.0])
            result = metric.result()
            if make_metric is td.metrics.Mean:
                metric.update_state([r + 5.0])
            return result
        if make_metric is td.metrics.SparseCategoricalAccuracy:
            metric.update_state([0, 1, 1], np.array([[0.9, 0.1], [0.2, 0.8], [0.9 - 0.8 * r, 0.1 + 0.8 * r]], F32))
        else:
            metric.update_state(np.zeros((1, 2), F32), np.array([[1.0 + r, 1.0]], F32))
        return metric.result()

    results = strategy.experimental_local_results(strategy.run(step))
    np.testing.assert_allclose([float(v) for v in results], local, rtol=1e-6)
    np.testing.assert_allclose(float(metric.result()), aggregate, rtol=1e-6)


def test_results_already_returned_do_not_change(mirrored_strategy):
    metric = create(mirrored_strategy, td.metrics.Sum)
    seen = run_and_collect(mirrored_strategy, metric, distribute(mirrored_strategy, [[1.0], [2.0]]))
    cross = metric.result()
    metric.update_state([10.0])
    metric.reset_state()
    assert [float(seen[r]) for r in range(2)] == [1.0, 2.0]
    np.testing.assert_allclose(cross, 3.0)
    plain = td.metrics.Sum()
    plain.update_state([1.0, 2.0])
    before = plain.result()
    plain.update_state([5.0])
    plain.reset_state()
    np.testing.assert_allclose(before, 3.0)


@pytest.mark.parametrize("strategy_name", ALL_WITH_CENTRAL)
@pytest.mark.parametrize("metric_cls", [td.metrics.Mean, td.metrics.SparseCategoricalAccuracy], ids=_metric_ids)
def test_reset_state_zeroes_every_copy(request, strategy_name, metric_cls):
    strategy = request.getfixturevalue(strategy_name)
    n = strategy.num_replicas_in_sync
    metric = create(strategy, metric_cls)
    rng = np.random.default_rng(1)
    if metric_cls is td.metrics.Mean:
        batches = [(rng.normal(size=r + 2).astype(F32),) for r in range(n)]
    else:
        batches = [(rng.integers(0, 3, size=r + 2), rng.random((r + 2, 3)).astype(F32)) for r in range(n)]
    args = [distribute(strategy, [b[k] for b in batches]) for k in range(len(batches[0]))]
    strategy.run(metric.update_state, args=args)
    assert float(sum(components(strategy, metric.count))) == sum(r + 2 for r in range(n))

    metric.reset_state()
    for variable in metric.variables:
        np.testing.assert_array_equal(components(strategy, variable), 0.0)
    assert float(metric.result()) == 0.0
    # Only what comes after the reset counts.
    if metric_cls is td.metrics.Mean:
        strategy.run(lambda: metric.update_state([float(rid()), 1.0]))
        expected = (sum(range(n)) + n) / (2 * n)
    else:
        strategy.run(lambda: metric.update_state([rid() % 2], [[1.0, 0.0]]))
        expected = (n - n // 2) / n  # replicas with an even id predict their label
    np.testing.assert_allclose(metric.result(), expected, **TOL)


def test_reset_state_without_strategy():
    metric = td.metrics.SparseCategoricalAccuracy()
    metric.update_state([1, 0], [[0.0, 1.0], [0.0, 1.0]])
    np.testing.assert_allclose(metric.result(), 0.5)
    metric.reset_state()
    assert [float(v.numpy()) for v in metric.variables] == [0.0, 0.0]
    metric.update_state([0], [[1.0, 0.0]])
    np.testing.assert_allclose(metric.result(), 1.0)


def test_reset_states_is_keras_2s_name_of_reset_state(mirrored_strategy):
    with mirrored_strategy.scope():
        metric = td.metrics.Mean()
    mirrored_strategy.run(lambda: metric.update_state(float(rid() + 1)))
    aliases.reset_warnings()  # an old name warns once per process
    with pytest.warns(DeprecationWarning, match=r"Metric.reset_states is a deprecated name .*use Metric.reset_state\(\)"):
        metric.reset_states()
    for variable in metric.variables:
        np.testing.assert_array_equal(components(mirrored_strategy, variable), 0.0)
    assert float(metric.result()) == 0.0


def test_reset_states_calls_a_subclass_reset_state():
    class Counting(td.metrics.Sum):
        resets = 0

        def reset_state(self) -> None:
            type(self).resets += 1
            super().reset_state()

    metric = Counting()
    metric.update_state(2.0)
    aliases.reset_warnings()
    with pytest.warns(DeprecationWarning):
        metric.reset_states()
    assert Counting.resets == 1 and float(metric.result()) == 0.0


@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_result_when_nothing_was_seen_is_zero(any_strategy, metric_cls):
    metric = create(any_strategy, metric_cls)
    result = metric.result()
    assert result.shape == () and result.dtype == F32 and float(result) == 0.0
    seen = run_and_collect(any_strategy, metric.result)
    assert [float(v) for v in seen.values()] == [0.0] * any_strategy.num_replicas_in_sync


@pytest.mark.replicas(2, 4)
@pytest.mark.parametrize("case", [c for c in CASES if c.reduction == "mean"], ids=repr)
def test_only_empty_batches_give_zero(mirrored_strategy, case):
    rng = np.random.default_rng(0)
    n = mirrored_strategy.num_replicas_in_sync
    batches = [case.make_batch(rng, 0) for _ in range(n)]
    metric = create(mirrored_strategy, case.make_metric)
    args = [distribute(mirrored_strategy, [b[0][k] for b in batches]) for k in range(len(batches[0][0]))]
    seen = run_and_collect(mirrored_strategy, metric, *args)
    assert [float(v) for v in seen.values()] == [0.0] * n
    np.testing.assert_array_equal(components(mirrored_strategy, metric.count), 0.0)


# --- other strategies ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=repr)
@pytest.mark.parametrize("strategy_name", ["central_storage_2cpu", "one_device_cpu", "default"])
def test_metrics_under_other_strategies(request, strategy_name, case):
    strategy = request.getfixturevalue(strategy_name)
    n = strategy.num_replicas_in_sync
    rng = np.random.default_rng(11)
    sizes = (3, 0)[:n] if n == 2 else (5,)
    batches = [case.make_batch(rng, size) for size in sizes]
    weights = [make_weights(rng, size, "per_sample") for size in sizes]
    metric = create(strategy, case.make_metric)
    args = [distribute(strategy, [b[0][k] for b in batches]) for k in range(len(batches[0][0]))]
    seen = run_and_collect(
        strategy, lambda *a: metric(*a[:-1], sample_weight=a[-1]), *args, distribute(strategy, weights)
    )

    samples = np.concatenate([b[1] for b in batches])
    w = np.concatenate(weights).astype(np.float64)
    expected = weighted_mean(samples, w) if case.reduction == "mean" else (samples * w).sum()
    assert len(seen) == n
    for value in seen.values():
        np.testing.assert_allclose(value, expected, **TOL)
    np.testing.assert_allclose(metric.result(), expected, **TOL)


# --- dtype ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", np.float64, td.float64], ids=["str", "numpy", "td"])
@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_float64_state_and_result(mirrored_strategy, metric_cls, dtype):
    metric = create(mirrored_strategy, lambda: metric_cls(dtype=dtype))
    assert metric.dtype == np.float64
    assert metric.get_config()["dtype"] == "float64"
    assert all(c.dtype == np.float64 for v in metric.variables for c in components(mirrored_strategy, v))
    assert metric.result().dtype == np.float64  # nothing seen yet
    if metric_cls in (td.metrics.Mean, td.metrics.Sum):
        args = ([np.float32(0.1), np.float32(0.2)],)
    elif metric_cls is td.metrics.SparseCategoricalAccuracy:
        args = ([1, 0], np.array([[0.0, 1.0], [0.0, 1.0]], F32))
    else:
        args = (np.array([[0.1, 0.2]], F32), np.array([[0.0, 0.0]], F32))
    seen = run_and_collect(mirrored_strategy, metric, *args)
    assert all(v.dtype == np.float64 for v in seen.values())
    assert metric.result().dtype == np.float64


@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_default_dtype_is_float32(metric_cls):
    metric = metric_cls()
    assert metric.dtype == np.float32
    assert all(v.numpy().dtype == np.float32 for v in metric.variables)


def test_float64_accumulates_without_float32_rounding():
    metric = td.metrics.Sum(dtype="float64")
    values = np.array([1.0, 1e-9, 1e-9], dtype=np.float64)
    metric.update_state(values)
    assert float(metric.result()) == float(values.sum())
    assert float(np.float32(1.0) + np.float32(2e-9)) != float(values.sum())  # float32 would have lost it


@pytest.mark.parametrize("dtype", ["int32", np.int64, "bool"])
@pytest.mark.parametrize("metric_cls", METRIC_CLASSES, ids=_metric_ids)
def test_non_floating_dtype_is_rejected(metric_cls, dtype):
    with pytest.raises(ValueError, match="must be a floating dtype"):
        metric_cls(dtype=dtype)


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric_cls", "y_true", "y_pred"),
    [
        pytest.param(td.metrics.SparseCategoricalAccuracy, [0, 1, 2], np.eye(3, dtype=F32)[:2], id="sca"),
        pytest.param(td.metrics.SparseCategoricalAccuracy, [[0], [1]], np.eye(3, dtype=F32), id="sca_column"),
        pytest.param(td.metrics.MeanSquaredError, np.zeros((2, 4), F32), np.zeros((3, 4), F32), id="mse_rank2"),
        pytest.param(td.metrics.MeanSquaredError, np.zeros(3, F32), np.zeros(2, F32), id="mse_rank1"),
    ],
)
def test_mismatched_sample_counts_raise_and_change_nothing(metric_cls, y_true, y_pred):
    metric = metric_cls()
    with pytest.raises(
        ValueError, match=rf"{metric_cls.__name__}\.update_state\(\): y_true and y_pred must have the same"
    ):
        metric.update_state(y_true, y_pred)
    assert [float(v.numpy()) for v in metric.variables] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("metric_cls", "args", "weight"),
    [
        pytest.param(td.metrics.Mean, ([1.0, 2.0, 3.0],), [1.0, 2.0], id="mean-too_few"),
        pytest.param(td.metrics.Sum, ([1.0, 2.0],), [1.0, 2.0, 3.0], id="sum-too_many"),
        pytest.param(td.metrics.Mean, ([1.0, 2.0],), [[1.0, 2.0], [3.0, 4.0]], id="mean-rank2_weight_rank1_values"),
        pytest.param(td.metrics.Sum, (np.ones((2, 3), F32),), np.ones((2, 2), F32), id="sum-rank2_mismatch"),
        pytest.param(
            td.metrics.SparseCategoricalAccuracy, ([0, 1], np.eye(2, dtype=F32)), [1.0, 1.0, 1.0], id="sca-too_many"
        ),
        pytest.param(td.metrics.MeanSquaredError, (np.ones((3, 2), F32), np.ones((3, 2), F32)), [1.0, 2.0], id="mse"),
    ],
)
def test_non_broadcastable_weights_raise_and_change_nothing(metric_cls, args, weight):
    metric = metric_cls()
    with pytest.raises(ValueError, match="sample_weight of shape .* cannot be broadcast"):
        metric.update_state(*args, sample_weight=weight)
    assert all(float(v.numpy()) == 0.0 for v in metric.variables)


def _bad_sample_counts(metric):
    bad = rid() == 1
    return metric([0, 1, 2] if bad else [0, 1], np.eye(3, dtype=F32)[:2])


def _bad_weights(metric):
    bad = rid() == 1
    return metric([1.0, 2.0], sample_weight=[1.0, 2.0, 3.0] if bad else [1.0, 2.0])


@pytest.mark.replicas(2, 4)
@pytest.mark.parametrize(
    ("make_metric", "replica_fn", "match"),
    [
        pytest.param(td.metrics.SparseCategoricalAccuracy, _bad_sample_counts, "same number of samples", id="samples"),
        pytest.param(td.metrics.Mean, _bad_weights, "cannot be broadcast", id="weights"),
    ],
)
def test_error_in_one_replica_leaves_the_strategy_usable(mirrored_strategy, make_metric, replica_fn, match):
    metric = create(mirrored_strategy, make_metric)
    with pytest.raises(ValueError, match=match):
        mirrored_strategy.run(replica_fn, args=(metric,))
    assert_strategy_works(mirrored_strategy)

    # The metric and the strategy still work: reset, then a clean step gives the numpy value.
    metric.reset_state()
    n = mirrored_strategy.num_replicas_in_sync
    values = [np.array([float(r), 2.0 * r + 1.0], F32) for r in range(n)]
    fresh = create(mirrored_strategy, td.metrics.Mean)
    seen = run_and_collect(mirrored_strategy, fresh, distribute(mirrored_strategy, values))
    expected = np.concatenate(values).mean()
    assert len(seen) == n
    for r in range(n):
        np.testing.assert_allclose(seen[r], values[r].mean(), **TOL)
    np.testing.assert_allclose(fresh.result(), expected, **TOL)
    assert float(metric.result()) == 0.0


# --- checkpoints ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["no_strategy", pytest.param(1, id="mirrored_1cpu"), pytest.param(4, id="mirrored_4cpu"), "central_storage_2cpu"],
)
def test_checkpoint_restores_the_aggregate_into_any_strategy(request, tmp_path, mirrored_strategy, target):
    source = create(mirrored_strategy, td.metrics.Mean)
    values = [np.array([1.0, 2.0, 3.0], F32), np.array([10.0], F32)]
    mirrored_strategy.run(source.update_state, args=(distribute(mirrored_strategy, values),))
    path = td.train.Checkpoint(metric=source).write(str(tmp_path / "ckpt"))

    # Two mirrored strategies: the target, over 1 or 4 replicas, is the plugin's by count.
    if isinstance(target, int):
        strategy = mirrored_strategy_for(target)
    else:
        strategy = None if target == "no_strategy" else request.getfixturevalue(target)
    restored = create(strategy, td.metrics.Mean)
    td.train.Checkpoint(metric=restored).read(path).assert_consumed()
    all_values = np.concatenate(values)
    np.testing.assert_allclose(restored.result(), all_values.mean(), **TOL)
    restored.update_state([20.0])
    np.testing.assert_allclose(restored.result(), np.append(all_values, 20.0).mean(), **TOL)
    shown = strategy or td.distribute.get_strategy()
    np.testing.assert_allclose(sum(components(shown, restored.count)), len(all_values) + 1, **TOL)
