"""``td.train`` checkpoints under crashes: a child process SIGKILLed during a save, and what crashed saves leave behind.

The crash tests run ``tools/test_programs/checkpoint_child.py`` in a child process and SIGKILL it at
chosen points of a save (and once at a moment nobody chooses); the sweep tests pause it mid-save
and check that another process's sweep leaves its files alone. Stale files are made by setting
their modification time, never by waiting. Also: paths and the state file.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.checkpoint import files

from checkpoint_helpers import (
    CHILD_SCRIPT,
    CHILD_WAIT_SECONDS,
    PACKAGE_ROOT,
    age,
    assert_files,
    assert_same_values,
    counter_checkpoint,
    data_file,
    data_files,
    index_file,
    read_index,
    save_numbered,
    saved_counter,
    state_file,
)
from conftest import load_program

# The program the crash tests run, imported too: the test reads back what it saves.
checkpoint_child = load_program("checkpoint_child")

# --- 5. crash safety: SIGKILL during a save ----------------------------------------------------


class Child:
    """``checkpoint_child.py`` in a child process; every wait on it is bounded."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.directory = tmp_path / "ckpts"
        self.directory.mkdir()
        self._stderr_path = tmp_path / "child-stderr.txt"
        self._stderr = open(self._stderr_path, "wb")  # a file, not a pipe: it cannot fill up and block the child
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, CHILD_SCRIPT, str(self.directory), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
        )
        self._buffer = b""

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=CHILD_WAIT_SECONDS)
        for stream in (self.process.stdin, self.process.stdout, self._stderr):
            if stream is not None:
                stream.close()

    def _diagnostics(self) -> str:
        self._stderr.flush()
        return f"child exit status {self.process.poll()}; stderr:\n{self._stderr_path.read_text(errors='replace')}"

    def line(self) -> str:
        """The child's next line of output, waiting at most ``CHILD_WAIT_SECONDS``."""
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        deadline = time.monotonic() + CHILD_WAIT_SECONDS
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"the child printed no line within {CHILD_WAIT_SECONDS} s. {self._diagnostics()}")
            ready, _, _ = select.select([descriptor], [], [], remaining)
            if ready:
                chunk = os.read(descriptor, 4096)
                if not chunk:
                    self.process.wait(timeout=CHILD_WAIT_SECONDS)
                    pytest.fail(f"the child closed its output. {self._diagnostics()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def expect(self, start: str) -> str:
        """Reads a line that must start with ``start``; returns the rest."""
        line = self.line()
        assert line.startswith(start), f"expected {start!r}..., got {line!r}. {self._diagnostics()}"
        return line[len(start):]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(timeout=CHILD_WAIT_SECONDS) == -signal.SIGKILL

    def resume(self) -> None:
        """Lets a blocked child go on with its save."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"continue\n")
        self.process.stdin.flush()

    def exit_status(self) -> int:
        return self.process.wait(timeout=CHILD_WAIT_SECONDS)


KILL_POINTS = {  # name: (os function the child blocks in, which call of it during the second write)
    "data_fsync": ("fsync", 1),
    "before_pending_rename": ("replace", 1),  # the data, synced, renamed to <data>.<hash>.pending
    "before_index_rename": ("replace", 2),  # the commit point
    "before_data_rename": ("replace", 3),  # committed: the pending data renamed to its final name
    "before_state_rename": ("replace", 4),
}
COMMITTED = ("before_data_rename", "before_state_rename")  # the second checkpoint's index is in place
LEAVES_A_TEMPORARY = ("data_fsync", "before_pending_rename", "before_index_rename", "before_state_rename")


def blocked_file(kill_point: str, name: str) -> str:
    """A regular expression of the file the child reports at ``kill_point`` (``name``: the second prefix's)."""
    return {
        "data_fsync": r"\.tmp-\w+\.part",
        "before_pending_rename": rf"{name}\.data-00000-of-00001\.[0-9a-f]{{16}}\.pending",
        "before_index_rename": rf"{name}\.index",
        "before_data_rename": rf"{name}\.data-00000-of-00001",
        "before_state_rename": "checkpoint",
    }[kill_point]


def restored_child_values(path: str) -> dict[str, np.ndarray]:
    ckpt = checkpoint_child.make_objects()
    ckpt.read(path).expect_partial().assert_existing_objects_matched()  # (a save also holds save_counter)
    return checkpoint_child.read_values(ckpt)


def assert_child_values(path: str, n: int) -> None:
    assert_same_values(restored_child_values(path), checkpoint_child.expected(n))


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(select, "select"), reason="needs POSIX signals")
@pytest.mark.parametrize(
    "saver, kill_point",
    [("save", point) for point in KILL_POINTS] + [("write", point) for point in KILL_POINTS if "state" not in point],
)
def test_sigkill_in_the_middle_of_a_save_leaves_the_previous_checkpoint(tmp_path, saver, kill_point):
    function, k = KILL_POINTS[kill_point]
    with Child(tmp_path, "block", saver, function, str(k)) as child:
        directory = child.directory
        first = str(directory / ("ckpt-1" if saver == "save" else "ckpt"))
        second = str(directory / ("ckpt-2" if saver == "save" else "ckpt"))
        assert child.expect("SAVED ") == first
        blocked = child.expect("BLOCKED ")
        # The child stopped exactly where this case says, in the second write, before that step ran.
        assert re.fullmatch(rf"{function} {blocked_file(kill_point, os.path.basename(second))}", blocked), blocked
        names = {p.name for p in directory.iterdir()}
        temporaries = [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
        assert len(temporaries) == (1 if kill_point in LEAVES_A_TEMPORARY else 0), names
        if kill_point == "data_fsync":
            assert temporaries[0].read_bytes().startswith(b"PK\x03\x04"), "the temporary being synced is the npz"
        pending = [p for p in data_files(second) if p.name.endswith(".pending")]
        assert len(pending) == (1 if kill_point in ("before_index_rename", "before_data_rename") else 0), names
        new_data_files = len(data_files(second)) - (1 if saver == "write" else 0)
        assert new_data_files == (0 if kill_point in ("data_fsync", "before_pending_rename") else 1), names
        assert index_file(second).is_file() == (kill_point in COMMITTED or saver == "write")
        child.kill()

    if saver == "save":
        assert td.train.latest_checkpoint(str(directory)) == first
        if kill_point in COMMITTED:
            assert_child_values(second, 2)  # complete (its index is the commit point), just not recorded
        assert_child_values(first, 1)
    else:  # the prefix rewritten: the old checkpoint, or the new one once its index is in place
        assert_child_values(second, 2 if kill_point in COMMITTED else 1)
    if kill_point == "before_data_rename":  # committed, its data still pending: read from there
        assert data_file(second).exists() == (saver == "write") and len(pending) == 1
    else:  # the crash left a stray temporary
        assert any(p.name.startswith(".tmp-") for p in directory.iterdir())

    # Saving and restoring go on, unbothered by the strays. Young strays stay: they could
    # be another process's save in progress.
    ckpt = checkpoint_child.make_objects()
    (ckpt.restore if saver == "save" else ckpt.read)(first).assert_consumed()
    if kill_point == "before_data_rename":  # a rewrite removes the pending data the index it replaces named
        assert_child_values(second, 2)
    checkpoint_child.set_values(ckpt, 3)
    path = ckpt.save(str(directory / "ckpt")) if saver == "save" else ckpt.write(str(directory / "ckpt"))
    assert path == second
    killed_before_its_index = 1 if kill_point == "before_index_rename" else 0  # its data file has no index
    assert len(data_files(second)) == 1 + killed_before_its_index
    assert not pending or pending[0].exists() == (kill_point == "before_index_rename")
    assert any(p.name.startswith(".tmp-") for p in directory.iterdir()) == (kill_point in LEAVES_A_TEMPORARY)
    assert_child_values(path, 3)

    # Once the strays are stale, the next save (or a manager's start) removes them, and no
    # data file an index points to, however old.
    age(*directory.iterdir())
    if saver == "save":
        assert td.train.latest_checkpoint(str(directory)) == second
        manager = td.train.CheckpointManager(ckpt, str(directory), max_to_keep=1)
        assert manager.latest_checkpoint == second
        assert_swept(directory)
        assert manager.save() == str(directory / "ckpt-3")
        assert manager.checkpoints == [str(directory / "ckpt-3")]
        assert_child_values(str(directory / "ckpt-3"), 3)
    else:
        assert ckpt.write(str(directory / "ckpt")) == second
        assert_swept(directory)


def assert_swept(directory: Path) -> None:
    """No temporary file is left, and every prefix has exactly the one data file its index names."""
    names = sorted(p.name for p in directory.iterdir())
    assert not [n for n in names if n.startswith(".tmp-")], names
    for index in directory.glob("*.index"):
        prefix = str(index)[: -len(".index")]
        assert [p.name for p in data_files(prefix)] == [read_index(prefix)["data_file"]], names


KILL_AFTER = 5  # the parent kills the looping child once it has announced this save


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(select, "select"), reason="needs POSIX signals")
def test_sigkill_at_an_unchosen_moment_leaves_a_consistent_latest_checkpoint(tmp_path):
    with Child(tmp_path, "loop") as child:
        for n in range(1, KILL_AFTER + 1):
            assert child.expect("SAVING ") == str(n)
        child.kill()  # somewhere in save KILL_AFTER or a later one: wherever the child happens to be
    directory = str(child.directory)

    latest = td.train.latest_checkpoint(directory)
    assert latest is not None
    number = int(latest.rsplit("-", 1)[1])
    assert latest == os.path.join(directory, f"ckpt-{number}")
    assert number >= KILL_AFTER - 1  # save KILL_AFTER - 1 had returned when SAVING KILL_AFTER was printed
    ckpt = checkpoint_child.make_objects()
    ckpt.restore(latest).assert_consumed()
    assert_same_values(checkpoint_child.read_values(ckpt), checkpoint_child.expected(number))  # all from one save
    assert saved_counter(ckpt) == number

    manager = td.train.CheckpointManager(ckpt, directory, max_to_keep=2)
    assert manager.latest_checkpoint == latest
    assert manager.checkpoints[-1] == latest
    for path in manager.checkpoints:  # every checkpoint it lists is complete and holds its own save
        assert_child_values(path, int(path.rsplit("-", 1)[1]))
    checkpoint_child.set_values(ckpt, number + 1)
    assert manager.save() == os.path.join(directory, f"ckpt-{number + 1}")
    assert_child_values(manager.latest_checkpoint, number + 1)
    assert td.train.latest_checkpoint(directory) == manager.latest_checkpoint
    assert len(manager.checkpoints) == 2


# --- 11. paths, the state file, and what crashed saves leave behind ---------------------------------


PATH_APIS = ["save", "write", "restore", "read", "latest_checkpoint", "CheckpointManager"]


@pytest.mark.parametrize("api", PATH_APIS)
def test_paths_may_be_bytes(tmp_path, monkeypatch, api):
    working = tmp_path / "working-directory"
    working.mkdir()
    monkeypatch.chdir(working)  # a bytes path mistaken for a str would land here
    directory = tmp_path / "ckpts"
    ckpt, v = counter_checkpoint()
    v.assign(np.full(4, 6.0, np.float32))
    saved = ckpt.save(str(directory / "ckpt"))
    restored, w = counter_checkpoint()
    encoded = os.fsencode

    if api == "save":
        assert ckpt.save(encoded(str(directory / "ckpt"))) == str(directory / "ckpt-2")
        assert td.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-2")
    elif api == "write":
        assert ckpt.write(encoded(str(directory / "plain"))) == str(directory / "plain")
        restored.restore(str(directory / "plain")).assert_consumed()
    elif api == "restore":
        restored.restore(encoded(saved)).assert_consumed()
    elif api == "read":  # a save read without its save_counter, as in TensorFlow: its count is not consumed
        restored.read(encoded(saved)).assert_existing_objects_matched()
    elif api == "latest_checkpoint":
        assert td.train.latest_checkpoint(encoded(str(directory))) == saved
    else:
        manager = td.train.CheckpointManager(restored, encoded(str(directory)), max_to_keep=1)
        assert manager.directory == str(directory) and manager.latest_checkpoint == saved
        restored.restore(manager.latest_checkpoint).assert_consumed()
        assert manager.save() == str(directory / "ckpt-2")
    if api in ("write", "restore", "read", "CheckpointManager"):
        np.testing.assert_array_equal(w.numpy(), v.numpy())
    assert list(working.iterdir()) == []


@pytest.mark.parametrize("api", PATH_APIS)
def test_a_path_of_another_type_is_refused_naming_the_argument(tmp_path, api):
    ckpt, _ = counter_checkpoint()
    calls = {
        "save": (lambda: ckpt.save(7), r"Checkpoint\.save\(\) expects file_prefix"),
        "write": (lambda: ckpt.write(7), r"Checkpoint\.write\(\) expects file_prefix"),
        "restore": (lambda: ckpt.restore(7), r"Checkpoint\.restore\(\) expects save_path"),
        "read": (lambda: ckpt.read(7), r"Checkpoint\.read\(\) expects save_path"),
        "latest_checkpoint": (lambda: td.train.latest_checkpoint(7), r"latest_checkpoint\(\) expects checkpoint_dir"),
        "CheckpointManager": (
            lambda: td.train.CheckpointManager(ckpt, 7, max_to_keep=1), r"CheckpointManager\(\) expects directory"
        ),
    }
    call, first_words = calls[api]
    with pytest.raises(TypeError, match=rf"^{first_words} to be a path: a str, bytes or os.PathLike. Got \w+=7 of type "
                                        rf"int; pass e.g."):
        call()
    assert saved_counter(ckpt) == 0


STATE_FILE_DAMAGE = {  # name: (the state file's bytes, given the valid state; the fault the warning names)
    "non_numeric_timestamp": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": ["yesterday", 1.0]}).encode(),
        r"all_model_checkpoint_timestamps\[0\] is 'yesterday', not a number of seconds",
    ),
    "null_timestamp": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": [1.0, None]}).encode(),
        r"all_model_checkpoint_timestamps\[1\] is None, not a number of seconds",
    ),
    "nan_timestamp": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": [1.0, float("nan")]}).encode(),
        r"all_model_checkpoint_timestamps\[1\] is nan, not a number of seconds",
    ),
    "timestamps_missing_one": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": [1.0]}).encode(),
        r"it lists 2 checkpoints but 1 timestamps",
    ),
    "non_numeric_last_preserved": (
        lambda state: json.dumps({**state, "last_preserved_timestamp": "now"}).encode(),
        r"last_preserved_timestamp is 'now', not a number of seconds",
    ),
    "paths_not_a_list": (
        lambda state: json.dumps({**state, "all_model_checkpoint_paths": "ckpt-3"}).encode(),
        r"all_model_checkpoint_paths is 'ckpt-3', not a list of paths",
    ),
    "no_latest": (
        lambda state: json.dumps({k: v for k, v in state.items() if k != "model_checkpoint_path"}).encode(),
        r"model_checkpoint_path is None, not a path",
    ),
    "not_an_object": (lambda state: b"[1, 2]", r"it holds a JSON list, not an object"),
    "truncated": (lambda state: json.dumps(state).encode()[:25], r"it is not JSON"),
    "not_utf8": (lambda state: b"\xff\xfe\x00garbage", r"it is not UTF-8 text"),
    "tensorflow_text_format": (
        lambda state: b'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n',
        r"it is not JSON .*TensorFlow's text-format state files are not read",
    ),
}


def damaged_state_directory(tmp_path: Path, damage: str) -> tuple[Path, td.train.Checkpoint, Any]:
    """ckpt-2 and ckpt-3 on disk (ckpt-3 the newer), and a state file damaged as ``damage`` says."""
    ckpt, v = counter_checkpoint()
    save_numbered(td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2), v, 3)
    age(index_file(tmp_path / "ckpt-2"), seconds=200.0)
    age(index_file(tmp_path / "ckpt-3"), seconds=100.0)
    (tmp_path / "checkpoint").write_bytes(STATE_FILE_DAMAGE[damage][0](state_file(tmp_path)))
    return tmp_path, ckpt, v


@pytest.mark.parametrize("damage", list(STATE_FILE_DAMAGE))
def test_a_manager_with_an_unusable_state_file_warns_and_starts_from_the_newest_checkpoint(tmp_path, damage):
    directory, _, _ = damaged_state_directory(tmp_path, damage)
    fault = STATE_FILE_DAMAGE[damage][1]
    ckpt, v = counter_checkpoint()
    unusable = rf"the state file .*checkpoint is unusable \({fault}"
    with pytest.warns(RuntimeWarning, match=rf"^CheckpointManager: {unusable}") as w:
        manager = td.train.CheckpointManager(ckpt, str(directory), max_to_keep=2)
    message = str(w[0].message)
    assert f"starts from the newest complete checkpoint in the directory, {directory / 'ckpt-3'}" in message
    assert f"leaves the older ones on disk, unmanaged (it never deletes them, since it cannot tell which were " \
           f"preserved): {[str(directory / 'ckpt-2')]}" in message
    assert manager.latest_checkpoint == str(directory / "ckpt-3")
    assert manager.checkpoints == [str(directory / "ckpt-3")]
    ckpt.restore(manager.latest_checkpoint).assert_consumed()
    np.testing.assert_array_equal(v.numpy(), np.full(4, 3, np.float32))

    save_numbered(manager, v, 2)  # ckpt-4, ckpt-5: ckpt-3 leaves the window; ckpt-2 was never managed
    assert_files(directory, 2, 4, 5)
    assert state_file(directory)["all_model_checkpoint_paths"] == ["ckpt-4", "ckpt-5"]  # rewritten, valid
    assert td.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-5")


@pytest.mark.parametrize("damage", list(STATE_FILE_DAMAGE))
def test_latest_checkpoint_with_an_unusable_state_file_warns_and_finds_the_newest_checkpoint(tmp_path, damage):
    directory, _, _ = damaged_state_directory(tmp_path, damage)
    fault = STATE_FILE_DAMAGE[damage][1]
    unusable = rf"the state file .*checkpoint is unusable \({fault}"
    with pytest.warns(RuntimeWarning, match=rf"^latest_checkpoint\(\): {unusable}"):
        assert td.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-3")


def test_an_unusable_state_file_in_a_directory_without_checkpoints_gives_none_and_an_empty_manager(tmp_path):
    (tmp_path / "checkpoint").write_text("{not json")
    with pytest.warns(RuntimeWarning, match=r"holds no complete numbered checkpoint, so there is no latest one"):
        assert td.train.latest_checkpoint(str(tmp_path)) is None
    ckpt, v = counter_checkpoint()
    with pytest.warns(RuntimeWarning, match=r"holds no complete checkpoint named ckpt-<number>, so it starts empty"):
        manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    assert manager.save() == str(tmp_path / "ckpt-1")
    assert td.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-1")  # the state file is valid again


SWEEPS = ["save", "write", "manager_start", "manager_save"]


def sweep_by(trigger: str, directory: Path) -> None:
    """Runs the save (or manager start) ``trigger`` names in ``directory``."""
    ckpt, _ = counter_checkpoint()
    if trigger == "save":
        ckpt.save(str(directory / "model"))
    elif trigger == "write":
        ckpt.write(str(directory / "model"))
    elif trigger == "manager_start":
        td.train.CheckpointManager(ckpt, str(directory), max_to_keep=1)
    else:
        td.train.CheckpointManager(ckpt, str(directory), max_to_keep=1).save()


@pytest.mark.parametrize("trigger", SWEEPS)
def test_stale_temporary_files_are_swept_and_younger_ones_kept(tmp_path, trigger):
    stale = tmp_path / ".tmp-crashed1.part"  # left by a save that crashed long ago
    stale.write_bytes(b"PK\x03\x04 half an npz")
    age(stale)
    young = tmp_path / ".tmp-writing2.part"  # another process's save, being written now
    young.write_bytes(b"PK\x03\x04 half an npz")
    not_quite = tmp_path / ".tmp-writing3.part"  # untouched for a little less than the bound
    not_quite.write_bytes(b"{")
    age(not_quite, seconds=files.STALE_SECONDS - 60.0)
    not_ours = [tmp_path / "notes.part", tmp_path / ".tmp-notes.txt"]
    for path in not_ours:
        path.write_text("keep me")
        age(path)

    sweep_by(trigger, tmp_path)

    assert not stale.exists()
    assert young.exists() and not_quite.exists() and all(path.exists() for path in not_ours)


def fake_data_file(prefix: Path, digits: str) -> Path:
    """A pending data file for ``prefix`` that no index names (as a save killed before its index leaves)."""
    path = prefix.parent / f"{prefix.name}.data-00000-of-00001.{digits * 16}.pending"
    path.write_bytes(b"PK\x03\x04 an orphan")
    return path


def test_a_rewrite_removes_the_stale_orphans_of_its_prefix_only(tmp_path):
    ckpt, v = counter_checkpoint()
    prefix = tmp_path / "model"
    ckpt.write(str(prefix))
    (written,) = data_files(prefix)
    stale_orphan, young_orphan = fake_data_file(prefix, "a"), fake_data_file(prefix, "b")
    other_prefix_orphan = fake_data_file(tmp_path / "model-1", "c")
    age(written, stale_orphan, other_prefix_orphan)

    v.assign(np.full(4, 5.0, np.float32))
    ckpt.write(str(prefix))

    assert data_files(prefix) == [data_file(prefix), young_orphan]
    assert read_index(prefix)["data_file"] == data_file(prefix).name
    assert not stale_orphan.exists()
    assert young_orphan.exists()  # may be another process's save of this prefix, its index to come
    assert other_prefix_orphan.exists()  # not this prefix's
    restored, w = counter_checkpoint()
    restored.read(str(prefix)).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 5.0, np.float32))


def test_a_manager_start_removes_stale_unreferenced_data_files_of_its_checkpoints(tmp_path):
    ckpt, v = counter_checkpoint()
    save_numbered(td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=None), v, 3)
    referenced = [path for n in (1, 2, 3) for path in data_files(tmp_path / f"ckpt-{n}")]
    stale = [fake_data_file(tmp_path / "ckpt-2", "a"), fake_data_file(tmp_path / "ckpt-9", "a")]  # 9: no index
    young = [fake_data_file(tmp_path / "ckpt-2", "b"), fake_data_file(tmp_path / "ckpt-8", "b")]
    unreadable_index = fake_data_file(tmp_path / "ckpt-3", "c")  # its index is damaged below: it may name this
    other_name = fake_data_file(tmp_path / "model-4", "d")
    index_file(tmp_path / "ckpt-3").write_bytes(b"\x00 damaged")
    age(*referenced, *stale, unreadable_index, other_name)  # referenced files are never removed, however old

    td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=None)

    assert [path.name for path in stale if path.exists()] == []
    assert all(path.exists() for path in [*referenced, *young, unreadable_index, other_name])


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(select, "select"), reason="needs POSIX signals")
@pytest.mark.parametrize(
    "saver, kill_point, sweeper",
    [
        ("save", "data_fsync", "manager_start"),
        ("save", "data_fsync", "save_elsewhere"),
        ("save", "before_index_rename", "manager_start"),
        ("save", "before_index_rename", "save_elsewhere"),
        ("write", "before_index_rename", "rewrite_same_prefix"),
        ("save", "before_data_rename", "manager_start"),
        ("write", "before_data_rename", "save_elsewhere"),
    ],
)
def test_a_save_in_progress_in_another_process_is_not_swept(tmp_path, saver, kill_point, sweeper):
    function, k = KILL_POINTS[kill_point]
    with Child(tmp_path, "block", saver, function, str(k)) as child:
        directory = child.directory
        second = str(directory / ("ckpt-2" if saver == "save" else "ckpt"))
        child.expect("SAVED ")
        child.expect(f"BLOCKED {function} ")  # paused inside its second save, files half done
        in_progress = [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
        in_progress += [p for p in data_files(second) if p.name.endswith(".pending")]
        assert in_progress

        ours = checkpoint_child.make_objects()  # this process saves into the same directory meanwhile
        checkpoint_child.set_values(ours, 3)
        if sweeper == "manager_start":
            td.train.CheckpointManager(ours, str(directory), max_to_keep=1)
        elif sweeper == "save_elsewhere":
            ours.save(str(directory / "other"))
        else:
            ours.write(second)
        assert all(path.exists() for path in in_progress), sorted(p.name for p in directory.iterdir())

        child.resume()
        assert child.expect("SAVED ") == second
        assert child.expect("DONE") == ""
        assert child.exit_status() == 0
    assert_child_values(second, 2)  # the other process's save completed intact (its index came last)
