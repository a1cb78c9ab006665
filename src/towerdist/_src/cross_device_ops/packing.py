"""Tensor fusion: reduce many small values as a few large packs.

``batch_reduce`` of K values costs K reductions; when the values are small, fixed costs
dominate. Packing flattens the values of one dtype, concatenates them into one buffer
per replica, reduces the buffer once (or in ``num_packs`` pieces) and hands back views
of the result. Mixed dtypes are packed per dtype.

Two ways to cut packs, both TensorFlow's:

* :func:`split_ranges` (``num_packs``): the concatenation of T elements is cut into
  ``num_packs`` consecutive ranges of ``T // num_packs`` elements, the last one taking
  the remainder (``HierarchicalCopyAllReduce``/``NcclAllReduce``).
* :func:`group_by_size` (``CommunicationOptions.bytes_per_pack``): values are taken in
  order and a new pack starts once the current one holds more than ``bytes_per_pack``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from towerdist._src.type_aliases import TensorLike

if TYPE_CHECKING:
    from towerdist._src.device import DeviceSpec

__all__ = ["group_by_dtype", "group_by_size", "pack", "split_ranges", "unpack"]


def group_by_dtype(dtypes: Sequence[Any]) -> list[list[int]]:
    """Indices of ``dtypes`` grouped by dtype, groups in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for index, dtype in enumerate(dtypes):
        groups.setdefault(dtype, []).append(index)
    return list(groups.values())


def split_ranges(total: int, num_packs: int) -> list[tuple[int, int]]:
    """Cuts ``range(total)`` into ``num_packs`` consecutive ``(start, stop)`` ranges.

    Every range has ``total // num_packs`` elements except the last, which also takes
    the remainder (``split_ranges(11, 3) == [(0, 3), (3, 6), (6, 11)]``). Empty ranges
    are dropped, so a small total gives fewer packs.

    Raises:
      ValueError: ``num_packs`` is not positive.
    """
    if num_packs <= 0:
        raise ValueError(f"num_packs must be greater than zero. Got num_packs={num_packs}.")
    size = total // num_packs
    bounds = [(k * size, (k + 1) * size) for k in range(num_packs - 1)]
    bounds.append(((num_packs - 1) * size, total))
    return [(start, stop) for start, stop in bounds if stop > start]


def group_by_size(nbytes: Sequence[int], bytes_per_pack: int) -> list[list[int]]:
    """Groups consecutive indices so that each group holds at least ``bytes_per_pack`` bytes.

    A group is closed as soon as its size exceeds ``bytes_per_pack``; the last group may be
    smaller. ``bytes_per_pack == 0`` puts everything in one group.
    """
    if bytes_per_pack <= 0:
        return [list(range(len(nbytes)))] if nbytes else []
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index, count in enumerate(nbytes):
        current.append(index)
        size += count
        if size > bytes_per_pack:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def pack(impl: ModuleType, arrays: Sequence[TensorLike], device: DeviceSpec | None = None) -> TensorLike:
    """One flat buffer on ``device`` holding ``arrays`` one after another (same dtype, same backend)."""
    return impl.concat([impl.flat(a) for a in arrays], 0, device)


def unpack(impl: ModuleType, buffer: TensorLike, shapes: Sequence[tuple[int, ...]]) -> list[TensorLike]:
    """Views of ``buffer`` with the given shapes, the inverse of :func:`pack`."""
    sizes = [_size(shape) for shape in shapes]
    pieces = impl.split(buffer, sizes, 0) if len(sizes) > 1 else [buffer]
    return [piece.reshape(shape) for piece, shape in zip(pieces, shapes)]


def _size(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
