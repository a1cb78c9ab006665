"""``OneDeviceStrategy``: everything on one device, one replica, no threads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from towerdist._src import config
from towerdist._src import device as device_lib
from towerdist._src.device import DeviceSpec
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.strategies.replica_context import ReplicaContext
from towerdist._src.strategies.strategy import Strategy
from towerdist._src.strategies.strategy_extended import StrategyExtended
from towerdist._src.type_aliases import Destinations, DeviceLike, Nest, TensorLike
from towerdist._src.variables.variable import Variable

__all__ = ["OneDeviceStrategy"]


class OneDeviceStrategy(Strategy):
    """Runs on a single device (``tf.distribute.OneDeviceStrategy``).

    Useful to test code written for a strategy before scaling it out: ``run`` calls the
    function once, on the calling thread, under the device scope; reductions return
    their input; datasets are not split.

    Args:
      device: the device, e.g. ``"/cpu:0"`` or ``"GPU:0"``.

    Example:
      >>> strategy = td.distribute.OneDeviceStrategy("/cpu:0")
      >>> total = 0
      >>> for i in range(10):
      ...     total += strategy.run(lambda x: x * 2, args=(i,))
      >>> total
      90
    """

    def __init__(self, device: DeviceLike) -> None:
        super().__init__(OneDeviceExtended(self, device))


class OneDeviceExtended(StrategyExtended):
    def __init__(self, container_strategy: Strategy, device: DeviceLike) -> None:
        super().__init__(container_strategy)
        spec = device_lib.parse(device)
        if not config.device_exists(spec):
            raise ValueError(
                f"OneDeviceStrategy got device={device!r} ({spec.short_name}), which does not exist. "
                f"Logical devices: {', '.join(d.name for d in config.list_logical_devices())}."
            )
        config.mark_initialized(f"OneDeviceStrategy({spec.short_name!r})")
        self._device = spec
        self._default_device = spec

    @property
    def _replica_devices(self) -> tuple[DeviceSpec, ...]:
        return (self._device,)

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Nest:
        ctx = ReplicaContext(self._container_strategy(), 0)
        ctx._device = self._device
        with device_lib.device(self._device), ctx:
            return fn(*args, **kwargs)

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: TensorLike,
        destinations: Destinations,
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> TensorLike:
        return value

    def _broadcast_to(self, tensor: TensorLike, destinations: Destinations) -> TensorLike:
        return tensor

    def _gather_to(self, value: TensorLike, destinations: Destinations, axis: int, *, collective: str) -> TensorLike:
        return value

    def _local_results(self, value: Nest) -> tuple[Nest]:
        return (value,)

    def _variable_device(self, colocate_with: object) -> DeviceSpec:
        return self._device

    def _update_device(self, var: Variable) -> DeviceSpec | None:
        return self._device  # as TensorFlow: the strategy's device, wherever var was made

    def _non_slot_devices(self, var_list: list[Variable]) -> tuple[str]:
        return (self._device.name,)

    def _deepcopy_strategy(self) -> Strategy:
        return OneDeviceStrategy(self._device)

    def _describe(self) -> str:
        return f"OneDeviceStrategy({self._device.short_name!r})"
