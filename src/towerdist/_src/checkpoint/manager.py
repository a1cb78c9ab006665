"""``td.train.CheckpointManager`` and the directory's ``checkpoint`` state file.

The state file (JSON, written atomically) names the latest checkpoint of a directory and
the ones a manager keeps::

    {"model_checkpoint_path": "ckpt-3",
     "all_model_checkpoint_paths": ["ckpt-1", "ckpt-2", "ckpt-3"],
     "all_model_checkpoint_timestamps": [1700000000.0, ...],
     "last_preserved_timestamp": 1699990000.0}

Paths inside the directory are stored relative to it, so a directory can be moved.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from towerdist._src.checkpoint import files
from towerdist._src.checkpoint.checkpoint import Checkpoint, require_outside_run

__all__ = ["CheckpointManager", "latest_checkpoint", "record_latest"]

STATE_FILE = "checkpoint"


def latest_checkpoint(checkpoint_dir: str, latest_filename: str | None = None) -> str | None:
    """The path prefix of the newest checkpoint in ``checkpoint_dir``, or None.

    None when the directory has no state file, or its latest checkpoint's files are gone.
    """
    state = _read_state(os.fspath(checkpoint_dir), latest_filename or STATE_FILE)
    if state is None:
        return None
    path = state.get("model_checkpoint_path")
    if not isinstance(path, str):
        return None
    path = _absolute(os.fspath(checkpoint_dir), path)
    return path if files.checkpoint_exists(path) else None


def record_latest(path: str) -> None:
    """Names ``path`` as the latest checkpoint in its directory's state file (``Checkpoint.save``)."""
    directory = os.path.dirname(path) or "."
    _write_state(directory, path, [path], [time.time()], None)


class CheckpointManager:
    """Saves numbered checkpoints into a directory and deletes all but the newest ``max_to_keep``.

    A new manager picks up the checkpoints its directory's state file lists, so a
    restarted job resumes with ``checkpoint.restore(manager.latest_checkpoint)``.

    Args:
      checkpoint: the ``td.train.Checkpoint`` to save.
      directory: where checkpoints go (created if missing).
      max_to_keep: how many checkpoints to keep (None: all).
      keep_checkpoint_every_n_hours: also keep one checkpoint per this many hours.
      checkpoint_name: the file prefix (``<directory>/<checkpoint_name>-<number>``).
      step_counter: a variable counting steps, with ``checkpoint_interval``.
      checkpoint_interval: with ``step_counter``, ``save()`` skips unless this many steps
        passed since the last save.
      init_fn: called by ``restore_or_initialize()`` when there is no checkpoint.

    Example:
      >>> manager = td.train.CheckpointManager(ckpt, "/tmp/run", max_to_keep=3)
      >>> ckpt.restore(manager.latest_checkpoint)     # None on the first run: restores nothing
      >>> manager.save()                               # '/tmp/run/ckpt-1'
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        directory: str,
        max_to_keep: int | None,
        keep_checkpoint_every_n_hours: float | None = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"CheckpointManager needs a td.train.Checkpoint. Got checkpoint={checkpoint!r}; wrap your objects: "
                f"td.train.Checkpoint(model=model, optimizer=optimizer)."
            )
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int)
                                        or max_to_keep <= 0):
            raise ValueError(f"Expected a positive integer or `None` for `max_to_keep`, got {max_to_keep!r}.")
        if checkpoint_interval is not None:
            if step_counter is None:
                raise ValueError("`step_counter` should be passed if `checkpoint_interval` is not None.")
            if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int) or \
                    checkpoint_interval <= 0:
                raise ValueError(f"`checkpoint_interval` must be a positive integer, got {checkpoint_interval!r}.")
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._max_to_keep = max_to_keep
        self._keep_every_seconds = None if keep_checkpoint_every_n_hours is None else \
            float(keep_checkpoint_every_n_hours) * 3600.0
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._init_fn = init_fn
        self._last_saved_step: int | None = None
        os.makedirs(self._directory, exist_ok=True)
        self._kept: dict[str, float] = {}  # path -> timestamp, oldest first
        self._latest: str | None = None
        self._last_preserved = time.time()
        state = _read_state(self._directory, STATE_FILE)
        if state is not None:
            paths = state.get("all_model_checkpoint_paths") or []
            stamps = state.get("all_model_checkpoint_timestamps") or []
            for k, path in enumerate(paths):
                absolute = _absolute(self._directory, path)
                if files.checkpoint_exists(absolute):
                    self._kept[absolute] = float(stamps[k]) if k < len(stamps) else time.time()
            self._latest = latest_checkpoint(self._directory)
            preserved = state.get("last_preserved_timestamp")
            if isinstance(preserved, (int, float)):
                self._last_preserved = float(preserved)

    @property
    def directory(self) -> str:
        """The directory checkpoints are saved in."""
        return self._directory

    @property
    def checkpoint(self) -> Checkpoint:
        """The managed checkpoint."""
        return self._checkpoint

    @property
    def checkpoint_interval(self) -> int | None:
        """The minimum number of steps between saves (with ``step_counter``)."""
        return self._checkpoint_interval

    @property
    def latest_checkpoint(self) -> str | None:
        """The path prefix of the newest checkpoint (None before the first save)."""
        return self._latest

    @property
    def checkpoints(self) -> list[str]:
        """The path prefixes of the checkpoints kept, oldest first."""
        return list(self._kept)

    def save(self, checkpoint_number: int | None = None, check_interval: bool = True) -> str | None:
        """Saves a checkpoint numbered ``checkpoint_number`` (default: the incremented save counter).

        Then deletes the oldest checkpoints beyond ``max_to_keep``. The new checkpoint is
        recorded in the state file before anything is deleted.

        Returns:
          The new checkpoint's path prefix, or None if skipped by ``checkpoint_interval``.
        """
        require_outside_run("CheckpointManager.save()")
        step = None
        if self._step_counter is not None:
            step = int(self._step_counter.numpy())
        if check_interval and self._checkpoint_interval is not None and self._last_saved_step is not None:
            assert step is not None
            if step - self._last_saved_step < self._checkpoint_interval:
                return None
        counter = self._checkpoint.save_counter
        counter.assign_add(1, read_value=False)
        if checkpoint_number is None:
            checkpoint_number = int(counter.numpy())
        try:
            path = self._checkpoint.write(f"{self._prefix}-{int(checkpoint_number)}")
        except BaseException:
            counter.assign_sub(1, read_value=False)
            raise
        self._kept.pop(path, None)  # re-saved: it becomes the newest
        self._kept[path] = time.time()
        self._latest = path
        self._last_saved_step = step
        self._record_state()
        self._sweep()
        self._record_state()
        return path

    def restore_or_initialize(self) -> str | None:
        """Restores the latest checkpoint if there is one, else calls ``init_fn``.

        Returns:
          The restored checkpoint's path, or None if it initialized instead.
        """
        if self._latest is not None:
            self._checkpoint.restore(self._latest)
            if self._step_counter is not None:
                self._last_saved_step = int(self._step_counter.numpy())
            return self._latest
        if self._init_fn is not None:
            self._init_fn()
        return None

    def _sweep(self) -> None:
        if self._max_to_keep is None:
            return
        while len(self._kept) > self._max_to_keep:
            path, stamp = next(iter(self._kept.items()))
            del self._kept[path]
            if self._keep_every_seconds is not None and stamp - self._last_preserved >= self._keep_every_seconds:
                self._last_preserved = stamp  # kept on disk for good, no longer managed
                continue
            files.remove_checkpoint(path)

    def _record_state(self) -> None:
        if self._latest is None:
            return
        _write_state(self._directory, self._latest, list(self._kept), list(self._kept.values()), self._last_preserved)


# --- the state file ---------------------------------------------------------------------


def _write_state(
    directory: str, latest: str, paths: list[str], stamps: list[float], last_preserved: float | None
) -> None:
    state: dict[str, Any] = {
        "model_checkpoint_path": _relative(directory, latest),
        "all_model_checkpoint_paths": [_relative(directory, p) for p in paths],
        "all_model_checkpoint_timestamps": stamps,
    }
    if last_preserved is not None:
        state["last_preserved_timestamp"] = last_preserved
    files.atomic_write(os.path.join(directory, STATE_FILE), lambda f: f.write(json.dumps(state, indent=1).encode()))


def _read_state(directory: str, name: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(directory, name), "rb") as stream:
            state = json.loads(stream.read().decode())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # not ours (e.g. TensorFlow's text-format state file) or damaged: no latest checkpoint
    return state if isinstance(state, dict) else None


def _relative(directory: str, path: str) -> str:
    if os.path.dirname(os.path.abspath(path)) == os.path.abspath(directory):
        return os.path.basename(path)
    return os.path.abspath(path)


def _absolute(directory: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(directory, path)
