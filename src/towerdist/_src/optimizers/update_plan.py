"""What the update of one variable needs every step, found once (the optimizer's update plan).

A :class:`VariablePlan` lists the single-device variables (components) a variable and its
slots are made of, answers which of them share one host buffer (so that the update rule
runs once for them), and keeps the buffers reused by their updates. Its questions change
nothing: making the components of a group hold one array object is a separate command
(:meth:`VariablePlan.unify`), which goes through the variables' storage API
(``ResourceVariable._share``), as :func:`publish` does for new values.

:class:`PlanCache` holds the optimizer's identity caches (plans by variable, the variables
and plans of the previous step, the rule's coefficients by value): they make a steady
training loop cheap, and say nothing about what an update does.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from towerdist._src.type_aliases import TensorLike
from towerdist._src.variables.aggregating_variable import AggregatingVariable
from towerdist._src.variables.distributed_variable import DistributedVariable
from towerdist._src.variables.update_buffers import UpdateBuffers
from towerdist._src.variables.variable import ResourceVariable, Variable, adopt_shared

__all__ = ["ONE_ARRAY", "ONE_BUFFER", "SEPARATE", "Group", "PlanCache", "VariablePlan", "components", "publish"]

# One group of a variable's components that share their buffers: the components, their
# gradients, their slots' components by slot name, the rule's coefficients, the buffers.
Group = tuple[list[ResourceVariable], list[Any], dict[str, list[ResourceVariable]], dict[str, Any], UpdateBuffers]


# How the components of a variable (and of each slot) hold their values: the answers of
# :meth:`VariablePlan.sharing`, compared by identity.
ONE_ARRAY = "one array"  # every component holds the very same array object
ONE_BUFFER = "one buffer"  # views of one buffer, not all the same object (see ``unify``)
SEPARATE = "separate"  # some component holds a value of its own


class VariablePlan:
    """What the update of one variable needs every step, found once."""

    __slots__ = ("_all", "_buffers", "component_list", "components", "slot_lists", "slots", "sum_buffers", "variable")

    def __init__(self, variable: Variable, slots: dict[str, Variable]) -> None:
        self.variable = variable  # keeps the id the plan is filed under in use
        self.components = components(variable)
        self.slots = {name: components(slot) for name, slot in slots.items()}
        self.component_list = list(self.components)
        self.slot_lists = {name: list(members) for name, members in self.slots.items()}
        self._all = [self.components, *self.slots.values()]
        self._buffers: dict[int, UpdateBuffers] = {}
        self.sum_buffers = UpdateBuffers()  # where the variable's summed gradient goes

    def sharing(self) -> str:
        """How the components (of the variable, and of each slot) hold their values: ``ONE_ARRAY``,
        ``ONE_BUFFER`` or ``SEPARATE``. Changes nothing.

        Copies made by variable creation or by a write hold views of one buffer; once
        :meth:`unify` (or an update) has made them hold the very same array, this is an
        identity check.
        """
        answer = ONE_ARRAY
        for members in self._all:
            first = members[0]._array
            for component in members:
                array = component._array
                if array is not first:
                    if data_key(array) != data_key(first):
                        return SEPARATE
                    answer = ONE_BUFFER
        return answer

    def unify(self) -> None:
        """Makes the components that view their first component's buffer hold its array object.

        The values do not change (the same memory, viewed the same way); later calls of
        :meth:`sharing` are identity checks. A component written meanwhile keeps its value.
        """
        for members in self._all:
            first = members[0]._array
            for component in members:
                array = component._array
                if array is not first and data_key(array) == data_key(first):
                    component._share(first, array)

    def buffers(self, group: int) -> UpdateBuffers:
        """The reusable buffers of the group led by component ``group``."""
        buffers = self._buffers.get(group)
        if buffers is None:
            buffers = self._buffers[group] = UpdateBuffers()
        return buffers

    def groups(self, grads: list[Any], equal: bool, coefficients: dict[str, Any]) -> list[Group]:
        """The components grouped by the buffers they share, each with its work.

        Components on logical CPUs hold one buffer (and so do their slots): the rule runs
        once for the group. A component written on its own (a replica-local write) forms
        its own group, as every device component does. ``equal`` says the gradients are
        equal on every component (an all-reduce's result, or one value for all).
        """
        members, slots = self.components, self.slots
        groups: dict[tuple[Any, ...], int] = {}
        work: list[Group] = []
        for j, component in enumerate(members):
            grad = grads[j] if len(grads) == len(members) else grads[0]
            key: tuple[Any, ...] = (data_key(component._array), *(data_key(s[j]._array) for s in slots.values()))
            if not equal:
                key += (data_key(grad),)
            index = groups.get(key)
            if index is not None:
                work[index][0].append(component)
                for name, group_members in work[index][2].items():
                    group_members.append(slots[name][j])
                continue
            groups[key] = len(work)
            work.append(
                ([component], [grad], {name: [s[j]] for name, s in slots.items()}, coefficients, self.buffers(j))
            )
        return work


class PlanCache:
    """The optimizer's identity caches: found once, looked up every step.

    ``plans`` by ``id(variable)`` (the plan keeps its variable alive, so the id stays its);
    the variables of the previous call, the
    class of its gradients when they were GPU arrays (cupy's), and its plans; the rule's coefficients by (learning rate, dtype) when they do not depend
    on the step.
    """

    __slots__ = (
        "_sized",
        "_small",
        "coefficients",
        "last_gpu_array_type",
        "last_plans",
        "last_variables",
        "plans",
    )

    def __init__(self) -> None:
        self.plans: dict[int, VariablePlan] = {}
        self.last_variables: tuple[Variable, ...] = ()
        self.last_gpu_array_type: type[Any] | None = None  # the previous call's GPU gradients' array class
        self.last_plans: list[VariablePlan] | None = None
        self.coefficients: dict[tuple[float, np.dtype[Any]], dict[str, Any]] = {}
        self._sized: list[VariablePlan] | None = None  # the plans ``_small`` was found for
        self._small = False

    def small_host_update(self, cost_per_byte: int, limit: int) -> bool:
        """Whether the last call's variables all live in host memory and their update is small.

        Small: parameter bytes x ``cost_per_byte`` under ``limit`` (one thread does it best).
        Found once per list of plans.
        """
        plans = self.last_plans
        if plans is not self._sized:
            self._sized = plans
            self._small = (
                plans is not None
                and all(type(c._array) is np.ndarray for plan in plans for c in plan.components)
                and sum(plan.components[0]._array.nbytes for plan in plans) * cost_per_byte < limit
            )
        return self._small

    def plans_of(self, variables: list[Variable]) -> list[VariablePlan] | None:
        """The plans of ``variables`` if every one exists (None: build them first)."""
        last = self.last_plans
        if last is not None and len(variables) == len(last):
            for var, plan in zip(variables, last):
                if plan.variable is not var:
                    break
            else:
                return last
        plans = self.plans
        found = [plans.get(id(var)) for var in variables]
        if any(plan is None for plan in found):
            return None
        self.last_plans = found  # type: ignore[assignment]
        return self.last_plans

    def remember_plans(self, variables: list[Variable]) -> list[VariablePlan]:
        """The plans of ``variables`` (every one built), kept as the last call's."""
        self.last_plans = [self.plans[id(var)] for var in variables]
        return self.last_plans

    def coefficients_of(self, learning_rate: float, dtype: np.dtype[Any]) -> dict[str, Any] | None:
        """The coefficients kept for ``(learning_rate, dtype)``, or None."""
        return self.coefficients.get((learning_rate, dtype))

    def keep_coefficients(
        self, learning_rate: float, dtype: np.dtype[Any], coefficients: dict[str, Any]
    ) -> dict[str, Any]:
        """Keeps ``coefficients`` for ``(learning_rate, dtype)`` and returns them."""
        if len(self.coefficients) > 64:  # a schedule: keep the cache small
            self.coefficients.clear()
        self.coefficients[(learning_rate, dtype)] = coefficients
        return coefficients


# var: a td.Variable. Any, because a variable that is neither distributed nor aggregating is a
# ResourceVariable, a fact of how variables are created that a checker cannot follow.
def components(var: Any) -> tuple[ResourceVariable, ...]:
    """The single-device variables ``var`` is made of (itself for a plain variable)."""
    if isinstance(var, DistributedVariable):
        return var._components
    if isinstance(var, AggregatingVariable):
        return (var.get(),)
    return (var,)


def publish(members: list[ResourceVariable], array: TensorLike) -> None:
    """Makes ``array`` (freshly computed, right shape and dtype) the value of every component.

    Host components of one group adopt the one read-only array (reads hand out views of
    it); a device component adopts its own array, moved to its device.
    """
    if type(array) is np.ndarray:
        array.setflags(write=False)
        adopt_shared(members, array)
        return
    for component in members:
        component._adopt_moved(array)


def data_key(array: TensorLike) -> Hashable:
    """Equal keys mean the same memory viewed the same way (host arrays); else the object."""
    if type(array) is np.ndarray:
        return (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)
    return id(array)
