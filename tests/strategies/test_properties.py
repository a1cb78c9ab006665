"""Property tests: reductions and gathers over 1-8 replicas agree with numpy.

Every property draws a replica count (1-8), shapes (0-d and 0-size dimensions included)
and dtypes (float32, float64, int32, int64), runs the towerdist API on the cached
``mirrored_strategy_for(n)`` strategies from conftest, and compares with a numpy computation of what
TensorFlow gives. Integers must match exactly; floats within float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import towerdist as td
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from numpy_reference import numpy_reduce

D = td.distribute
SUM, MEAN = D.ReduceOp.SUM, D.ReduceOp.MEAN
DTYPES = [np.float32, np.float64, np.int32, np.int64]
MAX_ABS = 100  # bound on the drawn values, so float tolerances can be absolute too
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
ATOL = {np.dtype(np.float32): 1e-3, np.dtype(np.float64): 1e-9}  # cancellation near 0

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

reduce_ops = st.sampled_from([SUM, MEAN])
replica_counts = st.integers(min_value=1, max_value=8)


def elements(dtype):
    if np.dtype(dtype).kind == "i":
        return st.integers(-MAX_ABS, MAX_ABS)
    width = np.dtype(dtype).itemsize * 8
    return st.floats(-MAX_ABS, MAX_ABS, width=width, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def arrays_of(draw, dtype, shape):
    return draw(hnp.arrays(dtype, shape, elements=elements(dtype)))


@st.composite
def same_shape_values(draw, n=None):
    """One array per replica, all of one random shape and dtype."""
    n = draw(replica_counts) if n is None else n
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    return [arrays_of(draw, dtype, shape) for _ in range(n)]


@st.composite
def uneven_values(draw):
    """One array per replica whose sizes along a random ``axis`` differ (0 included)."""
    n = draw(replica_counts)
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(1, 3))
    base = list(draw(hnp.array_shapes(min_dims=ndim, max_dims=ndim, min_side=0, max_side=3)))
    axis = draw(st.integers(-ndim, ndim - 1))
    arrays = []
    for _ in range(n):
        shape = list(base)
        shape[axis] = draw(st.integers(0, 4))
        arrays.append(arrays_of(draw, dtype, tuple(shape)))
    return arrays, axis


def distribute(strategy, arrays):
    """A PerReplica of ``strategy`` whose replica ``i`` holds ``arrays[i]``."""
    return strategy.experimental_distribute_values_from_function(lambda ctx: arrays[ctx.replica_id_in_sync_group])


def assert_reduced(actual, expected) -> None:
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if expected.dtype.kind in "iu" and actual.dtype.kind in "iu":
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=RTOL[expected.dtype], atol=ATOL[expected.dtype])


def assert_all_reduced(actual, op, arrays, *, in_place: bool = True) -> None:
    """``actual`` is the reduction of ``arrays``.

    One replica's value that is already on its destination is returned as it is
    (TensorFlow's single-value shortcut, reference 2.8), so its dtype is kept even for an
    integer MEAN; every API agrees on this (``test_one_replica_int_mean_has_one_dtype_in_every_api``).
    Sent to another device it is reduced like any value.
    """
    if len(arrays) == 1 and in_place:
        assert_reduced(actual, arrays[0])
    else:
        assert_reduced(actual, numpy_reduce(op, arrays))


# --- strategy.reduce ------------------------------------------------------------------------


@PROPERTY
@given(arrays=same_shape_values(), op=reduce_ops)
def test_reduce_without_axis_is_the_elementwise_reduction(arrays, op):
    strategy = mirrored_strategy_for(len(arrays))
    result = strategy.reduce(op, distribute(strategy, arrays), axis=None)
    if len(arrays) == 1:
        # Reference 2.8: one value already in place is returned as it is (an identity).
        assert_reduced(result, arrays[0])
    else:
        assert_reduced(result, numpy_reduce(op, arrays))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0/0 when no elements
@PROPERTY
@given(values=uneven_values(), op=reduce_ops)
def test_reduce_along_an_axis_is_the_global_reduction(values, op):
    # Reference 3.9: SUM with axis = global sum; MEAN = global sum / global element count
    # along axis (uneven and empty replicas weighted exactly; integer MEAN is float64;
    # no elements at all gives 0/0 = nan).
    arrays, axis = values
    strategy = mirrored_strategy_for(len(arrays))
    result = strategy.reduce(op, distribute(strategy, arrays), axis=axis)
    dtype = arrays[0].dtype
    total = np.sum(np.concatenate(arrays, axis=axis), axis=axis, dtype=dtype)
    if op is SUM:
        expected = np.asarray(total)
    else:
        count = sum(a.shape[axis] for a in arrays)
        out_dtype = np.float64 if dtype.kind in "iu" else dtype
        with np.errstate(invalid="ignore"):
            expected = np.asarray(np.true_divide(total, count, dtype=out_dtype))
    assert_reduced(result, expected)


# --- ReplicaContext.all_reduce --------------------------------------------------------------


@PROPERTY
@given(arrays=same_shape_values(), op=reduce_ops)
def test_all_reduce_gives_every_replica_the_reduction(arrays, op):
    strategy = mirrored_strategy_for(len(arrays))

    def step():
        return D.get_replica_context().all_reduce(op, arrays[D.get_replica_context().replica_id_in_sync_group])

    locals_ = strategy.experimental_local_results(strategy.run(step))
    assert len(locals_) == len(arrays)
    for local in locals_:
        assert_all_reduced(local, op, arrays)


# --- extended.batch_reduce_to ---------------------------------------------------------------


@st.composite
def batch_requests(draw):
    """Several values of mixed dtypes/shapes, each with a destination, and options."""
    n = draw(replica_counts)
    values = draw(st.lists(same_shape_values(n), min_size=1, max_size=5))
    # None: all-reduce (destinations = the value); k: reduce onto logical CPU k.
    destinations = [draw(st.one_of(st.none(), st.integers(0, 7))) for _ in values]
    bytes_per_pack = draw(st.one_of(st.just(0), st.integers(1, 4096)))
    return values, destinations, bytes_per_pack


@PROPERTY
@given(request=batch_requests(), op=reduce_ops)
def test_batch_reduce_to_reduces_every_value_whatever_the_packing(request, op):
    inputs, targets, bytes_per_pack = request
    n = len(inputs[0])
    strategy = mirrored_strategy_for(n)
    values = [distribute(strategy, arrays) for arrays in inputs]
    pairs = [(v, v if k is None else f"CPU:{k}") for v, k in zip(values, targets)]
    options = D.experimental.CommunicationOptions(bytes_per_pack=bytes_per_pack)
    results = strategy.extended.batch_reduce_to(op, pairs, options)
    assert len(results) == len(inputs)
    for result, arrays, k in zip(results, inputs, targets):
        if k is None and n > 1:
            assert isinstance(result, D.Mirrored)
            assert len(result.values) == n
            components = result.values
        else:
            assert isinstance(result, np.ndarray)  # one destination: a bare array
            components = [result]
        for component in components:
            # With one replica on CPU:0, the destination CPU:0 is where the value already is.
            assert_all_reduced(component, op, arrays, in_place=k is None or (n == 1 and k == 0))


# --- gather / all_gather --------------------------------------------------------------------


@PROPERTY
@given(values=uneven_values())
def test_gather_concatenates_in_replica_order(values):
    arrays, axis = values
    strategy = mirrored_strategy_for(len(arrays))
    result = strategy.gather(distribute(strategy, arrays), axis=axis)
    expected = np.concatenate(arrays, axis=axis)
    assert result.dtype == expected.dtype
    np.testing.assert_array_equal(result, expected, strict=True)


@PROPERTY
@given(values=uneven_values())
def test_all_gather_gives_every_replica_the_concatenation(values):
    arrays, axis = values
    strategy = mirrored_strategy_for(len(arrays))

    def step():
        return D.get_replica_context().all_gather(arrays[D.get_replica_context().replica_id_in_sync_group], axis=axis)

    expected = np.concatenate(arrays, axis=axis)
    locals_ = strategy.experimental_local_results(strategy.run(step))
    assert len(locals_) == len(arrays)
    for local in locals_:
        np.testing.assert_array_equal(local, expected, strict=True)


# --- the algorithms agree -------------------------------------------------------------------


@st.composite
def all_reduce_batches(draw):
    n = draw(replica_counts)
    return draw(st.lists(same_shape_values(n), min_size=1, max_size=4))


@PROPERTY
@given(inputs=all_reduce_batches(), op=reduce_ops, num_packs=st.integers(0, 3))
def test_hierarchical_copy_one_device_and_default_ops_agree(inputs, op, num_packs):
    n = len(inputs[0])
    strategy = mirrored_strategy_for(n)
    default_ops = strategy.extended._cross_device_ops  # what MirroredStrategy picked for CPUs
    values = [distribute(strategy, arrays) for arrays in inputs]
    pairs = [(v, v) for v in values]
    by_algorithm = [
        ops.batch_reduce(op, pairs)
        for ops in (default_ops, D.ReductionToOneDevice(), D.HierarchicalCopyAllReduce(num_packs=num_packs))
    ]
    for results in by_algorithm:
        for result, arrays in zip(results, inputs):
            for component in strategy.experimental_local_results(result):
                assert_all_reduced(component, op, arrays)
    # The three agree with each other, dtypes included (integers exactly).
    firsts = [[np.asarray(strategy.experimental_local_results(r)[0]) for r in results] for results in by_algorithm]
    for other_algorithm in firsts[1:]:
        for ours, default in zip(other_algorithm, firsts[0]):
            assert_reduced(ours, default)
