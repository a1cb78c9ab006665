"""Scatter updates and sparse reads of plain variables (``v.scatter_add(slices)``, ``v.sparse_read(i)``).

Literals marked "TF 2.21" were printed by TensorFlow 2.21 on the CPU for the same call
(``tf.Variable([1., 2., 3., 4.]).scatter_mul(tf.IndexedSlices([2., 3., 5.], [1, 1, 3]))``
and so on). The GPU tests run the same calls on a (simulated) GPU variable.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
from towerdist._src.backend import cupy_backend
from towerdist._src.variables.variable import UnreadVariable

InvalidArgumentError = td.errors.InvalidArgumentError


def slices(values, indices, dense_shape=None):
    return td.IndexedSlices(np.asarray(values, np.float32), np.asarray(indices), dense_shape)


# TF 2.21: tf.Variable([1., 2., 3., 4.]).<method>(tf.IndexedSlices([2., 3., 5.], [1, 1, 3])).numpy()
TF_REPEATED_INDEX = {
    "scatter_add": [1.0, 7.0, 3.0, 9.0],
    "scatter_sub": [1.0, -3.0, 3.0, -1.0],
    "scatter_mul": [1.0, 12.0, 3.0, 20.0],
    "scatter_div": [1.0, 0.33333334, 3.0, 0.8],
    "scatter_min": [1.0, 2.0, 3.0, 4.0],
    "scatter_max": [1.0, 3.0, 3.0, 5.0],
    "scatter_update": [1.0, 3.0, 3.0, 5.0],  # the last row of index 1 wins
}


@pytest.mark.parametrize("method", sorted(TF_REPEATED_INDEX))
def test_scatter_applies_every_row_of_a_repeated_index_as_tensorflow(method):
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    getattr(v, method)(slices([2.0, 3.0, 5.0], [1, 1, 3]))
    np.testing.assert_allclose(v.numpy(), TF_REPEATED_INDEX[method], rtol=1e-6)


@pytest.mark.parametrize("method", sorted(TF_REPEATED_INDEX))
def test_scatter_returns_the_variable_unread(method):
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    result = getattr(v, method)(slices([2.0], [0]))
    assert type(result) is UnreadVariable and result.name == "UnreadVariable"  # TF 2.21: _UnreadVariable
    np.testing.assert_allclose(result.numpy(), v.numpy())
    v.assign([0.0, 0.0, 0.0, 0.0])
    assert result.numpy().tolist() == [0.0, 0.0, 0.0, 0.0]  # it reads the variable when used


def test_scatter_add_sums_repeated_indices_and_rows():
    # TF 2.21: tf.Variable([1., 2., 3., 4.]).scatter_add(IndexedSlices([10., 20., 30.], [0, 0, 2], [4])) -> [31, 2, 33, 4]
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    v.scatter_add(slices([10.0, 20.0, 30.0], [0, 0, 2], [4]))
    assert v.numpy().tolist() == [31.0, 2.0, 33.0, 4.0]


def test_scatter_writes_whole_rows_of_a_matrix():
    v = td.Variable(np.zeros((3, 2), np.float32))
    v.scatter_add(td.IndexedSlices(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([2, 2])))
    assert v.numpy().tolist() == [[0.0, 0.0], [0.0, 0.0], [4.0, 6.0]]


def test_scatter_with_indices_of_two_dimensions_uses_each_index():
    v = td.Variable([0.0, 0.0, 0.0])
    v.scatter_add(td.IndexedSlices(np.ones((2, 2), np.float32), np.array([[0, 1], [1, 2]])))
    assert v.numpy().tolist() == [1.0, 2.0, 1.0]


def test_integer_scatter_div_truncates_towards_zero():
    # TF 2.21: tf.Variable([7, 8, -7, 9]).scatter_div(IndexedSlices([2, 3, 2], [0, 2, 1])) -> [3, 4, -2, 9]
    v = td.Variable([7, 8, -7, 9])
    v.scatter_div(td.IndexedSlices(np.array([2, 3, 2], np.int32), np.array([0, 2, 1])))
    assert v.numpy().tolist() == [3, 4, -2, 9]


def test_integer_scatter_div_by_zero_raises_and_writes_nothing():
    v = td.Variable([7, 8])
    with pytest.raises(InvalidArgumentError, match=r"Variable.scatter_div\(\) on Variable:0: the updates must not contain 0"):
        v.scatter_div(td.IndexedSlices(np.array([2, 0], np.int32), np.array([0, 1])))
    assert v.numpy().tolist() == [7, 8]


def test_a_value_read_before_a_scatter_keeps_its_value():
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    before = v.value()
    array = np.asarray(v)
    v.scatter_update(slices([9.0], [0]))
    assert before.tolist() == [1.0, 2.0, 3.0, 4.0] and array.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert v.numpy().tolist() == [9.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("method", sorted(TF_REPEATED_INDEX))
def test_scatter_refuses_a_dense_delta(method):
    v = td.Variable([1.0, 2.0])
    # TF 2.21: TypeError("Argument `sparse_delta` must be a `tf.IndexedSlices`. Received arg: [1.]")
    with pytest.raises(TypeError, match=rf"Variable.{method}\(\) takes sparse_delta as a td.IndexedSlices"):
        getattr(v, method)(np.array([1.0, 1.0], np.float32))
    assert v.numpy().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("index", [4, -1])
@pytest.mark.parametrize("method", sorted(TF_REPEATED_INDEX))
def test_an_index_out_of_range_raises_and_writes_nothing(method, index):
    # TF 2.21: InvalidArgumentError "indices[0] = 7 is not in [0, 4)" (also for -1); the variable is unchanged.
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(InvalidArgumentError, match=rf"Variable.{method}\(\) on Variable:0: indices\[1\] = {index} is not in \[0, 4\): the variable has shape \(4,\)"):
        getattr(v, method)(slices([5.0, 6.0], [0, index]))
    assert v.numpy().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_rows_of_the_wrong_shape_raise_and_write_nothing():
    v = td.Variable(np.zeros((3, 2), np.float32))
    with pytest.raises(InvalidArgumentError, match=r"scatter_add\(\) on Variable:0: the updates must have shape .* = \(1, 2\); got updates of shape \(1, 3\)"):
        v.scatter_add(td.IndexedSlices(np.ones((1, 3), np.float32), np.array([0])))
    assert v.numpy().tolist() == [[0.0, 0.0]] * 3


def test_rows_of_a_wider_dtype_raise():
    v = td.Variable([1, 2])
    with pytest.raises(InvalidArgumentError, match=r"Variable.scatter_add\(\) on Variable:0: cannot convert an array of dtype float64 to dtype int32"):
        v.scatter_add(td.IndexedSlices(np.array([1.5]), np.array([0])))
    assert v.numpy().tolist() == [1, 2]


def test_batch_scatter_update_writes_a_row_per_batch():
    # TF 2.21: tf.Variable([[1., 2.], [3., 4.]]).batch_scatter_update(IndexedSlices([[9.], [8.]], [[1], [0]])) -> [[1, 9], [8, 4]]
    v = td.Variable([[1.0, 2.0], [3.0, 4.0]])
    result = v.batch_scatter_update(td.IndexedSlices(np.array([[9.0], [8.0]], np.float32), np.array([[1], [0]])))
    assert type(result) is UnreadVariable
    assert v.numpy().tolist() == [[1.0, 9.0], [8.0, 4.0]]


def test_batch_scatter_update_of_one_dimensional_indices_is_scatter_update():
    v = td.Variable([1.0, 2.0, 3.0])
    v.batch_scatter_update(slices([7.0, 8.0], [2, 2]))
    assert v.numpy().tolist() == [1.0, 2.0, 8.0]


def test_batch_scatter_update_out_of_range_writes_nothing():
    v = td.Variable([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(InvalidArgumentError, match=r"batch_scatter_update\(\) on Variable:0: indices\[1\]\[0\] = 2 is not in \[0, 2\)"):
        v.batch_scatter_update(td.IndexedSlices(np.array([[9.0], [8.0]], np.float32), np.array([[1], [2]])))
    assert v.numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_scatter_nd_methods_as_tensorflow():
    # TF 2.21 on [1., 2., 3., 4.]: scatter_nd_add([[1], [1]], [10., 20.]) -> [1, 32, 3, 4];
    # then scatter_nd_update([[0]], [100.]) -> [100, 32, 3, 4]; then scatter_nd_sub([[0]], [1.]) -> [99, 32, 3, 4]
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    assert type(v.scatter_nd_add([[1], [1]], [10.0, 20.0])) is UnreadVariable
    assert v.numpy().tolist() == [1.0, 32.0, 3.0, 4.0]
    v.scatter_nd_update([[0]], [100.0])
    assert v.numpy().tolist() == [100.0, 32.0, 3.0, 4.0]
    v.scatter_nd_sub([[0]], [1.0])
    assert v.numpy().tolist() == [99.0, 32.0, 3.0, 4.0]


def test_scatter_nd_addresses_elements_and_rows_of_a_matrix():
    v = td.Variable(np.zeros((2, 3), np.float32))
    v.scatter_nd_add([[0, 1], [1, 2], [0, 1]], [1.0, 2.0, 3.0])
    v.scatter_nd_update([[1]], [[7.0, 7.0, 7.0]])
    assert v.numpy().tolist() == [[0.0, 4.0, 0.0], [7.0, 7.0, 7.0]]


def test_scatter_nd_update_keeps_the_last_update_of_a_repeated_index():
    v = td.Variable([0.0, 0.0])
    v.scatter_nd_update([[1], [1], [1]], [1.0, 2.0, 3.0])
    assert v.numpy().tolist() == [0.0, 3.0]


def test_scatter_nd_out_of_range_raises_and_writes_nothing():
    # TF 2.21: InvalidArgumentError "indices[0] = [7] does not index into shape [4]"
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(InvalidArgumentError, match=r"Variable.scatter_nd_add\(\) on Variable:0: indices\[1\] = \[7\] does not index into shape \[4\]"):
        v.scatter_nd_add([[0], [7]], [1.0, 1.0])
    assert v.numpy().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_scatter_nd_updates_of_the_wrong_shape_raise():
    v = td.Variable([1.0, 2.0])
    with pytest.raises(InvalidArgumentError, match=r"scatter_nd_update\(\) on Variable:0: the updates must have shape"):
        v.scatter_nd_update([[0]], [1.0, 2.0])
    assert v.numpy().tolist() == [1.0, 2.0]


def test_sparse_read_and_gather_nd_as_tensorflow():
    # TF 2.21 on [1., 2., 3., 4.]: sparse_read([3, 0, 0]) -> [4, 1, 1]; gather_nd([[1], [2]]) -> [2, 3]
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    assert v.sparse_read([3, 0, 0]).tolist() == [4.0, 1.0, 1.0]
    assert v.gather_nd([[1], [2]]).tolist() == [2.0, 3.0]
    # TF 2.21 on [[1., 9.], [8., 4.]]: sparse_read([1]) -> [[8, 4]]; gather_nd([[0, 1], [1, 0]]) -> [9, 8]; gather_nd([[1]]) -> [[8, 4]]
    w = td.Variable([[1.0, 9.0], [8.0, 4.0]])
    assert w.sparse_read([1]).tolist() == [[8.0, 4.0]]
    assert w.gather_nd([[0, 1], [1, 0]]).tolist() == [9.0, 8.0]
    assert w.gather_nd([[1]]).tolist() == [[8.0, 4.0]]


def test_sparse_reads_are_snapshots():
    v = td.Variable([1.0, 2.0])
    rows = v.sparse_read([1])
    v.scatter_update(slices([5.0], [1]))
    assert rows.tolist() == [2.0]


def test_sparse_reads_out_of_range_raise():
    v = td.Variable([1.0, 2.0, 3.0, 4.0])
    # TF 2.21: "indices[0] = 7 is not in [0, 4)" and "indices[0] = [7] does not index into param shape [4]"
    with pytest.raises(InvalidArgumentError, match=r"Variable.sparse_read\(\) on Variable:0: indices\[0\] = 7 is not in \[0, 4\)"):
        v.sparse_read([7])
    with pytest.raises(InvalidArgumentError, match=r"Variable.gather_nd\(\) on Variable:0: indices\[0\] = \[7\] does not index into"):
        v.gather_nd([[7]])
    with pytest.raises(InvalidArgumentError, match=r"sparse_read\(\) on Variable:0: indices must be integers"):
        v.sparse_read([0.5])


# --- on a GPU (real, or simulated with TOWERDIST_SIMULATE_GPUS) --------------------------------------


@pytest.mark.gpus(1)
@pytest.mark.parametrize("method", sorted(TF_REPEATED_INDEX))
def test_scatter_on_a_gpu_variable_gives_the_cpu_result(method):
    with td.device("GPU:0"):
        v = td.Variable([1.0, 2.0, 3.0, 4.0])
    getattr(v, method)(slices([2.0, 3.0, 5.0], [1, 1, 3]))  # host rows: moved to the GPU
    assert cupy_backend.owns(v.value())
    np.testing.assert_allclose(v.numpy(), TF_REPEATED_INDEX[method], rtol=1e-6)


@pytest.mark.gpus(1)
def test_scatter_nd_and_sparse_reads_on_a_gpu_variable():
    with td.device("GPU:0"):
        v = td.Variable([[1.0, 2.0], [3.0, 4.0]])
    v.scatter_nd_add([[0, 1], [0, 1]], [1.0, 1.0])
    v.batch_scatter_update(td.IndexedSlices(np.array([[9.0], [8.0]], np.float32), np.array([[0], [1]])))
    rows = v.sparse_read([1, 0])
    assert cupy_backend.owns(rows)
    np.testing.assert_array_equal(cupy_backend.xp.asnumpy(rows), [[3.0, 8.0], [9.0, 4.0]])
    np.testing.assert_array_equal(cupy_backend.xp.asnumpy(v.gather_nd([[0, 0]])), [9.0])


@pytest.mark.gpus(1)
def test_an_index_out_of_range_on_a_gpu_variable_writes_nothing():
    with td.device("GPU:0"):
        v = td.Variable([1.0, 2.0])
    with pytest.raises(InvalidArgumentError, match=r"indices\[0\] = 2 is not in \[0, 2\)"):
        v.scatter_add(slices([1.0], [2]))
    assert v.numpy().tolist() == [1.0, 2.0]


def test_a_float_scatter_div_by_zero_is_refused_and_writes_nothing():
    # TF 2.21: InvalidArgumentError "updates must not contain 0 [Op:ResourceScatterDiv]"; the variable unchanged.
    v = td.Variable(np.arange(8, dtype=np.float32).reshape(4, 2) + 1)
    before = v.numpy()
    with pytest.raises(InvalidArgumentError, match="must not contain 0"):
        v.scatter_div(td.IndexedSlices(np.float32([[0.0, 2.0]]), np.array([1])))
    np.testing.assert_array_equal(v.numpy(), before)
