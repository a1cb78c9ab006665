"""Scatter updates and sparse reads of distributed variables, in both contexts and every aggregation.

Literals marked "TF 2.21" come from TensorFlow 2.21 on a MirroredStrategy over 2 logical
CPUs: the variable starts at [1., 2., 3., 4.]; in cross-replica context it is written with
IndexedSlices([2., 3., 5.], [1, 1, 3]); in replica context replica r passes
IndexedSlices((r + 1) * [2., 3.], [1, 3], dense_shape=[4]). The rules are also checked on 1
and 4 replicas through their formulas.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
from towerdist._src.backend import cupy_backend
from towerdist._src.variables.variable import UnreadVariable

A = td.VariableAggregation
ON_READ = td.VariableSynchronization.ON_READ
InvalidArgumentError = td.errors.InvalidArgumentError
SLICE_METHODS = ("scatter_add", "scatter_sub", "scatter_mul", "scatter_div", "scatter_min", "scatter_max", "scatter_update")


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def components(v) -> list[list[float]]:
    return [np.asarray(cupy_backend.xp.asnumpy(c.value()) if cupy_backend.owns(c.value()) else c.value()).tolist() for c in v.values]


def replica_slices():
    return td.IndexedSlices(np.float32(rid() + 1) * np.array([2.0, 3.0], np.float32), np.array([1, 3]), [4])


def cross_slices():
    return td.IndexedSlices(np.array([2.0, 3.0, 5.0], np.float32), np.array([1, 1, 3]))


def make(strategy, aggregation, **kwargs):
    with strategy.scope():
        return td.Variable([1.0, 2.0, 3.0, 4.0], aggregation=aggregation, **kwargs)


def assert_strategy_works(strategy):
    n = strategy.num_replicas_in_sync
    total = strategy.reduce("sum", strategy.run(lambda: td.constant(float(rid() + 1))), axis=None)
    assert float(total) == n * (n + 1) / 2


# TF 2.21, cross-replica context (every aggregation where allowed): each component gets the plain result.
TF_CROSS_REPLICA = {
    "scatter_add": [1.0, 7.0, 3.0, 9.0],
    "scatter_sub": [1.0, -3.0, 3.0, -1.0],
    "scatter_mul": [1.0, 12.0, 3.0, 20.0],
    "scatter_div": [1.0, 0.33333334, 3.0, 0.8],
    "scatter_min": [1.0, 2.0, 3.0, 4.0],
    "scatter_max": [1.0, 3.0, 3.0, 5.0],
    "scatter_update": [1.0, 3.0, 3.0, 5.0],
}


def allowed(method, aggregation):
    return not (method in ("scatter_min", "scatter_max", "scatter_update") and aggregation in (A.SUM, A.MEAN))


@pytest.mark.replicas(1, 2, 4)
@pytest.mark.parametrize(
    ("aggregation", "method"),
    [(a, m) for a in (A.NONE, A.SUM, A.MEAN, A.ONLY_FIRST_REPLICA) for m in SLICE_METHODS if allowed(m, a)],
    ids=str,
)
def test_cross_replica_scatter_writes_every_component_and_returns_their_values(mirrored_strategy, method, aggregation):
    v = make(mirrored_strategy, aggregation)
    result = getattr(v, method)(cross_slices())
    for component in components(v):
        np.testing.assert_allclose(component, TF_CROSS_REPLICA[method], rtol=1e-6)
    n = mirrored_strategy.num_replicas_in_sync
    if n == 1:
        np.testing.assert_allclose(np.asarray(result), TF_CROSS_REPLICA[method], rtol=1e-6)
    else:  # TF 2.21: Mirrored of the components' new values (what extended.update gives)
        assert isinstance(result, td.distribute.Mirrored) and len(result.values) == n
        np.testing.assert_allclose(np.asarray(result.values[-1]), TF_CROSS_REPLICA[method], rtol=1e-6)


@pytest.mark.replicas(2, 4)
@pytest.mark.parametrize("method", SLICE_METHODS)
def test_cross_replica_scatter_of_per_replica_slices_gives_each_component_its_own(mirrored_strategy, method):
    v = make(mirrored_strategy, A.NONE)
    n = mirrored_strategy.num_replicas_in_sync
    per = mirrored_strategy.experimental_distribute_values_from_function(
        lambda ctx: td.IndexedSlices(np.array([float(ctx.replica_id_in_sync_group + 2)], np.float32), np.array([0]))
    )
    getattr(v, method)(per)
    assert len({tuple(c) for c in components(v)}) == (1 if method in ("scatter_min",) else n)


# TF 2.21, replica context, aggregation NONE: each replica writes its own component.
TF_REPLICA_NONE = {
    "scatter_add": [[1.0, 4.0, 3.0, 7.0], [1.0, 6.0, 3.0, 10.0]],
    "scatter_sub": [[1.0, 0.0, 3.0, 1.0], [1.0, -2.0, 3.0, -2.0]],
    "scatter_mul": [[1.0, 4.0, 3.0, 12.0], [1.0, 8.0, 3.0, 24.0]],
    "scatter_div": [[1.0, 1.0, 3.0, 1.3333334], [1.0, 0.5, 3.0, 0.6666667]],
    "scatter_min": [[1.0, 2.0, 3.0, 3.0], [1.0, 2.0, 3.0, 4.0]],
    "scatter_max": [[1.0, 2.0, 3.0, 4.0], [1.0, 4.0, 3.0, 6.0]],
    "scatter_update": [[1.0, 2.0, 3.0, 3.0], [1.0, 4.0, 3.0, 6.0]],
}


@pytest.mark.parametrize("method", SLICE_METHODS)
def test_replica_scatter_with_aggregation_none_writes_the_replicas_own_component(mirrored_strategy, method):
    v = make(mirrored_strategy, A.NONE)
    result = mirrored_strategy.run(lambda: getattr(v, method)(replica_slices()))
    np.testing.assert_allclose(components(v), TF_REPLICA_NONE[method], rtol=1e-6)
    # TF 2.21: PerReplica of UnreadVariables
    assert isinstance(result, td.distribute.DistributedValues)
    assert all(type(r) is UnreadVariable for r in result.values)


# TF 2.21, replica context with aggregation: the replicas' IndexedSlices reduced, then every component written.
TF_REPLICA_AGGREGATED = {
    (A.SUM, "scatter_add"): [1.0, 8.0, 3.0, 13.0],
    (A.SUM, "scatter_sub"): [1.0, -4.0, 3.0, -5.0],
    (A.MEAN, "scatter_add"): [1.0, 5.0, 3.0, 8.5],
    (A.MEAN, "scatter_sub"): [1.0, -1.0, 3.0, -0.5],
    (A.ONLY_FIRST_REPLICA, "scatter_add"): [1.0, 4.0, 3.0, 7.0],
    (A.ONLY_FIRST_REPLICA, "scatter_sub"): [1.0, 0.0, 3.0, 1.0],
    (A.ONLY_FIRST_REPLICA, "scatter_mul"): [1.0, 4.0, 3.0, 12.0],
    (A.ONLY_FIRST_REPLICA, "scatter_div"): [1.0, 1.0, 3.0, 1.3333334],
    (A.ONLY_FIRST_REPLICA, "scatter_min"): [1.0, 2.0, 3.0, 3.0],
    (A.ONLY_FIRST_REPLICA, "scatter_max"): [1.0, 2.0, 3.0, 4.0],
    (A.ONLY_FIRST_REPLICA, "scatter_update"): [1.0, 2.0, 3.0, 3.0],
    # TF 2.21 applies each replica's row in turn (its reduction concatenates the rows): x * a * b.
    (A.SUM, "scatter_mul"): [1.0, 16.0, 3.0, 72.0],
    (A.SUM, "scatter_div"): [1.0, 0.25, 3.0, 0.22222222],
    (A.MEAN, "scatter_mul"): [1.0, 4.0, 3.0, 18.0],
    (A.MEAN, "scatter_div"): [1.0, 1.0, 3.0, 0.88888889],
}


@pytest.mark.parametrize(("aggregation", "method"), sorted(TF_REPLICA_AGGREGATED, key=str), ids=str)
def test_replica_scatter_with_aggregation_writes_the_combined_rows_everywhere(mirrored_strategy, aggregation, method):
    v = make(mirrored_strategy, aggregation)
    result = mirrored_strategy.run(lambda: getattr(v, method)(replica_slices()))
    expected = TF_REPLICA_AGGREGATED[(aggregation, method)]
    for component in components(v):
        np.testing.assert_allclose(component, expected, rtol=1e-6)
    # TF 2.21: PerReplica of each component's new value
    for value in result.values:
        np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-6)


@pytest.mark.replicas(1, 2, 4)
def test_replica_scatter_add_sum_adds_every_replicas_rows(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    v = make(mirrored_strategy, A.SUM)
    mirrored_strategy.run(lambda: v.scatter_add(td.IndexedSlices(np.array([1.0, 1.0], np.float32), np.array([rid() % 4, 0]), [4])))
    expected = np.array([1.0, 2.0, 3.0, 4.0]) + np.bincount([r % 4 for r in range(n)] + [0] * n, minlength=4)
    for component in components(v):
        np.testing.assert_allclose(component, expected)


def test_replica_scatter_sum_of_one_shared_object_raises_as_tensorflow(mirrored_strategy):
    # TF 2.21: ValueError "A non-DistributedValues value IndexedSlices(...) cannot be reduced with the given reduce op ReduceOp.SUM."
    v = make(mirrored_strategy, A.SUM)
    shared = td.IndexedSlices(np.array([9.0], np.float32), np.array([1]), [4])
    with pytest.raises(ValueError):
        mirrored_strategy.run(lambda: v.scatter_add(shared))
    assert components(v) == [[1.0, 2.0, 3.0, 4.0]] * 2
    assert_strategy_works(mirrored_strategy)


@pytest.mark.parametrize("context", ["cross_replica", "replica"])
@pytest.mark.parametrize("aggregation", [A.SUM, A.MEAN], ids=str)
@pytest.mark.parametrize("method", ["scatter_min", "scatter_max", "scatter_update"])
def test_mirrored_scatter_min_max_update_refuse_sum_and_mean(mirrored_strategy, method, aggregation, context):
    # TF 2.21: NotImplementedError("scatter_min is only supported for mirrored variable (...) with NONE or
    # `ONLY_FIRST_REPLICA` aggregation, got: VariableAggregationV2.SUM.")
    v = make(mirrored_strategy, aggregation)
    call = lambda: getattr(v, method)(td.IndexedSlices(np.array([9.0], np.float32), np.array([1]), [4]))  # noqa: E731
    with pytest.raises(NotImplementedError, match=rf"MirroredVariable.{method}\(\) is only supported for mirrored variables with NONE or ONLY_FIRST_REPLICA aggregation, got: {aggregation}"):
        call() if context == "cross_replica" else mirrored_strategy.run(call)
    assert components(v) == [[1.0, 2.0, 3.0, 4.0]] * 2
    assert_strategy_works(mirrored_strategy)


@pytest.mark.parametrize("context", ["cross_replica", "replica"])
@pytest.mark.parametrize("aggregation", [A.NONE, A.SUM, A.MEAN, A.ONLY_FIRST_REPLICA], ids=str)
@pytest.mark.parametrize("method", SLICE_METHODS)
def test_sync_on_read_variables_refuse_scatter(mirrored_strategy, method, aggregation, context):
    # TF 2.21: NotImplementedError("Variables with `synchronization=ON_READ` doesn't support `scatter_add`")
    v = make(mirrored_strategy, aggregation, synchronization=ON_READ)
    call = lambda: getattr(v, method)(td.IndexedSlices(np.array([9.0], np.float32), np.array([1]), [4]))  # noqa: E731
    with pytest.raises(NotImplementedError, match=rf"Variables with `synchronization=ON_READ` doesn't support `{method}`: SyncOnReadVariable.{method}\(\)"):
        call() if context == "cross_replica" else mirrored_strategy.run(call)
    assert components(v) == [[1.0, 2.0, 3.0, 4.0]] * 2


@pytest.mark.parametrize("context", ["cross_replica", "replica"])
@pytest.mark.parametrize("synchronization", [td.VariableSynchronization.ON_WRITE, ON_READ], ids=str)
@pytest.mark.parametrize(
    "call",
    [
        lambda v: v.scatter_nd_add([[1]], [1.0]),
        lambda v: v.scatter_nd_sub([[1]], [1.0]),
        lambda v: v.scatter_nd_update([[1]], [1.0]),
        lambda v: v.batch_scatter_update(td.IndexedSlices(np.array([9.0], np.float32), np.array([1]))),
    ],
    ids=["scatter_nd_add", "scatter_nd_sub", "scatter_nd_update", "batch_scatter_update"],
)
def test_distributed_variables_refuse_scatter_nd_and_batch_scatter_update(mirrored_strategy, call, synchronization, context):
    # TF 2.21: NotImplementedError() (tf.Variable's unimplemented method) on MirroredVariable and SyncOnReadVariable
    v = make(mirrored_strategy, A.NONE, synchronization=synchronization)
    with pytest.raises(NotImplementedError, match=r"Variable\.(scatter_nd_\w+|batch_scatter_update)\(\) is not supported by distributed variables"):
        call(v) if context == "cross_replica" else mirrored_strategy.run(lambda: call(v))
    assert components(v) == [[1.0, 2.0, 3.0, 4.0]] * 2


def test_scatter_nd_works_on_each_copy_in_extended_update(mirrored_strategy):
    v = make(mirrored_strategy, A.NONE)
    mirrored_strategy.extended.update(v, lambda copy: copy.scatter_nd_add([[1]], [10.0]))
    assert components(v) == [[1.0, 12.0, 3.0, 4.0]] * 2


@pytest.mark.parametrize("context", ["cross_replica", "replica"])
@pytest.mark.parametrize("aggregation", [A.NONE, A.SUM], ids=str)
def test_an_index_out_of_range_writes_no_component_and_leaves_the_strategy_usable(mirrored_strategy, aggregation, context):
    v = make(mirrored_strategy, aggregation)
    bad = lambda: v.scatter_add(td.IndexedSlices(np.array([1.0, 1.0], np.float32), np.array([0, 5]), [6]))  # noqa: E731
    with pytest.raises(InvalidArgumentError, match=r"indices\[1\] = 5 is not in \[0, 4\)"):
        bad() if context == "cross_replica" else mirrored_strategy.run(bad)
    assert components(v) == [[1.0, 2.0, 3.0, 4.0]] * 2
    assert_strategy_works(mirrored_strategy)
    mirrored_strategy.run(lambda: v.scatter_add(td.IndexedSlices(np.array([1.0], np.float32), np.array([0]), [4])))
    assert components(v)[0][0] > 1.0


@pytest.mark.parametrize("context", ["cross_replica", "replica"])
def test_a_dense_delta_is_refused_with_a_type_error(mirrored_strategy, context):
    # TF 2.21: TypeError("Argument `sparse_delta` must be a `tf.IndexedSlices`. Received arg: [1. 1. 1. 1.]")
    v = make(mirrored_strategy, A.SUM)
    call = lambda: v.scatter_add(np.ones(4, np.float32))  # noqa: E731
    with pytest.raises(TypeError, match=r"MirroredVariable.scatter_add\(\) takes sparse_delta as a td.IndexedSlices"):
        call() if context == "cross_replica" else mirrored_strategy.run(call)
    assert_strategy_works(mirrored_strategy)


def test_a_value_read_before_a_scatter_keeps_its_value(mirrored_strategy):
    v = make(mirrored_strategy, A.NONE)
    before = [c.value() for c in v.values]
    v.scatter_update(td.IndexedSlices(np.array([9.0], np.float32), np.array([0])))
    assert [b.tolist() for b in before] == [[1.0, 2.0, 3.0, 4.0]] * 2


# --- sparse reads: the value the context reads (TF 2.21 raises a bare AttributeError: decided difference) ---


def test_mirrored_sparse_reads_read_the_replicas_own_component(mirrored_strategy):
    v = make(mirrored_strategy, A.NONE)
    mirrored_strategy.run(lambda: v.assign_add([float(rid())] * 4))
    rows = mirrored_strategy.run(lambda: v.sparse_read([3, 0]))
    assert [np.asarray(r).tolist() for r in rows.values] == [[4.0, 1.0], [5.0, 2.0]]
    assert np.asarray(v.gather_nd([[3]])).tolist() == [4.0]  # cross-replica: the first component


@pytest.mark.parametrize(("aggregation", "expected"), [(A.SUM, [7.0, 3.0]), (A.MEAN, [3.5, 1.5]), (A.ONLY_FIRST_REPLICA, [3.0, 1.0])], ids=str)
def test_sync_on_read_sparse_reads_aggregate_in_cross_replica_context(mirrored_strategy, aggregation, expected):
    v = make(mirrored_strategy, aggregation, synchronization=ON_READ)
    mirrored_strategy.run(lambda: v.assign([1.0 + rid(), 2.0, 3.0, 3.0 + rid()]))
    assert np.asarray(v.sparse_read([3, 0])).tolist() == expected
    local = mirrored_strategy.run(lambda: v.gather_nd([[3]]))
    assert [np.asarray(r).tolist() for r in local.values] == [[3.0], [4.0]]


# --- on (simulated) GPUs -----------------------------------------------------------------------


@pytest.mark.gpus(2)
@pytest.mark.parametrize("aggregation", [A.NONE, A.SUM, A.ONLY_FIRST_REPLICA], ids=str)
def test_scatter_on_gpu_components_in_both_contexts(aggregation):
    strategy = td.distribute.MirroredStrategy(["GPU:0", "GPU:1"])
    v = make(strategy, aggregation)
    v.scatter_add(cross_slices())
    assert components(v) == [TF_CROSS_REPLICA["scatter_add"]] * 2
    v.assign([1.0, 2.0, 3.0, 4.0])
    strategy.run(lambda: v.scatter_add(replica_slices()))
    expected = TF_REPLICA_NONE["scatter_add"] if aggregation is A.NONE else [TF_REPLICA_AGGREGATED[(aggregation, "scatter_add")]] * 2
    assert components(v) == expected
    assert all(cupy_backend.owns(c.value()) for c in v.values)
    with pytest.raises(InvalidArgumentError, match=r"is not in \[0, 4\)"):
        v.scatter_add(td.IndexedSlices(np.array([0.0], np.float32), np.array([4])))
    assert components(v) == expected
