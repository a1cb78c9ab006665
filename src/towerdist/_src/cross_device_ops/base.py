"""``CrossDeviceOps``: the interface for reducing and broadcasting across devices.

A ``CrossDeviceOps`` turns a ``PerReplica`` (one array per device) into a ``Mirrored``
(one equal array per destination device). Subclasses implement the hooks
``reduce_implementation``, ``batch_reduce_implementation`` and ``broadcast_implementation``
(TensorFlow's), which receive validated values and destinations resolved to a tuple of
devices.

The public methods (``reduce``, ``batch_reduce``, ``broadcast``) check their arguments
(every component must have the same shape and dtype) and call the hooks. Strategies reach
cross-device ops through one internal protocol instead, ``collectives.Collectives``
(arguments already checked at the API the user called, helper threads passed explicitly):
``CrossDeviceOps`` implements it here in terms of the hooks, the library's algorithms
override it with their direct paths, and a user's subclass is wrapped once, when the
strategy is built (``collectives.collectives_for``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from towerdist._src import array_ops, backend, parallel
from towerdist._src.cross_device_ops import sparse
from towerdist._src.cross_device_ops.gather import gather_to
from towerdist._src.cross_device_ops.placement import (
    as_per_replica,
    check_pairs,
    mirror,
    resolve_destinations,
    validate_components,
)
from towerdist._src.device import DeviceSpec
from towerdist._src.failures import name_api, worded_at
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import Destinations, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, PerReplica

__all__ = [
    "DEFAULT_OPTIONS",
    "CrossDeviceOps",
    "batch_reduce_with_hooks",
    "copy_in_place",
    "library_algorithm",
    "reduce_with_hooks",
]

DEFAULT_OPTIONS = CommunicationOptions()


def _check_reduce_op(reduce_op: object) -> ReduceOp:
    if not isinstance(reduce_op, ReduceOp):
        raise ValueError(
            f"`reduce_op` must be Reduce.SUM or Reduce.MEAN: CrossDeviceOps methods take a "
            f"td.distribute.ReduceOp, not a string. Got reduce_op={reduce_op!r}."
        )
    return reduce_op


C = TypeVar("C", bound="CrossDeviceOps")


def library_algorithm(cls: type[C]) -> type[C]:
    """Marks ``cls`` (exactly, not its subclasses) as one of towerdist's own algorithms."""
    cls._library_algorithm = True
    return cls


class CrossDeviceOps:
    """Base class for cross-device reduction and broadcast (``tf.distribute.CrossDeviceOps``).

    Subclasses implement ``reduce_implementation`` and may override
    ``batch_reduce_implementation`` and ``broadcast_implementation``. The hooks receive
    validated values and destinations resolved to a tuple of ``DeviceSpec``.
    """

    # (Collectives) a batch of values each reduced onto its own devices may take ``_all_reduce``.
    _all_reduces_batches = True
    # Whether this exact class is one of the library's algorithms (``library_algorithm``): a
    # strategy calls those directly, and wraps any other class, a user's, once (collectives.py).
    _library_algorithm: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._library_algorithm = False  # a subclass of a library algorithm is the user's

    def __init__(self) -> None:
        self._num_between_graph_workers = 1

    # --- public API -----------------------------------------------------------------------

    def reduce(
        self,
        reduce_op: ReduceOp,
        per_replica_value: TensorLike,
        destinations: Destinations,
        options: CommunicationOptions | None = None,
    ) -> TensorLike:
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
        try:
            validate_components(value)
        except BaseException as error:  # worded by this method: the subclass's name, as TF names it
            name_api(error, f"{type(self).__name__}.reduce()")
            raise
        return reduce_with_hooks(self, op, value, devices, options or DEFAULT_OPTIONS)

    def batch_reduce(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[TensorLike, Destinations]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Reduces several values at once; small ones may be packed into one transfer.

        Returns:
          One result per ``(value, destinations)`` pair, as :meth:`reduce` gives it.
        """
        op = _check_reduce_op(reduce_op)
        try:
            pairs = check_pairs(value_destination_pairs)
        except BaseException as error:
            name_api(error, f"{type(self).__name__}.batch_reduce()")
            raise
        return batch_reduce_with_hooks(self, op, pairs, options or DEFAULT_OPTIONS)

    def broadcast(self, tensor: TensorLike, destinations: Destinations) -> TensorLike:
        """Copies ``tensor`` to every destination device; a ``Mirrored`` for several."""
        return self.broadcast_implementation(tensor, resolve_destinations(destinations))

    # --- the Collectives protocol (collectives.py), in terms of the hooks ------------------

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> TensorLike:
        """``reduce`` of a value whose components were checked, onto resolved destinations."""
        del helpers  # the hooks lend parts to this thread's helpers, if any
        return reduce_with_hooks(self, reduce_op, value, destinations, options)

    def _batch_reduce_to(
        self,
        reduce_op: ReduceOp,
        pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[Any]:
        """``batch_reduce`` of checked values onto resolved destinations."""
        del helpers
        return batch_reduce_with_hooks(self, reduce_op, pairs, options)

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        out: Sequence[Any] | None,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]:
        """All-reduces checked values between ``devices`` (the collective path).

        ``columns[k][r]`` is value ``k``'s array on replica ``r`` (on ``devices[r]``); every
        column has one shape and one numeric dtype. Returns ``results[k][r]``, value ``k``'s
        reduction on ``devices[r]``. ``out[k]``, when given, is a private host buffer of
        the result's shape and dtype that an implementation may write the result into.
        This default goes through ``batch_reduce_implementation``, so subclasses written
        for TensorFlow's hooks serve the collective path too.
        """
        del out, helpers
        pairs = [(PerReplica(column, devices), devices) for column in columns]
        reduced = self.batch_reduce_implementation(reduce_op, pairs, options)
        return [list(r.values) if isinstance(r, DistributedValues) else [r] for r in reduced]

    def _all_reduce_sparse(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]:
        """All-reduces checked ``IndexedSlices`` between ``devices``: ``columns[k][r]`` in, ``results[k][r]`` out.

        The library's algorithms reduce the distinct rows only (``sparse.py``); a user's
        subclass gets the values through ``batch_reduce_implementation``, as TensorFlow
        hands them to its hooks.
        """
        del helpers
        if type(self)._library_algorithm:
            return sparse.all_reduce_sparse(reduce_op, columns, devices)
        pairs = [(PerReplica(column, devices), devices) for column in columns]
        reduced = self.batch_reduce_implementation(reduce_op, pairs, options)
        return [list(r.values) if isinstance(r, DistributedValues) else [r] for r in reduced]

    def _broadcast_to(self, tensor: TensorLike, destinations: tuple[DeviceSpec, ...]) -> TensorLike:
        """``broadcast`` onto resolved destinations."""
        return self.broadcast_implementation(tensor, tuple(destinations))

    # --- hooks ----------------------------------------------------------------------------

    def reduce_implementation(
        self,
        reduce_op: ReduceOp,
        per_replica_value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
    ) -> TensorLike:
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

    def broadcast_implementation(self, tensor: TensorLike, destinations: tuple[DeviceSpec, ...]) -> TensorLike:
        """Puts ``tensor`` on every destination: shared read-only on the host, copied to GPUs."""
        if sparse.is_sparse(tensor):
            return sparse.mirror_slices(sparse.copied(tensor), destinations)  # never the caller's arrays, as below
        array = array_ops.as_array(tensor)
        source = backend.for_array(array).copy(array)
        return mirror([source] * len(destinations), destinations)

    def _gather(
        self,
        per_replica_value: TensorLike,
        destinations: Destinations,
        axis: int,
        options: CommunicationOptions | None = None,
    ) -> TensorLike:
        """Concatenates the components along ``axis`` onto ``destinations``."""
        with worded_at("gather()"):
            return gather_to(as_per_replica(per_replica_value), resolve_destinations(destinations), axis)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def reduce_with_hooks(
    ops: CrossDeviceOps,
    reduce_op: ReduceOp,
    value: DistributedValues,
    destinations: tuple[DeviceSpec, ...],
    options: CommunicationOptions,
) -> TensorLike:
    """TensorFlow's ``reduce`` of a checked value: an identity in place, else ``ops.reduce_implementation``."""
    copied = copy_in_place(value, destinations)
    if copied is not None:
        return copied
    return ops.reduce_implementation(reduce_op, value, destinations, options)


def batch_reduce_with_hooks(
    ops: CrossDeviceOps,
    reduce_op: ReduceOp,
    pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
    options: CommunicationOptions,
) -> list[Any]:
    """TensorFlow's ``batch_reduce`` of checked values, through ``ops.batch_reduce_implementation``."""
    # A value that is one component already where it must go is an identity, as in
    # TensorFlow. (TF applies this only when *every* pair qualifies; per pair, a
    # result never depends on the other pairs of the batch, e.g. in its dtype.)
    results: list[Any] = [None] * len(pairs)
    to_reduce = []
    for k, (value, devices) in enumerate(pairs):
        copied = copy_in_place(value, devices)
        if copied is not None:
            results[k] = copied
        else:
            to_reduce.append(k)
    if to_reduce:
        reduced = ops.batch_reduce_implementation(reduce_op, [pairs[k] for k in to_reduce], options)
        for k, result in zip(to_reduce, reduced):
            results[k] = result
    return results


def copy_in_place(value: DistributedValues, devices: tuple[DeviceSpec, ...]) -> TensorLike | None:
    """A copy of ``value`` if it is one component already where it must go (an identity), else None."""
    if not _already_in_place(value, devices):
        return None
    if sparse.is_sparse(value):
        return sparse.mirror_slices(sparse.copied(value.values[0], canonical=True), devices)  # a reduction's form
    component = array_ops.as_array(value.values[0])
    return mirror([backend.for_array(component).copy(component)], devices)


def _already_in_place(value: DistributedValues, devices: tuple[DeviceSpec, ...]) -> bool:
    """One component whose device (if recorded) is the only destination."""
    return len(value.values) == 1 and len(devices) == 1 and value._devices in (None, devices)
