"""The distribution-aware optimizer base class (``td.optimizers.Optimizer``).

``apply_gradients`` follows TensorFlow's recipe for updating distributed variables:

1. In a replica context the replicas meet once (one barrier, like ``merge_call``); one
   function then runs in cross-replica context with every replica's gradients.
2. The gradients are summed across replicas in one call of the strategy's collective
   path (packed where small), each sum on its variable's devices.
3. The update rule runs once per variable and device group: the copies of a variable on
   logical CPUs share one host buffer (and so do its slots), so the rule runs once for
   all of them, as ``extended.update`` would have run it on each copy with the same
   result. Large steps spread the variables over the replica threads parked at the
   barrier (``parallel.py``). New values go into buffers reused from step to step when no
   snapshot looks at them (``update_buffers.py``), so a steady training loop allocates
   nothing here.
4. The step counter advances: a host-side integer, mirrored into the ``iterations``
   variable without reading it back from a device.

Slot variables (momentum, Adam's moments) are created under
``colocate_vars_with(var)``, so they live on exactly the devices of their variable. The
step counter ``iterations`` is a non-slot variable created under
``colocate_vars_with(non_slot_devices(var_list))``.

Subclasses name their slots (``_slot_names``) and implement ``_compute`` (the rule on
arrays); see ``sgd.py`` and ``adam.py``. A gradient given as ``IndexedSlices`` is checked and
prepared per replica, summed with the sparse collective (``_all_reduce_sparse``, never
densified for the exchange) and reaches ``_compute_sparse`` as the rows' sums, with the sums
of the slices' squares for the rules that square the gradient (``sparse_gradients.py`` says
why); each rule then does what Keras 3 does with the slices, row-wise or on every row.

The parts, one concept each: ``gradient_checks.py`` (the checks on the pairs, before any
update), ``update_plan.py`` (what one variable's update needs, found once; the identity
caches apart in ``PlanCache``), ``step_counter.py`` (the host step count). New values reach
the variables through their storage API (``ResourceVariable._adopt`` and friends in
``variables/variable.py``), never by writing ``_array``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import backend, context, parallel, update_fence
from towerdist._src.cross_device_ops.shared_memory import reduce_host_arrays
from towerdist._src.errors import ValidationError
from towerdist._src.failures import name_api, unworded, worded_at
from towerdist._src.indexed_slices import IndexedSlices, check_reducible, densify
from towerdist._src.optimizers.gradient_checks import (
    NOTHING_TO_SUM,
    check_gradient,
    check_pairs,
    check_sparse_gradient,
    columns_of,
    gradient_columns,
    to_sum,
    variable_ref,
    warn_skipped,
    where_from,
)
from towerdist._src.optimizers.sparse_gradients import SparseRows, prepare, rows_of
from towerdist._src.optimizers.step_counter import HostStep
from towerdist._src.optimizers.update_plan import (
    ONE_BUFFER,
    SEPARATE,
    Group,
    PlanCache,
    VariablePlan,
    components,
    publish,
)
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import Array, ArrayModule, TensorLike
from towerdist._src.variable_enums import VariableAggregation
from towerdist._src.variables import creation
from towerdist._src.variables.update_buffers import UpdateBuffers
from towerdist._src.variables.variable import ResourceVariable, Variable, VariableRef

if TYPE_CHECKING:  # named in annotations only
    from towerdist._src.device import DeviceSpec
    from towerdist._src.strategies.strategy import Strategy

__all__ = ["Optimizer"]

LearningRate = float | Callable[[int], Any]


class Optimizer:
    """Base class of towerdist's optimizers (TensorFlow's Keras optimizer API, without autodiff).

    Compute gradients yourself (numpy/cupy) and pass them to :meth:`apply_gradients`,
    inside ``strategy.run`` or in cross-replica context.

    Args:
      learning_rate: a float >= 0, or a callable taking the step (``iterations``, an int)
        and returning the learning rate (a schedule).
      name: the optimizer's name, used in its variables' names.
    """

    _slot_names: tuple[str, ...] = ()

    def __init__(self, learning_rate: LearningRate, name: str) -> None:
        self._learning_rate = _check_learning_rate(learning_rate)
        self._name = name
        self._strategy: Strategy | None = None  # the strategy of the variables, bound by the first build
        self._init_strategy = context.get_strategy()  # where `iterations` goes if used before that
        self._iterations: Variable | None = None
        self._non_slot: Any = None
        self._slots: dict[VariableRef, dict[str, Variable]] = {}
        # Checkpointed slot values restored before their slot existed: (variable ref, slot name) -> array.
        self._deferred_slots: dict[tuple[VariableRef, str], Any] = {}
        # The step count on the host (a write to ``iterations`` by anyone else is noticed).
        self._host_step = HostStep()
        # Per variable: its update plan (update_plan.py); the previous call's variables and plans.
        self._cache = PlanCache()
        self._api = f"{type(self).__name__}.apply_gradients()"

    # --- properties ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The optimizer's name."""
        return self._name

    @property
    def iterations(self) -> Variable:
        """The number of steps applied so far: an int64 non-slot variable.

        Created on first use, in the scope of the optimized variables' strategy (or, before
        any variable is known, of the strategy current when the optimizer was created).
        """
        if self._iterations is None:
            self._create_iterations(self._strategy or self._init_strategy, [])
        assert self._iterations is not None
        return self._iterations

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next step (a schedule is evaluated at ``iterations``).

        Assign a float or a schedule to change it.
        """
        if update_fence.up:  # the step count of an update this replica handed over
            update_fence.wait()
        return self._current_learning_rate(self._host_step.read(self._iterations))

    @learning_rate.setter
    def learning_rate(self, value: LearningRate) -> None:
        checked = _check_learning_rate(value)
        if update_fence.up:  # an update this replica handed over still applies the rate of its own call
            update_fence.wait()
        self._learning_rate = checked

    @property
    def variables(self) -> list[Variable]:
        """The optimizer's variables: ``iterations``, then the slots in creation order."""
        found = [] if self._iterations is None else [self._iterations]
        for slots in self._slots.values():
            found.extend(slots.values())
        return found

    def get_slot_names(self) -> list[str]:
        """The names of the slots this optimizer keeps per variable (``["m", "v"]`` for Adam)."""
        return list(self._slot_names)

    def get_slot(self, var: Variable, slot_name: str) -> Variable:
        """The slot variable ``slot_name`` of ``var`` (a distributed variable on ``var``'s devices).

        Raises:
          KeyError: ``var`` has no such slot (not optimized yet, or an unknown name).
        """
        with worded_at(f"{type(self).__name__}.get_slot()"):
            slots = self._slots.get(variable_ref(var))
        if slots is None or slot_name not in slots:
            known = ", ".join(repr(n) for n in self._slot_names) or "none"
            state = "has not been optimized yet" if slots is None else "has no such slot"
            raise KeyError(
                f"{type(self).__name__}.get_slot(): variable {var.name} {state}. Got slot_name={slot_name!r}; this "
                f"optimizer's slots are {known}, created on the first apply_gradients() (or build())."
            )
        return slots[slot_name]

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments, so ``type(opt).from_config(opt.get_config())`` makes a twin."""
        return {"name": self._name, "learning_rate": self._learning_rate}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Optimizer:
        """Creates an optimizer from :meth:`get_config`'s result."""
        return cls(**config)

    # --- building ------------------------------------------------------------------------

    def build(self, var_list: Sequence[Variable]) -> None:
        """Creates ``iterations`` and the slots of ``var_list`` now (else the first step does).

        Call it outside ``strategy.run`` (cross-replica context or no strategy).
        """
        api = f"{type(self).__name__}.build()"
        variables = list(var_list)
        with worded_at(api):
            for var in variables:
                variable_ref(var)
            strategy = self._bind(variables)
        if context.has_strategy() and context.get_strategy() is not strategy:
            raise context.wrong_strategy_scope(strategy, api)
        context.require_cross_replica_or_default(strategy, api)
        self._build(strategy, variables)

    def _build(self, strategy: Strategy, variables: Sequence[Variable]) -> None:
        plans = self._cache.plans
        if self._iterations is not None and all(id(var) in plans for var in variables):
            return  # every variable has its slots (and an update plan) already
        with strategy.scope():
            if self._iterations is None:
                self._create_iterations(strategy, variables)
            for var in variables:
                ref = var.ref()
                if ref not in self._slots:
                    self._slots[ref] = {name: self._create_slot(strategy, var, name) for name in self._slot_names}
                if id(var) not in plans:
                    plans[id(var)] = VariablePlan(var, self._slots[ref])

    def _create_iterations(self, strategy: Strategy, variables: Sequence[Variable]) -> None:
        with strategy.scope():
            extended = strategy.extended
            if variables:
                self._non_slot = extended.non_slot_devices(list(variables))
                with extended.colocate_vars_with(self._non_slot):
                    self._iterations = self._new_iterations()
            else:
                self._iterations = self._new_iterations()
                self._non_slot = extended.non_slot_devices([self._iterations])

    def _new_iterations(self) -> Variable:
        return creation.create_variable(  # type: ignore[no-any-return]
            np.int64(0),
            name=f"{self._name}/iterations",
            trainable=False,
            aggregation=VariableAggregation.ONLY_FIRST_REPLICA,
        )

    def _create_slot(self, strategy: Strategy, var: Variable, slot_name: str) -> Variable:
        initial = self._deferred_slots.pop((var.ref(), slot_name), None)
        if initial is None:
            initial = np.full(var.shape, self._slot_initial_value(slot_name), dtype=var.dtype)
        with strategy.extended.colocate_vars_with(var):
            return creation.create_variable(  # type: ignore[no-any-return]
                initial,
                name=f"{self._name}/{_base_name(var)}/{slot_name}",
                trainable=False,
                dtype=var.dtype,
                aggregation=VariableAggregation.NONE,
            )

    # --- applying gradients ----------------------------------------------------------------

    def apply_gradients(
        self,
        grads_and_vars: Iterable[tuple[Any, Variable]],
        name: str | None = None,
        experimental_aggregate_gradients: bool = True,
    ) -> Variable:
        """Applies one step of the update rule to each variable, summing gradients across replicas.

        Call it inside ``strategy.run`` (every replica passes its own gradients; they are
        summed, so scale each replica's loss by the *global* batch size, e.g. with
        ``td.nn.compute_average_loss``), or in cross-replica context / with no strategy
        (a ``PerReplica`` gradient of a multi-replica strategy is summed, any other value
        is applied as given).

        Args:
          grads_and_vars: pairs ``(gradient, variable)``; a ``None`` gradient skips its
            variable (with a warning).
          name: ignored (TensorFlow's op name).
          experimental_aggregate_gradients: False if the gradients are already summed
            across replicas (each replica then passes the same sum).

        Returns:
          ``iterations``, after the increment.

        Raises:
          ValueError: no gradients, a variable listed twice, or a gradient whose shape
            differs from its variable's (the message names the variable and replica).
          InvalidArgumentError: (also a ValueError) an ``IndexedSlices`` gradient whose
            ``dense_shape`` or rows are not the variable's, an index out of range, or a
            gradient whose dtype does not convert to the variable's.
            ``td.errors.ValidationError`` (also an ``AssertionError``, as TensorFlow raises)
            for variables created outside ``strategy.scope()`` used under a strategy.
          ContextError: called under another strategy's scope.
        """
        del name
        api = self._api
        if update_fence.up:  # this replica's previous update may still be being applied
            update_fence.wait()
        try:
            pairs, steady = self._checked_pairs(grads_and_vars)
            strategy = self._strategy if steady else None
            if strategy is None or (context.has_strategy() and context.get_strategy() is not strategy):
                strategy = self._bind([var for _, var in pairs])
                if context.has_strategy() and context.get_strategy() is not strategy:
                    raise context.wrong_strategy_scope(strategy, api)
        except BaseException as error:  # (free until raised: this is every training step's path)
            name_api(error, api)
            raise
        replica_context = context.replica_context_in_run()
        if replica_context is not None:
            # Every replica brings its pairs; one function applies them all (no regrouping).
            def settle(merge_strategy: Strategy, per_replica: list[list[tuple[Any, Variable]]]) -> list[Any]:
                try:
                    columns = gradient_columns(per_replica)
                    given = _given_columns(per_replica)
                    deferred = _replica_gpus(merge_strategy, len(per_replica))
                    self._apply(
                        merge_strategy, per_replica[0], columns, experimental_aggregate_gradients, True, deferred,
                        given,
                    )
                except BaseException as error:  # the gradients' checks raise unworded
                    name_api(error, api)
                    raise
                if deferred is None:
                    return [None] * len(per_replica)
                return [deferred[device.device_index] for device in _replica_devices(merge_strategy)]

            # Host arrays summed into a small update need nothing back: a replica arriving before
            # the others may hand a copy of them over and go on (replica_step.py, "Handing over").
            hand_over = (
                steady
                and self._cache.last_gpu_array_type is None  # (then every gradient is a numpy array)
                and experimental_aggregate_gradients
                and self._cache.small_host_update(self._cost_per_byte, _PARALLEL_MIN_BYTES)
            )
            own_updates = replica_context._collective(settle, pairs, api, self._hand_over_copy if hand_over else None)
            if own_updates:  # this replica's GPU: its copies of the variables, on its thread and stream
                for group in own_updates:
                    self._update_group(*group)
            assert self._iterations is not None
            return self._iterations
        context.require_cross_replica_or_default(strategy, api)
        try:
            with strategy.scope():
                columns = [columns_of(grad) for grad, _ in pairs]
                self._apply(strategy, pairs, columns, experimental_aggregate_gradients, False)
        except BaseException as error:  # the gradients' checks raise unworded (free until raised)
            name_api(error, api)
            raise
        assert self._iterations is not None
        return self._iterations

    def _hand_over_copy(
        self, pairs: list[tuple[np.ndarray, Variable]], replica: int
    ) -> tuple[HandedOver, frozenset[int]]:
        """A private copy of a replica's gradients for the replica settling the step (it goes on meanwhile),
        and the ids of the single-device variables the step writes (its fence: the variables, their
        slots, ``iterations``).

        Into buffers kept per variable and replica, reused every step.
        """
        plans = self._cache.plans
        name = _staging_name(replica)
        copied = HandedOver(pairs)
        written: list[int] = []
        for grad, var in pairs:
            plan = plans.get(id(var))
            buffer = None if plan is None else plan.sum_buffers.scratch(name, grad)
            if buffer is None:
                buffer = grad.copy()
            else:
                np.copyto(buffer, grad)
            copied.append((buffer, var))
            for members in (components(var), *(() if plan is None else plan.slots.values())):
                written.extend(map(id, members))
        if self._iterations is not None:
            written.extend(map(id, components(self._iterations)))
        return copied, frozenset(written)

    def _checked_pairs(
        self, grads_and_vars: Iterable[tuple[Any, Variable]]
    ) -> tuple[list[tuple[Any, Variable]], bool]:
        """The checked pairs, and whether they took the short way (the same variables as the previous call).

        When every gradient is an array and the variables are those of the previous call,
        in order, every check on them passed before (they are variables, of one strategy,
        none twice): only the gradients are new, and ``_apply`` checks those.
        """
        cache = self._cache
        try:
            pairs = grads_and_vars if type(grads_and_vars) is list else list(grads_and_vars)
        except TypeError:
            pairs = grads_and_vars  # type: ignore[assignment]  # not iterable: check_pairs says so
            return check_pairs(pairs)[0], False  # raises
        last = cache.last_variables
        if pairs and len(pairs) == len(last):
            gpu_array = cache.last_gpu_array_type  # a GPU step's gradients are cupy arrays, checked once as such
            for pair, var in zip(pairs, last):
                if not (
                    type(pair) is tuple
                    and len(pair) == 2
                    and pair[1] is var
                    and (type(pair[0]) is np.ndarray or type(pair[0]) is gpu_array)
                ):
                    break
            else:
                return pairs, True
        checked, skipped = check_pairs(pairs)
        if skipped:
            warn_skipped(skipped, self._api, stacklevel=3)  # the caller of apply_gradients
        cache.last_variables = tuple(var for _, var in checked)
        gpu_arrays = {type(grad) for grad, _ in checked if backend.is_array(grad) and type(grad) is not np.ndarray}
        cache.last_gpu_array_type = gpu_arrays.pop() if len(gpu_arrays) == 1 else None
        return checked, False

    def _apply(
        self,
        strategy: Strategy,
        pairs: list[tuple[Any, Variable]],
        columns: list[list[Any]],
        aggregate: bool,
        from_replicas: bool,
        deferred: dict[int, list[Group]] | None = None,
        given: list[list[Any]] | None = None,
    ) -> None:
        """Cross-replica half of ``apply_gradients``: sum, update each variable, count the step.

        ``columns[k]`` holds variable ``k``'s gradient from every replica (one entry when
        the same value stands for every replica). With ``deferred`` (a dict by GPU of the
        replicas, each GPU one replica's), the updates of the copies on those GPUs are not
        applied here but collected there, for each replica to apply on its own thread.
        ``given``: the gradient objects the replicas passed, when some were handed over as
        copies (the check that no object stands for every replica looks at those).
        """
        variables = [var for _, var in pairs]
        known = self._cache.plans_of(variables) if self._iterations is not None else None
        sparse = _NOTHING_SPARSE
        plain = True  # every gradient an array of its variable's kind, shape and dtype
        for k, var in enumerate(variables):
            current = (known[k].components if known is not None else components(var))[0]._array
            column = columns[k]
            shape, dtype, kind = current.shape, current.dtype, type(current)
            for part in column:  # the common case, checked inline: host arrays, or of the variable's GPU kind
                if (type(part) is not np.ndarray and type(part) is not kind) or part.shape != shape or part.dtype != dtype:
                    break
            else:
                continue
            plain = False
            if any(type(part) is IndexedSlices for part in column):
                columns[k], is_sparse = self._prepared_sparse(column, var, current, from_replicas)
                if is_sparse:
                    sparse = sparse | {k}
                continue
            check_gradient(column, var, current, from_replicas)
        plans = known if known is not None else self._build_plans(strategy, variables)
        workers = strategy.extended._num_workers
        summed = to_sum(columns, variables, from_replicas, workers, given) if aggregate else NOTHING_TO_SUM
        step = self._host_step.read(self._iterations)
        learning_rate = self._learning_rate if type(self._learning_rate) is float else self._current_learning_rate(step)
        coefficients_by_dtype: dict[np.dtype[Any], dict[str, Any]] = {}
        coefficients = []
        for plan in plans:
            dtype = plan.components[0]._array.dtype
            found = coefficients_by_dtype.get(dtype)
            if found is None:
                found = coefficients_by_dtype[dtype] = self._coefficients_for(learning_rate, step, dtype)
            if self._coefficients_per_variable:
                found = self._variable_coefficients(plan.variable, found)
            coefficients.append(found)
        # Several workers: one share, so that every worker issues its collectives in one order.
        shares = self._shares(plans) if workers == 1 else [list(range(len(plans)))]
        if len(shares) == 1:
            # A small update of host variables from host arrays, where the all-reduce is their sum
            # in replica order: the sums are added here, into the plans' buffers (the same values).
            add_here = (
                plain
                and plans is self._cache.last_plans
                and self._cache.small_host_update(self._cost_per_byte, _PARALLEL_MIN_BYTES)
                and strategy.extended._sums_host_arrays_in_order()
            )
            self._sum_and_update(
                strategy, shares[0], columns, summed, plans, coefficients, sparse, deferred, add_here=add_here
            )
        else:

            def run_share(part: int) -> None:
                with parallel.no_helpers():  # a share runs on one thread
                    self._sum_and_update(strategy, shares[part], columns, summed, plans, coefficients, sparse)

            parallel.run_parts(run_share, len(shares))
        assert self._iterations is not None
        self._host_step.advance(self._iterations, step + 1)

    def _shares(self, plans: list[VariablePlan]) -> list[list[int]]:
        """The variables (indices) each thread sums and updates: one share unless splitting pays.

        Inside a ``merge_fn`` the replicas parked at the barrier can take shares; the work
        is memory-bound, so it is split by bytes (the largest variables first, each to the
        lightest share) once it is large enough to repay a thread's wake-up. Host memory
        only: GPU work is not bound by the host's memory, and a parked replica's thread
        would launch on other GPUs' copies, on streams the step does not order.
        """
        everything = list(range(len(plans)))
        if plans is self._cache.last_plans and self._cache.small_host_update(self._cost_per_byte, _PARALLEL_MIN_BYTES):
            return [everything]  # (found once for these plans)
        parts = parallel.max_parts()
        if parts <= 1 or any(plan.components[0]._impl is not _HOST for plan in plans):
            return [everything]
        sizes = [plan.components[0]._array.nbytes for plan in plans]
        if sum(sizes) * self._cost_per_byte < _PARALLEL_MIN_BYTES:
            return [everything]
        parts = min(parts, len(plans))
        shares: list[list[int]] = [[] for _ in range(parts)]
        loads = [0] * parts
        for k in sorted(everything, key=lambda k: -sizes[k]):
            lightest = loads.index(min(loads))
            shares[lightest].append(k)
            loads[lightest] += sizes[k]
        return [sorted(share) for share in shares if share]

    def _sum_and_update(
        self,
        strategy: Strategy,
        indices: list[int],
        columns: list[list[Any]],
        to_sum: list[bool],
        plans: list[VariablePlan],
        coefficients: list[dict[str, Any]],
        sparse: frozenset[int],
        deferred: dict[int, list[Group]] | None = None,
        *,
        add_here: bool = False,
    ) -> None:
        """Sums the gradients of the variables ``indices`` (one collective call), then updates them.

        The gradients of the variables ``sparse`` (prepared ``IndexedSlices``) are summed with
        the sparse collective, in one call, and reach the rule as :class:`SparseRows`. The
        updates of copies on a GPU of ``deferred`` are collected there instead (see ``_apply``).
        ``add_here``: the gradients are host arrays whose all-reduce is their sum in replica
        order (``StrategyExtended._sums_host_arrays_in_order``): each is added on this thread,
        into its plan's buffer, with no collective call.
        """
        summing = [k for k in indices if to_sum[k]] if to_sum is not NOTHING_TO_SUM else []
        summed: dict[int, list[Any]] = {}
        if sparse:
            summed, converted = self._sum_sparse(strategy, [k for k in indices if k in sparse], columns, summing)
            for k, rows in converted.items():
                columns[k] = rows  # the replicas' own (unsummed) gradients, as SparseRows
            summing = [k for k in summing if k not in sparse]
        if summing:
            out = [plans[k].sum_buffers.scratch("sum", columns[k][0]) for k in summing]
            if add_here:
                for k, buffer in zip(summing, out):
                    summed[k] = [reduce_host_arrays(ReduceOp.SUM, columns[k], out=buffer)]
            else:
                reduced = strategy.extended._all_reduce(
                    ReduceOp.SUM, [columns[k] for k in summing], None, out, collective=self._api
                )
                summed.update(zip(summing, reduced))
        for k in indices:
            plan = plans[k]
            column = summed.get(k)
            equal = column is not None or len(columns[k]) == 1
            if column is None:
                column = columns[k]
            sharing = plan.sharing() if equal else SEPARATE
            if sharing is not SEPARATE:  # the common case: one buffer for every copy of the variable and slots
                if sharing is ONE_BUFFER:
                    plan.unify()  # one array object from now on: the next step's check is an identity check
                self._update_group(plan.component_list, column, plan.slot_lists, coefficients[k], plan.buffers(0))
            else:
                for group in plan.groups(column, equal, coefficients[k]):
                    device = group[0][0]._device
                    own = None if deferred is None or device.device_type != "GPU" else deferred.get(device.device_index)
                    if own is None:
                        self._update_group(*group)
                    else:
                        own.append(group)

    def _prepared_sparse(
        self, column: list[Any], var: Variable, current: Array, from_replicas: bool
    ) -> tuple[list[Any], bool]:
        """A column holding ``IndexedSlices``, checked and prepared for the sparse sum; whether it stays sparse.

        Every replica's slices are checked against the variable (errors unworded). A
        column mixing slices and dense gradients is made dense (the slices' rows summed),
        as a dense sum would make it.
        """
        shape, dtype = tuple(current.shape), current.dtype
        for replica, part in enumerate(column):
            if type(part) is IndexedSlices:
                check_sparse_gradient(part, var, current, where_from(replica, from_replicas, len(column)))
        if not all(type(part) is IndexedSlices for part in column):
            dense = [
                densify(IndexedSlices(part.values, part.indices, shape)) if type(part) is IndexedSlices else part
                for part in column
            ]
            check_gradient(dense, var, current, from_replicas)
            return dense, False
        prepared: dict[int, IndexedSlices] = {}  # one object given by several replicas stays one object
        for part in column:
            if id(part) not in prepared:
                prepared[id(part)] = prepare(part, shape, dtype, self._sparse_squares)
        result = [prepared[id(part)] for part in column]
        if len(prepared) > 1:
            check_reducible(result, self._api)
        return result, True

    def _sum_sparse(
        self, strategy: Strategy, indices: list[int], columns: list[list[Any]], summing: list[int]
    ) -> tuple[dict[int, list[Any]], dict[int, list[Any]]]:
        """The :class:`SparseRows` of the sparse gradients ``indices``: (summed across replicas, the others).

        Those in ``summing`` are summed with the sparse collective (one call); the others
        (one value for every replica, or already summed) are brought to their canonical
        form here, one object given by several replicas once.
        """
        squares = self._sparse_squares
        reducing = [k for k in indices if k in summing]
        summed: dict[int, list[Any]] = {}
        if reducing:
            reduced = strategy.extended._all_reduce_sparse(
                ReduceOp.SUM, [columns[k] for k in reducing], None, collective=self._api
            )
            for k, column in zip(reducing, reduced):
                summed[k] = [rows_of(part, squares, canonical=True) for part in column]
        local: dict[int, list[Any]] = {}
        for k in indices:
            if k not in summed:
                converted: dict[int, SparseRows] = {}
                for part in columns[k]:
                    if id(part) not in converted:
                        converted[id(part)] = rows_of(part, squares, canonical=False)
                local[k] = [converted[id(part)] for part in columns[k]]
        return summed, local

    def _build_plans(self, strategy: Strategy, variables: list[Variable]) -> list[VariablePlan]:
        self._build(strategy, variables)
        return self._cache.remember_plans(variables)

    def _coefficients_for(self, learning_rate: float, step: int, dtype: np.dtype[Any]) -> dict[str, Any]:
        """``_coefficients``, computed once per value when the rule does not depend on the step."""
        if self._coefficients_depend_on_step:
            return self._coefficients(learning_rate, step, dtype)
        coefficients = self._cache.coefficients_of(learning_rate, dtype)
        if coefficients is None:
            coefficients = self._cache.keep_coefficients(
                learning_rate, dtype, self._coefficients(learning_rate, step, dtype)
            )
        return coefficients

    def _update_group(
        self,
        members: list[ResourceVariable],
        grads: list[Any],
        slots: dict[str, list[ResourceVariable]],
        coefficients: dict[str, Any],
        buffers: UpdateBuffers,
    ) -> None:
        """Applies the rule once and publishes the new values to every component of the group."""
        first = members[0]
        impl = first._impl
        old_value = first._array
        old_slots = {name: slot[0]._array for name, slot in slots.items()} if slots else _NO_SLOTS
        grad = grads[0]
        if impl is _HOST and type(grad) is np.ndarray:
            if grad.dtype != old_value.dtype:
                grad = grad.astype(old_value.dtype)
            new_value, new_slots = self._compute(np, old_value, grad, old_slots, coefficients, buffers)
        elif type(grad) is SparseRows:
            if impl is _HOST:
                new_value, new_slots = self._compute_sparse(np, old_value, grad, old_slots, coefficients, buffers)
            else:
                with impl.on_device(first._device):
                    rows = grad.on(impl, first._device)
                    new_value, new_slots = self._compute_sparse(
                        impl.xp, old_value, rows, old_slots, coefficients, buffers
                    )
        else:
            with impl.on_array_device(old_value):  # every kernel of the update runs on the variable's GPU
                if type(grad) is not type(old_value) or grad.device != old_value.device:
                    grad = _on_device(grad, first)  # (a gradient already beside the variable needs no call)
                if grad.dtype != old_value.dtype:
                    grad = grad.astype(old_value.dtype)
                new_value, new_slots = self._compute(impl.xp, old_value, grad, old_slots, coefficients, buffers)
        publish(members, new_value)
        buffers.retire("var", old_value)
        if new_slots:
            for name, array in new_slots.items():
                publish(slots[name], array)
                buffers.retire(name, old_slots[name])

    # --- the update rule (subclasses) -----------------------------------------------------

    def _slot_initial_value(self, slot_name: str) -> float:
        """The value every element of a new slot starts at (Adagrad's accumulator: not 0)."""
        del slot_name
        return 0.0

    def _coefficients(self, learning_rate: float, step: int, dtype: np.dtype[Any]) -> dict[str, Any]:
        """Per-step scalars of the rule, in the variable's dtype (computed once per step)."""
        return {"lr": dtype.type(learning_rate)}

    def _compute(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: TensorLike,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        """The new value of the variable and of the slots that change.

        ``var``, ``grad`` and ``slots`` are read-only arrays on one device (``xp`` is numpy
        or cupy; the device is current). Write the results into ``out.out("var", var)`` and
        ``out.out(name, slots[name])`` and temporaries into ``out.scratch(...)`` (they
        return None for device arrays: pass ``out=None`` to the ufunc then), or return
        fresh arrays of the variable's dtype. Never write into the inputs.
        """
        raise NotImplementedError

    def _compute_sparse(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: SparseRows,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        """``_compute`` for a sparse gradient: the rows' sums (and, with ``_sparse_squares``, of their squares).

        By default the rule runs on the dense gradient, which gives Keras's numbers for a
        rule linear in the gradient whose every slot decays on every row (SGD with
        momentum). Rules that square the gradient, or that touch only the gradient's rows,
        override it.
        """
        return self._compute(xp, var, grad.dense(xp, var, out.scratch("dense_grad", var)), slots, coefficients, out)

    def _variable_coefficients(self, var: Variable, coefficients: dict[str, Any]) -> dict[str, Any]:
        """The coefficients of ``var``'s update (called with ``_coefficients_per_variable`` only)."""
        del var
        return coefficients

    # Whether some variables take other coefficients (AdamW's exclusions from weight decay).
    _coefficients_per_variable = False

    # Whether the rule needs, for a sparse gradient, the sums of the squares of each row's
    # slices (Keras squares the slices one by one: see ``sparse_gradients.py``).
    _sparse_squares = False

    # Whether ``_coefficients`` depends on the step (Adam's bias correction does; SGD's not).
    _coefficients_depend_on_step = True

    # Roughly how many bytes of memory one byte of parameter costs the rule (SGD reads the
    # variable and the gradient and writes the result; Adam touches several slots).
    _cost_per_byte = 3

    # --- helpers -------------------------------------------------------------------------

    def _bind(self, variables: Sequence[Variable]) -> Strategy:
        """The strategy the variables belong to; the optimizer keeps to one strategy.

        Its errors are :func:`~towerdist._src.failures.unworded` (most with ``separator=": "``):
        the public method (``build``, ``apply_gradients``) names itself. The caller then checks
        that this strategy's scope (or none) is current.
        """
        strategies = {id(_strategy_of(v)): _strategy_of(v) for v in variables}
        if len(strategies) > 1:
            names = ", ".join(f"{v.name} ({_strategy_of(v)!r})" for v in variables)
            raise unworded(
                ValueError(
                    f"the variables belong to different strategies: {names}. An "
                    f"optimizer updates the variables of one strategy; create them all in one strategy's scope."
                ),
                separator=": ",
            )
        strategy = next(iter(strategies.values())) if strategies else context.get_strategy()
        if variables and strategy is context.default_strategy():
            self._check_not_created_outside_scope(variables)
        if self._strategy is None and self._iterations is not None and _strategy_of(self._iterations) is not strategy:
            raise unworded(
                ValueError(
                    f"the optimizer's step counter was created under "
                    f"{_strategy_of(self._iterations)!r}, but the variables belong to {strategy!r}. Create the "
                    f"optimizer in the same strategy scope as the variables."
                ),
                separator=": ",
            )
        if self._strategy is None:
            self._strategy = strategy
        elif strategy is not self._strategy:
            raise unworded(
                ValueError(
                    f"this optimizer already optimizes variables of {self._strategy!r}; "
                    f"got variables of {strategy!r}. Use one optimizer per strategy."
                ),
                separator=": ",
            )
        return strategy

    def _check_not_created_outside_scope(self, variables: Sequence[Variable]) -> None:
        """Raises if plain variables (of no strategy) are used where a strategy is in force.

        A variable created outside ``strategy.scope()`` has one copy, which no replica owns;
        the error names the variables rather than the optimizer, which is not at fault
        (unworded: the public method puts its name in front).
        """
        default = context.default_strategy()
        if context.has_strategy():
            where = f"is {context.describe_location()}"
        elif self._strategy is not None and self._strategy is not default:
            where = f"already optimizes variables of {self._strategy!r}"
        elif self._iterations is not None and _strategy_of(self._iterations) is not default:
            where = f"was created in the scope of {_strategy_of(self._iterations)!r}"
        else:
            return  # no strategy anywhere: plain variables are right
        listed = ", ".join(f"{_base_name(v)!r} (shape {tuple(v.shape)})" for v in variables)
        plural = len(variables) > 1
        raise unworded(
            ValidationError(
                f"got {'variables' if plural else 'a variable'} created outside strategy.scope(): {listed} "
                f"{'are plain variables' if plural else 'is a plain variable'} of no strategy, but the optimizer "
                f"{where}. Create {'them' if plural else 'it'} inside `with strategy.scope():` so that every "
                f"replica has a copy to update."
            )
        )

    def _current_learning_rate(self, step: int) -> float:
        rate = self._learning_rate(step) if callable(self._learning_rate) else self._learning_rate
        value = float(np.asarray(backend.host().to_device(rate, None)) if backend.is_array(rate) else rate)
        if not np.isfinite(value) or value < 0:
            raise ValueError(
                f"{type(self).__name__}: the learning rate must be a finite number >= 0. The schedule "
                f"{self._learning_rate!r} returned {rate!r} at step {step}."
            )
        return value

    def _checkpoint_dependencies(self) -> list[tuple[str, Any]]:
        return [("iterations", self.iterations)]

    def __repr__(self) -> str:
        config = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "name")
        return f"{type(self).__name__}(name={self._name!r}, {config})"


def _check_learning_rate(value: object) -> LearningRate:
    if callable(value):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(float(value)) or value < 0:
        raise ValueError(
            f"Argument `learning_rate` should be a float >= 0, or a callable that takes the current step and returns "
            f"the learning rate. Received instead: learning_rate={value!r}"
        )
    return float(value)


def check_unit_interval(name: str, value: object, *, closed: bool) -> float:
    """``value`` as a float in [0, 1] (``closed``) or [0, 1); raises ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) <= 1:
        raise ValueError(f"`{name}` must be a float between [0, 1]. Received: {name}={value!r}")
    if not closed and value == 1:
        raise ValueError(f"`{name}` must be a float in [0, 1). Received: {name}={value!r}")
    return float(value)


def check_non_negative(name: str, value: object) -> float:
    """``value`` as a finite float >= 0; raises ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) < float("inf"):
        raise ValueError(f"`{name}` must be a float >= 0. Received: {name}={value!r}")
    return float(value)


class HandedOver(list):  # type: ignore[type-arg]
    """A replica's ``(gradient, variable)`` pairs copied for a hand-over; ``given`` are the pairs it passed."""

    __slots__ = ("given",)

    def __init__(self, given: list[tuple[Any, Variable]]) -> None:
        super().__init__()
        self.given = given


def _given_columns(per_replica: list[list[tuple[Any, Variable]]]) -> list[list[Any]] | None:
    """Each variable's gradient objects as the replicas passed them, if some were handed over (else None)."""
    for pairs in per_replica:
        if type(pairs) is HandedOver:
            break
    else:
        return None
    given = [pairs.given if type(pairs) is HandedOver else pairs for pairs in per_replica]
    return [list(column) for column in zip(*[[grad for grad, _ in pairs] for pairs in given])]


_STAGING_NAMES: dict[int, str] = {}


def _staging_name(replica: int) -> str:
    """The name of replica ``replica``'s staging buffers in a variable's ``UpdateBuffers``."""
    name = _STAGING_NAMES.get(replica)
    if name is None:
        name = _STAGING_NAMES[replica] = f"handed over by replica {replica}"
    return name


_HOST = backend.host()
_NO_SLOTS: dict[str, Any] = {}
_NOTHING_SPARSE: frozenset[int] = frozenset()


def _strategy_of(var: Variable) -> Strategy:
    return getattr(var, "_distribute_strategy", None) or context.default_strategy()


def _base_name(var: Variable) -> str:
    name = var.name
    return name[:-2] if name.endswith(":0") else name


def _on_device(grad: TensorLike, component: ResourceVariable) -> TensorLike:
    """``grad`` as an array on ``component``'s device."""
    if isinstance(grad, Variable):
        grad = grad.value()
    if not backend.is_array(grad):
        grad = np.asarray(grad)
    return backend.for_device(component._device).to_device(grad, component._device)


def _replica_devices(strategy: Strategy) -> tuple[DeviceSpec, ...]:
    """The devices of this worker's replicas, in replica order."""
    # (the seam's name for MirroredExtended._devices: every strategy with several replicas is one)
    return strategy.extended._replica_devices


def _replica_gpus(strategy: Strategy, replicas: int) -> dict[int, list[Group]] | None:
    """An empty list of updates for each replica's GPU, when every replica has a GPU of its own.

    Then each replica updates the copies of the variables on its GPU itself, on its own
    thread and stream, after the gradients are summed: one thread launching every GPU's
    kernels would serialise them. None otherwise (CPU replicas update in the ``merge_fn``).
    """
    if replicas < 2:
        return None
    devices = _replica_devices(strategy)
    if len(devices) != replicas or any(d.device_type != "GPU" for d in devices):
        return None
    indices = [d.device_index for d in devices]
    if len(set(indices)) != len(indices):
        return None
    return {index: [] for index in indices}


# Below this many bytes of memory traffic (parameter bytes x the rule's ``_cost_per_byte``),
# summing and updating on one thread is cheaper than waking a parked replica thread for a
# share. Measured with SGD on 2 replicas, 2-core VM: 1 MiB of parameters 0.81 ms serial vs
# 0.87 ms split; 4 MiB 1.73 vs 1.26 ms; 16 MiB 6.8 vs 4.6 ms; 64 MiB 72 vs 29 ms.
_PARALLEL_MIN_BYTES = 6 << 20
