"""TF 1.x's ``tf.contrib.distribute.MirroredStrategy`` on the modern core.

:class:`MirroredStrategy` here is a ``td.distribute.MirroredStrategy`` that also speaks
the tower-era API: ``call_for_each_tower``, ``unwrap`` returning lists, string reduce
methods ``"sum"``/``"mean"`` with optional destinations, ``fetch``, ``map``,
``distribute_dataset`` with TF 1.x's one-element-per-tower batching, and the members that
later moved to ``StrategyExtended``. Everything modern (``run``, ``scope``, variables,
datasets, ``extended``) works unchanged. ``reduce`` takes both TF 1.x's
``reduce(method_string, value, destinations=None)`` and TF 2's ``reduce(reduce_op, value, axis)``.

The tower-era members are written in the class body, each marked ``@aliases.old_name``:
they warn once (``DeprecationWarning``, naming the TF 2 replacement) and are registered in
the alias table (``towerdist._src.aliases``) by the class decorator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeAlias, TypeGuard

import numpy as np

from towerdist._src import aliases, backend, context, nest, steps
from towerdist._src import device as device_lib
from towerdist._src.compat import tower_context
from towerdist._src.compat.per_tower_dataset import PerTowerDataset
from towerdist._src.cross_device_ops.base import CrossDeviceOps
from towerdist._src.cross_device_ops.placement import ResolvedDevices
from towerdist._src.device import DeviceSpec
from towerdist._src.failures import name_api, unworded, worded_at
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.strategies.mirrored import MirroredExtended
from towerdist._src.strategies.mirrored import MirroredStrategy as _ModernMirroredStrategy
from towerdist._src.strategies.strategy import Strategy
from towerdist._src.type_aliases import AxisLike, Destinations, DeviceLike, Nest, ReduceOpLike, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, Mirrored, PerReplica
from towerdist._src.variable_enums import VariableAggregation
from towerdist._src.variables.distributed_variable import SyncOnReadVariable
from towerdist._src.variables.variable import Variable

__all__ = ["MapOutput", "MirroredStrategy"]

_NOT_GIVEN: Any = object()  # reduce()'s third argument was not passed

# TF 1.x's destinations: TF 2's, or a list of devices (reduce_to refuses lists; these methods take them).
_TowerDestinations: TypeAlias = "Destinations | Sequence[DeviceLike]"


@aliases.has_old_names(aliases.TOWER_STRATEGY)
class MirroredStrategy(_ModernMirroredStrategy):
    """Mirrors variables over the devices of one machine, with TF 1.x's tower API (``tf.contrib.distribute``).

    ``td.compat.v1.distribute.MirroredStrategy`` and ``td.contrib.distribute.MirroredStrategy``
    are this class. Code written for ``tf.contrib.distribute`` runs with only its import
    changed (``import towerdist.compat.v1 as tf``); the tower-era members warn once that
    they are deprecated and name their TF 2 replacement.

    Args:
      devices: the devices, e.g. ``["/device:GPU:0", "/device:GPU:1"]``. By default all GPUs,
        or all logical CPUs when there is no GPU (TF 1.x required GPUs).
      num_gpus: use ``/device:GPU:0 .. num_gpus-1`` (give this or ``devices``, not both).
      cross_tower_ops: a ``td.distribute.CrossDeviceOps`` (TF 1.x's name for ``cross_device_ops``).
      prefetch_on_device: when True, ``distribute_dataset`` produces elements ahead of the
        towers on a background thread.

    Raises:
      ValueError: both ``devices`` and ``num_gpus`` are given, no device is left
        (``devices=[]``, ``num_gpus=0``), or a device does not exist or repeats.

    Example:
      The ``merge_call`` example of TF 1.x's ``tf.contrib.distribute`` documentation:

      >>> import towerdist.compat.v1 as tf
      >>> distribution = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
      >>> def merge_fn(distribution, three_plus_tower_id):
      ...     return sum(distribution.unwrap(three_plus_tower_id))
      >>> def fn(three):
      ...     tower_ctx = tf.get_tower_context()
      ...     v = three + tower_ctx.tower_id
      ...     s = tower_ctx.merge_call(merge_fn, v)
      ...     return s + v
      >>> with distribution.scope():
      ...     merged_results = distribution.call_for_each_tower(fn, 3)
      ...     print(distribution.unwrap(merged_results))
      [10, 11]
    """

    def __init__(
        self,
        devices: Sequence[DeviceLike] | None = None,
        num_gpus: int | None = None,
        cross_tower_ops: CrossDeviceOps | None = None,
        prefetch_on_device: bool | None = None,
    ) -> None:
        if devices is not None and num_gpus is not None:
            raise ValueError(
                f"Must only specify one of `devices` and `num_gpus`. Got devices={devices!r} and num_gpus={num_gpus!r}."
            )
        if num_gpus is not None:
            if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
                raise ValueError(
                    f"compat.v1 MirroredStrategy() takes num_gpus as a non-negative int. Got num_gpus={num_gpus!r}."
                )
            devices = [f"/device:GPU:{i}" for i in range(num_gpus)]
        if devices is not None and len(devices) == 0:
            raise ValueError(
                "Must specify at least one device: got an empty device list "
                f"({'num_gpus=0' if num_gpus is not None else 'devices=[]'}). Pass devices=None to use every "
                f"GPU (or the logical CPUs)."
            )
        if prefetch_on_device is not None and not isinstance(prefetch_on_device, bool):
            raise TypeError(f"prefetch_on_device must be a bool or None. Got {prefetch_on_device!r}.")
        self._prefetch_on_device = bool(prefetch_on_device)
        self._tower_init_args = (devices, cross_tower_ops, prefetch_on_device)
        Strategy.__init__(self, _TowerMirroredExtended(self, devices, cross_tower_ops))

    def reduce(
        self,
        reduce_op: ReduceOpLike,
        value: Nest,
        axis: AxisLike | _TowerDestinations | None = _NOT_GIVEN,
        *,
        destinations: _TowerDestinations | None = None,
    ) -> Nest:
        """Combines the towers' values: TF 1.x's form (a mirrored result) or TF 2's (one value).

        **TF 1.x** ``reduce(method_string, value, destinations=None)``: combines with
        ``"sum"`` or ``"mean"`` and mirrors the result onto ``destinations``.

        **TF 2** ``reduce(reduce_op, value, axis)``: exactly ``td.distribute.Strategy.reduce``
        (one value on the current device), so this class keeps its parent's contract.

        The third argument (positional or ``axis=``) decides the form: an int or a tuple of
        ints is TF 2's ``axis``, and so is None when the operation is TF 2's (a ``ReduceOp``,
        ``"SUM"`` or ``"MEAN"``); a device string, a list of them, a distributed value, or
        None with a TF 1.x method (``"sum"``, ``"mean"``, a ``VariableAggregation``) is TF
        1.x's destinations, as are ``destinations=`` and no third argument.

        Args:
          reduce_op: TF 1.x: ``"sum"`` or ``"mean"`` (also ``ReduceOp``/``VariableAggregation``
            SUM or MEAN, or ``VariableAggregation.ONLY_FIRST_TOWER``: tower 0's value).
            TF 2: a ``ReduceOp`` or ``"SUM"``/``"MEAN"``.
          value: a per-tower value (``call_for_each_tower``'s or ``run``'s result), or the
            result of ``map`` (TF 1.x form).
          axis: TF 2's axis (None: element-wise across the towers), or, positionally,
            TF 1.x's destinations.
          destinations: TF 1.x's destinations by keyword: a device string, a list of them,
            or a distributed value or variable (its devices). By default, the devices
            ``value`` lives on.

        Returns:
          TF 1.x: a ``Mirrored`` value on the destinations (the bare array for one device;
          a Python number, the same on every device, stays as it is). TF 2: as
          ``td.distribute.Strategy.reduce``.

        Raises:
          ValueError: an unknown method, a value that is not per-tower summed over several
            towers, or both ``axis`` and ``destinations`` given.
          ContextError: called in a tower (use ``get_tower_context().merge_call``).
        """
        if axis is not _NOT_GIVEN and destinations is not None:
            raise ValueError(
                "compat.v1 MirroredStrategy.reduce() takes TF 2's axis or TF 1.x's destinations, not both. "
                f"Got axis={axis!r} and destinations={destinations!r}."
            )
        if axis is not _NOT_GIVEN and _is_tf2_axis(axis, reduce_op):
            return super().reduce(reduce_op, value, axis)
        return self._reduce_tf1(reduce_op, value, axis if axis is not _NOT_GIVEN else destinations)

    def _reduce_tf1(self, method_string: ReduceOpLike, value: Nest, destinations: object) -> Nest:
        with worded_at("MirroredStrategy.reduce()"):
            return self._reduce_tf1_worded(method_string, value, destinations)

    def _reduce_tf1_worded(self, method_string: ReduceOpLike, value: Nest, destinations: object) -> Nest:
        aggregation = tower_context.parse_method_string(method_string, allow_only_first=True)
        context.require_cross_replica_or_default(
            self, "MirroredStrategy.reduce()", fix="use get_tower_context().merge_call()"
        )
        targets = _destinations_of(self, value) if destinations is None else _destinations(self, destinations)
        if _is_map_result(value):
            return self.extended.broadcast_to(_reduce_map_outputs(aggregation, value), targets)
        if aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            first = value.values[0] if isinstance(value, DistributedValues) else value
            return self.extended.broadcast_to(_read(first), targets)
        op = ReduceOp.from_variable_aggregation(aggregation)
        if not isinstance(value, DistributedValues) and (op is ReduceOp.MEAN or self.num_replicas_in_sync == 1):
            return self.extended.broadcast_to(value, targets)
        return self.extended.reduce_to(op, value, targets)

    def configure(self, session_config: object = None) -> None:
        """Accepts a TF 1.x session config and changes nothing (the cross-tower ops are chosen at construction)."""
        del session_config

    # --- the tower-era members (old names: each warns once, naming its TF 2 replacement) ---

    @aliases.old_name("Strategy.run(fn, args, kwargs)", since="1.12")
    def call_for_each_tower(self, fn: Callable[..., Any], *args: Nest, **kwargs: Nest) -> Nest:
        """Runs ``fn(*args, **kwargs)`` once per tower and merges the results (TF 1.x).

        Per-tower arguments (``PerReplica``, ``worker_device_index``) give each tower its own
        component. ``fn`` may call ``get_tower_context()`` for ``tower_id`` and ``merge_call``.
        Call it in cross-tower context (inside ``scope()``) or outside any scope.

        Args:
          fn: the tower function.
          *args: positional arguments for ``fn``.
          **kwargs: keyword arguments for ``fn``, except ``run_concurrently`` (a bool), which
            this method takes: True runs the towers at once on their threads; False runs
            them one at a time in tower order, switching at each ``merge_call``. Left out,
            it follows ``td.config.run_replicas_sequentially()`` (at once by default).

        Returns:
          The towers' results merged as ``Strategy.run`` merges them.
        """
        given = "run_concurrently" in kwargs  # left out: td.config.run_replicas_sequentially() decides
        run_concurrently = kwargs.pop("run_concurrently", True)
        if not isinstance(run_concurrently, bool):
            raise TypeError(f"call_for_each_tower() takes run_concurrently as a bool. Got {run_concurrently!r}.")
        context.require_cross_replica_or_default(
            self, "call_for_each_tower()", fix="use get_tower_context().merge_call()"
        )
        extended = self.extended
        assert isinstance(extended, MirroredExtended)
        steps.begin()
        with self.scope():
            sequential = not run_concurrently if given else None
            try:
                return extended._call_for_each_replica(fn, args, kwargs, sequential=sequential)
            except BaseException as error:  # (free until raised: every step's path)
                name_api(error, "Strategy.run()")  # its errors have always read as run()'s
                raise
            finally:
                steps.end()

    @aliases.old_name("td.Variable(..., synchronization=ON_READ, aggregation=...)", since="1.10")
    def tower_local_var_scope(self, reduce_method: ReduceOpLike) -> AbstractContextManager[None]:
        """A scope whose new variables are sync-on-read, aggregated with ``reduce_method`` ("sum"/"mean").

        Must be used inside ``scope()`` (or in a tower). See
        :func:`towerdist._src.compat.tower_context.tower_local_var_scope`.
        """
        return tower_context.tower_local_var_scope(self, reduce_method)

    @property
    @aliases.old_name("Strategy.num_replicas_in_sync == 1", since="1.12")
    def is_single_tower(self) -> bool:
        """True when there is one tower, so ``call_for_each_tower(fn)`` calls ``fn`` once."""
        return self.num_replicas_in_sync == 1

    @property
    @aliases.old_name("Strategy.num_replicas_in_sync", since="1.12")
    def num_towers(self) -> int:
        """How many towers there are (``num_replicas_in_sync``)."""
        return self.num_replicas_in_sync

    @property
    @aliases.old_name("Strategy.experimental_distribute_values_from_function()", since="1.12")
    def worker_device_index(self) -> int | PerReplica[int]:
        """Each tower's index as a per-tower value (the int 0 with a single tower).

        Pass it to ``call_for_each_tower(fn, strategy.worker_device_index)``: tower ``i``'s
        ``fn`` receives the int ``i``.
        """
        n = self.num_replicas_in_sync
        if n == 1:
            return 0
        return PerReplica(tuple(range(n)), self.extended._replica_devices)

    @property
    @aliases.old_name("Strategy.extended.worker_devices", since="1.14")
    def worker_devices(self) -> list[str]:
        """The canonical names of the devices running the towers (a new list)."""
        return list(self.extended.worker_devices)

    @property
    @aliases.old_name("Strategy.extended.parameter_devices", since="1.14")
    def parameter_devices(self) -> list[str]:
        """The canonical names of the devices holding variables (a new list)."""
        return list(self.extended.parameter_devices)

    @aliases.old_name("Strategy.experimental_local_results()", since="2.0")
    def unwrap(self, value: object) -> list[Any]:
        """The per-tower values contained in ``value`` as a list (``[value]`` for a plain value).

        For a ``PerReplica``/``Mirrored`` value or a mirrored or tower-local variable, its
        components in tower order.
        """
        if isinstance(value, DistributedValues):
            return list(value.values)
        return [value]

    @aliases.old_name("Strategy.extended.read_var() or Strategy.reduce()", since="1.10")
    def fetch(
        self, val: TensorLike, destination: DeviceLike = "/device:CPU:0", fn: Callable[[Any], Any] = lambda x: x
    ) -> Nest:
        """``fn(val)`` copied to ``destination`` (TF 1.x).

        A tower-local (sync-on-read) variable contributes its aggregate over the towers; a
        mirrored value or variable its copy on ``destination`` if it has one, else its
        first copy. ``fn`` runs on the device of the value it is given.

        Raises:
          TypeError: ``val`` is a per-tower value (reduce it first).
        """
        context.require_cross_replica_or_default(self, "fetch()")
        target = device_lib.parse(destination)
        if isinstance(val, PerReplica):
            raise TypeError(
                f"fetch() takes a mirrored value, a variable or a plain value; got a per-tower value {val!r}. "
                f"Reduce it first: strategy.fetch(strategy.reduce('sum', value))."
            )
        source: DeviceSpec | None = None
        if isinstance(val, SyncOnReadVariable):
            value, source = self.extended.read_var(val), target
        elif isinstance(val, DistributedValues):
            index = val._devices.index(target) if val._devices and target in val._devices else 0
            source = val._devices[index] if val._devices else None
            value = _read(val.values[index])
        else:
            value, source = _read(val), None
        with device_lib.device(source) if source is not None else contextlib.nullcontext():
            result = fn(value)
        return _copy_to(result, target)

    @aliases.old_name("Strategy.run() over the elements", since="1.10")
    def map(
        self, map_over: Iterable[Any], fn: Callable[..., Any], *args: Nest, **kwargs: Nest
    ) -> MapOutput | PerReplica[MapOutput]:
        """Calls ``fn(x, *args, **kwargs)`` for each element ``x`` of ``map_over``, spread over the towers.

        Element ``i`` runs on tower ``i % num_towers``'s device (in this thread, one after the
        other). Mirrored arguments give each call the copy on its device. Returns a per-tower
        value whose components are :class:`MapOutput` lists; ``reduce("sum"/"mean", result)``
        sums all outputs (``"mean"`` divides by their number).

        Raises:
          TypeError: an argument is a per-tower (``PerReplica``) value.
        """
        _require_mirrored_args(args, kwargs, "map()")
        devices = self.extended._replica_devices
        outputs: list[MapOutput] = [MapOutput() for _ in devices]
        for i, element in enumerate(map_over):
            tower = i % len(devices)
            with device_lib.device(devices[tower]):
                outputs[tower].append(fn(element, *_select(tower, args), **_select(tower, kwargs)))
        if len(devices) == 1:
            return outputs[0]
        return PerReplica(outputs, devices)

    @aliases.old_name("Strategy.distribute_datasets_from_function()", since="1.11")
    def distribute_dataset(self, dataset: Iterable[Nest] | Callable[[], Iterable[Nest]]) -> PerTowerDataset:
        """Splits ``dataset`` across the towers TF 1.x's way: one whole element per tower.

        ``dataset`` is a dataset or a function returning one. Each step takes the next
        ``num_towers`` elements and gives element ``i`` to tower ``i`` (on its device); a last
        group too short to feed every tower is dropped. So the dataset's batch size is the
        *per-tower* batch size (TF 2's ``experimental_distribute_dataset`` splits global
        batches instead).

        Returns an object with ``get_next()`` (TF 1.8), ``make_one_shot_iterator()`` and
        ``make_initializable_iterator()`` (TF 1.9-1.11) and Python iteration.
        """
        return PerTowerDataset(self, dataset, prefetch=self._prefetch_on_device)

    @aliases.old_name("Strategy.extended.batch_reduce_to()", since="1.14")
    def batch_reduce(
        self, method_string: ReduceOpLike, value_destination_pairs: Sequence[tuple[TensorLike, _TowerDestinations | None]]
    ) -> list[Any]:
        """Several ``reduce`` calls in one (packed where possible): a list of mirrored values.

        Args:
          method_string: ``"sum"`` or ``"mean"``.
          value_destination_pairs: a list of ``(value, destinations)`` pairs; ``destinations``
            may be None (the value's devices).
        """
        api = "MirroredStrategy.batch_reduce()"
        with worded_at(api):
            aggregation = tower_context.parse_method_string(method_string)
        context.require_cross_replica_or_default(self, api, fix="use get_tower_context().merge_call()")
        pairs = list(value_destination_pairs)
        for k, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(
                    f"`value_destination_pairs` must be a list or a tuple of (value, destinations) pairs; "
                    f"element {k} is {pair!r}."
                )
        if any(not isinstance(v, PerReplica) or _is_map_result(v) for v, _ in pairs):
            return [self.reduce(aggregation, v, d) for v, d in pairs]
        op = ReduceOp.from_variable_aggregation(aggregation)
        resolved = [(v, _destinations_of(self, v) if d is None else _destinations(self, d)) for v, d in pairs]
        return self.extended.batch_reduce_to(op, resolved)

    @aliases.old_name("Strategy.extended.broadcast_to()", since="1.14")
    def broadcast(self, tensor: TensorLike, destinations: _TowerDestinations | None = None) -> TensorLike:
        """Copies ``tensor`` to every tower's device (or to ``destinations``): a mirrored value."""
        context.require_cross_replica_or_default(self, "broadcast()")
        targets = (
            ResolvedDevices(self.extended._replica_devices) if destinations is None else _destinations(self, destinations)
        )
        return self.extended.broadcast_to(tensor, targets)

    @aliases.old_name("Strategy.extended.update(var, fn, args, kwargs)", since="1.14")
    def update(self, var: Variable, fn: Callable[..., Any], *args: Nest, **kwargs: Nest) -> Nest:
        """Runs ``fn(v, *args, **kwargs)`` on each copy ``v`` of ``var`` (on its device); merges the results.

        Mirrored arguments give each call the copy on its device.

        Raises:
          TypeError: an argument is a per-tower (``PerReplica``) value; reduce it first.
        """
        _require_mirrored_args(args, kwargs, "update()")
        return self.extended.update(var, fn, args, kwargs)

    @aliases.old_name("Strategy.extended.update_non_slot()", since="1.14")
    def update_non_slot(self, colocate_with: object, fn: Callable[..., Any], *args: Nest, **kwargs: Nest) -> Nest:
        """Runs ``fn(*args, **kwargs)`` on the devices of ``colocate_with`` (from ``non_slot_devices``)."""
        if isinstance(colocate_with, list):
            colocate_with = tuple(colocate_with)
        return self.extended.update_non_slot(colocate_with, fn, args, kwargs)

    @aliases.old_name("Strategy.extended.non_slot_devices()", since="1.14")
    def non_slot_devices(self, var_list: Sequence[Variable]) -> list[str]:
        """The devices for variables that are not slots of one variable (a list of device names)."""
        return list(self.extended.non_slot_devices(var_list))

    @aliases.old_name("Strategy.extended.read_var()", since="1.14")
    def read_var(self, v: Variable) -> TensorLike:
        """The value of ``v`` in cross-tower context: a tower-local variable's aggregate, else its value."""
        return self.extended.read_var(v)


class _TowerMirroredExtended(MirroredExtended):
    """``MirroredExtended`` of the tower-era class (its copies and description)."""

    def _deepcopy_strategy(self) -> Strategy:
        strategy = self._container_strategy()
        assert isinstance(strategy, MirroredStrategy)
        devices, cross_tower_ops, prefetch_on_device = strategy._tower_init_args
        return MirroredStrategy(devices, None, cross_tower_ops, prefetch_on_device)

    def _describe(self) -> str:
        return f"compat.v1.MirroredStrategy(devices={tuple(d.short_name for d in self._devices)!r})"


# --- helpers -------------------------------------------------------------------------------


def _is_tf2_axis(axis: object, reduce_op: ReduceOpLike) -> TypeGuard[AxisLike | None]:
    """Whether ``reduce``'s third argument is TF 2's ``axis`` rather than TF 1.x's destinations."""
    if axis is None:  # TF 2 names its ops ReduceOp.SUM or "SUM"; TF 1.x's methods are "sum"/"mean"
        return isinstance(reduce_op, ReduceOp) or reduce_op in ("SUM", "MEAN")
    if isinstance(axis, bool):
        return False
    if isinstance(axis, tuple) and axis and all(isinstance(a, (int, np.integer)) for a in axis):
        return True
    return isinstance(axis, (int, np.integer))


class MapOutput(list):  # type: ignore[type-arg]
    """The outputs of ``map`` that ran on one tower's device, in element order."""


def _is_map_result(value: object) -> bool:
    if isinstance(value, MapOutput):
        return True
    return isinstance(value, PerReplica) and all(isinstance(v, MapOutput) for v in value.values)


def _reduce_map_outputs(aggregation: VariableAggregation, value: MapOutput | PerReplica[MapOutput]) -> TensorLike:
    outputs = [x for part in (value.values if isinstance(value, PerReplica) else [value]) for x in part]
    if not outputs:
        raise unworded(ValueError("got the result of map() over no elements; there is nothing to reduce."))
    if aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
        return outputs[0]
    arrays = [_on_host(x) for x in outputs]
    total = backend.host().add_n(arrays)
    if aggregation is VariableAggregation.MEAN:
        return backend.host().true_divide(total, len(arrays))
    return total


def _on_host(value: TensorLike) -> TensorLike:
    impl = backend.for_array(value)
    return backend.host().asarray(impl.to_device(value, device_lib.HOST) if impl is not backend.host() else value)


# ``destinations`` is whatever the user passed (an int too: a TF 2 axis given to TF 1.x's form), checked here;
# Any rather than object because an object with ``_devices`` (a user's distributed value) is passed on as it is.
def _destinations(strategy: MirroredStrategy, destinations: Any) -> ResolvedDevices:
    """TF 1.x destinations (a device, a list of devices, or a value) as resolved devices.

    Raises:
      ValueError: anything else, e.g. a TF 2 ``axis`` passed where TF 1.x takes destinations.
    """
    if isinstance(destinations, (list, tuple)) and not isinstance(destinations, ResolvedDevices):
        if not destinations:
            raise ValueError(
                "destinations can not be empty: got an empty list of devices; pass None for the value's "
                "devices, or device strings such as ['/device:CPU:0']."
            )
        return ResolvedDevices(device_lib.parse(d) for d in destinations)
    if isinstance(destinations, DistributedValues) and destinations._devices is None:
        return ResolvedDevices(strategy.extended._replica_devices)
    if isinstance(destinations, (str, DeviceSpec)) or hasattr(destinations, "_devices"):
        extended = strategy.extended
        assert isinstance(extended, MirroredExtended)
        return ResolvedDevices(extended._destinations(destinations))
    hint = (
        " For TF 2's reduce(op, value, axis), pass the axis as the third argument or as axis=."
        if isinstance(destinations, int)
        else ""
    )
    raise ValueError(
        f"destinations must be one of a `DistributedValues` object, a device string, a list of device "
        f"strings or None. Got destinations={destinations!r}.{hint}"
    )


def _destinations_of(strategy: MirroredStrategy, value: object) -> ResolvedDevices:
    """Where a reduction of ``value`` goes by default: the devices it lives on, else every tower's."""
    devices = getattr(value, "_devices", None) if isinstance(value, DistributedValues) else None
    return ResolvedDevices(devices or strategy.extended._replica_devices)


def _require_mirrored_args(args: tuple[Nest, ...], kwargs: dict[str, Nest], api: str) -> None:
    for leaf in nest.flatten((args, kwargs))[0]:
        if isinstance(leaf, PerReplica):
            raise TypeError(
                f"Expected value to be mirrored across towers: {leaf!r} in {api}. TF 1.x's {api} takes "
                f"mirrored or plain arguments; reduce per-tower values first (strategy.reduce)."
            )


def _select(tower: int, structure: Nest) -> Nest:
    return nest.map_structure(lambda x: x.values[tower] if isinstance(x, Mirrored) else x, structure)


def _read(value: TensorLike) -> TensorLike:
    """The current value of a variable; anything else as it is."""
    return value.value() if hasattr(value, "assign") and callable(getattr(value, "value", None)) else value


def _copy_to(result: Nest, target: DeviceSpec) -> Nest:
    impl = backend.for_device(target)
    return nest.map_structure(lambda x: impl.to_device(x, target) if backend.is_array(x) else x, result)
