"""``SharedMemoryAllReduce``: the all-reduce for CPU devices, bound by memory bandwidth.

Logical CPU devices share host memory, so an all-reduce of N buffers of S bytes can read
each input once and write one result: (N + 1) * S bytes of memory traffic. Every replica
then receives its own read-only view of that one result buffer (zero-copy; mutating it
in place raises instead of corrupting the other replicas).

The sum is computed chunk by chunk: for each chunk the inputs are added into the output
while that part of it is still in cache. Buffers of at least ``parallel_threshold_bytes``
are cut into contiguous parts reduced concurrently by the replica threads (numpy releases
the GIL), which is what it takes to reach the memory bandwidth with more than one core.
Integers are summed exactly in their own dtype; a MEAN of integers is float64.

The defaults were measured (``benchmarks/allreduce.py``, 4 replicas on a 2-core AMD EPYC
VM): 128 KiB chunks cost more in per-call overhead than they save in memory traffic
(1.4x numpy at 1 MiB); 1 MiB chunks with a 4 MiB parallel threshold gave 0.84x, 0.86x and
0.60x of the numpy time at 4, 16 and 64 MiB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from towerdist._src import array_ops, backend, parallel
from towerdist._src.cross_device_ops import packing, sparse
from towerdist._src.cross_device_ops.base import CrossDeviceOps, copy_in_place, library_algorithm
from towerdist._src.cross_device_ops.placement import mirror
from towerdist._src.device import DeviceSpec
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import DTypeLike, HostArray, TensorLike
from towerdist._src.values.distributed_values import DistributedValues

__all__ = ["SharedMemoryAllReduce", "reduce_host_arrays", "reduce_into_update"]

_host = backend.host()


def mean_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    """The dtype of a MEAN: float64 for integers (as TensorFlow's true division gives)."""
    return np.dtype(np.float64) if np.dtype(dtype).kind in "iu" else np.dtype(dtype)


def reduce_host_arrays(
    reduce_op: ReduceOp,
    arrays: Sequence[Any],
    chunk_bytes: int = 1 << 20,
    parallel_threshold_bytes: int = 1 << 22,
    out: HostArray | None = None,
    helpers: parallel.Helpers = parallel.THIS_THREAD,
) -> HostArray:
    """Reduces same-shaped host arrays element-wise, in replica order, into a new array.

    ``out``, when given, is a private buffer of the result's shape and dtype to write into.
    Large arrays are reduced in parts by ``helpers`` too (by default this thread's).
    """
    first = arrays[0]
    out_dtype = mean_dtype(first.dtype) if reduce_op is ReduceOp.MEAN else first.dtype
    if out is not None and (out.shape != first.shape or out.dtype != out_dtype):
        out = None
    if first.nbytes <= chunk_bytes and out_dtype == first.dtype:
        # Small: one ufunc call per input, no chunking (the common case of gradients).
        if len(arrays) == 1:
            total = np.array(first, copy=True) if out is None else out
            if out is not None:
                np.copyto(out, first)
        else:
            total = np.add(arrays[0], arrays[1], out=out)
            if type(total) is not np.ndarray:  # 0-d inputs without ``out`` give a scalar
                total = np.asarray(total)
        for x in arrays[2:]:
            np.add(total, x, out=total)
        if reduce_op is ReduceOp.MEAN:
            np.true_divide(total, len(arrays), out=total)
        return total
    flats = [_host.flat(a) for a in arrays]
    target = out.reshape(-1) if out is not None else _host.empty((flats[0].size,), out_dtype)
    _reduce_flat_into(target, flats, reduce_op, chunk_bytes, parallel_threshold_bytes, helpers=helpers)
    return target.reshape(first.shape)


def reduce_into_update(
    reduce_op: ReduceOp,
    arrays: Sequence[np.ndarray],
    old: np.ndarray,
    subtract: bool | None,
    out: np.ndarray,
    chunk_bytes: int = 1 << 20,
    parallel_threshold_bytes: int = 1 << 22,
) -> np.ndarray:
    """An aggregated variable write in one pass: ``out = old + reduce(arrays)`` (or ``-``; or the
    reduction alone with ``subtract=None``, an ``assign``).

    The reduction is taken first, chunk by chunk, then combined with ``old`` while the chunk
    is in cache, so the result is exactly ``old + (a0 + a1 + ...)`` as an all-reduce followed
    by ``assign_add`` gives, for one pass over memory instead of two (and no temporary).
    Same-shaped, same-dtype, contiguous host arrays; ``out`` is a private buffer like ``old``.
    """
    flats = [_host.flat(a) for a in arrays]
    target = out.reshape(-1)
    base = None if subtract is None else _host.flat(old)
    combine = np.subtract if subtract else np.add
    _reduce_flat_into(
        target, flats, reduce_op, chunk_bytes, parallel_threshold_bytes,
        then=None if base is None else lambda lo, hi: combine(base[lo:hi], target[lo:hi], out=target[lo:hi]),
    )
    return out


def _reduce_flat_into(
    out: HostArray,
    flats: Sequence[Any],
    reduce_op: ReduceOp,
    chunk_bytes: int,
    parallel_threshold_bytes: int,
    then: Callable[[int, int], Any] | None = None,
    helpers: parallel.Helpers = parallel.THIS_THREAD,
) -> None:
    size = out.size
    count = len(flats)
    divide = reduce_op is ReduceOp.MEAN
    chunk = max(1024, chunk_bytes // max(flats[0].itemsize, 1))
    num_chunks = max(1, math.ceil(size / chunk))
    parts = 1
    if size * flats[0].itemsize >= parallel_threshold_bytes:
        parts = min(parallel.max_parts(helpers), num_chunks)
    # Contiguous runs of whole chunks, one per part.
    per_part = math.ceil(num_chunks / parts)
    bounds = [(p * per_part * chunk, min((p + 1) * per_part * chunk, size)) for p in range(parts)]

    def reduce_part(part: int) -> None:
        start, stop = bounds[part]
        for lo in range(start, stop, chunk):
            hi = min(lo + chunk, stop)
            _host.accumulate_into(out, flats, lo, hi)
            if divide:
                _host.divide_into(out, count, lo, hi)
            if then is not None:
                then(lo, hi)

    parallel.run_parts(reduce_part, parts, helpers)


@library_algorithm
class SharedMemoryAllReduce(CrossDeviceOps):
    """All-reduce through host memory; the default cross-device ops for CPU devices.

    Args:
      chunk_bytes: size of the chunks summed while they stay in cache (per input).
      parallel_threshold_bytes: buffers at least this large are reduced by several
        threads at once (the replica threads, when they are free).
      pack_bytes: with ``bytes_per_pack=0``, values smaller than this are packed together
        (one reduction per dtype instead of one per value). 0 (the default) never packs
        automatically: in host memory packing costs more than it saves (measured on a
        2-core VM, 2 and 4 replicas, 4 to 64 values of 1 KiB: packing took 1.5 to 2.2 times
        as long, the copies into and out of the pack outweighing one ufunc call per value).
        An explicit ``CommunicationOptions(bytes_per_pack=...)`` still packs.
    """

    def __init__(
        self, chunk_bytes: int = 1 << 20, parallel_threshold_bytes: int = 1 << 22, pack_bytes: int = 0
    ) -> None:
        super().__init__()
        self._chunk_bytes = chunk_bytes
        self._parallel_threshold_bytes = parallel_threshold_bytes
        self._pack_bytes = pack_bytes

    # --- TensorFlow's hooks (this thread's helpers) ---------------------------------------------

    def reduce_implementation(
        self,
        reduce_op: ReduceOp,
        per_replica_value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
    ) -> TensorLike:
        return self._reduce_one(reduce_op, per_replica_value, destinations, parallel.THIS_THREAD)

    def batch_reduce_implementation(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
    ) -> list[Any]:
        return self._reduce_pairs(reduce_op, value_destination_pairs, options, parallel.THIS_THREAD)

    # --- the Collectives protocol (helpers given) ------------------------------------------------

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> TensorLike:
        copied = copy_in_place(value, destinations)
        if copied is not None:
            return copied
        return self._reduce_one(reduce_op, value, destinations, helpers)

    def _batch_reduce_to(
        self,
        reduce_op: ReduceOp,
        pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[Any]:
        results: list[Any] = [copy_in_place(value, devices) for value, devices in pairs]
        to_reduce = [k for k, result in enumerate(results) if result is None]
        if to_reduce:
            reduced = self._reduce_pairs(reduce_op, [pairs[k] for k in to_reduce], options, helpers)
            for k, result in zip(to_reduce, reduced):
                results[k] = result
        return results

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        out: Sequence[Any] | None,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]:
        """The collective path: one reduction per value (or per pack of small values).

        Every replica gets its own read-only view of the one result buffer.
        """
        inputs = [_on_host(column) for column in columns]
        keys = [column[0].dtype for column in inputs]
        results = self._reduce_columns(reduce_op, inputs, keys, options.bytes_per_pack, out, helpers)
        n = len(devices)
        shared = []
        for result in results:
            result.setflags(write=False)  # every replica sees it: nobody may write into it
            view = result.view
            shared.append([view() for _ in range(n)])
        return shared

    # --- the reductions ----------------------------------------------------------------------------

    def _reduce_one(
        self,
        reduce_op: ReduceOp,
        value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        helpers: parallel.Helpers,
    ) -> TensorLike:
        if sparse.is_sparse(value):
            return sparse.reduce_sparse(reduce_op, value, destinations)
        arrays = _host_arrays(value)
        result = reduce_host_arrays(
            reduce_op, arrays, self._chunk_bytes, self._parallel_threshold_bytes, helpers=helpers
        )
        return mirror([result] * len(destinations), destinations)

    def _reduce_pairs(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[Any]:
        return sparse.with_sparse_apart(
            reduce_op, value_destination_pairs, lambda pairs: self._reduce_dense_pairs(reduce_op, pairs, options, helpers)
        )

    def _reduce_dense_pairs(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[Any]:
        inputs = [_host_arrays(value) for value, _ in value_destination_pairs]
        # Only values with the same destinations, dtype and replica count can share a pack.
        keys = [
            (destinations, arrays[0].dtype, len(arrays))
            for (_, destinations), arrays in zip(value_destination_pairs, inputs)
        ]
        results = self._reduce_columns(reduce_op, inputs, keys, options.bytes_per_pack, None, helpers)
        return [
            mirror([result] * len(destinations), destinations)
            for result, (_, destinations) in zip(results, value_destination_pairs)
        ]

    def _reduce_columns(
        self,
        reduce_op: ReduceOp,
        inputs: list[list[Any]],
        keys: Sequence[Any],
        bytes_per_pack: int,
        out: Sequence[Any] | None,
        helpers: parallel.Helpers,
    ) -> list[Any]:
        """One reduced array per column of ``inputs``; columns with equal ``keys`` may be packed."""
        chunk, threshold = self._chunk_bytes, self._parallel_threshold_bytes
        if bytes_per_pack <= 0 and self._pack_bytes <= 0:  # no packing: one reduction per value
            return [
                reduce_host_arrays(reduce_op, column, chunk, threshold, out[k] if out is not None else None, helpers)
                for k, column in enumerate(inputs)
            ]
        results: list[Any] = [None] * len(inputs)
        for group in packing.group_by_dtype(keys):
            for pack in self._packs(group, inputs, bytes_per_pack):
                if len(pack) == 1:
                    k = pack[0]
                    results[k] = reduce_host_arrays(
                        reduce_op, inputs[k], chunk, threshold, out[k] if out is not None else None, helpers
                    )
                else:
                    self._reduce_pack(reduce_op, pack, inputs, results, helpers)
        return results

    def _packs(self, group: list[int], inputs: list[list[Any]], bytes_per_pack: int) -> list[list[int]]:
        nbytes = [inputs[k][0].nbytes for k in group]
        if bytes_per_pack > 0:
            return [[group[i] for i in pack] for pack in packing.group_by_size(nbytes, bytes_per_pack)]
        # Automatic: small values share one pack; large ones gain nothing from a copy.
        small = [k for k, size in zip(group, nbytes) if size < self._pack_bytes]
        large = [[k] for k, size in zip(group, nbytes) if size >= self._pack_bytes]
        return ([small] if small else []) + large

    def _reduce_pack(
        self,
        reduce_op: ReduceOp,
        pack: list[int],
        inputs: list[list[Any]],
        results: list[Any],
        helpers: parallel.Helpers,
    ) -> None:
        num_replicas = len(inputs[pack[0]])
        buffers = [packing.pack(_host, [inputs[k][r] for k in pack]) for r in range(num_replicas)]
        reduced = reduce_host_arrays(
            reduce_op, buffers, self._chunk_bytes, self._parallel_threshold_bytes, helpers=helpers
        )
        for k, piece in zip(pack, packing.unpack(_host, reduced, [inputs[k][0].shape for k in pack])):
            results[k] = piece

    def __repr__(self) -> str:
        return "SharedMemoryAllReduce()"


def _on_host(column: Sequence[Any]) -> list[Any]:
    """The replicas' values of one column as host arrays (the same objects when they are)."""
    for a in column:
        if type(a) is not np.ndarray:
            return [_host.to_device(a, None) for a in column]
    return list(column)


def _host_arrays(value: DistributedValues) -> list[Any]:
    return [_host.to_device(array_ops.as_array(c), None) for c in value.values]
