"""``CrossDeviceOps``: the interface for reducing and broadcasting across devices.

A ``CrossDeviceOps`` turns a ``PerReplica`` (one array per device) into a ``Mirrored``
(one equal array per destination device). The public methods validate their inputs
before any data moves — every component must have the same shape and dtype — and then
call the subclass hooks ``reduce_implementation``, ``batch_reduce_implementation`` and
``broadcast_implementation`` with the destinations resolved to a tuple of devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from towerdist._src import array_ops, backend
from towerdist._src.cross_device_ops.gather import gather_to
from towerdist._src.cross_device_ops.placement import (
    as_per_replica,
    mirror,
    resolve_destinations,
    validate_components,
)
from towerdist._src.device import DeviceSpec
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.values.distributed_values import DistributedValues

__all__ = ["CrossDeviceOps"]


def _check_reduce_op(reduce_op: Any) -> ReduceOp:
    if not isinstance(reduce_op, ReduceOp):
        raise ValueError(
            f"`reduce_op` must be Reduce.SUM or Reduce.MEAN: CrossDeviceOps methods take a "
            f"td.distribute.ReduceOp, not a string. Got reduce_op={reduce_op!r}."
        )
    return reduce_op


class CrossDeviceOps:
    """Base class for cross-device reduction and broadcast (``tf.distribute.CrossDeviceOps``).

    Subclasses implement ``reduce_implementation`` and may override
    ``batch_reduce_implementation`` and ``broadcast_implementation``. The hooks receive
    validated values and destinations resolved to a tuple of ``DeviceSpec``.
    """

    def __init__(self) -> None:
        self._num_between_graph_workers = 1

    # --- public API -----------------------------------------------------------------------

    def reduce(
        self,
        reduce_op: ReduceOp,
        per_replica_value: Any,
        destinations: Any,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """Reduces ``per_replica_value`` and places the result on ``destinations``.

        Args:
          reduce_op: ``ReduceOp.SUM`` or ``ReduceOp.MEAN``.
          per_replica_value: a ``PerReplica`` (a plain value counts as one component).
          destinations: a device string, a distributed value or variable, or an array.
          options: ``CommunicationOptions``.

        Returns:
          A ``Mirrored`` over the destination devices (the bare array for one device).
        """
        op = _check_reduce_op(reduce_op)
        value = as_per_replica(per_replica_value)
        devices = resolve_destinations(destinations)
        arrays = validate_components(value, f"{type(self).__name__}.reduce()")
        if _already_in_place(value, devices):
            # One value already where it must go: an identity, as in TensorFlow.
            return mirror([backend.for_array(arrays[0]).copy(arrays[0])], devices)
        return self.reduce_implementation(op, value, devices, options or CommunicationOptions())

    def batch_reduce(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Reduces several values at once; small ones may be packed into one transfer.

        Returns:
          One result per ``(value, destinations)`` pair, as :meth:`reduce` gives it.
        """
        op = _check_reduce_op(reduce_op)
        pairs: list[tuple[DistributedValues, tuple[DeviceSpec, ...]]] = []
        for k, pair in enumerate(value_destination_pairs):
            if not isinstance(pair, tuple):
                raise ValueError(
                    f"Each element of `value_destination_pairs` should be a tuple. Got element {k}: {pair!r}."
                )
            if len(pair) != 2:
                raise ValueError(
                    f"Each element of `value_destination_pairs` should be a tuple of size 2. Got element "
                    f"{k} of size {len(pair)}."
                )
            value = as_per_replica(pair[0])
            validate_components(value, f"{type(self).__name__}.batch_reduce() (value {k})")
            pairs.append((value, resolve_destinations(pair[1])))
        # A value that is one component already where it must go is an identity, as in
        # TensorFlow. (TF applies this only when *every* pair qualifies; per pair, a
        # result never depends on the other pairs of the batch, e.g. in its dtype.)
        results: list[Any] = [None] * len(pairs)
        to_reduce = []
        for k, (value, devices) in enumerate(pairs):
            if _already_in_place(value, devices):
                component = array_ops.convert_to_tensor(value._values[0])
                results[k] = mirror([backend.for_array(component).copy(component)], devices)
            else:
                to_reduce.append(k)
        if to_reduce:
            reduced = self.batch_reduce_implementation(
                op, [pairs[k] for k in to_reduce], options or CommunicationOptions()
            )
            for k, result in zip(to_reduce, reduced):
                results[k] = result
        return results

    def broadcast(self, tensor: Any, destinations: Any) -> Any:
        """Copies ``tensor`` to every destination device; a ``Mirrored`` for several."""
        return self.broadcast_implementation(tensor, resolve_destinations(destinations))

    # --- hooks ----------------------------------------------------------------------------

    def reduce_implementation(
        self,
        reduce_op: ReduceOp,
        per_replica_value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
    ) -> Any:
        """Reduces one validated value onto ``destinations`` (subclasses implement it)."""
        raise NotImplementedError(f"{type(self).__name__} must implement reduce_implementation().")

    def batch_reduce_implementation(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
    ) -> list[Any]:
        """Reduces several values; by default one ``reduce_implementation`` per pair."""
        return [self.reduce_implementation(reduce_op, v, d, options) for v, d in value_destination_pairs]

    def broadcast_implementation(self, tensor: Any, destinations: tuple[DeviceSpec, ...]) -> Any:
        """Puts ``tensor`` on every destination: shared read-only on the host, copied to GPUs."""
        array = array_ops.convert_to_tensor(tensor)
        source = backend.for_array(array).copy(array)
        return mirror([source] * len(destinations), destinations)

    def _gather(
        self, per_replica_value: Any, destinations: Any, axis: int, options: CommunicationOptions | None = None
    ) -> Any:
        """Concatenates the components along ``axis`` onto ``destinations``."""
        return gather_to(as_per_replica(per_replica_value), resolve_destinations(destinations), axis)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _already_in_place(value: DistributedValues, devices: tuple[DeviceSpec, ...]) -> bool:
    """One component whose device (if recorded) is the only destination."""
    return len(value._values) == 1 and len(devices) == 1 and value._devices in (None, devices)
