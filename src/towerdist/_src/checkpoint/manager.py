"""``td.train.CheckpointManager`` and the directory's ``checkpoint`` state file.

The state file (JSON, written atomically) names the latest checkpoint of a directory and
the ones a manager keeps::

    {"model_checkpoint_path": "ckpt-3",
     "all_model_checkpoint_paths": ["ckpt-1", "ckpt-2", "ckpt-3"],
     "all_model_checkpoint_timestamps": [1700000000.0, ...],
     "last_preserved_timestamp": 1699990000.0}

Paths inside the directory are stored relative to it, so a directory can be moved.

A state file that cannot be used (not JSON, a field of the wrong type, a timestamp that
is not a finite number, paths and timestamps of different lengths) is not trusted, but
not fatal either: with a warning naming the file and the fault, ``latest_checkpoint``
and ``CheckpointManager`` fall back on the newest complete numbered checkpoint in the
directory (by index modification time). The manager then manages only that one: older
checkpoints stay on disk, because the damaged file no longer says which of them were
preserved by ``keep_checkpoint_every_n_hours``. The next save rewrites the file.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable
from typing import Any

from towerdist._src.atomic_file import AtomicFile
from towerdist._src.checkpoint import files, graph, restoring
from towerdist._src.checkpoint.checkpoint import Checkpoint, require_outside_run, write_files
from towerdist._src.failures import worded_at
from towerdist._src.multi_worker import workers as workers_lib
from towerdist._src.variables.variable import Variable

__all__ = ["CheckpointManager", "latest_checkpoint", "record_latest"]

STATE_FILE = "checkpoint"


def latest_checkpoint(checkpoint_dir: str | bytes | os.PathLike[Any], latest_filename: str | None = None) -> str | None:
    """The path prefix of the newest checkpoint in ``checkpoint_dir``, or None.

    Args:
      checkpoint_dir: the directory (a ``str``, ``bytes`` or ``os.PathLike``).
      latest_filename: the state file's name (default ``"checkpoint"``).

    Returns:
      The prefix the directory's state file names as the latest, or None when there is no
      state file or that checkpoint's files are gone. If the state file is unusable
      (corrupt, or not towerdist's), warns and returns the newest complete numbered
      checkpoint (``<name>-<number>``) in the directory instead, or None if there is none.

    Raises:
      TypeError: ``checkpoint_dir`` is not a path.
    """
    with worded_at("latest_checkpoint()"):
        directory = files.as_path(checkpoint_dir, "checkpoint_dir")
    state_path = os.path.join(directory, latest_filename or STATE_FILE)
    state, problem = _read_state(state_path)
    if problem is not None:
        found = _numbered_checkpoints(directory, None)
        latest = found[-1][0] if found else None
        outcome = (
            f"using the newest complete numbered checkpoint in the directory instead: {latest}"
            if latest is not None
            else "the directory holds no complete numbered checkpoint, so there is no latest one"
        )
        warnings.warn(
            f"latest_checkpoint(): the state file {state_path} is unusable ({problem}); {outcome}. The next "
            f"Checkpoint.save() or CheckpointManager.save() in {directory} rewrites it.",
            RuntimeWarning,
            stacklevel=2,
        )
        return latest
    if state is None:
        return None
    path = _absolute(directory, state["model_checkpoint_path"])
    return path if files.checkpoint_exists(path) else None


def record_latest(path: str) -> None:
    """Names ``path`` as the latest checkpoint in its directory's state file (``Checkpoint.save``)."""
    directory = os.path.dirname(path) or "."
    _write_state(directory, path, [path], [time.time()], None)


class CheckpointManager:
    """Saves numbered checkpoints into a directory and deletes all but the newest ``max_to_keep``.

    A new manager picks up the checkpoints a manager listed in its directory's state file,
    so a restarted job resumes with ``checkpoint.restore(manager.latest_checkpoint)``.
    Checkpoints it did not save (``Checkpoint.save()``/``write()``, another name) may be
    the latest one, but are never deleted.

    A manager also removes what crashed saves left in its directory: temporary files and
    data files no index names, once they have not been modified for an hour (a younger
    one may be another process's save in progress). It does so when it starts and on
    every save.

    Under ``MultiWorkerMirroredStrategy`` every worker calls ``save()``. The chief writes
    its directory; a worker whose directory is its own (TensorFlow's tutorial gives each
    non-chief ``<dir>/workertemp_<id>``) writes there too, state file included, from its
    first save on; a worker whose directory is the chief's writes nothing.

    Args:
      checkpoint: the ``td.train.Checkpoint`` to save.
      directory: where checkpoints go (created if missing); a ``str``, ``bytes`` or
        ``os.PathLike``.
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
        step_counter: Variable | None = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
    ) -> None:
        """Creates the manager; see the class docstring.

        Raises:
          TypeError: ``checkpoint`` is not a ``td.train.Checkpoint``, or ``directory`` is
            not a path.
          ValueError: ``max_to_keep`` or ``checkpoint_interval`` is not a positive integer.

        Warns:
          RuntimeWarning: the directory's state file is unusable; the manager starts from
            the newest complete checkpoint in the directory.
        """
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"CheckpointManager needs a td.train.Checkpoint. Got checkpoint={checkpoint!r}; wrap your objects: "
                f"td.train.Checkpoint(model=model, optimizer=optimizer)."
            )
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep <= 0
        ):
            raise ValueError(f"Expected a positive integer or `None` for `max_to_keep`, got {max_to_keep!r}.")
        if checkpoint_interval is not None:
            if step_counter is None:
                raise ValueError("`step_counter` should be passed if `checkpoint_interval` is not None.")
            if (
                isinstance(checkpoint_interval, bool)
                or not isinstance(checkpoint_interval, int)
                or checkpoint_interval <= 0
            ):
                raise ValueError(f"`checkpoint_interval` must be a positive integer, got {checkpoint_interval!r}.")
        self._checkpoint = checkpoint
        with worded_at("CheckpointManager()"):
            self._directory = files.as_path(directory, "directory")
        self._max_to_keep = max_to_keep
        self._keep_every_seconds = (
            None if keep_checkpoint_every_n_hours is None else float(keep_checkpoint_every_n_hours) * 3600.0
        )
        self._name = checkpoint_name
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._init_fn = init_fn
        self._last_saved_step: int | None = None
        # Whether this process changes the directory: without other workers it does; under
        # MultiWorkerMirroredStrategy the chief does, and another worker once a save showed
        # that the directory is its own (not the chief's).
        self._writes_here = _is_chief()
        self._swept = False
        if self._writes_here:
            os.makedirs(self._directory, exist_ok=True)
        self._kept: dict[str, float] = {}  # path -> timestamp, oldest first
        self._latest: str | None = None
        self._last_preserved = time.time()
        state_path = os.path.join(self._directory, STATE_FILE)
        state, problem = _read_state(state_path)
        if problem is not None:
            self._recover(state_path, problem)
        elif state is not None:
            latest = _absolute(self._directory, state["model_checkpoint_path"])
            self._latest = latest if files.checkpoint_exists(latest) else None
            self._adopt(state)
        self._sweep_crash_leftovers()

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

        With ``checkpoint_interval``, a save is skipped (None is returned) unless that many
        steps of ``step_counter`` passed since the last save; ``check_interval=False`` saves
        regardless, unless a checkpoint was already saved at the current step.

        Args:
          checkpoint_number: the number in the checkpoint's name (default: the save counter).
          check_interval: whether to skip a save within ``checkpoint_interval`` steps of the last.

        Returns:
          The new checkpoint's path prefix, or None if skipped.
        """
        require_outside_run("CheckpointManager.save()")
        step = None
        if self._step_counter is not None:
            step = int(self._step_counter.numpy())
        if self._checkpoint_interval is not None and self._last_saved_step is not None and step is not None:
            if step == self._last_saved_step:
                return None  # saved at this step already: even check_interval=False writes nothing (as TF)
            if check_interval and step - self._last_saved_step < self._checkpoint_interval:
                return None
        counter = self._checkpoint.save_counter
        counter.assign_add(1, read_value=False)
        if checkpoint_number is None:
            checkpoint_number = int(counter.numpy())
        try:
            path = f"{self._prefix}-{int(checkpoint_number)}"
            self._writes_here = write_files(self._checkpoint, path, "CheckpointManager.save()")
        except BaseException:
            counter.assign_sub(1, read_value=False)
            raise
        self._kept.pop(path, None)  # re-saved: it becomes the newest
        self._kept[path] = time.time()
        self._latest = path
        self._last_saved_step = step
        workers = workers_lib.current()
        error: Exception | None = None
        try:
            self._sweep_crash_leftovers()  # a worker's first save into a directory of its own
            self._record_state()
            self._sweep()
            self._record_state()
        except Exception as caught:  # with several workers: agreed with the others, then re-raised
            if workers is None:
                raise
            error = caught
        if workers is not None:  # every worker returns once the directories are up to date
            workers.settle(error, "CheckpointManager.save() (the state file)")
        return path

    def restore_or_initialize(self) -> str | None:
        """Restores the latest checkpoint if there is one, else calls ``init_fn``.

        Under ``MultiWorkerMirroredStrategy``, when the restore is collective (the objects
        hold distributed variables or distributed iterators; see ``Checkpoint.restore``)
        every worker calls it and they decide together, from the chief's view of the
        directory; otherwise each worker decides from its own.

        Returns:
          The restored checkpoint's path, or None if it initialized instead.
        """
        workers = workers_lib.current()
        if workers is not None and restoring.agreed_by_workers(graph.walk(self._checkpoint._checkpoint_dependencies())):
            self._latest = workers.run_on_chief(lambda: self._latest, "CheckpointManager.restore_or_initialize()")
        if self._latest is not None:
            self._checkpoint.restore(self._latest)
            if self._step_counter is not None:
                self._last_saved_step = int(self._step_counter.numpy())
            return self._latest
        if self._init_fn is not None:
            self._init_fn()
        return None

    def _adopt(self, state: dict[str, Any]) -> None:
        """Takes over the checkpoints a manager listed in the state file, and none other.

        Only a manager records ``last_preserved_timestamp``; a state file without it was
        written by ``Checkpoint.save()`` (towerdist's or TensorFlow's), whose checkpoints no
        manager may delete. Of a manager's list, the entries saved after the last preserved
        one are managed (TensorFlow's rule); those without a timestamp are not.
        """
        if "last_preserved_timestamp" not in state:
            return
        self._last_preserved = float(state["last_preserved_timestamp"])
        now = time.time()
        stamps = state.get("all_model_checkpoint_timestamps", [])
        for path, stamp in zip(state.get("all_model_checkpoint_paths", []), stamps):
            absolute = _absolute(self._directory, path)
            stamp = min(float(stamp), now)  # a clock that went back must not keep a checkpoint forever
            if stamp > self._last_preserved and files.checkpoint_exists(absolute):
                self._kept[absolute] = stamp

    def _recover(self, state_path: str, problem: str) -> None:
        """Starts from the newest complete checkpoint of this manager's name (an unusable state file)."""
        found = _numbered_checkpoints(self._directory, self._name)
        if found:
            newest, stamp = found[-1]
            self._kept[newest] = stamp
            self._latest = newest
            others = [path for path, _ in found[:-1]]
            outcome = f"it starts from the newest complete checkpoint in the directory, {newest}"
            if others:
                outcome += (
                    f", and leaves the older ones on disk, unmanaged (it never deletes them, since it cannot tell "
                    f"which were preserved): {others}"
                )
        else:
            outcome = f"the directory holds no complete checkpoint named {self._name}-<number>, so it starts empty"
        warnings.warn(
            f"CheckpointManager: the state file {state_path} is unusable ({problem}); {outcome}. Its next save "
            f"rewrites the state file.",
            RuntimeWarning,
            stacklevel=3,
        )

    def _sweep_crash_leftovers(self) -> None:
        """Removes stale temporary files and unreferenced data files of ``<name>-<number>`` checkpoints (once)."""
        if self._swept or not self._writes_here:
            return
        self._swept = True
        files.sweep_temporaries(self._directory)
        numbered = re.compile(re.escape(self._name) + r"-\d+")
        names = _listdir(self._directory)
        stems = {name.partition(".data-")[0] for name in names if ".data-" in name}
        for stem in sorted(stem for stem in stems if numbered.fullmatch(stem)):
            files.sweep_orphans(os.path.join(self._directory, stem), names=names)

    def _sweep(self) -> None:
        if self._max_to_keep is None:
            return
        while len(self._kept) > self._max_to_keep:
            path, stamp = next(iter(self._kept.items()))
            del self._kept[path]
            if self._keep_every_seconds is not None and stamp - self._last_preserved >= self._keep_every_seconds:
                self._last_preserved = stamp  # kept on disk for good, no longer managed
                continue
            if self._writes_here:
                files.remove_checkpoint(path)

    def _record_state(self) -> None:
        if self._latest is None or not self._writes_here:
            return
        _write_state(self._directory, self._latest, list(self._kept), list(self._kept.values()), self._last_preserved)


def _is_chief() -> bool:
    """True without other workers, and on the chief (worker 0) of a MultiWorkerMirroredStrategy."""
    workers = workers_lib.current()
    return workers is None or workers.rank == 0


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
    with AtomicFile(os.path.join(directory, STATE_FILE)) as stream:
        stream.write(json.dumps(state, indent=1).encode())


def _read_state(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(state, None)``; ``(None, None)`` if there is no state file; ``(None, problem)`` if it is unusable."""
    try:
        with open(path, "rb") as stream:
            text = stream.read().decode()
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except IsADirectoryError:
        return None, "it is a directory"
    except UnicodeDecodeError:
        return None, "it is not UTF-8 text"
    try:
        state = json.loads(text)
    except json.JSONDecodeError as error:
        return None, f"it is not JSON ({error}); TensorFlow's text-format state files are not read"
    problem = _state_problem(state)
    return (None, problem) if problem is not None else (state, None)


def _state_problem(state: object) -> str | None:
    """What makes a parsed state file unusable, or None."""
    if not isinstance(state, dict):
        return f"it holds a JSON {type(state).__name__}, not an object"
    if not isinstance(state.get("model_checkpoint_path"), str):
        return f"model_checkpoint_path is {state.get('model_checkpoint_path')!r}, not a path"
    paths = state.get("all_model_checkpoint_paths", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return f"all_model_checkpoint_paths is {paths!r}, not a list of paths"
    stamps = state.get("all_model_checkpoint_timestamps", [])
    if not isinstance(stamps, list):
        return f"all_model_checkpoint_timestamps is {stamps!r}, not a list"
    for k, stamp in enumerate(stamps):
        if not _is_time(stamp):
            return f"all_model_checkpoint_timestamps[{k}] is {stamp!r}, not a number of seconds"
    if "all_model_checkpoint_timestamps" in state and len(stamps) != len(paths):
        return f"it lists {len(paths)} checkpoints but {len(stamps)} timestamps"
    if "last_preserved_timestamp" in state and not _is_time(state["last_preserved_timestamp"]):
        return f"last_preserved_timestamp is {state['last_preserved_timestamp']!r}, not a number of seconds"
    return None


def _is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbered_checkpoints(directory: str, name: str | None) -> list[tuple[str, float]]:
    """``(prefix, index modification time)`` of each complete ``<name>-<number>`` checkpoint, oldest first."""
    numbered = re.compile((".+" if name is None else re.escape(name)) + r"-(\d+)\.index(?:\.json)?")
    found: dict[str, tuple[float, int]] = {}
    for entry in _listdir(directory):
        match = numbered.fullmatch(entry)
        if match is None:
            continue
        path = os.path.join(directory, entry)
        try:
            modified = os.stat(path).st_mtime
        except OSError:
            continue
        prefix = path[: path.rindex(".index")]
        if prefix not in found or modified > found[prefix][0]:  # a version 3 index beside a version 2 one
            found[prefix] = (modified, int(match.group(1)))
    return [(prefix, modified) for prefix, (modified, _) in sorted(found.items(), key=lambda f: (f[1], f[0]))]


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _relative(directory: str, path: str) -> str:
    if os.path.dirname(os.path.abspath(path)) == os.path.abspath(directory):
        return os.path.basename(path)
    return os.path.abspath(path)


def _absolute(directory: str, path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(directory, path)
