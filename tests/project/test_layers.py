"""The layer order written in docs/contributing.md holds in the code, and no import cycle crosses a package.

Every import a module of ``src/towerdist`` executes counts: at the top of the file and inside
functions; only ``if TYPE_CHECKING:`` blocks are left out (they never run). A *unit* is a
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
PRIVATE = SOURCE / "towerdist" / "_src"
PAGE = ROOT / "docs" / "contributing.md"
PUBLIC = "towerdist (public)"

Site = tuple[str, int]  # (file relative to src/, line)

# `from towerdist._src.errors import X` names X, not a unit: only these names are units.
_PRIVATE_UNITS = frozenset(path.stem for path in PRIVATE.iterdir() if not path.name.startswith("__"))


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


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def _imported_units(node: ast.AST) -> set[str]:
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    units = {_unit(name) for name in names}
    return {unit for unit in units if unit is not None and (unit == PUBLIC or unit in _PRIVATE_UNITS)}


def import_graph() -> tuple[set[str], dict[tuple[str, str], list[Site]]]:
    """Every unit, and for each pair of units the import sites from one into the other."""
    units: set[str] = set()
    sites: dict[tuple[str, str], list[Site]] = collections.defaultdict(list)
    for path in sorted(SOURCE.joinpath("towerdist").rglob("*.py")):
        source_unit = _unit(_module_name(path))
        if source_unit is None:  # towerdist/_src/__init__.py, a docstring at most
            assert "import" not in path.read_text(encoding="utf-8"), f"{path} must stay empty"
            continue
        units.add(source_unit)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            for target in _imported_units(node):
                if target != source_unit:
                    sites[(source_unit, target)].append((str(path.relative_to(SOURCE)), node.lineno))
    return units, sites


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
def graph() -> tuple[set[str], dict[tuple[str, str], list[Site]]]:
    return import_graph()


def test_no_import_cycle_crosses_a_package(graph: tuple[set[str], dict[tuple[str, str], list[Site]]]) -> None:
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


def test_every_unit_has_a_documented_layer(graph: tuple[set[str], dict[tuple[str, str], list[Site]]]) -> None:
    units, _ = graph
    layers = documented_layers()
    assert sorted(units - layers.keys()) == [], "add these to the layer table of docs/contributing.md"
    assert sorted(layers.keys() - units) == [], "the layer table of docs/contributing.md names units that are gone"


def test_every_import_goes_down_the_documented_layers(
    graph: tuple[set[str], dict[tuple[str, str], list[Site]]],
) -> None:
    _, sites = graph
    layers = documented_layers()
    upward = sorted(
        (source, target)
        for source, target in sites
        if source in layers and target in layers and layers[target] > layers[source]
    )
    assert not upward, "imports that go up the layers of docs/contributing.md:\n" + _describe(upward, sites)


def test_the_graph_sees_function_level_imports_and_skips_type_checking_blocks(tmp_path: pathlib.Path) -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from towerdist._src.strategies.strategy import Strategy\n"
        "def f():\n"
        "    from towerdist._src.data import dataset\n"
        "    import towerdist.distribute\n"
    )
    skipped = _type_checking_nodes(tree)
    found = set().union(*(_imported_units(node) for node in ast.walk(tree) if id(node) not in skipped))
    assert found == {"data", PUBLIC}


def test_a_cycle_is_found_and_a_chain_is_not() -> None:
    assert strongly_connected({"a", "b", "c"}, {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a", "b", "c"}, {"a": {"b"}, "b": {"c"}}) == []
