"""Deferred restoration: a saved value waits for its object and takes it when the object is attached, as in TensorFlow.

Also the status checks while values wait (``assert_consumed`` fails, ``assert_existing_objects_matched``
passes), TensorFlow's write/read/save/restore cases of ``save_counter``, the most recent restore
winning, and the warning ``expect_partial()`` silences.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.checkpoint import deferred

from checkpoint_helpers import Stub, copies


class Lazy(td.Module):
    """A layer whose variables are created on first use (``build``), as Keras layers are."""

    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.n = n

    def build(self) -> None:
        self.w = td.Variable(np.zeros(self.n, np.float32), name="w")
        self.b = td.Variable(np.float32(0.0), name="b")


class Model(td.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = Lazy()


def saved_model(tmp_path: Any) -> str:
    """A checkpoint of a built ``Model``: dense.w = [1, 2, 3], dense.b = 4, saved with save()."""
    model = Model()
    model.dense.build()
    model.dense.w.assign([1.0, 2.0, 3.0])
    model.dense.b.assign(4.0)
    return td.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))


def test_a_variable_assigned_to_the_checkpoint_after_restore_takes_its_saved_value(tmp_path):
    path = td.train.Checkpoint(v=td.Variable(3.0)).save(str(tmp_path / "ckpt"))
    ckpt = td.train.Checkpoint()
    status = ckpt.restore(path)
    status.assert_existing_objects_matched()  # nothing that exists lacks its value
    with pytest.raises(AssertionError, match=r"matched to no object: \['v'\]\. \(A value waits for its object"):
        status.assert_consumed()
    with pytest.raises(AssertionError, match="^Nothing except the save counter was restored"):
        status.assert_nontrivial_match()

    ckpt.v = td.Variable(0.0)

    assert float(ckpt.v.numpy()) == 3.0
    status.assert_consumed().assert_existing_objects_matched().assert_nontrivial_match()


def test_variables_built_lazily_in_a_module_take_their_saved_values(tmp_path):
    path = saved_model(tmp_path)
    model = Model()
    status = td.train.Checkpoint(model=model).restore(path)
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match=r"matched to no object: \['model/dense/b', 'model/dense/w'\]"):
        status.assert_consumed()

    model.dense.build()

    assert model.dense.w.numpy().tolist() == [1.0, 2.0, 3.0] and float(model.dense.b.numpy()) == 4.0
    status.assert_consumed()


@pytest.mark.parametrize("how", ["sub_module", "list", "dict", "tuple"])
def test_modules_and_containers_attached_after_restore_take_their_values(tmp_path, how):
    source = td.Module()
    layers = [Lazy(), Lazy()]
    for k, layer in enumerate(layers):
        layer.build()
        layer.w.assign(np.full(3, k + 1.0, np.float32))
    keys = {"sub_module": "layer", "list": "layers", "dict": "layers", "tuple": "layers"}
    wrapped = {"sub_module": layers[0], "list": layers, "dict": {"a": layers[0], "b": layers[1]},
               "tuple": tuple(layers)}
    setattr(source, keys[how], wrapped[how])
    path = td.train.Checkpoint(model=source).save(str(tmp_path / "ckpt"))

    target = td.Module()
    status = td.train.Checkpoint(model=target).restore(path)
    fresh = [Lazy(), Lazy()]
    for layer in fresh:
        layer.build()  # built before they are attached: they receive their values when attached
    setattr(target, keys[how], {"sub_module": fresh[0], "list": fresh, "dict": {"a": fresh[0], "b": fresh[1]},
                                "tuple": tuple(fresh)}[how])

    assert fresh[0].w.numpy().tolist() == [1.0] * 3
    if how != "sub_module":
        assert fresh[1].w.numpy().tolist() == [2.0] * 3
    status.assert_consumed()


def test_a_list_grown_in_place_catches_up_at_the_next_attribute_assignment(tmp_path):
    source = td.Module()
    source.layers = [Lazy()]
    source.layers[0].build()
    source.layers[0].w.assign([7.0, 8.0, 9.0])
    path = td.train.Checkpoint(model=source).save(str(tmp_path / "ckpt"))
    target = td.Module()
    target.layers = []
    status = td.train.Checkpoint(model=target).restore(path)
    layer = Lazy()
    layer.build()

    target.layers.append(layer)  # a plain list says nothing when it grows

    assert layer.w.numpy().tolist() == [0.0] * 3
    with pytest.raises(AssertionError, match=r"objects that did not receive their saved value: \['model/layers/0/b', "
                                             r"'model/layers/0/w'\] \(they were added to a list or dict in place"):
        status.assert_existing_objects_matched()
    target.extra = td.Variable(1.0)  # any attribute assignment in the checkpoint's objects catches up
    assert layer.w.numpy().tolist() == [7.0, 8.0, 9.0]
    with pytest.raises(AssertionError, match=r"objects with no value in the checkpoint: \['model/extra'\]"):
        status.assert_existing_objects_matched()


def test_an_iterator_attached_after_restore_continues_its_stream(tmp_path):
    def dataset() -> td.data.Dataset:
        return td.data.Dataset.range(8).shuffle(4)

    iterator = iter(dataset())
    [next(iterator) for _ in range(3)]
    path = td.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
    rest = [int(x) for x in iterator]
    ckpt = td.train.Checkpoint()
    status = ckpt.restore(path)
    ckpt.iterator = fresh = iter(dataset())
    assert [int(x) for x in fresh] == rest
    status.assert_consumed()


@pytest.mark.parametrize("owner", ["checkpoint", "module"])
def test_a_value_that_does_not_fit_its_object_raises_at_attachment_which_is_undone(tmp_path, owner):
    path = saved_model(tmp_path)
    model = Model()
    ckpt = td.train.Checkpoint(model=model)
    ckpt.restore(path)
    wrong = td.Variable(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"^Cannot restore .*'model/dense/w' \(Variable:0\): the checkpoint holds "
                                         r"shape \(3,\), the variable has shape \(4,\)"):
        if owner == "module":
            model.dense.w = wrong
        else:
            ckpt.model = Model()
            ckpt.model.dense.w = wrong
    target = ckpt.model
    assert "w" not in vars(target.dense) and float(wrong.numpy().sum()) == 0.0
    target.dense.count = 3  # attributes that hold nothing a checkpoint saves are not checked
    target.dense.build()  # the right shape: it gets its value
    assert target.dense.w.numpy().tolist() == [1.0, 2.0, 3.0]


def test_an_object_attached_twice_under_the_same_key_receives_the_value_once(tmp_path):
    path = td.train.Checkpoint(v=td.Variable(3.0)).save(str(tmp_path / "ckpt"))
    ckpt = td.train.Checkpoint()
    ckpt.restore(path)
    ckpt.v = td.Variable(0.0)
    ckpt.v = replacement = td.Variable(5.0)
    assert float(replacement.numpy()) == 5.0


@pytest.mark.parametrize("order", ["first_then_second", "second_then_first"])
def test_the_most_recent_restore_wins_for_a_variable_attached_later(tmp_path, order):
    paths = {n: td.train.Checkpoint(v=td.Variable(float(n))).write(str(tmp_path / f"ckpt{n}")) for n in (1, 2)}
    first, second = (1, 2) if order == "first_then_second" else (2, 1)
    ckpt = td.train.Checkpoint()
    ckpt.read(paths[first])
    ckpt.read(paths[second])
    ckpt.v = td.Variable(0.0)
    assert float(ckpt.v.numpy()) == second


def test_an_optimizer_attached_after_restore_takes_its_iterations_and_then_its_slots(tmp_path):
    model = Model()
    model.dense.build()
    optimizer = td.optimizers.SGD(0.1, momentum=0.9)
    optimizer.apply_gradients([(np.ones(3, np.float32), model.dense.w), (np.float32(1.0), model.dense.b)])
    momentum = optimizer.get_slot(model.dense.w, "momentum").numpy().tolist()
    path = td.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

    target = Model()
    target.dense.build()
    ckpt = td.train.Checkpoint(model=target)
    status = ckpt.restore(path)
    ckpt.optimizer = fresh = td.optimizers.SGD(0.1, momentum=0.9)
    assert int(fresh.iterations.numpy()) == 1
    with pytest.raises(AssertionError, match="optimizer slot values waiting for their slot to be created"):
        status.assert_consumed()
    fresh.build(target.trainable_variables)
    assert fresh.get_slot(target.dense.w, "momentum").numpy().tolist() == momentum
    status.assert_consumed()


def test_deferred_restoration_in_a_training_loop_continues_as_if_uninterrupted(tmp_path):
    """TensorFlow's testDeferredRestorationUsageEager: restore before the model is built, train, save, repeat."""

    def step(model: Model, optimizer: Any, k: int) -> None:
        if not hasattr(model.dense, "w"):
            model.dense.build()  # built on first use, after the restore
        grads = [np.full(3, k + 1.0, np.float32), np.float32(-k)]
        optimizer.apply_gradients(zip(grads, [model.dense.w, model.dense.b]))

    uninterrupted, uninterrupted_optimizer = Model(), td.optimizers.Adam(0.01)
    for k in range(9):
        step(uninterrupted, uninterrupted_optimizer, k)

    directory = str(tmp_path)
    for continuation in range(3):
        model, optimizer = Model(), td.optimizers.Adam(0.01)
        root = td.train.Checkpoint(optimizer=optimizer, model=model)
        root.restore(td.train.latest_checkpoint(directory))  # None at first: restores nothing
        for k in range(3 * continuation, 3 * continuation + 3):
            step(model, optimizer, k)
        root.save(str(tmp_path / "ckpt"))
        assert int(optimizer.iterations.numpy()) == 3 * (continuation + 1)
    np.testing.assert_array_equal(model.dense.w.numpy(), uninterrupted.dense.w.numpy())
    np.testing.assert_array_equal(model.dense.b.numpy(), uninterrupted.dense.b.numpy())


def test_a_mirrored_variable_created_after_restore_gets_the_value_on_every_replica(tmp_path, mirrored_strategy):
    path = saved_model(tmp_path)
    model = Model()
    td.train.Checkpoint(model=model).restore(path)
    with mirrored_strategy.scope():
        model.dense.build()
    assert [c.tolist() for c in copies(model.dense.w)] == [[1.0, 2.0, 3.0]] * mirrored_strategy.num_replicas_in_sync


# --- save_counter and TensorFlow's write/read/save/restore cases ------------------------------------


def counter_and_v() -> tuple[td.train.Checkpoint, Any]:
    v = td.Variable(np.float32(2.0))
    return td.train.Checkpoint(v=v), v


def test_write_then_read_is_consumed(tmp_path):
    ckpt, _ = counter_and_v()
    path = ckpt.write(str(tmp_path / "ckpt"))
    assert set(read_entries(path)) == {"v"}  # no save_counter: none was created
    counter_and_v()[0].read(path).assert_consumed()


def test_write_then_restore_leaves_the_save_counter_it_creates_without_a_value(tmp_path):
    path = counter_and_v()[0].write(str(tmp_path / "ckpt"))
    status = counter_and_v()[0].restore(path)
    with pytest.raises(AssertionError, match=r"objects with no value in the checkpoint: \['save_counter'\]"):
        status.assert_consumed()
    with pytest.raises(AssertionError, match=r"objects with no value in the checkpoint: \['save_counter'\]"):
        status.assert_existing_objects_matched()
    status.assert_nontrivial_match()


def test_save_then_restore_is_consumed_and_numbering_goes_on(tmp_path):
    path = counter_and_v()[0].save(str(tmp_path / "ckpt"))
    ckpt, _ = counter_and_v()
    ckpt.restore(path).assert_consumed()
    assert int(ckpt.save_counter.numpy()) == 1
    assert ckpt.save(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt-2")


def test_save_then_read_leaves_the_saved_count_unused(tmp_path):
    path = counter_and_v()[0].save(str(tmp_path / "ckpt"))
    status = counter_and_v()[0].read(path)
    status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match=r"matched to no object: \['save_counter'\]"):
        status.assert_consumed()


def test_save_counter_cannot_be_assigned():
    ckpt, _ = counter_and_v()
    with pytest.raises(AttributeError, match="save_counter cannot be assigned"):
        ckpt.save_counter = td.Variable(np.int64(3))


def read_entries(path: str) -> dict[str, Any]:
    from checkpoint_helpers import read_index

    return read_index(path)["entries"]


# --- the warning expect_partial() silences -----------------------------------------------------------


@pytest.mark.parametrize("expect_partial", [False, True])
def test_deleting_a_restore_with_unused_values_warns_unless_expect_partial(tmp_path, caplog, expect_partial):
    path = td.train.Checkpoint(v=td.Variable(1.0), w=td.Variable(2.0)).write(str(tmp_path / "ckpt"))
    ckpt = td.train.Checkpoint(v=td.Variable(0.0))
    status = ckpt.read(path)
    if expect_partial:
        assert status.expect_partial() is status
    gc.collect()  # earlier tests' restores warn now, not below
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        caplog.clear()
        del ckpt, status
        gc.collect()
    messages = [record.getMessage() for record in caplog.records]
    if expect_partial:
        assert messages == []
    else:
        assert messages[0].startswith("Detecting that an object or model or td.train.Checkpoint is being deleted with "
                                      "unrestored values.")
        assert "To silence these warnings, use `status.expect_partial()`" in messages[0]
        assert messages[1:] == [f"Value in checkpoint {path} could not be found in the restored object: w"]


def test_a_restore_whose_values_all_found_their_objects_does_not_warn(tmp_path, caplog):
    path = td.train.Checkpoint(v=td.Variable(1.0)).write(str(tmp_path / "ckpt"))
    ckpt = td.train.Checkpoint()
    status = ckpt.read(path)
    ckpt.v = td.Variable(0.0)  # the waiting value found its object
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        caplog.clear()
        del ckpt, status
        gc.collect()
    assert caplog.records == []


def test_a_stub_saveable_attached_later_is_prepared_and_committed(tmp_path):
    path = td.train.Checkpoint(it=Stub("a", b"A")).write(str(tmp_path / "ckpt"))
    ckpt = td.train.Checkpoint()
    ckpt.read(path)
    ckpt.it = stub = Stub("b")
    assert stub.state == b"A" and [entry[0] for entry in stub.log] == ["prepare", "commit"]


def test_values_wait_with_the_objects_when_the_checkpoint_object_is_dropped_at_once(tmp_path, caplog):
    path = saved_model(tmp_path)
    model = Model()
    td.train.Checkpoint(model=model).restore(path)  # TensorFlow's idiom: checkpoint and status dropped at once
    gc.collect()
    model.dense.build()
    assert model.dense.w.numpy().tolist() == [1.0, 2.0, 3.0]


def test_a_restore_stops_waiting_and_warns_once_its_checkpoint_and_objects_are_gone(tmp_path, caplog):
    path = saved_model(tmp_path)
    gc.collect()
    before = deferred.waiting()
    model = Model()
    td.train.Checkpoint(model=model).restore(path)
    assert deferred.waiting() == before + 1
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        caplog.clear()
        del model
        gc.collect()
    assert deferred.waiting() == before
    assert [r.getMessage().rsplit(": ", 1)[1] for r in caplog.records[1:]] == ["model/dense/b", "model/dense/w"]
