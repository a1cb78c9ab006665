"""``MirroredStrategy``: synchronous data parallelism over the devices of one machine."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from towerdist._src import config, context, thread_state
from towerdist._src import device as device_lib
from towerdist._src.cross_device_ops.base import DEFAULT_OPTIONS, CrossDeviceOps
from towerdist._src.cross_device_ops.collectives import Collectives, collectives_for
from towerdist._src.cross_device_ops.gather import gather_to
from towerdist._src.cross_device_ops.nccl_all_reduce import NcclAllReduce
from towerdist._src.cross_device_ops.placement import (
    ResolvedDevices,
    check_pairs,
    resolve_destinations,
    validate_components,
)
from towerdist._src.cross_device_ops.select import select_cross_device_ops
from towerdist._src.cross_device_ops.shared_memory import SharedMemoryAllReduce
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import ValidationError
from towerdist._src.failures import API, name_api, unworded
from towerdist._src.indexed_slices import IndexedSlices, summed
from towerdist._src.options import CommunicationOptions, ValueContext
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.strategies.replica_context import ReplicaContext
from towerdist._src.strategies.replica_step import Step, StopReplica
from towerdist._src.strategies.replica_threads import ReplicaScheduler
from towerdist._src.strategies.round_requests import CollectiveRequest, MergeRequest
from towerdist._src.strategies.strategy import Strategy
from towerdist._src.strategies.strategy_extended import StrategyExtended, update_regroup
from towerdist._src.type_aliases import Destinations, DeviceLike, Nest, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, Mirrored, PerReplica
from towerdist._src.values.regroup import regroup, split_for_replicas
from towerdist._src.variables import creation
from towerdist._src.variables.distributed_variable import DistributedVariable
from towerdist._src.variables.variable import Variable

__all__ = ["MirroredStrategy"]

T = TypeVar("T")


class MirroredStrategy(Strategy):
    """Synchronous training on several devices of one machine (``tf.distribute.MirroredStrategy``).

    One replica per device. ``run`` calls the replica function on every replica at once
    (one persistent thread per replica; numpy and cupy release the GIL, so N replicas use
    N cores). Variables created in its scope are mirrored on every device; reductions
    use the cross-device ops chosen for the devices (see ``extended._cross_device_ops``).

    Args:
      devices: the devices, e.g. ``["GPU:0", "GPU:1"]`` or ``["CPU:0", "CPU:1"]``. By
        default all GPUs, or, without GPUs, all logical CPUs (one unless configured with
        ``td.config.set_logical_device_configuration``).
      cross_device_ops: a ``CrossDeviceOps`` to use instead of the default choice.

    Raises:
      ValueError: a device does not exist, or is given twice (``ValidationError``).
      TypeError: ``cross_device_ops`` is not a ``CrossDeviceOps``.

    Example:
      >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
      >>> strategy.run(lambda x: x * 2.0, args=(td.constant(3.0),))
      PerReplica:{
        0: np.float32(6.0),
        1: np.float32(6.0)
      }
    """

    def __init__(self, devices: Sequence[DeviceLike] | None = None, cross_device_ops: CrossDeviceOps | None = None) -> None:
        super().__init__(MirroredExtended(self, devices, cross_device_ops))


def _resolve_devices(devices: Sequence[DeviceLike] | None) -> tuple[DeviceSpec, ...]:
    if not devices:
        gpus = config.local_devices("GPU")
        return tuple(gpus or config.local_devices("CPU"))
    if isinstance(devices, (str, DeviceSpec)):
        raise TypeError(
            f"MirroredStrategy takes a list of devices. Got devices={devices!r}; write devices=[{devices!r}]."
        )
    specs = tuple(device_lib.parse(d) for d in devices)
    seen: dict[DeviceSpec, int] = {}
    for position, spec in enumerate(specs):
        if spec in seen:
            raise ValidationError(
                f"No duplicates allowed in `devices` argument: {spec.short_name} is given at positions "
                f"{seen[spec]} and {position} of devices={tuple(devices)!r}. Each replica needs its own "
                f"device."
            )
        seen[spec] = position
    remote = [s for s in specs if not s.is_local]
    if remote and len(remote) == len(specs):
        raise RuntimeError(
            f"In-graph multi-worker training with `MirroredStrategy` is not supported: devices "
            f"{[s.name for s in remote]} belong to other jobs. Use MultiWorkerMirroredStrategy, one "
            f"process per worker."
        )
    if remote:
        raise ValueError(
            f"MirroredStrategy devices must all be local ('/job:localhost'); got a mix of local and "
            f"remote devices: {[s.name for s in specs]}."
        )
    for spec in specs:
        if not config.device_exists(spec):
            existing = config.local_devices(spec.device_type)
            names = ", ".join(d.short_name for d in existing) or "none"
            hint = (
                " Split the host CPU into more logical devices with "
                "td.config.set_logical_device_configuration() at program start."
                if spec.device_type == "CPU"
                else " Check CUDA_VISIBLE_DEVICES and that cupy sees the GPU."
            )
            raise ValueError(
                f"MirroredStrategy got device {spec.short_name}, which does not exist; the logical "
                f"{spec.device_type} devices are: {names}.{hint}"
            )
    return specs


class MirroredExtended(StrategyExtended):
    def __init__(
        self, container_strategy: Strategy, devices: Sequence[DeviceLike] | None, cross_device_ops: CrossDeviceOps | None
    ) -> None:
        super().__init__(container_strategy)
        self._devices = _resolve_devices(devices)
        config.mark_initialized("MirroredStrategy()")
        if cross_device_ops is not None and not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError(
                f"cross_device_ops must be a td.distribute.CrossDeviceOps such as ReductionToOneDevice(). "
                f"Got cross_device_ops={cross_device_ops!r}."
            )
        if isinstance(cross_device_ops, NcclAllReduce):
            cross_device_ops.check_devices(self._devices)
        self._cross_device_ops = cross_device_ops or select_cross_device_ops(self._devices)
        # Every reduction goes through this (a user's subclass wrapped once, here).
        self._collectives: Collectives = collectives_for(self._cross_device_ops)
        self._plain_host_sum = (
            type(self._collectives) is SharedMemoryAllReduce and type(self)._all_reduce is MirroredExtended._all_reduce
        )
        # The API that batch_reduce_to()'s pair checks name: the cross-device ops' batch_reduce(),
        # which is where TensorFlow checks the (value, destinations) pairs.
        self._batch_api = f"{type(self._cross_device_ops).__name__}.batch_reduce()"
        self._scheduler = ReplicaScheduler(container_strategy, self._devices)
        self._scheduler.local_workers = self._workers_on_this_host()
        self._init_args = (devices, cross_device_ops)

    @property
    def _replica_devices(self) -> tuple[DeviceSpec, ...]:
        return self._devices

    def _workers_on_this_host(self) -> int:
        """The processes of the job running replicas on this host (this one alone)."""
        return 1

    _supports_per_replica_input = True

    # --- running replicas -----------------------------------------------------------------

    def _call_for_each_replica(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], sequential: bool | None = None
    ) -> Nest:
        n = len(self._devices)
        args_per_replica = split_for_replicas(args, n, "args")
        kwargs_per_replica = split_for_replicas(kwargs, n, "kwargs")
        strategy = self._container_strategy()
        results = self._scheduler.run(
            fn,
            args_per_replica,
            kwargs_per_replica,
            lambda i, step: self._replica_context(strategy, i, step),
            sequential,
        )
        return regroup(results, self._devices)

    def _replica_context(self, strategy: Strategy, i: int, step: Step | None) -> _MirroredReplicaContext:
        """The context replica ``i`` runs a step in."""
        return _MirroredReplicaContext(strategy, i, step, self._devices[i])

    def _distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Nest:
        n = len(self._devices)
        values = []
        for i, device in enumerate(self._devices):
            with device_lib.device(device):
                values.append(value_fn(ValueContext(i, n)))
        return regroup(values, self._devices, always_wrap=True)

    # --- reductions -----------------------------------------------------------------------

    def _destinations(self, destinations: Destinations) -> tuple[DeviceSpec, ...]:
        # A PerReplica built by hand records no devices: it lives on this strategy's.
        if isinstance(destinations, DistributedValues) and destinations._devices is None:
            if len(destinations.values) == len(self._devices):
                return self._devices
        return resolve_destinations(destinations)

    def _as_value(self, value: DistributedValues, which: str = "") -> DistributedValues:
        """``value`` (a variable's current values) with this strategy's devices; unworded if it has the wrong size.

        ``which`` tells the value apart in a batch (``" (value 3)"``), after the API's name.
        """
        if value._is_distributed_variable:
            value = PerReplica([c.value() for c in value.values], value._devices)
        count = len(value.values)
        if count != len(self._devices):
            raise unworded(
                ValueError(
                    f"{API}{which} got a {type(value).__name__} with {count} components, but {self._describe()} "
                    f"has {len(self._devices)} replicas; reduce values produced by this strategy."
                )
            )
        if value._devices is None:
            return type(value)(value.values, self._devices)
        return value

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: TensorLike,
        destinations: Destinations,
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> TensorLike:
        del collective  # the workers' name for it: one process has none to agree with
        if isinstance(value, Mirrored) or getattr(value, "_is_mirrored", False):
            if reduce_op is ReduceOp.MEAN:
                return value
            raise unworded(
                ValidationError(
                    f"cannot SUM a {type(value).__name__}: its components are already "
                    f"equal, so the sum would count the same value {len(self._devices)} times. Use MEAN, or "
                    f"reduce the PerReplica value it was made from."
                )
            )
        devices = ResolvedDevices(self._destinations(destinations))
        if not isinstance(value, DistributedValues):
            return self._reduce_non_distributed(reduce_op, value, devices)
        value = self._as_value(value)
        validate_components(value)
        return self._with_helpers(self._collectives._reduce_to, reduce_op, value, devices, options or DEFAULT_OPTIONS)

    def _reduce_non_distributed(self, reduce_op: ReduceOp, value: TensorLike, devices: ResolvedDevices) -> TensorLike:
        if reduce_op is ReduceOp.MEAN:
            return value  # the same value on every replica: its mean is itself
        if len(self._devices) != 1:
            raise ValueError(
                f"A non-DistributedValues value {value!r} cannot be reduced with the given reduce op "
                f"{reduce_op}: {self._describe()} has {len(self._devices)} replicas and SUM needs one value "
                f"from each. If strategy.run() returned it (or a merge_call() or an aggregated variable "
                f"write got it), every replica produced the very same Python object (a constant, a global, "
                f"an argument passed to all), which is passed on as it is rather than as a PerReplica. Make "
                f"each replica produce a value of its own (e.g. td.constant(...) inside the replica "
                f"function), multiply by strategy.num_replicas_in_sync, or use MEAN (which returns the "
                f"value itself)."
            )
        if isinstance(value, IndexedSlices):
            value = summed(value)  # a SUM gives the canonical form, with one replica as with several
        return self._collectives._broadcast_to(value, devices)

    def _batch_reduce_to(
        self, reduce_op: ReduceOp, pairs: list[tuple[TensorLike, Destinations]], options: CommunicationOptions | None
    ) -> list[Any]:
        resolved = []
        for pair in pairs:
            if isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], DistributedValues):
                value = self._as_value(pair[0])
                pair = (value, ResolvedDevices(self._destinations(pair[1])))
            resolved.append(pair)
        collectives = self._collectives
        devices = self._devices
        all_reduce = (
            len(devices) > 1
            and collectives._all_reduces_batches
            and all(
                isinstance(pair, tuple)
                and len(pair) == 2
                and isinstance(pair[0], DistributedValues)
                and pair[0]._devices == devices
                and pair[1] == devices
                for pair in resolved
            )
        )
        if all_reduce:  # every value is reduced onto its own devices: the collective path
            columns = [validate_components(value, f" (value {k})") for k, (value, _) in enumerate(resolved)]
            collective = "StrategyExtended.batch_reduce_to()"
            sparse_k = [k for k, column in enumerate(columns) if isinstance(column[0], IndexedSlices)]
            dense_k = [k for k in range(len(columns)) if k not in set(sparse_k)]
            reduced: list[Any] = [None] * len(columns)
            if dense_k:
                parts = self._all_reduce(reduce_op, [columns[k] for k in dense_k], options, collective=collective)
                for k, part in zip(dense_k, parts):
                    reduced[k] = part
            if sparse_k:
                parts = self._all_reduce_sparse(
                    reduce_op, [columns[k] for k in sparse_k], options, collective=collective
                )
                for k, part in zip(sparse_k, parts):
                    reduced[k] = part
            return [Mirrored(result, devices) for result in reduced]
        try:
            checked = check_pairs(resolved)
        except BaseException as error:  # worded as the cross-device ops' batch_reduce() (see _batch_api)
            name_api(error, self._batch_api)
            raise
        return self._with_helpers(collectives._batch_reduce_to, reduce_op, checked, options or DEFAULT_OPTIONS)

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        out: list[Any] | None = None,
        *,
        collective: str,
    ) -> list[list[Any]]:
        del collective  # the workers' name for it: one process has none to agree with
        if len(self._devices) == 1:
            return [list(column) for column in columns]
        return self._with_helpers(
            self._collectives._all_reduce, reduce_op, columns, self._devices, options or DEFAULT_OPTIONS, out
        )

    def _sums_host_arrays_in_order(self) -> bool:
        return self._plain_host_sum and len(self._devices) > 1

    def _all_reduce_sparse(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> list[list[Any]]:
        if len(self._devices) == 1:
            return super()._all_reduce_sparse(reduce_op, columns, options, collective=collective)
        return self._with_helpers(
            self._collectives._all_reduce_sparse, reduce_op, columns, self._devices, options or DEFAULT_OPTIONS
        )

    def _with_helpers(self, collective: Callable[..., T], *args: object) -> T:
        """``collective(*args, helpers)``, with the threads that may run its parts.

        Inside a ``merge_fn`` those are the parked replicas (the barrier set them on this
        thread); otherwise an idle replica pool is lent for the call and given back after.
        """
        helpers = thread_state.state.helpers
        if helpers is not None:
            return collective(*args, helpers)
        lease = self._scheduler.lend_idle_helpers()
        try:
            return collective(*args, lease)
        finally:
            lease.release()

    def _broadcast_to(self, tensor: TensorLike, destinations: Destinations) -> TensorLike:
        if isinstance(tensor, (int, float)) and not isinstance(tensor, bool):
            return tensor  # Python numbers are the same everywhere, as in TensorFlow
        return self._collectives._broadcast_to(tensor, ResolvedDevices(self._destinations(destinations)))

    def _gather_to(self, value: TensorLike, destinations: Destinations, axis: int, *, collective: str) -> TensorLike:
        del collective  # the workers' name for it: one process has none to agree with
        if not isinstance(value, DistributedValues):
            return value
        return gather_to(self._as_value(value), ResolvedDevices(self._destinations(destinations)), axis)

    # --- variables ------------------------------------------------------------------------

    def _create_variable(self, spec: creation.VariableSpec) -> Any:
        devices = self._variable_devices(spec.colocate_with)
        return creation.distributed_variable(spec, devices, self._container_strategy())

    def _variable_devices(self, colocate_with: object) -> tuple[DeviceSpec, ...]:
        if colocate_with is None:
            return self._devices
        return tuple(colocate_with._devices) if hasattr(colocate_with, "_devices") else self._devices

    def _validate_colocate_with(self, colocate_with: object) -> None:
        strategy = self._container_strategy()
        if isinstance(colocate_with, DistributedVariable):
            if colocate_with._distribute_strategy is not strategy:
                raise ValueError(
                    f"`colocate_vars_with` must only be passed a variable created in this "
                    f"tf.distribute.Strategy.scope(), not {colocate_with.name} created in scope: "
                    f"{colocate_with._distribute_strategy!r}."
                )
            return
        if isinstance(colocate_with, (tuple, list)) and all(isinstance(d, (str, DeviceSpec)) for d in colocate_with):
            if tuple(device_lib.parse(d) for d in colocate_with) == self._devices:
                return  # non_slot_devices(): every replica device
        raise ValueError(
            f"`colocate_vars_with` must only be passed a variable created in this tf.distribute.Strategy.scope() "
            f"(or the result of non_slot_devices()), not: {colocate_with!r}. {self._describe()} keeps a copy "
            f"of every variable on each of its devices."
        )

    def _check_update_variable(self, var: Variable) -> None:
        if not isinstance(var, DistributedVariable):
            raise ValidationError(
                f"StrategyExtended.update() of {self._describe()} needs a variable created in its scope; got "
                f"{var!r}. Create the variable inside `with strategy.scope():`."
            )
        super()._check_update_variable(var)

    # ``var`` is Any: the hook takes the base's ``Variable``, and ``_check_update_variable`` has made it a
    # ``DistributedVariable`` here (its ``values``), which no annotation of an override can say.
    def _update(
        self, var: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
    ) -> Nest:
        components = var.values
        n = len(components)
        args_per = split_for_replicas(args, n, "args")
        kwargs_per = split_for_replicas(kwargs, n, "kwargs")
        results = []
        for i, component in enumerate(components):
            with context.UpdateContext(component._device, i):
                results.append(fn(component, *args_per[i], **kwargs_per[i]))
        return update_regroup(results, var._devices, group)

    def _update_non_slot(
        self, colocate_with: object, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
    ) -> Nest:
        if not isinstance(colocate_with, tuple):
            raise ValidationError(
                f"update_non_slot() of {self._describe()} takes the tuple non_slot_devices() returned. Got "
                f"colocate_with={colocate_with!r}."
            )
        devices = tuple(device_lib.parse(d) for d in colocate_with)
        args_per = split_for_replicas(args, len(devices), "args")
        kwargs_per = split_for_replicas(kwargs, len(devices), "kwargs")
        results = []
        for i, device in enumerate(devices):
            with context.UpdateContext(device, i):
                results.append(fn(*args_per[i], **kwargs_per[i]))
        return update_regroup(results, devices, group)

    def _non_slot_devices(self, var_list: list[Variable]) -> tuple[str, ...]:
        return self.worker_devices

    # --- description ----------------------------------------------------------------------

    def _deepcopy_strategy(self) -> Strategy:
        devices, cross_device_ops = self._init_args
        return MirroredStrategy(devices, cross_device_ops)

    def _describe(self) -> str:
        return f"MirroredStrategy(devices={tuple(d.short_name for d in self._devices)!r})"


class _MirroredReplicaContext(ReplicaContext):
    """The replica context of one replica of a ``MirroredStrategy.run`` step."""

    def __init__(self, strategy: Strategy, replica_id: int, step: Step | None, device: DeviceSpec) -> None:
        super().__init__(strategy, replica_id)
        self._step = step
        self._device = device

    def _merge_call(
        self, merge_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], collective: str
    ) -> Nest:
        step = self._step
        if step is None:  # only in a replica thread abandoned after a timeout: just unwind
            raise StopReplica
        return step.meet(self._replica_id, MergeRequest(merge_fn, args, kwargs, collective))

    def _collective(
        self,
        fn: Callable[[Any, list[Any]], list[Any]],
        payload: object,
        collective: str,
        snapshot: Callable[[Any, int], tuple[Any, Collection[int]]] | None = None,
    ) -> Nest:
        step = self._step
        if step is None:
            raise StopReplica
        if step.num_replicas == 1:  # nobody to meet: run it here, in cross-replica context
            return super()._collective(fn, payload, collective)
        return step.meet(self._replica_id, CollectiveRequest(fn, payload, collective, snapshot))
