"""TF 1.x's tower context: ``TowerContext``, ``get_tower_context()`` and friends.

A "tower" is TF 1.x's word for a replica. :class:`TowerContext` is a view of the current
:class:`ReplicaContext` with the old member names (``tower_id``, ``num_towers``,
``merge_call(fn, *args, **kwargs)``); it adds no state of its own. The module functions
are served under their old names by the table of ``towerdist._src.compat.old_names``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from towerdist._src import context, thread_state
from towerdist._src import device as device_lib
from towerdist._src.failures import unworded, worded_at
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import DeviceLike, MergeFn, Nest, ReduceOpLike
from towerdist._src.variable_enums import VariableAggregation

if TYPE_CHECKING:
    from towerdist._src.strategies.replica_context import ReplicaContext
    from towerdist._src.strategies.strategy import Strategy

__all__ = [
    "TowerContext",
    "UpdateContext",
    "get_cross_tower_context",
    "get_loss_reduction",
    "get_tower_context",
    "parse_method_string",
    "tower_local_var_scope",
]


class TowerContext:
    """TF 1.x's ``TowerContext``: the current replica, under its tower-era names.

    Get it with ``td.compat.v1.get_tower_context()`` inside ``call_for_each_tower`` (or
    ``strategy.run``); outside any strategy it describes the default strategy's single
    tower. Its methods must be called from the tower it belongs to.

    Example:
      >>> import towerdist.compat.v1 as tf
      >>> strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
      >>> def fn(three):
      ...     ctx = tf.get_tower_context()
      ...     return three + ctx.tower_id
      >>> strategy.unwrap(strategy.call_for_each_tower(fn, 3))
      [3, 4]
    """

    def __init__(self, replica_context: ReplicaContext) -> None:
        self._replica_context = replica_context

    @property
    def distribution_strategy(self) -> Strategy:
        """The strategy this tower belongs to."""
        return self._replica_context.strategy

    @property
    def tower_id(self) -> int:
        """This tower's number, ``0 .. num_towers - 1``, as a Python int."""
        context.require_replica_context(self._replica_context, "TowerContext.tower_id")
        return int(self._replica_context._replica_id)

    @property
    def num_towers(self) -> int:
        """How many towers run in sync (``ReplicaContext.num_replicas_in_sync``)."""
        count: int = self._replica_context.num_replicas_in_sync
        return count

    @property
    def is_single_tower(self) -> bool:
        """True when there is one tower, so ``call_for_each_tower`` calls ``fn`` once."""
        context.require_replica_context(self._replica_context, "TowerContext.is_single_tower")
        return self.num_towers == 1

    @property
    def device(self) -> str:
        """The canonical name of this tower's device."""
        return str(self._replica_context.devices[0])

    def merge_call(self, merge_fn: MergeFn, *args: Nest, **kwargs: Nest) -> Nest:
        """Runs ``merge_fn(strategy, *args, **kwargs)`` once for all towers (TF 1.x varargs form).

        Every tower must call it. ``merge_fn`` runs in cross-tower context with each
        argument regrouped across towers (``strategy.unwrap(arg)`` lists the towers'
        values); each tower gets back its part of the result. The same as
        ``ReplicaContext.merge_call(merge_fn, args=args, kwargs=kwargs)``.
        """
        context.require_replica_context(self._replica_context, "TowerContext.merge_call()")
        return self._replica_context._merge_call(merge_fn, args, kwargs, "merge_call()")

    def tower_local_var_scope(self, reduce_method: ReduceOpLike) -> AbstractContextManager[None]:
        """The strategy's ``tower_local_var_scope`` (variables created inside are sync-on-read)."""
        return tower_local_var_scope(self.distribution_strategy, reduce_method)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TowerContext) and other._replica_context is self._replica_context

    def __hash__(self) -> int:
        return hash(id(self._replica_context))

    def __repr__(self) -> str:
        return f"TowerContext({self._replica_context!r})"


class UpdateContext:
    """TF 1.x's ``UpdateContext(device)``: inside it, ``get_update_device()`` names ``device``.

    ``StrategyExtended.update`` enters one per variable copy; TF 1.x code rarely needs to.
    """

    def __init__(self, device: DeviceLike) -> None:
        self._context = context.UpdateContext(device_lib.parse(device), None)

    def __enter__(self) -> None:
        self._context.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self._context.__exit__(*exc_info)


def get_tower_context() -> TowerContext | None:
    """The current ``TowerContext``; None in cross-tower context (inside ``scope()`` or a ``merge_fn``)."""
    replica_context = context.get_replica_context()
    return None if replica_context is None else TowerContext(replica_context)


def get_cross_tower_context() -> Strategy | None:
    """The current strategy in cross-tower context (``scope()`` or a ``merge_fn``), else None."""
    return context.get_cross_replica_context()


def get_loss_reduction() -> ReduceOp:
    """How gradients are combined across replicas: ``ReduceOp.SUM``.

    towerdist has no ``tf.losses`` collection to inspect; losses are scaled per replica
    with ``td.nn.compute_average_loss``, after which gradients are summed.
    """
    return ReduceOp.SUM


_METHOD_STRINGS = {"sum": VariableAggregation.SUM, "mean": VariableAggregation.MEAN}


def parse_method_string(method: object, allow_only_first: bool = False) -> VariableAggregation:
    """TF 1.x's reduce method (``"sum"``/``"mean"``, a ``ReduceOp`` or a ``VariableAggregation``).

    Raises:
      ValueError: anything else, naming the value (unworded: the public method names itself).
    """
    if isinstance(method, str) and method.lower() in _METHOD_STRINGS:
        return _METHOD_STRINGS[method.lower()]
    if isinstance(method, ReduceOp):
        return VariableAggregation[method.name]
    allowed = {VariableAggregation.SUM, VariableAggregation.MEAN}
    if allow_only_first:
        allowed.add(VariableAggregation.ONLY_FIRST_REPLICA)
    if isinstance(method, VariableAggregation) and method in allowed:
        return method
    extra = " or VariableAggregation.ONLY_FIRST_TOWER" if allow_only_first else ""
    raise unworded(
        ValueError(
            f"got method {method!r}; TF 1.x reduce methods are the strings 'sum' and 'mean' (or "
            f"ReduceOp.SUM/MEAN, VariableAggregation.SUM/MEAN{extra})."
        )
    )


@contextmanager
def tower_local_var_scope(strategy: Strategy, reduce_method: ReduceOpLike) -> Iterator[None]:
    """Variables created inside are sync-on-read ("tower-local"), aggregated with ``reduce_method``.

    Each tower updates its own copy (``assign_add`` in the tower); reading the variable in
    cross-tower context (``fetch``, ``read_var``, checkpoints) gives the aggregate. The
    variables are never trainable. The TF 2 spelling is
    ``td.Variable(..., synchronization=ON_READ, aggregation=...)``.
    """
    with worded_at("tower_local_var_scope()"):
        aggregation = parse_method_string(reduce_method, allow_only_first=True)
    context.require_strategy_scope(strategy, "tower_local_var_scope()")
    stack = thread_state.state.sync_on_read
    depth = len(stack)
    stack.append((strategy, aggregation))
    try:
        yield
    finally:
        del stack[depth:]
