"""TensorFlow's dtype names as numpy dtypes (``td.float32 == np.dtype("float32")``)."""

from __future__ import annotations

from typing import Any

import numpy as np

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


def python_dtype(array: np.ndarray) -> Any:
    """TensorFlow's dtype for an array built from Python values (float64 -> float32, ...)."""
    if array.dtype == np.float64:
        return np.float32
    if array.dtype == np.int64:
        if array.size == 0 or (array.min() >= _INT32.min and array.max() <= _INT32.max):
            return np.int32
    return array.dtype
