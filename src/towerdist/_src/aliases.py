"""The one table of old names: every TF 1.x / TF 2.0 alias, what it maps to, and its warning.

TensorFlow renamed much of ``tf.distribute`` between 1.8 and 2.4 ("tower" became
"replica", ``experimental_run_v2`` became ``run``, methods moved from ``Strategy`` to
``StrategyExtended``). towerdist keeps the old names working, and this module is the only
place that knows them. Each :class:`Alias` names

* ``old``: where the old name lives, as a module attribute (``towerdist.compat.v1.get_tower_context``)
  or a class member (``Strategy.experimental_run_v2``, ``compat.v1.MirroredStrategy.num_towers``);
* ``new``: what to use instead (shown in the warning and in ``docs/migrating-tf1.md``);
* ``target``: the implementation, as ``"module:qualname"`` (resolved on first use, so that
  this table imports nothing).

Using an old name emits one ``DeprecationWarning`` per name and process, pointing at the
user's line, and then behaves exactly as its target. Module attributes are served by a
module ``__getattr__`` (:func:`module_getattr`). Old class members come in two forms:

* members written in their class body (the tower API of ``compat.v1.MirroredStrategy``),
  so that readers and type checkers see them: each is marked with :func:`old_name` and
  the class with :func:`has_old_names`, which registers them in this table. A method warns
  when it is called, a property when it is read.
* members implemented elsewhere (the TF 2.0 leftovers on ``Strategy``, an enum value):
  listed in :data:`ALIASES` and put on the class by :func:`install` as descriptors that warn
  when the attribute is looked up on an instance.

Either way, looking a member up on the class itself (``td.distribute.Strategy.experimental_run_v2``)
returns the implementation without a warning, so ``inspect.signature`` and ``help`` work.
:func:`all_aliases` returns the complete table.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from towerdist._src import not_provided

__all__ = [
    "ALIASES",
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

_TOWER = "towerdist._src.compat.tower_strategy"
_TOWER_CONTEXT = "towerdist._src.compat.tower_context"
_LEGACY = "towerdist._src.strategies.legacy_names"


@dataclasses.dataclass(frozen=True)
class Alias:
    """One old name and what it maps to (see the module docstring)."""

    old: str
    new: str
    target: str
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

    def resolve(self) -> Any:
        """The implementation (imported on first use, then remembered)."""
        try:
            return _resolved[self.old]
        except KeyError:
            pass
        module_name, _, qualname = self.target.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        _resolved[self.old] = obj
        return obj

    def message(self) -> str:
        """The text of the ``DeprecationWarning``."""
        return (
            f"{self.old} is a deprecated name (TensorFlow {self.since}); use {self.new} instead. "
            f"towerdist keeps the old name working; see docs/migrating-tf1.md."
        )


def _tower_module_functions(module: str) -> list[Alias]:
    """The TF 1.x module-level tower functions, as they appear in ``module``."""
    return [
        Alias(
            f"{module}.get_tower_context",
            "towerdist.distribute.get_replica_context()",
            f"{_TOWER_CONTEXT}:get_tower_context",
            "1.12",
        ),
        Alias(
            f"{module}.get_cross_tower_context",
            "towerdist.distribute.get_cross_replica_context()",
            f"{_TOWER_CONTEXT}:get_cross_tower_context",
            "1.12",
        ),
        Alias(
            f"{module}.get_distribution_strategy",
            "towerdist.distribute.get_strategy()",
            "towerdist._src.context:get_strategy",
            "1.12",
        ),
        Alias(
            f"{module}.has_distribution_strategy",
            "towerdist.distribute.has_strategy()",
            "towerdist._src.context:has_strategy",
            "1.12",
        ),
    ]


def _contrib(name: str, new: str, target: str, kind: str = "class") -> Alias:
    return Alias(f"towerdist.contrib.distribute.{name}", new, target, "1.14 (tf.contrib removed in 2.0)", kind)


def _strategy_member(name: str, new: str, since: str) -> Alias:
    return Alias(f"{STRATEGY}.{name}", new, f"{_LEGACY}:{name}", since, "method")


ALIASES: tuple[Alias, ...] = (
    # --- TF 1.x module-level functions ----------------------------------------------------
    *_tower_module_functions("towerdist.compat.v1"),
    *_tower_module_functions("towerdist.compat.v1.distribute"),
    *_tower_module_functions("towerdist.contrib.distribute"),
    # --- tf.contrib.distribute (TF 1.8-1.14) ----------------------------------------------
    _contrib(
        "MirroredStrategy",
        "towerdist.compat.v1.distribute.MirroredStrategy (the same class)",
        f"{_TOWER}:MirroredStrategy",
    ),
    _contrib("TowerContext", "towerdist.distribute.ReplicaContext", f"{_TOWER_CONTEXT}:TowerContext"),
    _contrib("DistributionStrategy", "towerdist.distribute.Strategy", "towerdist._src.strategies.strategy:Strategy"),
    _contrib(
        "OneDeviceStrategy",
        "towerdist.distribute.OneDeviceStrategy",
        "towerdist._src.strategies.one_device:OneDeviceStrategy",
    ),
    _contrib(
        "CrossTowerOps",
        "towerdist.distribute.CrossDeviceOps",
        "towerdist._src.cross_device_ops.base:CrossDeviceOps",
    ),
    _contrib(
        "ReductionToOneDeviceCrossTowerOps",
        "towerdist.distribute.ReductionToOneDevice",
        "towerdist._src.cross_device_ops.reduction_to_one_device:ReductionToOneDevice",
    ),
    _contrib(
        "AllReduceCrossTowerOps",
        "towerdist.distribute.NcclAllReduce or HierarchicalCopyAllReduce",
        "towerdist._src.cross_device_ops.all_reduce_ops:AllReduceCrossDeviceOps",
    ),
    _contrib(
        "UpdateContext",
        "towerdist.distribute.get_update_device() inside extended.update()",
        f"{_TOWER_CONTEXT}:UpdateContext",
    ),
    _contrib(
        "get_update_device",
        "towerdist.distribute.get_update_device()",
        "towerdist._src.context:get_update_device",
        kind="function",
    ),
    _contrib(
        "get_loss_reduction",
        "towerdist.compat.v1.distribute.get_loss_reduction()",
        "towerdist._src.compat.tower_context:get_loss_reduction",
        kind="function",
    ),
    # --- TF 2.2/2.3 -----------------------------------------------------------------------
    Alias(
        "towerdist.distribute.experimental.CollectiveHints",
        "towerdist.distribute.experimental.CommunicationOptions",
        "towerdist._src.options:CollectiveHints",
        "2.4",
        "class",
    ),
    Alias(
        "towerdist.distribute.experimental.CollectiveCommunication",
        "towerdist.distribute.experimental.CommunicationImplementation",
        "towerdist._src.options:CommunicationImplementation",
        "2.4",
        "class",
    ),
    # --- TF 1.x VariableAggregation member ------------------------------------------------
    Alias(
        f"{AGGREGATION}.ONLY_FIRST_TOWER",
        "VariableAggregation.ONLY_FIRST_REPLICA",
        "towerdist._src.variable_enums:VariableAggregation.ONLY_FIRST_REPLICA",
        "1.12",
        "value",
    ),
    # --- TF 2.0-2.3 names and TF 1.x leftovers on tf.distribute.Strategy -----------------
    _strategy_member("experimental_run_v2", "Strategy.run()", "2.2"),
    _strategy_member(
        "experimental_distribute_datasets_from_function", "Strategy.distribute_datasets_from_function()", "2.4"
    ),
    _strategy_member("experimental_make_numpy_dataset", "td.data.Dataset.from_tensor_slices()", "2.2"),
    _strategy_member("unwrap", "Strategy.experimental_local_results()", "2.0"),
    _strategy_member("colocate_vars_with", "Strategy.extended.colocate_vars_with()", "2.0"),
    _strategy_member("configure", "Strategy.update_config_proto()", "2.0"),
    _strategy_member("update_config_proto", "nothing (towerdist has no sessions)", "2.0"),
    _strategy_member("make_dataset_iterator", "iter(Strategy.experimental_distribute_dataset(dataset))", "2.0"),
    _strategy_member("make_input_fn_iterator", "iter(Strategy.distribute_datasets_from_function(dataset_fn))", "2.0"),
    _strategy_member("experimental_run", "Strategy.run(fn, args=(next(iterator),))", "2.0"),
    # --- Keras 2 (tf.keras up to TF 2.15) ------------------------------------------------------
    Alias(
        f"{METRIC}.reset_states",
        "Metric.reset_state()",
        "towerdist._src.metrics.metric:reset_states",
        "2.5 (removed in 2.16 with Keras 3)",
        "method",
    ),
    Alias(
        f"{EXTENDED}.experimental_make_numpy_dataset",
        "td.data.Dataset.from_tensor_slices()",
        f"{_LEGACY}:experimental_make_numpy_dataset",
        "2.2",
        "method",
    ),
)

_resolved: dict[str, Any] = {}  # old name -> its implementation, once resolved
_BY_OWNER: dict[str, dict[str, Alias]] = {}
for _alias in ALIASES:
    _BY_OWNER.setdefault(_alias.owner, {})[_alias.name] = _alias
del _alias

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


def module_getattr(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving the old names the table lists for ``module``.

    Use as ``__getattr__ = aliases.module_getattr(__name__)`` in a public module. A name that
    is neither there nor in the table raises ``AttributeError``; for a TensorFlow name that
    towerdist does not provide, its message says what to use instead (``not_provided.py``).
    """
    table = _BY_OWNER.get(module, {})

    def __getattr__(name: str) -> Any:
        alias = table.get(name)
        if alias is None:  # for a TensorFlow name towerdist lacks, the error says what to use instead
            raise not_provided.attribute_error(module, name)
        # stacklevel 2 from _warn_once's caller: the user's line (attribute access or import).
        _warn_once(alias, stacklevel=2)
        return alias.resolve()

    return __getattr__


def module_dir(module: str, names: Iterable[str]) -> Callable[[], list[str]]:
    """A module ``__dir__`` listing ``names`` and the module's old names."""
    listed = sorted(set(names) | set(_BY_OWNER.get(module, {})))
    return lambda: listed


class _OldMember:
    """The descriptor serving one old member name of a class."""

    def __init__(self, alias: Alias) -> None:
        self._alias = alias
        self.__doc__ = alias.message()

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        alias = self._alias
        target = alias.resolve()
        if alias.kind == "value":
            _warn_once(alias, stacklevel=2)
            return target
        if instance is None:
            return target  # for inspect and help(): no warning
        _warn_once(alias, stacklevel=2)
        if alias.kind == "property":
            return target(instance)
        return target.__get__(instance, owner)

    def __set__(self, instance: Any, value: Any) -> None:
        _read_only(self._alias)(instance, value)


def install(cls: type, owner: str) -> None:
    """Puts a descriptor on ``cls`` for each member alias of ``owner`` in the table."""
    for name, alias in _BY_OWNER.get(owner, {}).items():
        descriptor = _OldMember(alias)
        descriptor.__set_name__(cls, name)
        setattr(cls, name, descriptor)


# --- old names written in their class body ----------------------------------------------

_registered: list[Alias] = []  # old members registered by has_old_names, in definition order
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
        def warned(*args: Any, **kwargs: Any) -> Any:
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
            kind = "property" if isinstance(raw, property) else "method"
            alias = Alias(f"{owner}.{name}", mark.new, f"{cls.__module__}:{cls.__qualname__}.{name}", mark.since, kind)
            if name in _BY_OWNER.get(owner, {}):
                raise ValueError(f"{alias.old} is registered twice in the alias table.")
            _BY_OWNER.setdefault(owner, {})[name] = alias
            _MARKED[fn] = alias
            _registered.append(alias)
            if isinstance(raw, property):
                setattr(cls, name, property(raw.fget, _read_only(alias), doc=raw.__doc__))
        return cls

    return register


def _read_only(alias: Alias) -> Callable[[Any, Any], None]:
    def refuse(instance: Any, value: Any) -> None:
        raise AttributeError(f"{alias.old} is read-only (a deprecated name of {alias.new}).")

    return refuse


def all_aliases() -> tuple[Alias, ...]:
    """Every old name towerdist keeps: :data:`ALIASES` and the members registered by :func:`has_old_names`."""
    importlib.import_module("towerdist")  # defines (and so registers) every class with old names
    return (*ALIASES, *_registered)
