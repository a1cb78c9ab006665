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
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import towerdist as td

from checkpoint_helpers import DataLossError, age, data_file, data_files, index_file, read_index

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
