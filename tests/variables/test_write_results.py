"""What a write of a distributed variable returns, as observed in TensorFlow 2.21.

Goldens (TF 2.21, CPU): with one component (``MultiWorkerMirroredStrategy`` on a worker without
GPUs, ``MirroredStrategy(["/cpu:0"])``) a grouped ``extended.update`` and a cross-replica write
(``read_value=True``, ``use_locking=True``, any aggregation) return the variable, read when used
(``_UnreadVariable``), not an array; with two components they return a ``Mirrored`` of the new
values. ``v[key].assign(x)`` in cross-replica context returns one ``_UnreadVariable`` on any
number of components.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
from towerdist._src.variables.variable import UnreadVariable

from conftest import multi_worker

A = td.VariableAggregation


def _one_component_strategies():
    return [
        pytest.param(lambda: multi_worker(1), id="multi_worker_1local"),
        pytest.param(lambda: td.distribute.MirroredStrategy(["/cpu:0"]), id="mirrored_1cpu"),
    ]


def _variable(strategy, aggregation=A.NONE):
    with strategy.scope():
        return td.Variable([1.0, 2.0], aggregation=aggregation)


def _is_unread(result, expected):
    assert type(result) is UnreadVariable, type(result)
    assert result.name == "UnreadVariable"
    np.testing.assert_array_equal(result.numpy(), expected)


@pytest.mark.parametrize("make", _one_component_strategies())
def test_a_grouped_update_of_one_component_returns_the_variable(make):
    strategy = make()
    v = _variable(strategy)
    g = td.constant([0.5, 0.5])
    result = strategy.extended.update(v, lambda var, g: var.assign_sub(g), args=(g,), group=True)
    _is_unread(result, [0.5, 1.5])  # TF: <tf.Variable 'UnreadVariable' ... numpy=array([0.5, 1.5])>
    assert result is not v
    ungrouped = strategy.extended.update(v, lambda var, g: var.assign_sub(g), args=(g,), group=False)
    assert isinstance(ungrouped, tuple) and len(ungrouped) == 1  # TF: a 1-tuple of UnreadVariable
    _is_unread(ungrouped[0], [0.0, 1.0])
    # a function returning a tensor gives the tensor itself; read_value=False gives None
    np.testing.assert_array_equal(strategy.extended.update(v, lambda var, g: g * 2, args=(g,)), [1.0, 1.0])
    assert strategy.extended.update(v, lambda var, g: var.assign_sub(g, read_value=False), args=(g,)) is None


@pytest.mark.parametrize("make", _one_component_strategies())
@pytest.mark.parametrize(
    ("aggregation", "write", "expected"),
    [
        (A.NONE, lambda v: v.assign([3.0, 4.0], read_value=True), [3.0, 4.0]),
        (A.NONE, lambda v: v.assign([3.0, 4.0], use_locking=True), [3.0, 4.0]),
        (A.NONE, lambda v: v.assign_add([1.0, 1.0], use_locking=True), [2.0, 3.0]),
        (A.MEAN, lambda v: v.assign([3.0, 4.0]), [3.0, 4.0]),
        (A.SUM, lambda v: v.assign_sub([1.0, 1.0]), [0.0, 1.0]),
    ],
)
def test_a_cross_replica_write_of_one_component_returns_the_variable(make, aggregation, write, expected):
    strategy = make()
    v = _variable(strategy, aggregation)
    result = write(v)
    _is_unread(result, expected)
    v.assign([7.0, 8.0])
    np.testing.assert_array_equal(result.numpy(), [7.0, 8.0])  # read when used, not a snapshot
    assert v.assign([1.0, 1.0], read_value=False) is None


@pytest.mark.parametrize("make", _one_component_strategies())
def test_a_replica_write_of_one_component_returns_the_variable(make):
    strategy = make()
    summed = _variable(strategy, A.SUM)
    _is_unread(strategy.run(lambda: summed.assign_add(td.constant([1.0, 1.0]))), [2.0, 3.0])
    mean = _variable(strategy, A.MEAN)
    _is_unread(strategy.run(lambda: mean.assign(td.constant([5.0, 5.0]))), [5.0, 5.0])


@pytest.mark.replicas(2)
def test_writes_of_two_components_return_the_new_values(mirrored_strategy):
    # TF 2.21, MirroredStrategy over 2 CPUs: Mirrored:{0: <tf.Tensor [3., 4.]>, 1: <tf.Tensor [3., 4.]>}
    v = _variable(mirrored_strategy)
    for result in (
        v.assign([3.0, 4.0], read_value=True),
        v.assign([3.0, 4.0], use_locking=True),
        mirrored_strategy.extended.update(v, lambda var, x: var.assign(x), args=(td.constant([3.0, 4.0]),)),
    ):
        assert isinstance(result, td.distribute.Mirrored)
        assert [np.asarray(r).tolist() for r in mirrored_strategy.experimental_local_results(result)] == [[3.0, 4.0]] * 2


@pytest.mark.replicas(2)
def test_assigning_an_element_in_cross_replica_context_returns_one_variable(mirrored_strategy):
    # TF 2.21, MirroredStrategy over 2 CPUs, w = [3., 4.]: w[0].assign(1.0) returns one
    # <tf.Variable 'UnreadVariable' numpy=array([1., 4.])> (TF writes the first copy only;
    # towerdist writes every copy, so the copies stay equal).
    w = _variable(mirrored_strategy)
    w.assign([3.0, 4.0])
    result = w[0].assign(1.0)
    _is_unread(result, [1.0, 4.0])
    assert [c.numpy().tolist() for c in w.values] == [[1.0, 4.0], [1.0, 4.0]]
    assert result.device == w.device and result.shape == (2,) and result.dtype == np.float32
    chained = result.assign_add([1.0, 1.0])  # TF: another UnreadVariable, [2., 5.]
    _is_unread(chained, [2.0, 5.0])
    assert [c.numpy().tolist() for c in w.values] == [[2.0, 5.0], [2.0, 5.0]]
    _is_unread(w[0:1].assign([5.0]), [5.0, 5.0])


@pytest.mark.parametrize("make", _one_component_strategies())
def test_assigning_an_element_of_one_component_returns_the_variable(make):
    w = _variable(make())
    _is_unread(w[0].assign(3.0), [3.0, 2.0])  # TF: UnreadVariable [3., 2.]
