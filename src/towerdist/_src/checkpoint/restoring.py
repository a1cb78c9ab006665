"""What a restore does: read the files (here, or on the chief for every worker), match, prepare, apply.

Restore is all or nothing. The files are verified (the index's and the data file's
SHA-256, sizes, shapes, dtypes); every saved value is matched to its variable and checked
against it, and every saveable (an input iterator) prepares its restore from its saved
state, before the first variable is assigned. Then the variables are assigned and the
saveables' restores committed. A mismatch, a failed check or a saveable that refuses its
state raises with nothing changed.

**Who reads the files.** Without other workers, this process reads them. Under
``MultiWorkerMirroredStrategy`` a restore is *local* (each worker reads the files itself,
no collective is involved, so one worker alone may restore, e.g. the chief for an
evaluation) unless the objects hold something the workers must agree on: a distributed
variable of the multi-worker strategy (a mirrored or sync-on-read variable, or an
optimizer slot of one) or a collective saveable (a distributed iterator). Then the
restore is *collective*: every worker must call it; the chief reads the files and sends
their content to every worker, so the copies of a mirrored variable stay identical even
without a shared filesystem, and the workers agree on the outcome (a failure on one
worker raises on every worker, and none changes anything).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from towerdist._src.checkpoint import files, graph, saving
from towerdist._src.checkpoint.saveable import Saveable
from towerdist._src.multi_worker import workers as workers_lib
from towerdist._src.variables.aggregating_variable import AggregatingVariable
from towerdist._src.variables.distributed_variable import DistributedVariable
from towerdist._src.variables.variable import ASSIGN, Variable, to_array

__all__ = ["Plan", "agreed_by_workers", "apply", "assign", "converted", "prepare", "read"]


class Plan:
    """What a restore does: assign now, defer until a slot exists, commit saveables, and what it matched."""

    def __init__(self) -> None:
        self.assignments: list[tuple[Variable, np.ndarray]] = []
        self.deferred: list[tuple[Any, Any, np.ndarray]] = []  # (optimizer, (variable ref, slot), array)
        self.deferred_keys: dict[str, tuple[Any, Any]] = {}
        self.commits: list[Callable[[], None]] = []  # the saveables' prepared restores
        self.matched: set[str] = set()


def agreed_by_workers(found: graph.Graph) -> bool:
    """Whether restoring ``found`` needs every worker (see the module docstring): False without other workers."""
    if workers_lib.current() is None:
        return False
    if any(saveable._checkpoint_collective for saveable in found.saveables.values()):
        return True
    return any(_shared_by_workers(v) for v in saving.saved_variables(found, strict=False).values())


def _shared_by_workers(variable: Variable) -> bool:
    """True for a variable a multi-worker strategy keeps the same on every worker."""
    if not isinstance(variable, (DistributedVariable, AggregatingVariable)):
        return False
    return bool(variable.distribute_strategy.extended._num_workers > 1)


def read(prefix: str, collective: bool, api: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The checkpoint's entries and arrays: read here, or (``collective``) on the chief and sent to every worker.

    ``api`` names the collectives (the public method called).
    """
    workers = workers_lib.current()
    if not collective or workers is None:
        return files.read_checkpoint(prefix)
    return _read_on_chief(prefix, workers, api)


def _read_on_chief(
    prefix: str, workers: workers_lib.Workers, api: str
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``files.read_checkpoint(prefix)`` on the chief, its result broadcast to every worker.

    An error reading (no checkpoint, corrupt files) is raised on every worker.
    """
    read_here: dict[str, np.ndarray] = {}

    def read_index() -> dict[str, Any]:
        entries, arrays = files.read_checkpoint(prefix)
        read_here.update(arrays)
        return {"entries": entries, "arrays": [[key, a.dtype.str, list(a.shape)] for key, a in arrays.items()]}

    index = workers.run_on_chief(read_index, api)
    blobs = []
    for key, dtype, shape in index["arrays"]:
        if workers.rank == 0:
            blobs.append(np.ascontiguousarray(read_here[key]).reshape(-1).view(np.uint8))
        else:
            blobs.append(np.empty(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, np.uint8))
    blobs = workers.broadcast(blobs, f"{api} (the values)", None)
    arrays = {
        key: blob.view(np.dtype(dtype)).reshape(shape) for (key, dtype, shape), blob in zip(index["arrays"], blobs)
    }
    return index["entries"], arrays


def prepare(
    found: graph.Graph,
    entries: dict[str, Any],
    arrays: dict[str, np.ndarray],
    prefix: str,
    collective: bool,
    api: str = "Checkpoint.restore()",
) -> Plan:
    """Matches the saved values to ``found``'s objects and prepares every saveable's restore.

    Changes nothing. With ``collective``, every worker takes part, the saveables are
    prepared in key order on every worker even after one failed, and the outcome is agreed:
    a failure anywhere raises on every worker.

    Raises:
      ValueError: a saved value does not fit its variable (shape, dtype), or a key holds
        a variable's value where the object is a saveable, or the reverse.
      Exception: what a saveable's ``_checkpoint_restorer`` raised (e.g.
        ``FailedPreconditionError`` for an iterator of another pipeline).
      AbortedError: (collective) another worker failed.
    """
    error: Exception | None = None
    plan = Plan()
    try:
        _match_variables(plan, found, entries, arrays, prefix)
    except ValueError as caught:
        if not collective:
            raise  # no saveable prepares work that would be dropped
        error = caught
    for key in sorted(found.saveables):
        if key not in entries:
            continue
        try:
            plan.commits.append(_prepared(found.saveables[key], key, entries[key], arrays[key], prefix))
            plan.matched.add(key)
        except Exception as caught:  # the others are still prepared (collective ones keep the workers in step)
            error = error or caught
    workers = workers_lib.current()
    if collective and workers is not None:
        workers.settle(error, api)
    elif error is not None:
        raise error
    return plan


def apply(plan: Plan) -> None:
    """Assigns the matched values, hands the deferred slot values to their optimizers, commits the saveables."""
    for variable, array in plan.assignments:
        assign(variable, array)
    for optimizer, slot, array in plan.deferred:
        optimizer._deferred_slots[slot] = array
    for commit in plan.commits:
        commit()


def _prepared(saveable: Saveable, key: str, entry: dict[str, Any], array: np.ndarray, prefix: str) -> Callable[[], None]:
    """``saveable``'s prepared restore of its saved ``array`` (raises, changing nothing, if it does not fit)."""
    if entry["kind"] != files.KIND_OBJECT:
        raise ValueError(
            f"Cannot restore {prefix}: {key!r} holds the value of a variable ({entry.get('variable')}), but this "
            f"checkpoint's object there is a {type(saveable).__name__}. No object was changed; restore into the "
            f"objects that were saved."
        )
    try:
        return saveable._checkpoint_restorer(array.tobytes())
    except Exception as error:
        error.add_note(f"(restoring the {type(saveable).__name__} saved under {key!r} in {prefix}; no object changed)")
        raise


def _match_variables(plan: Plan, found: graph.Graph, entries: dict[str, Any], arrays: dict[str, np.ndarray],
                     prefix: str) -> None:
    """Pairs saved arrays with live variables into ``plan``; raises (changing nothing) on any mismatch."""
    problems: list[str] = []
    live = saving.saved_variables(found, strict=False)
    for key, variable in live.items():
        if key not in arrays:
            continue
        if entries[key]["kind"] != files.KIND_VARIABLE:
            problems.append(f"{key!r} ({variable.name}): the checkpoint holds the state of a {entries[key]['class']} "
                            f"there, not a variable's value")
            continue
        value, problem = converted(variable, arrays[key])
        if problem:
            problems.append(f"{key!r} ({variable.name}): {problem}")
        else:
            plan.assignments.append((variable, value))
            plan.matched.add(key)
    for path, optimizer in found.optimizers:
        for key, array in arrays.items():
            parsed = graph.parse_slot_key(path, key)
            if key in plan.matched or parsed is None or entries[key]["kind"] != files.KIND_VARIABLE:
                continue
            variable_key, slot_name = parsed
            primary = found.variables.get(variable_key)
            if primary is None or slot_name not in optimizer.get_slot_names():
                continue
            if primary.ref() in optimizer._slots:
                continue  # the slot exists but was not saved under this key: left unmatched
            _, problem = converted(primary, array)
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


def converted(variable: Variable, array: np.ndarray) -> tuple[np.ndarray, str | None]:
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


def assign(variable: Variable, array: np.ndarray) -> None:
    """Assigns ``array`` as cross-replica code does, in any scope (SUM sync-on-read: split)."""
    if isinstance(variable, (DistributedVariable, AggregatingVariable)):
        variable._write_cross_replica(ASSIGN, array, False)
    else:
        variable._write(ASSIGN, array, False)
