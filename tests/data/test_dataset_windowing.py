"""``Dataset.window``, ``group_by_window`` and ``bucket_by_sequence_length`` (and their
``td.data.experimental`` forms): order, element specs, cardinality, errors, distribution.

Expected values were observed in TensorFlow 2.21 unless a test says otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td

D = td.data.Dataset
TS = td.TensorSpec
INF = td.data.INFINITE_CARDINALITY
UNK = td.data.UNKNOWN_CARDINALITY

pytestmark = pytest.mark.timeout(60)


def windows(dataset: D) -> list[list[int]]:
    """The windows of a dataset of windows of scalars, as lists of ints."""
    return [[int(v) for v in window] for window in dataset]


def as_lists(dataset: D) -> list:
    return [np.asarray(element).tolist() for element in dataset]


# --- window -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected", "cardinality"),
    [
        ((3,), [[0, 1, 2], [3, 4, 5], [6]], 3),
        ((3, None, 1, True), [[0, 1, 2], [3, 4, 5]], 2),
        ((3, 2, 1, True), [[0, 1, 2], [2, 3, 4], [4, 5, 6]], 3),
        ((3, 1, 2, True), [[0, 2, 4], [1, 3, 5], [2, 4, 6]], 3),
        ((3, 1, 2, False), [[0, 2, 4], [1, 3, 5], [2, 4, 6], [3, 5], [4, 6], [5], [6]], 7),
        ((2, 5), [[0, 1], [5, 6]], 2),
        ((3, 5, 3), [[0, 3, 6], [5]], 2),
    ],
    ids=["size", "drop", "shift", "stride-drop", "stride", "gaps", "gaps-stride"],
)
def test_window_order_and_cardinality(args, expected, cardinality):
    # observed in TensorFlow 2.21 (over range(7))
    ds = D.range(7).window(*args)
    assert windows(ds) == expected
    assert ds.cardinality() == cardinality


def test_window_element_spec_is_a_dataset_spec():
    # observed in TensorFlow 2.21
    ds = D.range(7).window(3)
    assert repr(ds.element_spec) == "DatasetSpec(TensorSpec(shape=(), dtype=tf.int64, name=None), TensorShape([]))"
    first = next(iter(ds))
    assert isinstance(first, D)
    assert first.element_spec == TS((), np.int64)
    assert first.cardinality() == 3


def test_window_of_tuples_is_a_tuple_of_datasets():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices(([1, 2, 3], [4, 5, 6])).window(2)
    assert [(windows_of(a), windows_of(b)) for a, b in ds] == [([1, 2], [4, 5]), ([3], [6])]
    assert ds.element_spec[1].element_spec == TS((), np.int32)


def windows_of(dataset: D) -> list[int]:
    return [int(v) for v in dataset]


def test_window_of_dicts_is_a_dict_of_datasets():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices({"a": [1, 2, 3], "b": [4, 5, 6]}).window(2)
    assert [{k: windows_of(v) for k, v in d.items()} for d in ds] == [{"a": [1, 2], "b": [4, 5]}, {"a": [3], "b": [6]}]


def test_window_of_nested_elements_keeps_the_nesting():
    # observed in TensorFlow 2.21: ((DatasetSpec(int64), {'a': DatasetSpec(float64)}),)
    ds = D.from_tensor_slices(((np.arange(3), {"a": np.arange(3.0)}),)).window(2)
    (inner,) = ds.element_spec
    assert inner[0].element_spec == TS((), np.int64)
    assert inner[1]["a"].element_spec == TS((), np.float64)
    ((ints, floats),) = next(iter(ds))
    assert windows_of(ints) == [0, 1]
    assert [float(v) for v in floats["a"]] == [0.0, 1.0]


def test_window_then_flat_map_batch():
    # observed in TensorFlow 2.21
    ds = D.range(7).window(3, 2).flat_map(lambda w: w.batch(3))
    assert as_lists(ds) == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6]]


def test_window_of_tuples_then_flat_map_zip():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices(([1, 2, 3], [4, 5, 6])).window(2)
    flat = ds.flat_map(lambda a, b: D.zip((a.batch(2), b.batch(2))))
    assert [(a.tolist(), b.tolist()) for a, b in flat] == [([1, 2], [4, 5]), ([3], [6])]


def test_window_of_an_empty_dataset_is_empty():
    # observed in TensorFlow 2.21
    ds = D.range(0).window(3)
    assert windows(ds) == []
    assert ds.cardinality() == 0


def test_window_cardinality_of_infinite_and_unknown_inputs():
    # observed in TensorFlow 2.21
    assert D.range(7).repeat().window(3).cardinality() == INF
    assert D.range(7).filter(lambda x: True).window(3).cardinality() == UNK


def test_window_of_an_infinite_dataset_is_lazy():
    assert windows(D.range(5).repeat().window(2, 3).take(3)) == [[0, 1], [3, 4], [1, 2]]


def test_window_of_matrices_keeps_their_spec():
    ds = D.from_tensor_slices(np.arange(12.0).reshape(6, 2)).window(4, drop_remainder=True)
    (window,) = list(ds)
    assert window.element_spec == TS((2,), np.float64)
    assert as_lists(window.batch(4)) == [[[0, 1], [2, 3], [4, 5], [6, 7]]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 0}, "window size must be greater than zero"),
        ({"size": -1}, "window size must be greater than zero"),
        ({"size": 2, "shift": 0}, "window shift must be greater than zero"),
        ({"size": 2, "shift": -1}, "window shift must be greater than zero"),
        ({"size": 2, "stride": 0}, "window stride must be greater than zero"),
    ],
    ids=["size0", "size-1", "shift0", "shift-1", "stride0"],
)
def test_window_arguments_must_be_positive(kwargs, match):
    # observed in TensorFlow 2.21: InvalidArgumentError when the dataset is made
    with pytest.raises(td.errors.InvalidArgumentError, match=match):
        D.range(7).window(**kwargs)


def test_window_size_must_be_an_integer():
    # observed in TensorFlow 2.21: TypeError "Cannot convert 2.5 to EagerTensor of dtype int64"
    with pytest.raises(TypeError, match="integer size"):
        D.range(7).window(2.5)


def test_window_passes_an_upstream_error_through():
    def boom(x):
        if int(x) == 4:
            raise KeyError("bad element")
        return x

    iterator = iter(D.range(7).map(boom).window(2))
    assert windows_of(next(iterator)) == [0, 1]
    assert windows_of(next(iterator)) == [2, 3]
    with pytest.raises(KeyError, match="bad element"):
        next(iterator)


def reference_windows(n: int, size: int, shift: int, stride: int, drop: bool) -> list[list[int]]:
    """TensorFlow's documented rule: window i holds i*shift + j*stride (j < size) that are < n."""
    out = []
    start = 0
    while start < n:
        window = [start + j * stride for j in range(size) if start + j * stride < n]
        if drop and len(window) < size:
            break
        out.append(window)
        start += shift
    return out


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 30),
    size=st.integers(1, 6),
    shift=st.integers(1, 7),
    stride=st.integers(1, 4),
    drop=st.booleans(),
)
def test_windows_equal_the_reference_model(n, size, shift, stride, drop):
    ds = D.range(n).window(size, shift, stride, drop)
    expected = reference_windows(n, size, shift, stride, drop)
    assert windows(ds) == expected
    assert ds.cardinality() == len(expected)


# --- group_by_window ------------------------------------------------------------------------------


def test_group_by_window_full_windows_come_when_full():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices(np.array([2, 1, 0, 2, 1, 0], np.int64))
    grouped = ds.group_by_window(lambda x: x, lambda k, w: w.batch(2), window_size=2)
    assert as_lists(grouped) == [[2, 2], [1, 1], [0, 0]]


def test_group_by_window_flushes_open_windows_in_ascending_key_order():
    # observed in TensorFlow 2.21 (keys [2,1,0,2,1,0], window 4 -> [[0,0],[1,1],[2,2]])
    ds = D.from_tensor_slices(np.array([2, 1, 0, 2, 1, 0], np.int64))
    grouped = ds.group_by_window(lambda x: x, lambda k, w: w.batch(4), window_size=4)
    assert as_lists(grouped) == [[0, 0], [1, 1], [2, 2]]


def test_group_by_window_modulo_example():
    # observed in TensorFlow 2.21
    grouped = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(2), window_size=2)
    assert as_lists(grouped) == [[0, 3], [1, 4], [2, 5], [6, 9], [7], [8]]
    assert grouped.element_spec == TS((None,), np.int64)
    assert grouped.cardinality() == UNK


def test_group_by_window_orders_negative_keys_ascending():
    # observed in TensorFlow 2.21: the open windows of keys -1 ([7]) and -2 ([8]) come as [8], [7]
    grouped = D.range(10).group_by_window(lambda x: -(x % 3), lambda k, w: w.batch(10), window_size=2)
    assert as_lists(grouped) == [[0, 3], [1, 4], [2, 5], [6, 9], [8], [7]]


def test_group_by_window_with_window_size_func():
    # observed in TensorFlow 2.21
    grouped = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(10), window_size_func=lambda k: k + 1)
    assert as_lists(grouped) == [[0], [3], [1, 4], [6], [2, 5, 8], [9], [7]]


def test_group_by_window_reduce_func_gets_the_key_and_may_return_the_window():
    # observed in TensorFlow 2.21
    same = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w, window_size=3)
    assert as_lists(same) == [0, 3, 6, 1, 4, 7, 2, 5, 8, 9]
    shifted = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.map(lambda v: v + k), window_size=3)
    assert as_lists(shifted) == [0, 3, 6, 2, 5, 8, 4, 7, 10, 9]


def test_group_by_window_python_int_keys_convert_to_int64():
    # observed in TensorFlow 2.21: lambda x: 0 works
    grouped = D.range(4).group_by_window(lambda x: 0, lambda k, w: w.batch(4), window_size=2)
    assert as_lists(grouped) == [[0, 1], [2, 3]]


def test_group_by_window_tuple_elements_are_separate_key_arguments():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices((np.array([1, 2, 3, 4], np.int64), np.array([1.0, 2.0, 3.0, 4.0], np.float32)))
    grouped = ds.group_by_window(lambda x, y: x % 2, lambda k, w: w.batch(2), window_size=2)
    assert [(a.tolist(), b.tolist()) for a, b in grouped] == [([1, 3], [1.0, 3.0]), ([2, 4], [2.0, 4.0])]
    assert grouped.element_spec == (TS((None,), np.int64), TS((None,), np.float32))


def test_group_by_window_spec_follows_reduce_func():
    # observed in TensorFlow 2.21: batch(3, drop_remainder=True) gives (3,)
    grouped = D.range(10).group_by_window(lambda x: x % 2, lambda k, w: w.batch(3, drop_remainder=True), window_size=3)
    assert grouped.element_spec == TS((3,), np.int64)
    assert as_lists(grouped) == [[0, 2, 4], [1, 3, 5]]


def test_group_by_window_of_an_infinite_dataset_is_infinite():
    # observed in TensorFlow 2.21
    grouped = D.range(10).repeat().group_by_window(lambda x: x % 2, lambda k, w: w.batch(10), window_size=2)
    assert grouped.cardinality() == INF
    assert as_lists(grouped.take(3)) == [[0, 2], [1, 3], [4, 6]]


def test_group_by_window_of_an_empty_dataset_is_empty():
    # observed in TensorFlow 2.21
    assert list(D.range(0).group_by_window(lambda x: x % 2, lambda k, w: w.batch(10), window_size=2)) == []


@pytest.mark.parametrize("kwargs", [{}, {"window_size": 2, "window_size_func": lambda k: 2}], ids=["neither", "both"])
def test_group_by_window_takes_exactly_one_window_size(kwargs):
    # observed in TensorFlow 2.21: ValueError for both and for neither
    with pytest.raises(ValueError, match=r"group_by_window\(\) takes exactly one of window_size and window_size_func"):
        D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(2), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "got"),
    [({"window_size": 0}, 0), ({"window_size": -1}, -1), ({"window_size_func": lambda k: k}, 0)],
    ids=["zero", "negative", "func-zero"],
)
def test_group_by_window_size_must_be_positive_when_used(kwargs, got):
    # observed in TensorFlow 2.21: InvalidArgumentError while iterating
    ds = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(10), **kwargs)
    with pytest.raises(td.errors.InvalidArgumentError, match=f"window size must be greater than zero, but got {got}"):
        list(ds)


def test_group_by_window_int32_key_is_a_value_error():
    # observed in TensorFlow 2.21: "Tensor conversion requested dtype int64 for Tensor with dtype int32"
    ds = D.range(10).group_by_window(lambda x: (x % 3).astype(np.int32), lambda k, w: w.batch(2), window_size=2)
    with pytest.raises(ValueError, match=r"key_func must return a single int64 scalar.*int32"):
        list(ds)


def test_group_by_window_vector_key_is_a_value_error():
    # observed in TensorFlow 2.21: "`key_func` must return a single `tf.int64` scalar tensor"
    ds = D.range(10).group_by_window(lambda x: np.stack([x, x]), lambda k, w: w.batch(2), window_size=2)
    with pytest.raises(ValueError, match=r"int64 of shape \(2,\)"):
        list(ds)


def test_group_by_window_int32_window_size_func_is_a_value_error():
    # observed in TensorFlow 2.21
    ds = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(10), window_size_func=lambda k: np.int32(2))
    with pytest.raises(ValueError, match="window_size_func must return a single int64 scalar"):
        list(ds)


def test_group_by_window_reduce_func_must_return_a_dataset():
    # observed in TensorFlow 2.21: TypeError ("`reduce_func` must return a single `tf.data.Dataset` object")
    ds = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: k, window_size=3)
    with pytest.raises(TypeError, match=r"reduce_func must return a single td.data.Dataset.*int64"):
        list(ds)


def test_group_by_window_float_window_size_is_a_type_error():
    # observed in TensorFlow 2.21: TypeError "Expected int64, but got 2.0 of type 'float'"
    with pytest.raises(TypeError, match="integer window_size"):
        D.range(4).group_by_window(lambda x: x % 2, lambda k, w: w.batch(4), window_size=2.0)


def test_group_by_window_error_in_key_func_comes_out_after_earlier_windows():
    def key(x):
        if int(x) == 5:
            raise KeyError("no key for 5")
        return x % 2

    iterator = iter(D.range(10).group_by_window(key, lambda k, w: w.batch(3), window_size=3))
    assert next(iterator).tolist() == [0, 2, 4]
    with pytest.raises(KeyError, match="no key for 5"):
        next(iterator)


def test_experimental_group_by_window_applies_the_same_transformation():
    # observed in TensorFlow 2.21
    transformation = td.data.experimental.group_by_window(
        lambda x: x % 2, lambda k, w: w.batch(3, drop_remainder=True), window_size=3
    )
    assert as_lists(D.range(10).apply(transformation)) == [[0, 2, 4], [1, 3, 5]]


def test_experimental_group_by_window_checks_its_arguments_at_once():
    with pytest.raises(ValueError, match="exactly one of window_size"):
        td.data.experimental.group_by_window(lambda x: x, lambda k, w: w)


# --- bucket_by_sequence_length --------------------------------------------------------------------

ELEMENTS = [[0], [1, 2, 3, 4], [5, 6, 7], [7, 8, 9, 10, 11], [13, 14, 15, 16, 19, 20], [21, 22]]


def sequences() -> D:
    """TensorFlow's documented example input (int64 vectors of lengths 1, 4, 3, 5, 6, 2)."""
    return D.from_generator(lambda: iter(ELEMENTS), output_signature=TS((None,), np.int64))


def length(element):
    return np.int32(element.shape[0])


def test_bucket_by_sequence_length_example():
    # observed in TensorFlow 2.21
    ds = sequences().bucket_by_sequence_length(length, [3, 5], [2, 2, 2])
    assert as_lists(ds) == [
        [[1, 2, 3, 4], [5, 6, 7, 0]],
        [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]],
        [[0, 0], [21, 22]],
    ]
    assert ds.element_spec == TS((None, None), np.int64)
    assert ds.cardinality() == UNK


def test_bucket_by_sequence_length_pad_to_bucket_boundary():
    # observed in TensorFlow 2.21
    ds = sequences().bucket_by_sequence_length(
        length, [4, 7], [2, 2, 2], pad_to_bucket_boundary=True, padding_values=np.int64(-1)
    )
    assert as_lists(ds) == [
        [[0, -1, -1], [5, 6, 7]],
        [[1, 2, 3, 4, -1, -1], [7, 8, 9, 10, 11, -1]],
        [[21, 22, -1]],
        [[13, 14, 15, 16, 19, 20]],
    ]


def test_bucket_by_sequence_length_beyond_the_last_boundary_is_an_internal_error():
    # observed in TensorFlow 2.21: the batches before it, then InternalError ("elements must have
    # length < max(bucket_boundaries)") when the last bucket is batched
    ds = sequences().bucket_by_sequence_length(length, [4, 6], [2, 2, 2], pad_to_bucket_boundary=True)
    iterator = iter(ds)
    assert [next(iterator).tolist() for _ in range(3)] == [
        [[0, 0, 0], [5, 6, 7]],
        [[1, 2, 3, 4, 0], [7, 8, 9, 10, 11]],
        [[21, 22, 0]],
    ]
    with pytest.raises(td.errors.InternalError, match=r"pad_to_bucket_boundary=True needs every element length <"):
        next(iterator)


def test_bucket_by_sequence_length_pad_to_bucket_boundary_without_boundaries_is_an_internal_error():
    # observed in TensorFlow 2.21: InternalError ("elements must have length < max(bucket_boundaries)")
    ds = D.range(3).map(lambda x: np.full(int(x), x))
    ds = ds.bucket_by_sequence_length(lambda e: np.int32(e.shape[0]), [], [2], pad_to_bucket_boundary=True)
    with pytest.raises(td.errors.InternalError, match=r"pad_to_bucket_boundary=True needs bucket boundaries") as info:
        list(ds)
    assert "None" not in str(info.value)


def test_bucket_by_sequence_length_batches_scalar_strings_into_object_arrays_of_bytes():
    # observed in TensorFlow 2.21: [array([b'bc', b'def'], dtype=object), array([b'a'], dtype=object)]
    ds = D.from_tensor_slices([b"a", b"bc", b"def"]).bucket_by_sequence_length(lambda s: np.int32(len(s)), [2], [2, 2])
    batches = list(ds)
    assert [batch.tolist() for batch in batches] == [[b"bc", b"def"], [b"a"]]
    assert all(type(item) is bytes for batch in batches for item in batch)
    assert ds.element_spec == TS((None,), object)


def test_bucket_by_sequence_length_batches_scalar_numbers_into_vectors():
    # observed in TensorFlow 2.21: [array([0, 1]), array([2, 3]), array([4])], spec (None,) int64
    ds = D.range(5).bucket_by_sequence_length(lambda x: np.int32(x), [2], [2, 2])
    assert as_lists(ds) == [[0, 1], [2, 3], [4]]
    assert ds.element_spec == TS((None,), np.int64)


def test_bucket_by_sequence_length_int64_length_is_a_type_error():
    # observed in TensorFlow 2.21: "Input 'y' of 'LessEqual' Op has type int64 that does not match type int32"
    ds = sequences().bucket_by_sequence_length(lambda e: np.int64(e.shape[0]), [3, 5], [2, 2, 2])
    with pytest.raises(TypeError, match="must return an int32 length"):
        list(ds)


def test_bucket_by_sequence_length_float_length_is_a_type_error():
    # observed in TensorFlow 2.21
    ds = sequences().bucket_by_sequence_length(lambda e: np.float32(e.shape[0]), [3, 5], [2, 2, 2])
    with pytest.raises(TypeError, match="float32"):
        list(ds)


def test_bucket_by_sequence_length_python_int_length_is_int32():
    # observed in TensorFlow 2.21: lambda e: -1 puts everything in the first bucket
    ds = sequences().bucket_by_sequence_length(lambda e: -1, [3, 5], [2, 2, 2])
    assert as_lists(ds)[0] == [[0, 0, 0, 0], [1, 2, 3, 4]]


def test_bucket_by_sequence_length_drop_remainder():
    # observed in TensorFlow 2.21: the bucket of size 3 never fills and is dropped; spec keeps batch None
    ds = sequences().bucket_by_sequence_length(length, [3, 5], [2, 2, 3], drop_remainder=True)
    assert as_lists(ds) == [[[1, 2, 3, 4], [5, 6, 7, 0]], [[0, 0], [21, 22]]]
    assert ds.element_spec == TS((None, None), np.int64)
    assert list(sequences().bucket_by_sequence_length(length, [3, 5], [4, 4, 4], drop_remainder=True)) == []


def test_bucket_by_sequence_length_no_padding_batches_like_batch():
    # observed in TensorFlow 2.21: unequal lengths fail as batch() does
    ds = sequences().bucket_by_sequence_length(length, [3, 5], [2, 2, 2], no_padding=True)
    with pytest.raises(
        td.errors.InvalidArgumentError, match=r"First element had shape \[4\] and element 1 had shape \[3\]"
    ):
        list(ds)
    fixed = D.from_tensor_slices(np.arange(12).reshape(6, 2)).bucket_by_sequence_length(
        lambda e: 2, [3, 5], [2, 2, 2], no_padding=True
    )
    assert as_lists(fixed) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert fixed.element_spec == TS((None, 2), np.int64)


def test_bucket_by_sequence_length_unsorted_boundaries_follow_tensorflows_rule():
    # observed in TensorFlow 2.21: the first bucket i with lower[i] <= length < upper[i]
    ds = sequences().bucket_by_sequence_length(length, [5, 3], [2, 2, 2])
    assert as_lists(ds) == [
        [[0, 0, 0, 0], [1, 2, 3, 4]],
        [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]],
        [[5, 6, 7], [21, 22, 0]],
    ]


def test_bucket_by_sequence_length_padded_shapes():
    # observed in TensorFlow 2.21
    ds = sequences().bucket_by_sequence_length(length, [3, 5], [2, 2, 2], padded_shapes=[8])
    assert ds.element_spec == TS((None, 8), np.int64)
    assert as_lists(ds)[0] == [[1, 2, 3, 4, 0, 0, 0, 0], [5, 6, 7, 0, 0, 0, 0, 0]]
    too_small = sequences().bucket_by_sequence_length(length, [3, 5], [2, 2, 2], padded_shapes=[5])
    with pytest.raises(td.errors.DataLossError, match="smaller size than the input element"):
        list(too_small)


def test_bucket_by_sequence_length_fixed_dimensions_are_not_padded_to_the_boundary():
    # observed in TensorFlow 2.21: pad_to_bucket_boundary fills only unknown dimensions
    fixed = D.from_tensor_slices(np.arange(12).reshape(6, 2))
    ds = fixed.bucket_by_sequence_length(lambda e: 4, [3, 5], [2, 2, 2], pad_to_bucket_boundary=True)
    assert as_lists(ds) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert ds.element_spec == TS((None, 2), np.int64)


def test_bucket_by_sequence_length_dict_elements_with_padding_values():
    # observed in TensorFlow 2.21
    ds = sequences().map(lambda e: {"tok": e, "len": np.int32(e.shape[0])})
    bucketed = ds.bucket_by_sequence_length(
        lambda d: d["len"], [3, 5], [2, 2, 2], padding_values={"tok": np.int64(-1), "len": np.int32(0)}
    )
    first = next(iter(bucketed))
    assert first["tok"].tolist() == [[1, 2, 3, 4], [5, 6, 7, -1]]
    assert first["len"].tolist() == [4, 3]


def test_bucket_by_sequence_length_tuple_elements_are_separate_arguments():
    # observed in TensorFlow 2.21
    ds = sequences().map(lambda e: (e, np.int32(e.shape[0])))
    tokens, lengths = next(iter(ds.bucket_by_sequence_length(lambda e, n: n, [3, 5], [2, 2, 2])))
    assert tokens.tolist() == [[1, 2, 3, 4], [5, 6, 7, 0]]
    assert lengths.tolist() == [4, 3]


def test_bucket_by_sequence_length_python_int_padding_value_on_int64_is_a_type_error():
    # observed in TensorFlow 2.21: TypeError when the dataset is made
    with pytest.raises(TypeError, match="padding_values must have the dtype"):
        sequences().bucket_by_sequence_length(length, [4, 7], [2, 2, 2], padding_values=-1)


def test_bucket_by_sequence_length_needs_one_more_batch_size_than_boundaries():
    # observed in TensorFlow 2.21: "`len(bucket_batch_sizes)` must equal `len(bucket_boundaries) + 1`"
    with pytest.raises(ValueError, match=r"len\(bucket_batch_sizes\)=2 and len\(bucket_boundaries\)=2"):
        sequences().bucket_by_sequence_length(length, [3, 5], [2, 2])


def test_bucket_by_sequence_length_zero_batch_size_fails_when_its_bucket_is_used():
    # observed in TensorFlow 2.21: "Window size must be greater than zero, but got 0."
    ds = sequences().bucket_by_sequence_length(length, [3, 5], [2, 0, 2])
    with pytest.raises(td.errors.InvalidArgumentError, match="window size must be greater than zero, but got 0"):
        list(ds)


def test_bucket_by_sequence_length_scalars_are_batched():
    # observed in TensorFlow 2.21
    ds = D.range(5).bucket_by_sequence_length(lambda e: 4, [3, 5], [2, 2, 2], pad_to_bucket_boundary=True)
    assert as_lists(ds) == [[0, 1], [2, 3], [4]]
    assert ds.element_spec == TS((None,), np.int64)


def test_experimental_bucket_by_sequence_length_with_apply():
    # observed in TensorFlow 2.21
    transformation = td.data.experimental.bucket_by_sequence_length(length, [3, 5], [2, 2, 2])
    assert as_lists(sequences().apply(transformation))[2] == [[0, 0], [21, 22]]
    with pytest.raises(ValueError, match="one more batch size than boundaries"):
        td.data.experimental.bucket_by_sequence_length(length, [3], [2, 2, 2])


# --- distribution ----------------------------------------------------------------------------------


def _steps(strategy, dist) -> list:
    return [[np.asarray(p).tolist() for p in strategy.experimental_local_results(step)] for step in dist]


def test_distribute_dataset_of_windows_batched_by_flat_map(mirrored_strategy):
    ds = D.range(7).window(4, 3).flat_map(lambda w: w.batch(4))
    assert _steps(mirrored_strategy, mirrored_strategy.experimental_distribute_dataset(ds)) == [
        [[0, 1], [2, 3]],
        [[3, 4], [5, 6]],
        [[6], []],
    ]


def test_distribute_dataset_of_grouped_windows(mirrored_strategy):
    ds = D.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(3), window_size=3)
    assert _steps(mirrored_strategy, mirrored_strategy.experimental_distribute_dataset(ds)) == [
        [[0, 3], [6]],
        [[1, 4], [7]],
        [[2, 5], [8]],
        [[9], []],
    ]


def test_distribute_dataset_of_buckets(mirrored_strategy):
    ds = sequences().bucket_by_sequence_length(length, [3, 5], [2, 2, 2])
    assert _steps(mirrored_strategy, mirrored_strategy.experimental_distribute_dataset(ds)) == [
        [[[1, 2, 3, 4]], [[5, 6, 7, 0]]],
        [[[7, 8, 9, 10, 11, 0]], [[13, 14, 15, 16, 19, 20]]],
        [[[0, 0]], [[21, 22]]],
    ]


def test_distribute_datasets_from_function_with_buckets(mirrored_strategy):
    def dataset_fn(ctx):
        return sequences().bucket_by_sequence_length(length, [3, 5], [2, 2, 2])

    steps = _steps(mirrored_strategy, mirrored_strategy.distribute_datasets_from_function(dataset_fn))
    # replica 0 takes batch 0, replica 1 batch 1; the batch size is unknown, so the last step is
    # kept and the second replica gets an empty batch
    assert steps[0] == [[[1, 2, 3, 4], [5, 6, 7, 0]], [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]]]
    assert steps[1][0] == [[0, 0], [21, 22]]
    assert len(steps) == 2
