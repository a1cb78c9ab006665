"""The registry of old names: every TF 1.x / TF 2.0 alias, what it maps to, and its warning.

TensorFlow renamed much of ``tf.distribute`` between 1.8 and 2.4 ("tower" became
"replica", ``experimental_run_v2`` became ``run``, methods moved from ``Strategy`` to
``StrategyExtended``). towerdist keeps the old names working, and every one of them is
registered here. Each :class:`Alias` names

* ``old``: where the old name lives, as a module attribute (``towerdist.compat.v1.get_tower_context``)
  or a class member (``Strategy.experimental_run_v2``, ``compat.v1.MirroredStrategy.num_towers``);
* ``new``: what to use instead (shown in the warning and in ``docs/migrating-tf1.md``);
* ``target``: the implementation itself.

This module is in the bottom layer, so it names no implementation: each alias is declared
where its implementation may be imported, and registered when that code runs.

* Old module attributes (``towerdist.compat.v1.get_tower_context``, the names of
  ``towerdist.contrib.distribute``) are listed in one table, ``towerdist._src.compat.old_names``,
  and served by the public module's ``__getattr__`` (:func:`module_getattr`).
* Old members written in their class body (the tower API of ``compat.v1.MirroredStrategy``),
  so that readers and type checkers see them: each is marked with :func:`old_name` and the
  class with :func:`has_old_names`, which registers them. A method warns when it is called,
  a property when it is read.
* Old members implemented beside their class (the TF 2.0 leftovers on ``Strategy`` in
  ``strategies/legacy_names.py``, an enum value, Keras 2's ``Metric.reset_states``): the
  class's module hands them to :func:`install`, which puts them on the class as descriptors
  that warn when the attribute is looked up on an instance.

Using an old name emits one ``DeprecationWarning`` per name and process, pointing at the
user's line, and then behaves exactly as its target. Looking a member up on the class itself
(``td.distribute.Strategy.experimental_run_v2``) returns the implementation without a
warning, so ``inspect.signature`` and ``help`` work. :func:`all_aliases` returns the complete
table once ``towerdist`` is imported (importing any part of it does).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from towerdist._src import not_provided

__all__ = [
    "Alias",
    "all_aliases",
    "has_old_names",
    "install",
    "module_dir",
    "module_getattr",
    "old_name",
    "reset_warnings",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_C = TypeVar("_C", bound=type)

# Owners of member aliases.
STRATEGY = "Strategy"
EXTENDED = "StrategyExtended"
TOWER_STRATEGY = "compat.v1.MirroredStrategy"
AGGREGATION = "VariableAggregation"
METRIC = "Metric"


@dataclasses.dataclass(frozen=True)
class Alias:
    """One old name and what it maps to (see the module docstring)."""

    old: str
    new: str
    target: Any  # the implementation: a function, class, property or enum value
    since: str  # the TensorFlow version that renamed or deprecated it
    kind: str = "function"  # "function", "class", "method", "property" or "value"

    @property
    def owner(self) -> str:
        """The module (for module attributes) or class label (for members) holding the old name."""
        return self.old.rpartition(".")[0]

    @property
    def name(self) -> str:
        """The old name itself, without its owner."""
        return self.old.rpartition(".")[2]

    def message(self) -> str:
        """The text of the ``DeprecationWarning``."""
        return (
            f"{self.old} is a deprecated name (TensorFlow {self.since}); use {self.new} instead. "
            f"towerdist keeps the old name working; see docs/migrating-tf1.md."
        )


_registered: list[Alias] = []  # every registered old name, in registration order
_BY_OWNER: dict[str, dict[str, Alias]] = {}  # owner -> old name -> its alias
_registry_lock = threading.Lock()


def _register(alias: Alias) -> None:
    """Adds ``alias`` to the table. The same old name registered again with the same replacement
    (its module reloaded, ``importlib.reload``) takes the new target; with another, it is refused."""
    with _registry_lock:
        table = _BY_OWNER.setdefault(alias.owner, {})
        existing = table.get(alias.name)
        if existing is None:
            _registered.append(alias)
        elif (existing.new, existing.since, existing.kind) == (alias.new, alias.since, alias.kind):
            _registered[_registered.index(existing)] = alias
        else:
            raise ValueError(
                f"{alias.old} is registered twice in the alias table, as {existing.new} and as {alias.new}."
            )
        table[alias.name] = alias


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(alias: Alias, stacklevel: int) -> None:
    """Warns about ``alias`` the first time it is used in this process.

    ``stacklevel`` counts from the caller of this function, as for ``warnings.warn``.
    """
    with _warned_lock:
        if alias.old in _warned:
            return
        _warned.add(alias.old)
    warnings.warn(alias.message(), DeprecationWarning, stacklevel=stacklevel + 1)


def reset_warnings() -> None:
    """Forgets which old names have warned, so each warns again (for tests)."""
    with _warned_lock:
        _warned.clear()


def module_getattr(module: str, old_names: Iterable[Alias] = ()) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``old_names``, the old names of ``module``, after registering them.

    Use as ``__getattr__ = aliases.module_getattr(__name__, old_names.COMPAT_V1)`` in a public
    module. Any other name raises ``AttributeError``; for a TensorFlow name that towerdist
    does not provide, its message says what to use instead (``not_provided.py``).

    Raises:
        ValueError: an alias of ``old_names`` lives in another module, or is registered twice.
    """
    for alias in old_names:
        if alias.owner != module:
            raise ValueError(
                f"aliases.module_getattr() serves the old names of one module. Got {alias.old} for "
                f"module={module!r}; pass it to the module_getattr() of {alias.owner}."
            )
        _register(alias)
    table = _BY_OWNER.setdefault(module, {})  # the module's old names, as registered now and later

    def __getattr__(name: str) -> Any:
        alias = table.get(name)
        if alias is None:  # for a TensorFlow name towerdist lacks, the error says what to use instead
            raise not_provided.attribute_error(module, name)
        # stacklevel 2 from _warn_once's caller: the user's line (attribute access or import).
        _warn_once(alias, stacklevel=2)
        return alias.target

    return __getattr__


def module_dir(module: str, names: Iterable[str]) -> Callable[[], list[str]]:
    """A module ``__dir__`` listing ``names`` and the module's old names."""
    names = tuple(names)
    return lambda: sorted(set(names) | set(_BY_OWNER.get(module, {})))


class _OldMember:
    """The descriptor serving one old member name of a class."""

    def __init__(self, alias: Alias) -> None:
        self._alias = alias
        self.__doc__ = alias.message()

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    # Any: the old member is whatever its target is (a value, a method, a property's value).
    def __get__(self, instance: object, owner: type | None = None) -> Any:
        alias = self._alias
        target = alias.target
        if alias.kind == "value":
            _warn_once(alias, stacklevel=2)
            return target
        if instance is None:
            return target  # for inspect and help(): no warning
        _warn_once(alias, stacklevel=2)
        if alias.kind == "property":
            return target(instance)
        return target.__get__(instance, owner)

    def __set__(self, instance: object, value: object) -> None:
        _read_only(self._alias.old, self._alias.new)(instance, value)


def install(cls: type, old_names: Iterable[Alias]) -> None:
    """Registers ``old_names``, old members of ``cls``, and puts a descriptor on ``cls`` for each.

    Raises:
        ValueError: an old name is registered twice.
    """
    for alias in old_names:
        _register(alias)
        descriptor = _OldMember(alias)
        descriptor.__set_name__(cls, alias.name)
        setattr(cls, alias.name, descriptor)


# --- old names written in their class body ----------------------------------------------

_MARKED: dict[Callable[..., Any], Alias] = {}  # each marked function -> its registered alias


@dataclasses.dataclass(frozen=True)
class _OldNameMark:
    new: str
    since: str


def old_name(new: str, *, since: str) -> Callable[[_F], _F]:
    """Marks a method of a class body as an old name, replaced by ``new`` in TensorFlow ``since``.

    The method warns once (per name and process) when it is called, then runs. Put
    ``@property`` above it for an old property (it then warns when read). The class must be
    decorated with :func:`has_old_names`, which registers the name in the alias table.

    Example::

        @aliases.has_old_names(aliases.TOWER_STRATEGY)
        class MirroredStrategy(...):
            @property
            @aliases.old_name("Strategy.num_replicas_in_sync", since="1.12")
            def num_towers(self) -> int: ...
    """
    mark = _OldNameMark(new, since)

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def warned(*args: object, **kwargs: object) -> object:
            alias = _MARKED.get(warned)
            if alias is None:
                raise TypeError(
                    f"{fn.__qualname__} is marked with aliases.old_name but its class is not decorated "
                    f"with aliases.has_old_names(owner)."
                )
            _warn_once(alias, stacklevel=2)  # the user's line: the call, or the property read
            return fn(*args, **kwargs)

        warned.__dict__["_towerdist_old_name"] = mark
        return cast(_F, warned)

    return decorate


def has_old_names(owner: str) -> Callable[[_C], _C]:
    """Registers the members of a class marked with :func:`old_name` as old names of ``owner``.

    ``owner`` is the class label used in the table and in warnings (e.g.
    ``"compat.v1.MirroredStrategy"``). Old properties become read-only with a message
    naming their replacement.
    """

    def register(cls: _C) -> _C:
        for name, raw in list(vars(cls).items()):
            fn = raw.fget if isinstance(raw, property) else raw
            mark = getattr(fn, "_towerdist_old_name", None)
            if not isinstance(mark, _OldNameMark) or not callable(fn):
                continue
            old = f"{owner}.{name}"
            if isinstance(raw, property):
                member: Any = property(raw.fget, _read_only(old, mark.new), doc=raw.__doc__)
                setattr(cls, name, member)
                alias = Alias(old, mark.new, member, mark.since, "property")
            else:
                alias = Alias(old, mark.new, raw, mark.since, "method")
            _register(alias)
            _MARKED[fn] = alias
        return cls

    return register


def _read_only(old: str, new: str) -> Callable[[object, object], None]:
    def refuse(instance: object, value: object) -> None:
        raise AttributeError(f"{old} is read-only (a deprecated name of {new}).")

    return refuse


def all_aliases() -> tuple[Alias, ...]:
    """Every old name registered, in registration order: all that towerdist keeps once it is imported."""
    with _registry_lock:
        return tuple(_registered)
