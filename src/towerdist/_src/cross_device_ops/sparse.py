"""Reducing ``IndexedSlices`` across replicas without densifying them.

The replicas' rows are summed in one pass over all of them (``unique_rows_sum`` of their
concatenation: one SIMD sort of ``index << bits | position`` keys, then a copy of each
index's first row and one addition per repeat), each index's rows in replica order, so
each row's sum is the one a dense all-reduce of the densified gradients gives, bit for
bit. Only the distinct rows come out, sorted (the canonical form). On the host every
replica's rows are read where they are (the all-gather is in place, in shared memory); on
GPUs each destination copies the other replicas' rows (peer copies) and merges them.
Summing each replica's own repeats first, on its thread, was measured slower: two passes
over the rows instead of one.

When the replicas' rows, all in canonical form already, add up to more than
``DENSE_FRACTION`` times the table's rows, an accumulation into a dense table (every row)
replaces the sort; the result is then taken back to the rows touched. Either way the
result is the same ``IndexedSlices`` (the union of the rows, sorted), and the timeline says
which path ran (``sparse all-reduce (rows)`` or ``(dense)``). Across workers the same
choice is made by bytes (``multi_worker/workers.py``: ``Workers.sparse_sum``).

TensorFlow concatenates the replicas' slices instead (repeats kept); the densified value
is identical (DESIGN §10.22, ``docs/concepts.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from towerdist._src import backend, profiler
from towerdist._src.device import DeviceSpec
from towerdist._src.indexed_slices import IndexedSlices, is_canonical, summed
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import ArrayModule
from towerdist._src.values.distributed_values import DistributedValues, Mirrored

__all__ = [
    "DENSE_FRACTION",
    "all_reduce_placed",
    "all_reduce_sparse",
    "combine",
    "copied",
    "is_sparse",
    "mirror_slices",
    "reduce_sparse",
    "to_device",
    "with_sparse_apart",
]

# The merge accumulates into a dense table (every row) when the replicas' rows add up to
# at least this many times the table's rows. Measured on a 2-core AMD EPYC VM, 100,000 x 64
# float32, 2 and 4 replicas at 1 % to 100 % density: the row merge was faster up to 2 x 60 %
# of the table, the dense table from 4 x 60 % on (both then slower than a dense all-reduce
# of gradients that were dense to begin with: benchmarks/sparse.py).
DENSE_FRACTION = 2.0


def is_sparse(value: object) -> bool:
    """Whether ``value`` (a distributed value or a component) holds ``IndexedSlices``."""
    if isinstance(value, DistributedValues):
        return bool(value.values) and isinstance(value.values[0], IndexedSlices)
    return isinstance(value, IndexedSlices)


def to_device(slices: IndexedSlices, device: DeviceSpec | None) -> IndexedSlices:
    """``slices`` with its arrays on ``device`` (the host for None or a CPU)."""
    impl = backend.host() if device is None else backend.for_device(device)
    values = impl.to_device(slices.values, device)
    indices = impl.to_device(slices.indices, device)
    if values is slices.values and indices is slices.indices:
        return slices
    return IndexedSlices(values, indices, slices.dense_shape)


def combine(reduce_op: ReduceOp, parts: Sequence[IndexedSlices], count: int, device: DeviceSpec | None) -> IndexedSlices:
    """The sum (or mean over ``count`` replicas) of ``parts``, on ``device``, in canonical form.

    ``parts`` are in replica order, of one dense shape and dtype (checked by the caller),
    in canonical form or not: their rows are sorted and summed in one pass over all of them
    (``unique_rows_sum`` of the concatenation: each index's rows add in replica order, and
    within a replica in their order). The result never shares memory with a part.
    """
    on_device = [to_device(part, device) for part in parts]
    first = on_device[0]
    impl = backend.for_array(first.values)
    xp = impl.xp
    rows = int(first.shape[0] or 0)
    touched = sum(int(part.indices.shape[0]) for part in on_device)
    dense = touched >= DENSE_FRACTION * rows > 0 and all(is_canonical(part.indices) for part in on_device)
    with profiler.Span(
        f"sparse all-reduce ({'dense' if dense else 'rows'})",
        {"replicas": len(parts), "rows_sent": touched, "table_rows": rows},
    ):
        with impl.on_array_device(first.values):
            if dense:
                indices, values = _merge_dense(xp, on_device, rows)
            else:
                indices, values = impl.unique_rows_sum(
                    xp.concatenate([part.indices for part in on_device]),
                    xp.concatenate([part.values for part in on_device]),
                )
                if len(on_device) == 1 and values is first.values:
                    indices, values = xp.array(indices, copy=True), xp.array(values, copy=True)
            if reduce_op is ReduceOp.MEAN:
                values = impl.true_divide(values, count)
    return IndexedSlices(values, indices, first.dense_shape)


def _merge_dense(xp: ArrayModule, parts: Sequence[IndexedSlices], rows: int) -> tuple[Any, Any]:
    """The parts accumulated into a zeroed table of every row, then taken back to the rows touched.

    The table comes from ``_tables`` (fresh memory would page-fault on every row, which
    costs more than the merge) and goes back zeroed: only its touched rows are cleared.
    """
    first = parts[0]
    key = (rows, tuple(first.values.shape[1:]), first.dtype.str, backend.for_array(first.values).name)
    table = _tables.take(key) if xp is np else None
    if table is None:
        table = xp.zeros((rows, *first.values.shape[1:]), first.dtype)
    touched = xp.zeros(rows, bool)
    for part in parts:
        if part.indices.shape[0] == rows:
            table += part.values  # canonical and complete: row i is at position i
        else:
            table[part.indices] += part.values  # canonical: each index once per part
        touched[part.indices] = True
    union = xp.flatnonzero(touched).astype(np.int64)
    if union.shape[0] == rows:
        return union, table  # every row: the table is the result (and leaves the pool)
    values = xp.take(table, union, axis=0)
    if xp is np:
        table[union] = 0
        _tables.give(key, table)
    return union, values


class _TablePool:
    """Zeroed host tables for ``_merge_dense``, kept per shape and dtype (at most one each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[Any, ...], np.ndarray] = {}

    def take(self, key: tuple[Any, ...]) -> np.ndarray | None:
        with self._lock:
            return self._tables.pop(key, None)

    def give(self, key: tuple[Any, ...], table: np.ndarray) -> None:
        with self._lock:
            self._tables[key] = table


_tables = _TablePool()


def reduce_sparse(
    reduce_op: ReduceOp,
    value: DistributedValues,
    destinations: tuple[DeviceSpec, ...],
    on: DeviceSpec | None = None,
) -> IndexedSlices | Mirrored[IndexedSlices]:
    """The reduction of a ``PerReplica`` of ``IndexedSlices`` placed on ``destinations``.

    Reduced once, on ``on`` (by default the first destination), then placed on every
    destination (:func:`mirror_slices`). MEAN divides by the number of components.
    """
    parts = list(value.values)  # summed in one pass over every replica's rows: faster than each replica first
    reduced = combine(reduce_op, parts, len(parts), on or destinations[0])
    return mirror_slices(reduced, destinations)


def all_reduce_sparse(
    reduce_op: ReduceOp, columns: Sequence[Sequence[IndexedSlices]], devices: tuple[DeviceSpec, ...]
) -> list[list[IndexedSlices]]:
    """``columns[k][r]`` (value ``k`` of replica ``r``) all-reduced: ``results[k][r]`` on ``devices[r]``.

    Host replicas share one result (read-only arrays); GPU replicas each merge the rows on
    their own GPU.
    """
    results = []
    for column in columns:
        parts = list(column)  # (in canonical form already inside run: each replica summed its own rows)
        if all(d.device_type != "GPU" for d in devices):
            reduced = combine(reduce_op, parts, len(parts), devices[0])
            results.append(all_reduce_placed(reduced, devices))
        else:
            results.append([combine(reduce_op, parts, len(parts), device) for device in devices])
    return results


def all_reduce_placed(slices: IndexedSlices, devices: Sequence[DeviceSpec]) -> list[IndexedSlices]:
    """``slices`` (a reduction's result) for each of ``devices``: shared read-only on the host, copied to GPUs."""
    placed = mirror_slices(slices, devices)
    return list(placed.values) if isinstance(placed, DistributedValues) else [placed]


def mirror_slices(slices: IndexedSlices, destinations: Sequence[DeviceSpec]) -> IndexedSlices | Mirrored[IndexedSlices]:
    """``slices`` on every destination: one bare ``IndexedSlices`` for one, a ``Mirrored`` for several.

    Host destinations share ``slices``' arrays, made read-only; GPUs get copies.
    """
    placed = []
    host = backend.host()
    for device in destinations:
        if backend.for_device(device) is host and backend.for_array(slices.values) is host:
            placed.append(_read_only(slices))
        else:
            copy = to_device(slices, device)
            placed.append(copy if copy is not slices else _copied(slices, device))
    if len(destinations) == 1:
        return placed[0]
    return Mirrored(placed, tuple(destinations))


def copied(slices: IndexedSlices, canonical: bool = False) -> IndexedSlices:
    """A copy of ``slices`` (new arrays where they are), in canonical form if ``canonical``."""
    if canonical and summed(slices) is not slices:
        return summed(slices)  # new arrays already
    impl = backend.for_array(slices.values)
    return IndexedSlices(impl.copy(slices.values), backend.for_array(slices.indices).copy(slices.indices), slices.dense_shape)


def with_sparse_apart(
    reduce_op: ReduceOp,
    pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
    reduce_dense: Callable[[Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]]], Sequence[Any]],
) -> list[Any]:
    """The results of ``pairs``: sparse values by :func:`reduce_sparse`, the others by ``reduce_dense(pairs)``."""
    where = [k for k, (value, _) in enumerate(pairs) if is_sparse(value)]
    if not where:
        return list(reduce_dense(pairs))
    results: list[Any] = [None] * len(pairs)
    for k in where:
        value, destinations = pairs[k]
        results[k] = reduce_sparse(reduce_op, value, destinations)
    dense = [k for k in range(len(pairs)) if results[k] is None]
    if dense:
        for k, result in zip(dense, reduce_dense([pairs[k] for k in dense])):
            results[k] = result
    return results


def _read_only(slices: IndexedSlices) -> IndexedSlices:
    values, indices = slices.values.view(), slices.indices.view()
    values.flags.writeable = False
    indices.flags.writeable = False
    return IndexedSlices(values, indices, slices.dense_shape)


def _copied(slices: IndexedSlices, device: DeviceSpec) -> IndexedSlices:
    impl = backend.for_device(device)
    return IndexedSlices(impl.copy(slices.values, device), impl.copy(slices.indices, device), slices.dense_shape)

