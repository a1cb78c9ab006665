"""``AggregatingVariable``: CentralStorageStrategy's variable, stored once on the parameter device.

Every replica reads the one copy. Writes in replica context are aggregated across the
replicas first (SUM, MEAN, ONLY_FIRST_REPLICA; NONE raises), exactly like a
``MirroredVariable``'s (see ``aggregation.py``); writes in cross-replica context go to the
one copy, a distributed value contributing its first component. Sync-on-read variables
of a CentralStorageStrategy are aggregating variables too (as in TensorFlow).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import backend, context
from towerdist._src import device as device_lib
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues
from towerdist._src.variable_enums import VariableAggregation, VariableSynchronization
from towerdist._src.variables import aggregation
from towerdist._src.variables.sliced import describe_write
from towerdist._src.variables.variable import ResourceVariable, Variable, WriteOp, WriteResult

if TYPE_CHECKING:
    from towerdist._src.strategies.strategy import Strategy

__all__ = ["AggregatingVariable"]


class AggregatingVariable(Variable):
    """One variable on the parameter device shared by all replicas (CentralStorageStrategy)."""

    def __init__(self, strategy: Strategy, variable: ResourceVariable) -> None:
        self._distribute_strategy = strategy
        self._v = variable
        self._devices = variable._devices
        variable._distributed_container = weakref.ref(self)

    def get(self) -> ResourceVariable:
        """The underlying single-device variable."""
        return self._v

    @property
    def name(self) -> str:
        return self._v.name

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._v.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._v.shape

    @property
    def device(self) -> str:
        return self._v.device

    @property
    def trainable(self) -> bool:
        return self._v.trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._v.synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        return self._v.aggregation

    @property
    def distribute_strategy(self) -> Strategy:
        return self._distribute_strategy

    @property
    def constraint(self) -> Callable[[Any], Any] | None:
        return self._v.constraint

    def value(self) -> TensorLike:
        """The value; read in a replica on a GPU, a copy on that GPU (the variable lives on the parameter device)."""
        value = self._v.value()
        here = device_lib.current()
        if here is not None and here.device_type == "GPU" and context.replica_context_in_run() is not None:
            return backend.for_device(here).to_device(value, here)
        return value

    def _write(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        api = describe_write("AggregatingVariable", op)
        if context.has_strategy() and context.get_strategy() is not self._distribute_strategy:
            raise context.wrong_strategy_scope(self._distribute_strategy, api)
        replica_context = context.replica_context_in_run()
        if replica_context is not None and replica_context.strategy is self._distribute_strategy:
            return aggregation.write_in_replica(self, op, value, read_value)
        return self._write_cross_replica(op, value, read_value)

    def _write_cross_replica(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        if isinstance(value, DistributedValues) and not isinstance(value, Variable):
            value = value.values[0]  # TensorFlow's select_single_value: the primary component
        return self._v._write(op, value, read_value)

    def __deepcopy__(self, memo: dict[int, Any]) -> AggregatingVariable:
        """A new aggregating variable of the same strategy holding a copy of the value (as TensorFlow's).

        Raises:
          ContextError: called under another strategy's scope.
        """
        if context.has_strategy() and context.get_strategy() is not self._distribute_strategy:
            raise context.wrong_strategy_scope(self._distribute_strategy, "copy.deepcopy()")
        inner = copy.deepcopy(self._v, memo)
        copied = AggregatingVariable(self._distribute_strategy, inner)
        memo[id(self)] = copied
        return copied

    def __repr__(self) -> str:
        return repr(self._v)
