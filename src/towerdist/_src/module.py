"""``td.Module``: a container of variables and other modules (TensorFlow's ``tf.Module``).

Subclass it for a model; the variables assigned to its attributes (directly, or inside
lists, tuples and dicts, or inside sub-modules) are found by ``variables`` and
``trainable_variables`` and saved by ``td.train.Checkpoint``, as are input iterators
assigned to them::

    class Dense(td.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.w = td.Variable(np.zeros((n_in, n_out), np.float32))
            self.b = td.Variable(np.zeros(n_out, np.float32))
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from towerdist._src.checkpoint import deferred
from towerdist._src.checkpoint.saveable import is_saveable
from towerdist._src.variables.variable import Variable

__all__ = ["Module", "snake_case"]

_VALID_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Module:
    """A named container that tracks the variables and modules in its attributes.

    Attributes are walked in name order; a variable reachable twice is listed once.
    """

    def __init__(self, name: str | None = None) -> None:
        if name is None:
            name = snake_case(type(self).__name__)
        elif not isinstance(name, str) or not _VALID_NAME.fullmatch(name):
            raise ValueError(
                f"td.Module name must be a valid Python identifier. Got name={name!r}; use letters, digits and "
                f"underscores."
            )
        self._module_name = name

    @property
    def name(self) -> str:
        """The module's name (the snake-cased class name unless given)."""
        return self._module_name

    @property
    def variables(self) -> tuple[Variable, ...]:
        """Every variable of this module and its sub-modules, each once, in TensorFlow's order.

        The module's own variables first (attributes by name; lists in order, dicts by key),
        then each sub-module's, sub-module by sub-module in that order, recursively.
        """
        return tuple(v for v in _flatten(self, {id(self)}) if isinstance(v, Variable))

    @property
    def trainable_variables(self) -> tuple[Variable, ...]:
        """The variables created with ``trainable=True`` (the default for on-write variables)."""
        return tuple(v for v in self.variables if v.trainable)

    @property
    def non_trainable_variables(self) -> tuple[Variable, ...]:
        """The variables created with ``trainable=False``."""
        return tuple(v for v in self.variables if not v.trainable)

    @property
    def submodules(self) -> tuple[Module, ...]:
        """Every module nested in this one (not this one itself), each once, in TensorFlow's order."""
        return tuple(m for m in _flatten(self, {id(self)}) if isinstance(m, Module))

    def __setattr__(self, name: str, value: object) -> None:
        """Sets the attribute; a variable, module or iterator in ``value`` takes a saved value waiting for it.

        A ``td.train.Checkpoint`` restored before this module had the attribute keeps the
        values whose objects did not exist yet; they go to their objects now (as in
        TensorFlow, whose modules track their attributes). If a waiting value does not fit
        its object, the assignment is undone and the error raised.
        """
        missing = object()
        previous = self.__dict__.get(name, missing)
        object.__setattr__(self, name, value)
        try:
            deferred.attached(self, value)
        except BaseException:
            if previous is missing:
                object.__delattr__(self, name)
            else:
                object.__setattr__(self, name, previous)
            raise

    def _checkpoint_dependencies(self) -> list[tuple[str, Any]]:
        return [(name, value) for name, value in _attributes(self) if _tracks(value)]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"


def _attributes(module: Module) -> list[tuple[str, Any]]:
    return sorted((k, v) for k, v in vars(module).items() if k != "_module_name")


def _tracks(value: object) -> bool:
    """True if ``value`` is, or contains, something a module tracks."""
    if isinstance(value, (Variable, Module)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_tracks(v) for v in value)
    if isinstance(value, dict):
        return any(_tracks(v) for v in value.values())
    return hasattr(value, "_checkpoint_dependencies") or is_saveable(value)


def _flatten(module: Module, seen: set[int]) -> Iterator[Any]:
    """The variables and modules under ``module``, in TensorFlow's order, each once.

    First the module's own: its attributes by name, lists and tuples in order, dicts by
    key; then, sub-module by sub-module in that order, each sub-module's, recursively.
    """
    submodules = []
    for _, attribute in _attributes(module):
        for leaf in _leaves(attribute):
            if id(leaf) in seen:
                continue
            seen.add(id(leaf))
            yield leaf
            if isinstance(leaf, Module):
                submodules.append(leaf)
    for submodule in submodules:
        yield from _flatten(submodule, seen)


def _leaves(value: object) -> Iterator[Variable | Module]:
    """The variables and modules in ``value`` (itself, or nested in lists, tuples and dicts)."""
    if isinstance(value, (Variable, Module)):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _leaves(value[key])


def snake_case(name: str) -> str:
    """TensorFlow's rule: ``_`` before a capital that follows a lower-case letter or digit, or
    that starts a word (a capital followed by a lower-case letter, not at the start)."""
    return re.sub(r"((?<=[a-z0-9])[A-Z]|(?!^)[A-Z](?=[a-z]))", r"_\1", name).lower()
