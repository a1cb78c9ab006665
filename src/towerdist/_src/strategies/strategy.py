"""``Strategy`` and ``StrategyExtended``: the API every strategy shares.

``Strategy`` is thin: it checks the context, parses arguments and delegates to its
``StrategyExtended``, which holds the logic. Concrete strategies (default, OneDevice,
Mirrored) subclass ``StrategyExtended`` and implement its underscore hooks.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from towerdist._src import aliases, array_ops, backend, context, nest, thread_state, type_aliases
from towerdist._src import device as device_lib
from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver
from towerdist._src.cross_device_ops.gather import normalize_axis
from towerdist._src.cross_device_ops.placement import Destinations, resolve_destinations
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import ContextError, ValidationError
from towerdist._src.input.distributed_dataset import DistributedDataset, DistributedDatasetsFromFunction, InputWorker
from towerdist._src.input.input_context import InputContext, InputOptions, InputReplicationMode
from towerdist._src.options import CommunicationOptions, ValueContext
from towerdist._src.reduce_op import ReduceOp, parse_reduce_op
from towerdist._src.type_aliases import Nest, ReplicaFn
from towerdist._src.values.distributed_values import DistributedValues, Mirrored, PerReplica
from towerdist._src.values.regroup import local_results, regroup, value_container
from towerdist._src.variables import creation
from towerdist._src.variables.distributed_variable import DistributedVariable, SyncOnReadVariable
from towerdist._src.variables.variable import read_unread

__all__ = ["Strategy", "StrategyExtended"]


class Strategy:
    """A way to run one computation on several devices (``tf.distribute.Strategy``).

    Use a concrete strategy (``MirroredStrategy``, ``OneDeviceStrategy``) or the default
    one (``td.distribute.get_strategy()`` outside any scope).

    The methods are grouped by the context they may be called in; see the package
    docstring of ``towerdist.distribute`` for the contexts.
    """

    def __init__(self, extended: StrategyExtended) -> None:
        self._extended = extended

    # --- any context ----------------------------------------------------------------------

    @property
    def extended(self) -> StrategyExtended:
        """The ``StrategyExtended`` with the lower-level API of this strategy."""
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run ``fn`` in each ``run`` call."""
        return self._extended._num_replicas_in_sync

    @property
    def cluster_resolver(self) -> ClusterResolver | None:
        """The cluster resolver (None: single-machine strategies have none)."""
        return None

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The per-replica parts of ``value``, in replica order.

        A distributed value gives its components; a nested structure gives one copy per
        replica with its distributed leaves selected; any other value gives ``(value,)``.
        """
        return self._extended._local_results(value)

    def experimental_distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Any:
        """Builds a distributed value by calling ``value_fn(ValueContext(...))`` per replica.

        Multi-replica strategies always return a ``PerReplica`` (even of equal values);
        single-replica strategies return ``value_fn``'s result as it is.

        Example:
          >>> strategy.experimental_distribute_values_from_function(
          ...     lambda ctx: ctx.replica_id_in_sync_group * 10)
          PerReplica:{
            0: 0,
            1: 10
          }
        """
        return self._extended._distribute_values_from_function(value_fn)

    # --- input --------------------------------------------------------------------------

    def experimental_distribute_dataset(self, dataset: Any, options: InputOptions | None = None) -> Any:
        """Splits each global batch of ``dataset`` across the replicas.

        ``dataset`` yields *global* batches: a ``td.data.Dataset``, a ``tf.data.Dataset``, a
        PyTorch ``DataLoader`` or any iterable of array structures. With the default
        auto-shard policy a batch of ``b`` rows becomes ``N`` pieces of ``ceil(b / N)`` rows
        (the last ones shorter or empty); with ``AutoShardPolicy.OFF``, TensorFlow's cycling
        rule. The default strategy returns ``dataset`` unchanged; one-replica strategies
        return its elements unsplit.

        Example:
          >>> dist = strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2))
          >>> [strategy.experimental_local_results(x) for x in dist]
          [(array([0]), array([1])), (array([2]), array([3]))]

        Raises:
          ValueError: the elements are scalars (call ``batch`` first).
          NotImplementedError: ``options`` asks for ``InputReplicationMode.PER_REPLICA``.
          TypeError: ``dataset`` is an array or not iterable, or ``options`` is not ``InputOptions``.
        """
        options = _check_input_options(options, "experimental_distribute_dataset()")
        return self._extended._experimental_distribute_dataset(dataset, options)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None = None
    ) -> Any:
        """Feeds the replicas from datasets that ``dataset_fn(input_context)`` builds.

        ``dataset_fn`` is called once per worker (once per replica with
        ``InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)``) with
        an ``InputContext``; nothing is split or sharded: each replica takes the next whole
        element, and replicas left without one at the end get empty pieces.

        Example:
          >>> def dataset_fn(ctx):
          ...     batch = ctx.get_per_replica_batch_size(4)
          ...     return td.data.Dataset.range(8).batch(batch).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
          >>> dist = strategy.distribute_datasets_from_function(dataset_fn)

        Raises:
          ValueError: inconsistent ``InputOptions`` (as TensorFlow checks them).
          NotImplementedError: ``PER_REPLICA`` on a strategy that does not support it.
        """
        options = _check_input_options(options, "distribute_datasets_from_function()")
        return self._extended._distribute_datasets_from_function(dataset_fn, options)

    # --- cross-replica or default context -------------------------------------------------

    def scope(self) -> context.StrategyScope:
        """A context manager making this strategy current (cross-replica context).

        Entering the scope of the strategy that is already current is allowed and
        counted; entering another strategy's scope inside it raises ``ContextError``.
        ``with strategy.scope() as s:`` binds ``s`` to the strategy.
        """
        return context.StrategyScope(self)

    def run(
        self,
        fn: ReplicaFn,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Nest:
        """Runs ``fn`` once per replica and merges the results.

        Replica ``i`` receives ``args``/``kwargs`` with every ``PerReplica``/``Mirrored``
        replaced by its component ``i`` (distributed variables are passed whole). The
        results are merged by identity: the same object from every replica is returned
        as it is, different objects become a ``PerReplica``; lists, tuples, namedtuples
        and dicts are merged element-wise.

        Call it in cross-replica context or outside any scope (also from a ``merge_fn``).

        Args:
          fn: the replica function.
          args: a list or tuple of positional arguments.
          kwargs: a dict of keyword arguments.
          options: a ``td.distribute.RunOptions``; accepted and ignored (TPU-only in TF).

        Raises:
          ContextError: called inside a replica function, or under another strategy.
          ValueError: ``args`` is not a list or tuple, or a distributed argument has the
            wrong number of components.
        """
        del options
        context.require_cross_replica_or_default(self, "Strategy.run()")
        if not isinstance(args, (list, tuple)):
            raise ValueError(
                f"positional args must be a list or tuple, got {type(args)}. Strategy.run() passes "
                f"args=(x,) as fn(x); wrap a single argument in a tuple."
            )
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"Strategy.run() takes kwargs as a dict. Got kwargs of type {type(kwargs).__name__}.")
        return self._extended._run(fn, tuple(args), kwargs or {})

    def reduce(self, reduce_op: Any, value: Any, axis: Any) -> Any:
        """Reduces ``value`` across replicas (and along ``axis`` when given).

        * ``axis=None``: element-wise across replicas; every replica's value must have the
          same shape.
        * ``axis=k`` (or a tuple of axes): SUM gives the global sum over the replicas and
          ``axis``; MEAN the global sum divided by the global number of elements along
          ``axis``, so uneven and empty replicas are weighted exactly. A MEAN of integers
          is float64.

        A non-distributed ``value`` stands for the same value on every replica: MEAN
        returns it; SUM raises on more than one replica (the sum would be ambiguous).
        Call it in cross-replica context or outside any scope.

        Raises:
          ValueError: an unknown reduce op, or SUM of a non-distributed value.
          TypeError: ``reduce_op`` is not a ReduceOp or string, or ``axis`` is not an int.
          InvalidArgumentError: shapes differ (``axis=None``) or ``axis`` is out of range.
        """
        context.require_cross_replica_or_default(self, "Strategy.reduce()")
        op = parse_reduce_op(reduce_op, "Strategy.reduce()")
        if axis is None:
            return self._extended._reduce(op, value)
        return self._reduce_along_axis(op, value, axis)

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenates the replicas' values along ``axis`` onto the current device.

        Sizes along ``axis`` may differ between replicas. A non-distributed value is
        returned as it is. Call it in cross-replica context (in a replica, use
        ``ReplicaContext.all_gather``).
        """
        context.require_cross_replica_or_default(
            self, "Strategy.gather()", fix="use get_replica_context().all_gather() in a replica instead"
        )
        destination = Destinations((self._extended._reduce_destination(),))
        return nest.map_structure(lambda v: local_results(self._extended._gather_to(v, destination, axis), 1)[0], value)

    def group(self, value: Any, name: str | None = None) -> None:
        """Waits until every component of ``value`` is computed (``tf.group`` of its local results).

        In TensorFlow's graph mode this makes one op that runs them all. Eagerly, numpy
        arrays are already computed and cupy arrays are synchronised with their device.
        Callable in any context.

        Args:
          value: a nest of arrays or distributed values.
          name: accepted for TensorFlow compatibility; unused.

        Returns:
          None, as eager ``tf.group`` does.
        """
        del name
        pending = set()
        for component in nest.flatten(self.experimental_local_results(value))[0]:
            if backend.for_array(component) is not backend.host():
                pending.add(int(component.device.id))
        for index in sorted(pending):
            gpu = device_lib.DeviceSpec(device_type="GPU", device_index=index)
            backend.for_device(gpu).synchronize(gpu)

    # --- helpers --------------------------------------------------------------------------

    def _reduce_along_axis(self, op: ReduceOp, value: Any, axis: Any) -> Any:
        if isinstance(value, DistributedValues):
            parts = list(self._extended._local_results(value))
        else:
            parts = [value] * len(self._extended._replica_devices)  # the same value on every replica
        arrays = [array_ops.as_array(p) for p in parts]
        axes = _axes(axis, arrays[0].ndim)
        sums = [array_ops.reduce_sum(a, axis=axes) for a in arrays]
        devices = self._extended._replica_devices
        numer = self._extended._reduce(ReduceOp.SUM, PerReplica(sums, devices) if len(sums) > 1 else sums[0])
        if op is ReduceOp.SUM:
            return numer
        count = self._extended._sum_counts(sum(_count(a.shape, axes) for a in arrays), "Strategy.reduce()")
        impl = backend.for_array(numer)
        return impl.true_divide(numer, impl.asarray(count, dtype=numer.dtype))

    def __copy__(self) -> Any:
        raise RuntimeError(
            f"Must only deepcopy DistributionStrategy: copy.copy({self!r}) would share its replica "
            f"threads; use copy.deepcopy() or create a new strategy."
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self._extended._deepcopy_strategy()

    def __repr__(self) -> str:
        return self._extended._describe()


def _check_input_options(options: Any, api: str) -> InputOptions | None:
    if options is not None and not isinstance(options, InputOptions):
        raise TypeError(f"{api} takes options=td.distribute.InputOptions(...). Got options={options!r}.")
    return options


def _check_replication_options(options: InputOptions | None) -> None:
    """TensorFlow's consistency checks of ``InputOptions`` for ``distribute_datasets_from_function``."""
    if options is None:
        return
    per_replica = options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    if not per_replica and options.experimental_place_dataset_on_device:
        raise ValueError(
            "When `experimental_place_dataset_on_device` is set for dataset placement, you must also "
            "specify `PER_REPLICA` for the replication mode."
        )
    if per_replica and options.experimental_place_dataset_on_device and options.experimental_fetch_to_device:
        raise ValueError(
            "`experimental_place_dataset_on_device` can not be set to True when experimental_fetch_to_device "
            "is True and replication mode is set to `PER_REPLICA`; pass experimental_fetch_to_device=False."
        )


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    raw = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    axes = tuple(normalize_axis(a, ndim, "Strategy.reduce()") for a in raw)
    if len(set(axes)) != len(axes):
        raise ValueError(f"Strategy.reduce() got a repeated axis: axis={axis!r}.")
    return axes


def _count(shape: Sequence[int], axes: Sequence[int]) -> int:
    count = 1
    for a in axes:
        count *= int(shape[a])
    return count


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

    def _failed_before(self, seq: int, api: str, error: BaseException) -> None:
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
        reduce_op: Any,
        value: Any,
        destinations: type_aliases.Destinations,
        options: CommunicationOptions | None = None,
    ) -> Any:
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
        _check_destinations(destinations, "StrategyExtended.reduce_to()")
        op = parse_reduce_op(reduce_op, "StrategyExtended.reduce_to()")
        return self._reduce_to(op, value, destinations, options)

    def batch_reduce_to(
        self,
        reduce_op: Any,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list[Any]:
        """Like ``reduce_to`` for many ``(value, destinations)`` pairs at once (packed).

        Values of mixed dtypes are fine; each dtype is packed separately.
        """
        strategy = self._container_strategy()
        context.require_cross_replica_or_default(strategy, "StrategyExtended.batch_reduce_to()")
        op = parse_reduce_op(reduce_op, "StrategyExtended.batch_reduce_to()")
        pairs = list(value_destination_pairs)
        for value_and_destinations in pairs:
            if isinstance(value_and_destinations, tuple) and len(value_and_destinations) == 2:
                _check_destinations(value_and_destinations[1], "StrategyExtended.batch_reduce_to()")
        return self._batch_reduce_to(op, pairs, options)

    def broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        """Copies ``tensor`` to ``destinations`` (a ``Mirrored`` for several devices).

        Raises:
          ValueError: ``tensor`` is not an array, a number, a string or a nested list of
            them (None, a dict, a function), or is a ragged list.
        """
        strategy = self._container_strategy()
        api = "StrategyExtended.broadcast_to()"
        context.require_cross_replica_or_default(strategy, api)
        _check_destinations(destinations, api)
        if not (
            backend.is_array(tensor) or isinstance(tensor, DistributedValues) or hasattr(tensor, "_towerdist_value")
        ):
            array_ops.from_python(tensor, api)  # raises for None, dicts, functions, ragged lists
        return self._broadcast_to(tensor, destinations)

    def call_for_each_replica(
        self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Runs ``fn`` once per replica, as ``Strategy.run`` does."""
        strategy = self._container_strategy()
        context.require_cross_replica_or_default(strategy, "StrategyExtended.call_for_each_replica()")
        with strategy.scope():
            return self._call_for_each_replica(fn, tuple(args), kwargs or {})

    # --- variables ----------------------------------------------------------------------

    def update(
        self,
        var: Any,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Any:
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
        args, kwargs = _check_call_arguments(args, kwargs, "StrategyExtended.update()")
        replica_context = context.replica_context_in_run()
        if replica_context is not None:
            # Inside strategy.run (of any strategy, the default one included): meet the other
            # replicas first, as TensorFlow does.
            def merge_update(merge_strategy: Any, merged_var: Any, *merged_args: Any, **merged_kwargs: Any) -> Any:
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
        with strategy.scope():
            return self._update(var, fn, args, kwargs, group)

    def update_non_slot(
        self,
        colocate_with: Any,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        group: bool = True,
    ) -> Any:
        """Runs ``fn(*args, **kwargs)`` once per device of ``colocate_with``, in update contexts.

        ``colocate_with`` is what ``non_slot_devices()`` returned. Use it to update
        non-slot variables (an optimizer's step counter) created under
        ``colocate_vars_with(non_slot_devices(...))``. Call it in cross-replica context.
        """
        strategy = self._container_strategy()
        context.require_cross_replica_or_default(strategy, "StrategyExtended.update_non_slot()")
        args, kwargs = _check_call_arguments(args, kwargs, "StrategyExtended.update_non_slot()")
        with strategy.scope():
            return self._update_non_slot(colocate_with, fn, args, kwargs, group)

    def non_slot_devices(self, var_list: Sequence[Any]) -> Any:
        """Where non-slot variables live: pass it to ``colocate_vars_with`` and ``update_non_slot``.

        ``MirroredStrategy``: every replica device. The default and CentralStorage
        strategies: the variable of ``var_list`` with the smallest name (its device).
        """
        return self._non_slot_devices(list(var_list))

    def colocate_vars_with(self, colocate_with_variable: Any) -> contextlib.AbstractContextManager[None]:
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

    def value_container(self, value: Any) -> Any:
        """The distributed variable ``value`` is a component of, else ``value`` itself."""
        return value_container(value)

    def variable_created_in_scope(self, v: Any) -> bool:
        """True if ``v`` was created while this strategy's scope was active."""
        return getattr(v, "_distribute_strategy", None) is self._variable_owner()

    def read_var(self, v: Any) -> Any:
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

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``Strategy.run`` once its arguments are checked: in the strategy's scope by default."""
        with self._container_strategy().scope():
            return self._call_for_each_replica(fn, args, kwargs)

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    # Input: strategies describe this process's replicas; MultiWorker adds its worker index.
    _supports_per_replica_input = False

    def _input_worker(self) -> InputWorker:
        return InputWorker(self._replica_devices)

    def _experimental_distribute_dataset(self, dataset: Any, options: InputOptions | None) -> Any:
        if options is not None and options.experimental_replication_mode is InputReplicationMode.PER_REPLICA:
            raise NotImplementedError(
                "InputReplicationMode.PER_REPLICA is only supported in `distribute_datasets_from_function`."
            )
        return DistributedDataset(
            dataset, self._input_worker(), self._container_strategy(), options, "experimental_distribute_dataset()"
        )

    def _distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None
    ) -> Any:
        per_replica = options is not None and options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
        if per_replica and not self._supports_per_replica_input:  # before the options' own checks, as TF
            raise NotImplementedError(
                f"InputReplicationMode.PER_REPLICA is only supported in `distribute_datasets_from_function` of "
                f"MirroredStrategy, not {self._describe()}."
            )
        _check_replication_options(options)
        return DistributedDatasetsFromFunction(
            dataset_fn,
            self._input_worker(),
            self._container_strategy(),
            options,
            per_replica,
            "distribute_datasets_from_function()",
        )

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: Any,
        destinations: Any,
        options: CommunicationOptions | None,
        api: str = "StrategyExtended.reduce_to()",
    ) -> Any:
        raise NotImplementedError

    def _batch_reduce_to(
        self, reduce_op: ReduceOp, pairs: list[tuple[Any, Any]], options: CommunicationOptions | None
    ) -> list[Any]:
        return [self._reduce_to(reduce_op, value, destinations, options) for value, destinations in pairs]

    def _broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        raise NotImplementedError

    def _gather_to(self, value: Any, destinations: Any, axis: Any, api: str = "Strategy.gather()") -> Any:
        raise NotImplementedError

    def _local_results(self, value: Any) -> tuple[Any, ...]:
        return local_results(value, self._num_replicas_in_sync)

    def _distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Any:
        return value_fn(ValueContext())

    def _reduce_destination(self) -> DeviceSpec:
        """Where ``Strategy.reduce``/``gather`` put their result: the current device, else the host."""
        return device_lib.current() or self._default_device or device_lib.HOST

    def _reduce(self, reduce_op: ReduceOp, value: Any) -> Any:
        """Element-wise reduction across replicas onto the current device (``reduce(axis=None)``)."""
        destination = Destinations((self._reduce_destination(),))
        api = "Strategy.reduce()"
        if isinstance(value, DistributedValues):
            return self._local_results(self._reduce_to(reduce_op, value, destination, None, api))[0]
        return nest.map_structure(
            lambda v: self._local_results(self._reduce_to(reduce_op, v, destination, None, api))[0], value
        )

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        out: list[Any] | None = None,
        api: str = "ReplicaContext.all_reduce()",
    ) -> list[list[Any]]:
        """The collective path: all-reduces checked values between this strategy's replicas.

        ``columns[k][r]`` is value ``k`` from replica ``r``; the caller has checked them (one
        shape and numeric dtype per value) at the API the user called. Returns
        ``results[k][r]``. With one replica every value is its own reduction (the same
        object: callers that hand it to users copy it). ``out`` is passed to the
        cross-device ops (see ``CrossDeviceOps._all_reduce``).
        """
        del reduce_op, options, out
        return [list(column) for column in columns]

    def _sum_counts(self, count: int, api: str) -> int:
        """``count`` summed over the workers (this process's count with one worker)."""
        del api
        return count

    def _first_replica_value(self, value: Any, api: str) -> Any:
        """The value of global replica 0 (``ONLY_FIRST_REPLICA``): this worker's first component."""
        del api
        return self._local_results(value)[0]

    def _deepcopy_strategy(self) -> Strategy:
        raise RuntimeError(f"{self._describe()} cannot be copied; create a new strategy instead.")

    def _describe(self) -> str:
        return f"{type(self._container_strategy()).__name__}()"

    # --- variable hooks (single-device behaviour: default and OneDevice strategies) --------

    def _variable_owner(self) -> Any:
        """What ``_distribute_strategy`` of a variable created in this strategy's scope is."""
        return self._container_strategy()

    def _create_variable(self, spec: creation.VariableSpec) -> Any:
        owner = self._container_strategy() if context.has_strategy() else None
        return creation.plain_variable(spec, self._variable_device(spec.colocate_with), owner)

    def _variable_device(self, colocate_with: Any) -> DeviceSpec:
        if colocate_with is not None:
            return _devices_of(colocate_with)[0]
        return device_lib.current() or self._default_device or device_lib.HOST

    def _validate_colocate_with(self, colocate_with: Any) -> None:
        _devices_of(colocate_with)  # raises if it names no device

    def _check_update_variable(self, var: Any) -> None:
        if isinstance(var, DistributedVariable) and var._distribute_strategy is not self._container_strategy():
            raise _foreign_variable(var, self._describe())

    def _update_device(self, var: Any) -> DeviceSpec | None:
        """The device ``update`` names for ``var`` (single-device strategies)."""
        return _devices_of(var)[0] if hasattr(var, "_devices") else None

    def _update(
        self, var: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
    ) -> Any:
        with context.UpdateContext(self._update_device(var), None):
            result = fn(var, *args, **kwargs)
        return result if group else nest.map_structure(self._local_results, result)

    def _update_non_slot(
        self, colocate_with: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
    ) -> Any:
        with context.UpdateContext(self._non_slot_device(colocate_with), None):
            result = fn(*args, **kwargs)
        return result if group else nest.map_structure(self._local_results, result)

    def _non_slot_device(self, colocate_with: Any) -> DeviceSpec:
        """The device ``update_non_slot`` names for ``colocate_with`` (single-device strategies).

        As in TensorFlow, any value is accepted: a variable, a distributed value or device
        names give their (first) device, an array its own device, anything else the
        current device.
        """
        if backend.is_array(colocate_with):
            return resolve_destinations(colocate_with)[0]
        try:
            return _devices_of(colocate_with)[0]
        except ValueError:
            return device_lib.current() or self._default_device or device_lib.HOST

    def _non_slot_devices(self, var_list: list[Any]) -> Any:
        if not var_list:
            raise ValueError("non_slot_devices() needs the list of variables being optimized; got an empty list.")
        return min(var_list, key=lambda v: v.name)


class _Colocation:
    """The context manager of ``colocate_vars_with``: pushes its target for variable creation."""

    def __init__(self, strategy: Strategy, target: Any) -> None:
        self._entry = (strategy, target)

    def __enter__(self) -> None:
        thread_state.state.colocations.append(self._entry)

    def __exit__(self, *exc_info: object) -> None:
        thread_state.state.colocations.pop()


def _devices_of(target: Any) -> tuple[DeviceSpec, ...]:
    """The devices of a variable, a distributed value, a device string or a tuple of them."""
    if isinstance(target, (str, DeviceSpec)):
        return (device_lib.parse(target),)
    if isinstance(target, (tuple, list)) and target and all(isinstance(d, (str, DeviceSpec)) for d in target):
        return tuple(device_lib.parse(d) for d in target)
    devices = getattr(target, "_devices", None)
    if devices:
        return tuple(devices)
    raise ValueError(
        f"`colocate_vars_with` must only be passed a variable created in this tf.distribute.Strategy.scope() "
        f"(or the result of non_slot_devices()), not: {target!r}."
    )


def _foreign_variable(var: Any, strategy: str) -> ValidationError:
    return ValidationError(
        f"{var.name} was created in the scope of {var._distribute_strategy!r}, not of {strategy}; a strategy "
        f"can only update variables created in its own scope."
    )


def update_regroup(results: list[Any], devices: Sequence[DeviceSpec], group: bool) -> Any:
    """Merges per-component update results: ``Mirrored`` values, or per-component tuples.

    Grouped, a component's write result (an ``UnreadVariable``) is read into its new value,
    as TensorFlow's grouped update reads each result; per-component tuples keep them.
    """
    if group:
        return regroup([read_unread(result) for result in results], devices, wrap_class=Mirrored)
    merged = regroup(results, devices, wrap_class=Mirrored)
    return nest.map_structure(lambda x: x._values if isinstance(x, DistributedValues) else (x,), merged)


def _check_call_arguments(args: Any, kwargs: Any, api: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not isinstance(args, (list, tuple)):
        raise ValueError(
            f"{api} takes args as a list or tuple. Got args of type {type(args).__name__}; "
            f"wrap a single argument as args=(x,)."
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"{api} takes kwargs as a dict. Got kwargs of type {type(kwargs).__name__}.")
    return tuple(args), dict(kwargs or {})


def _check_destinations(destinations: Any, api: str) -> None:
    if destinations is None:
        raise ValidationError(f"{api} needs destinations. Got destinations=None; pass a device string or a value.")
    if isinstance(destinations, (list, tuple)) and not isinstance(destinations, Destinations):
        raise ValidationError(
            f"{api} takes one destination (a device string, a distributed value or a variable), not a "
            f"list. Got destinations={destinations!r}; to reach several devices pass a distributed value "
            f"that lives on them."
        )


aliases.install(Strategy, aliases.STRATEGY)
aliases.install(StrategyExtended, aliases.EXTENDED)
