"""Reference results computed with plain numpy, shared by the reduction tests."""

from __future__ import annotations

import functools

import numpy as np

import towerdist as td


def numpy_reduce(op: td.distribute.ReduceOp, arrays: list[np.ndarray]) -> np.ndarray:
    """TensorFlow's result: the element-wise sum in the inputs' dtype, taken in replica order;
    MEAN divides it by the replica count (integers give float64, reference 3.9, DESIGN 5)."""
    total = np.asarray(functools.reduce(np.add, arrays))
    if op is td.distribute.ReduceOp.SUM:
        return total
    out_dtype = np.float64 if total.dtype.kind in "iu" else total.dtype
    return np.asarray(np.true_divide(total, len(arrays), dtype=out_dtype))
