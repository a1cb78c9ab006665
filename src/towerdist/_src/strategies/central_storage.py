"""``CentralStorageStrategy``: replicated compute, variables stored once on a parameter device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from towerdist._src import config, context, nest
from towerdist._src import device as device_lib
from towerdist._src.cross_device_ops.reduction_to_one_device import ReductionToOneDevice
from towerdist._src.errors import ValidationError
from towerdist._src.strategies.mirrored import MirroredExtended
from towerdist._src.strategies.strategy import Strategy
from towerdist._src.strategies.strategy_extended import StrategyExtended
from towerdist._src.type_aliases import DeviceLike, Nest
from towerdist._src.values.distributed_values import DistributedValues
from towerdist._src.variables import creation
from towerdist._src.variables.aggregating_variable import AggregatingVariable
from towerdist._src.variables.variable import Variable

__all__ = ["CentralStorageStrategy"]

_HOST_NAME = "/device:CPU:0"


class CentralStorageStrategy(Strategy):
    """Replicates compute, keeps one copy of each variable (``tf.distribute.experimental.CentralStorageStrategy``).

    Replicas run as in ``MirroredStrategy`` (one thread per compute device). Variables
    created in its scope live once, on the parameter device; with more than one replica
    they are ``AggregatingVariable``\\ s: every replica reads the one copy, and writes made
    in replica context are aggregated across replicas (by the variable's
    ``aggregation``) before they are applied. Reductions go through the host CPU.

    Args:
      compute_devices: the replica devices; default all GPUs, else the host CPU.
      parameter_device: where variables live; default the only compute device when there
        is one, else the host CPU.

    Example:
      >>> strategy = td.distribute.experimental.CentralStorageStrategy(
      ...     compute_devices=["CPU:0", "CPU:1"], parameter_device="CPU:0")
      >>> with strategy.scope():
      ...     v = td.Variable(1.0, aggregation=td.VariableAggregation.SUM)
      >>> _ = strategy.run(lambda: v.assign_add(td.constant(1.0)))  # each replica adds 1.0
      >>> v
      <tf.Variable 'Variable:0' shape=() dtype=float32, numpy=3.0>
    """

    def __init__(
        self, compute_devices: Sequence[DeviceLike] | None = None, parameter_device: DeviceLike | None = None
    ) -> None:
        super().__init__(CentralStorageExtended(self, compute_devices, parameter_device))


class CentralStorageExtended(MirroredExtended):
    _between_graph = True  # a parameter-server strategy, as in TensorFlow

    def __init__(
        self,
        container_strategy: Strategy,
        compute_devices: Sequence[DeviceLike] | None,
        parameter_device: DeviceLike | None,
    ) -> None:
        if not compute_devices:
            compute_devices = [d.name for d in config.local_devices("GPU")] or [_HOST_NAME]
        super().__init__(container_strategy, compute_devices, ReductionToOneDevice(reduce_to_device=_HOST_NAME))
        if parameter_device is None:
            parameter_device = self._devices[0].name if len(self._devices) == 1 else _HOST_NAME
        spec = device_lib.parse(parameter_device)
        if not config.device_exists(spec):
            raise ValueError(
                f"CentralStorageStrategy got parameter_device={parameter_device!r} ({spec.short_name}), which does "
                f"not exist. Logical devices: {', '.join(d.name for d in config.list_logical_devices())}."
            )
        self._parameter_device = spec
        self._parameter_device_name = str(parameter_device)  # reported as given, as TensorFlow does
        self._central_init_args = (compute_devices, parameter_device)  # MirroredExtended._init_args holds its own

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return (self._parameter_device_name,)

    # --- variables ------------------------------------------------------------------------

    def _create_variable(self, spec: creation.VariableSpec) -> Variable:
        strategy = self._container_strategy()
        variable = creation.plain_variable(spec, self._parameter_device, strategy)
        if len(self._devices) == 1:
            return variable
        return AggregatingVariable(strategy, variable)

    def _validate_colocate_with(self, colocate_with: object) -> None:
        if isinstance(colocate_with, Variable) and colocate_with.distribute_strategy is self._container_strategy():
            return
        raise ValueError(
            f"`colocate_vars_with` must only be passed a variable created in this tf.distribute.Strategy.scope(), "
            f"not: {colocate_with!r}. (Every variable of {self._describe()} lives on "
            f"{self._parameter_device.short_name} anyway.)"
        )

    def _check_update_variable(self, var: Variable) -> None:
        if (
            not isinstance(var, Variable)
            or getattr(var, "_distribute_strategy", None) is not self._container_strategy()
        ):
            raise ValidationError(
                f"StrategyExtended.update() of {self._describe()} needs a variable created in its scope; got "
                f"{var!r}. Create the variable inside `with strategy.scope():`."
            )

    def _update(
        self, var: Variable, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
    ) -> Nest:
        target = var.get() if isinstance(var, AggregatingVariable) else var
        with context.UpdateContext(self._parameter_device, None):
            result = fn(target, *_primary(args), **_primary(kwargs))
        return result if group else nest.map_structure(self._local_results, result)

    _update_non_slot = StrategyExtended._update_non_slot
    _non_slot_devices = StrategyExtended._non_slot_devices

    # --- description ----------------------------------------------------------------------

    def _deepcopy_strategy(self) -> Strategy:
        compute_devices, parameter_device = self._central_init_args
        return CentralStorageStrategy(compute_devices, parameter_device)

    def _describe(self) -> str:
        devices = tuple(d.short_name for d in self._devices)
        return f"CentralStorageStrategy(compute_devices={devices!r}, parameter_device={self._parameter_device_name!r})"


def _primary(structure: Nest) -> Nest:
    """``structure`` with each distributed value replaced by its first component."""
    return nest.map_structure(
        lambda x: x.values[0] if isinstance(x, DistributedValues) and not isinstance(x, Variable) else x, structure
    )
