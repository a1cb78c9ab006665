"""``ReductionToOneDevice``: copy every component to one device, reduce there, broadcast."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from towerdist._src import array_ops, backend
from towerdist._src import device as device_lib
from towerdist._src.cross_device_ops import sparse
from towerdist._src.cross_device_ops.base import CrossDeviceOps, library_algorithm
from towerdist._src.cross_device_ops.placement import mirror
from towerdist._src.device import DeviceSpec
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues

__all__ = ["ReductionToOneDevice"]


@library_algorithm
class ReductionToOneDevice(CrossDeviceOps):
    """Reduces on one device, then broadcasts (``tf.distribute.ReductionToOneDevice``).

    Args:
      reduce_to_device: the device to reduce on; by default the first destination.
      accumulation_fn: combines the list of components; by default an element-wise sum
        in replica order (``td.add_n``). A custom function fully replaces the addition.

    Example:
      >>> strategy = td.distribute.MirroredStrategy(
      ...     ["CPU:0", "CPU:1"], cross_device_ops=td.distribute.ReductionToOneDevice())
    """

    def __init__(
        self, reduce_to_device: str | None = None, accumulation_fn: Callable[[list[Any]], Any] | None = None
    ) -> None:
        super().__init__()
        self.reduce_to_device = reduce_to_device
        self._target = None if reduce_to_device is None else device_lib.parse(reduce_to_device)
        self.accumulation_fn = accumulation_fn

    def reduce_implementation(
        self,
        reduce_op: ReduceOp,
        per_replica_value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
    ) -> TensorLike:
        if sparse.is_sparse(per_replica_value):  # summed without densifying (accumulation_fn is for dense values, as in TF)
            return sparse.reduce_sparse(reduce_op, per_replica_value, destinations, on=self._target)
        target = self._target or destinations[0]
        impl = backend.for_device(target)
        arrays = [impl.to_device(array_ops.as_array(c), target) for c in per_replica_value.values]
        if self.accumulation_fn is None:
            reduced = impl.add_n(arrays)
        else:
            reduced = array_ops.as_array(self.accumulation_fn(arrays))
            if impl.buffer_id(reduced) in {impl.buffer_id(a) for a in arrays}:
                reduced = impl.copy(reduced)  # e.g. max() returns an input: never alias the caller's data
        if reduce_op is ReduceOp.MEAN:
            reduced = impl.true_divide(reduced, len(arrays))
        return mirror([reduced] * len(destinations), destinations)

    def __repr__(self) -> str:
        return f"ReductionToOneDevice(reduce_to_device={self.reduce_to_device!r})"
