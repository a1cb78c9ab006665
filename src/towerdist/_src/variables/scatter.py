"""Scatter updates and sparse reads of a variable's rows (``v.scatter_add(slices)``, ``v.sparse_read(i)``).

A scatter is one more operation of the variables' write protocol: its ``op`` is a
:class:`Scatter` (the other ops are the method names ``"assign"``, ... and
``sliced.SliceAssign``), so it follows every rule of ``assign``: which components it writes
in which context, aggregation in replica context (the replicas' ``IndexedSlices`` are
reduced with ``extended.reduce_to``), all-or-nothing across components, and snapshots (the
new value is computed into a new array; an array read earlier never changes).

Rules, as TensorFlow's ops on the CPU:

* ``scatter_add/sub/mul/div/min/max``: each row of ``sparse_delta.values`` is applied to the
  row its index names, so a repeated index applies every one of its rows (added, multiplied,
  ... in their order).
* ``scatter_update``, ``scatter_nd_update``, ``batch_scatter_update``: a repeated index
  takes its *last* row (TensorFlow leaves the winner unspecified; its CPU kernel, like
  numpy's assignment, keeps the last one).
* Integer ``scatter_div`` truncates towards zero (C's division, TensorFlow's), and a zero
  divisor is an error.
* Every index is checked before anything is written: an index out of range raises
  ``InvalidArgumentError`` naming the index and the variable's shape, and the variable
  (every component of a distributed one) is unchanged.

The arithmetic runs on the variable's own array module (numpy, or cupy for a GPU
component), on that array's device.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from towerdist._src import backend
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import API, unworded
from towerdist._src.indexed_slices import IndexedSlices, summed_rows
from towerdist._src.type_aliases import Array, ArrayModule, TensorLike
from towerdist._src.values.distributed_values import DistributedValues

__all__ = [
    "ACCUMULATING",
    "BATCH",
    "ND",
    "REFUSED_WITH_REDUCTION",
    "SLICES",
    "Scatter",
    "gather_nd",
    "index_array",
    "require_slices",
    "sparse_read",
]

# The scatter methods, by the kind of argument they take.
SLICES = ("scatter_add", "scatter_sub", "scatter_mul", "scatter_div", "scatter_min", "scatter_max", "scatter_update")
ND = ("scatter_nd_add", "scatter_nd_sub", "scatter_nd_update")
BATCH = "batch_scatter_update"
# Repeated indices apply every row (the others keep the last row).
ACCUMULATING = frozenset({"scatter_add", "scatter_sub", "scatter_mul", "scatter_div", "scatter_min", "scatter_max"})
# A MirroredVariable refuses these with SUM or MEAN aggregation (TensorFlow's rule): the
# minimum, maximum or new value of a row cannot be combined from the replicas' rows by a sum.
REFUSED_WITH_REDUCTION = frozenset({"scatter_min", "scatter_max", "scatter_update"})


class Scatter:
    """The write ``variable.<method>(...)`` of rows, as an ``op`` of the write protocol.

    The value written is the ``IndexedSlices`` (``scatter_*``, ``batch_scatter_update``)
    or the updates of ``scatter_nd_*``, whose indices the op carries. Compares by identity,
    as :class:`~towerdist._src.variables.sliced.SliceAssign` does.
    """

    __slots__ = ("method", "nd_indices")

    def __init__(self, method: str, nd_indices: TensorLike = None) -> None:
        self.method = method
        self.nd_indices = nd_indices

    def __str__(self) -> str:
        return self.method

    def split(self, value: TensorLike) -> tuple[TensorLike, TensorLike]:
        """``(indices, updates)`` of the value written."""
        if self.method in ND:
            return self.nd_indices, value
        return value.indices, value.values

    def apply(self, new: TensorLike, indices: TensorLike, updates: TensorLike, name: str) -> None:
        """Applies the scatter to ``new`` (a private copy of the value), after :meth:`check`-ing everything.

        ``indices`` and ``updates`` are on ``new``'s device, ``updates`` of its dtype.

        Raises:
          InvalidArgumentError: an index out of range, updates of the wrong shape, or a zero
            integer divisor (nothing written: ``new`` is untouched).
        """
        shape = tuple(new.shape)
        xp = backend.for_array(new).xp
        if self.method in ND:
            rows, updates, view_shape = _nd_rows(xp, indices, updates, shape, name)
        elif self.method == BATCH:
            rows, updates, view_shape = _batch_rows(xp, indices, updates, shape, name)
        else:
            rows, updates, view_shape = _slice_rows(indices, updates, shape, name)
        if self.method == "scatter_div" and bool((updates == 0).any()):  # TF refuses for every dtype
            raise unworded(
                InvalidArgumentError(f"{API} on {name}: the updates must not contain 0. Nothing was written.")
            )
        view = new.reshape(view_shape)  # a view: ``new`` is a fresh contiguous array
        method = self.method.replace("_nd", "")
        if method in ("scatter_add", "scatter_sub"):
            unique, summed = summed_rows(rows, updates)
            if method == "scatter_add":
                view[unique] += summed
            else:
                view[unique] -= summed
        elif method in ACCUMULATING:
            _apply_in_rounds(xp, view, rows, updates, method)
        else:
            last, position = xp.unique(rows[::-1], return_index=True)
            view[last] = updates[::-1][position]


def _slice_rows(
    indices: TensorLike, updates: TensorLike, shape: tuple[int, ...], name: str
) -> tuple[TensorLike, TensorLike, tuple[int, ...]]:
    """Rows and updates of ``scatter_*``: one update of shape ``shape[1:]`` per index."""
    if not shape:
        raise unworded(
            InvalidArgumentError(f"{API} on {name}: the variable is a scalar; scatter updates need rows (rank >= 1).")
        )
    expected = (*indices.shape, *shape[1:])
    if tuple(updates.shape) != expected:
        raise unworded(
            InvalidArgumentError(
                f"{API} on {name}: the updates must have shape indices.shape + variable.shape[1:] = {expected}; got "
                f"updates of shape {tuple(updates.shape)} (indices {tuple(indices.shape)}, variable {shape}). "
                f"Nothing was written."
            )
        )
    rows = indices.reshape(-1)
    _check_rows(indices, rows, shape[0], shape, name)
    return rows, updates.reshape((rows.shape[0], *shape[1:])), shape


def _nd_rows(
    xp: ArrayModule, indices: TensorLike, updates: TensorLike, shape: tuple[int, ...], name: str
) -> tuple[TensorLike, TensorLike, tuple[int, ...]]:
    """Rows of ``scatter_nd_*``: the last axis of ``indices`` addresses the first ``K`` dimensions."""
    if indices.ndim == 0 or indices.shape[-1] > len(shape) or indices.shape[-1] == 0:
        raise unworded(
            InvalidArgumentError(
                f"{API} on {name}: indices must have shape [..., K] with 1 <= K <= the variable's rank "
                f"{len(shape)}; got indices of shape {tuple(indices.shape)}. Nothing was written."
            )
        )
    k = int(indices.shape[-1])
    expected = (*indices.shape[:-1], *shape[k:])
    if tuple(updates.shape) != expected:
        raise unworded(
            InvalidArgumentError(
                f"{API} on {name}: the updates must have shape indices.shape[:-1] + variable.shape[K:] = {expected}; "
                f"got updates of shape {tuple(updates.shape)} (indices {tuple(indices.shape)}, variable {shape}). "
                f"Nothing was written."
            )
        )
    flat = indices.reshape(-1, k)
    bounds = xp.asarray(np.asarray(shape[:k], dtype=np.int64))
    bad = xp.flatnonzero(((flat < 0) | (flat >= bounds)).any(axis=1))
    if bad.size:
        position = int(bad[0])
        label = "".join(f"[{int(i)}]" for i in np.unravel_index(position, tuple(indices.shape[:-1])))
        raise unworded(
            InvalidArgumentError(
                f"{API} on {name}: indices{label} = {[int(i) for i in flat[position]]} does not index into shape "
                f"{list(shape)} ({int(bad.size)} of {int(flat.shape[0])} indices are out of range). Nothing was written."
            )
        )
    strides = np.cumprod((1, *shape[k - 1 : 0 : -1]))[::-1].astype(np.int64)  # row-major strides of shape[:k]
    rows = (flat * xp.asarray(strides)).sum(axis=1) if flat.shape[0] else flat.reshape(-1)
    rows_total = int(np.prod(shape[:k], dtype=np.int64))
    return rows, updates.reshape((flat.shape[0], *shape[k:])), (rows_total, *shape[k:])


def _batch_rows(
    xp: ArrayModule, indices: TensorLike, updates: TensorLike, shape: tuple[int, ...], name: str
) -> tuple[TensorLike, TensorLike, tuple[int, ...]]:
    """Rows of ``batch_scatter_update``: ``indices[b..., i]`` names a row of the variable's batch ``b...``."""
    batch = tuple(indices.shape[:-1])
    if len(shape) < indices.ndim or tuple(shape[: len(batch)]) != batch:
        raise unworded(
            InvalidArgumentError(
                f"{API} on {name}: the indices' batch dimensions {batch} (all but the last) must be the variable's "
                f"first dimensions; the variable has shape {shape}. Nothing was written."
            )
        )
    depth = shape[len(batch)]
    expected = (*indices.shape, *shape[indices.ndim :])
    if tuple(updates.shape) != expected:
        raise unworded(
            InvalidArgumentError(
                f"{API} on {name}: the updates must have shape indices.shape + variable.shape[indices.ndim:] = "
                f"{expected}; got updates of shape {tuple(updates.shape)} (indices {tuple(indices.shape)}, variable "
                f"{shape}). Nothing was written."
            )
        )
    count = int(np.prod(batch, dtype=np.int64))
    per_batch = int(indices.shape[-1])
    _check_rows(indices, indices.reshape(-1), depth, shape, name)
    offsets = xp.arange(count, dtype=np.int64).reshape(count, 1) * depth
    rows = (indices.reshape(count, per_batch).astype(np.int64) + offsets).reshape(-1)
    tail = shape[indices.ndim :]
    return rows, updates.reshape((count * per_batch, *tail)), (count * depth, *tail)


def _check_rows(indices: Array, rows: TensorLike, limit: int, shape: tuple[int, ...], name: str, written: bool = True) -> None:
    """Raises ``InvalidArgumentError`` naming the first of ``rows`` (``indices`` flattened) outside ``[0, limit)``."""
    if rows.shape[0] == 0:
        return
    xp = backend.for_array(rows).xp
    bad = xp.flatnonzero((rows < 0) | (rows >= limit))
    if bad.size:
        position = int(bad[0])
        label = "".join(f"[{int(i)}]" for i in np.unravel_index(position, tuple(indices.shape)))
        ending = " Nothing was written." if written else ""
        raise unworded(
            InvalidArgumentError(
                f"{API} on {name}: indices{label} = {int(rows[position])} is not in [0, {limit}): the variable has "
                f"shape {shape} ({int(bad.size)} of {int(rows.shape[0])} indices are out of range).{ending}"
            )
        )


def _apply_in_rounds(xp: ArrayModule, view: TensorLike, rows: TensorLike, updates: TensorLike, method: str) -> None:
    """Applies mul/div/min/max row by row, a repeated index once per round, in the order of the rows.

    Each round takes the first remaining occurrence of every index, so the rows of one index
    apply in their order and no assignment has two writers (cupy's are unordered).
    """
    while rows.shape[0]:
        unique, first = xp.unique(rows, return_index=True)
        view[unique] = _combine(xp, view[unique], updates[first], method)
        if unique.shape[0] == rows.shape[0]:
            return
        rest = xp.ones(rows.shape[0], dtype=bool)
        rest[first] = False
        rows, updates = rows[rest], updates[rest]


def _combine(xp: ArrayModule, old: TensorLike, update: TensorLike, method: str) -> TensorLike:
    if method == "scatter_mul":
        return old * update
    if method == "scatter_min":
        return xp.minimum(old, update)
    if method == "scatter_max":
        return xp.maximum(old, update)
    if old.dtype.kind in "iu":  # C's division: truncated towards zero, as TensorFlow's
        quotient = old // update
        return quotient + ((old - quotient * update != 0) & ((old < 0) != (update < 0)))
    return (old / update).astype(old.dtype)  # (a zero divisor was refused before anything was written)


def require_slices(sparse_delta: object, cross_replica: bool) -> None:
    """Raises ``TypeError`` unless ``sparse_delta`` is an ``IndexedSlices`` (in cross-replica context,
    also a distributed value of one ``IndexedSlices`` per replica)."""
    parts = getattr(sparse_delta, "values", None) if cross_replica and _is_distributed(sparse_delta) else None
    if isinstance(sparse_delta, IndexedSlices) or (parts and all(isinstance(p, IndexedSlices) for p in parts)):
        return
    raise unworded(
        TypeError(
            f"takes sparse_delta as a td.IndexedSlices (the rows to write and their indices). Got sparse_delta="
            f"{sparse_delta!r} of type {type(sparse_delta).__name__}; wrap the rows as "
            f"td.IndexedSlices(values, indices), or use assign_add() for a dense delta."
        )
    )


def _is_distributed(value: object) -> bool:
    return isinstance(value, DistributedValues) and not getattr(value, "_is_distributed_variable", False)


# --- sparse reads ------------------------------------------------------------------------------


def sparse_read(value: TensorLike, indices: TensorLike, name: str) -> TensorLike:
    """The rows ``indices`` of ``value`` (a new array, on ``value``'s device): ``value[indices]``.

    Raises:
      InvalidArgumentError: an index is out of range or not an integer.
    """
    impl = backend.for_array(value)
    with impl.on_array_device(value):
        index = index_array(impl, value, indices, name)
        if not value.shape:
            raise unworded(InvalidArgumentError(f"{API} on {name}: the variable is a scalar; it has no rows to read."))
        _check_rows(index, index.reshape(-1), int(value.shape[0]), tuple(value.shape), name, written=False)
        return value[index]


def gather_nd(value: TensorLike, indices: TensorLike, name: str) -> TensorLike:
    """The elements or slices of ``value`` that the last axis of ``indices`` addresses (``tf.gather_nd``).

    Raises:
      InvalidArgumentError: an index is out of range, or ``indices``' last axis is longer than the rank.
    """
    impl = backend.for_array(value)
    shape = tuple(value.shape)
    with impl.on_array_device(value):
        index = index_array(impl, value, indices, name)
        if index.ndim == 0 or index.shape[-1] > len(shape):
            raise unworded(
                InvalidArgumentError(
                    f"{API} on {name}: indices must have shape [..., K] with K <= the variable's rank {len(shape)}; "
                    f"got indices of shape {tuple(index.shape)}."
                )
            )
        k = int(index.shape[-1])
        xp = impl.xp
        flat = index.reshape(-1, k)
        bad = xp.flatnonzero(((flat < 0) | (flat >= xp.asarray(np.asarray(shape[:k], dtype=np.int64)))).any(axis=1))
        if bad.size:
            position = int(bad[0])
            label = "".join(f"[{int(i)}]" for i in np.unravel_index(position, tuple(index.shape[:-1])))
            raise unworded(
                InvalidArgumentError(
                    f"{API} on {name}: indices{label} = {[int(i) for i in flat[position]]} does not index into the "
                    f"variable's shape {list(shape)}."
                )
            )
        return value[tuple(index[..., j] for j in range(k))]


def index_array(impl: ModuleType, value: TensorLike, indices: TensorLike, name: str) -> TensorLike:
    """``indices`` as an integer array on ``value``'s device (``impl``: that device's backend module)."""
    if hasattr(indices, "_towerdist_value"):
        indices = indices._towerdist_value()
    array = indices if backend.is_array(indices) and not np.isscalar(indices) else np.asarray(indices)
    if array.dtype.kind not in "iu":
        raise unworded(
            InvalidArgumentError(f"{API} on {name}: indices must be integers; got dtype {array.dtype} ({indices!r}).")
        )
    return impl.to_device_of(array, value)
