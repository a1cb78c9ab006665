"""Nested structures (lists, tuples, namedtuples, dicts) through optree.

``None`` is a leaf, as in TensorFlow's ``tf.nest``. This module only fixes optree's
options and adds :func:`explain_mismatch`, which says *where* two structures differ
(``"at [1]['logits']: a list of length 2 vs a list of length 3"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optree

from towerdist._src.type_aliases import Nest

__all__ = ["explain_mismatch", "flatten", "format_path", "map_structure", "unflatten"]

PyTreeSpec = optree.PyTreeSpec


def flatten(tree: Nest) -> tuple[list[Any], PyTreeSpec]:
    """The leaves of ``tree`` (dicts in sorted-key order) and its structure."""
    return optree.tree_flatten(tree, none_is_leaf=True)


def flatten_with_paths(tree: Nest) -> tuple[list[tuple[Any, ...]], list[Any], PyTreeSpec]:
    return optree.tree_flatten_with_path(tree, none_is_leaf=True)


def unflatten(spec: PyTreeSpec, leaves: Sequence[Any]) -> Nest:
    """Rebuilds a structure like the one ``spec`` came from (dicts keep their key order)."""
    return optree.tree_unflatten(spec, leaves)


def map_structure(fn: Callable[..., Any], tree: Nest, *rest: Nest) -> Nest:
    return optree.tree_map(fn, tree, *rest, none_is_leaf=True)


def is_nested(value: Nest) -> bool:
    """True if ``value`` is a list, tuple, namedtuple or dict (a structure, not a leaf)."""
    return not optree.treespec_is_leaf(optree.tree_structure(value, none_is_leaf=True))


def format_path(path: Sequence[Any]) -> str:
    """``('a', 0)`` -> ``"['a'][0]"``; the empty path is ``"the top level"``."""
    if not path:
        return "the top level"
    return "".join(f"[{key!r}]" for key in path)


def explain_mismatch(first: Nest, other: Nest) -> str:
    """Describes the first place where two structures differ, with its path."""
    return _explain(first, other, ())


def _describe(node: Nest) -> str:
    spec = optree.tree_structure(node, none_is_leaf=True)
    if optree.treespec_is_leaf(spec):
        return f"a leaf ({type(node).__name__})"
    kind = type(node).__name__
    if isinstance(node, dict):
        return f"a {kind} with keys {', '.join(sorted(map(repr, node)))}"
    return f"a {kind} of length {len(node)}"


def _explain(a: Nest, b: Nest, path: tuple[Any, ...]) -> str:
    spec_a = optree.tree_structure(a, none_is_leaf=True)
    spec_b = optree.tree_structure(b, none_is_leaf=True)
    if spec_a == spec_b:
        return ""
    here = f"at {format_path(path)}: {_describe(a)} vs {_describe(b)}"
    if spec_a.type is not spec_b.type or spec_a.num_children != spec_b.num_children:
        return here
    if isinstance(a, dict):
        if set(a) != set(b):
            return here
        keys: Sequence[Any] = sorted(a, key=repr)
        children = [(key, a[key], b[key]) for key in keys]
    else:
        children = [(i, x, y) for i, (x, y) in enumerate(zip(a, b))]
    for key, x, y in children:
        inner = _explain(x, y, (*path, key))
        if inner:
            return inner
    return here
