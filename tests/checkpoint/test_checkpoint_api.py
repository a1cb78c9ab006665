"""``td.train.Checkpoint``'s API details, and the dtypes a checkpoint holds (strings, dates) and refuses."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.checkpoint import restoring as restoring_module

from checkpoint_helpers import (
    NET_TRAINABLE_KEYS,
    ON_READ,
    A,
    Net,
    assert_files,
    copies,
    counter_checkpoint,
    data_file,
    data_files,
    index_file,
    make_state,
    read_index,
    save_numbered,
    saved_counter,
    seal,
    slot_keys,
    state_file,
    train,
)
from conftest import mirrored_param

# --- 9. Checkpoint API details -------------------------------------------------------------------


def test_save_numbers_from_the_save_counter_which_is_saved_and_restored(tmp_path):
    ckpt, v = counter_checkpoint()
    prefix = str(tmp_path / "ckpt")
    assert saved_counter(ckpt) == 0
    assert [ckpt.save(prefix) for _ in range(3)] == [f"{prefix}-{n}" for n in (1, 2, 3)]
    assert saved_counter(ckpt) == 3
    assert td.train.latest_checkpoint(str(tmp_path)) == f"{prefix}-3"
    assert read_index(f"{prefix}-2")["entries"]["save_counter"]["shape"] == []

    restored, _ = counter_checkpoint()
    restored.restore(f"{prefix}-2").assert_consumed()
    assert saved_counter(restored) == 2
    assert restored.save(prefix) == f"{prefix}-3"  # numbering continues from the restored counter


def test_write_does_not_touch_the_save_counter_or_the_state_file(tmp_path):
    ckpt, _ = counter_checkpoint()
    assert ckpt.write(str(tmp_path / "plain")) == str(tmp_path / "plain")
    assert saved_counter(ckpt) == 0
    assert not (tmp_path / "checkpoint").exists()
    assert td.train.latest_checkpoint(str(tmp_path)) is None
    restored, _ = counter_checkpoint()
    restored.read(str(tmp_path / "plain")).assert_consumed()


@pytest.mark.parametrize("same_values", [True, False])
def test_rewriting_a_prefix_leaves_one_data_file(tmp_path, same_values):
    ckpt, v = counter_checkpoint()
    prefix = str(tmp_path / "model")
    v.assign(np.full(4, 1.0, np.float32))
    ckpt.write(prefix)
    old = data_file(prefix).read_bytes()
    if not same_values:
        v.assign(np.full(4, 2.0, np.float32))
    ckpt.write(prefix)
    assert data_files(prefix) == [data_file(prefix)]
    assert (data_file(prefix).read_bytes() == old) == same_values
    assert read_index(prefix)["data_file"] == data_file(prefix).name
    restored, w = counter_checkpoint()
    restored.read(prefix).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), v.numpy())


def test_restore_none_restores_nothing_and_its_asserts_raise():
    ckpt, v = counter_checkpoint()
    status = ckpt.restore(None)
    assert status.expect_partial() is status
    status.run_restore_ops()
    for check in (status.assert_consumed, status.assert_existing_objects_matched, status.assert_nontrivial_match):
        with pytest.raises(AssertionError, match=r"^No checkpoint specified \(save_path=None\)"):
            check()
    np.testing.assert_array_equal(v.numpy(), np.zeros(4, np.float32))


def test_assert_nontrivial_match_fails_when_no_key_matches(tmp_path):
    v = td.Variable(np.ones(2, np.float32))
    path = td.train.Checkpoint(model=v).save(str(tmp_path / "ckpt"))
    w = td.Variable(np.zeros(2, np.float32))
    status = td.train.Checkpoint(net=w).restore(path)
    with pytest.raises(AssertionError, match="^Nothing except the save counter was restored from"):
        status.assert_nontrivial_match()
    unmatched_both_ways = r"to no object: \['model'\]; objects with no value in the checkpoint: \['net'\]"
    with pytest.raises(AssertionError, match=unmatched_both_ways):
        status.assert_consumed()
    with pytest.raises(AssertionError, match=r"did not restore every existing object: objects with no value in the "
                                             r"checkpoint: \['net'\]"):
        status.assert_existing_objects_matched()
    assert status.expect_partial() is status
    np.testing.assert_array_equal(w.numpy(), np.zeros(2, np.float32))


def test_assert_existing_objects_matched_allows_extra_saved_values(tmp_path):
    source = make_state(td.distribute.get_strategy())
    train(source, steps=1)
    path = td.train.Checkpoint(model=source.net, optimizer=source.optimizer, extra=td.Variable(3.0)).save(
        str(tmp_path / "ckpt")
    )
    net = Net(seed=8)
    status = td.train.Checkpoint(model=net).restore(path)  # no optimizer, no extra
    status.assert_existing_objects_matched().assert_nontrivial_match()
    with pytest.raises(AssertionError, match=r"matched to no object: \['extra', 'optimizer/.slots/model/layers"):
        status.assert_consumed()
    for mine, theirs in zip(net.variables, source.net.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


@pytest.mark.parametrize("value", [3, 2.5, "w", np.zeros(3), None, object()])
def test_non_trackable_objects_are_rejected(value):
    with pytest.raises(ValueError, match="^Checkpoint was expecting model to be a trackable object"):
        td.train.Checkpoint(model=value)


@pytest.mark.parametrize("name", ["save_counter", "_private"])
def test_reserved_names_are_rejected(name):
    with pytest.raises(ValueError, match=f"^Checkpoint: the name {name!r} is reserved"):
        td.train.Checkpoint(**{name: td.Variable(1.0)})


def test_lists_dicts_and_escaped_names_are_keys(tmp_path):
    objects = {
        "layers": [td.Variable(np.float32(1)), "not trackable", td.Variable(np.float32(2))],
        "table": {"a/b": td.Variable(np.float32(3)), ".slots": td.Variable(np.float32(4)), "100%": td.Variable(5.0)},
    }
    path = td.train.Checkpoint(**objects).save(str(tmp_path / "ckpt"))
    keys = set(read_index(path)["entries"])
    assert keys == {"layers/0", "layers/2", "table/a%2Fb", "table/%2Eslots", "table/100%25", "save_counter"}

    fresh = {
        "layers": [td.Variable(np.float32(0)), "not trackable", td.Variable(np.float32(0))],
        "table": {"a/b": td.Variable(np.float32(0)), ".slots": td.Variable(np.float32(0)), "100%": td.Variable(0.0)},
    }
    td.train.Checkpoint(**fresh).restore(path).assert_consumed()
    assert [float(fresh["layers"][k].numpy()) for k in (0, 2)] == [1.0, 2.0]
    assert [float(v.numpy()) for v in fresh["table"].values()] == [3.0, 4.0, 5.0]


def test_dict_keys_must_be_strings(tmp_path):
    with pytest.raises(TypeError, match=r"^Checkpoint: the dict at 'table' has a key of type int"):
        td.train.Checkpoint(table={1: td.Variable(1.0)}).save(str(tmp_path / "ckpt"))


def test_a_variable_reachable_twice_is_saved_once_under_its_first_key(tmp_path):
    shared = td.Variable(np.arange(3, dtype=np.float32))
    module = td.Module()
    module.first = shared
    module.second = [shared]
    path = td.train.Checkpoint(a=shared, b=[shared], m=module).save(str(tmp_path / "ckpt"))
    assert set(read_index(path)["entries"]) == {"a", "save_counter"}
    again = td.Variable(np.zeros(3, np.float32))
    module.first = module.second[0] = again
    td.train.Checkpoint(a=again, b=[again], m=module).restore(path).assert_consumed()
    np.testing.assert_array_equal(again.numpy(), np.arange(3, dtype=np.float32))


def test_an_optimizer_without_its_model_is_refused_at_save(tmp_path):
    state = make_state(td.distribute.get_strategy())
    train(state, steps=1)
    ckpt = td.train.Checkpoint(optimizer=state.optimizer)
    with pytest.raises(ValueError, match=r"^Checkpoint: the optimizer at 'optimizer' has slots for \w+:0, which this"):
        ckpt.save(str(tmp_path / "ckpt"))
    assert saved_counter(ckpt) == 0  # the failed save did not count
    assert list(tmp_path.iterdir()) == []


def test_a_none_aggregation_sync_on_read_variable_is_refused_at_save(tmp_path, mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(np.zeros(2, np.float32), synchronization=ON_READ, aggregation=A.NONE, name="per_replica")
    ckpt = td.train.Checkpoint(v=v)
    with pytest.raises(ValueError, match=r"^Checkpoint cannot save per_replica:0 \(at 'v'\): a sync-on-read variable"):
        ckpt.save(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="^Checkpoint cannot save per_replica:0"):
        ckpt.write(str(tmp_path / "plain"))
    assert saved_counter(ckpt) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("api", ["save", "write", "restore", "manager.save"])
def test_save_and_restore_inside_strategy_run_raise_context_error(tmp_path, mirrored_strategy, api):
    with mirrored_strategy.scope():
        v = td.Variable(np.ones(2, np.float32))
    ckpt = td.train.Checkpoint(v=v)
    path = ckpt.write(str(tmp_path / "ready"))
    calls = {
        "save": lambda: ckpt.save(str(tmp_path / "inside")),
        "write": lambda: ckpt.write(str(tmp_path / "inside")),
        "restore": lambda: ckpt.restore(path),
        "manager.save": lambda: manager.save(),
    }
    manager = td.train.CheckpointManager(ckpt, str(tmp_path / "manager-dir"), max_to_keep=1)
    called = "CheckpointManager.save" if api == "manager.save" else f"Checkpoint.{api}"

    with pytest.raises(td.errors.ContextError, match=rf"^{called}\(\) must be called outside strategy.run"):
        mirrored_strategy.run(calls[api])
    assert saved_counter(ckpt) == 0
    assert manager.latest_checkpoint is None and list((tmp_path / "manager-dir").iterdir()) == []
    assert not list(tmp_path.glob("inside*"))
    ckpt.restore(path).assert_nontrivial_match()  # fine between steps, and the strategy still works
    replica_ids = mirrored_strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    assert [int(r) for r in mirrored_strategy.experimental_local_results(replica_ids)] == [0, 1]


def test_the_index_documents_the_format(tmp_path, mirrored_strategy):
    state = make_state(mirrored_strategy)
    train(state, steps=1)
    path = state.checkpoint().save(str(tmp_path / "ckpt"))
    index = read_index(path)
    assert list(index) == [
        "format", "format_version", "towerdist_version", "data_file", "data_sha256", "data_size", "entries",
        "index_sha256",
    ]
    assert index["format"] == "towerdist-checkpoint"
    assert index["format_version"] == 3
    assert index["towerdist_version"] == td.__version__
    recorded = index["index_sha256"]
    seal(index)  # the documented recipe gives the recorded checksum
    assert index["index_sha256"] == recorded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    data = data_file(path)
    assert index["data_file"] == data.name
    assert index["data_size"] == data.stat().st_size
    assert index["data_sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    entries = index["entries"]
    assert list(entries) == sorted(entries)
    assert set(entries) == {
        *NET_TRAINABLE_KEYS, "model/seen", *slot_keys(NET_TRAINABLE_KEYS), "optimizer/iterations",
        "metric/total", "metric/count", "save_counter",
    }
    assert entries["model/layers/0/w"] | {"member": "-"} == {
        "member": "-", "shape": [3, 5], "dtype": "float32", "kind": "variable", "variable": "w:0",
        "class": "MirroredVariable", "synchronization": "ON_WRITE", "aggregation": "NONE",
    }
    assert entries["model/seen"]["dtype"] == "int64" and entries["model/seen"]["shape"] == []
    assert entries["metric/total"]["class"] == "SyncOnReadVariable"
    assert (entries["metric/total"]["synchronization"], entries["metric/total"]["aggregation"]) == ("ON_READ", "SUM")
    assert entries["optimizer/iterations"]["aggregation"] == "ONLY_FIRST_REPLICA"
    with np.load(data, allow_pickle=False) as archive:  # a plain npz: one member per entry, no pickles
        assert sorted(archive.files) == sorted(e["member"] for e in entries.values())
        np.testing.assert_array_equal(archive[entries["model/layers/0/w"]["member"]], state.net.layers[0].w.numpy())
        np.testing.assert_array_equal(archive[entries["metric/count"]["member"]], state.metric.count.numpy())


def test_root_lends_its_dependencies_to_the_checkpoint(tmp_path):
    module = td.Module()
    module.a = td.Variable(np.float32(2.0))
    module.b = [td.Variable(np.float32(3.0))]
    ckpt = td.train.Checkpoint(root=module, c=td.Variable(np.float32(4.0)))
    module.d = td.Variable(np.float32(5.0))  # the root's dependencies are the root's, now
    path = ckpt.write(str(tmp_path / "root"))
    assert set(read_index(path)["entries"]) == {"a", "b/0", "c", "d"}
    assert ckpt.a is module.a and ckpt.d is module.d
    with pytest.raises(ValueError, match="^Checkpoint was expecting root to be a trackable object"):
        td.train.Checkpoint(root=3)
    with pytest.raises(ValueError, match="^Checkpoint: root already has a dependency named 'a'"):
        td.train.Checkpoint(root=module, a=td.Variable(1.0))


def test_paths_may_be_pathlib_paths(tmp_path):
    ckpt, v = counter_checkpoint()
    v.assign(np.full(4, 6.0, np.float32))
    path = ckpt.save(tmp_path / "ckpt")
    assert path == str(tmp_path / "ckpt-1")
    assert td.train.latest_checkpoint(tmp_path) == path
    restored, w = counter_checkpoint()
    restored.restore(tmp_path / "ckpt-1").assert_consumed()
    np.testing.assert_array_equal(w.numpy(), v.numpy())
    manager = td.train.CheckpointManager(restored, tmp_path, max_to_keep=1)
    assert manager.latest_checkpoint == path
    assert manager.save() == str(tmp_path / "ckpt-2")


def test_manager_resaving_a_kept_number_makes_it_the_newest(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    save_numbered(manager, v, 2)
    assert manager.save(checkpoint_number=1) == str(tmp_path / "ckpt-1")
    assert manager.checkpoints == [str(tmp_path / "ckpt-2"), str(tmp_path / "ckpt-1")]
    assert manager.save() == str(tmp_path / "ckpt-4")  # the fourth save
    assert manager.checkpoints == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-4")]
    assert_files(tmp_path, 1, 4)
    assert state_file(tmp_path)["all_model_checkpoint_paths"] == ["ckpt-1", "ckpt-4"]


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_checkpoint_files_get_the_mode_of_ordinarily_created_files(tmp_path, umask_022):
    ckpt, _ = counter_checkpoint()
    path = ckpt.save(str(tmp_path / "ckpt"))
    ordinary = tmp_path / "ordinary.txt"
    ordinary.write_text("x")
    expected_mode = stat.S_IMODE(ordinary.stat().st_mode)  # 0o644 under umask 022
    for written in (index_file(path), data_file(path), tmp_path / "checkpoint"):
        assert oct(stat.S_IMODE(written.stat().st_mode)) == oct(expected_mode), written.name


# --- 10. dtypes: strings, dates, and what a checkpoint cannot hold -------------------------------


STRINGS = {
    "str": np.array([["a", "bc"], ["déjà", ""]]),  # numpy str_ ('<U4')
    "bytes": np.array([b"a", b"\x00\xffz", b""]),  # numpy bytes_ ('|S3')
}


def blank_like(values: np.ndarray, width: int | None = None) -> np.ndarray:
    dtype = values.dtype if width is None else np.dtype(f"{values.dtype.kind}{width}")
    return np.zeros(values.shape, dtype)  # empty strings


@pytest.mark.parametrize("kind", list(STRINGS))
@pytest.mark.parametrize("strategy_name", ["default", mirrored_param(2)])
def test_string_variables_save_and_restore(request, tmp_path, strategy_name, kind):
    strategy = request.getfixturevalue(strategy_name)
    values = STRINGS[kind]

    def make(initial: np.ndarray) -> dict[str, Any]:
        with strategy.scope():
            return {
                "mirrored": td.Variable(initial, trainable=False, name="vocabulary"),
                "on_read": td.Variable(initial, synchronization=ON_READ, aggregation=A.ONLY_FIRST_REPLICA),
            }

    source = make(values)
    path = td.train.Checkpoint(strings=source).save(str(tmp_path / "ckpt"))
    entry = read_index(path)["entries"]["strings/mirrored"]
    assert (entry["dtype"], entry["shape"]) == (values.dtype.str, list(values.shape))
    with np.load(data_files(path)[0], allow_pickle=False) as archive:  # no pickle needed to read them
        np.testing.assert_array_equal(archive[entry["member"]], values)

    target = make(blank_like(values))
    td.train.Checkpoint(strings=target).restore(path).assert_consumed()
    for name, variable in target.items():
        assert variable.dtype == values.dtype, name
        for k, copy in enumerate(copies(variable)):
            np.testing.assert_array_equal(copy, values, err_msg=f"{name}, copy {k}")


@pytest.mark.parametrize("width", [1, 4, 10], ids=lambda w: f"width{w}")
@pytest.mark.parametrize("kind", list(STRINGS))
def test_strings_restore_into_a_string_variable_of_any_width_as_assign_stores_them(tmp_path, kind, width):
    values = STRINGS[kind]  # up to 4 characters / 3 bytes long
    path = td.train.Checkpoint(v=td.Variable(values)).write(str(tmp_path / "ckpt"))
    assigned = td.Variable(blank_like(values, width))
    assigned.assign(values)  # what a string variable of this width makes of the saved strings
    target = td.Variable(blank_like(values, width), name="vocabulary")

    if np.array_equal(assigned.numpy(), values):
        td.train.Checkpoint(v=target).read(path).assert_consumed()
        np.testing.assert_array_equal(target.numpy(), values)
        assert target.dtype == assigned.dtype
    else:  # variables of fixed width: restore refuses to cut a string, where assign() would
        with pytest.raises(ValueError, match=r"^Cannot restore .*: 'v' \(vocabulary:0\): the checkpoint holds strings"):
            td.train.Checkpoint(v=target).read(path)
        np.testing.assert_array_equal(target.numpy(), blank_like(values, width))


@pytest.mark.parametrize("kind", list(STRINGS))
def test_a_restore_that_would_cut_strings_is_refused_and_changes_nothing(tmp_path, monkeypatch, kind):
    values = STRINGS[kind]
    path = td.train.Checkpoint(v=td.Variable(values, name="vocabulary"), w=td.Variable(1.0)).write(str(tmp_path / "c"))
    # A string variable that keeps its width when assigned (numpy's own conversion cuts longer strings).
    monkeypatch.setattr(restoring_module, "to_array", lambda array, dtype, what: array.astype(dtype))
    narrow = td.Variable(np.full(values.shape, "z" if kind == "str" else b"z"), name="vocabulary")
    other = td.Variable(0.0)
    longest, unit = (4, "characters") if kind == "str" else (3, "bytes")  # 'déjà', b'\x00\xffz'
    too_long = rf"the checkpoint holds strings of up to {longest} {unit}, longer than the variable's dtype"
    with pytest.raises(ValueError, match=r"^Cannot restore .*c: 'v' \(vocabulary:0\): " + too_long) as error:
        td.train.Checkpoint(v=narrow, w=other).restore(path)
    assert f"e.g. dtype='{values.dtype.kind}{longest}'" in str(error.value)
    np.testing.assert_array_equal(narrow.numpy(), np.full(values.shape, "z" if kind == "str" else b"z"))
    assert float(other.numpy()) == 0.0  # not even the variable that fitted


def test_str_and_bytes_strings_do_not_restore_into_each_other(tmp_path):
    path = td.train.Checkpoint(v=td.Variable(np.array(["ab", "c"]))).write(str(tmp_path / "ckpt"))
    as_bytes = td.Variable(np.array([b"xy", b"z"]))
    kinds = r"the checkpoint holds dtype <U2, the variable has dtype \|S2"
    with pytest.raises(ValueError, match=r"^Cannot restore .*: " + kinds):
        td.train.Checkpoint(v=as_bytes).restore(path)
    np.testing.assert_array_equal(as_bytes.numpy(), np.array([b"xy", b"z"]))


@pytest.mark.parametrize(
    "value",
    [
        np.array([True, False]),
        np.array([0, 255], np.uint8),
        np.array([-7, 7], np.int16),
        np.array([0.5, -2.0], np.float16),
        np.array([1.5, -2.0], ">f4"),  # big-endian
        np.array([1 + 2j, -3j], np.complex64),
        np.array(["2024-02-29T12:00:01", "1969-07-20T20:17:40"], "datetime64[s]"),
        np.array([1500, -3], "timedelta64[ms]"),
    ],
    ids=lambda v: v.dtype.str,
)
def test_every_storable_dtype_round_trips_exactly(tmp_path, value):
    path = td.train.Checkpoint(v=td.Variable(value)).write(str(tmp_path / "ckpt"))
    assert np.dtype(read_index(path)["entries"]["v"]["dtype"]) == value.dtype
    target = td.Variable(np.zeros_like(value))
    td.train.Checkpoint(v=target).read(path).assert_consumed()
    assert target.dtype == value.dtype
    np.testing.assert_array_equal(target.numpy(), value)


UNSTORABLE = {  # name: (value, the dtype as the message prints it, words of the reason)
    "object": (np.array(["a", 1], dtype=object), "object", "object arrays can only be stored with pickle"),
    "structured": (np.zeros(2, [("x", "f4"), ("y", "i4")]), r"\[\('x', '<f4'\), \('y', '<i4'\)\]",
                   "structured and void dtypes have no TensorFlow dtype"),
    "void": (np.zeros(2, "V4"), r"\|V4", "structured and void dtypes have no TensorFlow dtype"),
    "string_dtype": (np.array(["a", "bc"], dtype=np.dtypes.StringDType()), r"StringDType\(\)",
                     "numpy's variable-width StringDType can only be stored with pickle"),
}


@pytest.mark.parametrize("api", ["save", "write", "manager.save"])
@pytest.mark.parametrize("dtype_name", list(UNSTORABLE))
def test_a_dtype_no_checkpoint_can_hold_is_refused_at_save_before_anything_is_written(tmp_path, dtype_name, api):
    value, printed, reason = UNSTORABLE[dtype_name]
    ckpt = td.train.Checkpoint(good=td.Variable(np.ones(2, np.float32)), zbad=td.Variable(value, name="bad"))
    saves = {
        "save": lambda: ckpt.save(str(tmp_path / "ckpt")),
        "write": lambda: ckpt.write(str(tmp_path / "ckpt")),
        "manager.save": lambda: td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1).save(),
    }
    prefix = re.escape(str(tmp_path / "ckpt"))
    with pytest.raises(TypeError, match=rf"^Checkpoint cannot save bad:0 \(at 'zbad'\) to {prefix}(-1)?: its dtype "
                                        rf"{printed} cannot be stored: {re.escape(reason)}") as error:
        saves[api]()
    assert "Checkpoints hold bool, integer, float, complex, string" in str(error.value)
    assert list(tmp_path.iterdir()) == []  # not a byte written
    assert saved_counter(ckpt) == 0
