"""``td.dtypes`` (``tf.dtypes``): the dtypes under TensorFlow's names, ``DType``, ``as_dtype`` and ``cast``."""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td


def test_the_dtypes_a_tf_script_names_are_the_top_level_ones():
    # A TF script: tf.dtypes.int64 (TensorFlow 2.21: the same object as tf.int64)
    assert td.dtypes.int64 is td.int64 == np.dtype("int64")
    assert td.dtypes.float32 is td.float32
    assert td.dtypes.string is td.string
    assert isinstance(td.dtypes.int64, td.dtypes.DType)
    np.testing.assert_array_equal(td.dtypes.cast(td.constant([1.7, 2.2]), td.dtypes.int64), [1, 2])


@pytest.mark.parametrize(
    ("value", "expected"),
    # TensorFlow 2.21's tf.as_dtype
    [
        (float, "float32"),
        (bool, "bool"),
        ("float32", "float32"),
        ("int64", "int64"),
        (np.float64, "float64"),
        (np.dtype("int8"), "int8"),
        (td.int64, "int64"),
        ("string", "object"),
        (object, "object"),
        ("bool", "bool"),
        ("double", "float64"),
        ("half", "float16"),
    ],
)
def test_as_dtype_names_what_tensorflow_names(value, expected):
    assert td.dtypes.as_dtype(value) == np.dtype(expected)


@pytest.mark.parametrize("value", [int, complex, str, bytes, None, "nonsense", "bfloat16"])
def test_as_dtype_refuses_what_tensorflow_refuses(value):
    # TensorFlow 2.21: TypeError "Cannot convert the argument `type_value`: <class 'int'> to a TensorFlow DType."
    with pytest.raises(TypeError, match=r"^Cannot convert the argument `type_value`: .* to a towerdist dtype\. Pass a dtype"):
        td.dtypes.as_dtype(value)
