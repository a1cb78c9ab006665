"""The type aliases towerdist's signatures share, so readers and type checkers see one meaning.

* ``Nest``: an array or scalar, or lists, tuples, dicts and namedtuples of them (optree's
  pytrees); what ``strategy.run`` passes and returns. It stays ``Any``: ``run`` merges the
  replicas' results leaf by leaf (a tuple of arrays comes back as a tuple of
  ``PerReplica``), a type no checker can spell, and users index and unpack it freely.
* ``TensorLike``: one value where TensorFlow takes a tensor: a numpy or cupy array, a numpy
  or Python scalar, a list of numbers, a variable or anything else ``np.asarray`` converts.
  It stays ``Any``: what converts is decided at run time (and checked there, with errors
  naming the API), and a checker following numpy's and cupy's arithmetic through one
  protocol would reject most correct code.
* ``HostArray``: a numpy array of any shape and dtype (host memory).
* ``Array``: an array of either kind, numpy's or cupy's (or the simulated GPUs'), when only
  its metadata is used: ``shape``, ``dtype``, ``ndim``, ``size``, ``nbytes``. Code that
  computes with it holds it as ``HostArray``, or ``TensorLike`` across both kinds.
* ``ArrayModule``: the module an array kind computes with (``numpy``, ``cupy``, or the
  simulated GPUs' module): the ``xp`` of the update rules and backends.
* ``DTypeLike``: numpy's: a dtype, a type (``np.float32``, ``float``) or a dtype name.
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
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import numpy as np
from numpy.typing import DTypeLike

from towerdist._src.reduce_op import ReduceOp
from towerdist._src.variable_enums import VariableAggregation

if TYPE_CHECKING:  # device names, values, variables and placement sit above this layer: only named here
    from towerdist._src.cross_device_ops.placement import ResolvedDevices
    from towerdist._src.device import DeviceSpec
    from towerdist._src.values.distributed_values import DistributedValues
    from towerdist._src.variables.variable import Variable

__all__ = [
    "Array",
    "ArrayModule",
    "AxisLike",
    "DTypeLike",
    "Destinations",
    "DeviceLike",
    "HostArray",
    "MergeFn",
    "NamedDevice",
    "Nest",
    "ReduceOpLike",
    "ReplicaFn",
    "TensorLike",
]


class Array(Protocol):
    """An array of either kind (numpy, cupy, the simulated GPUs'): what is read of it without computing."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def ndim(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class NamedDevice(Protocol):
    """A logical device object, e.g. ``td.config.list_logical_devices()[0]``: its ``name`` says which."""

    @property
    def name(self) -> str: ...


Nest: TypeAlias = Any
TensorLike: TypeAlias = Any
HostArray: TypeAlias = "np.ndarray[Any, Any]"
ArrayModule: TypeAlias = ModuleType
ReplicaFn: TypeAlias = Callable[..., Any]
MergeFn: TypeAlias = Callable[..., Any]
ReduceOpLike: TypeAlias = ReduceOp | Literal["sum", "mean", "SUM", "MEAN", "Sum", "Mean"] | VariableAggregation
DeviceLike: TypeAlias = "str | DeviceSpec | NamedDevice"
AxisLike: TypeAlias = int | Sequence[int]
# ResolvedDevices: the library's own calls pass destinations it has resolved already.
Destinations: TypeAlias = "str | DeviceSpec | DistributedValues | Variable | np.ndarray[Any, Any] | ResolvedDevices"
