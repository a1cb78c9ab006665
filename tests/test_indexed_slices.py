"""``td.IndexedSlices``: the type, its validation, its text, and its densification.

Literals marked "TF 2.21" were printed by TensorFlow 2.21 (CPU) from the same inputs,
e.g. ``str(tf.IndexedSlices(tf.constant([[1., 2.], [3., 4.]]), tf.constant([0, 2]),
tf.constant([3, 2])))``. TensorFlow prints its tensors inside the frame; towerdist prints
numpy's reprs in the same frame.
"""

from __future__ import annotations

import re

import numpy as np
import optree
import pytest

import towerdist as td
from towerdist._src import nest
from towerdist._src.backend import cupy_backend
from towerdist.errors import InvalidArgumentError


def slices(values=((1.0, 2.0), (3.0, 4.0), (5.0, 6.0)), indices=(1, 1, 0), dense_shape=(3, 2), dtype=np.float32):
    return td.IndexedSlices(np.asarray(values, dtype), np.asarray(indices), None if dense_shape is None else list(dense_shape))


# --- attributes ------------------------------------------------------------------------------


def test_attributes_are_tensorflows():
    s = slices()
    assert s.dtype == np.float32
    assert s.shape == (3, 2)
    assert s.dense_shape.tolist() == [3, 2] and s.dense_shape.dtype.kind == "i"
    np.testing.assert_array_equal(s.indices, [1, 1, 0])
    np.testing.assert_array_equal(s.values, [[1, 2], [3, 4], [5, 6]])
    assert s.device == "/job:localhost/replica:0/task:0/device:CPU:0"  # TF 2.21: the same string on the host
    assert s.name == ""


def test_dense_shape_is_a_read_only_host_copy():
    shape = np.array([3, 2])
    s = td.IndexedSlices(np.ones((1, 2)), np.array([0]), shape)
    shape[0] = 99
    assert s.dense_shape.tolist() == [3, 2]
    with pytest.raises(ValueError, match="read-only"):
        s.dense_shape[0] = 5


def test_without_dense_shape_the_first_dimension_is_unknown():
    s = slices(dense_shape=None)
    assert s.dense_shape is None
    assert s.shape == (None, 2)


def test_negation_negates_the_values_and_keeps_indices_and_shape():
    s = -slices()
    assert isinstance(s, td.IndexedSlices)
    np.testing.assert_array_equal(s.values, -np.array([[1, 2], [3, 4], [5, 6]]))
    np.testing.assert_array_equal(s.indices, [1, 1, 0])
    assert s.dense_shape.tolist() == [3, 2]


def test_is_one_leaf_of_a_nest():
    s = slices()
    leaves, spec = optree.tree_flatten({"grad": s, "step": 1})
    assert leaves[0] is s and spec.num_leaves == 2
    assert nest.flatten([s])[0] == [s]
    mapped = nest.map_structure(lambda x: x, {"grad": s})
    assert mapped["grad"] is s


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "indices", "dense_shape", "match"),
    [
        (np.ones((2, 2)), np.array([0.0, 1.0]), None, r"IndexedSlices: indices must be integers; got dtype float64"),
        (np.ones((2, 2)), np.array([0, 1, 2]), None, r"IndexedSlices: values must have one slice per index: indices have shape \(3,\)"),
        (np.ones((2, 2)), np.array([0, 1]), [3, 3], r"IndexedSlices: dense_shape \(3, 3\) does not match the rows of values"),
        (np.ones((2, 2)), np.array([0, 1]), [-3, 2], r"IndexedSlices: dense_shape \[-3, 2\] has a negative dimension"),
        (np.ones((2, 2)), np.array([0, 1]), [[3, 2]], r"IndexedSlices: dense_shape must be a list of integers"),
        (np.ones((2, 2)), np.array([0, 1]), [3.5, 2], r"IndexedSlices: dense_shape must be a list of integers"),
    ],
    ids=["float_indices", "too_few_values", "row_shape", "negative", "nested_shape", "float_shape"],
)
def test_invalid_arguments_are_refused(values, indices, dense_shape, match):
    with pytest.raises(InvalidArgumentError, match=match):
        td.IndexedSlices(values, indices, dense_shape)


# --- text ----------------------------------------------------------------------------------------


def test_str_has_tensorflows_frame():
    # TF 2.21: 'IndexedSlices(indices=tf.Tensor([0 2], shape=(2,), dtype=int32), values=tf.Tensor(
    # [[1. 2.] [3. 4.]], shape=(2, 2), dtype=float32), dense_shape=tf.Tensor([3 2], shape=(2,), dtype=int32))'
    s = td.IndexedSlices(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([0, 2], np.int32), [3, 2])
    text = str(s)
    assert re.fullmatch(r"IndexedSlices\(indices=(.*), values=(.*), dense_shape=(.*)\)", text, re.S)
    assert text.index("indices=") < text.index("values=") < text.index("dense_shape=")
    assert "[0, 2]" in text and "[3, 2]" in text
    assert repr(s) == text


def test_str_without_dense_shape_leaves_it_out():
    # TF 2.21: 'IndexedSlices(indices=tf.Tensor([0 2], ...), values=tf.Tensor(..., dtype=float32))'
    text = str(slices(dense_shape=None))
    assert text.startswith("IndexedSlices(indices=") and "dense_shape" not in text and text.endswith(")")


# --- densify -------------------------------------------------------------------------------------


def test_convert_to_tensor_sums_repeated_indices():
    # TF 2.21: tf.convert_to_tensor(tf.IndexedSlices([[1., 2.], [3., 4.], [5., 6.]], [1, 1, 0], [3, 2]))
    # == [[5.0, 6.0], [4.0, 6.0], [0.0, 0.0]] (float32).
    dense = td.convert_to_tensor(slices())
    assert isinstance(dense, np.ndarray) and dense.dtype == np.float32
    np.testing.assert_array_equal(dense, [[5.0, 6.0], [4.0, 6.0], [0.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(slices()), dense)


def test_densify_keeps_integer_dtypes():
    # TF 2.21: tf.convert_to_tensor(tf.IndexedSlices(tf.constant([[1, 2]], tf.int32), [1], [2, 2])) == [[0, 0], [1, 2]] int32
    dense = td.convert_to_tensor(td.IndexedSlices(np.array([[1, 2]], np.int32), np.array([1]), [2, 2]))
    assert dense.dtype == np.int32
    assert dense.tolist() == [[0, 0], [1, 2]]


def test_np_asarray_takes_a_dtype():
    assert np.asarray(slices(), dtype=np.float64).dtype == np.float64


def test_multi_dimensional_indices_densify_their_elements():
    values = np.arange(8, dtype=np.float64).reshape(2, 2, 2)
    dense = np.asarray(td.IndexedSlices(values, np.array([[0, 2], [2, 1]]), [3, 2]))
    # slices in row-major order of the indices: rows 0, 2, 2, 1 get [0, 1], [2, 3], [4, 5], [6, 7]
    np.testing.assert_array_equal(dense, [[0, 1], [6, 7], [2 + 4, 3 + 5]])


def test_densify_without_dense_shape_raises_tensorflows_value_error():
    # TF 2.21: ValueError 'Tensor conversion requested for IndexedSlices for argument `value` without dense_shape: ...'
    with pytest.raises(ValueError, match=r"^Tensor conversion requested for IndexedSlices"):
        td.convert_to_tensor(slices(dense_shape=None))
    with pytest.raises(ValueError, match=r"^Tensor conversion requested for IndexedSlices .*np.asarray"):
        np.asarray(slices(dense_shape=None))


@pytest.mark.parametrize(("index", "position"), [(5, "[1]"), (-1, "[1]"), (3, "[1]")])
def test_densify_with_an_index_out_of_range_names_it_and_the_shape(index, position):
    # TF 2.21: InvalidArgumentError 'segment_ids[0] = 5 is out of range [0, 3) [Op:UnsortedSegmentSum]'
    s = td.IndexedSlices(np.ones((2, 2)), np.array([0, index]), [3, 2])
    with pytest.raises(InvalidArgumentError, match=rf"indices{re.escape(position)} = {index} is not in \[0, 3\): the array has shape \(3, 2\)"):
        td.convert_to_tensor(s)


def test_densify_of_an_empty_slices_is_zeros():
    dense = td.convert_to_tensor(td.IndexedSlices(np.zeros((0, 2), np.float64), np.zeros(0, np.int64), [4, 2]))
    np.testing.assert_array_equal(dense, np.zeros((4, 2)))


@pytest.mark.gpus(2)
def test_on_a_gpu_densify_runs_there_and_sums_duplicates():
    with td.device("GPU:1"):
        s = td.IndexedSlices(td.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), td.constant([1, 1, 0]), [3, 2])
        dense = td.convert_to_tensor(s)
    assert s.device == "/job:localhost/replica:0/task:0/device:GPU:1"
    assert cupy_backend.owns(dense) and int(dense.device.id) == 1
    np.testing.assert_array_equal(np.asarray(s), [[5.0, 6.0], [4.0, 6.0], [0.0, 0.0]])
    np.testing.assert_array_equal((-s).values.get(), -np.array([[1, 2], [3, 4], [5, 6]]))


@pytest.mark.gpus(1)
def test_on_a_gpu_an_index_out_of_range_is_named():
    with td.device("GPU:0"):
        s = td.IndexedSlices(td.constant([[1.0], [2.0]]), td.constant([0, 7]), [3, 1])
    with pytest.raises(InvalidArgumentError, match=r"indices\[1\] = 7 is not in \[0, 3\)"):
        td.convert_to_tensor(s)


def test_a_scalar_index_names_one_row_as_in_tensorflow():
    # TF 2.21: tf.IndexedSlices(row, 1) is one slice; v.scatter_update of it writes row 1.
    row = np.array([7.0, 8.0], np.float32)
    s = td.IndexedSlices(row, np.array(1), [3, 2])
    np.testing.assert_array_equal(td.convert_to_tensor(s), [[0, 0], [7, 8], [0, 0]])
    v = td.Variable(np.ones((3, 2), np.float32))
    v.scatter_update(td.IndexedSlices(row, 1))
    np.testing.assert_array_equal(v.numpy(), [[1, 1], [7, 8], [1, 1]])


def test_identity_keeps_an_indexed_slices_sparse_and_copies_it():
    # TF 2.21: tf.identity of an IndexedSlices is an IndexedSlices.
    values = np.ones((2, 2), np.float32)
    s = td.IndexedSlices(values, np.array([0, 2]), [3, 2])
    copy = td.identity(s)
    assert isinstance(copy, td.IndexedSlices)
    assert copy.dense_shape.tolist() == [3, 2]
    values[0, 0] = 5.0
    np.testing.assert_array_equal(copy.values, np.ones((2, 2)))
