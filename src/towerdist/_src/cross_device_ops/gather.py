"""Concatenating the components of a distributed value along an axis (gather / all_gather)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import SupportsIndex

from towerdist._src import array_ops, backend
from towerdist._src.cross_device_ops.placement import mirror
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import unworded
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues

__all__ = ["axis_index", "gather_to"]


def axis_index(axis: SupportsIndex, ndim: int) -> int:
    """``axis`` as a non-negative int below ``ndim``.

    Raises (:func:`unworded`: the caller's API goes in front):
      TypeError: ``axis`` is not an integer.
      InvalidArgumentError: ``axis`` is out of range.
    """
    if isinstance(axis, bool) or not isinstance(axis, int) and not hasattr(axis, "__index__"):
        raise unworded(TypeError(f"needs an integer axis. Got axis={axis!r} of type {type(axis).__name__}."))
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise unworded(
            InvalidArgumentError(
                f"got axis={axis}, which is out of range for values of rank {ndim}; use an axis in [{-ndim}, {ndim}).",
                axis=axis,
            )
        )
    return int(axis % ndim)


def gather_to(value: DistributedValues, destinations: Sequence[DeviceSpec], axis: SupportsIndex) -> TensorLike:
    """Concatenates ``value``'s components in replica order along ``axis`` onto ``destinations``.

    Sizes along ``axis`` may differ between replicas; every other dimension and the dtype
    must agree.

    Raises (:func:`unworded`: the caller's API goes in front):
      InvalidArgumentError: scalar components, a bad axis, or mismatched shapes/dtypes.
    """
    arrays = [array_ops.as_array(c) for c in value.values]
    first = arrays[0]
    if first.ndim == 0:
        raise unworded(
            InvalidArgumentError(
                "cannot concatenate scalars: replica 0's value has shape (). Gather values with at "
                "least one dimension, e.g. reshape each to (1,) first.",
            )
        )
    axis = axis_index(axis, first.ndim)
    for replica_id, array in enumerate(arrays[1:], start=1):
        other_dims_differ = array.ndim != first.ndim or any(
            a != b for d, (a, b) in enumerate(zip(array.shape, first.shape)) if d != axis
        )
        if other_dims_differ or array.dtype != first.dtype:
            raise unworded(
                InvalidArgumentError(
                    f"along axis {axis} needs every replica's value to have the same dtype and the same "
                    f"size in every other dimension, but replica 0 has shape {tuple(first.shape)} and dtype "
                    f"{first.dtype} while replica {replica_id} has shape {tuple(array.shape)} and dtype "
                    f"{array.dtype}.",
                    replicas=(0, replica_id),
                    shapes=(tuple(first.shape), tuple(array.shape)),
                )
            )
    target = destinations[0]
    impl = backend.for_device(target)
    gathered = impl.concat([impl.to_device(a, target) for a in arrays], axis, target)
    return mirror([gathered] * len(destinations), destinations)
