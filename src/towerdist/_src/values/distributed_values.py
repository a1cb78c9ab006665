"""Distributed values: one component per replica (``PerReplica``, ``Mirrored``).

* ``PerReplica`` holds an unrelated value per replica, e.g. the result of
  ``strategy.run``. It has no arithmetic; reduce it (``strategy.reduce``) or look at its
  components (``strategy.experimental_local_results``) to use it across replicas.
* ``Mirrored`` holds values known to be equal on every replica, e.g. the result of
  ``extended.reduce_to``. It behaves like its local component: in a replica it is that
  replica's component, in cross-replica context the component on the current device
  (``td.device``) or the first one.

Components are ordered by replica id. ``_devices`` records where each component lives
when a strategy made the value (None for values built by hand).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from towerdist._src import context
from towerdist._src import device as device_lib
from towerdist._src.device import DeviceSpec
from towerdist._src.operators import ArrayOperators
from towerdist._src.type_aliases import DTypeLike, HostArray, TensorLike

__all__ = ["DistributedValues", "Mirrored", "PerReplica"]

# The type of the components (``PerReplica[np.ndarray]``). A bare ``PerReplica`` means
# ``PerReplica[Any]``: PEP 696's default, which Python 3.11's ``typing`` cannot spell at run
# time (and run time never subscripts these classes).
if TYPE_CHECKING:
    from typing_extensions import TypeVar as _TypeVarWithDefault

    T = _TypeVarWithDefault("T", default=Any)
else:
    T = TypeVar("T")


class DistributedValues(Generic[T]):
    """Base class of values with one component per replica (``tf.distribute.DistributedValues``).

    Do not instantiate it; strategies create ``PerReplica`` and ``Mirrored`` values.
    It is generic in its components' type for type checkers only (``PerReplica[np.ndarray]``
    in annotations); nothing is subscripted at run time.
    """

    # Distributed variables are passed to replica functions whole, not split per replica.
    _is_distributed_variable = False

    def __init__(self, values: Sequence[T], devices: Sequence[DeviceSpec] | None = None) -> None:
        self._values = tuple(values)
        if devices is not None and len(devices) != len(self._values):
            raise ValueError(
                f"{type(self).__name__} needs one device per component. Got {len(self._values)} "
                f"components and {len(devices)} devices."
            )
        if devices is not None and not all(isinstance(d, DeviceSpec) for d in devices):
            devices = [device_lib.parse(d) for d in devices]  # accept "CPU:0", "/gpu:1", ...
        self._devices = None if devices is None else tuple(devices)

    @property
    def values(self) -> tuple[T, ...]:
        """The components, one per replica, in replica order."""
        return self._values

    @property
    def _primary(self) -> T:
        return self._values[0]

    def _get(self) -> T:
        """The component of the current replica (or of the update context's component)."""
        replica_id = context.current_replica_id()
        if replica_id is None:
            return self._get_cross_replica()
        return self._values[replica_id]

    def _get_cross_replica(self) -> T:
        return self._get_on_device_or_primary()

    def _get_on_device_or_primary(self) -> T:
        here = device_lib.current()
        if here is not None and self._devices is not None and here in self._devices:
            return self._values[self._devices.index(here)]
        return self._values[0]

    def _format(self, formatter: Callable[[Any], str]) -> str:
        body = ",\n".join(f"  {i}: {formatter(v)}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{body}\n}}"

    def __str__(self) -> str:
        return self._format(str)

    def __repr__(self) -> str:
        return self._format(repr)


class PerReplica(DistributedValues[T]):
    """One independent value per replica (``tf.types.experimental.PerReplica``).

    Example:
      >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
      >>> strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
      PerReplica:{
        0: np.int32(0),
        1: np.int32(1)
      }
    """

    def _local(self) -> T:
        """The component of the current replica; raises outside a replica context.

        Inside a replica the PerReplica stands for its local component; elsewhere its
        meaning is ambiguous, exactly as in TensorFlow.
        """
        replica_id = context.current_replica_id()
        if replica_id is None or context.in_cross_replica_context() or not context.has_strategy():
            raise ValueError(
                "It looks like you are using a PerReplica object while not inside a replica "
                "context, which is not supported. Reduce it with strategy.reduce(), look at its "
                "components with strategy.experimental_local_results(), or use it inside "
                "strategy.run()."
            )
        return self._values[replica_id]

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> HostArray:
        return _to_numpy(self._local(), dtype, copy)


def _to_numpy(value: TensorLike, dtype: DTypeLike | None, copy: bool | None) -> HostArray:
    """``value`` as a numpy array, honouring numpy 2's ``copy`` argument of ``__array__``."""
    if copy:
        return np.array(value, dtype=dtype, copy=True)
    if copy is False:
        return np.asarray(value, dtype=dtype, copy=False)  # raises if a copy is needed
    return np.asarray(value, dtype=dtype)


class Mirrored(ArrayOperators, DistributedValues[T]):
    """Values that are equal on every replica (``tf.types.experimental.Mirrored``).

    It behaves like its local component: attribute access, ``np.asarray``, indexing,
    arithmetic and comparison operators all act on ``_get()``.
    """

    def _operand(self) -> T:
        return self._get()

    def __getattr__(self, name: str) -> Any:
        # Dunder and private lookups (copy, pickle, half-initialised objects) must not recurse.
        if name.startswith("__") or name in ("_values", "_devices"):
            raise AttributeError(name)
        return getattr(self._get(), name)

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> HostArray:
        return _to_numpy(self._get(), dtype, copy)

    # == and hash stay by identity, as for TensorFlow's Mirrored: results are regrouped and
    # used as dict keys by identity.
    __eq__ = object.__eq__
    __hash__ = object.__hash__
