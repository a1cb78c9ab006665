"""What a save writes: one value per variable, one opaque state per saveable, and their index entries.

A variable is saved as one value whatever the strategy: the common value of a mirrored
variable, the aggregate of a sync-on-read one (its SUM, MEAN or first copy). A saveable
(an input iterator) is saved as the bytes its ``_checkpoint_state()`` returns, as one
``uint8`` array.

Under ``MultiWorkerMirroredStrategy`` every worker computes what is saved, in the same
order: reading a sync-on-read variable aggregates across the workers, and a collective
saveable's ``_checkpoint_state()`` is itself a collective. So every saveable's state is
asked for, in key order, even after an earlier one failed: the workers stay in step, and
the first error is raised once all were asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from towerdist._src import backend
from towerdist._src.checkpoint import files, graph
from towerdist._src.checkpoint.saveable import Saveable
from towerdist._src.variable_enums import VariableAggregation
from towerdist._src.variables.aggregating_variable import AggregatingVariable
from towerdist._src.variables.distributed_variable import DistributedVariable, SyncOnReadVariable
from towerdist._src.variables.variable import Variable

__all__ = ["saved_variables", "values_to_save"]

Arrays = dict[str, np.ndarray]
Entries = dict[str, dict[str, Any]]


def values_to_save(found: graph.Graph, prefix: str) -> tuple[Arrays, Entries]:
    """The arrays to save and their index entries, keyed by checkpoint key.

    Raises:
      TypeError: a variable's dtype cannot be saved (before any value is read), or a
        saveable's state is not bytes.
      ValueError: a variable has no single value (sync-on-read, aggregation NONE), or an
        optimizer's slots belong to a variable this checkpoint does not save.
    """
    variables = saved_variables(found)
    for key, variable in variables.items():
        _require_storable(variable, key, prefix)
    arrays: Arrays = {}
    entries: Entries = {}
    for key, variable in variables.items():
        array = _saved_value(variable, key)
        arrays[key] = array
        entries[key] = {
            "shape": list(array.shape),
            "dtype": files.dtype_text(array.dtype),
            "kind": files.KIND_VARIABLE,
            "variable": variable.name,
            "class": type(variable).__name__,
            "synchronization": variable.synchronization.name,
            "aggregation": variable.aggregation.name,
        }
    error: Exception | None = None
    for key in sorted(found.saveables):
        try:
            state = _saved_state(found.saveables[key], key)
        except Exception as caught:  # the others are still asked (collective ones keep the workers in step)
            error = error or caught
            continue
        arrays[key] = state
        entries[key] = {
            "shape": list(state.shape),
            "dtype": "uint8",
            "kind": files.KIND_OBJECT,
            "class": type(found.saveables[key]).__name__,
        }
    if error is not None:
        raise error
    return arrays, entries


def saved_variables(found: graph.Graph, strict: bool = True) -> dict[str, Variable]:
    """Every variable to save, by key: the graph's variables and its optimizers' slots.

    Raises:
      ValueError: ``strict`` and an optimizer has slots for a variable the graph lacks.
    """
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
        value = variable.values[0].value()
    elif isinstance(variable, AggregatingVariable):
        value = variable.get().value()
    else:
        value = variable.value()
    return np.array(backend.host().to_device(value, None), copy=True)


def _saved_state(saveable: Saveable, key: str) -> np.ndarray:
    """The state ``saveable`` gives, as a ``uint8`` array (a copy)."""
    state = saveable._checkpoint_state()
    if not isinstance(state, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"Checkpoint cannot save the {type(saveable).__name__} at {key!r}: its _checkpoint_state() returned "
            f"{type(state).__name__}, not bytes."
        )
    return np.frombuffer(bytes(state), np.uint8).copy()
