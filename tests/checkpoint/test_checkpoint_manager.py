"""``td.train.CheckpointManager``: numbering, retention, the state file, ``latest_checkpoint``."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import towerdist as td
from towerdist._src.checkpoint import files

from checkpoint_helpers import (
    assert_files,
    counter_checkpoint,
    data_files,
    index_file,
    save_numbered,
    saved_counter,
    state_file,
)

# --- 8. CheckpointManager ---------------------------------------------------------------------


def test_manager_keeps_the_newest_max_to_keep_and_records_them(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    assert manager.directory == str(tmp_path) and manager.checkpoint is ckpt

    paths = save_numbered(manager, v, 5)

    assert paths == [str(tmp_path / f"ckpt-{n}") for n in range(1, 6)]
    assert manager.checkpoints == paths[-2:]
    assert manager.latest_checkpoint == paths[-1] == td.train.latest_checkpoint(str(tmp_path))
    assert_files(tmp_path, 4, 5)  # index and data of the older ones are gone
    state = state_file(tmp_path)
    assert state["model_checkpoint_path"] == "ckpt-5"
    assert state["all_model_checkpoint_paths"] == ["ckpt-4", "ckpt-5"]
    assert len(state["all_model_checkpoint_timestamps"]) == 2
    restored, w = counter_checkpoint()
    restored.restore(manager.checkpoints[0]).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 4, np.float32))


def test_manager_with_max_to_keep_none_keeps_everything(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=None)
    paths = save_numbered(manager, v, 4)
    assert manager.checkpoints == paths
    assert_files(tmp_path, 1, 2, 3, 4)
    assert state_file(tmp_path)["all_model_checkpoint_paths"] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]


def test_a_new_manager_recovers_the_checkpoints_and_goes_on(tmp_path):
    ckpt, v = counter_checkpoint()
    first = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3)
    save_numbered(first, v, 4)

    resumed_ckpt, w = counter_checkpoint()
    second = td.train.CheckpointManager(resumed_ckpt, str(tmp_path), max_to_keep=3)
    assert second.checkpoints == first.checkpoints == [str(tmp_path / f"ckpt-{n}") for n in (2, 3, 4)]
    assert second.latest_checkpoint == first.latest_checkpoint
    resumed_ckpt.restore(second.latest_checkpoint).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 4, np.float32))
    assert save_numbered(second, w, 1) == [str(tmp_path / "ckpt-5")]  # numbering continues from save_counter
    assert second.checkpoints == [str(tmp_path / f"ckpt-{n}") for n in (3, 4, 5)]
    assert_files(tmp_path, 3, 4, 5)


def test_a_new_manager_skips_listed_checkpoints_whose_files_are_gone(tmp_path):
    ckpt, v = counter_checkpoint()
    save_numbered(td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3), v, 3)
    os.remove(index_file(tmp_path / "ckpt-2"))
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3)
    assert manager.checkpoints == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-3")]


def test_manager_checkpoint_number_names_the_file_and_still_counts_saves(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2, checkpoint_name="model")
    assert manager.save(checkpoint_number=100) == str(tmp_path / "model-100")
    assert manager.save(checkpoint_number=np.int64(7)) == str(tmp_path / "model-7")
    assert saved_counter(ckpt) == 2
    assert manager.save() == str(tmp_path / "model-3")
    assert manager.checkpoints == [str(tmp_path / "model-7"), str(tmp_path / "model-3")]
    assert td.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model-3")
    assert not index_file(tmp_path / "model-100").exists()


def test_manager_checkpoint_interval_skips_saves_until_enough_steps(tmp_path):
    ckpt, _ = counter_checkpoint()
    step = td.Variable(np.int64(0), trainable=False)
    manager = td.train.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=None, step_counter=step, checkpoint_interval=3
    )
    assert manager.checkpoint_interval == 3
    saved_at = {}
    for current in range(8):
        step.assign(current)
        saved_at[current] = manager.save()
    assert [s for s, path in saved_at.items() if path is not None] == [0, 3, 6]
    assert saved_at[6] == str(tmp_path / "ckpt-3")
    step.assign(7)
    assert manager.save(check_interval=False) == str(tmp_path / "ckpt-4")  # forced
    assert manager.save() is None  # the forced save counts: 7 - 7 < 3


def test_a_manager_never_deletes_checkpoints_saved_by_checkpoint_save(tmp_path):
    # TensorFlow 2.21 (its testContinueFromUnmanaged): Checkpoint.save(prefix) twice, then a manager
    # with max_to_keep=2: latest 'unusual_prefix-2', checkpoints [], save_counter 2; three saves
    # list ['ckpt-3'], ['ckpt-3', 'ckpt-4'], ['ckpt-4', 'ckpt-5']; unusual_prefix-1 and -2 stay.
    ckpt, _ = counter_checkpoint()
    first = ckpt.save(str(tmp_path / "unusual_prefix"))
    second = ckpt.save(str(tmp_path / "unusual_prefix"))
    resumed, _ = counter_checkpoint()
    manager = td.train.CheckpointManager(resumed, str(tmp_path), max_to_keep=2)
    assert manager.latest_checkpoint == second
    assert manager.checkpoints == []
    resumed.restore(manager.latest_checkpoint)
    assert saved_counter(resumed) == 2
    lists = []
    for _ in range(3):
        manager.save()
        lists.append([os.path.basename(p) for p in manager.checkpoints])
    assert lists == [["ckpt-3"], ["ckpt-3", "ckpt-4"], ["ckpt-4", "ckpt-5"]]
    assert files.checkpoint_exists(first) and files.checkpoint_exists(second)
    again = td.train.CheckpointManager(resumed, str(tmp_path), max_to_keep=2)
    assert [os.path.basename(p) for p in again.checkpoints] == ["ckpt-4", "ckpt-5"]


def test_a_manager_never_deletes_a_checkpoint_written_with_checkpoint_write(tmp_path):
    # TensorFlow 2.21: Checkpoint.write('<dir>/unusual_prefix-2') then a manager (max_to_keep=1):
    # latest None, checkpoints []; its saves never touch the written checkpoint's files.
    ckpt, _ = counter_checkpoint()
    written = ckpt.write(str(tmp_path / "unusual_prefix-2"))
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    for _ in range(3):
        manager.save()
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-3"]
    assert files.checkpoint_exists(written)


def test_manager_with_an_interval_saves_once_per_step_even_when_forced(tmp_path):
    # TensorFlow 2.21, checkpoint_interval=10: step 0 save(check_interval=False) twice -> a path,
    # then None; save() -> None; step 5: save() None, forced save a path, forced again None;
    # step 10: save() None (5 steps since the forced save), forced a path; step 12 None; 25 a path;
    # save(checkpoint_number=7, check_interval=False) at step 25 again -> None.
    ckpt, _ = counter_checkpoint()
    step = td.Variable(np.int64(0), trainable=False)
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=5, step_counter=step, checkpoint_interval=10)
    outcomes = []
    for value, check in [(0, False), (0, False), (0, True), (5, True), (5, False), (5, False), (10, True),
                         (10, False), (12, True), (25, True), (25, False)]:
        step.assign(value)
        path = manager.save(check_interval=check) if value != 25 or check else manager.save(7, check_interval=False)
        outcomes.append(None if path is None else os.path.basename(path))
    assert outcomes == ["ckpt-1", None, None, None, "ckpt-2", None, None, "ckpt-3", None, "ckpt-4", None]
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]


def test_manager_without_an_interval_saves_every_time_at_one_step(tmp_path):
    # TensorFlow 2.21: a step_counter without checkpoint_interval: three saves at one step write three.
    ckpt, _ = counter_checkpoint()
    step = td.Variable(np.int64(3), trainable=False)
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=5, step_counter=step)
    paths = [manager.save(), manager.save(), manager.save(check_interval=False)]
    assert [os.path.basename(p) for p in paths] == ["ckpt-1", "ckpt-2", "ckpt-3"]


def test_restore_or_initialize_calls_init_fn_only_when_there_is_no_checkpoint(tmp_path):
    calls = []
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=1, init_fn=lambda: calls.append(v.assign(np.ones(4, np.float32)))
    )
    assert manager.restore_or_initialize() is None
    assert len(calls) == 1
    v.assign(np.full(4, 2.5, np.float32))
    path = manager.save()

    restored, w = counter_checkpoint()
    again = td.train.CheckpointManager(
        restored, str(tmp_path), max_to_keep=1, init_fn=lambda: calls.append("called")
    )
    assert again.restore_or_initialize() == path
    assert len(calls) == 1
    np.testing.assert_array_equal(w.numpy(), np.full(4, 2.5, np.float32))
    empty = td.train.CheckpointManager(counter_checkpoint()[0], str(tmp_path / "empty"), max_to_keep=1)
    assert empty.restore_or_initialize() is None  # no init_fn: nothing to do


@pytest.mark.parametrize("max_to_keep", [0, -1, 1.5, True, "3"])
def test_manager_rejects_an_invalid_max_to_keep(tmp_path, max_to_keep):
    with pytest.raises(ValueError, match=r"^Expected a positive integer or `None` for `max_to_keep`, got"):
        td.train.CheckpointManager(counter_checkpoint()[0], str(tmp_path), max_to_keep=max_to_keep)


@pytest.mark.parametrize(
    "interval, with_step_counter, first_words",
    [
        (2, False, "`step_counter` should be passed if `checkpoint_interval` is not None."),
        (0, True, "`checkpoint_interval` must be a positive integer, got 0."),
        (1.5, True, "`checkpoint_interval` must be a positive integer, got 1.5."),
    ],
)
def test_manager_rejects_bad_interval_arguments(tmp_path, interval, with_step_counter, first_words):
    step_counter = td.Variable(np.int64(0)) if with_step_counter else None
    with pytest.raises(ValueError, match=f"^{re.escape(first_words)}"):
        td.train.CheckpointManager(
            counter_checkpoint()[0], str(tmp_path), max_to_keep=1, step_counter=step_counter,
            checkpoint_interval=interval,
        )


def test_manager_needs_a_checkpoint(tmp_path):
    with pytest.raises(TypeError, match="^CheckpointManager needs a td.train.Checkpoint"):
        td.train.CheckpointManager({"v": td.Variable(1.0)}, str(tmp_path), max_to_keep=1)


def test_manager_keep_checkpoint_every_n_hours_keeps_swept_files_on_disk(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1, keep_checkpoint_every_n_hours=0.0)
    save_numbered(manager, v, 3)
    assert manager.checkpoints == [str(tmp_path / "ckpt-3")]
    assert_files(tmp_path, 1, 2, 3)  # no longer managed, but preserved


def test_latest_checkpoint_is_none_without_a_complete_latest_checkpoint(tmp_path):
    assert td.train.latest_checkpoint(str(tmp_path)) is None  # empty directory
    assert td.train.latest_checkpoint(str(tmp_path / "no-such-dir")) is None
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    save_numbered(manager, v, 2)
    assert td.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-2")
    os.remove(index_file(tmp_path / "ckpt-2"))
    for data in data_files(tmp_path / "ckpt-2"):
        data.unlink()
    assert td.train.latest_checkpoint(str(tmp_path)) is None  # ckpt-1 is complete, but not the latest
