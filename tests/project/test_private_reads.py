"""Underscores mean "this package only": no package reads another's private members except through a seam.

A *unit* is a subpackage or top-level module of ``towerdist._src`` (as in the layer test);
the public facade (``towerdist`` and its public subpackages) is one more. A private name
(one leading underscore) belongs to the units that define it: a ``def``/``class``, an
assignment at module or class level, a ``__slots__`` entry, or ``self._x = ...``. A unit may
read ``obj._x`` (``obj`` not ``self``/``cls``) or import ``_x`` only if it defines ``_x``
itself, or if ``_x`` is a member of a seam protocol of ``towerdist/_src/seams.py``: what one
package asks of another, typed and documented there and in ``docs/contributing.md``.

Private names that towerdist does not define (``sys._getframe``, a namedtuple's ``_replace``)
are Python's and not checked. A name defined in several units counts as each one's: the
check cannot tell whose ``_values`` an expression holds, so such a read passes in any unit
that defines the name too.
"""

from __future__ import annotations

import ast
import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
PRIVATE = SOURCE / "towerdist" / "_src"
SEAMS = PRIVATE / "seams.py"
PUBLIC = "towerdist (public)"

Read = tuple[str, str, int, str]  # (unit, file relative to src/, line, name)


def _unit_of(path: pathlib.Path) -> str:
    try:
        parts = path.relative_to(PRIVATE).parts
    except ValueError:
        return PUBLIC
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own members."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def definitions(tree: ast.AST) -> set[str]:
    """The private names a module defines."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)  # ``self._x = ...``, or an attribute this module puts on an object
    bodies = [tree.body] + [node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    for body in bodies:
        for statement in body:
            targets: list[ast.expr] = []
            if isinstance(statement, ast.Assign):
                targets = statement.targets
            elif isinstance(statement, ast.AnnAssign):
                targets = [statement.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
                if isinstance(target, ast.Name) and target.id == "__slots__" and statement.value is not None:
                    names.update(
                        leaf.value
                        for leaf in ast.walk(statement.value)
                        if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str)
                    )
    return {name for name in names if _private(name)}


def _python_modules(tree: ast.AST) -> set[str]:
    """The names a module binds to modules outside towerdist (``import os``): their privates are Python's."""
    return {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if not alias.name.startswith("towerdist")
    }


def reads(tree: ast.AST) -> list[tuple[int, str]]:
    """The private names a module reads off other objects or imports from other modules."""
    found: list[tuple[int, str]] = []
    python = _python_modules(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            if isinstance(node.ctx, ast.Load) and not (isinstance(node.value, ast.Name) and node.value.id in python):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("towerdist"):
            found.extend((node.lineno, alias.name) for alias in node.names if _private(alias.name))
    return found


def seam_names(source: str) -> set[str]:
    """The members of the seam protocols (every class of ``seams.py``)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            names |= definitions(ast.Module(body=node.body, type_ignores=[]))
            names |= {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return {name for name in names if _private(name)}


def cross_package_reads(modules: dict[str, tuple[str, str]], seams: set[str]) -> list[Read]:
    """``modules``: file name -> (unit, source). The reads of private names other units own, not seams."""
    trees = {name: ast.parse(source) for name, (_, source) in modules.items()}
    owners: dict[str, set[str]] = collections.defaultdict(set)
    for name, tree in trees.items():
        for private in definitions(tree):
            owners[private].add(modules[name][0])
    found: list[Read] = []
    for name, tree in trees.items():
        unit = modules[name][0]
        for line, private in reads(tree):
            if private in seams or private not in owners or unit in owners[private]:
                continue
            found.append((unit, name, line, private))
    return sorted(found)


def _package_modules() -> dict[str, tuple[str, str]]:
    return {
        str(path.relative_to(SOURCE)): (_unit_of(path), path.read_text(encoding="utf-8"))
        for path in sorted((SOURCE / "towerdist").rglob("*.py"))
    }


def test_no_package_reads_another_packages_private_members_outside_the_seams() -> None:
    found = cross_package_reads(_package_modules(), seam_names(SEAMS.read_text(encoding="utf-8")))
    listed = "\n".join(f"  {file}:{line}: {name} (in {unit})" for unit, file, line, name in found)
    assert not found, (
        f"{len(found)} read(s) of another package's private members:\n{listed}\n"
        "Use a public member, or name what the package needs in a protocol of towerdist/_src/seams.py."
    )


def test_every_seam_member_is_defined_by_some_package() -> None:
    modules = _package_modules()
    defined = set().union(*(definitions(ast.parse(source)) for name, (_, source) in modules.items()
                            if not name.endswith("_src/seams.py")))
    stale = seam_names(SEAMS.read_text(encoding="utf-8")) - defined
    assert not stale, f"seams.py names members no package defines: {sorted(stale)}"


# --- the check finds what it must find ---------------------------------------------------------

_OWNER = '''
class Variable:
    __slots__ = ("_array",)

    def __init__(self):
        self._array = None
        self._lock = None

def _helper():
    pass
'''


@pytest.mark.parametrize(
    ("reader", "name"),
    [
        ("def f(v):\n    return v._array\n", "_array"),  # a __slots__ entry
        ("def f(v):\n    return v._lock\n", "_lock"),  # set in __init__
        ("from towerdist._src.variables.variable import _helper\n", "_helper"),  # a private function imported
        ("def f(v):\n    v._lock.acquire()\n", "_lock"),  # a call on it
    ],
)
def test_a_planted_read_of_another_packages_private_member_is_found(reader: str, name: str) -> None:
    modules = {"towerdist/_src/variables/variable.py": ("variables", _OWNER), "towerdist/_src/optimizers/o.py": ("optimizers", reader)}
    assert [(unit, read) for unit, _, _, read in cross_package_reads(modules, set())] == [("optimizers", name)]


def test_reads_within_the_package_of_seam_members_and_of_pythons_privates_pass() -> None:
    modules = {
        "towerdist/_src/variables/variable.py": ("variables", _OWNER),
        "towerdist/_src/variables/other.py": ("variables", "def f(v):\n    return v._array\n"),
        "towerdist/_src/optimizers/o.py": ("optimizers", "import os\n\ndef f(v):\n    os._helper()\n    return v._lock\n"),
    }
    assert cross_package_reads(modules, {"_lock"}) == []
    assert cross_package_reads(modules, set()) == [("optimizers", "towerdist/_src/optimizers/o.py", 5, "_lock")]


def test_seam_names_are_the_protocols_members() -> None:
    source = '''
from typing import Protocol

class StrategySeam(Protocol):
    _num_workers: int

    def _create_variable(self, spec): ...

    @property
    def _replica_devices(self): ...
'''
    assert seam_names(source) == {"_num_workers", "_create_variable", "_replica_devices"}
