"""``td.IndexedSlices``: a sparse representation of a dense array by its rows.

The gradient of an embedding lookup touches a few rows of a large table; TensorFlow
represents it as an ``IndexedSlices``: ``values[i]`` is a slice of the dense array at row
``indices[i]``, and the dense value is the sum of the slices at each row (an index may
appear several times). towerdist reduces them across replicas and workers without
densifying (``cross_device_ops/sparse.py``), variables take them through ``scatter_*``,
and optimizers apply them row by row.

Here: the type, its conversion to a dense array (``td.convert_to_tensor``), and
:func:`summed`, the canonical form (each index once, indices sorted) that reductions
exchange.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from towerdist._src import array_ops, backend, nest
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.type_aliases import DTypeLike, Nest, TensorLike

__all__ = ["IndexedSlices", "check_reducible", "densify", "is_canonical", "refuse_in_gather", "summed"]


_GRAPH_MEMBERS = frozenset({"op", "graph", "consumers"})


class IndexedSlices:
    """A sparse representation of a dense array: some of its rows (``tf.IndexedSlices``).

    ``values[i]`` is the slice of the dense array at ``indices[i]``; the dense value is
    ``zeros(dense_shape)`` with each slice added at its index (repeated indices add up).
    Arrays stay where they are (numpy on the host, cupy on a GPU); ``dense_shape`` is kept
    on the host as an integer array, or None when unknown.

    An ``IndexedSlices`` is one leaf in nested structures (it is never flattened into its
    three arrays), so ``ReplicaContext.all_reduce`` and ``Strategy.reduce`` take it as one
    value.

    Args:
      values: an array whose first dimensions match ``indices``.
      indices: an integer array of row numbers (1-D for gradients).
      dense_shape: the dense array's shape (a list, tuple or integer array), or None.

    Example:
      >>> grad = td.IndexedSlices(np.ones((2, 3), np.float32), np.array([0, 4]), dense_shape=[10, 3])
      >>> td.convert_to_tensor(grad).shape
      (10, 3)

    Raises:
      InvalidArgumentError: ``indices`` is not an integer array, ``values`` does not start
        with ``indices``' shape, or ``dense_shape`` disagrees with ``values``' rows.
    """

    __slots__ = ("_dense_shape", "_indices", "_values")

    def __init__(self, values: TensorLike, indices: TensorLike, dense_shape: TensorLike | None = None) -> None:
        values = _as_array(values)
        indices = _as_array(indices)
        if indices.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"IndexedSlices: indices must be integers; got dtype {indices.dtype} (indices={indices!r})."
            )
        if tuple(values.shape[: indices.ndim]) != tuple(indices.shape):
            raise InvalidArgumentError(
                f"IndexedSlices: values must have one slice per index: indices have shape {tuple(indices.shape)} "
                f"but values have shape {tuple(values.shape)} (their leading dimensions must be "
                f"{tuple(indices.shape)})."
            )
        shape = None if dense_shape is None else _dense_shape(dense_shape)
        if shape is not None and indices.ndim == 1 and tuple(int(d) for d in shape[1:]) != tuple(values.shape[1:]):
            raise InvalidArgumentError(
                f"IndexedSlices: dense_shape {tuple(int(d) for d in shape)} does not match the rows of values, of "
                f"shape {tuple(values.shape[1:])} each (values have shape {tuple(values.shape)}); the dense "
                f"array's dimensions after the first must be the rows' shape."
            )
        self._values = values
        self._indices = indices
        self._dense_shape = shape

    @property
    def values(self) -> TensorLike:
        """The slices: ``values[i]`` is the dense array's row ``indices[i]`` (one of its parts)."""
        return self._values

    @property
    def indices(self) -> TensorLike:
        """The row numbers of the slices (integers; repeats allowed)."""
        return self._indices

    @property
    def dense_shape(self) -> np.ndarray | None:
        """The dense array's shape as a host integer array, or None when unknown."""
        return self._dense_shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype of ``values`` (and of the dense array)."""
        return self._values.dtype  # type: ignore[no-any-return]

    @property
    def shape(self) -> tuple[int | None, ...]:
        """The dense array's shape; the first dimension is None when ``dense_shape`` is unknown."""
        if self._dense_shape is None:
            return (None, *tuple(self._values.shape[self._indices.ndim :]))
        return tuple(int(d) for d in self._dense_shape)

    @property
    def device(self) -> str:
        """The device of ``values``, as TensorFlow names it (``/job:localhost/replica:0/task:0/device:GPU:1``)."""
        if backend.for_array(self._values) is backend.host():
            return "/job:localhost/replica:0/task:0/device:CPU:0"
        return f"/job:localhost/replica:0/task:0/device:GPU:{int(self._values.device.id)}"

    @property
    def name(self) -> str:
        """The name of ``values`` (arrays carry none: an empty string)."""
        return ""

    def __getattr__(self, name: str) -> Any:
        # Only called for names the class lacks: TensorFlow's graph members get a message that says why.
        if name in _GRAPH_MEMBERS:
            raise AttributeError(
                f"IndexedSlices.{name} is a member of TensorFlow graphs, and towerdist is eager: there is no graph, "
                f"operation or consumer. Use values, indices and dense_shape."
            )
        raise AttributeError(f"'IndexedSlices' object has no attribute {name!r}")

    def __neg__(self) -> IndexedSlices:
        with backend.for_array(self._values).on_array_device(self._values):  # on the values' GPU, whichever is current
            return IndexedSlices(-self._values, self._indices, self._dense_shape)

    def __str__(self) -> str:
        shape = "" if self._dense_shape is None else f", dense_shape={self._dense_shape!r}"
        return f"IndexedSlices(indices={self._indices!r}, values={self._values!r}{shape})"

    __repr__ = __str__

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        dense = densify(self, "np.asarray()")
        array = np.asarray(backend.host().to_device(dense, None))
        return array if dtype is None else array.astype(dtype)

    def _towerdist_dense(self) -> TensorLike:
        return densify(self, "td.convert_to_tensor()")


def _as_array(value: TensorLike) -> TensorLike:
    if backend.is_array(value) and not np.isscalar(value):
        return value
    if hasattr(value, "_towerdist_value") or hasattr(value, "_values"):
        return array_ops.as_array(value)  # a variable or distributed value: its array here
    return np.asarray(value)


def _dense_shape(dense_shape: TensorLike) -> np.ndarray:
    shape = np.asarray(backend.host().to_device(dense_shape, None) if backend.is_array(dense_shape) else dense_shape)
    if shape.ndim != 1 or shape.dtype.kind not in "iu" and shape.size:
        raise InvalidArgumentError(
            f"IndexedSlices: dense_shape must be a list of integers (the dense array's shape); got {dense_shape!r}."
        )
    if np.any(shape < 0):
        raise InvalidArgumentError(f"IndexedSlices: dense_shape {shape.tolist()} has a negative dimension.")
    shape = shape.astype(shape.dtype if shape.dtype.kind in "iu" else np.int64, copy=True)
    shape.flags.writeable = False
    return shape


def densify(slices: IndexedSlices, api: str = "td.convert_to_tensor()") -> TensorLike:
    """The dense array ``slices`` stands for (repeated indices summed), on the device of its values.

    Raises:
      ValueError: ``dense_shape`` is unknown (TensorFlow's error).
      InvalidArgumentError: an index is out of range for ``dense_shape``.
    """
    if slices.dense_shape is None:
        raise ValueError(f"Tensor conversion requested for IndexedSlices without dense_shape ({api}): {slices}")
    shape = tuple(int(d) for d in slices.dense_shape)
    values, indices = slices.values, slices.indices
    check_indices(indices, shape, api)
    impl = backend.for_array(values)
    with impl.on_array_device(values):
        dense = impl.zeros(shape, values.dtype, None)
        if indices.ndim == 1:
            unique, rows = summed_rows(indices, values)
            dense[unique] = rows
        else:  # one slice per element of a multi-dimensional index array: its rows, flattened
            flat = indices.reshape(-1)
            unique, rows = summed_rows(flat, values.reshape((flat.shape[0], *values.shape[indices.ndim :])))
            dense[unique] = rows
    return dense


def check_indices(indices: TensorLike, shape: tuple[int, ...], api: str) -> None:
    """Raises ``InvalidArgumentError`` naming the first index outside ``[0, shape[0])``."""
    rows = shape[0] if shape else 0
    if indices.size == 0:
        return
    impl = backend.for_array(indices)
    with impl.on_array_device(indices):
        flat = indices.reshape(-1)
        bad = impl.xp.flatnonzero((flat < 0) | (flat >= rows))
        count = int(bad.size)
        position = int(bad[0]) if count else 0
        value = int(flat[position]) if count else 0
    if count:
        where = np.unravel_index(position, tuple(indices.shape))
        label = "".join(f"[{int(i)}]" for i in where)
        raise InvalidArgumentError(
            f"{api}: indices{label} = {value} is not in [0, {rows}): the array has shape {shape} ({count} of "
            f"{int(indices.size)} indices are out of range). Nothing was written."
        )


def summed_rows(indices: TensorLike, values: TensorLike) -> tuple[TensorLike, TensorLike]:
    """``(distinct indices in increasing order, the rows of values summed per index)``.

    The rows of one index are summed in their order in ``values``. Indices already strictly
    increasing are returned as they are (no copy).
    """
    impl = backend.for_array(values)
    if is_canonical(indices):
        return indices, values
    return impl.unique_rows_sum(indices, values)  # type: ignore[no-any-return]


def is_canonical(indices: TensorLike) -> bool:
    """Whether ``indices`` (1-D) are strictly increasing: each index once, sorted."""
    if indices.shape[0] < 2:
        return True
    with backend.for_array(indices).on_array_device(indices):
        return bool((indices[1:] > indices[:-1]).all())


def summed(slices: IndexedSlices) -> IndexedSlices:
    """``slices`` in canonical form: each index once, in increasing order, duplicates summed.

    The dense value is unchanged. Indices become int64 (the dtype reductions exchange).
    """
    indices, values = summed_rows(slices.indices, slices.values)
    if indices.dtype != np.int64:
        with backend.for_array(indices).on_array_device(indices):
            indices = indices.astype(np.int64)
    if indices is slices.indices and values is slices.values:
        return slices
    return IndexedSlices(values, indices, slices.dense_shape)


def check_reducible(components: Sequence[IndexedSlices], api: str, ids: Sequence[int] | None = None) -> None:
    """Checks that the replicas' ``IndexedSlices`` can be summed: 1-D indices, one dense shape and dtype.

    Slices without a ``dense_shape`` may be summed with others without one, of the same
    row shape; the sum then has no ``dense_shape`` either.

    ``ids`` are the replicas' numbers in the message (by default their positions).

    Raises:
      InvalidArgumentError: a mismatch, naming both replicas and their dense shapes or dtypes.
    """
    ids = list(range(len(components))) if ids is None else list(ids)
    first = components[0]
    for replica, item in zip(ids, components):
        if item.indices.ndim != 1:
            raise InvalidArgumentError(
                f"{api}: replica {replica}'s IndexedSlices has indices of shape {tuple(item.indices.shape)}; "
                f"reducing across replicas needs 1-D indices (one row number per slice)."
            )
    # Slices without a dense_shape are reduced too (as TensorFlow does): their rows must agree.
    shapes = [_described_shape(item) for item in components]
    for replica, item, shape in zip(ids[1:], components[1:], shapes[1:]):
        if shape != shapes[0] or item.dtype != first.dtype:
            raise InvalidArgumentError(
                f"{api}: the replicas' IndexedSlices differ: replica {ids[0]} has dense_shape {shapes[0]} and "
                f"dtype {first.dtype}, replica {replica} has dense_shape {shape} and dtype {item.dtype}. Every "
                f"replica must contribute slices of the same dense array (TensorFlow would keep the first "
                f"replica's dense_shape).",
                replicas=(ids[0], replica),
                shapes=(tuple(shapes[0]), tuple(shape)),
            )
    if first.dtype.kind not in "iufc":
        raise InvalidArgumentError(
            f"{api}: reducing IndexedSlices needs numeric values; got dtype {first.dtype}. Cast the values first."
        )


def _described_shape(item: IndexedSlices) -> list[int | None]:
    """``dense_shape`` as a list, or ``[None, *row shape]`` when unknown (compared across replicas)."""
    if item.dense_shape is None:
        return [None, *(int(d) for d in item.values.shape[1:])]
    return [int(d) for d in item.dense_shape]


def refuse_in_gather(value: Nest, api: str) -> None:
    """Raises TensorFlow's ``NotImplementedError`` if ``value`` (a nest) holds a bare ``IndexedSlices``.

    A ``PerReplica`` of them is not refused: TensorFlow densifies its components and
    concatenates those.
    """
    leaves = [value] if isinstance(value, IndexedSlices) else nest.flatten(value)[0]
    if any(isinstance(leaf, IndexedSlices) for leaf in leaves):
        verb = api.split(".")[-1].rstrip("()")
        raise NotImplementedError(
            f"{verb} does not support IndexedSlices ({api}). Reduce them with all_reduce(), or gather "
            f"td.convert_to_tensor() of each (dense) or their .values and .indices separately."
        )
