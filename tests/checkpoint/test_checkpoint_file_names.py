"""Checkpoint file names as TensorFlow's (``P.index``, ``P.data-00000-of-00001``), and the older format still read.

Scripts written for TensorFlow find towerdist's checkpoints the way they find TensorFlow's
(``os.path.exists(prefix + ".index")``, ``glob("ckpt-*.index")``). The data file's name is
fixed, so a rewrite's data is pending under a name holding its hash until its index is in
place: a reader whose data file does not match the index reads the pending file. The
format version 2 checkpoint under ``data/format_v2`` was written by towerdist's version 2
writer (``ckpt-1.index.json``, ``ckpt-1.data-<hash>.npz``, and the ``checkpoint`` state file)
from ``Net`` below with ``Checkpoint(model=net).save(".../ckpt")``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.checkpoint import files

from checkpoint_helpers import DataLossError, Stub, age, data_file, data_files, index_file, read_index, seal

FORMAT_V2 = Path(__file__).parent / "data" / "format_v2"


class Net(td.Module):
    """The objects of the version 2 checkpoint, initialised to other values."""

    def __init__(self) -> None:
        super().__init__()
        self.w = td.Variable(np.zeros((2, 3), np.float32), name="w")
        self.b = td.Variable(np.zeros(2, np.float32), name="b")
        self.vocab = td.Variable(np.array(["", "", ""], dtype="<U3"), name="vocab")
        self.steps = td.Variable(np.int64(0), trainable=False, name="steps")


V2_VALUES = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([0.5, -1.5], np.float32),
             "vocab": np.array(["a", "bc", "def"]), "steps": np.array(7, np.int64)}


def assert_v2_values(net: Net) -> None:
    for name, value in V2_VALUES.items():
        np.testing.assert_array_equal(getattr(net, name).numpy(), value, err_msg=name)


@pytest.fixture
def v2_directory(tmp_path: Path) -> Path:
    directory = tmp_path / "v2"
    shutil.copytree(FORMAT_V2, directory)
    return directory


# --- TensorFlow's names -------------------------------------------------------------------------


def test_a_save_writes_tensorflows_two_files_and_scripts_find_them(tmp_path):
    ckpt = td.train.Checkpoint(v=td.Variable(np.arange(4, dtype=np.float32)))
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    paths = [manager.save() for _ in range(3)]
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index", "ckpt-3.data-00000-of-00001", "ckpt-3.index",
    ]
    assert os.path.exists(paths[-1] + ".index") and not os.path.exists(paths[0] + ".index")
    newest = max(glob.glob(str(tmp_path / "ckpt-*.index")), key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
    assert newest[: -len(".index")] == td.train.latest_checkpoint(str(tmp_path)) == paths[-1]
    index = read_index(paths[-1])
    assert index["format_version"] == 3 and index["data_file"] == "ckpt-3.data-00000-of-00001"


def test_a_reader_reads_the_pending_data_its_index_names_when_the_data_file_is_older(tmp_path):
    v = td.Variable(np.float32(1.0))
    ckpt = td.train.Checkpoint(v=v)
    prefix = str(tmp_path / "ckpt")
    ckpt.write(prefix)
    old_data = data_file(prefix).read_bytes()
    v.assign(2.0)
    ckpt.write(prefix)
    # As a crash between the index's rename and the data's leaves it: the new index, the old data file.
    sha256 = read_index(prefix)["data_sha256"]
    pending = Path(f"{data_file(prefix)}.{sha256[:16]}.pending")
    data_file(prefix).rename(pending)
    data_file(prefix).write_bytes(old_data)
    assert hashlib.sha256(pending.read_bytes()).hexdigest() == sha256

    target = td.Variable(np.float32(0.0))
    td.train.Checkpoint(v=target).read(prefix).assert_consumed()
    assert float(target.numpy()) == 2.0

    pending.unlink()  # without it, the data file is what it is: not the index's
    with pytest.raises(DataLossError, match=r"^Checkpoint data file .*ckpt\.data-00000-of-00001 is corrupt: its "
                                            r"SHA-256 does not match its index") as error:
        td.train.Checkpoint(v=target).read(prefix)
    assert error.value.path == str(data_file(prefix))


def test_an_index_tensorflow_wrote_is_refused_saying_so(tmp_path):
    path = td.train.Checkpoint(v=td.Variable(1.0)).write(str(tmp_path / "ckpt"))
    index_file(path).write_bytes(b"\x00\x00\x00\x01\x12\x08tensorflow-sstable")  # not JSON, as TF's tables
    with pytest.raises(DataLossError, match=r"^Checkpoint index .* is truncated or corrupt .* if TensorFlow wrote this "
                                            r"checkpoint, towerdist cannot read it"):
        td.train.Checkpoint(v=td.Variable(0.0)).read(path)


# --- format version 2 -----------------------------------------------------------------------------


def test_a_version_2_checkpoint_is_found_and_restored(v2_directory):
    assert sorted(os.listdir(v2_directory)) == ["checkpoint", "ckpt-1.data-0371a6258545f441.npz", "ckpt-1.index.json"]
    latest = td.train.latest_checkpoint(str(v2_directory))
    assert latest == str(v2_directory / "ckpt-1")
    net = Net()
    ckpt = td.train.Checkpoint(model=net)
    ckpt.restore(latest).assert_consumed()
    assert_v2_values(net)
    assert int(ckpt.save_counter.numpy()) == 1


def test_a_manager_takes_over_a_version_2_directory_and_writes_version_3(v2_directory):
    net = Net()
    ckpt = td.train.Checkpoint(model=net)
    manager = td.train.CheckpointManager(ckpt, str(v2_directory), max_to_keep=1)
    assert manager.latest_checkpoint == str(v2_directory / "ckpt-1")
    ckpt.restore(manager.latest_checkpoint).assert_consumed()
    assert manager.save() == str(v2_directory / "ckpt-2")
    assert sorted(os.listdir(v2_directory)) == [  # ckpt-1 was Checkpoint.save()'s: never deleted by a manager
        "checkpoint", "ckpt-1.data-0371a6258545f441.npz", "ckpt-1.index.json", "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
    ]
    fresh = Net()
    td.train.Checkpoint(model=fresh).restore(td.train.latest_checkpoint(str(v2_directory))).assert_consumed()
    assert_v2_values(fresh)


def test_writing_version_3_to_a_version_2_prefix_supersedes_it(v2_directory):
    net = Net()
    ckpt = td.train.Checkpoint(model=net)
    prefix = str(v2_directory / "ckpt-1")
    ckpt.restore(prefix)
    net.steps.assign(8)
    ckpt.write(prefix)
    assert sorted(os.listdir(v2_directory)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    fresh = Net()
    td.train.Checkpoint(model=fresh).read(prefix)
    assert int(fresh.steps.numpy()) == 8


def test_a_damaged_version_2_checkpoint_raises_data_loss(v2_directory):
    (data,) = data_files(v2_directory / "ckpt-1")
    content = bytearray(data.read_bytes())
    content[len(content) // 2] ^= 0x01
    data.write_bytes(bytes(content))
    net = Net()
    with pytest.raises(DataLossError, match=r"^Checkpoint data file .*\.npz is corrupt: its SHA-256"):
        td.train.Checkpoint(model=net).restore(str(v2_directory / "ckpt-1"))
    assert float(net.steps.numpy()) == 0


def test_a_manager_sweeps_stale_version_2_orphans_and_keeps_the_referenced_data(v2_directory):
    (referenced,) = data_files(v2_directory / "ckpt-1")
    orphan = v2_directory / "ckpt-1.data-aaaaaaaaaaaaaaaa.npz"
    orphan.write_bytes(b"PK\x03\x04 an orphan")
    age(referenced, orphan)
    td.train.CheckpointManager(td.train.Checkpoint(model=Net()), str(v2_directory), max_to_keep=1)
    assert referenced.exists() and not orphan.exists()


# --- entries of kind "object", and indexes in the wrong file --------------------------------------


def _object_checkpoint(tmp_path: Path) -> str:
    return td.train.Checkpoint(it=Stub("a", b"state"), v=td.Variable(1.0)).write(str(tmp_path / "ckpt"))


def _resealed(path: str, edit: Any, file: Path | None = None) -> None:
    index = read_index(path)
    edit(index)
    seal(index)
    (file or index_file(path)).write_text(json.dumps(index), encoding="utf-8")


MALFORMED = r"^Checkpoint index .* is malformed: "
ENTRY_DAMAGE = {  # name: (edit of the index, the message after MALFORMED)
    "unknown_kind": (lambda i: i["entries"]["it"].update(kind="tensor"), r"entry 'it' has kind 'tensor', not"),
    "no_kind": (lambda i: i["entries"]["v"].pop("kind"), r"entry 'v' has kind None, not 'variable' or 'object'"),
    "object_not_bytes": (
        lambda i: i["entries"]["it"].update(dtype="float32"), r"entry 'it' is an object's state, but not a 1-D uint8"
    ),
    "object_without_class": (lambda i: i["entries"]["it"].pop("class"), r"entry 'it' has class None, not a string"),
    "variable_without_aggregation": (
        lambda i: i["entries"]["v"].pop("aggregation"), r"entry 'v' has aggregation None, not a string"
    ),
}


@pytest.mark.parametrize("damage", list(ENTRY_DAMAGE))
def test_a_resealed_index_with_a_malformed_entry_raises_data_loss(tmp_path, damage):
    path = _object_checkpoint(tmp_path)
    edit, message = ENTRY_DAMAGE[damage]
    _resealed(path, edit)
    stub, v = Stub("b"), td.Variable(0.0)
    with pytest.raises(DataLossError, match=MALFORMED + message):
        td.train.Checkpoint(it=stub, v=v).read(path)
    assert stub.log == [] and float(v.numpy()) == 0.0


def test_a_version_3_index_in_an_index_json_file_is_refused(tmp_path):
    path = _object_checkpoint(tmp_path)
    index_file(path).rename(f"{path}.index.json")
    with pytest.raises(DataLossError, match=r"^Checkpoint .*ckpt\.index\.json has format_version 3; this towerdist "
                                            r"reads versions 2 \(in \.index\.json files\) and 3 \(in \.index files\)"):
        td.train.Checkpoint(v=td.Variable(0.0)).read(path)


def test_a_version_2_entry_with_a_kind_is_refused(v2_directory):
    prefix = str(v2_directory / "ckpt-1")
    index_json = Path(f"{prefix}.index.json")
    index = json.loads(index_json.read_text())
    index["entries"]["model/b"]["kind"] = "variable"
    seal(index)
    index_json.write_text(json.dumps(index))
    with pytest.raises(DataLossError, match=MALFORMED + r"entry 'model/b' has a kind, which version 2 entries"):
        td.train.Checkpoint(model=Net()).restore(prefix)


def test_a_checkpoint_rewritten_between_reading_its_index_and_its_data_is_read_again(tmp_path, monkeypatch):
    v = td.Variable(np.float32(1.0))
    ckpt = td.train.Checkpoint(v=v)
    prefix = str(tmp_path / "ckpt")
    ckpt.write(prefix)
    real = files._read_data
    calls = []

    def rewritten_meanwhile(prefix_: str, index: dict[str, Any]) -> Any:
        if not calls:  # another process replaces the checkpoint after this reader read the old index
            v.assign(2.0)
            ckpt.write(prefix)
        calls.append(index["data_sha256"])
        return real(prefix_, index)

    monkeypatch.setattr(files, "_read_data", rewritten_meanwhile)
    target = td.Variable(np.float32(0.0))
    td.train.Checkpoint(v=target).read(prefix).assert_consumed()
    assert float(target.numpy()) == 2.0 and len(calls) == 2 and calls[0] != calls[1]


def test_an_index_removed_while_being_read_is_not_found(tmp_path, monkeypatch):
    prefix = str(tmp_path / "ckpt")
    td.train.Checkpoint(v=td.Variable(1.0)).write(prefix)
    index_file(prefix).unlink()
    monkeypatch.setattr(files.os.path, "isfile", lambda path: True)  # it was there a moment ago
    with pytest.raises(td.errors.NotFoundError, match=r"it was removed while being read"):
        td.train.Checkpoint(v=td.Variable(0.0)).read(prefix)
