"""``Strategy``: the API every strategy shares (``tf.distribute.Strategy``).

``Strategy`` is thin: it checks the context, parses arguments and delegates to its
``StrategyExtended`` (``strategy_extended.py``), which holds the logic. Concrete strategies
(default, OneDevice, Mirrored) subclass ``StrategyExtended`` and implement its underscore
hooks. The argument checks both share live in ``arguments.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar, overload

from towerdist._src import aliases, array_ops, backend, context, nest, steps
from towerdist._src import device as device_lib
from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver
from towerdist._src.cross_device_ops.placement import ResolvedDevices
from towerdist._src.failures import name_api, worded_at
from towerdist._src.indexed_slices import refuse_in_gather
from towerdist._src.input.input_context import InputContext, InputOptions
from towerdist._src.options import RunOptions, ValueContext
from towerdist._src.reduce_op import ReduceOp, parse_reduce_op
from towerdist._src.strategies import legacy_names
from towerdist._src.strategies.arguments import check_input_options, element_count, reduce_axes
from towerdist._src.strategies.strategy_extended import StrategyExtended
from towerdist._src.type_aliases import AxisLike, Nest, ReduceOpLike, ReplicaFn, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, PerReplica
from towerdist._src.values.regroup import local_results

__all__ = ["Strategy"]

_GATHER = "Strategy.gather()"  # also what the workers of a multi-worker strategy call its collective

T = TypeVar("T")


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

    @overload
    def experimental_local_results(self, value: DistributedValues[T]) -> tuple[T, ...]: ...

    @overload
    def experimental_local_results(self, value: object) -> tuple[Any, ...]: ...

    def experimental_local_results(self, value: object) -> tuple[Any, ...]:
        """The per-replica parts of ``value``, in replica order.

        A distributed value gives its components; a nested structure gives one copy per
        replica with its distributed leaves selected; any other value gives ``(value,)``.
        """
        return self._extended._local_results(value)

    def experimental_distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Nest:
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

    def experimental_distribute_dataset(self, dataset: Iterable[Nest], options: InputOptions | None = None) -> Any:
        """Splits each global batch of ``dataset`` across the replicas.

        ``dataset`` yields *global* batches: a ``td.data.Dataset``, a ``tf.data.Dataset``, a
        PyTorch ``DataLoader`` or any iterable of array structures. With the default
        auto-shard policy a batch of ``b`` rows becomes ``N`` pieces of ``ceil(b / N)`` rows
        (the last ones shorter or empty); with ``AutoShardPolicy.OFF``, TensorFlow's cycling
        rule. The default strategy returns ``dataset`` unchanged; one-replica strategies
        return its elements unsplit.

        Example:
          Each global batch of 4 gives each of the 2 replicas 2 rows:

          >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
          >>> dataset = td.data.Dataset.from_tensor_slices(np.arange(8)).batch(4)
          >>> for x in strategy.experimental_distribute_dataset(dataset):
          ...     print(strategy.experimental_local_results(x))
          (array([0, 1]), array([2, 3]))
          (array([4, 5]), array([6, 7]))

        Raises:
          ValueError: the elements are scalars (call ``batch`` first).
          NotImplementedError: ``options`` asks for ``InputReplicationMode.PER_REPLICA``.
          TypeError: ``dataset`` is an array or not iterable, or ``options`` is not ``InputOptions``.
        """
        with worded_at("experimental_distribute_dataset()"):
            return self._extended._experimental_distribute_dataset(dataset, check_input_options(options))

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
        with worded_at("distribute_datasets_from_function()"):
            return self._extended._distribute_datasets_from_function(dataset_fn, check_input_options(options))

    # --- cross-replica or default context -------------------------------------------------

    def scope(self) -> context.StrategyScope[Strategy]:
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
        options: RunOptions | None = None,
    ) -> Nest:
        """Runs ``fn`` once per replica and merges the results.

        Replica ``i`` receives ``args``/``kwargs`` with every ``PerReplica``/``Mirrored``
        replaced by its component ``i`` (distributed variables are passed whole). The
        results are merged by identity: the same object from every replica is returned
        as it is, different objects become a ``PerReplica``; lists, tuples, namedtuples
        and dicts are merged element-wise.

        Call it in cross-replica context or outside any scope (also from a ``merge_fn``).

        Example:
          >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
          >>> def step(x):
          ...     return x + td.distribute.get_replica_context().replica_id_in_sync_group
          >>> strategy.run(step, args=(td.constant(10),))
          PerReplica:{
            0: np.int32(10),
            1: np.int32(11)
          }

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
        steps.begin()  # what tells the input iterators that the batches handed out are used
        try:
            return self._extended._run(fn, tuple(args), kwargs or {})
        except BaseException as error:  # a hot path: no context manager, nothing to pay until it raises
            name_api(error, "Strategy.run()")
            raise
        finally:
            steps.end()

    def reduce(self, reduce_op: ReduceOpLike, value: Nest, axis: AxisLike | None) -> Nest:
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

        Example:
          >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
          >>> dist = strategy.experimental_distribute_dataset(td.data.Dataset.range(4).batch(4))
          >>> x = next(iter(dist))  # replica 0 has [0, 1], replica 1 has [2, 3]
          >>> strategy.reduce("sum", x, axis=None)  # across replicas, element-wise
          array([2, 4])
          >>> strategy.reduce("sum", x, axis=0)  # across replicas and along axis 0
          array(6)

        Raises:
          ValueError: an unknown reduce op, or SUM of a non-distributed value.
          TypeError: ``reduce_op`` is not a ReduceOp or string, or ``axis`` is not an int.
          InvalidArgumentError: shapes differ (``axis=None``) or ``axis`` is out of range.
        """
        context.require_cross_replica_or_default(self, "Strategy.reduce()")
        op = parse_reduce_op(reduce_op, "Strategy.reduce()")
        try:
            if axis is None:
                return self._extended._reduce(op, value)
            return self._reduce_along_axis(op, value, axis)
        except BaseException as error:  # a hot path: no context manager, nothing to pay until it raises
            name_api(error, "Strategy.reduce()")
            raise

    def gather(self, value: Nest, axis: int) -> Nest:
        """Concatenates the replicas' values along ``axis`` onto the current device.

        Sizes along ``axis`` may differ between replicas. A non-distributed value is
        returned as it is. Call it in cross-replica context (in a replica, use
        ``ReplicaContext.all_gather``).

        Example:
          >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
          >>> def step():  # replica 0 returns [0], replica 1 [0, 1]
          ...     return np.arange(td.distribute.get_replica_context().replica_id_in_sync_group + 1)
          >>> strategy.gather(strategy.run(step), axis=0)
          array([0, 0, 1])
        """
        context.require_cross_replica_or_default(
            self, "Strategy.gather()", fix="use get_replica_context().all_gather() in a replica instead"
        )
        refuse_in_gather(value, _GATHER)  # a bare IndexedSlices (a PerReplica of them is densified, as in TF)
        destination = ResolvedDevices((self._extended._reduce_destination(),))
        try:
            return nest.map_structure(
                lambda v: local_results(self._extended._gather_to(v, destination, axis, collective=_GATHER), 1)[0],
                value,
            )
        except BaseException as error:
            name_api(error, _GATHER)
            raise

    def group(self, value: Nest, name: str | None = None) -> None:
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

    def _reduce_along_axis(self, op: ReduceOp, value: Nest, axis: AxisLike) -> TensorLike:
        replicas = len(self._extended._replica_devices)
        if isinstance(value, DistributedValues):
            parts = list(self._extended._local_results(value))
        elif nest.is_nested(value) and any(isinstance(leaf, DistributedValues) for leaf in nest.flatten(value)[0]):
            parts = list(local_results(value, replicas))  # a tuple of PerReplica (strategy.run's result)
        else:
            parts = [value] * replicas  # the same value on every replica
        # As in TensorFlow (tf.reduce_sum of each replica's value), a list or tuple becomes one
        # array (stacked: equal shapes only) and a dict is refused.
        for part in parts:
            _refuse_mappings(part, axis)
        arrays = [array_ops.as_array(p) for p in parts]
        axes = reduce_axes(axis, arrays[0].ndim)
        sums = [array_ops.reduce_sum(a, axis=axes) for a in arrays]
        devices = self._extended._replica_devices
        numer = self._extended._reduce(ReduceOp.SUM, PerReplica(sums, devices) if len(sums) > 1 else sums[0])
        if op is ReduceOp.SUM:
            return numer
        count = self._extended._sum_counts(sum(element_count(a.shape, axes) for a in arrays), "Strategy.reduce()")
        impl = backend.for_array(numer)
        return impl.true_divide(numer, impl.asarray(count, dtype=numer.dtype))

    def __copy__(self) -> NoReturn:
        raise RuntimeError(
            f"Must only deepcopy DistributionStrategy: copy.copy({self!r}) would share its replica "
            f"threads; use copy.deepcopy() or create a new strategy."
        )

    def __deepcopy__(self, memo: dict[int, object]) -> Strategy:
        return self._extended._deepcopy_strategy()

    def __repr__(self) -> str:
        return self._extended._describe()


def _refuse_mappings(value: object, axis: AxisLike) -> None:
    if not nest.is_nested(value):
        return
    if isinstance(value, Mapping):
        raise TypeError(
            f"Strategy.reduce() with axis={axis!r} reduces one tensor per replica and cannot take a dict, "
            f"as in TensorFlow. Got a value with keys {sorted(map(str, value))}; reduce each entry: "
            f"{{k: strategy.reduce(op, v, axis={axis!r}) for k, v in value.items()}}, or use axis=None, "
            f"which keeps the structure."
        )
    if isinstance(value, (list, tuple)):
        for item in value:
            _refuse_mappings(item, axis)


aliases.install(Strategy, legacy_names.STRATEGY_OLD_NAMES)
