"""Writes to an aggregated variable made in replica context.

A ``MirroredVariable`` with an aggregation (or CentralStorage's ``AggregatingVariable``)
must stay one value, so a replica cannot just write its own copy. Instead every replica's
write meets at the replica barrier (an internal collective request, like ``merge_call``
without regrouping arguments it does not need); the replicas' values are combined
according to the variable's ``aggregation`` and the result is written everywhere:

=====================  ==================================================================
aggregation            value written
=====================  ==================================================================
SUM                    the sum of the replicas' values (``reduce_to(SUM, value, var)``)
MEAN                   their mean
ONLY_FIRST_REPLICA     replica 0's value
NONE                   ``AggregatingVariable``: ``ValueError`` (there is no rule to combine
                       the values); a ``MirroredVariable`` never gets here: each replica
                       writes its own component, as in TensorFlow 2.21
=====================  ==================================================================

When every replica passes the *same* object (a Python number, an array made outside
``run``), it stands for one value: MEAN and ONLY_FIRST_REPLICA write it, SUM raises
(``reduce_to`` of a non-distributed value), as in TensorFlow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from towerdist._src import context
from towerdist._src import device as device_lib
from towerdist._src.cross_device_ops import sparse
from towerdist._src.cross_device_ops.placement import ResolvedDevices
from towerdist._src.cross_device_ops.shared_memory import SharedMemoryAllReduce, reduce_into_update
from towerdist._src.failures import name_api
from towerdist._src.indexed_slices import IndexedSlices, check_reducible
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues, PerReplica
from towerdist._src.values.regroup import regroup, select_replica
from towerdist._src.variable_enums import VariableAggregation
from towerdist._src.variables.scatter import Scatter
from towerdist._src.variables.sliced import describe_write
from towerdist._src.variables.variable import ASSIGN, ASSIGN_ADD, ASSIGN_SUB, ResourceVariable, WriteOp, WriteResult

if TYPE_CHECKING:  # the distributed variables import this module; the strategies build on the variables
    from towerdist._src.strategies.strategy import Strategy
    from towerdist._src.variables.aggregating_variable import AggregatingVariable
    from towerdist._src.variables.distributed_variable import DistributedVariable

# The variables whose replica-context writes are aggregated here.
AggregatedVariable: TypeAlias = "DistributedVariable | AggregatingVariable"

__all__ = ["aggregation_error", "write_in_replica"]


def aggregation_error(variable_type: str, name: str) -> ValueError:
    """The error for writing a variable with aggregation NONE in replica context."""
    return ValueError(
        f"You must specify an aggregation method to update a {variable_type} in replica context: "
        f"{name} was created with aggregation=VariableAggregation.NONE, so the values the replicas "
        f"write cannot be combined into one. Either create it with an aggregation, e.g. "
        f"td.Variable(..., aggregation=td.VariableAggregation.SUM) (or MEAN, ONLY_FIRST_REPLICA), or "
        f"update it in cross-replica context: call "
        f"td.distribute.get_replica_context().merge_call(merge_fn, ...) and inside merge_fn use "
        f"strategy.extended.update(variable, fn, ...)."
    )


def write_in_replica(variable: AggregatedVariable, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
    """Replica-context ``variable.<op>(value)``: aggregate across replicas, then write."""
    api = describe_write(type(variable).__name__, op)
    if variable.aggregation is VariableAggregation.NONE:
        raise aggregation_error(type(variable).__name__, variable.name)
    if isinstance(value, DistributedValues) and not getattr(value, "_is_distributed_variable", False):
        raise TypeError(
            f"Cannot use DistributedValues to update variables in replica context: {api} got a "
            f"{type(value).__name__}. Pass this replica's own value (strategy.run hands each replica its "
            f"component)."
        )
    if hasattr(value, "_towerdist_value"):
        value = value._towerdist_value()  # a variable: this replica reads it now
    replica_context = context.get_replica_context()
    assert replica_context is not None  # callers write in replica context only
    return replica_context._collective(_settle_writes, (variable, op, value, read_value), api)


def _settle_writes(strategy: Any, writes: list[tuple[AggregatedVariable, WriteOp, TensorLike, bool]]) -> list[Any]:
    """Runs once per round (cross-replica context): combines the replicas' values, writes once.

    ``writes[i]`` is replica ``i``'s ``(variable, op, value, read_value)``; the replicas
    met in the same API (the barrier checked it), so the method is the same. Each replica
    gets its component of the new value if it asked for it (``read_value``), else None.
    """
    # ``strategy`` stays Any (here and in _write_fused): a multi-replica strategy whose ``extended`` has the
    # cross-device ops, which ``Strategy.extended`` (typed as the base class) does not name.
    variable, op = writes[0][0], writes[0][1]
    if any(write[0] is not variable for write in writes):
        raise ValueError(
            "The replicas wrote to variables at the same point of strategy.run() with different "
            f"variables or methods ({_describe(regroup([write[0] for write in writes]))}, {op!r}); every "
            f"replica must make the same write (same variable, same method) at the same point."
        )
    read_value = any(write[3] for write in writes)
    written = _write_fused(strategy, variable, op, [write[2] for write in writes], read_value)
    if written is not _NOT_FUSED:
        return [select_replica(i, written) if write[3] else None for i, write in enumerate(writes)]
    devices = strategy.extended._replica_devices if len(writes) > 1 else None  # (multi-replica)
    value = regroup([write[2] for write in writes], devices, what=f"values of {describe_write(type(variable).__name__, op)}")
    try:
        combined = _aggregate(strategy, variable, value, op)
    except BaseException as error:  # the reduction's errors name the write the user made
        name_api(error, describe_write(type(variable).__name__, op))
        raise
    written = variable._write_cross_replica(op, combined, read_value)
    return [select_replica(i, written) if write[3] else None for i, write in enumerate(writes)]


_NOT_FUSED: Any = object()
_FUSED_OPS = {ASSIGN: None, ASSIGN_ADD: False, ASSIGN_SUB: True}  # op -> ``subtract`` of reduce_into_update


def _write_fused(strategy: Any, variable: Any, op: WriteOp, values: list[TensorLike], read_value: bool) -> Any:
    """The write as one pass over host memory, when it can be: ``_NOT_FUSED`` otherwise.

    The common case of a large aggregated write on logical CPUs: a SUM or MEAN
    ``MirroredVariable`` whose components share one host buffer, each replica passing its own
    host array of the variable's shape and dtype, in one process. The reduction and the
    update then run chunk by chunk in one pass (``reduce_into_update``), into the buffer the
    previous value was in when nobody still looks at it; the result is the same as reducing
    first and writing after. Anything else takes the general path.
    """
    # ``variable`` stays Any: a MirroredVariable once the checks below pass (its ``_write_result``), before
    # them any variable aggregated here.
    subtract = _FUSED_OPS.get(op, _NOT_FUSED) if type(op) is str else _NOT_FUSED
    agg = variable.aggregation
    extended = strategy.extended
    components: tuple[Any, ...] = getattr(variable, "_components", ())
    if (
        subtract is _NOT_FUSED
        or agg not in (VariableAggregation.SUM, VariableAggregation.MEAN)
        or len(values) < 2
        or len(components) != len(values)
        or extended._num_workers != 1
        or type(extended._cross_device_ops) is not SharedMemoryAllReduce  # (a subclass may override its reduce)
    ):
        return _NOT_FUSED
    old = components[0]._array
    if not _one_host_buffer(components, old):
        return _NOT_FUSED
    if agg is VariableAggregation.MEAN and old.dtype.kind not in "fc":
        return _NOT_FUSED  # (the general path raises the error for integer MEAN)
    for k, value in enumerate(values):
        if type(value) is not np.ndarray or value.shape != old.shape or value.dtype != old.dtype:
            return _NOT_FUSED
        if not value.flags.c_contiguous or any(value is other for other in values[:k]):
            return _NOT_FUSED  # (the same object from two replicas: the general path says why SUM refuses it)
    if op == ASSIGN:
        components[0]._check_assign_shape(old.shape)
    with contextlib.ExitStack() as locks:
        for component in components:
            locks.enter_context(component._write_lock)
        if not _one_host_buffer(components, old):
            return _NOT_FUSED  # written meanwhile (by code outside this step)
        out = components[0]._spare_like(old)
        if out is None:
            out = np.empty_like(old)
        reduce_into_update(ReduceOp.from_variable_aggregation(agg), values, old, subtract, out)
        for k, component in enumerate(components):
            component._store(out)
            if k:
                component._drop_spare()
    if not read_value:
        return None
    return variable._write_result()


def _one_host_buffer(components: Sequence[ResourceVariable], old: TensorLike) -> bool:
    """Whether every component's value is ``old`` or a view of the same whole host buffer."""
    if type(old) is not np.ndarray:
        return False
    owner = old if old.base is None else old.base
    for component in components:
        array = component._array
        if array is not old and (
            type(array) is not np.ndarray
            or (array if array.base is None else array.base) is not owner
            or array.shape != old.shape
            or array.strides != old.strides
        ):
            return False
    return owner.shape == old.shape or owner.size == old.size


def _aggregate(strategy: Strategy, variable: AggregatedVariable, value: TensorLike, op: WriteOp) -> TensorLike:
    agg = variable.aggregation
    if agg is VariableAggregation.MEAN and variable.dtype.kind != "f" and isinstance(value, PerReplica):
        raise ValueError(
            f"Cannot update non-float variables with tf.VariableAggregation.MEAN aggregation in replica "
            f"context: {variable.name} has dtype {variable.dtype}, and the mean of the replicas' values "
            f"is not an integer in general. Either change the variable dtype to float or update it in "
            f"cross-replica context."
        )
    collective = describe_write(type(variable).__name__, op)  # the workers name the collective after the write
    if agg is VariableAggregation.ONLY_FIRST_REPLICA:
        if isinstance(value, PerReplica) and isinstance(value.values[0], IndexedSlices):
            return _first_slices(strategy, value, collective)
        first = strategy.extended._first_replica_value(value, collective)
        return strategy.extended.broadcast_to(first, variable)
    # The internal entry: the context, the op and the destination (the variable) are known good.
    reduce_op = ReduceOp.from_variable_aggregation(agg)
    if _applies_rows_in_turn(op, value):
        return _concatenated_slices(strategy, reduce_op, value, collective)
    return strategy.extended._reduce_to(reduce_op, value, variable, None, collective=collective)


def _applies_rows_in_turn(op: WriteOp, value: TensorLike) -> bool:
    """A ``scatter_mul``/``scatter_div`` of the replicas' ``IndexedSlices``: each row's effect depends on the others'."""
    parts = value.values if isinstance(value, PerReplica) else (value,)  # (one local replica: the value itself)
    return isinstance(op, Scatter) and op.method in ("scatter_mul", "scatter_div") and isinstance(parts[0], IndexedSlices)


def _concatenated_slices(
    strategy: Strategy, reduce_op: ReduceOp, value: PerReplica[IndexedSlices] | IndexedSlices, collective: str
) -> IndexedSlices:
    """Every replica's slices one after another (MEAN: each value divided by the replicas), as TensorFlow reduces them.

    A sum of rows would give the same dense value, but a scatter_mul multiplies by each
    replica's row in turn (``x * a * b``, not ``x * (a + b)``): TensorFlow's numbers. Across
    workers the slices are gathered in global replica order (TensorFlow's all-gather).
    """
    parts = [sparse.to_device(part, None) for part in (value.values if isinstance(value, PerReplica) else (value,))]
    check_reducible(parts, collective)
    extended = strategy.extended
    host = ResolvedDevices((device_lib.HOST,))
    indices = extended._gather_to(PerReplica([p.indices.astype(np.int64) for p in parts]), host, 0, collective=collective)
    values = extended._gather_to(PerReplica([p.values for p in parts]), host, 0, collective=collective)
    if reduce_op is ReduceOp.MEAN:
        values = values / strategy.num_replicas_in_sync
    return IndexedSlices(values, indices, parts[0].dense_shape)


def _first_slices(strategy: Strategy, value: PerReplica, collective: str) -> IndexedSlices:
    """Replica 0's ``IndexedSlices`` (a scatter with ONLY_FIRST_REPLICA), written to every component as it is.

    Each component moves the rows to its own device as it writes them, so there is nothing
    to broadcast within one process.
    """
    if strategy.extended._num_workers != 1:
        raise NotImplementedError(
            f"{collective} with aggregation ONLY_FIRST_REPLICA is not supported across workers yet: global replica "
            f"0's IndexedSlices would have to be broadcast to the other workers. Use aggregation SUM or MEAN "
            f"(scatter_add/scatter_sub), or scatter in cross-replica context with the same rows on every worker."
        )
    first: IndexedSlices = value.values[0]
    return first


def _describe(value: object) -> str:
    if isinstance(value, PerReplica):
        return "replicas passed " + ", ".join(_describe(v) for v in value.values)
    if isinstance(value, str):
        return repr(value)
    name = getattr(value, "name", None)
    return repr(value) if name is None else f"{name} (object {id(value):#x})"
