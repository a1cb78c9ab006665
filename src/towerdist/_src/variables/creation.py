"""What ``td.Variable(...)`` creates, and where.

1. The arguments are checked the same way in every context (invalid synchronization or
   aggregation raise ``ValueError``), and the name gets the thread's ``td.name_scope``.
2. Outside ``strategy.run``, the current strategy's ``extended._create_variable(spec)``
   builds the variable: a plain :class:`ResourceVariable` for the default and one-device
   strategies, a ``MirroredVariable``/``SyncOnReadVariable`` for ``MirroredStrategy``, an
   ``AggregatingVariable`` for ``CentralStorageStrategy``.
3. Inside ``strategy.run``, every replica asks for the variable and one variable is made
   for all of them: the requests meet at the replica barrier (``ReplicaContext._merge_call``),
   which runs once, in replica order, whatever the thread timing. Replica 0's initial value
   is used (callables of other replicas are never called) and every replica gets the same
   variable. Replicas asking for different variables at the same point raise
   ``RuntimeError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import numpy as np

from towerdist._src import backend, context, name_scope, thread_state
from towerdist._src import device as device_lib
from towerdist._src.device import DeviceSpec
from towerdist._src.type_aliases import Array, DTypeLike, TensorLike
from towerdist._src.values.distributed_values import PerReplica
from towerdist._src.variable_enums import VariableAggregation, VariableSynchronization
from towerdist._src.variables.distributed_variable import MirroredVariable, SyncOnReadVariable
from towerdist._src.variables.variable import ResourceVariable, Variable, to_array

if TYPE_CHECKING:  # the strategies build on the variables: only their types are named here
    from towerdist._src.strategies.replica_context import ReplicaContext
    from towerdist._src.strategies.strategy import Strategy

# What td.Variable() starts from: a value, or a callable returning one (called once).
InitialValue: TypeAlias = TensorLike | Callable[[], TensorLike]

__all__ = ["VariableSpec", "create_variable", "distributed_variable", "materialize", "plain_variable"]


class VariableSpec(NamedTuple):
    """The checked arguments of one ``td.Variable(...)`` call."""

    initial_value: Any
    trainable: bool | None
    name: str
    dtype: np.dtype[Any] | None
    shape: tuple[int | None, ...] | None
    validate_shape: bool
    synchronization: VariableSynchronization
    aggregation: VariableAggregation
    constraint: Callable[[Any], Any] | None
    colocate_with: Any  # the target of the innermost colocate_vars_with block, or None

    def resolved_trainable(self) -> bool:
        """``trainable``, defaulting to False for sync-on-read variables and True otherwise."""
        if self.trainable is not None:
            return bool(self.trainable)
        return self.synchronization is not VariableSynchronization.ON_READ


def create_variable(
    initial_value: InitialValue | None = None,
    trainable: bool | None = None,
    *,
    name: str | None = None,
    dtype: DTypeLike | None = None,
    shape: Sequence[int | None] | None = None,
    synchronization: VariableSynchronization | None = VariableSynchronization.AUTO,
    aggregation: VariableAggregation | None = VariableAggregation.NONE,
    validate_shape: bool = True,
    caching_device: object = None,
    constraint: Callable[[Any], Any] | None = None,
) -> Any:
    """``td.Variable(...)``: see :class:`towerdist.Variable` for the arguments."""
    # (-> Any, not Variable, while callers still carry a ``type: ignore[no-any-return]`` for it)
    del caching_device  # a graph-mode placement hint; towerdist places variables itself
    spec = _check(
        initial_value, trainable, name, dtype, shape, validate_shape, synchronization, aggregation, constraint
    )
    context.require_no_mixed_scopes("td.Variable()")
    replica_context = context.replica_context_in_run()
    if replica_context is not None and context.has_strategy():
        # Inside strategy.run: one variable for all replicas (the default strategy's run has
        # one replica, which creates its variable directly).
        request = _Request(spec, replica_context)
        return replica_context._merge_call(_create_shared, (request,), {}, "td.Variable()")
    return context.get_strategy().extended._create_variable(spec)


def _check(
    initial_value: InitialValue | None,
    trainable: bool | None,
    name: str | None,
    dtype: DTypeLike | None,
    shape: Sequence[int | None] | int | None,
    validate_shape: bool,
    synchronization: VariableSynchronization | None,
    aggregation: VariableAggregation | None,
    constraint: Callable[[Any], Any] | None,
) -> VariableSpec:
    # The annotations are the contract; the checks below word TensorFlow's errors for code that breaks it.
    if initial_value is None:
        raise ValueError(
            "The `initial_value` arg to `td.Variable` must be specified: pass an array, a Python value, or "
            "a callable returning one, e.g. td.Variable(0.0) or td.Variable(lambda: td.zeros([3]))."
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"td.Variable() takes name as a string. Got name={name!r} of type {type(name).__name__}.")
    label = name_scope.variable_name(name)  # in td.name_scope("main"): "main/<name>"
    # None means the default, as in TensorFlow (library code passes None through).
    if synchronization is None:
        synchronization = VariableSynchronization.AUTO
    if aggregation is None:
        aggregation = VariableAggregation.NONE
    if not isinstance(synchronization, VariableSynchronization):
        raise ValueError(
            f"Invalid variable synchronization mode: {synchronization!r} for variable: {name}. Use a "
            f"td.VariableSynchronization member (AUTO, NONE, ON_WRITE, ON_READ)."
        )
    if not isinstance(aggregation, VariableAggregation):
        raise ValueError(
            f"Invalid variable aggregation mode: {aggregation!r} for variable: {name}. Use a "
            f"td.VariableAggregation member (NONE, SUM, MEAN, ONLY_FIRST_REPLICA)."
        )
    if constraint is not None and not callable(constraint):
        raise ValueError(f"The `constraint` argument must be a callable. Got constraint={constraint!r}.")
    declared = None
    if shape is not None:
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        declared = tuple(None if d is None else int(d) for d in shape)
    if synchronization is VariableSynchronization.AUTO:
        sync_on_read = thread_state.state.sync_on_read
        if sync_on_read and sync_on_read[-1][0] is context.get_strategy():
            # Inside TF 1.x's tower_local_var_scope: a sync-on-read variable, never trainable.
            synchronization, aggregation, trainable = VariableSynchronization.ON_READ, sync_on_read[-1][1], False
    colocations = thread_state.state.colocations
    colocate_with = None
    if colocations and colocations[-1][0] is context.get_strategy():
        colocate_with = colocations[-1][1]
    return VariableSpec(
        initial_value=initial_value,
        trainable=None if trainable is None else bool(trainable),
        name=label,
        dtype=None if dtype is None else np.dtype(dtype),
        shape=declared,
        validate_shape=bool(validate_shape),
        synchronization=synchronization,
        aggregation=aggregation,
        constraint=constraint,
        colocate_with=colocate_with,
    )


def materialize(spec: VariableSpec, device: DeviceSpec) -> TensorLike:
    """Computes the initial value once, on ``device``, as a private array of the right dtype.

    Raises:
      ValueError: the value does not have the declared ``shape``.
    """
    with device_lib.device(device):
        raw = spec.initial_value() if callable(spec.initial_value) else spec.initial_value
        array = to_array(raw, spec.dtype, f"td.Variable(name={spec.name!r}) initial_value")
    shape = tuple(array.shape)
    declared = spec.shape
    if declared is not None and (
        len(declared) != len(shape) or any(d is not None and d != s for d, s in zip(declared, shape))
    ):
        raise ValueError(
            f"In this `td.Variable` creation, the initial value's shape ({shape}) is not compatible with the "
            f"explicitly supplied `shape` argument ({declared}) for variable {spec.name!r}."
        )
    return backend.for_device(device).copy(array, device)


def declared_shape(spec: VariableSpec, array: Array) -> tuple[int | None, ...] | None:
    """The shape later assignments must have (None: any shape)."""
    if not spec.validate_shape:
        return None
    return spec.shape if spec.shape is not None else tuple(array.shape)


def host_counter(name: str) -> ResourceVariable:
    """An untrainable int64 scalar variable, 0, on the host and of no strategy: the same in every scope.

    For the counters checkpoints keep (``save_counter``, ``checkpointed_runs``).
    """
    spec = VariableSpec(
        np.int64(0),
        False,
        name,
        np.dtype(np.int64),
        (),
        True,
        VariableSynchronization.AUTO,
        VariableAggregation.ONLY_FIRST_REPLICA,
        None,
        None,
    )
    return plain_variable(spec, device_lib.HOST, None)


def plain_variable(spec: VariableSpec, device: DeviceSpec, strategy: Strategy | None) -> ResourceVariable:
    """A single-device variable on ``device`` created from ``spec``."""
    array = materialize(spec, device)
    return ResourceVariable(
        array,
        name=spec.name,
        device=device,
        trainable=spec.resolved_trainable(),
        synchronization=spec.synchronization,
        aggregation=spec.aggregation,
        shape=declared_shape(spec, array),
        constraint=spec.constraint,
        strategy=strategy,
    )


def distributed_variable(
    spec: VariableSpec, devices: Sequence[DeviceSpec], strategy: Strategy
) -> MirroredVariable | SyncOnReadVariable:
    """A ``MirroredVariable`` (ON_WRITE/AUTO) or ``SyncOnReadVariable`` (ON_READ) over ``devices``.

    The initial value is computed once, on the first device, and copied to the others
    (logical CPU devices share one immutable array). Component ``i > 0`` is named
    ``"<name>/replica_<i>"``.

    Raises:
      ValueError: synchronization NONE, or aggregation MEAN with a non-floating dtype.
    """
    if spec.synchronization is VariableSynchronization.NONE:
        raise ValueError(
            f"`NONE` variable synchronization mode is not supported with tf.distribute strategy. Please change "
            f"the `synchronization` for variable: {spec.name} (ON_WRITE keeps the copies equal, ON_READ "
            f"aggregates them when read)."
        )
    array = materialize(spec, devices[0])
    if spec.aggregation is VariableAggregation.MEAN and array.dtype.kind != "f":
        raise ValueError(
            f"creating distributed tf.Variable with aggregation=MEAN and a non-floating dtype is not supported, "
            f"please use a different aggregation or dtype (variable {spec.name!r} has dtype {array.dtype})."
        )
    synchronization = spec.synchronization
    if synchronization is VariableSynchronization.AUTO:
        synchronization = VariableSynchronization.ON_WRITE
    shape = declared_shape(spec, array)
    host = backend.host()
    components = []
    for i, device in enumerate(devices):
        impl = backend.for_device(device)
        shared = i == 0 or (impl is host and host.owns(array))
        components.append(
            ResourceVariable(
                array if shared else impl.copy(array, device),
                name=spec.name if i == 0 else f"{spec.name}/replica_{i}",
                device=device,
                trainable=spec.resolved_trainable(),
                synchronization=synchronization,
                aggregation=spec.aggregation,
                shape=shape,
                constraint=spec.constraint,
                strategy=strategy,
            )
        )
    kind = SyncOnReadVariable if synchronization is VariableSynchronization.ON_READ else MirroredVariable
    return kind(strategy, components, spec.aggregation)


# --- one variable for all replicas, created inside strategy.run --------------------------------


class _Request:
    """One replica's request to create a variable (a fresh object per replica and call)."""

    __slots__ = ("replica_context", "spec")

    def __init__(self, spec: VariableSpec, replica_context: ReplicaContext) -> None:
        self.spec = spec
        self.replica_context = replica_context


def _create_shared(strategy: Strategy, requests: PerReplica[_Request] | _Request) -> Variable:
    """Runs once, in cross-replica context, when every replica has asked for the variable."""
    ordered = list(requests.values) if isinstance(requests, PerReplica) else [requests]
    first = ordered[0].spec
    for replica_id, request in enumerate(ordered[1:], start=1):
        problem = _mismatch(first, request.spec)
        if problem:
            raise RuntimeError(
                f"Tried to create variable {request.spec.name!r} with mismatching {problem} on device "
                f"{replica_id}: td.Variable() inside strategy.run() creates one variable shared by all "
                f"replicas, so every replica must create the same variables in the same order, but at this "
                f"point replica 0 created {first.name!r} and replica {replica_id} created "
                f"{request.spec.name!r}."
            )
    # The initial value is computed as replica 0 would compute it, in its replica context
    # and on its device (a sync-on-read variable reads its local copy, as in TensorFlow);
    # the variable itself is then created in cross-replica context.
    replica_0 = ordered[0].replica_context
    with replica_0, device_lib.device(replica_0._device):
        initial_value = first.initial_value() if callable(first.initial_value) else first.initial_value
        initial_value = to_array(initial_value, first.dtype, f"td.Variable(name={first.name!r}) initial_value")
    variable: Variable = strategy.extended._create_variable(first._replace(initial_value=initial_value))
    return variable


def _mismatch(first: VariableSpec, other: VariableSpec) -> str | None:
    if _canonical(first.name) != _canonical(other.name):
        return "name"
    for field in ("synchronization", "aggregation"):
        if getattr(first, field) != getattr(other, field):
            return f"{field} ({getattr(first, field)!r} vs {getattr(other, field)!r})"
    a, b = first.initial_value, other.initial_value
    if backend.is_array(a) and backend.is_array(b) and tuple(a.shape) != tuple(b.shape):
        return f"initial value shape ({tuple(a.shape)} vs {tuple(b.shape)})"
    return None


def _canonical(name: str) -> str:
    """TensorFlow's canonical variable name: ``_<n>`` suffixes of name scopes are dropped."""
    return re.sub(r"_\d+$", "", re.sub(r"_\d+/", "/", name))
