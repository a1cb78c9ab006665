"""The all-reduce family: ``HierarchicalCopyAllReduce`` and ``NcclAllReduce``.

Both reduce a batch of values whose destinations are their own devices (an all-reduce)
by packing each dtype's values into ``num_packs`` packs and all-reducing every pack.
Any other request (different destinations, e.g. a reduction onto the host) falls back
to ``ReductionToOneDevice``, as in TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from towerdist._src import array_ops, backend, parallel
from towerdist._src.cross_device_ops import packing, sparse
from towerdist._src.cross_device_ops.base import CrossDeviceOps, library_algorithm
from towerdist._src.cross_device_ops.placement import mirror
from towerdist._src.cross_device_ops.reduction_to_one_device import ReductionToOneDevice
from towerdist._src.device import DeviceSpec
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues

__all__ = ["AllReduceCrossDeviceOps"]


@library_algorithm
class AllReduceCrossDeviceOps(CrossDeviceOps):
    """Base of the all-reduce algorithms: packing, fallback, MEAN; subclasses reduce packs."""

    _algorithm = "all-reduce"

    def __init__(self, num_packs: int = 1) -> None:
        super().__init__()
        if not isinstance(num_packs, int) or num_packs < 0:
            raise ValueError(f"{type(self).__name__} requires num_packs >= 0, but {num_packs} is specified")
        self.num_packs = num_packs
        self._fallback = ReductionToOneDevice()

    def reduce_implementation(
        self,
        reduce_op: ReduceOp,
        per_replica_value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
    ) -> TensorLike:
        if sparse.is_sparse(per_replica_value):
            return sparse.reduce_sparse(reduce_op, per_replica_value, destinations)
        # As in TensorFlow, a plain reduce all-reduces only between the value's own
        # non-CPU devices; anything else (e.g. onto the host) reduces on one device.
        if per_replica_value._devices == destinations and all(d.device_type != "CPU" for d in destinations):
            return mirror(self._batch_all_reduce(reduce_op, [per_replica_value.values], destinations)[0], destinations)
        return self._fallback.reduce_implementation(reduce_op, per_replica_value, destinations, options)

    def batch_reduce_implementation(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
    ) -> list[Any]:
        return sparse.with_sparse_apart(
            reduce_op, value_destination_pairs, lambda pairs: self._batch_reduce_dense(reduce_op, pairs, options)
        )

    def _batch_reduce_dense(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
    ) -> list[Any]:
        first_devices = value_destination_pairs[0][0]._devices
        if first_devices is not None and all(
            value._devices == first_devices and destinations == first_devices
            for value, destinations in value_destination_pairs
        ):
            columns = [value.values for value, _ in value_destination_pairs]
            return [
                mirror(result, first_devices) for result in self._batch_all_reduce(reduce_op, columns, first_devices)
            ]
        return [self.reduce_implementation(reduce_op, v, d, options) for v, d in value_destination_pairs]

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        out: Sequence[Any] | None,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]:
        del options, out, helpers
        # mirror() hands host buffers shared by several replicas out as read-only views.
        return [list(mirror(result, devices).values) for result in self._batch_all_reduce(reduce_op, columns, devices)]

    def _batch_all_reduce(
        self, reduce_op: ReduceOp, columns: Sequence[Sequence[Any]], devices: tuple[DeviceSpec, ...]
    ) -> list[list[Any]]:
        """All-reduces ``columns[k][j]`` (value ``k`` on ``devices[j]``); returns ``results[k][j]``."""
        per_device = [
            [backend.for_device(d).to_device(array_ops.as_array(column[j]), d) for column in columns]
            for j, d in enumerate(devices)
        ]
        # per_device[j][k]: value k's component on device j.
        results: list[list[Any]] = [[None] * len(devices) for _ in columns]
        dtypes = [per_device[0][k].dtype for k in range(len(columns))]
        for group in packing.group_by_dtype(dtypes):
            self._all_reduce_group(reduce_op, devices, per_device, group, results)
        return results

    def _all_reduce_group(
        self,
        reduce_op: ReduceOp,
        devices: tuple[DeviceSpec, ...],
        per_device: list[list[Any]],
        group: list[int],
        results: list[list[Any]],
    ) -> None:
        shapes = [per_device[0][k].shape for k in group]
        if self.num_packs == 0:
            packs_per_value = [[per_device[j][k] for j in range(len(devices))] for k in group]
            for k, components in zip(group, packs_per_value):
                reduced = self._all_reduce_pack(devices, components, pack_index=0)
                results[k] = _finish(reduce_op, devices, reduced)
            return
        buffers = [
            packing.pack(backend.for_device(d), [per_device[j][k] for k in group], d) for j, d in enumerate(devices)
        ]
        ranges = packing.split_ranges(buffers[0].size, self.num_packs) or [(0, 0)]
        pieces = [
            self._all_reduce_pack(devices, [b[start:stop] for b in buffers], pack_index=p)
            for p, (start, stop) in enumerate(ranges)
        ]
        for j, device in enumerate(devices):
            impl = backend.for_device(device)
            whole = impl.concat([piece[j] for piece in pieces], 0, device) if len(pieces) > 1 else pieces[0][j]
            for k, part in zip(group, packing.unpack(impl, whole, shapes)):
                results[k][j] = part
        for k in group:
            results[k] = _finish(reduce_op, devices, results[k])

    def _all_reduce_pack(self, devices: tuple[DeviceSpec, ...], components: list[Any], pack_index: int) -> list[Any]:
        """Sums one pack: ``components[j]`` lives on ``devices[j]``; returns the sum on every device."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_packs={self.num_packs})"


def _finish(reduce_op: ReduceOp, devices: tuple[DeviceSpec, ...], summed: list[Any]) -> list[Any]:
    if reduce_op is not ReduceOp.MEAN:
        return summed
    return [backend.for_device(d).true_divide(x, len(devices)) for d, x in zip(devices, summed)]
