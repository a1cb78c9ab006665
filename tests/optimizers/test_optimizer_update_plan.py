"""The optimizer's update plan and the variable storage API it writes through.

``VariablePlan.sharing`` is a question: it changes no component. ``unify`` (a command)
makes the components that view one buffer hold one array object, through
``ResourceVariable._share``, which leaves a component alone if a write swapped its value
meanwhile. ``_adopt`` and ``adopt_shared`` take an array as the value without copying it.
"""

from __future__ import annotations

import numpy as np

import towerdist as td
from towerdist._src.optimizers.update_plan import ONE_ARRAY, ONE_BUFFER, SEPARATE, VariablePlan, components
from towerdist._src.variables.variable import adopt_shared


def _views_of_one_buffer(var) -> np.ndarray:
    members = components(var)
    base = np.array(members[0].numpy())
    base.flags.writeable = False
    for member in members:
        member._adopt(base.view())  # the same memory, a different object each
    return base


def test_sharing_is_a_question_and_unify_is_the_command(mirrored_strategy):
    with mirrored_strategy.scope():
        var = td.Variable(np.arange(4.0, dtype=np.float32))
    _views_of_one_buffer(var)
    plan = VariablePlan(var, {})
    before = [member._array for member in components(var)]
    assert plan.sharing() is ONE_BUFFER
    assert [member._array for member in components(var)] == before  # nothing changed
    assert all(a is b for a, b in zip((m._array for m in components(var)), before))
    plan.unify()
    first = components(var)[0]._array
    assert all(member._array is first for member in components(var))
    assert plan.sharing() is ONE_ARRAY


def test_a_component_written_on_its_own_is_separate(mirrored_strategy):
    with mirrored_strategy.scope():
        var = td.Variable(np.zeros(3, np.float32))
    components(var)[1].assign(np.ones(3, np.float32))
    assert VariablePlan(var, {}).sharing() is SEPARATE


def test_share_leaves_a_value_written_meanwhile():
    var = td.Variable(np.zeros(2, np.float32))
    stale = var._array
    var.assign([1.0, 2.0])
    assert var._share(np.zeros(2, np.float32), stale) is False
    np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])


def test_adopt_shared_takes_one_array_without_copying(mirrored_strategy):
    with mirrored_strategy.scope():
        var = td.Variable(np.zeros(3, np.float32))
    array = np.array([1.0, 2.0, 3.0], np.float32)
    array.flags.writeable = False
    adopt_shared(list(components(var)), array)
    assert all(member._array is array for member in components(var))
    for value in var.values:
        np.testing.assert_array_equal(value.numpy(), array)
