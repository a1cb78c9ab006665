"""Array helpers with TensorFlow's dtype rules, dtype names, ``td.function``, enums and small
option classes (DESIGN section 1; reference 2.4, 2.7, 2.5 for distributed-value conversion).
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td

PerReplica = td.distribute.PerReplica
ReduceOp = td.distribute.ReduceOp
NOT_IN_REPLICA = "It looks like you are using a PerReplica object while not inside a replica context"


def replica_id():
    return td.distribute.get_replica_context().replica_id_in_sync_group


# --- constant -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        (1.5, np.float32),
        ([1.0, 2.0], np.float32),
        ([1.0, 2], np.float32),
        ([], np.float32),
        (3, np.int32),
        ([1, 2, 3], np.int32),
        (-(2**31), np.int32),
        (2**31 - 1, np.int32),
        (2**31, np.int64),
        (2**40, np.int64),
        ([1, 2**40], np.int64),
        (True, np.bool_),
    ],
    ids=repr,
)
def test_constant_of_python_values_follows_tf_dtype_rules(value, dtype):
    result = td.constant(value)
    assert result.dtype == dtype
    np.testing.assert_array_equal(result, np.asarray(value))


@pytest.mark.parametrize(
    "array",
    [np.array([1.0, 2.0]), np.array([1, 2], dtype=np.int64), np.array([1, 2], dtype=np.int8), np.float64(1.5)],
    ids=["float64", "int64", "int8", "np-float64-scalar"],
)
def test_constant_of_numpy_values_keeps_their_dtype(array):
    assert td.constant(array).dtype == array.dtype


def test_constant_copies_a_numpy_array():
    source = np.array([1.0, 2.0, 3.0])
    result = td.constant(source)
    source[0] = 100.0
    np.testing.assert_array_equal(result, [1.0, 2.0, 3.0])


def test_constant_with_dtype():
    assert td.constant(1, dtype=td.float64).dtype == np.float64
    assert td.constant([1.7], dtype=td.float16).dtype == np.float16


def test_constant_broadcasts_a_scalar_to_shape():
    result = td.constant(5, shape=(2, 3))
    np.testing.assert_array_equal(result, np.full((2, 3), 5, dtype=np.int32))
    assert result.dtype == np.int32


def test_constant_broadcast_result_is_writable_and_independent():
    result = td.constant(0.0, shape=[3])
    result[0] = 1.0
    np.testing.assert_array_equal(result, [1.0, 0.0, 0.0])


def test_constant_reshapes_a_list_to_shape():
    np.testing.assert_array_equal(td.constant([1, 2, 3, 4], shape=[2, 2]), np.array([[1, 2], [3, 4]]))


def test_constant_of_a_per_replica_outside_a_replica_raises():
    with pytest.raises(ValueError, match=NOT_IN_REPLICA):
        td.constant(PerReplica([np.array(1.0), np.array(2.0)]))


@pytest.mark.parametrize("value", [None, {"a": 1}, print, [1.0, None]], ids=["None", "dict", "function", "list with None"])
def test_constant_refuses_values_that_are_not_numbers_or_strings(value):
    with pytest.raises(ValueError, match=r"Attempt to convert a value .* with an unsupported type .*: td\.constant\(\)"):
        td.constant(value)


def test_constant_refuses_a_ragged_list():
    with pytest.raises(ValueError, match=r"Can't convert non-rectangular Python sequence to an array: td\.constant\(\)"):
        td.constant([[1, 2], [3]])


def test_constant_of_strings_is_a_string_array():
    np.testing.assert_array_equal(td.constant(["a", "bc"]), np.array(["a", "bc"]))


# --- convert_to_tensor ------------------------------------------------------------------------


def test_convert_to_tensor_returns_an_array_of_the_right_dtype_unchanged():
    array = np.array([1.0, 2.0], dtype=np.float32)
    assert td.convert_to_tensor(array) is array
    assert td.convert_to_tensor(array, dtype=td.float32) is array


def test_convert_to_tensor_casts_to_a_requested_dtype():
    result = td.convert_to_tensor(np.array([1, 2], dtype=np.int32), dtype=td.float32)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, [1.0, 2.0])


@pytest.mark.parametrize(("value", "dtype"), [(2.5, np.float32), (2, np.int32), ([1, 2], np.int32)])
def test_convert_to_tensor_of_python_values_follows_tf_dtype_rules(value, dtype):
    assert td.convert_to_tensor(value).dtype == dtype


def test_convert_to_tensor_uses_dtype_hint_for_python_values():
    assert td.convert_to_tensor(2, dtype_hint=td.float32).dtype == np.float32


def test_convert_to_tensor_of_per_replica_inside_run_is_the_local_component(mirrored_strategy):
    pr = PerReplica([np.array([1.0]), np.array([2.0])])
    result = mirrored_strategy.run(lambda: td.convert_to_tensor(pr))
    assert result.values[0] is pr.values[0]
    assert result.values[1] is pr.values[1]


@pytest.mark.parametrize(
    "helper",
    [
        td.convert_to_tensor,
        td.identity,
        lambda x: td.cast(x, td.float32),
        td.reduce_sum,
        td.reduce_mean,
        lambda x: td.add_n([x]),
    ],
    ids=["convert_to_tensor", "identity", "cast", "reduce_sum", "reduce_mean", "add_n"],
)
def test_helpers_given_a_per_replica_outside_a_replica_raise(mirrored_strategy, helper):
    # TF converts a PerReplica only inside a replica context (reference 2.5,
    # ``_per_replica_to_tensor``); elsewhere every conversion raises ValueError.
    with pytest.raises(ValueError, match=NOT_IN_REPLICA):
        helper(PerReplica([np.array([1.0]), np.array([2.0])]))
    assert [int(v) for v in mirrored_strategy.run(replica_id).values] == [0, 1]


def test_convert_to_tensor_of_per_replica_in_cross_replica_context_raises(mirrored_strategy):
    with mirrored_strategy.scope():
        with pytest.raises(ValueError, match=NOT_IN_REPLICA):
            td.convert_to_tensor(PerReplica([np.array([1.0]), np.array([2.0])]))
    assert [int(v) for v in mirrored_strategy.run(replica_id).values] == [0, 1]


def test_convert_to_tensor_of_mirrored_is_its_local_component(mirrored_strategy):
    m = td.distribute.Mirrored([np.array([1.0]), np.array([2.0])])
    assert td.convert_to_tensor(m) is m.values[0]
    result = mirrored_strategy.run(lambda: td.convert_to_tensor(m))
    assert result.values[1] is m.values[1]


# --- cast / identity / add_n ----------------------------------------------------------------


def test_cast_converts_dtype_truncating_toward_zero():
    result = td.cast(np.array([1.7, -1.7, 2.5]), td.int32)
    assert result.dtype == np.int32
    np.testing.assert_array_equal(result, np.trunc([1.7, -1.7, 2.5]).astype(np.int32))


def test_cast_of_a_python_value():
    result = td.cast(3, td.float64)
    assert result.dtype == np.float64 and result == 3.0


def test_cast_returns_a_new_array():
    source = np.array([1, 2], dtype=np.int32)
    result = td.cast(source, td.float32)
    source[0] = 9
    np.testing.assert_array_equal(result, [1.0, 2.0])


def test_identity_is_a_copy():
    source = np.array([1.0, 2.0])
    result = td.identity(source)
    source[0] = 100.0
    np.testing.assert_array_equal(result, [1.0, 2.0])
    assert result.dtype == source.dtype


def test_identity_of_a_python_value_follows_tf_dtype_rules():
    assert td.identity(1.0).dtype == np.float32


def test_add_n_sums_elementwise():
    inputs = [np.array([1.0, 2.0]), np.array([10.0, 20.0]), np.array([100.0, 200.0])]
    np.testing.assert_array_equal(td.add_n(inputs), np.sum(inputs, axis=0))


def test_add_n_keeps_the_dtype_and_does_not_alias_its_input():
    first = np.array([1, 2], dtype=np.int32)
    result = td.add_n([first])
    assert result.dtype == np.int32
    first[0] = 50
    np.testing.assert_array_equal(result, [1, 2])


def test_add_n_of_nothing_raises_value_error():
    with pytest.raises(ValueError, match="add_n\\(\\) needs at least one input"):
        td.add_n([])


# --- reduce_sum / reduce_mean ---------------------------------------------------------------

MATRIX = np.array([[1, 2, 3], [4, 5, 7]], dtype=np.int32)
FMATRIX = MATRIX.astype(np.float32)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1), [0]])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_sum_matches_numpy_and_keeps_dtype(axis, keepdims):
    numpy_axis = tuple(axis) if isinstance(axis, list) else axis
    result = td.reduce_sum(MATRIX, axis=axis, keepdims=keepdims)
    expected = np.sum(MATRIX, axis=numpy_axis, keepdims=keepdims)
    np.testing.assert_array_equal(result, expected)
    assert result.shape == expected.shape
    assert result.dtype == np.int32


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_mean_of_floats_matches_numpy(axis, keepdims):
    result = td.reduce_mean(FMATRIX, axis=axis, keepdims=keepdims)
    expected = np.mean(FMATRIX, axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(result, expected)
    assert result.shape == expected.shape
    assert result.dtype == np.float32


def test_reduce_mean_of_int32_truncates_like_tf():
    result = td.reduce_mean(np.array([1, 2], dtype=np.int32))
    assert result == 1
    assert result.dtype == np.int32


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_mean_of_ints_is_the_truncated_quotient(axis, keepdims):
    total = np.sum(MATRIX, axis=axis, keepdims=keepdims, dtype=np.int64)
    count = MATRIX.size // np.size(total)
    expected = np.trunc(total / count).astype(np.int32)
    result = td.reduce_mean(MATRIX, axis=axis, keepdims=keepdims)
    np.testing.assert_array_equal(result, expected)
    assert result.shape == expected.shape
    assert result.dtype == np.int32


def test_reduce_mean_of_negative_ints_truncates_toward_zero():
    # TF's integer Mean divides like C++: -3 / 2 == -1 (not floor's -2).
    assert td.reduce_mean(np.array([-1, -2], dtype=np.int32)) == int(np.trunc(-3 / 2))


def test_reduce_mean_of_a_python_list_is_float32():
    result = td.reduce_mean([1.0, 2.0])
    assert result.dtype == np.float32 and result == 1.5


# --- zeros / ones / range -------------------------------------------------------------------


@pytest.mark.parametrize(("fn", "fill"), [(td.zeros, 0.0), (td.ones, 1.0)], ids=["zeros", "ones"])
@pytest.mark.parametrize("shape", [3, (2, 3), [4], ()])
def test_zeros_and_ones_default_to_float32(fn, fill, shape):
    result = fn(shape)
    expected_shape = (shape,) if isinstance(shape, int) else tuple(shape)
    assert result.dtype == np.float32
    assert result.shape == expected_shape
    np.testing.assert_array_equal(result, np.full(expected_shape, fill, dtype=np.float32))


@pytest.mark.parametrize(("fn", "fill"), [(td.zeros, 0), (td.ones, 1)], ids=["zeros", "ones"])
def test_zeros_and_ones_with_dtype(fn, fill):
    result = fn((2,), dtype=td.int64)
    assert result.dtype == np.int64
    np.testing.assert_array_equal(result, [fill, fill])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((5,), np.arange(5, dtype=np.int32)),
        ((1, 10, 3), np.arange(1, 10, 3, dtype=np.int32)),
        ((10, 0, -2), np.arange(10, 0, -2, dtype=np.int32)),
        ((0.0, 1.0, 0.25), np.arange(0.0, 1.0, 0.25, dtype=np.float32)),
        ((3.0,), np.arange(3.0, dtype=np.float32)),
        ((0, 1.0, 0.5), np.arange(0, 1.0, 0.5, dtype=np.float32)),
    ],
    ids=["limit", "start-limit-delta", "negative-delta", "floats", "float-limit", "mixed"],
)
def test_range_dtype_and_values(args, expected):
    result = td.range(*args)
    assert result.dtype == expected.dtype
    np.testing.assert_array_equal(result, expected)


def test_range_with_dtype():
    result = td.range(3, dtype=td.float64)
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, [0.0, 1.0, 2.0])


# --- dtypes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "float16", "float32", "float64", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64", "complex64", "complex128", "bool",
    ],
)
def test_dtype_names_are_numpy_dtypes(name):
    assert getattr(td, name) == np.dtype(name)


@pytest.mark.parametrize(("alias", "name"), [("double", "float64"), ("half", "float16")])
def test_dtype_aliases(alias, name):
    assert getattr(td, alias) == np.dtype(name)


# --- td.function ----------------------------------------------------------------------------


def double(x):
    return x * 2


def test_function_as_a_bare_decorator_calls_the_function():
    step = td.function(double)
    assert step(3) == 6
    assert step.python_function is double
    assert step.__name__ == "double"


def test_function_with_options_calls_the_function():
    assert td.function(jit_compile=True, reduce_retracing=True)(double)(3) == 6


def test_function_with_input_signature_calls_the_function():
    assert td.function(input_signature=[None])(double).python_function is double


def test_function_of_a_function_wraps_once():
    step = td.function(double)
    assert td.function(step) is step


def test_function_as_a_method_decorator_binds_self():
    class Model:
        factor = 3

        @td.function
        def step(self, x):
            return x * self.factor

    assert Model().step(2) == 6


def _exhausting_step(iterator):
    return next(iterator)


def test_function_raises_out_of_range_for_a_stop_iteration():
    step = td.function(_exhausting_step)
    with pytest.raises(td.errors.OutOfRangeError, match="^End of sequence: a StopIteration escaped the td.function") as info:
        step(iter([]))
    assert info.value.error_code == td.errors.OUT_OF_RANGE
    assert isinstance(info.value.__cause__, StopIteration)


def test_function_out_of_range_is_still_a_stop_iteration():
    step = td.function(_exhausting_step)
    with pytest.raises(StopIteration):
        step(iter([]))


def test_function_other_errors_pass_unchanged():
    @td.function
    def step():
        raise KeyError("k")

    with pytest.raises(KeyError):
        step()


def test_function_out_of_range_from_an_inner_function_passes_unchanged():
    inner = td.function(_exhausting_step)
    outer = td.function(lambda it: inner(it))
    with pytest.raises(td.errors.OutOfRangeStopIteration) as info:
        outer(iter([]))
    assert isinstance(info.value.__cause__, StopIteration)
    assert not isinstance(info.value.__cause__, td.errors.OutOfRangeError)


def test_function_in_a_generator_raises_a_plain_out_of_range_error():
    # Python turns a StopIteration leaving a generator into RuntimeError (PEP 479); TensorFlow's
    # OutOfRangeError leaves it unchanged, so here the error is not a StopIteration.
    step = td.function(_exhausting_step)

    def losses(iterator):
        while True:
            yield step(iterator)

    with pytest.raises(td.errors.OutOfRangeError) as info:
        list(losses(iter([1])))
    assert not isinstance(info.value, StopIteration)


def test_function_ends_an_epoch_as_tensorflow_does(mirrored_strategy):
    # TensorFlow 2.21, 2 CPU replicas, Dataset.range(8).batch(4): the loop sees [6, 22], then
    # OutOfRangeError (next() outside tf.function raises StopIteration, get_next() OutOfRangeError).
    strategy = mirrored_strategy
    iterator = iter(strategy.experimental_distribute_dataset(td.data.Dataset.range(8).batch(4)))

    @td.function
    def step(iterator):
        per_replica = strategy.run(lambda x: td.reduce_sum(x), args=(next(iterator),))
        return strategy.reduce("SUM", per_replica, axis=None)

    seen = []
    try:
        while True:
            seen.append(int(step(iterator)))
    except td.errors.OutOfRangeError:
        pass
    assert seen == [6, 22]


def test_function_decorated_replica_fn_runs(mirrored_strategy):
    @td.function
    def step(x):
        return x * 2.0

    result = mirrored_strategy.run(step, args=(td.constant(3.0),))
    assert [float(v) for v in mirrored_strategy.experimental_local_results(result)] == [6.0, 6.0]


# --- ReduceOp -------------------------------------------------------------------------------


def test_reduce_op_members():
    assert [(op.name, op.value) for op in ReduceOp] == [("SUM", "SUM"), ("MEAN", "MEAN")]


@pytest.mark.parametrize("name", ["SUM", "MEAN"])
def test_reduce_op_from_its_value(name):
    assert ReduceOp(name) is getattr(ReduceOp, name)


@pytest.mark.parametrize("bad", ["sum", "mean", "MAX", ""])
def test_reduce_op_from_a_wrong_string_raises_value_error(bad):
    with pytest.raises(ValueError, match=f"'{bad}' is not a valid ReduceOp"):
        ReduceOp(bad)


@pytest.mark.parametrize(("aggregation", "op"), [("SUM", "SUM"), ("MEAN", "MEAN")])
def test_reduce_op_from_variable_aggregation(aggregation, op):
    assert ReduceOp.from_variable_aggregation(td.VariableAggregation[aggregation]) is ReduceOp[op]


@pytest.mark.parametrize("aggregation", ["NONE", "ONLY_FIRST_REPLICA"])
def test_reduce_op_from_a_non_reducing_aggregation_raises(aggregation):
    with pytest.raises(ValueError, match="^Could not convert from `tf.VariableAggregation`") as info:
        ReduceOp.from_variable_aggregation(td.VariableAggregation[aggregation])
    assert f"VariableAggregationV2.{aggregation}" in str(info.value)


# --- VariableAggregation / VariableSynchronization -------------------------------------------


def test_variable_aggregation_members():
    assert [(m.name, m.value) for m in td.VariableAggregation] == [
        ("NONE", 0), ("SUM", 1), ("MEAN", 2), ("ONLY_FIRST_REPLICA", 3)
    ]


def test_variable_aggregation_repr_is_tf_v2_style():
    assert repr(td.VariableAggregation.SUM) == "VariableAggregationV2.SUM"


def test_variable_synchronization_members():
    assert [(m.name, m.value) for m in td.VariableSynchronization] == [
        ("AUTO", 0), ("NONE", 1), ("ON_WRITE", 2), ("ON_READ", 3)
    ]


# --- ValueContext / RunOptions --------------------------------------------------------------


def test_value_context_str_has_two_spaces_before_total():
    context = td.distribute.experimental.ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=4)
    assert str(context) == "tf.distribute.ValueContext(replica id 2,  total replicas in sync: 4)"


def test_value_context_defaults():
    context = td.distribute.experimental.ValueContext()
    assert (context.replica_id_in_sync_group, context.num_replicas_in_sync) == (0, 1)
    assert str(context) == "tf.distribute.ValueContext(replica id 0,  total replicas in sync: 1)"


def test_value_context_doc_example():
    context = td.distribute.experimental.ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=4)
    assert context.replica_id_in_sync_group / context.num_replicas_in_sync == 0.5


def test_run_options_defaults():
    options = td.distribute.RunOptions()
    assert options._fields == (
        "experimental_enable_dynamic_batch_size",
        "experimental_bucketizing_dynamic_shape",
        "experimental_xla_options",
    )
    assert tuple(options) == (True, False, None)


def test_run_accepts_and_ignores_run_options(mirrored_strategy):
    result = mirrored_strategy.run(replica_id, options=td.distribute.RunOptions(experimental_enable_dynamic_batch_size=False))
    assert [int(v) for v in result.values] == [0, 1]
