"""Distributed variables: one component variable per replica device.

* :class:`MirroredVariable` (``synchronization=ON_WRITE``/``AUTO``) keeps its components
  equal: a write in cross-replica context goes to every component, a write in replica
  context is aggregated across replicas first (``aggregation.py``).
* :class:`SyncOnReadVariable` (``synchronization=ON_READ``) lets each replica write its own
  component and aggregates only when read in cross-replica context (metrics).

Both are ``DistributedValues`` (``.values`` are the components, in replica order) and
``Variable``\\ s. Which component a read or write touches depends on the context:

=======================  ==============================  =====================================
context                  read                            write
=======================  ==============================  =====================================
replica ``i``            component ``i``                 mirrored: aggregated, all components
                                                         (aggregation NONE: component ``i``);
                                                         sync-on-read: component ``i``
update context ``i``     component ``i``                 component ``i``
cross-replica / none     mirrored: the component on the  every component
                         current device, else the first;
                         sync-on-read: the aggregate
=======================  ==============================  =====================================
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import backend, context, thread_state, update_fence
from towerdist._src.failures import name_api
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import TensorLike
from towerdist._src.values.distributed_values import DistributedValues, Mirrored, PerReplica
from towerdist._src.values.regroup import split_for_replicas
from towerdist._src.variable_enums import VariableAggregation, VariableSynchronization
from towerdist._src.variables import aggregation, scatter
from towerdist._src.variables.sliced import SliceAssign, describe_write
from towerdist._src.variables.variable import (
    ASSIGN_ADD,
    ASSIGN_SUB,
    ResourceVariable,
    Variable,
    WriteOp,
    WriteResult,
    to_array,
    unread,
)

if TYPE_CHECKING:
    from towerdist._src.strategies.strategy import Strategy

__all__ = ["DistributedVariable", "MirroredVariable", "SyncOnReadVariable", "write_components"]


class DistributedVariable(DistributedValues, Variable):
    """Base class of variables with one component per replica device."""

    _is_distributed_variable = True

    def __init__(self, strategy: Strategy, components: Sequence[ResourceVariable], aggregation: VariableAggregation) -> None:
        super().__init__(components, [c._device for c in components])
        self._components: tuple[ResourceVariable, ...] = tuple(components)
        self._distribute_strategy = strategy
        self._aggregation = aggregation
        container = weakref.ref(self)
        for component in components:
            component._distributed_container = container

    # --- properties (of the primary component unless the context picks another) ----------

    @property
    def name(self) -> str:
        return self._components[0].name

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._components[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._component_here().shape

    @property
    def device(self) -> str:
        return self._component_here().device

    @property
    def trainable(self) -> bool:
        return self._components[0].trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._components[0].synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        return self._aggregation

    @property
    def distribute_strategy(self) -> Strategy:
        return self._distribute_strategy

    @property
    def constraint(self) -> Callable[[Any], Any] | None:
        return self._components[0].constraint

    # --- reads ----------------------------------------------------------------------------

    def value(self) -> TensorLike:
        modes = thread_state.state.modes
        if modes:
            top = modes[-1]
            replica_context = top.replica_context
            if top.strategy is self._distribute_strategy and replica_context is not None:
                # The hot path: a read in a replica of this variable's strategy.
                return self._components[replica_context._replica_id].value()
        self._check_strategy("value()")
        replica_id = context.current_replica_id()
        if replica_id is not None and replica_id < len(self._components):
            return self._components[replica_id].value()
        return self._read_cross_replica()

    def _read_cross_replica(self) -> TensorLike:
        raise NotImplementedError

    def _get_cross_replica(self) -> TensorLike:
        return self._read_cross_replica()

    def _component_here(self) -> ResourceVariable:
        """The component of this replica or update context, else of the current device."""
        replica_id = context.current_replica_id()
        if replica_id is not None and replica_id < len(self._components):
            return self._components[replica_id]
        component: ResourceVariable = self._get_on_device_or_primary()
        return component

    # --- writes ---------------------------------------------------------------------------

    def _write(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        self._check_strategy(describe_write("", op).lstrip("."))
        component = self._update_component()
        if component is not None:
            return component._write(op, value, read_value)
        replica_context = context.replica_context_in_run()
        if replica_context is not None and replica_context.strategy is self._distribute_strategy:
            return self._write_in_replica(op, value, read_value)
        return self._write_cross_replica(op, value, read_value)

    def _write_in_replica(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        raise NotImplementedError

    def _api(self, method: str) -> str:
        return f"{type(self).__name__}.{method}()"

    def _check_scatter(self, method: str) -> None:
        if method in scatter.ND or method == scatter.BATCH:
            raise NotImplementedError(
                f"{self._api(method)} is not supported by distributed variables (as in TensorFlow): {self.name} has "
                f"{len(self._components)} copies. Use scatter_update()/scatter_add() with a td.IndexedSlices, or "
                f"write each copy in strategy.extended.update({self.name.partition(':')[0]}, lambda copy: "
                f"copy.{method}(...))."
            )

    def _write_cross_replica(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        """Writes ``value`` to every component (a distributed value component-wise)."""
        try:
            parts = split_for_replicas(value, len(self._components), "value")
        except BaseException as error:  # a hot path: nothing to pay until it raises
            name_api(error, describe_write(type(self).__name__, op))  # the write the user called
            raise
        write_components(self._components, op, parts)
        if not read_value:
            return None
        if type(op) is SliceAssign:
            # ``v[key].assign(x)``: one variable, read when used, as in TensorFlow (whose
            # strided-slice assign writes the first copy only; here every copy is written).
            return unread(self)
        return self._write_result()

    def _write_result(self) -> WriteResult:
        """What a write returns when asked to read the value, as TensorFlow's grouped update.

        Several components: every component's new value (a ``Mirrored``). One component
        (``MultiWorkerMirroredStrategy`` on a worker without GPUs, a one-device
        ``MirroredStrategy``): TensorFlow returns that component's write result as it is, the
        variable read when used (an ``UnreadVariable``).
        """
        if len(self._components) == 1:
            return unread(self._components[0])
        return Mirrored([component.value() for component in self._components], self._devices)

    def _update_component(self) -> ResourceVariable | None:
        """The component an update context of this thread selects, if any."""
        state = thread_state.state
        if not state.updates or (state.modes and state.modes[-1].replica_context is not None):
            return None
        replica_id = state.updates[-1].replica_id
        if replica_id is None or replica_id >= len(self._components):
            return None
        return self._components[replica_id]

    def _check_strategy(self, method: str) -> None:
        """Raises if another strategy is current; ``method`` is e.g. ``"value()"``."""
        if context.has_strategy() and context.get_strategy() is not self._distribute_strategy:
            raise context.wrong_strategy_scope(self._distribute_strategy, f"{type(self).__name__}.{method}")

    def __deepcopy__(self, memo: dict[int, Any]) -> DistributedVariable:
        """A new distributed variable of the same strategy, devices and attributes (as TensorFlow's).

        Each component is copied on its own device (components sharing one host buffer
        share one new buffer); writes to the copy never change the original. Allowed
        outside any scope or under this variable's strategy.

        Raises:
          ContextError: called under another strategy's scope.
        """
        if context.has_strategy() and context.get_strategy() is not self._distribute_strategy:
            raise context.wrong_strategy_scope(self._distribute_strategy, "copy.deepcopy()")
        copies: dict[int, Any] = {}
        components = []
        for component in self._components:
            if update_fence.up:  # copied by the replica that handed its update over: the value after it
                update_fence.wait(component)
            array = component._array
            if id(array) not in copies:
                copies[id(array)] = component._impl.copy(array, component._device)
            components.append(component._copy_with(copies[id(array)]))
        copied = type(self)(self._distribute_strategy, components, self._aggregation)
        memo[id(self)] = copied
        for original, component in zip(self._components, components):
            memo[id(original)] = component
        return copied


class MirroredVariable(DistributedVariable):
    """A variable kept equal on every replica device (``synchronization=ON_WRITE``).

    Created by ``td.Variable(...)`` in a ``MirroredStrategy`` scope. In replica context a
    write is combined across replicas according to ``aggregation`` (SUM, MEAN,
    ONLY_FIRST_REPLICA) and then applied to every component. With aggregation NONE (the
    default) each replica writes only its own component, as in TensorFlow 2.21: the
    components stay equal when every replica writes the same value, e.g. after an
    ``all_reduce`` of the gradients::

        def step(grad):
            total = td.distribute.get_replica_context().all_reduce("sum", grad)
            v.assign_sub(0.1 * total)   # each replica updates its copy with the same value

    A cross-replica read returns the component on the current device, else the first one.
    """

    _is_mirrored = True

    def _check_scatter(self, method: str) -> None:
        super()._check_scatter(method)
        if method in scatter.REFUSED_WITH_REDUCTION and self._aggregation in (
            VariableAggregation.SUM,
            VariableAggregation.MEAN,
        ):
            raise NotImplementedError(
                f"{self._api(method)} is only supported for mirrored variables with NONE or ONLY_FIRST_REPLICA "
                f"aggregation, got: {self._aggregation} ({self.name}): the replicas' rows cannot be combined by "
                f"{self._aggregation.name} for this update. Create the variable with "
                f"aggregation=td.VariableAggregation.ONLY_FIRST_REPLICA (or NONE), or use scatter_add()."
            )

    def _read_cross_replica(self) -> TensorLike:
        return self._get_on_device_or_primary().value()

    def _write_in_replica(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        if self._aggregation is VariableAggregation.NONE:
            # The replica's own component only. Components on logical CPUs may share one
            # (immutable) buffer; the write swaps in a new buffer for this component alone.
            return self._component_here()._write(op, value, read_value)
        return aggregation.write_in_replica(self, op, value, read_value)


class SyncOnReadVariable(DistributedVariable):
    """A variable whose replicas update their own copy; reads aggregate (``ON_READ``).

    In replica context reads and writes use the replica's own component. In
    cross-replica context a read aggregates the components (SUM, MEAN or the first for
    ONLY_FIRST_REPLICA; NONE raises ``ValueError``), ``assign(x)`` stores ``x / N`` in every
    component for SUM (so the sum reads back as ``x``) and ``x`` otherwise, and
    ``assign_add``/``assign_sub`` raise for SUM.
    """

    def _check_scatter(self, method: str) -> None:
        super()._check_scatter(method)
        raise NotImplementedError(
            f"Variables with `synchronization=ON_READ` doesn't support `{method}`: {self._api(method)} of "
            f"{self.name} (each replica's copy is its own partial value). Write the replica's own copy with "
            f"assign()/assign_add() inside strategy.run(), or use a variable with synchronization=ON_WRITE."
        )

    def _read_cross_replica(self) -> TensorLike:
        if self._aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            extended = self._distribute_strategy.extended
            if extended._num_workers == 1:
                return self._components[0].value()
            return extended._first_replica_value(self._components[0].value(), f"reading {self.name}")
        op = ReduceOp.from_variable_aggregation(self._aggregation)
        return self._distribute_strategy.extended._reduce(op, self)

    def _write_in_replica(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        return self._component_here()._write(op, value, read_value)

    def _write_cross_replica(self, op: WriteOp, value: TensorLike, read_value: bool) -> WriteResult:
        if self._aggregation is VariableAggregation.SUM:
            if op in (ASSIGN_ADD, ASSIGN_SUB):
                raise ValueError(
                    f"SyncOnReadVariable does not support `{op}` in cross-replica context when aggregation "
                    f"is set to `tf.VariableAggregation.SUM`: {self.name} would add the value to each of "
                    f"its {len(self._components)} copies, changing the sum by {len(self._components)} times "
                    f"the value. Call {op} inside strategy.run(), or assign() the new total."
                )
            value = self._split_sum(value)
        super()._write_cross_replica(op, value, read_value=False)
        return self.value() if read_value else None

    def _split_sum(self, value: TensorLike) -> TensorLike:
        """Parts of ``value``, one per component, that sum to ``value``.

        Floating point: ``value / num_replicas`` in every component (TensorFlow's rule).
        Integers: ``value // num_replicas`` in every component and the remainder added to
        the first, so the sum reads back exactly (TensorFlow truncates and loses it).
        """
        if isinstance(value, DistributedValues) and not isinstance(value, Variable):
            return value  # already one value per component
        # The same conversion rules as every other write (a float into an int variable or a
        # complex value into a real one raises), before the value is split.
        array = to_array(value, self.dtype, f"{type(self).__name__}.assign() of {self.name}")
        impl = backend.for_array(array)
        extended = self._distribute_strategy.extended
        local = len(self._components)
        n = local * extended._num_workers  # every worker's copies (MultiWorkerMirroredStrategy)
        if self.dtype.kind not in "iu":
            return impl.true_divide(array, n).astype(self.dtype)
        whole = impl.xp.asarray(array)
        share = whole // n
        first = share + (whole - share * n) if extended._worker_index == 0 else share
        return PerReplica([first] + [share] * (local - 1))


# --- writing components as one transaction ---------------------------------------------------


def write_components(components: Sequence[ResourceVariable], op: WriteOp, parts: Sequence[TensorLike]) -> list[TensorLike]:
    """Applies ``op(parts[i])`` to ``components[i]`` for every ``i``, all or nothing.

    Every new value is computed before any is stored, so a bad value (wrong shape or
    dtype) leaves all components unchanged. Components in host memory that hold the same
    array and receive the same part share one result (each gets its own read-only
    object), so a mirrored variable on N logical CPUs costs one update, not N.

    Returns the components' new values.
    """
    with contextlib.ExitStack() as locks:
        for component in components:  # always in component order: no lock-order inversion
            locks.enter_context(component._write_lock)
        return _write_locked(components, op, parts)


def _write_locked(components: Sequence[ResourceVariable], op: WriteOp, parts: Sequence[TensorLike]) -> list[TensorLike]:
    host = backend.host()
    prepared: list[Any] = []
    shared: list[bool] = []  # the component reuses another's result (that one keeps the spare buffer)
    cache: dict[tuple[object, ...], TensorLike] = {}
    for component, part in zip(components, parts):
        key = None
        if component._impl is host:
            part_key = _content_key(part)
            if part_key is not None:
                key = (_content_key(component._array), part_key)
                if key in cache:
                    prepared.append(cache[key])
                    shared.append(True)
                    continue
        array = component._prepare(op, part)
        if key is not None:
            cache[key] = array
        prepared.append(array)
        shared.append(False)
    for component, array, reused in zip(components, prepared, shared):
        component._store(array)
        if reused:
            component._drop_spare()
    return [component.value() for component in components]


def _content_key(value: object) -> tuple[object, ...] | None:
    """Equal keys mean equal contents at this instant (same memory, same view); else None."""
    if isinstance(value, np.ndarray):
        return ("array", value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.str)
    if isinstance(value, (int, float, bool, np.generic)):
        return ("object", id(value))
    return None
