"""Every public symbol has a docstring (as mpi4py's test suite checks for its API).

"Public" means: every public module of towerdist (no leading underscore anywhere in its
dotted name), every name it exports in ``__all__``, and every public method and property
of the classes among them (including members inherited from towerdist base classes).
An override may rely on its base class's docstring (``inspect.getdoc`` inherits it).
The old names of the alias table are public too: their targets need docstrings.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import towerdist
from towerdist._src import aliases


def _public_modules() -> list[str]:
    names = ["towerdist"]
    for info in pkgutil.walk_packages(towerdist.__path__, "towerdist."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


PUBLIC_MODULES = _public_modules()


def _exported(module_name: str) -> list[tuple[str, object]]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return [(f"{module_name}.{n}", getattr(module, n)) for n in names]


def _is_ours(obj: object) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("towerdist")


def _member_docs(cls: type) -> list[tuple[str, str | None]]:
    """(defining class's qualified name + member, docstring) of the public members of ``cls``.

    Covers the members ``cls`` defines or inherits from towerdist classes.
    """
    found: dict[str, tuple[type, str | None]] = {}
    for klass in cls.__mro__:
        if not _is_ours(klass):
            continue
        for name, raw in vars(klass).items():
            if name.startswith("_") or name in found or isinstance(raw, aliases._OldMember):
                continue  # old names are checked through the alias table below
            if isinstance(raw, property):
                doc = inspect.getdoc(raw.fget) or inspect.getdoc(raw)
            elif isinstance(raw, (classmethod, staticmethod)) or inspect.isfunction(raw):
                # An override inherits its documentation from any base defining the name.
                doc = inspect.getdoc(getattr(cls, name))
            else:
                continue  # enum members and constants; nested classes are exported separately
            found[name] = (klass, doc)
    return [(f"{k.__module__}.{k.__qualname__}.{n}", doc) for n, (k, doc) in found.items()]


def _undocumented() -> list[str]:
    missing: list[str] = []
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        if not (module.__doc__ or "").strip():
            missing.append(f"module {module_name}")
        for qualname, obj in _exported(module_name):
            if inspect.ismodule(obj) or id(obj) in seen or not _is_ours(obj):
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                if not (vars(obj).get("__doc__") or "").strip():
                    missing.append(qualname)
                missing.extend(name for name, doc in _member_docs(obj) if not (doc or "").strip())
            elif callable(obj) and not (inspect.getdoc(obj) or "").strip():
                missing.append(qualname)
    for alias in aliases.all_aliases():
        target = alias.target
        if alias.kind != "value" and not (inspect.getdoc(target) or "").strip():
            missing.append(f"{alias.old} -> {target!r}")
    return sorted(set(missing))


def test_the_walk_finds_the_public_api():
    # Guards the test itself: a broken walk would pass vacuously.
    assert {"towerdist", "towerdist.distribute", "towerdist.compat.v1", "towerdist.contrib.distribute"} <= set(
        PUBLIC_MODULES
    )
    exported = {name for module in PUBLIC_MODULES for name, _ in _exported(module)}
    assert "towerdist.distribute.MirroredStrategy" in exported
    assert "towerdist.compat.v1.distribute.MirroredStrategy" in exported
    members = dict(_member_docs(towerdist.distribute.MirroredStrategy))
    assert "towerdist._src.strategies.strategy.Strategy.run" in members
    assert "towerdist._src.strategies.strategy_extended.StrategyExtended.reduce_to" in dict(
        _member_docs(towerdist.distribute.StrategyExtended)
    )


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_module_has_a_docstring(module_name):
    assert (importlib.import_module(module_name).__doc__ or "").strip(), module_name


def test_every_public_symbol_has_a_docstring():
    missing = _undocumented()
    assert not missing, "public symbols without a docstring:\n  " + "\n  ".join(missing)
