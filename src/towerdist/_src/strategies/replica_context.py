"""``ReplicaContext``: what a replica function can do (``tf.distribute.ReplicaContext``).

Inside ``strategy.run(fn)``, ``td.distribute.get_replica_context()`` returns the calling
replica's context. It names the replica (``replica_id_in_sync_group``) and offers the
collective operations between replicas: ``merge_call`` (run a function once, in
cross-replica context, on everyone's arguments), ``all_reduce`` and ``all_gather``.
Every replica must make the same sequence of these calls.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import array_ops, backend, context, nest, thread_state
from towerdist._src import device as device_lib
from towerdist._src.backend import cupy_backend
from towerdist._src.cross_device_ops.sparse import copied
from towerdist._src.failures import name_api
from towerdist._src.indexed_slices import IndexedSlices, refuse_in_gather
from towerdist._src.options import CommunicationOptions
from towerdist._src.reduce_op import ReduceOp, parse_reduce_op
from towerdist._src.strategies.collective_args import (
    Contribution,
    check_gather_leaves,
    check_reduce_leaves,
    check_structures,
)
from towerdist._src.type_aliases import MergeFn, Nest, ReduceOpLike, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, PerReplica
from towerdist._src.values.regroup import select_replica

if TYPE_CHECKING:
    from towerdist._src.strategies.strategy import Strategy
    from towerdist._src.strategies.strategy_extended import StrategyExtended
    from towerdist._src.variables.variable import Variable

__all__ = ["ReplicaContext"]


class ReplicaContext:
    """The context of one replica inside ``strategy.run`` (``tf.distribute.ReplicaContext``).

    Get it with ``td.distribute.get_replica_context()`` rather than constructing it.
    Its methods must be called from the replica it belongs to.

    Example:
      >>> def step():
      ...     ctx = td.distribute.get_replica_context()
      ...     return ctx.all_reduce("sum", td.constant(1.0))
      >>> strategy.experimental_local_results(strategy.run(step))
      (array(2., dtype=float32), array(2., dtype=float32))
    """

    def __init__(self, strategy: Strategy, replica_id_in_sync_group: int | np.integer[Any] | None) -> None:
        if replica_id_in_sync_group is not None and not isinstance(replica_id_in_sync_group, (int, np.integer)):
            raise ValueError(
                f"replica_id_in_sync_group can only be an integer, a Tensor or None. Got "
                f"{replica_id_in_sync_group!r} of type {type(replica_id_in_sync_group).__name__}."
            )
        self._strategy = strategy
        self._replica_id = 0 if replica_id_in_sync_group is None else int(replica_id_in_sync_group)
        self._device: Any = None
        self._depths: list[int] = []

    # Entering pushes this replica context on the thread's mode stack. (No mode object is
    # kept on self: a self-reference cycle would keep results alive until the cycle
    # collector runs.)
    def __enter__(self) -> ReplicaContext:
        modes = thread_state.state.modes
        self._depths.append(len(modes))
        modes.append(thread_state.Mode(self._strategy, None, self))
        return self

    def __exit__(self, *exc_info: object) -> None:
        del thread_state.state.modes[self._depths.pop() :]

    # --- properties -----------------------------------------------------------------------

    @property
    def strategy(self) -> Strategy:
        """The strategy this replica belongs to."""
        return self._strategy

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas take part in collective operations."""
        count: int = self._strategy.num_replicas_in_sync
        return count

    @property
    def replica_id_in_sync_group(self) -> int | np.int32:
        """This replica's id, ``0 .. num_replicas_in_sync - 1``, as a numpy int32 scalar."""
        return np.int32(self._replica_id)

    @property
    def devices(self) -> tuple[str, ...]:
        """The device of this replica (deprecated in TensorFlow; kept for old code)."""
        here = self._device or device_lib.current() or device_lib.DeviceSpec()
        return (here.name,)

    # --- replica context ------------------------------------------------------------------

    def merge_call(self, merge_fn: MergeFn, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Nest:
        """Runs ``merge_fn(strategy, *args, **kwargs)`` once for all replicas.

        Every replica must call ``merge_call``; when all have arrived, replica 0's
        ``merge_fn`` runs once in cross-replica context with each argument regrouped
        across replicas (a ``PerReplica`` where the replicas passed different objects).
        Each replica gets back its part of the result (its component where the result is
        distributed).

        May only be called from the replica function this context belongs to.

        Example:
          >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
          >>> def merge_fn(strategy, value):  # runs once, in cross-replica context
          ...     print(value)
          ...     return strategy.reduce("sum", value, axis=None)
          >>> def step():
          ...     ctx = td.distribute.get_replica_context()
          ...     return ctx.merge_call(merge_fn, args=(ctx.replica_id_in_sync_group + 1,))
          >>> strategy.run(step)
          PerReplica:{
            0: 1,
            1: 2
          }
          array(3, dtype=int32)

        Raises:
          ContextError: called outside this replica's function.
        """
        context.require_replica_context(self, "ReplicaContext.merge_call()")
        if not isinstance(args, (list, tuple)):
            raise ValueError(
                f"ReplicaContext.merge_call() takes args as a list or tuple. Got args of type "
                f"{type(args).__name__}; wrap a single argument as args=(x,)."
            )
        return self._merge_call(merge_fn, tuple(args), dict(kwargs or {}), "merge_call()")

    def _merge_call(
        self, merge_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], collective: str
    ) -> Nest:
        # One replica: run merge_fn right here, in cross-replica context, and unpack
        # distributed results to this replica's component as the multi-replica path does.
        modes = thread_state.state.modes
        depth = len(modes)
        modes.append(context.cross_replica_mode(self._strategy))
        try:
            result = merge_fn(self._strategy, *args, **kwargs)
        finally:
            del thread_state.state.modes[depth:]
        return select_replica(self._replica_id, result)

    def _collective(
        self,
        fn: Callable[[Any, list[Any]], list[Any]],
        payload: object,
        collective: str,
        snapshot: Callable[[Any, int], tuple[Any, Collection[int]]] | None = None,
    ) -> Nest:
        """An internal collective: ``fn(strategy, payloads)`` runs once on every replica's payload.

        ``payloads`` are in replica order; ``fn`` returns one part per replica and this
        replica gets its part. Unlike ``merge_call``, nothing is regrouped or selected.
        With ``snapshot`` (``snapshot(payload, replica)`` copies the payload and says which
        single-device variables ``fn`` writes, by ``id``), ``fn`` returns None for every replica
        and a replica arriving before the others may hand the payload over and go on instead
        of waiting (``replica_step.py``, "Handing over"): its part is None.
        """
        del snapshot  # one replica: nothing to hand over to
        modes = thread_state.state.modes
        depth = len(modes)
        modes.append(context.cross_replica_mode(self._strategy))
        extended = self._strategy.extended
        seq = extended._collective_seq()
        try:
            parts = fn(self._strategy, [payload])
        except Exception as error:
            name_api(error, collective)  # a check's failure, worded by the collective the user called
            extended._failed_before(seq, collective, error)  # before the workers met: the other workers raise too
            raise
        finally:
            del thread_state.state.modes[depth:]
        return parts[0]

    def _update(
        self,
        var: Variable,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Nest:
        """Updates ``var`` from this replica: ``strategy.extended.update`` in replica context.

        TensorFlow's ``ReplicaContext._update``. Every replica calls it; the replicas'
        ``args``/``kwargs`` meet at a ``merge_call`` and component ``i`` of ``var`` is
        updated with replica ``i``'s arguments (the same object from every replica is
        used for every component). Returns this replica's part of the result.

        Example:
          >>> def step():
          ...     ctx = td.distribute.get_replica_context()
          ...     ctx._update(v, lambda var, value: var.assign(value), args=(td.identity(1.0),))
        """
        context.require_replica_context(self, "ReplicaContext._update()")
        return self._strategy.extended.update(var, fn, args, kwargs, group)

    def all_reduce(self, reduce_op: ReduceOpLike, value: Nest, options: CommunicationOptions | None = None) -> Nest:
        """Reduces ``value`` (a nested structure of arrays) across replicas.

        Every replica contributes its own ``value`` and receives the reduced structure.
        Integer values are reduced exactly; a MEAN of integers is float64.

        Args:
          reduce_op: ``ReduceOp.SUM``/``MEAN`` or ``"sum"``/``"mean"``.
          value: an array, scalar, or nested structure of them, with the same structure,
            shapes and dtypes in every replica.
          options: ``CommunicationOptions`` (e.g. ``bytes_per_pack``).

        Example:
          >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
          >>> def step():
          ...     ctx = td.distribute.get_replica_context()
          ...     return ctx.all_reduce("sum", ctx.replica_id_in_sync_group + 1)
          >>> strategy.run(step)  # 1 + 2 on every replica
          PerReplica:{
            0: array(3, dtype=int32),
            1: array(3, dtype=int32)
          }

        Raises:
          InvalidArgumentError: the replicas' structures, shapes or dtypes differ (the
            message names the key path and the replicas).
        """
        api = _ALL_REDUCE
        context.require_replica_context(self, api)
        op = parse_reduce_op(reduce_op, api)
        contribution = _contribution(value)

        def settle(strategy: Strategy, parts: list[Contribution]) -> list[Any]:
            check_structures(parts)
            check_reduce_leaves(parts)
            num_leaves = len(parts[0].arrays)
            columns = [[part.arrays[k] for part in parts] for k in range(num_leaves)]
            sparse = [k for k in range(num_leaves) if isinstance(columns[k][0], IndexedSlices)]
            if not sparse:
                reduced = strategy.extended._all_reduce(op, columns, options, collective=api)
            else:
                reduced = _all_reduce_mixed(strategy.extended, op, columns, sparse, options, api)
            return [_fresh([reduced[k][r] for k in range(num_leaves)], part.arrays) for r, part in enumerate(parts)]

        reduced = self._collective(settle, contribution, api)
        return _unflatten(contribution.spec, reduced)

    def all_gather(self, value: Nest, axis: int, options: CommunicationOptions | None = None) -> Nest:
        """Concatenates ``value`` (a nested structure of arrays) across replicas along ``axis``.

        Replica order is kept; sizes along ``axis`` may differ between replicas, every
        other dimension must agree. Scalars cannot be gathered.

        Example:
          >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
          >>> def step():
          ...     ctx = td.distribute.get_replica_context()
          ...     return ctx.all_gather(np.full(2, ctx.replica_id_in_sync_group), axis=0)
          >>> strategy.run(step)
          PerReplica:{
            0: array([0, 0, 1, 1], dtype=int32),
            1: array([0, 0, 1, 1], dtype=int32)
          }

        Raises:
          InvalidArgumentError: the replicas' structures differ, scalars, a bad ``axis``, or
            mismatched shapes/dtypes (the message names the key path and the replicas).
        """
        api = "ReplicaContext.all_gather()"
        context.require_replica_context(self, api)
        del options
        refuse_in_gather(value, api)
        contribution = _contribution(value)

        def settle(strategy: Strategy, parts: list[Contribution]) -> list[Any]:
            check_structures(parts)
            if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
                check_gather_leaves(parts, int(axis))
            devices = strategy.extended._replica_devices
            num_leaves = len(parts[0].arrays)
            per_leaf = [PerReplica([part.arrays[k] for part in parts], devices) for k in range(num_leaves)]
            # (_gather_to's errors are unworded: _collective, or the barrier, names them after api)
            gathered = [strategy.extended._gather_to(v, v, axis, collective=api) for v in per_leaf]
            return [
                _fresh([_component(gathered[k], r) for k in range(num_leaves)], part.arrays)
                for r, part in enumerate(parts)
            ]

        gathered = self._collective(settle, contribution, api)
        return _unflatten(contribution.spec, gathered)

    def __repr__(self) -> str:
        return f"ReplicaContext(replica {self._replica_id} of {self._strategy!r})"


_ALL_REDUCE = "ReplicaContext.all_reduce()"


def _all_reduce_mixed(
    extended: StrategyExtended,
    op: ReduceOp,
    columns: list[list[Any]],
    sparse: list[int],
    options: CommunicationOptions | None,
    api: str,
) -> list[list[Any]]:
    """``columns`` all-reduced, the ``sparse`` ones (``IndexedSlices``) on their own path."""
    dense = [k for k in range(len(columns)) if k not in set(sparse)]
    reduced: list[list[Any]] = [[] for _ in columns]
    if dense:
        for k, result in zip(dense, extended._all_reduce(op, [columns[k] for k in dense], options, collective=api)):
            reduced[k] = result
    for k, result in zip(sparse, extended._all_reduce_sparse(op, [columns[k] for k in sparse], options, collective=api)):
        reduced[k] = result
    return reduced


def _contribution(value: Nest) -> Contribution:
    """One replica's argument to a collective, flattened (a single array skips optree).

    An ``IndexedSlices`` stays as it is: one pass over every replica's rows sums them (each
    replica summing its own first, in parallel, measured slower: two passes over the rows).
    """
    if type(value) is np.ndarray or cupy_backend.owns(value):  # one array: no structure (host or GPU alike)
        return Contribution([value], None)
    leaves, spec = nest.flatten(value)
    return Contribution([_leaf(leaf) for leaf in leaves], spec)


def _leaf(leaf: TensorLike) -> TensorLike:
    if isinstance(leaf, IndexedSlices):
        return leaf  # summed with the other replicas' rows, in one pass (cross_device_ops/sparse.py)
    return array_ops.as_array(leaf)


def _unflatten(spec: nest.PyTreeSpec | None, leaves: list[Any]) -> Nest:
    return leaves[0] if spec is None else nest.unflatten(spec, leaves)


def _component(value: TensorLike, replica: int) -> TensorLike:
    return value.values[replica] if isinstance(value, DistributedValues) else value


def _fresh(results: list[Any], given: list[Any]) -> list[Any]:
    """``results`` with any array that is the replica's own input replaced by a copy.

    A single replica reduces a value to itself; it still gets a new array, as from a
    multi-replica all-reduce, never its own input object.
    """
    for k, (result, mine) in enumerate(zip(results, given)):
        if result is mine:
            results[k] = copied(result) if isinstance(result, IndexedSlices) else backend.for_array(result).copy(result)
    return results


class DefaultReplicaContext(ReplicaContext):
    """The replica context outside any strategy scope (``replica_id_in_sync_group`` is 0)."""

    @property
    def replica_id_in_sync_group(self) -> int | np.int32:
        return 0

    def __repr__(self) -> str:
        return "DefaultReplicaContext()"
