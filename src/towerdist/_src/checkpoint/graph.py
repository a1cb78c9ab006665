"""The object graph a checkpoint saves: which variables, under which keys.

Starting from the ``Checkpoint``'s named objects, the graph is walked breadth first;
children are visited in name order. An object's children are:

* a ``td.Variable``: none (it is saved);
* a :class:`~towerdist._src.checkpoint.saveable.Saveable` (an input iterator): none (its
  state is saved as one opaque entry, keyed like a variable);
* ``td.Module``, optimizers, metrics, ``Checkpoint``: what their
  ``_checkpoint_dependencies()`` lists (a module's trackable attributes, an
  optimizer's ``iterations``, a metric's state variables);
* a list or tuple: its items, named ``"0"``, ``"1"``, ...; a dict: its values, by key.

A variable's (or saveable's) key is the ``/``-joined path of names by which it is first reached (names
are escaped so that ``/`` and ``%`` cannot collide). An optimizer's slot variables are
keyed by their variable's key: ``<optimizer>/.slots/<variable key>/<slot name>``. The
walk of the same objects always gives the same keys, which is how ``restore`` matches
saved arrays to live variables.
"""

from __future__ import annotations

import urllib.parse
from collections import deque
from typing import Any, NamedTuple, Protocol

from towerdist._src.checkpoint.saveable import Saveable, is_saveable
from towerdist._src.variables.variable import Variable

__all__ = ["Graph", "SLOTS", "Trackable", "is_trackable", "walk"]

SLOTS = ".slots"


class Trackable(Protocol):
    """An object a checkpoint walks into: a ``td.Module``, an optimizer, a metric, a ``Checkpoint``."""

    def _checkpoint_dependencies(self) -> list[tuple[str, Any]]:
        """Its named children, as TensorFlow's trackables list them."""
        ...


class Graph(NamedTuple):
    """The variables and saveables reachable from a checkpoint's root, and its optimizers."""

    variables: dict[str, Variable]  # key -> variable
    keys: dict[int, str]  # id(variable) -> key
    optimizers: list[tuple[str, Any]]  # (path, optimizer)
    saveables: dict[str, Saveable]  # key -> object saved as one opaque state
    visited: set[int]  # id() of every object reached (containers included)


def is_trackable(value: object) -> bool:
    """True for what a ``Checkpoint`` can hold: variables, saveables, trackable objects, lists and dicts."""
    return (
        isinstance(value, (Variable, list, tuple, dict))
        or hasattr(value, "_checkpoint_dependencies")
        or is_saveable(value)
    )


def walk(roots: list[tuple[str, Any]]) -> Graph:
    """Walks the graph from ``roots`` (``(name, object)`` pairs) breadth first."""
    variables: dict[str, Variable] = {}
    keys: dict[int, str] = {}
    optimizers: list[tuple[str, Any]] = []
    saveables: dict[str, Saveable] = {}
    seen: set[int] = set()
    queue: deque[tuple[str, Any]] = deque((escape(name), value) for name, value in sorted(roots, key=lambda r: r[0]))
    while queue:
        path, value = queue.popleft()
        if id(value) in seen:
            continue
        if isinstance(value, Variable):
            seen.add(id(value))
            variables[path] = value
            keys[id(value)] = path
            continue
        if is_saveable(value):
            seen.add(id(value))
            saveables[path] = value
            continue
        children = _children(value, path)
        if children is None:
            continue
        seen.add(id(value))
        if hasattr(value, "_slots") and hasattr(value, "_deferred_slots"):
            optimizers.append((path, value))
        for name, child in children:
            queue.append((f"{path}/{escape(name)}", child))
    return Graph(variables, keys, optimizers, saveables, seen)


def slot_key(optimizer_path: str, variable_key: str, slot_name: str) -> str:
    """The key of an optimizer's slot ``slot_name`` for the variable saved under ``variable_key``."""
    return f"{optimizer_path}/{SLOTS}/{variable_key}/{escape(slot_name)}"


def parse_slot_key(optimizer_path: str, key: str) -> tuple[str, str] | None:
    """``(variable key, slot name)`` if ``key`` is a slot key of the optimizer at ``optimizer_path``."""
    start = f"{optimizer_path}/{SLOTS}/"
    if not key.startswith(start):
        return None
    variable_key, _, slot_name = key[len(start) :].rpartition("/")
    return (variable_key, unescape(slot_name)) if variable_key else None


def escape(name: str) -> str:
    """``name`` made safe as one path component (no ``/``; cannot start with ``.``)."""
    escaped = name.replace("%", "%25").replace("/", "%2F")
    return "%2E" + escaped[1:] if escaped.startswith(".") else escaped


def unescape(name: str) -> str:
    """The inverse of :func:`escape`."""
    return urllib.parse.unquote(name)


def _children(value: object, path: str) -> list[tuple[str, Any]] | None:
    if isinstance(value, (list, tuple)):
        return [(str(k), item) for k, item in enumerate(value) if is_trackable(item)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(
                    f"Checkpoint: the dict at {path!r} has a key of type {type(key).__name__} ({key!r}); checkpointed "
                    f"dicts need string keys."
                )
        return [(key, value[key]) for key in sorted(value) if is_trackable(value[key])]
    dependencies = getattr(value, "_checkpoint_dependencies", None)
    if dependencies is None:
        return None
    return sorted(dependencies(), key=lambda d: d[0])
