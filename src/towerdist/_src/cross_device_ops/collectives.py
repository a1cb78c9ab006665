"""``Collectives``: the one way a strategy reaches its cross-device ops.

A strategy checks a reduction's arguments at the API the user called (and names that API
in its errors), resolves the destinations, and finds the threads that may help (the
replicas parked while a ``merge_fn`` runs, or an idle pool). It then calls one of the four
methods below, every argument already checked and the helper threads passed explicitly:

* ``_reduce_to(reduce_op, value, destinations, options, helpers)``: one value;
* ``_batch_reduce_to(reduce_op, pairs, options, helpers)``: several ``(value, destinations)``;
* ``_all_reduce(reduce_op, columns, devices, options, out, helpers)``: the collective path
  of ``ReplicaContext.all_reduce`` and optimizers, plain lists of arrays in and out;
* ``_all_reduce_sparse(reduce_op, columns, devices, options, helpers)``: the same for
  ``IndexedSlices`` (lists of them in and out);
* ``_broadcast_to(tensor, destinations)``.

``CrossDeviceOps`` implements them in terms of TensorFlow's hooks
(``reduce_implementation`` and friends); the library's algorithms override them with their
direct paths. A user's subclass, written against TensorFlow's hooks (or overriding a public
method), is wrapped once, when the strategy is built, by :func:`collectives_for`: the
wrapper keeps TensorFlow's semantics (the public method when it is overridden, the hooks
otherwise) and lends the helper threads to the user's code through this thread's state, as
the hooks expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from towerdist._src import parallel
from towerdist._src.cross_device_ops.base import CrossDeviceOps, batch_reduce_with_hooks, reduce_with_hooks
from towerdist._src.cross_device_ops.placement import ResolvedDevices
from towerdist._src.device import DeviceSpec
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues

__all__ = ["Collectives", "collectives_for"]

class Collectives(Protocol):
    """What a strategy calls: arguments checked, destinations resolved, helper threads explicit.

    ``_all_reduces_batches``: whether a batch whose every value goes onto its own devices may
    take the collective path (``_all_reduce``) instead of ``_batch_reduce_to``.
    """

    _all_reduces_batches: bool

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> TensorLike: ...

    def _batch_reduce_to(
        self,
        reduce_op: ReduceOp,
        pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[Any]: ...

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        out: Sequence[Any] | None,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]: ...

    def _all_reduce_sparse(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]: ...

    def _broadcast_to(self, tensor: TensorLike, destinations: ResolvedDevices) -> TensorLike: ...


def collectives_for(ops: CrossDeviceOps) -> Collectives:
    """``ops`` itself if it is one of the library's own classes, else ``ops`` wrapped (once)."""
    if type(ops)._library_algorithm:
        return ops
    return UserOps(ops)


class UserOps:
    """A user's ``CrossDeviceOps`` subclass as ``Collectives``, with TensorFlow's semantics.

    A public ``reduce``/``batch_reduce``/``broadcast`` the subclass overrides is what is
    called (as TensorFlow's strategies call them); otherwise the hooks, through
    ``CrossDeviceOps``'s own flow. ``_all_reduce`` is the subclass's (by default through
    ``batch_reduce_implementation``; a subclass of a library algorithm keeps its direct path).
    The helper threads are this thread's while the user's code runs.
    """

    __slots__ = ("_all_reduces_batches", "_own_batch_reduce", "_own_reduce", "ops")

    def __init__(self, ops: CrossDeviceOps) -> None:
        cls = type(ops)
        self.ops = ops
        self._own_reduce = cls.reduce is not CrossDeviceOps.reduce
        self._own_batch_reduce = cls.batch_reduce is not CrossDeviceOps.batch_reduce
        self._all_reduces_batches = not self._own_batch_reduce

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: DistributedValues,
        destinations: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> TensorLike:
        with parallel.helpers_installed(helpers):
            if self._own_reduce:
                return self.ops.reduce(reduce_op, value, ResolvedDevices(destinations), options)
            return reduce_with_hooks(self.ops, reduce_op, value, destinations, options)

    def _batch_reduce_to(
        self,
        reduce_op: ReduceOp,
        pairs: Sequence[tuple[DistributedValues, tuple[DeviceSpec, ...]]],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[Any]:
        with parallel.helpers_installed(helpers):
            if self._own_batch_reduce:
                # (destinations marked resolved, as the public method re-resolves them)
                return self.ops.batch_reduce(reduce_op, [(v, ResolvedDevices(d)) for v, d in pairs], options)
            return batch_reduce_with_hooks(self.ops, reduce_op, pairs, options)

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        out: Sequence[Any] | None,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]:
        with parallel.helpers_installed(helpers):
            return self.ops._all_reduce(reduce_op, columns, devices, options, out, parallel.THIS_THREAD)

    def _all_reduce_sparse(
        self,
        reduce_op: ReduceOp,
        columns: Sequence[Sequence[Any]],
        devices: tuple[DeviceSpec, ...],
        options: CommunicationOptions,
        helpers: parallel.Helpers,
    ) -> list[list[Any]]:
        with parallel.helpers_installed(helpers):
            return self.ops._all_reduce_sparse(reduce_op, columns, devices, options, parallel.THIS_THREAD)

    def _broadcast_to(self, tensor: TensorLike, destinations: ResolvedDevices) -> TensorLike:
        return self.ops.broadcast(tensor, destinations)

    def __repr__(self) -> str:
        return f"collectives of {self.ops!r}"
