"""The type aliases towerdist's signatures share, so readers and type checkers see one meaning.

* ``Nest``: an array or scalar, or lists, tuples, dicts and namedtuples of them (optree's
  pytrees); what ``strategy.run`` passes and returns. It stays ``Any``: ``run`` merges the
  replicas' results leaf by leaf (a tuple of arrays comes back as a tuple of
  ``PerReplica``), a type no checker can spell, and users index and unpack it freely.
* ``ReplicaFn``: the function ``strategy.run`` calls once per replica.
* ``MergeFn``: the function ``ReplicaContext.merge_call`` calls once, as
  ``merge_fn(strategy, *args, **kwargs)``, in cross-replica context.
* ``ReduceOpLike``: a ``ReduceOp``, the strings ``"sum"``/``"mean"`` (``"SUM"``, ``"Sum"``,
  ...), or ``VariableAggregation.SUM``/``MEAN`` (TF 1.x-era code passes a variable's
  aggregation). At run time any capitalisation of the strings is accepted; a checker sees
  the spellings the documentation uses, so that ``"SUMM"`` or ``"max"`` is flagged.
* ``DeviceLike``: a device name (``"GPU:0"``, ``"/cpu:1"``), a ``DeviceSpec``, or a logical
  device object (anything with a ``name``, as ``list_logical_devices()`` returns).
* ``AxisLike``: an axis, or several, of ``Strategy.reduce``.
* ``Destinations``: where a reduction or broadcast puts its result: a device name or
  ``DeviceSpec``, a distributed value or variable (its devices), or an array (its device).
  One destination, not a list: ``reduce_to`` refuses lists of devices (as TensorFlow).
  Inside the library, destinations already resolved to devices are a
  ``cross_device_ops.placement.ResolvedDevices`` (accepted too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import numpy as np

from towerdist._src.reduce_op import ReduceOp
from towerdist._src.variable_enums import VariableAggregation

if TYPE_CHECKING:  # device names, values, variables and placement sit above this layer: only named here
    from towerdist._src.cross_device_ops.placement import ResolvedDevices
    from towerdist._src.device import DeviceSpec
    from towerdist._src.values.distributed_values import DistributedValues
    from towerdist._src.variables.variable import Variable

__all__ = [
    "AxisLike",
    "Destinations",
    "DeviceLike",
    "MergeFn",
    "NamedDevice",
    "Nest",
    "ReduceOpLike",
    "ReplicaFn",
]


class NamedDevice(Protocol):
    """A logical device object, e.g. ``td.config.list_logical_devices()[0]``: its ``name`` says which."""

    @property
    def name(self) -> str: ...


Nest: TypeAlias = Any
ReplicaFn: TypeAlias = Callable[..., Any]
MergeFn: TypeAlias = Callable[..., Any]
ReduceOpLike: TypeAlias = ReduceOp | Literal["sum", "mean", "SUM", "MEAN", "Sum", "Mean"] | VariableAggregation
DeviceLike: TypeAlias = "str | DeviceSpec | NamedDevice"
AxisLike: TypeAlias = int | Sequence[int]
# ResolvedDevices: the library's own calls pass destinations it has resolved already.
Destinations: TypeAlias = "str | DeviceSpec | DistributedValues | Variable | np.ndarray[Any, Any] | ResolvedDevices"
