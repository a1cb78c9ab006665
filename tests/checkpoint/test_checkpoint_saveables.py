"""Objects saved as one opaque state (input iterators, the ``Saveable`` protocol) in ``td.train`` checkpoints.

A stub that records what it is asked pins the protocol (one ``uint8`` entry of kind
``object``, restorers prepared before any variable is assigned and committed after the
last, all or nothing); a real ``td.data`` iterator pins the use it exists for: a restored
iterator of a rebuilt pipeline continues the stream exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import towerdist as td

from checkpoint_helpers import Stub, data_files, index_file, read_index

FailedPreconditionError = td.errors.FailedPreconditionError


class Holder(td.Module):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.it = value


HOLDERS = {  # name: (wrap the object, the key it is saved under)
    "keyword": (lambda it: {"it": it}, "it"),
    "list": (lambda it: {"its": [it]}, "its/0"),
    "dict": (lambda it: {"its": {"train": it}}, "its/train"),
    "module_attribute": (lambda it: {"model": Holder(it)}, "model/it"),
    "inner_checkpoint": (lambda it: {"inner": td.train.Checkpoint(it=it)}, "inner/it"),
}


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_saveable_is_saved_as_one_uint8_entry_under_its_key_and_restored(tmp_path, holder):
    wrap, key = HOLDERS[holder]
    state = b"\x00position 3\xff"
    path = td.train.Checkpoint(**wrap(Stub("a", state))).write(str(tmp_path / "ckpt"))
    entry = read_index(path)["entries"][key]
    assert entry | {"member": "-"} == {"member": "-", "shape": [len(state)], "dtype": "uint8", "kind": "object",
                                       "class": "Stub"}

    fresh = Stub("b")
    status = td.train.Checkpoint(**wrap(fresh)).read(path)
    status.assert_consumed().assert_existing_objects_matched().assert_nontrivial_match()
    assert fresh.state == state
    assert fresh.log == [("prepare", "b", None), ("commit", "b", None)]


def test_a_manager_saves_and_restores_a_saveable(tmp_path):
    manager = td.train.CheckpointManager(td.train.Checkpoint(it=Stub("a", b"one")), str(tmp_path), max_to_keep=1)
    path = manager.save()
    fresh = Stub("b")
    td.train.Checkpoint(it=fresh).restore(td.train.latest_checkpoint(str(tmp_path))).assert_consumed()
    assert path == str(tmp_path / "ckpt-1") and fresh.state == b"one"


def test_an_empty_state_round_trips(tmp_path):
    path = td.train.Checkpoint(it=Stub("a", b"")).write(str(tmp_path / "ckpt"))
    fresh = Stub("b", b"before")
    td.train.Checkpoint(it=fresh).read(path).assert_consumed()
    assert fresh.state == b""


def test_restorers_are_prepared_before_any_variable_is_assigned_and_committed_after_the_last(tmp_path):
    path = td.train.Checkpoint(v=td.Variable(5.0), b=Stub("b", b"B"), a=Stub("a", b"A")).write(str(tmp_path / "c"))
    w = td.Variable(0.0)
    log: list[Any] = []

    def watch() -> float:
        return float(w.numpy())

    a, b = Stub("a", log=log, watch=watch), Stub("b", log=log, watch=watch)
    td.train.Checkpoint(v=w, a=a, b=b).read(path).assert_consumed()

    assert log == [("prepare", "a", 0.0), ("prepare", "b", 0.0), ("commit", "a", 5.0), ("commit", "b", 5.0)]
    assert (a.state, b.state) == (b"A", b"B")


def test_a_restorer_that_refuses_changes_nothing_and_the_strategy_stays_usable(tmp_path, mirrored_strategy):
    strategy = mirrored_strategy
    with strategy.scope():
        v = td.Variable(np.arange(3, dtype=np.float32))
    path = td.train.Checkpoint(v=v, a=Stub("a", b"A"), b=Stub("b", b"B")).write(str(tmp_path / "ckpt"))
    with strategy.scope():
        w = td.Variable(np.zeros(3, np.float32))
    log: list[Any] = []
    a, b = Stub("a", b"old a", log=log), Stub("b", b"old b", log=log, refuse=True)
    ckpt = td.train.Checkpoint(v=w, a=a, b=b)

    with pytest.raises(FailedPreconditionError, match=r"^b refuses the state b'B'") as error:
        ckpt.restore(path)

    assert any("restoring the Stub saved under 'b'" in note for note in error.value.__notes__)
    assert [c.numpy().tolist() for c in w.values] == [[0.0, 0.0, 0.0]] * len(w.values)
    assert (a.state, b.state) == (b"old a", b"old b")
    assert [entry[0] for entry in log] == ["prepare", "prepare"]  # prepared, never committed
    total = strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", 1.0))
    assert strategy.experimental_local_results(total)[0] == strategy.num_replicas_in_sync
    b.refuse = False
    ckpt.read(path).assert_consumed()  # the same restore, once the object accepts its state
    assert [c.numpy().tolist() for c in w.values] == [[0.0, 1.0, 2.0]] * len(w.values)
    assert (a.state, b.state) == (b"A", b"B")


def test_a_variables_value_does_not_restore_into_a_saveable_nor_the_reverse(tmp_path):
    path = td.train.Checkpoint(x=td.Variable(1.0), y=Stub("y", b"Y")).write(str(tmp_path / "ckpt"))
    v, stub = td.Variable(0.0), Stub("x")
    with pytest.raises(ValueError, match=r"^Cannot restore .*'x' holds the value of a variable \(Variable:0\), but "
                                         r"this checkpoint's object there is a Stub"):
        td.train.Checkpoint(x=stub).restore(path)
    assert stub.log == [] and float(v.numpy()) == 0.0
    with pytest.raises(ValueError, match=r"^Cannot restore .*'y' \(Variable:0\): the checkpoint holds the state of a "
                                         r"Stub there, not a variable's value"):
        td.train.Checkpoint(y=v).restore(path)
    assert float(v.numpy()) == 0.0


def test_the_status_counts_saveables_like_variables(tmp_path):
    path = td.train.Checkpoint(it=Stub("a", b"A"), extra=Stub("e", b"E")).write(str(tmp_path / "ckpt"))
    fresh, unsaved = Stub("b"), Stub("c")
    status = td.train.Checkpoint(it=fresh, other=unsaved).read(path)
    status.assert_nontrivial_match()  # the iterator alone is a match
    with pytest.raises(AssertionError, match=r"matched to no object: \['extra'\]; objects with no value in the "
                                             r"checkpoint: \['other'\]"):
        status.assert_consumed()
    with pytest.raises(AssertionError, match=r"did not restore every existing object: objects with no value in the "
                                             r"checkpoint: \['other'\]"):
        status.assert_existing_objects_matched()
    assert fresh.state == b"A" and unsaved.log == []


def test_a_state_that_is_not_bytes_is_refused_at_save_before_anything_is_written(tmp_path):
    class Wrong(Stub):
        def _checkpoint_state(self) -> Any:
            return "text"

    with pytest.raises(TypeError, match=r"^Checkpoint cannot save the Wrong at 'it': its _checkpoint_state\(\) "
                                        r"returned str, not bytes"):
        td.train.Checkpoint(it=Wrong("w")).write(str(tmp_path / "ckpt"))
    assert list(tmp_path.iterdir()) == []


def test_a_saveable_that_fails_to_save_fails_the_save_after_the_others_were_asked(tmp_path):
    class Failing(Stub):
        def _checkpoint_state(self) -> bytes:
            super()._checkpoint_state()
            raise td.errors.FailedPreconditionError("no position to save")

    log: list[Any] = []
    ckpt = td.train.Checkpoint(a=Failing("a", log=log), b=Stub("b", b"B", log=log))
    with pytest.raises(FailedPreconditionError, match="no position to save"):
        ckpt.save(str(tmp_path / "ckpt"))
    assert log == [("state", "a"), ("state", "b")]  # every object is asked (collective ones need it)
    assert list(tmp_path.iterdir()) == [] and int(ckpt.save_counter.numpy()) == 0


@pytest.mark.parametrize("value", [Stub, [Stub]], ids=["class", "list_of_a_class"])
def test_a_class_that_follows_the_protocol_is_not_an_object_to_save(value):
    with pytest.raises(ValueError, match="Checkpoint was expecting it to be a trackable object"):
        td.train.Checkpoint(it=value if not isinstance(value, list) else value[0])


# --- a real input iterator ------------------------------------------------------------------------


def shuffled() -> td.data.Dataset:
    return td.data.Dataset.range(10).shuffle(5)


def ints(elements: Any) -> list[int]:
    return [int(x) for x in elements]


@pytest.mark.parametrize("saver", ["save", "manager"])
def test_a_restored_iterator_of_a_rebuilt_pipeline_continues_the_stream(tmp_path, saver):
    iterator = iter(shuffled())
    head = ints(next(iterator) for _ in range(3))
    step = td.Variable(np.int64(3))
    ckpt = td.train.Checkpoint(iterator=iterator, step=step)
    if saver == "save":
        path = ckpt.save(str(tmp_path / "ckpt"))
    else:
        path = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1).save()
    rest = ints(iterator)
    assert sorted(head + rest) == list(range(10))

    fresh = iter(shuffled())  # a new pipeline: its own unseeded shuffle, restored to the saved one's order
    restored_step = td.Variable(np.int64(0))
    td.train.Checkpoint(iterator=fresh, step=restored_step).restore(path).assert_consumed()
    assert ints(fresh) == rest
    assert int(restored_step.numpy()) == 3


def test_restoring_an_iterator_of_another_pipeline_raises_and_changes_nothing(tmp_path):
    iterator = iter(shuffled())
    next(iterator)
    path = td.train.Checkpoint(iterator=iterator, step=td.Variable(np.int64(1))).write(str(tmp_path / "ckpt"))

    other = iter(td.data.Dataset.range(10).batch(2))
    assert next(other).tolist() == [0, 1]
    step = td.Variable(np.int64(0))
    with pytest.raises(td.errors.NotFoundError, match=r"^Checkpoint\.restore\(\) cannot restore the iterator: its "
                                                    r"pipeline differs from the saved one"):
        td.train.Checkpoint(iterator=other, step=step).restore(path)
    assert int(step.numpy()) == 0
    assert [batch.tolist() for batch in other] == [[2, 3], [4, 5], [6, 7], [8, 9]]  # where it stood


def test_the_files_of_a_checkpoint_with_an_iterator_are_tensorflows_two(tmp_path):
    path = td.train.Checkpoint(iterator=iter(shuffled())).write(str(tmp_path / "ckpt"))
    assert index_file(path).is_file() and [p.name for p in data_files(path)] == ["ckpt.data-00000-of-00001"]
