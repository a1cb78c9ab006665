"""The numpy backend: arrays in host memory, for every CPU device.

All logical CPU devices share host memory, so "moving" an array between them costs
nothing: :func:`to_device` returns the array itself and :func:`share` hands each
destination a distinct read-only object looking at one buffer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from towerdist._src.type_aliases import DTypeLike, HostArray, TensorLike

if TYPE_CHECKING:  # device names import this backend: only the type is named here
    from towerdist._src.device import DeviceSpec

name = "numpy"
xp = np


def owns(value: object) -> bool:
    """True if ``value`` is a numpy array or numpy scalar."""
    return isinstance(value, (np.ndarray, np.generic))


def asarray(value: TensorLike, dtype: DTypeLike | None = None, device: DeviceSpec | None = None) -> np.ndarray:
    """Converts ``value`` to a numpy array (no copy when it already is one of ``dtype``)."""
    del device  # host memory serves every CPU device
    return np.asarray(value, dtype=dtype)


def to_device(array: TensorLike, device: DeviceSpec | None) -> np.ndarray:
    """Returns ``array`` as a host array for ``device`` (copies only from another backend)."""
    del device
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "get") and not isinstance(array, np.generic):  # a cupy array
        return np.asarray(array.get())
    return np.asarray(array)


def to_device_of(value: TensorLike, array: HostArray) -> np.ndarray:
    """``value`` as a host array (``array`` is a host array: host memory serves every CPU)."""
    del array
    return to_device(value, None)


def copy(array: TensorLike, device: DeviceSpec | None = None) -> np.ndarray:
    """Returns a fresh, writable copy of ``array`` in host memory."""
    del device
    return np.array(to_device(array, None), copy=True)


def buffer_id(array: np.ndarray) -> int:
    """An id of the memory ``array`` looks at: views of one buffer have the same id."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return id(root)


def share(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Makes arrays that look at one buffer safe to hand to different replicas.

    ``arrays`` all view the same memory (possibly the same object several times). One
    array is returned as it is, still writable. Several become distinct read-only
    objects, so that a replica mutating its component in place gets an error instead of
    corrupting the others.
    """
    if len(arrays) == 1:
        return list(arrays)
    out: list[np.ndarray] = []
    seen: set[int] = set()
    for array in arrays:
        array.flags.writeable = False
        if id(array) in seen:
            array = array.view()
        seen.add(id(array))
        out.append(array)
    return out


def freeze(array: np.ndarray) -> np.ndarray:
    """A new read-only object looking at ``array``, which becomes read-only too.

    For buffers nobody writes in place any more (a variable's stored value).
    """
    base = np.asarray(array)  # numpy scalars become 0-d arrays
    base.flags.writeable = False  # so that no view of it can be made writable again
    view = base.view()
    return view


def empty(shape: Sequence[int], dtype: DTypeLike, device: DeviceSpec | None = None) -> np.ndarray:
    del device
    return np.empty(shape, dtype=dtype)


def zeros(shape: Sequence[int], dtype: DTypeLike, device: DeviceSpec | None = None) -> np.ndarray:
    del device
    return np.zeros(shape, dtype=dtype)


def flat(array: np.ndarray) -> np.ndarray:
    """A 1-D C-contiguous view of ``array`` (a copy only if it is not contiguous)."""
    return np.ascontiguousarray(array).reshape(-1)


def accumulate_into(out: np.ndarray, inputs: Sequence[np.ndarray], start: int, stop: int) -> None:
    """Writes ``sum(x[start:stop] for x in inputs)`` into ``out[start:stop]`` (1-D arrays).

    The sum is taken in input order. With a short range the partial sum stays in cache,
    so the memory traffic is one read of every input and one write of ``out``.
    ``out`` may have a wider dtype than the inputs (e.g. float64 for a mean of ints),
    in which case the sum is taken in the inputs' dtype first, as TensorFlow does.
    """
    target = out[start:stop]
    if len(inputs) == 1:
        target[...] = inputs[0][start:stop]
        return
    if out.dtype == inputs[0].dtype:
        np.add(inputs[0][start:stop], inputs[1][start:stop], out=target)
        for x in inputs[2:]:
            np.add(target, x[start:stop], out=target)
        return
    partial = inputs[0][start:stop] + inputs[1][start:stop]
    for x in inputs[2:]:
        np.add(partial, x[start:stop], out=partial)
    target[...] = partial


def divide_into(out: np.ndarray, divisor: int, start: int, stop: int) -> None:
    """Divides ``out[start:stop]`` by ``divisor`` in place (float and complex arrays)."""
    target = out[start:stop]
    np.true_divide(target, divisor, out=target)


def add_n(arrays: Sequence[TensorLike]) -> np.ndarray:
    """The element-wise sum of same-shaped arrays, taken in order, in a new array."""
    if len(arrays) == 1:
        return np.array(arrays[0], copy=True)
    # np.add on 0-d arrays returns a scalar; asarray makes it an array we can add into.
    total = np.asarray(np.add(arrays[0], arrays[1]))
    for x in arrays[2:]:
        np.add(total, x, out=total)
    return total


def add(array: HostArray, other: TensorLike, subtract: bool = False) -> np.ndarray:
    """A new array ``array + other`` (or ``-``) with ``array``'s dtype."""
    combine = np.subtract if subtract else np.add
    return np.asarray(combine(array, other, dtype=array.dtype))


def true_divide(array: TensorLike, divisor: TensorLike) -> np.ndarray:
    return np.asarray(np.true_divide(array, divisor))


def unique_rows_sum(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct indices sorted, values' rows summed per index)``; the rows of an index add in their order.

    The rows are ordered by sorting one int64 key per row, ``index << bits | position``
    (distinct keys: an unstable sort keeps each index's rows in their order, and numpy
    sorts integers with SIMD, far faster than a stable ``argsort``). The first row of each
    index is copied, then the second rows of every repeated index are added at once, then
    the third, ... (each pass writes each index at most once). Past ``_MAX_REPEAT_PASSES``
    repeats of one index, ``np.add.reduceat`` sums them instead (the same order).
    """
    count = indices.shape[0]
    if count == 0:
        return indices.astype(np.int64), values
    wide = indices.astype(np.int64, copy=False)
    shift = count.bit_length()  # key = index << shift | position: shifts and masks, no division
    if wide.min() >= 0 and int(wide.max()) < (1 << (62 - shift)):
        keys = (wide << shift) | np.arange(count)
        keys.sort()
        ordered = keys >> shift
        order = keys & ((1 << shift) - 1)
    else:  # negative indices (the caller reports them) or too large for the keys: a stable sort
        order = np.argsort(wide, kind="stable")
        ordered = wide[order]
    starts = np.empty(count, bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    first = np.flatnonzero(starts)
    if first.shape[0] == count:
        return ordered, np.take(values, order, axis=0)
    segment = np.cumsum(starts) - 1
    rank = np.arange(count) - first[segment]  # 0 for an index's first row, 1 for its second, ...
    repeats = int(rank.max())
    if repeats > _MAX_REPEAT_PASSES:
        # (dtype: numpy's reduceat sums small integers as int64; the sum keeps the values' dtype, as TF's does)
        return ordered[first], np.add.reduceat(np.take(values, order, axis=0), first, axis=0, dtype=values.dtype)
    summed = np.take(values, order[first], axis=0)
    for k in range(1, repeats + 1):
        at = np.flatnonzero(rank == k)
        summed[segment[at]] += np.take(values, order[at], axis=0)
    return ordered[first], summed


_MAX_REPEAT_PASSES = 16


def concat(arrays: Sequence[TensorLike], axis: int, device: DeviceSpec | None = None) -> np.ndarray:
    """The arrays joined along ``axis`` in host memory (``device``: any CPU)."""
    del device
    return np.concatenate([to_device(a, None) for a in arrays], axis=axis)


def split(array: np.ndarray, sizes: Sequence[int], axis: int = 0) -> list[np.ndarray]:
    """Splits ``array`` along ``axis`` into consecutive pieces of the given sizes (views)."""
    boundaries = np.cumsum(sizes)[:-1]
    return list(np.split(array, boundaries, axis=axis))


def synchronize(device: DeviceSpec | None = None) -> None:
    """Waits for pending work on ``device``; numpy work is synchronous, so nothing to do."""
    del device


_NO_DEVICE_SCOPE = contextlib.nullcontext()


def on_device(device: DeviceSpec | None) -> contextlib.AbstractContextManager[None]:
    """A context in which array operations run on ``device`` (nothing to do for host memory)."""
    del device
    return _NO_DEVICE_SCOPE


def on_array_device(array: HostArray) -> contextlib.AbstractContextManager[None]:
    """A context for kernels reading ``array``: nothing to do in host memory."""
    del array
    return _NO_DEVICE_SCOPE
