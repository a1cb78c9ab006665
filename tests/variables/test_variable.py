"""The plain single-device ``td.Variable`` (outside any strategy scope).

Pinned here, against TensorFlow 2.21's ``tf.Variable`` where the two agree:

* creation: default dtypes (Python float -> float32, int -> int32), ``dtype=`` conversion,
  callable initial values (called once), keyword-only arguments after ``trainable``, and
  the argument checks (missing initial value, bad synchronization/aggregation/constraint,
  a ``shape=`` the initial value does not have);
* properties: ``name`` (``":0"`` suffix), ``device`` (canonical name, ``td.device``),
  ``trainable`` defaults, ``synchronization``/``aggregation`` as given,
  ``distribute_strategy``; the exact ``repr``;
* writes: ``assign``/``assign_add``/``assign_sub`` return the variable, read when used (an
  ``UnreadVariable``, None with ``read_value=False``), the dtype conversion rules, the shape rules (assign checks the
  declared shape, ``None`` dims and ``validate_shape=False`` relax it; assign_add/sub never
  broadcast), and a failed write changes nothing;
* snapshot semantics: arrays handed out by reads never change afterwards and are read-only;
  ``numpy()`` and ``np.asarray(v, copy=True)`` are writable copies; the variable never
  aliases an array it was given;
* operators and conversions act on the value; ``hash`` is refused and ``ref()`` is the key;
* readers running while another thread assigns always see whole, consistent values.
"""

from __future__ import annotations

import copy
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import towerdist as td

InvalidArgumentError = td.errors.InvalidArgumentError
Sync = td.VariableSynchronization
Agg = td.VariableAggregation

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


# --- creation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("initial", "dtype"),
    [
        (1.0, np.float32),
        (3, np.int32),
        ([1.0, 2.0], np.float32),
        ([1, 2], np.int32),
        (True, np.bool_),
        (np.float64(1.0), np.float64),
        (np.zeros(2, np.int64), np.int64),
        (np.zeros((2, 2), np.float16), np.float16),
    ],
)
def test_default_dtype_follows_tensorflow(initial, dtype):
    v = td.Variable(initial)
    assert v.dtype == dtype
    assert v.value().dtype == dtype
    np.testing.assert_array_equal(v.numpy(), np.asarray(initial))


def test_python_values_give_float32_and_int32_td_dtypes():
    assert td.Variable(1.0).dtype == td.float32
    assert td.Variable(1).dtype == td.int32


def test_dtype_argument_converts_the_initial_value():
    as_float = td.Variable(1, dtype=td.float32)
    assert as_float.dtype == np.float32 and float(as_float) == 1.0
    exact = td.Variable(0.1, dtype=td.float64)
    assert exact.dtype == np.float64 and float(exact) == 0.1  # not rounded through float32
    from_array = td.Variable(np.array([1, 2]), dtype=td.float32)
    assert from_array.dtype == np.float32
    np.testing.assert_array_equal(from_array.numpy(), [1.0, 2.0])


def test_dtype_argument_refuses_to_lose_information():
    with pytest.raises(TypeError, match=r"td\.Variable\(name='Variable'\) initial_value: cannot convert 1\.5"):
        td.Variable(1.5, dtype=td.int32)
    with pytest.raises(InvalidArgumentError, match=r"td\.Variable\(name='Variable'\) initial_value: cannot convert"):
        td.Variable(np.array([1.5]), dtype=td.int32)


def test_callable_initial_value_is_called_exactly_once():
    calls = []

    def init():
        calls.append(1)
        return np.array([1.0, 2.0], np.float32)

    v = td.Variable(init)
    v.assign_add([1.0, 1.0])
    _ = v.value(), repr(v), v.numpy()
    assert len(calls) == 1
    np.testing.assert_array_equal(v.numpy(), [2.0, 3.0])


def test_callable_initial_value_with_dtype():
    v = td.Variable(lambda: 2, dtype=td.float64)
    assert v.dtype == np.float64 and float(v) == 2.0


def test_an_error_raised_by_the_initial_value_callable_propagates():
    def init():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        td.Variable(init)


@pytest.mark.parametrize("call", [lambda: td.Variable(), lambda: td.Variable(None), lambda: td.Variable(name="a")])
def test_initial_value_is_required(call):
    with pytest.raises(ValueError, match=r"The `initial_value` arg to `td\.Variable` must be specified"):
        call()


def test_arguments_after_trainable_are_keyword_only():
    with pytest.raises(TypeError):
        td.Variable(1.0, True, "a")
    v = td.Variable(1.0, False, name="a")
    assert v.trainable is False and v.name == "a:0"


def test_name_must_be_a_string():
    with pytest.raises(TypeError, match=r"td\.Variable\(\) takes name as a string"):
        td.Variable(1.0, name=3)


@pytest.mark.parametrize("initial", ["ab", np.array(["a", "bc"]), np.array([b"x", b"yz"])])
def test_string_variables_hold_strings(initial):
    v = td.Variable(initial)
    assert v.dtype.kind == np.asarray(initial).dtype.kind
    np.testing.assert_array_equal(v.numpy(), initial)


def test_string_variable_takes_longer_strings_without_truncating():
    v = td.Variable(np.array(["a", "bc"]))
    v.assign(np.array(["a much longer string", "x"]))
    assert v.numpy().tolist() == ["a much longer string", "x"]
    v.assign(["short", "y"])
    assert v.numpy().tolist() == ["short", "y"]


@pytest.mark.parametrize(
    "value, error",
    [(3, TypeError), (1.5, TypeError), (np.array(3), td.errors.InvalidArgumentError),
     (np.array(2.5), td.errors.InvalidArgumentError)],
)
def test_numbers_never_become_strings(value, error):
    v = td.Variable("text")
    with pytest.raises(error, match=r"Variable\.assign\(\): cannot convert .*strings convert only to and from strings"):
        v.assign(value)
    assert v.numpy() == "text"


def test_ragged_initial_value_raises_a_clear_error():
    with pytest.raises(ValueError, match=r"Can't convert non-rectangular Python sequence to an array: td\.Variable"):
        td.Variable([[1.0], [1.0, 2.0]])


def test_ragged_assign_raises_and_changes_nothing():
    v = td.Variable([[0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="Can't convert non-rectangular Python sequence"):
        v.assign([[1.0], [1.0, 2.0]])
    np.testing.assert_array_equal(v.numpy(), np.zeros((2, 2)))


def test_is_a_td_variable():
    v = td.Variable(1.0)
    assert isinstance(v, td.Variable)
    assert v.is_initialized() is True


def test_the_initial_array_is_copied():
    source = np.array([1.0, 2.0], np.float32)
    v = td.Variable(source)
    source[0] = 99.0
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


def test_a_variable_initialised_from_a_variable_is_independent():
    a = td.Variable([1.0, 2.0])
    b = td.Variable(a)
    a.assign([5.0, 6.0])
    np.testing.assert_array_equal(b.numpy(), [1.0, 2.0])
    b.assign_add([1.0, 1.0])
    np.testing.assert_array_equal(a.numpy(), [5.0, 6.0])


# --- properties --------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "name"), [({}, "Variable:0"), ({"name": "a"}, "a:0"), ({"name": "a/b"}, "a/b:0")])
def test_name(kwargs, name):
    assert td.Variable(1.0, **kwargs).name == name


def test_default_names_are_not_made_unique():
    assert td.Variable(1.0).name == td.Variable(2.0).name == "Variable:0"


def test_device_is_the_canonical_name_of_the_current_device():
    assert td.Variable(1.0).device == CPU0
    with td.device("CPU:1"):
        v = td.Variable(1.0)
        from_callable = td.Variable(lambda: td.constant([1.0]))
    assert v.device == CPU1
    assert from_callable.device == CPU1
    v.assign(2.0)  # writes keep the variable where it is
    assert v.device == CPU1


@pytest.mark.parametrize(
    ("kwargs", "trainable"),
    [
        ({}, True),
        ({"trainable": False}, False),
        ({"synchronization": Sync.ON_READ}, False),
        ({"synchronization": Sync.ON_READ, "trainable": True}, True),
        ({"synchronization": Sync.ON_WRITE}, True),
    ],
)
def test_trainable_default(kwargs, trainable):
    assert td.Variable(1.0, **kwargs).trainable is trainable


@pytest.mark.parametrize("synchronization", list(Sync))
@pytest.mark.parametrize("aggregation", list(Agg))
def test_synchronization_and_aggregation_are_kept_as_given(synchronization, aggregation):
    v = td.Variable(1.0, synchronization=synchronization, aggregation=aggregation)
    assert v.synchronization is synchronization
    assert v.aggregation is aggregation


def test_defaults_are_auto_and_none():
    v = td.Variable(1.0)
    assert v.synchronization is Sync.AUTO  # a plain variable does not resolve AUTO
    assert v.aggregation is Agg.NONE


def test_mean_aggregation_with_an_int_dtype_is_fine_for_a_plain_variable():
    v = td.Variable(3, aggregation=Agg.MEAN)
    v.assign_add(1)
    assert int(v) == 4


def test_sync_none_is_fine_for_a_plain_variable():
    v = td.Variable(1.0, synchronization=Sync.NONE)
    assert float(v.assign(2.0)) == 2.0


@pytest.mark.parametrize("mode", [7, "sum", "ON_READ"])
def test_invalid_synchronization(mode):
    with pytest.raises(ValueError, match="Invalid variable synchronization mode"):
        td.Variable(1.0, synchronization=mode)


@pytest.mark.parametrize("mode", [7, "sum"])
def test_invalid_aggregation(mode):
    with pytest.raises(ValueError, match="Invalid variable aggregation mode"):
        td.Variable(1.0, aggregation=mode)


def test_none_aggregation_and_synchronization_mean_the_defaults():
    v = td.Variable(1.0, aggregation=None, synchronization=None)
    assert v.aggregation is td.VariableAggregation.NONE
    assert v.synchronization is Sync.AUTO


def test_distribute_strategy_is_the_default_strategy():
    v = td.Variable(1.0)
    assert v.distribute_strategy is td.distribute.get_strategy()


def test_constraint_is_kept_and_not_applied_by_assign():
    def clip(x):
        return np.clip(x, 0.0, 1.0)

    v = td.Variable(0.5, constraint=clip)
    assert v.constraint is clip
    v.assign(5.0)  # as in TensorFlow: optimizers apply constraints, assign does not
    assert float(v) == 5.0
    assert td.Variable(1.0).constraint is None


def test_constraint_must_be_callable():
    with pytest.raises(ValueError, match="The `constraint` argument must be a callable"):
        td.Variable(1.0, constraint=3)


def test_caching_device_is_accepted():
    assert float(td.Variable(1.0, caching_device="CPU:1")) == 1.0


def test_shape_and_get_shape():
    v = td.Variable(np.zeros((2, 3)))
    assert v.shape == (2, 3)
    assert v.get_shape() == (2, 3)
    assert td.Variable(1.0).shape == ()


# --- repr --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda: td.Variable(1.0), "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"),
        (
            lambda: td.Variable([1.0, 2.0]),
            "<tf.Variable 'Variable:0' shape=(2,) dtype=float32, numpy=array([1., 2.], dtype=float32)>",
        ),
        (lambda: td.Variable(3), "<tf.Variable 'Variable:0' shape=() dtype=int32, numpy=3>"),
        (
            lambda: td.Variable(np.zeros((2, 2))),
            "<tf.Variable 'Variable:0' shape=(2, 2) dtype=float64, numpy=\narray([[0., 0.],\n       [0., 0.]])>",
        ),
        (lambda: td.Variable(0.1), "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=0.1>"),
        (lambda: td.Variable(True, name="b"), "<tf.Variable 'b:0' shape=() dtype=bool, numpy=True>"),
    ],
)
def test_repr_matches_tensorflow(make, text):
    assert repr(make()) == text


def test_repr_shows_the_current_value():
    v = td.Variable(1.0)
    v.assign_add(2.0)
    assert repr(v) == "<tf.Variable 'Variable:0' shape=() dtype=float32, numpy=3.0>"


# --- writes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "arg", "expected"), [("assign", 5.0, 5.0), ("assign_add", 2.0, 3.0), ("assign_sub", 2.0, -1.0)]
)
def test_writes_return_the_variable_read_when_used(op, arg, expected):
    # TF 2.21: type(v.assign(5.0)).__name__ == "_UnreadVariable", isinstance tf.Variable,
    # name "UnreadVariable", `is v` False, numpy() 5.0; read after a later write: 7.0.
    v = td.Variable(1.0)
    result = getattr(v, op)(arg)
    assert isinstance(result, td.Variable) and type(result).__name__ == "UnreadVariable"
    assert result is not v
    assert result.name == "UnreadVariable"
    assert result.dtype == np.float32 and result.shape == () and result.device == v.device
    assert result.numpy() == expected
    assert repr(result) == f"<tf.Variable 'UnreadVariable' shape=() dtype=float32, numpy={expected}>"
    v.assign(7.0)
    assert result.numpy() == 7.0  # not a snapshot: it reads the variable when used


def test_writes_chain_and_write_the_same_variable():
    # TF 2.21: v = tf.Variable([1., 2.]); v.assign([3., 4.]).assign_add([1., 1.]) -> v is [4., 5.].
    v = td.Variable([1.0, 2.0])
    chained = v.assign([3.0, 4.0]).assign_add([1.0, 1.0])
    np.testing.assert_array_equal(v.numpy(), [4.0, 5.0])
    np.testing.assert_array_equal(chained.numpy(), [4.0, 5.0])
    np.testing.assert_array_equal(v.assign_sub([1.0, 1.0]) + 1.0, [4.0, 5.0])  # arithmetic reads it
    assert v.assign_add([0.0, 0.0]).ref() != v.ref()


@pytest.mark.parametrize(
    ("op", "arg", "expected"), [("assign", 5.0, 5.0), ("assign_add", 2.0, 3.0), ("assign_sub", 2.0, -1.0)]
)
def test_writes_return_none_with_read_value_false(op, arg, expected):
    v = td.Variable(1.0)
    assert getattr(v, op)(arg, read_value=False) is None
    assert float(v) == expected


def test_writes_accept_tensorflows_use_locking_and_name():
    v = td.Variable(1.0)
    v.assign(2.0, use_locking=True, name="x")
    v.assign_add(1.0, True, "y")
    v.assign_sub(0.5, use_locking=False, name=None, read_value=False)
    assert float(v) == 2.5


def test_value_and_read_value_are_the_current_value():
    v = td.Variable([1.0, 2.0])
    v.assign([3.0, 4.0])
    np.testing.assert_array_equal(v.value(), [3.0, 4.0])
    np.testing.assert_array_equal(v.read_value(), [3.0, 4.0])
    np.testing.assert_array_equal(np.asarray(v), [3.0, 4.0])


def test_assign_from_a_variable_and_from_itself():
    v = td.Variable([1.0, 2.0])
    w = td.Variable([10.0, 20.0])
    v.assign(w)
    np.testing.assert_array_equal(v.numpy(), [10.0, 20.0])
    v.assign_add(v)
    np.testing.assert_array_equal(v.numpy(), [20.0, 40.0])
    v.assign_sub(w)
    np.testing.assert_array_equal(v.numpy(), [10.0, 20.0])
    np.testing.assert_array_equal(w.numpy(), [10.0, 20.0])


# --- dtype conversion on write -----------------------------------------------------------


def test_int_array_into_float_variable_converts():
    v = td.Variable([1.0, 2.0])
    v.assign(np.array([3, 4], np.int32))
    assert v.dtype == np.float32
    np.testing.assert_array_equal(v.numpy(), [3.0, 4.0])
    v.assign_add(np.array([1, 1], np.int64))
    assert v.dtype == np.float32
    np.testing.assert_array_equal(v.numpy(), [4.0, 5.0])


def test_python_values_into_float_variable_convert():
    v = td.Variable([1.0, 2.0])
    v.assign([1, 2])
    assert v.dtype == np.float32
    v.assign_add([0.5, 0.5])
    np.testing.assert_array_equal(v.numpy(), [1.5, 2.5])


@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
def test_float_array_into_int_variable_is_invalid_argument(op):
    v = td.Variable([1, 2])
    with pytest.raises(InvalidArgumentError, match=rf"Variable\.{op}\(\): cannot convert an array of dtype float"):
        getattr(v, op)(np.array([1.5, 2.0]))
    assert issubclass(InvalidArgumentError, ValueError)


@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
def test_python_float_into_int_variable_is_type_error(op):
    v = td.Variable(1)
    with pytest.raises(TypeError, match=rf"Variable\.{op}\(\): cannot convert 1\.5"):
        getattr(v, op)(1.5)


@pytest.mark.parametrize(
    ("dtype", "value"), [(np.uint8, 300), (np.uint8, -1), (np.int8, 128), (np.int8, -129), (np.int32, 2**31)]
)
def test_python_int_out_of_range_is_type_error(dtype, value):
    v = td.Variable(np.zeros((), dtype))
    with pytest.raises(TypeError, match=r"Variable\.assign\(\): cannot convert"):
        v.assign(value)


@given(
    dtype=st.sampled_from([np.int8, np.int16, np.int32, np.int64]),
    data=st.data(),
)
@settings(max_examples=30, deadline=None)
def test_python_ints_in_range_of_a_signed_dtype_are_stored_exactly(dtype, data):
    info = np.iinfo(dtype)
    value = data.draw(st.integers(int(info.min), int(info.max)))
    v = td.Variable(np.zeros((), dtype))
    v.assign(value)
    assert v.dtype == dtype
    assert int(v) == value


def test_python_ints_in_range_into_unsigned_variables():
    assert int(td.Variable(5, dtype=td.uint8)) == 5
    v = td.Variable(np.array([1, 2], np.uint8))
    v.assign([3, 4])
    v.assign_add([1, 1])
    np.testing.assert_array_equal(v.numpy(), [4, 5])


@pytest.mark.parametrize("value", ["a", ["a"]])
def test_string_into_a_number_variable_is_type_error(value):
    v = td.Variable(1.0)
    with pytest.raises(TypeError, match=r"Variable\.assign\(\): cannot convert"):
        v.assign(value)
    assert float(v) == 1.0


@pytest.mark.parametrize("value", [None, {"x": 1}, print])
def test_value_that_is_not_numbers_or_strings_is_value_error(value):
    v = td.Variable(1.0)
    with pytest.raises(ValueError, match=r"Attempt to convert a value .* with an unsupported type"):
        v.assign(value)
    assert float(v) == 1.0


def test_complex_into_float_variable_is_type_error():
    with pytest.raises(TypeError, match=r"Variable\.assign\(\): cannot convert 1j"):
        td.Variable(1.0).assign(1j)


# --- shapes ------------------------------------------------------------------------------


def test_assign_of_another_shape_names_both_shapes():
    v = td.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match=r"Cannot assign a value of shape \(3,\) to variable Variable:0") as info:
        v.assign([1.0, 2.0, 3.0])
    assert "(2,)" in str(info.value)


@pytest.mark.parametrize("op", ["assign_add", "assign_sub"])
@pytest.mark.parametrize("delta", [1.0, [1.0], [[1.0, 1.0]], [1.0, 1.0, 1.0]])
def test_assign_add_and_sub_never_broadcast(op, delta):
    v = td.Variable([1.0, 2.0])
    with pytest.raises(InvalidArgumentError, match=rf"Cannot {op} a value of shape"):
        getattr(v, op)(delta)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


def test_none_dimension_allows_other_sizes_of_the_same_rank():
    v = td.Variable([1.0, 2.0], shape=(None,))
    v.assign([3.0, 4.0, 5.0])
    assert v.shape == (3,)
    np.testing.assert_array_equal(v.numpy(), [3.0, 4.0, 5.0])
    v.assign_add([1.0, 1.0, 1.0])  # against the current shape
    np.testing.assert_array_equal(v.numpy(), [4.0, 5.0, 6.0])
    with pytest.raises(InvalidArgumentError, match="Cannot assign_add a value of shape"):
        v.assign_add([1.0, 1.0])
    with pytest.raises(ValueError, match=r"Cannot assign a value of shape \(\)"):
        v.assign(1.0)
    with pytest.raises(ValueError, match=r"Cannot assign a value of shape \(1, 3\)"):
        v.assign([[1.0, 2.0, 3.0]])


def test_partially_known_shape():
    v = td.Variable(np.zeros((2, 3)), shape=(None, 3))
    v.assign(np.ones((5, 3)))
    assert v.shape == (5, 3)
    with pytest.raises(ValueError, match=r"Cannot assign a value of shape \(5, 4\)"):
        v.assign(np.ones((5, 4)))


def test_validate_shape_false_allows_any_shape():
    v = td.Variable([1.0, 2.0], validate_shape=False)
    v.assign(np.ones((2, 3)))
    assert v.shape == (2, 3)
    v.assign(7.0)
    assert v.shape == () and float(v) == 7.0


def test_shape_argument_as_an_int():
    v = td.Variable([1.0, 2.0], shape=2)
    v.assign([3.0, 4.0])
    with pytest.raises(ValueError, match="Cannot assign a value of shape"):
        v.assign([1.0])


@pytest.mark.parametrize(("initial", "shape"), [([1.0, 2.0], (3,)), (1.0, (1,)), ([1.0, 2.0], (None, 2))])
def test_shape_argument_incompatible_with_the_initial_value(initial, shape):
    with pytest.raises(ValueError, match=r"In this `td\.Variable` creation, the initial value's shape"):
        td.Variable(initial, shape=shape)


@pytest.mark.parametrize(
    "bad_write",
    [
        lambda v: v.assign([1.0, 2.0, 3.0]),
        lambda v: v.assign_add(1.0),
        lambda v: v.assign_sub([[1.0, 1.0]]),
        lambda v: v.assign("x"),
        lambda v: v.assign(np.array([1.0, 2.0], np.complex64)),
        lambda v: v.assign_add(np.array([1j, 1j])),
    ],
)
def test_a_failed_write_leaves_the_value_unchanged(bad_write):
    v = td.Variable([1.0, 2.0])
    before = v.value()
    with pytest.raises((ValueError, TypeError)):
        bad_write(v)
    assert v.shape == (2,) and v.dtype == np.float32
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(before, [1.0, 2.0])


# --- snapshots ---------------------------------------------------------------------------


def test_reads_are_snapshots():
    v = td.Variable([1.0, 2.0])
    reads = [v.value(), v.read_value(), np.asarray(v), td.convert_to_tensor(v), v.assign([3.0, 4.0]).value()]
    v.assign_add([10.0, 10.0])
    v.assign_sub([1.0, 1.0])
    v.assign([0.0, 0.0])
    for read, expected in zip(reads, [[1.0, 2.0]] * 4 + [[3.0, 4.0]]):
        np.testing.assert_array_equal(read, expected)
    np.testing.assert_array_equal(v.numpy(), [0.0, 0.0])


@pytest.mark.parametrize(
    "read",
    [
        lambda v: v.value(),
        lambda v: v.read_value(),
        lambda v: np.asarray(v),
        lambda v: td.convert_to_tensor(v),
        lambda v: v.assign([5.0, 6.0]).value(),
        lambda v: v.assign_add([0.0, 0.0]).value(),
        lambda v: v.assign_sub([0.0, 0.0]).value(),
        lambda v: v.value()[:1],
        lambda v: v[:1],
    ],
)
def test_reads_are_read_only(read):
    v = td.Variable([5.0, 6.0])
    array = read(v)
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 99.0
    np.testing.assert_array_equal(v.numpy(), [5.0, 6.0])


def test_scalar_reads_are_read_only():
    v = td.Variable(1.0)
    with pytest.raises(ValueError, match="read-only"):
        v.value()[()] = 5.0
    assert float(v) == 1.0


def test_numpy_is_a_writable_copy():
    v = td.Variable([1.0, 2.0])
    copy = v.numpy()
    assert isinstance(copy, np.ndarray) and copy.flags.writeable
    copy[0] = 99.0
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    assert v.numpy() is not v.numpy()


def test_asarray_with_copy_true_is_writable_and_independent():
    v = td.Variable([1.0, 2.0])
    copy = np.asarray(v, copy=True)
    assert copy.flags.writeable
    copy[0] = 99.0
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    converted = np.asarray(v, dtype=np.float64)
    assert converted.dtype == np.float64
    np.testing.assert_array_equal(converted, [1.0, 2.0])


@pytest.mark.parametrize("op", ["assign", "assign_add", "assign_sub"])
def test_the_variable_does_not_alias_an_array_it_was_given(op):
    v = td.Variable(np.zeros(2, np.float32))
    given_array = np.array([1.0, 2.0], np.float32)
    expected = getattr(v, op)(given_array).numpy()
    given_array[:] = 99.0
    np.testing.assert_array_equal(v.numpy(), expected)


def test_identity_is_a_writable_copy():
    v = td.Variable([1.0, 2.0])
    copy = td.identity(v)
    assert isinstance(copy, np.ndarray) and copy.flags.writeable
    copy[0] = 99.0
    v.assign([3.0, 4.0])
    np.testing.assert_array_equal(copy, [99.0, 2.0])
    np.testing.assert_array_equal(v.numpy(), [3.0, 4.0])


@given(
    initial=hnp.arrays(np.float32, st.integers(0, 4), elements=st.floats(-1e3, 1e3, width=32)),
    data=st.data(),
)
@settings(max_examples=40, deadline=None)
def test_assign_add_and_sub_match_numpy_and_keep_every_snapshot(initial, data):
    shape = initial.shape
    deltas = hnp.arrays(np.float32, shape, elements=st.floats(-1e3, 1e3, width=32))
    steps = data.draw(st.lists(st.tuples(st.sampled_from(["assign_add", "assign_sub", "assign"]), deltas), max_size=6))
    v = td.Variable(initial)
    expected = initial.copy()
    snapshots = [(v.value(), expected.copy())]
    for op, delta in steps:
        if op == "assign_add":
            expected = np.add(expected, delta, dtype=np.float32)
        elif op == "assign_sub":
            expected = np.subtract(expected, delta, dtype=np.float32)
        else:
            expected = delta.copy()
        returned = getattr(v, op)(delta).value()
        delta[...] = 7.0  # the caller reusing its buffer does not reach the variable
        np.testing.assert_array_equal(returned, expected)
        snapshots.append((returned, expected.copy()))
    assert v.dtype == np.float32 and v.shape == shape
    np.testing.assert_array_equal(v.numpy(), expected)
    for snapshot, value in snapshots:
        np.testing.assert_array_equal(snapshot, value)


# --- operators and conversions -----------------------------------------------------------


M = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)


@pytest.mark.parametrize(
    ("compute", "expected"),
    [
        (lambda v: v + 1, [2.0, 3.0]),
        (lambda v: 1 + v, [2.0, 3.0]),
        (lambda v: v - 1, [0.0, 1.0]),
        (lambda v: 1 - v, [0.0, -1.0]),
        (lambda v: v * v, [1.0, 4.0]),
        (lambda v: v / 2, [0.5, 1.0]),
        (lambda v: 2 / v, [2.0, 1.0]),
        (lambda v: v**2, [1.0, 4.0]),
        (lambda v: 2**v, [2.0, 4.0]),
        (lambda v: v // 2, [0.0, 1.0]),
        (lambda v: v % 2, [1.0, 0.0]),
        (lambda v: -v, [-1.0, -2.0]),
        (lambda v: +v, [1.0, 2.0]),
        (lambda v: abs(-v), [1.0, 2.0]),
        (lambda v: v @ M, [7.0, 10.0]),
        (lambda v: M @ v, [5.0, 11.0]),
        (lambda v: np.ones(2, np.float32) + v, [2.0, 3.0]),
        (lambda v: np.ones(2, np.float32) - v, [0.0, -1.0]),
        (lambda v: v + td.Variable([10.0, 20.0]), [11.0, 22.0]),
        (lambda v: np.exp(v - v), [1.0, 1.0]),
        (lambda v: np.sum(v), 3.0),
        (lambda v: np.maximum(v, 1.5), [1.5, 2.0]),
        (lambda v: td.reduce_sum(v), 3.0),
    ],
)
def test_operators_act_on_the_value(compute, expected):
    v = td.Variable([1.0, 2.0])
    result = compute(v)
    assert not isinstance(result, td.Variable)
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


def test_operators_keep_the_variables_dtype():
    v = td.Variable([1.0, 2.0])
    assert (v + 1).dtype == np.float32
    assert (v * v).dtype == np.float32
    assert td.reduce_sum(v).dtype == np.float32


def test_integer_bitwise_operators():
    v = td.Variable([1, 6])
    np.testing.assert_array_equal(v & 3, [1, 2])
    np.testing.assert_array_equal(v | 1, [1, 7])
    np.testing.assert_array_equal(v ^ 1, [0, 7])
    np.testing.assert_array_equal(~v, [-2, -7])


@pytest.mark.parametrize(
    ("compute", "expected"),
    [
        (lambda v: v == 1.0, [True, False]),
        (lambda v: v != 1.0, [False, True]),
        (lambda v: v < 1.5, [True, False]),
        (lambda v: v <= 1.0, [True, False]),
        (lambda v: v > 1.5, [False, True]),
        (lambda v: v >= 2.0, [False, True]),
        (lambda v: 1.5 > v, [True, False]),
        (lambda v: v == td.Variable([1.0, 3.0]), [True, False]),
    ],
)
def test_comparisons_are_element_wise(compute, expected):
    result = compute(td.Variable([1.0, 2.0]))
    assert isinstance(result, np.ndarray) and result.dtype == np.bool_
    np.testing.assert_array_equal(result, expected)


def test_variables_are_unhashable_and_ref_is_the_key():
    v = td.Variable(1.0)
    w = td.Variable(1.0)
    with pytest.raises(TypeError, match="Variable is unhashable"):
        hash(v)
    with pytest.raises(TypeError, match="Variable is unhashable"):
        {v}  # noqa: B018
    assert v.ref() == v.ref()
    assert hash(v.ref()) == hash(v.ref())
    assert v.ref() != w.ref()  # equal values, different variables
    assert v.ref().deref() is v
    assert v.experimental_ref() == v.ref()
    table = {v.ref(): "v", w.ref(): "w"}
    assert table[v.ref()] == "v" and table[w.ref()] == "w"
    assert len({v.ref(), v.ref(), w.ref()}) == 2


def test_python_scalar_conversions():
    assert float(td.Variable(2.5)) == 2.5
    assert int(td.Variable(2.7)) == 2
    assert int(td.Variable(7)) == 7
    assert float(td.Variable(7)) == 7.0
    assert bool(td.Variable(0.0)) is False
    assert bool(td.Variable(3)) is True


@pytest.mark.parametrize("convert", [float, int, bool])
def test_python_scalar_conversions_need_a_scalar(convert):
    v = td.Variable([1.0, 2.0])
    with pytest.raises(TypeError, match=rf"{convert.__name__}\(\) needs a scalar variable"):
        convert(v)


def test_indexing():
    v = td.Variable([[1.0, 2.0], [3.0, 4.0]])
    assert float(v[1, 0]) == 3.0
    np.testing.assert_array_equal(v[1], [3.0, 4.0])
    np.testing.assert_array_equal(v[:, 1], [2.0, 4.0])
    np.testing.assert_array_equal(v[td.Variable(0)], [1.0, 2.0])
    assert [float(x) for x in td.Variable([1.0, 2.0])] == [1.0, 2.0]


def test_convert_to_tensor_gives_the_value():
    v = td.Variable([1.0, 2.0])
    array = td.convert_to_tensor(v)
    assert isinstance(array, np.ndarray) and array.dtype == np.float32
    np.testing.assert_array_equal(array, [1.0, 2.0])
    as_double = td.convert_to_tensor(v, dtype=td.float64)
    assert as_double.dtype == np.float64
    np.testing.assert_array_equal(as_double, [1.0, 2.0])


# --- threads -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_readers_see_whole_values_while_another_thread_assigns():
    size, writes, readers = 512, 300, 3
    v = td.Variable(np.zeros(size))
    done = threading.Event()

    def write():
        try:
            for i in range(1, writes + 1):
                v.assign(np.full(size, float(i)))
        finally:
            done.set()

    def read():
        kept = []
        last = 0.0
        count = 0
        while True:
            finished = done.is_set()
            array = v.value() if count % 2 else np.asarray(v)
            first = float(array[0])
            assert np.all(array == first), "a read saw a partly written value"
            assert first >= last, "a read went back in time"
            last = first
            if count % 17 == 0:
                kept.append((array, first))
            count += 1
            if finished:
                break
        for array, first in kept:  # snapshots taken during the writes never changed
            assert np.all(array == first)
        return last

    with ThreadPoolExecutor(readers + 1) as pool:
        futures = [pool.submit(read) for _ in range(readers)]
        writer = pool.submit(write)
        writer.result(timeout=50)
        finals = [f.result(timeout=50) for f in futures]
    assert finals == [float(writes)] * readers
    np.testing.assert_array_equal(v.numpy(), np.full(size, float(writes)))


@pytest.mark.timeout(60)
def test_concurrent_assign_add_loses_no_update():
    threads, per_thread, rounds = 4, 1000, 5
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so that an unlocked read-modify-write shows
    try:
        totals = []
        for _ in range(rounds):
            v = td.Variable(0.0, dtype=td.float64)
            start = threading.Barrier(threads, timeout=30)

            def add(v=v, start=start):
                start.wait()
                for _ in range(per_thread):
                    v.assign_add(1.0, read_value=False)

            with ThreadPoolExecutor(threads) as pool:
                for future in [pool.submit(add) for _ in range(threads)]:
                    future.result(timeout=50)
            totals.append(float(v))
    finally:
        sys.setswitchinterval(interval)
    assert totals == [float(threads * per_thread)] * rounds


def test_a_read_cannot_be_made_writable_again():
    v = td.Variable([1.0, 2.0])
    read = v.value()
    with pytest.raises(ValueError, match="cannot set WRITEABLE flag"):
        read.flags.writeable = True
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


# --- copy.deepcopy (as TensorFlow's ResourceVariable.__deepcopy__) ---------------------------


def test_deepcopy_is_a_new_independent_variable_with_the_same_attributes():
    def clip(x):
        return np.clip(x, 0.0, 1.0)

    with td.device("CPU:2"):
        v = td.Variable(np.array([1.0, 2.0], np.float32), name="w", trainable=False, constraint=clip,
                        shape=(None,), aggregation=td.VariableAggregation.SUM)
    copied = copy.deepcopy(v)
    assert type(copied) is type(v) and copied is not v
    assert (copied.name, copied.device, copied.dtype, copied.shape, copied.trainable) == (
        v.name, v.device, v.dtype, v.shape, v.trainable
    )
    assert copied.aggregation is v.aggregation and copied.synchronization is v.synchronization
    assert copied.constraint is clip and copied.distribute_strategy is v.distribute_strategy
    copied.assign([7.0, 8.0, 9.0])  # the declared shape (None,) is kept
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(copied.numpy(), [7.0, 8.0, 9.0])


def test_deepcopy_of_a_model_copies_its_variables_once():
    v = td.Variable(1.0)
    model = {"a": v, "b": [v]}
    copied = copy.deepcopy(model)
    assert copied["a"] is copied["b"][0] and copied["a"] is not v


def test_numpy_ufuncs_apply_to_a_variables_value():
    v = td.Variable(np.full(2, 4.0))
    np.testing.assert_array_equal(np.sqrt(v), [2.0, 2.0])
    np.testing.assert_array_equal(np.add(np.ones(2), v), [5.0, 5.0])
    np.testing.assert_array_equal(np.ones(2) * v, [4.0, 4.0])
    assert isinstance(np.multiply(v, 2.0), np.ndarray)


# --- slice assignment (TF 2.21 values in the comments) -----------------------------------


def test_slice_assign_writes_the_selected_elements_and_returns_the_variable():
    # TF: v = tf.Variable([1., 2., 3.]); v[0].assign(9.) -> [9, 2, 3]; v[1:].assign([5., 6.]) -> [9, 5, 6],
    # each returning an _UnreadVariable of the whole variable.
    v = td.Variable([1.0, 2.0, 3.0], name="w")
    result = v[0].assign(9.0)
    assert type(result).__name__ == "UnreadVariable"
    np.testing.assert_array_equal(result.numpy(), [9.0, 2.0, 3.0])
    v[1:].assign([5.0, 6.0])
    np.testing.assert_array_equal(v.numpy(), [9.0, 5.0, 6.0])


@pytest.mark.parametrize(
    ("initial", "write", "expected"),
    [
        ([9.0, 5.0, 6.0], lambda v: v[1:].assign(7.0), [9.0, 7.0, 7.0]),  # a scalar broadcasts
        ([9.0, 7.0, 7.0], lambda v: v[0].assign(1), [1.0, 7.0, 7.0]),  # an int into a float variable
        ([1.0, 7.0, 7.0], lambda v: v[::2].assign([0.5, 0.25]), [0.5, 7.0, 0.25]),
        ([0.5, 7.0, 0.25], lambda v: v[-1].assign(-1.0), [0.5, 7.0, -1.0]),
        ([[1, 2], [3, 4]], lambda v: v[0, 1].assign(9), [[1, 9], [3, 4]]),
        ([[1, 9], [3, 4]], lambda v: v[:, 0].assign([7, 8]), [[7, 9], [8, 4]]),
        ([[7, 9], [8, 4]], lambda v: v[1].assign([5, 6]), [[7, 9], [5, 6]]),
        ([[7, 9], [5, 6]], lambda v: v[..., 1].assign([0, 0]), [[7, 0], [5, 0]]),
        ([[7, 0], [5, 0]], lambda v: v[None].assign([[[1, 1], [1, 1]]]), [[1, 1], [1, 1]]),
        ([1.0, 2.0], lambda v: v[1:].assign([5.0]), [1.0, 5.0]),  # [1] broadcasts to (1,)
    ],
)
def test_slice_assign_matches_tensorflow(initial, write, expected):
    v = td.Variable(initial)
    write(v)
    np.testing.assert_array_equal(v.numpy(), expected)
    assert v.dtype == np.asarray(expected, v.dtype).dtype


@pytest.mark.parametrize(
    ("key", "value", "error", "match"),
    [
        (slice(1, None), [1.0, 2.0, 3.0], InvalidArgumentError, r"shape \(3,\) to the elements \[1:\] of variable w:0, of shape \(2,\)"),
        (0, [1.0, 2.0], InvalidArgumentError, r"shape \(2,\) to the elements \[0\] of variable w:0, of shape \(\)"),
        (0, "a", TypeError, "cannot convert"),
    ],
)
def test_a_bad_slice_assign_raises_tensorflows_error_type_and_changes_nothing(key, value, error, match):
    # TF: InvalidArgumentError "Cannot broadcast input shape [3] into final shape [2]"; a string: TypeError.
    v = td.Variable([1.0, 2.0, 3.0], name="w")
    with pytest.raises(error, match=match):
        v[key].assign(value)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0, 3.0])


def test_slice_assign_of_a_float_into_an_int_variable_raises_type_error():
    # TF: m[0, 1].assign(1.5) -> TypeError "Cannot convert 1.5 to EagerTensor of dtype int32".
    m = td.Variable([[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="cannot convert 1.5 to dtype int32"):
        m[0, 1].assign(1.5)


@pytest.mark.parametrize(
    "derived",
    [lambda v: v[0][()], lambda v: v[1:][0:1], lambda v: v[1:] + 1, lambda v: v[1:].copy(), lambda v: v.value()[1:]],
)
def test_only_the_array_read_by_indexing_the_variable_has_assign(derived):
    # TF: m[0][1].assign and (v[0] + 1).assign raise AttributeError.
    v = td.Variable([1.0, 2.0, 3.0])
    with pytest.raises(AttributeError):
        derived(v).assign(1.0)


@pytest.mark.parametrize("method", ["assign_add", "assign_sub"])
def test_sliced_values_have_no_assign_add_or_sub(method):
    # TF: v[0].assign_add -> AttributeError ('EagerTensor' object has no attribute 'assign_add').
    v = td.Variable([1.0, 2.0])
    assert not hasattr(v[0], method)


def test_a_slice_read_is_still_a_read_only_snapshot_array():
    v = td.Variable([1.0, 2.0, 3.0])
    first, rest = v[0], v[1:]
    assert isinstance(rest, np.ndarray) and isinstance(first, np.ndarray) and first.shape == ()
    v.assign([7.0, 8.0, 9.0])
    assert float(first) == 1.0 and first.numpy() == 1.0
    np.testing.assert_array_equal(rest, [2.0, 3.0])
    assert type(rest * 2) is np.ndarray and type(rest.sum()) is np.float32
    assert repr(rest) == "array([2., 3.], dtype=float32)"
    with pytest.raises(ValueError, match="read-only"):
        rest[0] = 5.0


def test_an_element_read_can_be_accumulated_in_place_as_the_numpy_scalar_it_was():
    # The accumulator pattern (TF: tf.Tensor(2.0) after total += 1): the element is a copy of its
    # own, so adding to it leaves the variable alone.
    v = td.Variable([1.0, 2.0, 3.0])
    total = v[0]
    total += v[1]
    total += 1
    assert float(total) == 4.0
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0, 3.0])
