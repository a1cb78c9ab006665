"""``td.train.Checkpoint``: save and restore variables, optimizers, metrics and modules.

What is saved is one value per variable, whatever the strategy: the common value of a
mirrored variable, the aggregate of a sync-on-read one (its SUM, MEAN or first copy).
Restoring assigns that value in cross-replica context, so a mirrored variable gets it on
every device and a SUM sync-on-read variable gets ``value / replicas`` on each copy. A
checkpoint therefore restores into any strategy and any number of replicas, inside or
outside ``strategy.scope()``.

Restore is all or nothing: the files are verified (the index's and the data file's
SHA-256, sizes, shapes, dtypes) and every value is matched to its variable before the
first one is assigned. Save is checked first too: a variable whose dtype no checkpoint
can hold is refused before a file is written.

Under ``MultiWorkerMirroredStrategy`` saving and restoring are collective: every worker calls
them. Every worker reads the values; only the chief (worker 0) writes files, once every
worker has its values (a worker failing mid-save makes every worker raise, and no file
changes). Restoring reads the files once, on the chief, and broadcasts the values.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from towerdist._src import backend, context
from towerdist._src.checkpoint import files, graph
from towerdist._src.failures import worded_at
from towerdist._src.multi_worker import workers as workers_lib
from towerdist._src.variable_enums import VariableAggregation
from towerdist._src.variables import creation
from towerdist._src.variables.aggregating_variable import AggregatingVariable
from towerdist._src.variables.distributed_variable import DistributedVariable, SyncOnReadVariable
from towerdist._src.variables.variable import ASSIGN, Variable, to_array

__all__ = ["Checkpoint", "CheckpointLoadStatus", "InitializationOnlyStatus"]

_SAVE_COUNTER = "save_counter"


class Checkpoint:
    """Groups trackable objects so they can be saved and restored together.

    Args:
      root: optional object whose own dependencies become the checkpoint's (as if passed
        one by one as keyword arguments).
      **kwargs: the objects to save, by name: variables, optimizers, metrics,
        ``td.Module``\\ s, other checkpoints, or lists/dicts of them.

    Example:
      >>> ckpt = td.train.Checkpoint(model=model, optimizer=optimizer)
      >>> path = ckpt.save("/tmp/ckpts/ckpt")        # '/tmp/ckpts/ckpt-1'
      >>> ckpt.restore(path).assert_consumed()

    Call ``save``, ``write`` and ``restore`` outside ``strategy.run`` (in cross-replica
    context or with no strategy).
    """

    def __init__(self, root: Any = None, **kwargs: Any) -> None:
        objects: dict[str, Any] = {}
        if root is not None:
            dependencies = getattr(root, "_checkpoint_dependencies", None)
            if dependencies is None:
                raise ValueError(
                    f"Checkpoint was expecting root to be a trackable object (a td.Module, optimizer, metric or "
                    f"Checkpoint), got {root!r}."
                )
            objects.update(dependencies())
        for name, value in kwargs.items():
            if name == _SAVE_COUNTER or name.startswith("_"):
                raise ValueError(
                    f"Checkpoint: the name {name!r} is reserved; pass the object under another keyword argument."
                )
            if not graph.is_trackable(value):
                raise ValueError(
                    f"Checkpoint was expecting {name} to be a trackable object (a td.Variable, td.Module, optimizer, "
                    f"metric, Checkpoint, or a list or dict of them), got {value!r} of type {type(value).__name__}."
                )
            objects[name] = value
        self._objects = objects
        self._save_counter: Variable | None = None

    def __getattr__(self, name: str) -> Any:
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"'Checkpoint' object has no attribute {name!r}")

    @property
    def save_counter(self) -> Variable:
        """How many times :meth:`save` has run (an int64 variable, saved with the checkpoint)."""
        if self._save_counter is None:
            self._save_counter = creation.host_counter(_SAVE_COUNTER)
        return self._save_counter

    def _tracked(self, name: str) -> Any:
        """The object saved under ``name``, or None."""
        return self._objects.get(name)

    def _track(self, name: str, value: Any) -> None:
        """Saves ``value`` under ``name`` from now on (TensorFlow tracks attributes assigned after construction)."""
        if name in self._objects or name == _SAVE_COUNTER or not graph.is_trackable(value):
            raise ValueError(f"Checkpoint: cannot track {value!r} as {name!r}.")
        self._objects[name] = value

    def _checkpoint_dependencies(self) -> list[tuple[str, Any]]:
        return [*self._objects.items(), (_SAVE_COUNTER, self.save_counter)]

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
            path = self.write(f"{prefix}-{number}")
        except BaseException:
            counter.assign(number - 1, read_value=False)
            raise
        workers = workers_lib.current()
        if workers is None:
            record_latest(path)
            return path
        # MultiWorkerMirroredStrategy: the chief keeps the state file; every worker returns once it is written.
        error: Exception | None = None
        if workers.rank == 0:
            try:
                record_latest(path)
            except Exception as caught:  # agreed with the other workers, then re-raised
                error = caught
        workers.settle(error, "Checkpoint.save() (the state file)")
        return path

    def write(self, file_prefix: str | bytes | os.PathLike[Any]) -> str:
        """Writes the checkpoint at exactly ``file_prefix`` (``.index.json`` and ``.data-*.npz`` files).

        The write is atomic: an earlier checkpoint at the same prefix stays readable until
        the new one is complete. Does not touch ``save_counter`` or the state file.
        Variables of bool, integer, float, complex, string (numpy ``str_`` and ``bytes_``),
        ``datetime64`` and ``timedelta64`` dtypes are saved; any other dtype is refused
        before a file is written.

        Args:
          file_prefix: the path prefix (a ``str``, ``bytes`` or ``os.PathLike``).

        Returns:
          ``file_prefix`` as a ``str``.

        Raises:
          TypeError: ``file_prefix`` is not a path, or a variable's dtype cannot be saved
            (object, structured, void or numpy ``StringDType``).
          ValueError: a variable has no single value to save (sync-on-read with
            aggregation NONE), or an optimizer slot's variable is not in the checkpoint.
        """
        require_outside_run("Checkpoint.write()")
        with worded_at("Checkpoint.write()"):
            prefix = files.as_path(file_prefix, "file_prefix")
        workers = workers_lib.current()
        if workers is None:
            files.write_checkpoint(prefix, *self._values_to_save(prefix))
            return prefix
        # MultiWorkerMirroredStrategy: every worker reads the values (sync-on-read variables
        # aggregate across workers); only the chief writes, once every worker has its values.
        api = "Checkpoint.write()"
        error: Exception | None = None
        try:
            arrays, entries = self._values_to_save(prefix)
        except Exception as caught:  # agreed with the other workers, then re-raised
            error = caught
        workers.settle(error, api)
        if workers.rank == 0:
            try:
                files.write_checkpoint(prefix, arrays, entries)
            except Exception as caught:  # agreed with the other workers, then re-raised
                error = caught
        workers.settle(error, f"{api} on the chief")
        return prefix

    def _values_to_save(self, prefix: str) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """The arrays to save and their index entries, keyed by checkpoint key."""
        found = graph.walk(self._checkpoint_dependencies())
        arrays: dict[str, np.ndarray] = {}
        entries: dict[str, dict[str, Any]] = {}
        for key, variable in _saved_variables(found).items():
            _require_storable(variable, key, prefix)
            array = _saved_value(variable, key)
            arrays[key] = array
            entries[key] = {
                "shape": list(array.shape),
                "dtype": files.dtype_text(array.dtype),
                "variable": variable.name,
                "class": type(variable).__name__,
                "synchronization": variable.synchronization.name,
                "aggregation": variable.aggregation.name,
            }
        return arrays, entries

    # --- restoring -----------------------------------------------------------------------

    def restore(
        self, save_path: str | bytes | os.PathLike[Any] | None
    ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restores every variable of this checkpoint's objects from ``save_path``.

        Values are matched by key (see ``towerdist._src.checkpoint.graph``). An optimizer's
        slots that do not exist yet are restored when the optimizer creates them (on its
        first step or ``build``). Works inside or outside ``strategy.scope()`` and into
        any number of replicas.

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
            data file changed). No variable is changed.
          ValueError: a saved value's shape or dtype differs from its variable's (string
            widths may differ, as long as no saved string would be cut short). No
            variable is changed.
        """
        require_outside_run("Checkpoint.restore()")
        if save_path is None:
            return InitializationOnlyStatus()
        with worded_at("Checkpoint.restore()"):
            prefix = files.as_path(save_path, "save_path")
        workers = workers_lib.current()
        if workers is None:
            entries, arrays = files.read_checkpoint(prefix)
        else:
            entries, arrays = _read_on_chief(prefix, workers)
        found = graph.walk(self._checkpoint_dependencies())
        plan = _match(found, entries, arrays, prefix)
        for variable, array in plan.assignments:
            _assign(variable, array)
        for optimizer, slot, array in plan.deferred:
            optimizer._deferred_slots[slot] = array
        return CheckpointLoadStatus(self, prefix, set(entries), plan)

    def read(self, save_path: str | bytes | os.PathLike[Any]) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restores from ``save_path`` (a checkpoint from :meth:`write`); the same as :meth:`restore`."""
        return self.restore(save_path)

    def __repr__(self) -> str:
        names = ", ".join(self._objects)
        return f"<td.train.Checkpoint({names})>"


class _Plan:
    """What a restore does: assign now, defer until a slot exists, and what it left out."""

    def __init__(self) -> None:
        self.assignments: list[tuple[Variable, np.ndarray]] = []
        self.deferred: list[tuple[Any, Any, np.ndarray]] = []  # (optimizer, (variable ref, slot), array)
        self.deferred_keys: dict[str, tuple[Any, Any]] = {}
        self.matched: set[str] = set()


class CheckpointLoadStatus:
    """The result of :meth:`Checkpoint.restore`: checks on how well the checkpoint matched."""

    def __init__(self, checkpoint: Checkpoint, prefix: str, entries: set[str], plan: _Plan) -> None:
        self._checkpoint = checkpoint
        self._prefix = prefix
        self._entries = entries
        self._plan = plan

    def _pending(self) -> list[str]:
        return sorted(k for k, (opt, slot) in self._plan.deferred_keys.items() if slot in opt._deferred_slots)

    def _unmatched_objects(self) -> list[str]:
        found = graph.walk(self._checkpoint._checkpoint_dependencies())
        return sorted(k for k in _saved_variables(found, strict=False) if k not in self._entries)

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Asserts that every saved value was restored and every variable received one.

        Values for optimizer slots that do not exist yet count as unrestored until the
        optimizer creates them.

        Raises:
          AssertionError: listing the keys at fault.
        """
        unused = sorted(self._entries - self._plan.matched - set(self._plan.deferred_keys))
        pending = self._pending()
        missing = self._unmatched_objects()
        problems = []
        if unused:
            problems.append(f"values in the checkpoint matched to no object: {unused}")
        if pending:
            problems.append(
                f"optimizer slot values waiting for their slot to be created (run a step or optimizer.build()): "
                f"{pending}"
            )
        if missing:
            problems.append(f"variables with no value in the checkpoint: {missing}")
        if problems:
            raise AssertionError(f"Checkpoint {self._prefix} was not fully consumed: " + "; ".join(problems) + ".")
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Asserts that every variable that exists now received a value (extra saved values are fine).

        Raises:
          AssertionError: listing the variables with no saved value.
        """
        missing = self._unmatched_objects()
        if missing:
            raise AssertionError(f"Checkpoint {self._prefix} has no value for these variables: {missing}.")
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """Asserts that at least one variable other than ``save_counter`` was restored.

        Raises:
          AssertionError: nothing but the save counter matched.
        """
        if not (self._plan.matched | set(self._plan.deferred_keys)) - {_SAVE_COUNTER}:
            raise AssertionError(
                f"Nothing except the save counter was restored from {self._prefix}: no key of the checkpoint "
                f"matches this Checkpoint's objects. Check the keyword names you passed to td.train.Checkpoint."
            )
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Declares a partial restore intended (towerdist warns about nothing anyway)."""
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """Does nothing: restores happen eagerly (TensorFlow graph-mode compatibility)."""
        del session


class InitializationOnlyStatus:
    """The status of ``restore(None)``: nothing was restored."""

    def assert_consumed(self) -> InitializationOnlyStatus:
        """Always raises: there was no checkpoint."""
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def assert_existing_objects_matched(self) -> InitializationOnlyStatus:
        """Always raises: there was no checkpoint."""
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def assert_nontrivial_match(self) -> InitializationOnlyStatus:
        """Always raises: there was no checkpoint."""
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def expect_partial(self) -> InitializationOnlyStatus:
        """Returns this status."""
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """Does nothing."""
        del session


# --- helpers --------------------------------------------------------------------------------


def _read_on_chief(prefix: str, workers: workers_lib.Workers) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``files.read_checkpoint(prefix)`` on the chief, its result broadcast to every worker.

    An error reading (no checkpoint, corrupt files) is raised on every worker.
    """
    api = "Checkpoint.restore()"
    read: dict[str, np.ndarray] = {}

    def read_index() -> dict[str, Any]:
        entries, arrays = files.read_checkpoint(prefix)
        read.update(arrays)
        return {"entries": entries, "arrays": [[key, a.dtype.str, list(a.shape)] for key, a in arrays.items()]}

    index = workers.run_on_chief(read_index, api)
    blobs = []
    for key, dtype, shape in index["arrays"]:
        if workers.rank == 0:
            blobs.append(np.ascontiguousarray(read[key]).reshape(-1).view(np.uint8))
        else:
            blobs.append(np.empty(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, np.uint8))
    blobs = workers.broadcast(blobs, f"{api} (the values)", None)
    arrays = {
        key: blob.view(np.dtype(dtype)).reshape(shape) for (key, dtype, shape), blob in zip(index["arrays"], blobs)
    }
    return index["entries"], arrays


def require_outside_run(api: str) -> None:
    """Checkpoints are saved and restored between steps, never inside ``strategy.run``."""
    context.require_outside_run(api, "save and restore checkpoints between steps")


def _saved_variables(found: graph.Graph, strict: bool = True) -> dict[str, Variable]:
    """Every variable to save, by key: the graph's variables and its optimizers' slots."""
    saved = dict(found.variables)
    for path, optimizer in found.optimizers:
        for ref, slots in optimizer._slots.items():
            variable = ref.deref()
            key = found.keys.get(id(variable))
            if key is None:
                if not strict:
                    continue
                raise ValueError(
                    f"Checkpoint: the optimizer at {path!r} has slots for {variable.name}, which this checkpoint does "
                    f"not save, so they could not be restored. Pass the model too, e.g. "
                    f"td.train.Checkpoint(model=model, optimizer=optimizer)."
                )
            for name, slot in slots.items():
                saved[graph.slot_key(path, key, name)] = slot
    return saved


def _require_storable(variable: Variable, key: str, prefix: str) -> None:
    """Refuses, before anything is written, a variable whose dtype no checkpoint can hold."""
    reason = files.unstorable_reason(np.dtype(variable.dtype))
    if reason is not None:
        raise TypeError(
            f"Checkpoint cannot save {variable.name} (at {key!r}) to {prefix}: its dtype {variable.dtype} cannot be "
            f"stored: "
            f"{reason}. Checkpoints hold bool, integer, float, complex, string (numpy str_ and bytes_), datetime64 "
            f"and timedelta64 variables."
        )


def _saved_value(variable: Variable, key: str) -> np.ndarray:
    """The one value saved for ``variable``, as a host array."""
    if isinstance(variable, SyncOnReadVariable):
        if variable.aggregation is VariableAggregation.NONE:
            raise ValueError(
                f"Checkpoint cannot save {variable.name} (at {key!r}): a sync-on-read variable with aggregation "
                f"NONE has no single value across replicas. Create it with aggregation SUM, MEAN or "
                f"ONLY_FIRST_REPLICA."
            )
        value = variable._read_cross_replica()
    elif isinstance(variable, DistributedVariable):
        value = variable._values[0].value()
    elif isinstance(variable, AggregatingVariable):
        value = variable.get().value()
    else:
        value = variable.value()
    return np.array(backend.host().to_device(value, None), copy=True)


def _match(found: graph.Graph, entries: dict[str, Any], arrays: dict[str, np.ndarray], prefix: str) -> _Plan:
    """Pairs saved arrays with live variables; raises (changing nothing) on any mismatch."""
    plan = _Plan()
    problems: list[str] = []
    live = _saved_variables(found, strict=False)
    for key, variable in live.items():
        if key not in arrays:
            continue
        value, problem = _converted(variable, arrays[key])
        if problem:
            problems.append(f"{key!r} ({variable.name}): {problem}")
        else:
            plan.assignments.append((variable, value))
            plan.matched.add(key)
    for path, optimizer in found.optimizers:
        for key, array in arrays.items():
            parsed = graph.parse_slot_key(path, key)
            if key in plan.matched or parsed is None:
                continue
            variable_key, slot_name = parsed
            primary = found.variables.get(variable_key)
            if primary is None or slot_name not in optimizer.get_slot_names():
                continue
            if primary.ref() in optimizer._slots:
                continue  # the slot exists but was not saved under this key: left unmatched
            _, problem = _converted(primary, array)
            if problem:
                problems.append(f"{key!r} (slot {slot_name!r} of {primary.name}): {problem}")
                continue
            slot = (primary.ref(), slot_name)
            plan.deferred.append((optimizer, slot, array))
            plan.deferred_keys[key] = (optimizer, slot)
    if problems:
        raise ValueError(
            f"Cannot restore {prefix}: " + "; ".join(problems) + ". No variable was changed; restore into variables "
            "of the saved shapes and dtypes."
        )
    return plan


def _converted(variable: Variable, array: np.ndarray) -> tuple[np.ndarray, str | None]:
    """``array`` as ``variable`` will hold it, and what makes it unfit (None if it fits)."""
    if tuple(array.shape) != tuple(variable.shape):
        return array, f"the checkpoint holds shape {tuple(array.shape)}, the variable has shape {tuple(variable.shape)}"
    dtype = np.dtype(variable.dtype)
    if array.dtype == dtype:
        return array, None
    if array.dtype.kind == dtype.kind and dtype.kind in "SU":
        # numpy strings have a width, TensorFlow's do not: a string value restores into a
        # string variable of any width, converted as its assign() converts it, if that
        # keeps every string whole.
        value = to_array(array, dtype, f"Checkpoint.restore() into {variable.name}")
        if np.array_equal(value, array):
            return value, None
        longest = int(np.char.str_len(array).max())
        unit = "characters" if dtype.kind == "U" else "bytes"
        return array, (
            f"the checkpoint holds strings of up to {longest} {unit}, longer than the variable's dtype "
            f"{files.dtype_text(dtype)} holds; create the variable with a dtype that holds them, e.g. "
            f"dtype='{dtype.kind}{longest}'"
        )
    saved, wanted = files.dtype_text(array.dtype), files.dtype_text(dtype)
    return array, f"the checkpoint holds dtype {saved}, the variable has dtype {wanted}"


def _assign(variable: Variable, array: np.ndarray) -> None:
    """Assigns ``array`` as cross-replica code does, in any scope (SUM sync-on-read: split)."""
    if isinstance(variable, (DistributedVariable, AggregatingVariable)):
        variable._write_cross_replica(ASSIGN, array, False)
    else:
        variable._write(ASSIGN, array, False)
