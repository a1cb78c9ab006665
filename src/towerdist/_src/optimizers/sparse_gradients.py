"""Sparse gradients (``IndexedSlices``) on their way from the replicas to the update rule.

Keras 3 applies an ``IndexedSlices`` gradient with TensorFlow's sparse ops, and two of
their properties decide the numbers:

* A slice is never merged with another slice of the same row before a nonlinear op:
  ``square(g)`` squares each slice, and the squares of one row add up where they are
  scattered or densified. Adam's ``v``, RMSprop's ``velocity`` and Adagrad's
  ``accumulator`` so take the *sum of the squares* of a row's slices, not the square of
  the row's sum (a dense gradient of the same rows gives the latter).
* TensorFlow's ``MirroredStrategy`` sums ``IndexedSlices`` across replicas by
  concatenating the replicas' slices, so a row sent by two replicas is two slices, again
  squared one by one.

towerdist sums sparse gradients across replicas (and workers) with
``StrategyExtended._all_reduce_sparse``, which exchanges each row once (its canonical
form: each index once, sorted). To keep Keras's numbers, a rule that squares the gradient
sends, next to each slice, the slice's square (:func:`prepare`): the reduction then
sums both, row by row, and the rule receives a :class:`SparseRows` with the rows' sums and
the sums of their squares. The squares ride in the same ``IndexedSlices`` (stacked on a
new axis 1), so the indices are exchanged once; the values' bytes double.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import backend
from towerdist._src.indexed_slices import IndexedSlices, summed
from towerdist._src.type_aliases import ArrayModule, TensorLike

if TYPE_CHECKING:  # named in annotations only
    from towerdist._src.device import DeviceSpec

__all__ = ["SparseRows", "copy_into", "prepare", "rows_of", "scatter_rows"]


class SparseRows:
    """A variable's summed sparse gradient, ready for the update rule.

    ``indices`` are distinct and increasing (1-D, int64); ``values[i]`` is the sum of the
    slices of row ``indices[i]`` (in the variable's dtype); ``squares[i]`` the sum of their
    element-wise squares (None when the rule does not need them). All on one device.
    """

    __slots__ = ("indices", "squares", "values")

    def __init__(self, indices: TensorLike, values: TensorLike, squares: TensorLike | None) -> None:
        self.indices = indices
        self.values = values
        self.squares = squares

    def on(self, impl: ModuleType, device: DeviceSpec) -> SparseRows:
        """These rows on ``device`` (``impl`` its backend): the same object when they are there."""
        moved = [impl.to_device(a, device) if a is not None else None for a in (self.indices, self.values, self.squares)]
        if all(new is old for new, old in zip(moved, (self.indices, self.values, self.squares))):
            return self
        return SparseRows(*moved)

    def dense(self, xp: ArrayModule, like: TensorLike, out: TensorLike | None) -> TensorLike:
        """The dense gradient: the rows' sums at their rows, zeros elsewhere (into ``out`` if not None)."""
        return scatter_rows(xp, self.indices, self.values, like, out)

    def dense_squares(self, xp: ArrayModule, like: TensorLike, out: TensorLike | None) -> TensorLike:
        """The sums of the squared slices at their rows, zeros elsewhere (into ``out`` if not None)."""
        return scatter_rows(xp, self.indices, self.squares, like, out)

    def __repr__(self) -> str:
        return f"SparseRows(indices={self.indices!r}, values={self.values!r}, squares={self.squares!r})"


def scatter_rows(
    xp: ArrayModule, indices: TensorLike, rows: TensorLike, like: TensorLike, out: TensorLike | None
) -> TensorLike:
    """``rows`` at ``indices`` (distinct) and zeros elsewhere, shaped like ``like`` (into ``out`` if a buffer)."""
    if out is None:
        out = xp.zeros_like(like)
    else:
        out.fill(0)
    out[indices] = rows
    return out


def prepare(part: IndexedSlices, shape: tuple[int, ...], dtype: np.dtype[Any], squares: bool) -> IndexedSlices:
    """One replica's checked gradient as the ``IndexedSlices`` the reduction sums.

    Indices flattened to 1-D (a slice per index), values cast to the variable's ``dtype``
    (Keras casts the gradient first), ``dense_shape`` the variable's ``shape``. With
    ``squares``, every slice is followed by its element-wise square on a new axis 1
    (values of shape ``(n, 2, *row)``, dense shape ``(rows, 2, *row)``): see the module
    docstring.
    """
    values, indices = part.values, part.indices
    impl = backend.for_array(values)
    with impl.on_array_device(values):
        if indices.ndim != 1:
            indices = indices.reshape(-1)
            values = values.reshape((indices.shape[0], *shape[1:]))
        if values.dtype != dtype:
            values = values.astype(dtype)
        if not squares:
            if values is part.values and indices is part.indices and _same_shape(part, shape):
                return part
            return IndexedSlices(values, indices, shape)
        xp = impl.xp
        packed = xp.stack([values, values * values], axis=1)
    return IndexedSlices(packed, indices, (shape[0], 2, *shape[1:]))


def _same_shape(part: IndexedSlices, shape: tuple[int, ...]) -> bool:
    return part.dense_shape is not None and tuple(int(d) for d in part.dense_shape) == shape


def rows_of(reduced: IndexedSlices, squares: bool, canonical: bool) -> SparseRows:
    """The :class:`SparseRows` of a prepared gradient (``canonical``: a reduction's result, already summed)."""
    if not canonical:
        reduced = summed(reduced)
    values = reduced.values
    if squares:
        return SparseRows(reduced.indices, values[:, 0], values[:, 1])
    return SparseRows(reduced.indices, values, None)


def copy_into(xp: ArrayModule, array: TensorLike, out: TensorLike | None) -> TensorLike:
    """A writable copy of ``array``, in ``out`` when it is a buffer (a row-wise update starts from it).

    Reads hand out the published value as a snapshot, so an update never writes into it:
    a rule that changes a few rows copies the rest (a memory copy) and computes only those.
    """
    if out is None:
        return xp.array(array, copy=True)
    out[...] = array
    return out
