"""The layer order written in docs/contributing.md holds in the code, and no import cycle crosses a package.

Every import a module of ``src/towerdist`` executes counts: ``import`` and ``from ... import``
statements, absolute or relative, at the top of the file, inside functions and under any ``if``
(the ``else`` of ``if TYPE_CHECKING:`` and ``if not TYPE_CHECKING:`` included), and calls of
``importlib.import_module`` or ``__import__`` with a literal module name. Only the body of
``if TYPE_CHECKING:`` (or ``if typing.TYPE_CHECKING:``) is left out: it never runs. A *unit* is a
subpackage or top-level module of ``towerdist._src``; the public facade (``towerdist`` and its
public subpackages) is one more unit, the top one.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
PAGE = ROOT / "docs" / "contributing.md"
PUBLIC = "towerdist (public)"

Site = tuple[str, int]  # (file relative to the source root, line)
Graph = tuple[set[str], dict[tuple[str, str], list[Site]]]


def private_units(source: pathlib.Path) -> frozenset[str]:
    """The units of the tree under ``source``: `from towerdist._src.errors import X` names X, not a unit."""
    private = source / "towerdist" / "_src"
    return frozenset(path.stem for path in private.iterdir() if not path.name.startswith("__"))


def _unit(module: str) -> str | None:
    """The unit a dotted module name belongs to, or None outside towerdist."""
    parts = module.split(".")
    if parts[0] != "towerdist":
        return None
    if len(parts) >= 3 and parts[1] == "_src":
        return parts[2]
    if len(parts) == 2 and parts[1] == "_src":
        return None  # `from towerdist._src import x`: resolved per imported name
    return PUBLIC


def _module_name(path: pathlib.Path, source: pathlib.Path) -> str:
    parts = path.relative_to(source).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(name: str, level: int, package: str) -> str:
    """``name`` imported with ``level`` leading dots from a module of ``package``, as an absolute name."""
    if level == 0:
        return name
    base = package.rsplit(".", level - 1)[0] if level > 1 else package
    return f"{base}.{name}" if name else base


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` test is exactly ``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (a body that never runs)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return (
        isinstance(test, ast.Attribute)
        and test.attr == "TYPE_CHECKING"
        and isinstance(test.value, ast.Name)
        and test.value.id in {"typing", "_typing"}
    )


def _never_run(tree: ast.AST) -> set[int]:
    """The nodes in the bodies of ``if TYPE_CHECKING:`` blocks (their ``else`` runs, so it is not here)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _called_import(call: ast.Call, package: str) -> str | None:
    """The module ``importlib.import_module("...")`` or ``__import__("...")`` imports, when it is a literal."""
    function = call.func
    called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    if called not in {"import_module", "__import__"} or not call.args:
        return None
    name = _literal(call.args[0])
    if name is None:
        return None
    if called == "import_module" and name.startswith("."):
        anchor = _literal(call.args[1]) if len(call.args) > 1 else None
        stripped = name.lstrip(".")
        return _absolute(stripped, len(name) - len(stripped), anchor or package)
    return name


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Each module the code ``source`` of ``module`` imports when it runs, absolute, with its line.

    ``from m import a`` yields ``m`` and ``m.a`` (``a`` may be a submodule); relative imports are
    resolved against the module's package.
    """
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    skipped = _never_run(tree)
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node.level, package)
            found += [(base, node.lineno)] + [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.Call) and (name := _called_import(node, package)) is not None:
            found.append((name, node.lineno))
    return found


def import_graph(source: pathlib.Path = SOURCE) -> Graph:
    """Every unit of the tree under ``source``, and for each pair of units the import sites from one into the other."""
    known = private_units(source)
    units: set[str] = set()
    sites: dict[tuple[str, str], list[Site]] = collections.defaultdict(list)
    for path in sorted(source.joinpath("towerdist").rglob("*.py")):
        module = _module_name(path, source)
        source_unit = _unit(module)
        text = path.read_text(encoding="utf-8")
        if source_unit is None:  # towerdist/_src/__init__.py, a docstring at most
            assert "import" not in text, f"{path} must stay empty"
            continue
        units.add(source_unit)
        for name, line in imported_modules(text, module, path.name == "__init__.py"):
            target = _unit(name)
            if target is not None and target != source_unit and (target == PUBLIC or target in known):
                site = (str(path.relative_to(source)), line)
                if site not in sites[(source_unit, target)]:
                    sites[(source_unit, target)].append(site)
    return units, sites


def upward_imports(graph: Graph, layers: dict[str, int]) -> list[tuple[str, str]]:
    """The pairs of units ``(source, target)`` where ``source`` imports a unit of a higher layer."""
    _, sites = graph
    return sorted(
        (source, target)
        for source, target in sites
        if source in layers and target in layers and layers[target] > layers[source]
    )


def documented_layers() -> dict[str, int]:
    """``{unit: layer}`` from the layer table of docs/contributing.md (layer 0 at the bottom)."""
    layers: dict[str, int] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        row = re.match(r"^\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row is None:
            continue
        for name in re.findall(r"`([^`]+)`", row.group(2)):
            assert name not in layers, f"docs/contributing.md puts {name} in two layers"
            layers[name] = int(row.group(1))
    return layers


def strongly_connected(units: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of the unit graph: its strongly connected components of more than one unit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        on_stack.add(unit)
        for target in sorted(edges.get(unit, ())):
            if target not in index:
                visit(target)
                low[unit] = min(low[unit], low[target])
            elif target in on_stack:
                low[unit] = min(low[unit], index[target])
        if low[unit] == index[unit]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == unit:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(units):
        if unit not in index:
            visit(unit)
    return found


def _describe(pairs: list[tuple[str, str]], sites: dict[tuple[str, str], list[Site]]) -> str:
    return "\n".join(
        f"  {source} -> {target}: " + ", ".join(f"{file}:{line}" for file, line in sites[(source, target)][:4])
        for source, target in pairs
    )


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph()


def test_no_import_cycle_crosses_a_package(graph: Graph) -> None:
    units, sites = graph
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for source, target in sites:
        edges[source].add(target)
    cycles = strongly_connected(units, edges)
    described = [
        _describe([(s, t) for (s, t) in sites if s in cycle and t in cycle], sites) for cycle in cycles
    ]
    assert not cycles, "import cycles between packages:\n" + "\n".join(
        f"{' <-> '.join(cycle)}\n{text}" for cycle, text in zip(cycles, described)
    )


def test_every_unit_has_a_documented_layer(graph: Graph) -> None:
    units, _ = graph
    layers = documented_layers()
    assert sorted(units - layers.keys()) == [], "add these to the layer table of docs/contributing.md"
    assert sorted(layers.keys() - units) == [], "the layer table of docs/contributing.md names units that are gone"


def test_every_import_goes_down_the_documented_layers(graph: Graph) -> None:
    upward = upward_imports(graph, documented_layers())
    assert not upward, "imports that go up the layers of docs/contributing.md:\n" + _describe(upward, graph[1])


# --- the check can fail: each way of writing an import, planted in a module of `values` (layer 2) ---

_PLANTED = {
    "relative import": "from ..strategies import strategy\n",
    "relative import of the package": "from .. import strategies\n",
    "else of if TYPE_CHECKING": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    pass\n"
        "else:\n"
        "    from towerdist._src.strategies import strategy\n"
    ),
    "elif after if TYPE_CHECKING": (
        "import typing\n"
        "if typing.TYPE_CHECKING:\n"
        "    pass\n"
        "elif True:\n"
        "    import towerdist._src.strategies.strategy\n"
    ),
    "if not TYPE_CHECKING": (
        "from typing import TYPE_CHECKING\n"
        "if not TYPE_CHECKING:\n"
        "    from towerdist._src.strategies import strategy\n"
    ),
    "a condition mentioning TYPE_CHECKING": (
        "import sys\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING or sys.version_info >= (3,):\n"
        "    import towerdist._src.strategies\n"
    ),
    "importlib.import_module literal": (
        "import importlib\n"
        "def resolve():\n"
        '    return importlib.import_module("towerdist._src.strategies.strategy").Strategy\n'
    ),
    "import_module literal, relative": (
        "from importlib import import_module\n"
        'STRATEGY = import_module("..strategies.strategy", __package__)\n'
    ),
    "__import__ literal": '__import__("towerdist._src.strategies.strategy")\n',
}


def _planted_tree(root: pathlib.Path, source: str) -> pathlib.Path:
    """A source tree whose `values` package (layer 2) holds ``source`` beside an empty `strategies` (layer 4)."""
    private = root / "towerdist" / "_src"
    for package in ("values", "strategies"):
        (private / package).mkdir(parents=True)
        (private / package / "__init__.py").write_text("")
    (private / "strategies" / "strategy.py").write_text("class Strategy: ...\n")
    (private / "values" / "planted.py").write_text(source)
    return root


@pytest.mark.parametrize("source", _PLANTED.values(), ids=_PLANTED.keys())
def test_a_planted_upward_import_fails_the_check(tmp_path: pathlib.Path, source: str) -> None:
    graph = import_graph(_planted_tree(tmp_path, source))
    assert upward_imports(graph, documented_layers()) == [("values", "strategies")]
    assert graph[1][("values", "strategies")][0][0] == str(pathlib.Path("towerdist/_src/values/planted.py"))


@pytest.mark.parametrize(
    "source",
    [
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..strategies import strategy\n",
        "import typing\nif typing.TYPE_CHECKING:\n    import towerdist._src.strategies\nelse:\n    pass\n",
        "import importlib\ndef load(name):\n    return importlib.import_module(name)\n",
        "from . import planted\nfrom .planted import x\n",
    ],
    ids=["if TYPE_CHECKING body", "typing.TYPE_CHECKING body", "import_module of a variable", "within the package"],
)
def test_what_never_runs_or_stays_in_the_package_passes_the_check(tmp_path: pathlib.Path, source: str) -> None:
    assert upward_imports(import_graph(_planted_tree(tmp_path, source)), documented_layers()) == []


def test_imports_resolve_to_absolute_modules_with_their_lines() -> None:
    source = (
        "from . import sibling\n"
        "from ...errors import Error\n"
        "def f():\n"
        "    import towerdist.distribute\n"
    )
    assert imported_modules(source, "towerdist._src.values.planted", is_package=False) == [
        ("towerdist._src.values", 1),
        ("towerdist._src.values.sibling", 1),
        ("towerdist.errors", 2),
        ("towerdist.errors.Error", 2),
        ("towerdist.distribute", 4),
    ]
    assert imported_modules("from .x import y\n", "towerdist._src.values", is_package=True) == [
        ("towerdist._src.values.x", 1),
        ("towerdist._src.values.x.y", 1),
    ]


def test_a_cycle_is_found_and_a_chain_is_not() -> None:
    assert strongly_connected({"a", "b", "c"}, {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a", "b", "c"}, {"a": {"b"}, "b": {"c"}}) == []
