"""TensorFlow's dtype names as numpy dtypes (``td.float32 == np.dtype("float32")``), and ``as_dtype``."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike

bool = np.dtype(np.bool_)  # noqa: A001  (TensorFlow's name)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
float16 = np.dtype(np.float16)
half = float16
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
double = float64
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)
string = np.dtype(np.object_)

_INT32 = np.iinfo(np.int32)

DType = np.dtype  # towerdist's dtypes are numpy's

# TensorFlow's names that numpy spells otherwise.
_NAMES = {"string": string, "half": half, "double": double, "bool": bool}
_UNSUPPORTED = ("bfloat16", "qint8", "qint16", "qint32", "quint8", "quint16", "resource", "variant")


def as_dtype(type_value: DTypeLike | None) -> np.dtype[Any]:
    """The dtype ``type_value`` names (``tf.as_dtype``): a dtype, a numpy type, a name, ``float`` or ``bool``.

    As in TensorFlow 2.21: ``float`` is float32, ``object`` is string, names are TensorFlow's
    (``"float32"``, ``"string"``, ``"half"``, ``"double"``) or numpy's.

    Raises:
      TypeError: ``type_value`` names no dtype towerdist has (``int``, ``str``, ``None``,
        ``"bfloat16"``, ``"nonsense"``).
    """
    if type_value is float:
        return float32
    if isinstance(type_value, str) and type_value in _NAMES:
        return _NAMES[type_value]
    # (identity, not ==: np.dtype("int64") == int is True)
    unsupported = isinstance(type_value, str) and type_value in _UNSUPPORTED
    rejected = type_value is None or any(type_value is t for t in (int, complex, str, bytes)) or unsupported
    if not rejected:
        try:
            found: np.dtype[Any] = np.dtype(type_value)
            return found
        except TypeError:
            pass
    raise TypeError(
        f"Cannot convert the argument `type_value`: {type_value!r} to a towerdist dtype. Pass a dtype "
        f"(td.float32, td.int64, ...), its name ('float32', 'int64', 'string') or a numpy type (np.float32)"
        + (f"; {type_value} is a TensorFlow dtype numpy does not have." if unsupported else ".")
    )


def python_dtype(array: np.ndarray) -> DTypeLike:
    """TensorFlow's dtype for an array built from Python values (float64 -> float32, ...)."""
    if array.dtype == np.float64:
        return np.float32
    if array.dtype == np.int64:
        if array.size == 0 or (array.min() >= _INT32.min and array.max() <= _INT32.max):
            return np.int32
    return array.dtype
