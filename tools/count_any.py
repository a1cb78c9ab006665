"""Count the parameters and returns of towerdist's functions that are annotated exactly ``Any``.

Reads every ``.py`` file under ``src/towerdist`` (``_src`` included) with ``ast``, nothing
imported. A parameter counts when it carries an annotation: positional-only, ordinary,
keyword-only, ``*args`` and ``**kwargs``; the first parameter of a method (``self``,
``cls``: a function defined directly in a class body, unless it is a ``staticmethod``) is
left out. An annotation is *exactly* ``Any`` when it is the name ``Any`` or ``typing.Any``
(any module alias: ``t.Any``), or the string of one; ``Any | None`` or ``list[Any]`` are
not. Returns are counted the same way, over the functions with a return annotation.

The names the package defines as ``Any`` (``Nest: TypeAlias = Any``: documented aliases for
values that really are anything) are reported apart: a parameter annotated with one of them
(or with one ``| None``) is not exactly ``Any``, but a reader should see how many there are.

    python tools/count_any.py                   # totals, percentages, the top 15 files
    python tools/count_any.py --max-percent 10  # exit status 1 above 10 % of parameters
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import pathlib
import sys
from collections.abc import Iterator, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "towerdist"
TOP_FILES = 15


@dataclasses.dataclass
class Counts:
    """Annotated parameters and returns, and how many of each are exactly ``Any``."""

    parameters: int = 0
    any_parameters: int = 0
    aliased_parameters: int = 0  # annotated with a name the package defines as Any
    returns: int = 0
    any_returns: int = 0

    def __iadd__(self, other: Counts) -> Counts:
        self.parameters += other.parameters
        self.any_parameters += other.any_parameters
        self.aliased_parameters += other.aliased_parameters
        self.returns += other.returns
        self.any_returns += other.any_returns
        return self


def is_exactly_any(annotation: ast.expr) -> bool:
    """Whether ``annotation`` is ``Any``, ``<module>.Any`` or a string holding one of them."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value.strip(), mode="eval").body
        except SyntaxError:
            return False
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    return isinstance(annotation, ast.Attribute) and annotation.attr == "Any" and isinstance(annotation.value, ast.Name)


def any_aliases(sources: Sequence[str]) -> frozenset[str]:
    """The names the modules define as ``Any`` at their top level (``X: TypeAlias = Any``, ``X = Any``),
    or as another such name (``ElementSpec: TypeAlias = Nest``)."""
    definitions: list[tuple[str, ast.expr]] = []
    for source in sources:
        for statement in ast.parse(source).body:
            if isinstance(statement, ast.AnnAssign) and statement.value is not None:
                targets: list[ast.expr] = [statement.target]
            elif isinstance(statement, ast.Assign):
                targets = statement.targets
            else:
                continue
            value = statement.value
            assert value is not None
            definitions.extend((target.id, value) for target in targets if isinstance(target, ast.Name))
    names: set[str] = set()
    while True:
        found = {
            name for name, value in definitions
            if is_exactly_any(value) or (isinstance(value, ast.Name) and value.id in names)
        }
        if found <= names:
            return frozenset(names)
        names |= found


def is_alias(annotation: ast.expr, aliases: frozenset[str]) -> bool:
    """Whether ``annotation`` is one of ``aliases``, or one of them ``| None``."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        if isinstance(annotation.right, ast.Constant) and annotation.right.value is None:
            annotation = annotation.left
    return isinstance(annotation, ast.Name) and annotation.id in aliases


def _is_staticmethod(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in function.decorator_list:
        name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", None)
        if name == "staticmethod":
            return True
    return False


def _functions(node: ast.AST, in_class: bool = False) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """Every function under ``node``, with whether it is a method (defined directly in a class body)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield child, in_class and not _is_staticmethod(child)
            yield from _functions(child, False)  # a function nested in a method is no method
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, True)
        else:  # statements such as ``if TYPE_CHECKING:`` keep the body they are in
            yield from _functions(child, in_class)


def count_source(source: str, aliases: frozenset[str] = frozenset()) -> Counts:
    """The counts of one module's source text; ``aliases``: the names defined as ``Any``."""
    counts = Counts()
    for function, is_method in _functions(ast.parse(source)):
        arguments = function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        if is_method and positional:
            positional = positional[1:]  # self or cls
        parameters = [*positional, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
        for parameter in parameters:
            if parameter is not None and parameter.annotation is not None:
                counts.parameters += 1
                counts.any_parameters += is_exactly_any(parameter.annotation)
                counts.aliased_parameters += is_alias(parameter.annotation, aliases)
        if function.returns is not None:
            counts.returns += 1
            counts.any_returns += is_exactly_any(function.returns)
    return counts


def count_tree(package: pathlib.Path) -> dict[pathlib.Path, Counts]:
    """The counts of every ``.py`` file under ``package``, by path."""
    sources = {path: path.read_text(encoding="utf-8") for path in sorted(package.rglob("*.py"))}
    aliases = any_aliases(list(sources.values()))
    return {path: count_source(source, aliases) for path, source in sources.items()}


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the counts; returns 1 when ``--max-percent`` is given and exceeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", type=pathlib.Path, default=PACKAGE, help="default: src/towerdist")
    parser.add_argument("--max-percent", type=float, help="fail when more parameters than this are exactly Any")
    args = parser.parse_args(argv)

    by_file = count_tree(args.package)
    total = Counts()
    for counts in by_file.values():
        total += counts
    param_percent = _percent(total.any_parameters, total.parameters)
    print(f"parameters: {total.any_parameters} of {total.parameters} annotated are exactly Any ({param_percent:.1f} %)")
    aliased_percent = _percent(total.aliased_parameters, total.parameters)
    print(f"            {total.aliased_parameters} more are annotated with a name defined as Any (Nest, TensorLike, ...: "
          f"{aliased_percent:.1f} %)")
    return_percent = _percent(total.any_returns, total.returns)
    print(f"returns:    {total.any_returns} of {total.returns} annotated are exactly Any ({return_percent:.1f} %)")
    print(f"the {TOP_FILES} files with the most parameters annotated Any:")
    top = sorted(by_file.items(), key=lambda item: (-item[1].any_parameters, str(item[0])))[:TOP_FILES]
    for path, counts in top:
        if counts.any_parameters:
            shown = path.relative_to(args.package.parent) if path.is_relative_to(args.package.parent) else path
            print(f"  {counts.any_parameters:5d} of {counts.parameters:5d}  {shown}")
    if args.max_percent is not None and param_percent > args.max_percent:
        print(
            f"count_any: {param_percent:.1f} % of the annotated parameters are exactly Any, more than "
            f"--max-percent {args.max_percent:g}; annotate them with a precise type or a domain alias.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
