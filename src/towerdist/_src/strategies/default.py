"""The default strategy: what ``td.distribute.get_strategy()`` returns outside any scope.

It has one replica, runs functions directly on the calling thread, and its reductions
return their input: code written for a strategy also runs without one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from towerdist._src import context
from towerdist._src.device import DeviceSpec
from towerdist._src.input.input_context import InputContext, InputOptions
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.strategies.replica_context import DefaultReplicaContext, ReplicaContext
from towerdist._src.strategies.strategy import Strategy
from towerdist._src.strategies.strategy_extended import StrategyExtended
from towerdist._src.type_aliases import Destinations, Nest, TensorLike

__all__ = ["default_strategy"]


class _DefaultDistributionStrategy(Strategy):
    """The default (single-replica, no-op) strategy. There is exactly one instance."""

    def scope(self) -> Any:
        """Checks that no other strategy is current; changes nothing else."""
        return context.DefaultStrategyScope(self)


class DefaultExtended(StrategyExtended):
    def __init__(self, container_strategy: Strategy) -> None:
        super().__init__(container_strategy)
        self._default_replica_context = DefaultReplicaContext(container_strategy, 0)

    @property
    def _replica_devices(self) -> tuple[DeviceSpec, ...]:
        return (self._reduce_destination(),)

    @property
    def worker_devices(self) -> tuple[str, ...]:
        raise RuntimeError(
            "worker_devices() method unsupported by default tf.distribute.Strategy: there is no "
            "strategy scope; create a strategy (e.g. MirroredStrategy) to place replicas on devices."
        )

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        raise RuntimeError(
            "parameter_devices() method unsupported by default tf.distribute.Strategy: there is no "
            "strategy scope; create a strategy (e.g. MirroredStrategy) to place variables on devices."
        )

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Nest:
        with ReplicaContext(self._container_strategy(), 0):
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

    def _broadcast_to(self, tensor: TensorLike, destinations: Destinations) -> NoReturn:
        raise NotImplementedError(
            "broadcast_to() is not supported by the default strategy (as in TensorFlow); create a "
            "strategy to broadcast between devices."
        )

    def _gather_to(self, value: TensorLike, destinations: Destinations, axis: int, *, collective: str) -> TensorLike:
        return value

    def _local_results(self, value: Nest) -> tuple[Nest]:
        return (value,)

    def _experimental_distribute_dataset(self, dataset: Iterable[Nest], options: InputOptions | None) -> Iterable[Nest]:
        return dataset  # as TensorFlow: the default strategy iterates the dataset itself

    def _distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None
    ) -> Any:
        return dataset_fn(InputContext())

    def _variable_owner(self) -> None:
        return None  # variables created outside any scope belong to no strategy

    def _deepcopy_strategy(self) -> Strategy:
        raise RuntimeError(
            "Should only create a single instance of _DefaultDistributionStrategy: the default "
            "strategy cannot be copied."
        )

    def _describe(self) -> str:
        return "DefaultStrategy()"


def _make_default_strategy() -> _DefaultDistributionStrategy:
    strategy = _DefaultDistributionStrategy.__new__(_DefaultDistributionStrategy)
    Strategy.__init__(strategy, DefaultExtended(strategy))
    return strategy


# Created at import, so that replica threads asking for it concurrently all see one object.
_instance = _make_default_strategy()


def default_strategy() -> _DefaultDistributionStrategy:
    """The default strategy (there is exactly one)."""
    return _instance


context.register_default_strategy(default_strategy)
