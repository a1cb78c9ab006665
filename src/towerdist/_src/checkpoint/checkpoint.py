"""``td.train.Checkpoint``: save and restore variables, optimizers, metrics, modules and input iterators.

What is saved is one value per variable, whatever the strategy (``saving.py``), and one
opaque state per saveable object such as an input iterator (``saveable.py``). Restoring
assigns each value in cross-replica context, so a mirrored variable gets it on every
device and a SUM sync-on-read variable gets ``value / replicas`` on each copy. A
checkpoint therefore restores into any strategy and any number of replicas, inside or
outside ``strategy.scope()``. Restore is all or nothing (``restoring.py``); save is
checked first too: a variable whose dtype no checkpoint can hold is refused before a
file is written.

Under ``MultiWorkerMirroredStrategy`` saving is collective: every worker calls it, and
every worker computes the values (sync-on-read variables and distributed iterators
combine every worker's). Each distinct path is written by one worker: the chief's by the
chief, and a path only non-chief workers name (``<dir>/workertemp_1/ckpt``, TensorFlow's
tutorial pattern) by the first of them that names it. So on a shared filesystem where
every worker passes the same path, only the chief writes; a worker failing mid-save
makes every worker raise. Restoring is local unless the objects hold distributed
variables or collective saveables (``restoring.py``).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from towerdist._src import context
from towerdist._src.checkpoint import deferred, files, graph, restoring, saving
from towerdist._src.checkpoint.status import SAVE_COUNTER, CheckpointLoadStatus, InitializationOnlyStatus
from towerdist._src.failures import worded_at
from towerdist._src.multi_worker import workers as workers_lib
from towerdist._src.variables import creation
from towerdist._src.variables.variable import Variable

__all__ = ["Checkpoint", "CheckpointLoadStatus", "InitializationOnlyStatus", "require_outside_run", "write_files"]


class Checkpoint:
    """Groups trackable objects so they can be saved and restored together.

    Args:
      root: optional object whose own dependencies become the checkpoint's (as if passed
        one by one as keyword arguments).
      **kwargs: the objects to save, by name: variables, optimizers, metrics,
        ``td.Module``\\ s, input iterators (``iter(dataset)``, distributed iterators),
        other checkpoints, or lists/dicts of them.

    Example:
      >>> ckpt = td.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator)
      >>> path = ckpt.save("/tmp/ckpts/ckpt")        # '/tmp/ckpts/ckpt-1'
      >>> ckpt.restore(path).assert_consumed()

    Call ``save``, ``write`` and ``restore`` outside ``strategy.run`` (in cross-replica
    context or with no strategy).
    """

    def __init__(self, root: graph.Trackable | None = None, **kwargs: object) -> None:
        if root is not None and getattr(root, "_checkpoint_dependencies", None) is None:
            raise ValueError(
                f"Checkpoint was expecting root to be a trackable object (a td.Module, optimizer, metric or "
                f"Checkpoint), got {root!r}."
            )
        objects: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name == SAVE_COUNTER or name.startswith("_"):
                raise ValueError(
                    f"Checkpoint: the name {name!r} is reserved; pass the object under another keyword argument."
                )
            if not graph.is_trackable(value):
                raise ValueError(
                    f"Checkpoint was expecting {name} to be a trackable object (a td.Variable, td.Module, optimizer, "
                    f"metric, input iterator, Checkpoint, or a list or dict of them), got {value!r} of type "
                    f"{type(value).__name__}."
                )
            if root is not None and dict(root._checkpoint_dependencies()).get(name, value) is not value:
                raise ValueError(
                    f"Checkpoint: root already has a dependency named {name!r}, a different object than the {name} "
                    f"passed; pass it under another name."
                )
            objects[name] = value
        self._root = root
        self._objects = objects
        self._save_counter: Variable | None = None

    def __getattr__(self, name: str) -> Any:
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        root = self.__dict__.get("_root")
        if root is not None:
            found = dict(root._checkpoint_dependencies())
            if name in found:
                return found[name]
        raise AttributeError(f"'Checkpoint' object has no attribute {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        """Tracks a trackable object assigned after construction (as TensorFlow does); it takes a waiting value."""
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        if name == SAVE_COUNTER:
            raise AttributeError("Checkpoint.save_counter cannot be assigned: it counts save() calls.")
        if not graph.is_trackable(value):
            self._objects.pop(name, None)
            object.__setattr__(self, name, value)
            return
        missing = object()
        previous = self._objects.get(name, missing)
        self.__dict__.pop(name, None)
        self._objects[name] = value
        try:
            deferred.attached(self, value)
        except BaseException:
            if previous is missing:
                del self._objects[name]
            else:
                self._objects[name] = previous
            raise

    def __delattr__(self, name: str) -> None:
        if name in self._objects:
            del self._objects[name]
        else:
            object.__delattr__(self, name)

    @property
    def save_counter(self) -> Variable:
        """How many times :meth:`save` has run (an int64 variable, saved with the checkpoint).

        Created when first read, or by :meth:`save` or :meth:`restore` (which gives it the
        saved count), as in TensorFlow: until then :meth:`write` saves no count, and
        :meth:`read` restores none.
        """
        counter = self._save_counter
        if counter is None:
            counter = self._save_counter = creation.host_counter(SAVE_COUNTER)
            deferred.attached(self, counter)  # a restore may hold its value
        return counter

    def _tracked(self, name: str) -> Any:
        """The object saved under ``name``, or None."""
        return dict(self._checkpoint_dependencies()).get(name)

    def _track(self, name: str, value: object) -> None:
        """Saves ``value`` under ``name`` from now on (TensorFlow tracks attributes assigned after construction)."""
        if self._tracked(name) is not None or name == SAVE_COUNTER or not graph.is_trackable(value):
            raise ValueError(f"Checkpoint: cannot track {value!r} as {name!r}.")
        setattr(self, name, value)

    def _checkpoint_dependencies(self) -> list[tuple[str, Any]]:
        dependencies = dict(self._root._checkpoint_dependencies()) if self._root is not None else {}
        dependencies.update(self._objects)
        if self._save_counter is not None:
            dependencies[SAVE_COUNTER] = self._save_counter
        return list(dependencies.items())

    # --- saving --------------------------------------------------------------------------

    def save(self, file_prefix: str | bytes | os.PathLike[Any]) -> str:
        """Writes a numbered checkpoint ``<file_prefix>-<save_counter>`` and records it as the latest.

        Increments ``save_counter``, writes like :meth:`write`, then updates the directory's
        ``checkpoint`` state file so that ``td.train.latest_checkpoint(directory)`` finds it.

        Args:
          file_prefix: the path prefix (a ``str``, ``bytes`` or ``os.PathLike``).

        Returns:
          The checkpoint's path prefix as a ``str``, for :meth:`restore`.

        Raises:
          TypeError: ``file_prefix`` is not a path, or a variable's dtype cannot be saved.
          ValueError: as for :meth:`write`.
        """
        from towerdist._src.checkpoint.manager import record_latest  # noqa: PLC0415  (manager imports this)

        require_outside_run("Checkpoint.save()")
        with worded_at("Checkpoint.save()"):
            prefix = files.as_path(file_prefix, "file_prefix")
        counter = self.save_counter
        number = int(counter.numpy()) + 1
        counter.assign(number, read_value=False)
        try:
            path = f"{prefix}-{number}"
            wrote = write_files(self, path, "Checkpoint.save()")
        except BaseException:
            counter.assign(number - 1, read_value=False)
            raise
        workers = workers_lib.current()
        if workers is None:
            record_latest(path)
            return path
        # MultiWorkerMirroredStrategy: each worker that wrote keeps its directory's state
        # file; every worker returns once they are written.
        error: Exception | None = None
        if wrote:
            try:
                record_latest(path)
            except Exception as caught:  # agreed with the other workers, then re-raised
                error = caught
        workers.settle(error, "Checkpoint.save() (the state file)")
        return path

    def write(self, file_prefix: str | bytes | os.PathLike[Any]) -> str:
        """Writes the checkpoint at exactly ``file_prefix`` (``<prefix>.index`` and ``<prefix>.data-00000-of-00001``).

        The write is atomic: an earlier checkpoint at the same prefix stays readable until
        the new one is complete. Does not touch ``save_counter`` or the state file.
        Variables of bool, integer, float, complex, string (numpy ``str_`` and ``bytes_``),
        ``datetime64`` and ``timedelta64`` dtypes are saved; any other dtype is refused
        before a file is written. Input iterators are saved as their position.

        Under ``MultiWorkerMirroredStrategy`` every worker calls it; the chief writes its
        path, and a worker that passes a path of its own (one the chief does not pass)
        writes there too.

        Args:
          file_prefix: the path prefix (a ``str``, ``bytes`` or ``os.PathLike``).

        Returns:
          ``file_prefix`` as a ``str``.

        Raises:
          TypeError: ``file_prefix`` is not a path, or a variable's dtype cannot be saved
            (object, structured, void or numpy ``StringDType``).
          ValueError: a variable has no single value to save (sync-on-read with
            aggregation NONE), or an optimizer slot's variable is not in the checkpoint.
          FailedPreconditionError: an input iterator cannot save its position (its
            pipeline keeps state outside itself and the dataset's
            ``experimental_external_state_policy`` is FAIL).
        """
        require_outside_run("Checkpoint.write()")
        with worded_at("Checkpoint.write()"):
            prefix = files.as_path(file_prefix, "file_prefix")
        write_files(self, prefix, "Checkpoint.write()")
        return prefix

    # --- restoring -----------------------------------------------------------------------

    def restore(
        self, save_path: str | bytes | os.PathLike[Any] | None
    ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restores every variable and iterator of this checkpoint's objects from ``save_path``.

        Values are matched by key (see ``towerdist._src.checkpoint.graph``). Works inside
        or outside ``strategy.scope()`` and into any number of replicas.

        A value whose object does not exist yet waits for it, as in TensorFlow: a variable
        or iterator assigned to this checkpoint later (``ckpt.v = td.Variable(...)``), or
        created later in one of its ``td.Module``\\ s (a lazily built layer), takes its
        saved value when it is attached; an optimizer's slots take theirs when the
        optimizer creates them (on its first step or ``build``). Then ``save_counter`` is
        created, if it did not exist, and takes the saved count.

        Under ``MultiWorkerMirroredStrategy`` the restore is local (each worker reads the
        files itself, and one worker may restore alone) unless the objects hold
        distributed variables or distributed iterators: then every worker must call it,
        the chief reads the files and sends their content to the others, and a failure on
        one worker raises on all of them.

        Args:
          save_path: what :meth:`save`/:meth:`write` returned, or
            ``td.train.latest_checkpoint(dir)`` (a ``str``, ``bytes`` or
            ``os.PathLike``). None restores nothing.

        Returns:
          A status with ``assert_consumed()`` and friends.

        Raises:
          TypeError: ``save_path`` is not a path.
          NotFoundError: no checkpoint at ``save_path``.
          DataLossError: the files are truncated or corrupt (any byte of the index or the
            data file changed). No object is changed.
          ValueError: a saved value's shape or dtype differs from its variable's (string
            widths may differ, as long as no saved string would be cut short). No
            object is changed.
          FailedPreconditionError: an input iterator's saved position does not fit its
            pipeline (another dataset). No object is changed.
        """
        status = self._read(save_path, "Checkpoint.restore()")
        self.save_counter  # noqa: B018  (created after reading, so that it takes the saved count, as in TensorFlow)
        return status

    def read(self, save_path: str | bytes | os.PathLike[Any]) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restores from ``save_path`` as :meth:`restore` does, without creating ``save_counter``.

        The counterpart of :meth:`write`: a checkpoint written by ``write()`` and read by
        ``read()`` is fully consumed. (``restore()`` creates ``save_counter``, so after
        ``write()`` its ``assert_consumed()`` fails on the counter, and ``read()`` of a
        checkpoint from ``save()`` leaves its count unused, as in TensorFlow.)
        """
        return self._read(save_path, "Checkpoint.read()")

    def _read(
        self, save_path: str | bytes | os.PathLike[Any] | None, api: str
    ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        require_outside_run(api)
        if save_path is None:
            return InitializationOnlyStatus()
        with worded_at(api):
            prefix = files.as_path(save_path, "save_path")
            found = graph.walk(self._checkpoint_dependencies())
            collective = restoring.agreed_by_workers(found)
            entries, arrays = restoring.read(prefix, collective, api)
            plan = restoring.prepare(found, entries, arrays, prefix, collective, api)
        restoring.apply(plan)
        restore = deferred.Restore(self, prefix, entries, arrays, plan.matched | set(plan.deferred_keys))
        restore.slots.update(plan.deferred_keys)
        restore.wait(found)
        return CheckpointLoadStatus(self, restore)

    def __repr__(self) -> str:
        names = ", ".join(name for name, _ in self._checkpoint_dependencies() if name != SAVE_COUNTER)
        return f"<td.train.Checkpoint({names})>"


def write_files(checkpoint: Checkpoint, prefix: str, api: str) -> bool:
    """Writes ``checkpoint``'s objects at ``prefix``; True if this process wrote the files.

    Without other workers it always writes. Under ``MultiWorkerMirroredStrategy`` (a
    collective): every worker computes the values, the workers compare their prefixes,
    and each distinct prefix is written by the lowest-ranked worker that names it (the
    chief's by the chief). Any failure raises on every worker.
    """
    found = graph.walk(checkpoint._checkpoint_dependencies())
    workers = workers_lib.current()
    if workers is None:
        with worded_at(api):
            files.write_checkpoint(prefix, *saving.values_to_save(found, prefix))
        return True
    error: Exception | None = None
    try:
        with worded_at(api):
            arrays, entries = saving.values_to_save(found, prefix)
    except Exception as caught:  # agreed with the other workers, then re-raised
        error = caught
    workers.settle(error, api)
    digests = workers.agree_extra(f"{api} (where each worker writes)", _path_digest(prefix), None)
    writes_here = digests.index(digests[workers.rank]) == workers.rank
    if writes_here:
        try:
            files.write_checkpoint(prefix, arrays, entries)
        except Exception as caught:  # agreed with the other workers, then re-raised
            error = caught
    workers.settle(error, f"{api} (writing the files)")
    return writes_here


def _path_digest(prefix: str) -> int:
    """A number that tells the workers' paths apart (63 bits of the absolute path's SHA-256)."""
    return int.from_bytes(hashlib.sha256(os.path.abspath(prefix).encode()).digest()[:8], "big") >> 1


def require_outside_run(api: str) -> None:
    """Checkpoints are saved and restored between steps, never inside ``strategy.run``."""
    context.require_outside_run(api, "save and restore checkpoints between steps")
