"""``Dataset.padded_batch``: padding rules, element specs, cardinality, errors, distribution.

Expected values were observed in TensorFlow 2.21 (``tf.data.Dataset.padded_batch``) unless a
test says otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td

D = td.data.Dataset
TS = td.TensorSpec
UNK = td.data.UNKNOWN_CARDINALITY

pytestmark = pytest.mark.timeout(60)


def filled(n: int = 4) -> D:
    """``[1], [2, 2], [3, 3, 3], ...`` (int64), the example of TensorFlow's documentation."""
    return D.range(1, n + 1).map(lambda x: np.full(int(x), x))


def as_lists(dataset: D) -> list:
    return [np.asarray(batch).tolist() for batch in dataset]


# --- TensorFlow's documented examples -------------------------------------------------------------


def test_pads_each_batch_to_its_longest_element():
    # observed in TensorFlow 2.21
    ds = filled().padded_batch(2)
    assert as_lists(ds) == [[[1, 0], [2, 2]], [[3, 3, 3, 0], [4, 4, 4, 4]]]
    assert ds.element_spec == TS((None, None), np.int64)


def test_pads_to_a_fixed_padded_shape():
    # observed in TensorFlow 2.21: padded_shapes=5 means [5]
    ds = filled().padded_batch(2, padded_shapes=5)
    assert as_lists(ds) == [[[1, 0, 0, 0, 0], [2, 2, 0, 0, 0]], [[3, 3, 3, 0, 0], [4, 4, 4, 4, 0]]]
    assert ds.element_spec == TS((None, 5), np.int64)


def test_pads_with_a_padding_value_of_the_components_dtype():
    # observed in TensorFlow 2.21
    ds = filled().padded_batch(2, padded_shapes=(5,), padding_values=np.int64(-1))
    assert as_lists(ds)[0] == [[1, -1, -1, -1, -1], [2, 2, -1, -1, -1]]


def test_python_float_padding_value_works_on_float32():
    # observed in TensorFlow 2.21: -1.0 is a float32 constant
    ds = filled().map(lambda x: x.astype(np.float32)).padded_batch(2, padding_values=-1.0)
    batches = list(ds)
    assert batches[0].dtype == np.float32
    assert batches[0].tolist() == [[1.0, -1.0], [2.0, 2.0]]


def test_python_int_padding_value_on_int64_is_a_type_error():
    # observed in TensorFlow 2.21: a Python int is int32 ("values type int32 does not match type int64")
    with pytest.raises(TypeError, match=r"padded_batch\(\) padding_values must have the dtype.*int32.*int64"):
        list(filled().padded_batch(2, padding_values=0))


def test_python_int_padding_value_on_int64_fails_when_made_if_the_spec_is_static():
    ds = D.from_tensor_slices(np.arange(4, dtype=np.int64).reshape(2, 2))
    with pytest.raises(TypeError, match="np.int64"):
        ds.padded_batch(2, padding_values=0)


def test_int32_padding_value_works_on_int32():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices(np.array([1, 2], np.int32)).map(lambda x: np.full(int(x), x))
    assert as_lists(ds.padded_batch(2, padding_values=np.int32(7))) == [[[1, 7], [2, 2]]]


@pytest.mark.parametrize("value", [7.0, "a"], ids=["float", "string"])
def test_padding_value_of_another_type_is_a_type_error(value):
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices(np.array([1, 2], np.int32)).map(lambda x: np.full(int(x), x))
    with pytest.raises(TypeError, match="padding_values must have the dtype"):
        list(ds.padded_batch(2, padding_values=value))


def test_non_scalar_padding_value_is_a_value_error():
    # observed in TensorFlow 2.21: "padding_values values should be scalars, but got (2,)"
    with pytest.raises(ValueError, match=r"must be scalars.*\(2,\)"):
        list(filled().padded_batch(2, padding_values=np.array([0, 0], np.int64)))


# --- strings, booleans, structures ------------------------------------------------------------------


def test_strings_pad_with_empty_bytes():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices([b"a", b"bb"]).map(lambda s: np.array([s[i : i + 1] for i in range(len(s))], object))
    batches = list(ds.padded_batch(2))
    assert batches[0].tolist() == [[b"a", b""], [b"b", b"b"]]
    assert ds.padded_batch(2).element_spec == TS((None, None), object)


@pytest.mark.parametrize("value", ["x", b"x"])
def test_strings_pad_with_a_given_string(value):
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices([b"ab", b"c"]).map(lambda s: np.array([s[i : i + 1] for i in range(len(s))], object))
    assert as_lists(ds.padded_batch(2, padding_values=value)) == [[[b"a", b"b"], [b"c", b"x"]]]


def test_scalar_strings_batch_into_an_object_array_of_bytes():
    # observed in TensorFlow 2.21: [array([b'a', b'bc'], dtype=object), array([b'd'], dtype=object)]
    batches = list(D.from_tensor_slices([b"a", b"bc", b"d"]).padded_batch(2))
    assert [batch.tolist() for batch in batches] == [[b"a", b"bc"], [b"d"]]
    assert all(type(item) is bytes for batch in batches for item in batch)


def test_scalar_floats_batch_into_a_float32_vector():
    # observed in TensorFlow 2.21: [array([1.5, 2.5], dtype=float32)]
    (batch,) = list(D.from_tensor_slices([1.5, 2.5]).padded_batch(2))
    assert batch.dtype == np.float32
    assert batch.tolist() == [1.5, 2.5]


def test_booleans_pad_with_false():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices([True, False]).map(lambda b: np.full(2, b))
    assert as_lists(ds.padded_batch(2, padded_shapes=[3])) == [[[True, True, False], [False, False, False]]]


def test_dict_elements_with_a_scalar_component_and_drop_remainder():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices({"a": [1, 2, 3]}).map(lambda d: {"a": np.full(int(d["a"]), d["a"]), "b": d["a"]})
    padded = ds.padded_batch(2, drop_remainder=True)
    assert padded.element_spec == {"a": TS((2, None), np.int32), "b": TS((2,), np.int32)}
    (batch,) = list(padded)
    assert batch["a"].tolist() == [[1, 0], [2, 2]]
    assert batch["b"].tolist() == [1, 2]


def test_tuple_elements_take_padding_values_per_component_with_none_as_default():
    # observed in TensorFlow 2.21
    ints = D.from_tensor_slices(np.array([1, 2, 3, 4], np.int32)).map(lambda x: np.full(int(x), x))
    ds = D.zip((ints, ints.map(lambda x: x.astype(np.float32))))
    padded = ds.padded_batch(2, padding_values=(np.int32(-1), None))
    first = next(iter(padded))
    assert first[0].tolist() == [[1, -1], [2, 2]]
    assert first[1].tolist() == [[1.0, 0.0], [2.0, 2.0]]
    assert padded.element_spec == (TS((None, None), np.int32), TS((None, None), np.float32))


def test_mixed_fixed_and_unknown_padded_dimensions():
    # observed in TensorFlow 2.21
    ds = D.range(1, 4).map(lambda x: np.zeros((int(x), 4 - int(x))) + float(x))
    padded = ds.padded_batch(3, padded_shapes=[None, 4], drop_remainder=True)
    (batch,) = list(padded)
    assert batch.shape == (3, 3, 4)
    assert batch[0].tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert batch[2].tolist() == [[3, 0, 0, 0], [3, 0, 0, 0], [3, 0, 0, 0]]
    assert padded.element_spec == TS((3, None, 4), np.float64)


def test_default_padding_of_matrices_pads_every_dimension_to_the_batch_maximum():
    # observed in TensorFlow 2.21
    ds = D.range(1, 4).map(lambda x: np.zeros((int(x), 4 - int(x))) + float(x))
    batches = list(ds.padded_batch(2))
    assert batches[0].tolist() == [[[1, 1, 1], [0, 0, 0]], [[2, 2, 0], [2, 2, 0]]]
    assert batches[1].tolist() == [[[3], [3], [3]]]


def test_scalars_batch_like_batch():
    # observed in TensorFlow 2.21
    ds = D.range(3).padded_batch(2)
    assert as_lists(ds) == [[0, 1], [2]]
    assert ds.element_spec == TS((None,), np.int64)


def test_known_dimensions_stay_in_the_spec_by_default_and_follow_padded_shapes():
    # observed in TensorFlow 2.21
    ds = D.from_tensor_slices(np.ones((3, 2)))
    assert ds.padded_batch(2).element_spec == TS((None, 2), np.float64)
    assert ds.padded_batch(2, padded_shapes=[3]).element_spec == TS((None, 3), np.float64)
    assert as_lists(ds.padded_batch(2, padded_shapes=[3])) == [[[1, 1, 0], [1, 1, 0]], [[1, 1, 0]]]
    assert ds.padded_batch(2, padded_shapes=[None]).element_spec == TS((None, None), np.float64)
    assert ds.padded_batch(2, padded_shapes=[-1]).element_spec == TS((None, None), np.float64)


def test_spec_learnt_by_running_the_pipeline_leaves_padded_dimensions_unknown():
    # map's spec is learnt from its first element ([1]); the padded sizes vary, so they are None.
    assert filled().padded_batch(2, drop_remainder=True).element_spec == TS((2, None), np.int64)


# --- cardinality and empty inputs ---------------------------------------------------------------------


@pytest.mark.parametrize(("n", "drop", "expected"), [(4, False, 2), (5, False, 3), (5, True, 2), (1, True, 0)])
def test_cardinality_is_that_of_batch(n, drop, expected):
    ds = D.from_tensor_slices(np.ones((n, 2))).padded_batch(2, drop_remainder=drop)
    assert ds.cardinality() == expected
    assert len(list(ds)) == expected


def test_empty_input_gives_no_batches():
    # observed in TensorFlow 2.21: spec (None, None), cardinality 0
    ds = D.from_generator(lambda: iter([]), output_signature=TS((None,), np.int64)).padded_batch(2)
    assert list(ds) == []
    assert ds.element_spec == TS((None, None), np.int64)
    assert D.from_tensor_slices(np.zeros((0, 3))).padded_batch(2).cardinality() == 0


def test_unknown_cardinality_stays_unknown():
    assert filled().filter(lambda x: True).padded_batch(2).cardinality() == UNK


# --- errors -----------------------------------------------------------------------------------------


def test_padded_shape_smaller_than_an_element_is_data_loss_after_the_batches_before_it():
    # observed in TensorFlow 2.21: the first batch fits, the second raises DataLossError
    iterator = iter(filled().padded_batch(2, padded_shapes=[2]))
    assert next(iterator).tolist() == [[1, 0], [2, 2]]
    with pytest.raises(td.errors.DataLossError, match=r"smaller size than the input element.*\(3,\)"):
        next(iterator)


@pytest.mark.parametrize("size", [0, -1])
def test_batch_size_must_be_positive(size):
    # observed in TensorFlow 2.21: InvalidArgumentError when the dataset is made
    with pytest.raises(td.errors.InvalidArgumentError, match=r"padded_batch\(\) batch size must be greater than zero"):
        filled().padded_batch(size)


def test_batch_size_must_be_an_integer():
    with pytest.raises(TypeError, match="integer batch_size"):
        filled().padded_batch(2.0)


@pytest.mark.parametrize(
    ("padded_shapes", "error", "match"),
    [
        ((5, 6), ValueError, r"padded shape \(5, 6\) is not compatible with the shape \(2,\)"),
        ([], ValueError, r"padded shape \(\) is not compatible"),
        ([1], ValueError, r"padded shape \(1,\) is not compatible with the shape \(2,\)"),
        ([3.5], TypeError, "int64 vector"),
        ([-2], ValueError, "must be >= 0"),
        ({"a": [3]}, ValueError, "must be a shape"),
    ],
    ids=["rank", "scalar-shape", "smaller-than-known", "float", "negative", "dict"],
)
def test_bad_padded_shapes(padded_shapes, error, match):
    # observed in TensorFlow 2.21 (types; the dict case: ValueError "Attempt to convert a value ({'a': [3]})")
    with pytest.raises(error, match=match):
        D.from_tensor_slices(np.ones((3, 2))).padded_batch(2, padded_shapes=padded_shapes)


def test_padded_shapes_for_scalars_must_be_empty():
    # observed in TensorFlow 2.21: "The padded shape (2,) is not compatible with the shape ()"
    with pytest.raises(ValueError, match=r"padded shape \(2,\) is not compatible with the shape \(\)"):
        D.range(3).padded_batch(2, padded_shapes=[2])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"padding_values": 0}, TypeError),
        ({"padded_shapes": 5}, TypeError),
        ({"padded_shapes": [5]}, TypeError),
        ({"padding_values": (np.int32(1),)}, ValueError),
    ],
    ids=["scalar-value", "scalar-shape", "list-shape", "short-tuple"],
)
def test_structures_must_match_the_elements(kwargs, error):
    # observed in TensorFlow 2.21: a leaf for a tuple is a TypeError ("If shallow structure is a
    # sequence, input must also be a sequence"), a tuple of another length a ValueError
    ints = D.from_tensor_slices(np.ones((2, 2), np.int32))
    with pytest.raises(error, match="must have the structure of the dataset's elements"):
        D.zip((ints, ints)).padded_batch(2, **kwargs)


def test_unknown_rank_needs_padded_shapes():
    # observed in TensorFlow 2.21: "You must provide `padded_shapes` argument because component 0 has unknown rank."
    ds = D.from_generator(lambda: iter([np.ones(2), np.ones(3)]), output_types=np.float64)
    with pytest.raises(ValueError, match="needs padded_shapes: component 0 has an unknown rank"):
        ds.padded_batch(2)
    padded = ds.padded_batch(2, padded_shapes=[4])
    assert as_lists(padded) == [[[1, 1, 0, 0], [1, 1, 1, 0]]]
    assert padded.element_spec == TS((None, 4), np.float64)
    assert padded.cardinality() == UNK


def test_elements_of_different_ranks_are_refused():
    ds = D.from_generator(lambda: iter([np.ones(2), np.ones((2, 2))]), output_types=np.float64)
    with pytest.raises(td.errors.InvalidArgumentError, match="component 0 must have rank 1"):
        list(ds.padded_batch(2, padded_shapes=[None]))


def test_an_error_in_an_upstream_function_comes_out_with_its_type():
    def boom(x):
        if int(x) == 3:
            raise KeyError("bad element")
        return np.full(int(x), x)

    iterator = iter(D.range(1, 5).map(boom).padded_batch(2))
    assert next(iterator).tolist() == [[1, 0], [2, 2]]
    with pytest.raises(KeyError, match="bad element"):
        next(iterator)


# --- what numpy cannot represent ---------------------------------------------------------------------


def _ragged_rows() -> np.ndarray:
    rows = np.empty(2, dtype=object)
    rows[0], rows[1] = np.ones(2), np.ones(3)
    return rows


def test_ragged_stand_in_rows_are_refused_with_a_clear_error():
    # TensorFlow: "`padded_batch` is only supported for datasets that produce tensor elements"
    # for RaggedTensorSpec/SparseTensorSpec; numpy's stand-in is an object array of arrays.
    with pytest.raises(TypeError, match="numpy has no ragged or sparse tensors"):
        list(D.from_tensor_slices(_ragged_rows()).padded_batch(2))


def test_ragged_object_array_element_is_refused_with_a_clear_error():
    with pytest.raises(TypeError, match="stand-in for a ragged tensor"):
        list(D.from_tensors(_ragged_rows()).padded_batch(2))


def test_datasets_as_components_are_refused():
    with pytest.raises(TypeError, match="pads dense array components only"):
        D.range(4).window(2).padded_batch(2)


# --- a property: padding is reversible ---------------------------------------------------------------

_shapes = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3)), min_size=1, max_size=9)


@settings(max_examples=60, deadline=None)
@given(shapes=_shapes, batch_size=st.integers(1, 4), drop=st.booleans())
def test_every_element_is_recovered_by_slicing_off_its_padding(shapes, batch_size, drop):
    elements = [np.arange(1, a * b + 1, dtype=np.int64).reshape(a, b) * (i + 1) for i, (a, b) in enumerate(shapes)]
    ds = D.from_generator(lambda: iter(elements), output_signature=TS((None, None), np.int64))
    batches = list(ds.padded_batch(batch_size, drop_remainder=drop))
    expected_count = len(elements) // batch_size if drop else -(-len(elements) // batch_size)
    assert len(batches) == expected_count
    for b, batch in enumerate(batches):
        members = elements[b * batch_size : (b + 1) * batch_size]
        assert batch.shape == (len(members), max(m.shape[0] for m in members), max(m.shape[1] for m in members))
        for row, element in zip(batch, members, strict=True):
            a, c = element.shape
            np.testing.assert_array_equal(row[:a, :c], element)
            # the rest is padding: zeros (the elements' values are all positive)
            assert int(np.count_nonzero(row)) == element.size


# --- distribution ------------------------------------------------------------------------------------


def _per_replica(strategy, value) -> list:
    return [np.asarray(piece).tolist() for piece in strategy.experimental_local_results(value)]


def test_distribute_dataset_splits_padded_global_batches(mirrored_strategy):
    # global batches of 3 then 1 (partial): pieces of ceil(b / 2) rows, padded width kept
    dist = mirrored_strategy.experimental_distribute_dataset(filled().padded_batch(3))
    steps = [_per_replica(mirrored_strategy, step) for step in dist]
    assert steps == [
        [[[1, 0, 0], [2, 2, 0]], [[3, 3, 3]]],
        [[[4, 4, 4, 4]], []],
    ]


def test_distribute_dataset_padded_batch_of_known_size_is_split_evenly(mirrored_strategy):
    ds = filled(8).padded_batch(4, padded_shapes=[8], drop_remainder=True)
    dist = mirrored_strategy.experimental_distribute_dataset(ds)
    steps = [[np.asarray(p).shape for p in mirrored_strategy.experimental_local_results(s)] for s in dist]
    assert steps == [[(2, 8), (2, 8)], [(2, 8), (2, 8)]]


def test_distribute_datasets_from_function_with_padded_batch(mirrored_strategy):
    def dataset_fn(ctx):
        return (
            filled(6)
            .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
            .padded_batch(ctx.get_per_replica_batch_size(4))
        )

    dist = mirrored_strategy.distribute_datasets_from_function(dataset_fn)
    steps = [_per_replica(mirrored_strategy, step) for step in dist]
    # one input pipeline: replica 0 takes batch 0, replica 1 batch 1, ...; the batch size is unknown
    # statically, so the last, incomplete step is kept and the second replica gets an empty batch
    assert steps[0] == [[[1, 0], [2, 2]], [[3, 3, 3, 0], [4, 4, 4, 4]]]
    assert steps[1][0] == [[5, 5, 5, 5, 5, 0], [6, 6, 6, 6, 6, 6]]
    assert len(steps) == 2
