"""``StrategyExtended``: the lower-level API of a strategy, and the hooks concrete strategies implement.

``Strategy`` (``strategy.py``) checks contexts and arguments and calls this class's
underscore hooks; the default, OneDevice and Mirrored strategies override them.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from towerdist._src import aliases, array_ops, backend, context, nest, steps, thread_state
from towerdist._src import device as device_lib
from towerdist._src.cross_device_ops.placement import ResolvedDevices, resolve_destinations
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import ContextError
from towerdist._src.failures import name_api, worded_at
from towerdist._src.indexed_slices import summed
from towerdist._src.input.distributed_dataset import DistributedDataset, DistributedDatasetsFromFunction, InputWorker
from towerdist._src.input.input_context import InputContext, InputOptions, InputReplicationMode
from towerdist._src.options import CommunicationOptions, ValueContext
from towerdist._src.reduce_op import ReduceOp, parse_reduce_op
from towerdist._src.strategies import legacy_names
from towerdist._src.strategies.arguments import (
    check_call_arguments,
    check_destinations,
    check_replication_options,
    devices_of,
    foreign_variable,
)
from towerdist._src.type_aliases import Destinations, Nest, ReduceOpLike, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, Mirrored, PerReplica
from towerdist._src.values.regroup import local_results, regroup, value_container
from towerdist._src.variables import creation
from towerdist._src.variables.distributed_variable import DistributedVariable, SyncOnReadVariable
from towerdist._src.variables.variable import Variable, read_unread

if TYPE_CHECKING:
    from towerdist._src.strategies.strategy import Strategy

__all__ = ["StrategyExtended", "update_regroup"]

# ``Strategy.reduce(axis=None)`` (and a sync-on-read variable's read, which is one): the workers' name for it.
_REDUCE = "Strategy.reduce()"


class StrategyExtended:
    """The lower-level API of a strategy (``tf.distribute.StrategyExtended``).

    Most code never needs it: optimizers and variables call it for you. It is where
    distribution-aware algorithms find reductions onto chosen devices (``reduce_to``,
    ``batch_reduce_to``), broadcasts and per-replica calls.
    """

    def __init__(self, container_strategy: Strategy) -> None:
        self._container_strategy_weakref = weakref.ref(container_strategy)
        self._default_device: DeviceSpec | None = None
        self._require_static_shapes = False

    def _collective_seq(self) -> int:
        """Where the workers' collectives stand, before preparing one (-1: this strategy has no other workers)."""
        return -1

    def _failed_before(self, seq: int, collective: str, error: BaseException) -> None:
        """Preparing a collective begun at ``seq`` failed here: tells the other workers (none here)."""

    def _container_strategy(self) -> Strategy:
        strategy = self._container_strategy_weakref()
        if strategy is None:
            raise ContextError(
                f"This {type(self).__name__} outlived its strategy: the strategy object was garbage-collected, "
                f"so its `extended` cannot be used any more. Keep a reference to the strategy for as long as "
                f"you use strategy.extended."
            )
        return strategy

    # --- any context ----------------------------------------------------------------------

    @property
    def experimental_require_static_shapes(self) -> bool:
        """True if the strategy needs static shapes (no towerdist strategy does)."""
        return self._require_static_shapes

    # TF 1.x leftovers that TF 2.x keeps on tf.compat.v1.distribute.StrategyExtended.

    _between_graph = False

    @property
    def experimental_between_graph(self) -> bool:
        """True when each worker builds its own program (parameter-server style); False for in-process strategies."""
        return self._between_graph

    @property
    def experimental_should_init(self) -> bool:
        """Whether this process should initialise variables: always True (towerdist variables start initialised)."""
        return True

    @property
    def should_checkpoint(self) -> bool:
        """Whether this process should save checkpoints: True (one process; the MPI strategy says so on rank 0 only)."""
        return True

    @property
    def should_save_summary(self) -> bool:
        """Whether this process should write summaries: True (one process)."""
        return True

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The canonical names of the devices replicas run on, in replica order."""
        return tuple(d.name for d in self._replica_devices)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The canonical names of the devices variables are placed on."""
        return tuple(d.name for d in self._replica_devices)

    @property
    def _num_replicas_in_sync(self) -> int:
        return len(self._replica_devices)

    # Workers (processes): one, except under MultiWorkerMirroredStrategy.

    @property
    def _num_workers(self) -> int:
        return 1

    @property
    def _worker_index(self) -> int:
        return 0

    @property
    def _first_replica_id(self) -> int:
        """The global replica id of this worker's first replica."""
        return 0

    @property
    def _replica_devices(self) -> tuple[DeviceSpec, ...]:
        raise NotImplementedError

    # --- cross-replica or default context -------------------------------------------------

    def reduce_to(
        self,
        reduce_op: ReduceOpLike,
        value: TensorLike,
        destinations: Destinations,
        options: CommunicationOptions | None = None,
    ) -> TensorLike:
        """Reduces ``value`` across replicas and places the result on ``destinations``.

        Args:
          reduce_op: ``ReduceOp.SUM``/``MEAN`` (or ``"sum"``/``"mean"``).
          value: a ``PerReplica`` (one value per replica).
          destinations: a device string, a distributed value or variable (its devices).
            Pass ``value`` itself to all-reduce.
          options: ``CommunicationOptions``.

        Returns:
          A ``Mirrored`` over the destination devices (a bare array for one device).
        """
        strategy = self._container_strategy()
        context.require_cross_replica_or_default(strategy, "StrategyExtended.reduce_to()")
        try:
            check_destinations(destinations)
            op = parse_reduce_op(reduce_op, "StrategyExtended.reduce_to()")
            return self._reduce_to(op, value, destinations, options, collective="StrategyExtended.reduce_to()")
        except BaseException as error:  # a hot path (optimizers): nothing to pay until it raises
            name_api(error, "StrategyExtended.reduce_to()")
            raise

    def batch_reduce_to(
        self,
        reduce_op: ReduceOpLike,
        value_destination_pairs: Sequence[tuple[TensorLike, Destinations]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Like ``reduce_to`` for many ``(value, destinations)`` pairs at once (packed).

        Values of mixed dtypes are fine; each dtype is packed separately.
        """
        strategy = self._container_strategy()
        context.require_cross_replica_or_default(strategy, "StrategyExtended.batch_reduce_to()")
        op = parse_reduce_op(reduce_op, "StrategyExtended.batch_reduce_to()")
        pairs = list(value_destination_pairs)
        with worded_at("StrategyExtended.batch_reduce_to()"):
            for value_and_destinations in pairs:
                if isinstance(value_and_destinations, tuple) and len(value_and_destinations) == 2:
                    check_destinations(value_and_destinations[1])
            return self._batch_reduce_to(op, pairs, options)

    def broadcast_to(self, tensor: TensorLike, destinations: Destinations) -> TensorLike:
        """Copies ``tensor`` to ``destinations`` (a ``Mirrored`` for several devices).

        Raises:
          ValueError: ``tensor`` is not an array, a number, a string or a nested list of
            them (None, a dict, a function), or is a ragged list.
        """
        strategy = self._container_strategy()
        api = "StrategyExtended.broadcast_to()"
        context.require_cross_replica_or_default(strategy, api)
        with worded_at(api):
            check_destinations(destinations)
            if not (
                backend.is_array(tensor) or isinstance(tensor, DistributedValues) or hasattr(tensor, "_towerdist_value")
            ):
                array_ops.from_python(tensor, api)  # raises for None, dicts, functions, ragged lists
            return self._broadcast_to(tensor, destinations)

    def call_for_each_replica(
        self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Nest:
        """Runs ``fn`` once per replica, as ``Strategy.run`` does."""
        strategy = self._container_strategy()
        context.require_cross_replica_or_default(strategy, "StrategyExtended.call_for_each_replica()")
        steps.begin()
        try:
            with worded_at("Strategy.run()"):  # its errors have always read as run()'s, which it is
                with strategy.scope():
                    return self._call_for_each_replica(fn, tuple(args), kwargs or {})
        finally:
            steps.end()

    # --- variables ----------------------------------------------------------------------

    def update(
        self,
        var: Variable,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Nest:
        """Runs ``fn(component, *args, **kwargs)`` on every component of ``var``.

        Each call runs in an update context (``td.distribute.get_update_device()`` names the
        component's device); ``PerReplica``/``Mirrored`` arguments are replaced by their
        component for that device, distributed variables are passed whole (and read or
        write their component for that device). Called in a replica context, the replicas'
        arguments first meet at a ``merge_call`` and are regrouped.

        Args:
          var: a variable created in this strategy's scope.
          fn: called as ``fn(component, *args, **kwargs)``.
          args: a list or tuple of positional arguments.
          kwargs: a dict of keyword arguments.
          group: True: the results merged into ``Mirrored`` values (a single value for one
            component); False: for each result, a tuple with one entry per component.

        Example:
          >>> with strategy.scope():
          ...     v = td.Variable(5.0, aggregation=td.VariableAggregation.SUM)
          >>> strategy.extended.update(v, lambda c: c.assign(1.0))
          Mirrored:{
            0: array(1., dtype=float32),
            1: array(1., dtype=float32)
          }
        """
        strategy = self._container_strategy()
        try:
            args, kwargs = check_call_arguments(args, kwargs)
        except BaseException as error:  # a hot path (optimizers): nothing to pay until it raises
            name_api(error, "StrategyExtended.update()")
            raise
        replica_context = context.replica_context_in_run()
        if replica_context is not None:
            # Inside strategy.run (of any strategy, the default one included): meet the other
            # replicas first, as TensorFlow does.
            def merge_update(
                merge_strategy: Strategy, merged_var: Variable | PerReplica[Variable], *merged_args: Nest, **merged_kwargs: Nest
            ) -> Nest:
                if isinstance(merged_var, PerReplica):
                    names = ", ".join(getattr(v, "name", repr(v)) for v in merged_var.values)
                    raise ValueError(
                        f"StrategyExtended.update() was called by the replicas with different variables "
                        f"({names}, in replica order); every replica must update the same variable at the "
                        f"same point."
                    )
                return self.update(merged_var, fn, merged_args, merged_kwargs, group)

            return replica_context._merge_call(merge_update, (var, *args), kwargs, "StrategyExtended.update()")
        context.require_cross_replica_or_default(strategy, "StrategyExtended.update()")
        self._check_update_variable(var)
        try:
            with strategy.scope():
                return self._update(var, fn, args, kwargs, group)
        except BaseException as error:  # a hot path (optimizers): nothing to pay until it raises
            name_api(error, "StrategyExtended.update()")
            raise

    def update_non_slot(
        self,
        colocate_with: object,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Nest:
        """Runs ``fn(*args, **kwargs)`` once per device of ``colocate_with``, in update contexts.

        ``colocate_with`` is what ``non_slot_devices()`` returned. Use it to update
        non-slot variables (an optimizer's step counter) created under
        ``colocate_vars_with(non_slot_devices(...))``. Call it in cross-replica context.
        """
        strategy = self._container_strategy()
        context.require_cross_replica_or_default(strategy, "StrategyExtended.update_non_slot()")
        with worded_at("StrategyExtended.update_non_slot()"):
            args, kwargs = check_call_arguments(args, kwargs)
            with strategy.scope():
                return self._update_non_slot(colocate_with, fn, args, kwargs, group)

    def non_slot_devices(self, var_list: Sequence[Variable]) -> Any:
        """Where non-slot variables live: pass it to ``colocate_vars_with`` and ``update_non_slot``.

        ``MirroredStrategy``: every replica device. The default and CentralStorage
        strategies: the variable of ``var_list`` with the smallest name (its device).
        """
        return self._non_slot_devices(list(var_list))

    def colocate_vars_with(self, colocate_with_variable: object) -> contextlib.AbstractContextManager[None]:
        """A context manager: variables created in it live on the same devices as the given one.

        Use it for an optimizer's slot variables, so that ``update(var, fn, args=(slot,))``
        finds every slot component next to its variable's. It also accepts the result of
        ``non_slot_devices()``. Call it inside ``strategy.scope()`` (or a replica function).

        Raises:
          ValueError: the argument is not a variable of this strategy (or its non-slot devices).
        """
        strategy = self._container_strategy()
        context.require_strategy_scope(strategy, "StrategyExtended.colocate_vars_with()")
        self._validate_colocate_with(colocate_with_variable)
        return _Colocation(strategy, colocate_with_variable)

    def value_container(self, value: object) -> object:
        """The distributed variable ``value`` is a component of, else ``value`` itself."""
        return value_container(value)

    def variable_created_in_scope(self, v: object) -> bool:
        """True if ``v`` was created while this strategy's scope was active."""
        return getattr(v, "_distribute_strategy", None) is self._variable_owner()

    def read_var(self, v: Variable) -> TensorLike:
        """The value of ``v`` as cross-replica code sees it (sync-on-read: the aggregate), as a new array.

        A sync-on-read variable is aggregated, so it must be read in cross-replica context
        of its strategy (or outside any scope). Other variables are read in any context, as
        in TensorFlow: in a replica, a mirrored variable gives that replica's copy.

        Raises:
          ContextError: ``v`` is sync-on-read and this is a replica context, or another
            strategy's scope.
        """
        if isinstance(v, SyncOnReadVariable):
            context.require_cross_replica_or_default(self._container_strategy(), "StrategyExtended.read_var()")
            return v._read_cross_replica()
        if isinstance(v, DistributedVariable) and context.replica_context_in_run() is None:
            return array_ops.identity(v._components[0])  # its primary copy, under any scope (as TF)
        return array_ops.identity(v)

    # --- hooks for concrete strategies ----------------------------------------------------

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Nest:
        """``Strategy.run`` once its arguments are checked: in the strategy's scope by default."""
        with self._container_strategy().scope():
            return self._call_for_each_replica(fn, args, kwargs)

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Nest:
        raise NotImplementedError

    # Input: strategies describe this process's replicas; MultiWorker adds its worker index.
    _supports_per_replica_input = False

    def _input_worker(self) -> InputWorker:
        return InputWorker(self._replica_devices)

    def _experimental_distribute_dataset(self, dataset: Iterable[Nest], options: InputOptions | None) -> Any:
        if options is not None and options.experimental_replication_mode is InputReplicationMode.PER_REPLICA:
            raise NotImplementedError(
                "InputReplicationMode.PER_REPLICA is only supported in `distribute_datasets_from_function`."
            )
        return DistributedDataset(dataset, self._input_worker(), self._container_strategy(), options)

    def _distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None
    ) -> Any:
        per_replica = options is not None and options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
        if per_replica and not self._supports_per_replica_input:  # before the options' own checks, as TF
            raise NotImplementedError(
                f"InputReplicationMode.PER_REPLICA is only supported in `distribute_datasets_from_function` of "
                f"MirroredStrategy, not {self._describe()}."
            )
        check_replication_options(options)
        return DistributedDatasetsFromFunction(
            dataset_fn,
            self._input_worker(),
            self._container_strategy(),
            options,
            per_replica,
        )

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: TensorLike,
        destinations: Destinations,
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> TensorLike:
        """Reduces ``value`` onto ``destinations``; the public method has checked the context and arguments.

        Its errors are :func:`~towerdist._src.failures.unworded`: the public method that called
        it (``reduce_to``, ``Strategy.reduce``, a variable's write) names itself in front.

        ``collective`` is what the workers of a multi-worker strategy call this collective: the
        public method the user called (``"Strategy.reduce()"``, a variable's write). They compare
        it before moving data (different calls at the same point raise on every worker) and
        their messages name it. Strategies of one process have nobody to agree with and ignore
        it. The same holds for ``_gather_to``, ``_all_reduce``, ``_sum_counts`` and
        ``_first_replica_value``.
        """
        raise NotImplementedError

    def _batch_reduce_to(
        self, reduce_op: ReduceOp, pairs: list[tuple[TensorLike, Destinations]], options: CommunicationOptions | None
    ) -> list[Any]:
        collective = "StrategyExtended.batch_reduce_to()"  # its only caller
        return [
            self._reduce_to(reduce_op, value, destinations, options, collective=collective)
            for value, destinations in pairs
        ]

    def _broadcast_to(self, tensor: TensorLike, destinations: Destinations) -> TensorLike:
        raise NotImplementedError

    def _gather_to(self, value: TensorLike, destinations: Destinations, axis: int, *, collective: str) -> TensorLike:
        """Concatenates the replicas' values along ``axis`` onto ``destinations`` (errors unworded)."""
        raise NotImplementedError

    def _local_results(self, value: Nest) -> tuple[Any, ...]:
        return local_results(value, self._num_replicas_in_sync)

    def _distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Nest:
        return value_fn(ValueContext())

    def _reduce_destination(self) -> DeviceSpec:
        """Where ``Strategy.reduce``/``gather`` put their result: the current device, else the host."""
        return device_lib.current() or self._default_device or device_lib.HOST

    def _reduce(self, reduce_op: ReduceOp, value: Nest) -> Nest:
        """Element-wise reduction across replicas onto the current device (``reduce(axis=None)``)."""
        destination = ResolvedDevices((self._reduce_destination(),))
        if isinstance(value, DistributedValues):
            return self._local_results(self._reduce_to(reduce_op, value, destination, None, collective=_REDUCE))[0]
        return nest.map_structure(
            lambda v: self._local_results(self._reduce_to(reduce_op, v, destination, None, collective=_REDUCE))[0],
            value,
        )

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        out: list[Any] | None = None,
        *,
        collective: str,
    ) -> list[list[Any]]:
        """The collective path: all-reduces checked values between this strategy's replicas.

        ``columns[k][r]`` is value ``k`` from replica ``r``; the caller has checked them (one
        shape and numeric dtype per value) at the API the user called. Returns
        ``results[k][r]``. With one replica every value is its own reduction (the same
        object: callers that hand it to users copy it). ``out`` is passed to the
        cross-device ops (see ``CrossDeviceOps._all_reduce``).
        """
        del reduce_op, options, out, collective
        return [list(column) for column in columns]

    def _sums_host_arrays_in_order(self) -> bool:
        """Whether ``_all_reduce(SUM, ...)`` of small host arrays is their element-wise sum in replica order.

        True when that sum is all the collective does: computed on the calling thread, with no
        other process to agree with and no user's ``CrossDeviceOps`` to call. A caller with
        private output buffers may then add the arrays itself (the optimizer's update of host
        variables does, every step), and gets the very values ``_all_reduce`` would give.
        """
        return False

    def _all_reduce_sparse(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> list[list[Any]]:
        """The collective path for ``IndexedSlices``: ``columns[k][r]`` in, ``results[k][r]`` out.

        The caller has checked every column (``indexed_slices.check_reducible``: 1-D
        indices, one dense shape and dtype). Results are in canonical form (each index
        once, sorted, duplicates summed; the densified value is the sum). With one replica
        that is the input's canonical form (possibly the input itself: callers that hand
        it to users copy it).
        """
        del reduce_op, options, collective
        return [[summed(value) for value in column] for column in columns]

    def _sum_counts(self, count: int, collective: str) -> int:
        """``count`` summed over the workers (this process's count with one worker)."""
        del collective
        return count

    def _first_replica_value(self, value: Nest, collective: str) -> TensorLike:
        """The value of global replica 0 (``ONLY_FIRST_REPLICA``): this worker's first component."""
        del collective
        return self._local_results(value)[0]

    def _deepcopy_strategy(self) -> Strategy:
        raise RuntimeError(f"{self._describe()} cannot be copied; create a new strategy instead.")

    def _describe(self) -> str:
        return f"{type(self._container_strategy()).__name__}()"

    # --- variable hooks (single-device behaviour: default and OneDevice strategies) --------

    def _variable_owner(self) -> Strategy | None:
        """What ``_distribute_strategy`` of a variable created in this strategy's scope is."""
        return self._container_strategy()

    def _create_variable(self, spec: creation.VariableSpec) -> Variable:
        owner = self._container_strategy() if context.has_strategy() else None
        return creation.plain_variable(spec, self._variable_device(spec.colocate_with), owner)

    def _variable_device(self, colocate_with: object) -> DeviceSpec:
        if colocate_with is not None:
            return devices_of(colocate_with)[0]
        return device_lib.current() or self._default_device or device_lib.HOST

    def _validate_colocate_with(self, colocate_with: object) -> None:
        devices_of(colocate_with)  # raises if it names no device

    def _check_update_variable(self, var: Variable) -> None:
        if isinstance(var, DistributedVariable) and var._distribute_strategy is not self._container_strategy():
            raise foreign_variable(var, self._describe())

    def _update_device(self, var: Variable) -> DeviceSpec | None:
        """The device ``update`` names for ``var`` (single-device strategies)."""
        return devices_of(var)[0] if hasattr(var, "_devices") else None

    def _update(
        self, var: Variable, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
    ) -> Nest:
        with context.UpdateContext(self._update_device(var), None):
            result = fn(var, *args, **kwargs)
        return result if group else nest.map_structure(self._local_results, result)

    def _update_non_slot(
        self, colocate_with: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
    ) -> Nest:
        with context.UpdateContext(self._non_slot_device(colocate_with), None):
            result = fn(*args, **kwargs)
        return result if group else nest.map_structure(self._local_results, result)

    def _non_slot_device(self, colocate_with: object) -> DeviceSpec:
        """The device ``update_non_slot`` names for ``colocate_with`` (single-device strategies).

        As in TensorFlow, any value is accepted: a variable, a distributed value or device
        names give their (first) device, an array its own device, anything else the
        current device.
        """
        if backend.is_array(colocate_with):
            return resolve_destinations(colocate_with)[0]
        try:
            return devices_of(colocate_with)[0]
        except ValueError:
            return device_lib.current() or self._default_device or device_lib.HOST

    def _non_slot_devices(self, var_list: list[Variable]) -> Any:
        if not var_list:
            raise ValueError("non_slot_devices() needs the list of variables being optimized; got an empty list.")
        return min(var_list, key=lambda v: v.name)


class _Colocation:
    """The context manager of ``colocate_vars_with``: pushes its target for variable creation."""

    def __init__(self, strategy: Strategy, target: object) -> None:
        self._entry = (strategy, target)

    def __enter__(self) -> None:
        thread_state.state.colocations.append(self._entry)

    def __exit__(self, *exc_info: object) -> None:
        thread_state.state.colocations.pop()


def update_regroup(results: list[Nest], devices: Sequence[DeviceSpec], group: bool) -> Nest:
    """Merges per-component update results: ``Mirrored`` values, or per-component tuples.

    Grouped, a component's write result (an ``UnreadVariable``) is read into its new value,
    as TensorFlow's grouped update reads each result; per-component tuples keep them. One
    component's result is returned as it is, as in TensorFlow (which reads the results only
    to order several of them): ``extended.update(v, lambda var: var.assign_sub(g))`` then
    returns the variable, read when used.
    """
    if group and len(results) == 1:
        return results[0]
    if group:
        return regroup([read_unread(result) for result in results], devices, wrap_class=Mirrored)
    merged = regroup(results, devices, wrap_class=Mirrored)
    return nest.map_structure(lambda x: x.values if isinstance(x, DistributedValues) else (x,), merged)


aliases.install(StrategyExtended, legacy_names.EXTENDED_OLD_NAMES)
