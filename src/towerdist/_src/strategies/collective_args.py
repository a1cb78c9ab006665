"""Checking the replicas' arguments of a collective, once, at the API the user called.

``ReplicaContext.all_reduce`` and ``all_gather`` take a nested structure from every
replica. Before any data moves, the structures must agree, and each leaf must have the
same dtype on every replica and the same shape (for ``all_gather``: the same size in every
dimension but the gather axis). A mismatch raises ``InvalidArgumentError`` naming the API,
the key path of the leaf and the replicas, e.g.::

    ReplicaContext.all_reduce() needs the same shape and dtype from every replica, but at
    ['logits'] replica 0 has shape (3,), replica 1 has (4,).

The per-replica arguments arrive as :class:`Contribution` objects (one per replica,
holding the flattened leaves and the structure), so that a structure mismatch is reported
here and not as a failure to regroup the arguments of an internal ``merge_call``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from towerdist._src import nest
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import API, unworded
from towerdist._src.indexed_slices import IndexedSlices, check_reducible
from towerdist._src.type_aliases import Array, Nest

__all__ = ["Contribution", "check_gather_leaves", "check_reduce_leaves", "check_structures"]


class Contribution:
    """One replica's flattened argument to a collective.

    A fresh object per replica and call, so regrouping always makes a ``PerReplica`` of
    the contributions: an all-reduce counts every replica's value even when replicas pass
    the same array object.
    """

    __slots__ = ("arrays", "spec")

    def __init__(self, arrays: list[Any], spec: nest.PyTreeSpec | None) -> None:
        self.arrays = arrays
        self.spec = spec


def check_structures(contributions: Sequence[Contribution]) -> None:
    """Raises ``InvalidArgumentError`` unless every replica passed the same nested structure.

    A contribution's ``spec`` is None for a single array (no structure to compare). The
    error is :func:`unworded`: the collective's API is put in front of it.
    """
    first = contributions[0]
    for replica, other in enumerate(contributions[1:], start=1):
        if _spec(other) is not _spec(first) and _spec(other) != _spec(first):
            where = nest.explain_mismatch(_value(first), _value(other))
            raise unworded(
                InvalidArgumentError(
                    f"needs the same nested structure from every replica, but replica 0 and replica "
                    f"{replica} differ {where}. Pass the same nesting of lists, tuples and dicts (with the "
                    f"same keys) from every replica.",
                    replicas=(0, replica),
                )
            )


# A single array skips optree (spec None); it is the same structure as any other single leaf
# (an IndexedSlices, a scalar), so a mismatch there is one of the leaves, worded by their check.
_LEAF_SPEC = nest.flatten(0)[1]


def _spec(contribution: Contribution) -> nest.PyTreeSpec:
    return _LEAF_SPEC if contribution.spec is None else contribution.spec


_CAST = "Cast the values to one dtype first, e.g. with td.cast()."


def _value(contribution: Contribution) -> Nest:
    if contribution.spec is None:
        return contribution.arrays[0]
    return nest.unflatten(contribution.spec, contribution.arrays)


def check_reduce_leaves(contributions: Sequence[Contribution]) -> None:
    """Raises ``InvalidArgumentError`` (:func:`unworded`) unless each leaf has one shape and numeric dtype on every
    replica."""
    rule = "needs every replica's value to have the same shape and dtype"
    first = contributions[0].arrays
    for k, array in enumerate(first):
        if isinstance(array, IndexedSlices) or any(isinstance(c.arrays[k], IndexedSlices) for c in contributions):
            _check_sparse_leaf(contributions, k)
            continue
        if array.dtype.kind not in "iufc":
            path = _path(contributions[0], k)
            where = f" at {nest.format_path(path)}" if path else ""
            raise unworded(
                InvalidArgumentError(
                    f"reduces numbers, but{where} replica 0's value has dtype {array.dtype}. Cast it to a "
                    f"numeric dtype first, or gather it with all_gather().",
                    path=path,
                )
            )
    for replica, other in enumerate(contributions[1:], start=1):
        for k, (a, b) in enumerate(zip(first, other.arrays)):
            if isinstance(a, IndexedSlices):
                continue  # checked above
            if a.shape != b.shape:
                fix = "To combine values of different lengths use all_gather() or strategy.reduce(..., axis=0)."
                raise _leaf_error(rule, contributions[0], k, replica, "shape", a, b, fix)
            if a.dtype != b.dtype:
                raise _leaf_error(rule, contributions[0], k, replica, "dtype", a, b, _CAST)


def _check_sparse_leaf(contributions: Sequence[Contribution], k: int) -> None:
    """Leaf ``k`` must be an ``IndexedSlices`` on every replica, of one dense shape and dtype (unworded)."""
    path = _path(contributions[0], k)
    where = f" at {nest.format_path(path)}" if path else ""
    leaves = [c.arrays[k] for c in contributions]
    kinds = [isinstance(leaf, IndexedSlices) for leaf in leaves]
    if not all(kinds):
        sparse_replica, dense_replica = kinds.index(True), kinds.index(False)
        raise unworded(
            InvalidArgumentError(
                f"needs every replica's value to be of one kind, but{where} replica {sparse_replica} has an "
                f"IndexedSlices and replica {dense_replica} a dense {type(leaves[dense_replica]).__name__}. Pass "
                f"IndexedSlices from every replica, or densify with td.convert_to_tensor() on every replica.",
                path=path,
                replicas=(sparse_replica, dense_replica),
            )
        )
    try:
        check_reducible(leaves, f"{API}{where}")
    except InvalidArgumentError as error:
        error.path = path  # type: ignore[attr-defined]
        raise unworded(error) from None


def check_gather_leaves(contributions: Sequence[Contribution], axis: int) -> None:
    """Raises ``InvalidArgumentError`` (:func:`unworded`) unless each leaf can be concatenated along ``axis``.

    Sizes along ``axis`` may differ; ranks, dtypes and every other dimension must agree.
    (Scalars and an out-of-range ``axis`` are left for the gather itself to report.)
    """
    rule = (
        f"along axis {axis} needs every replica's value to have the same dtype and the same size in "
        f"every other dimension"
    )
    first = contributions[0].arrays
    for replica, other in enumerate(contributions[1:], start=1):
        for k, (a, b) in enumerate(zip(first, other.arrays)):
            if a.dtype != b.dtype:
                raise _leaf_error(rule, contributions[0], k, replica, "dtype", a, b, _CAST)
            if a.ndim == 0 or not -a.ndim <= axis < a.ndim:
                continue  # scalars or a bad axis: the gather names them
            gather_axis = axis % a.ndim
            if a.ndim != b.ndim or any(x != y for d, (x, y) in enumerate(zip(a.shape, b.shape)) if d != gather_axis):
                fix = f"Only the size along axis {axis} may differ between replicas."
                raise _leaf_error(rule, contributions[0], k, replica, "shape", a, b, fix)


def _path(contribution: Contribution, k: int) -> tuple[Any, ...]:
    return () if contribution.spec is None else tuple(contribution.spec.paths()[k])


def _leaf_error(
    rule: str, first: Contribution, k: int, replica: int, what: str, mine: Array, theirs: Array, fix: str
) -> InvalidArgumentError:
    """The error for leaf ``k``, naming its key path, the two replicas and their shapes or dtypes."""
    path = _path(first, k)
    where = f" at {nest.format_path(path)}" if path else ""
    mine_text: object  # a shape or a dtype, as the message prints it
    theirs_text: object
    if what == "shape":
        mine_text, theirs_text = tuple(mine.shape), tuple(theirs.shape)
    else:
        mine_text, theirs_text = mine.dtype, theirs.dtype
    return unworded(
        InvalidArgumentError(
            f"{rule}, but{where} replica 0 has {what} {mine_text}, replica {replica} has {theirs_text}. {fix}",
            path=path,
            replicas=(0, replica),
        )
    )
