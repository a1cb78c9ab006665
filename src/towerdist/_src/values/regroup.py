"""How ``run`` hands values to replicas (select) and merges their results (regroup).

**Select**: every ``PerReplica``/``Mirrored`` leaf of a nested argument is replaced by the
component of the replica being called; distributed variables and every other object are
passed unchanged.

**Regroup** merges the results of the N replicas, leaf by leaf, *by identity*:

* the same object from every replica -> that object (so one replica never wraps), except
  numpy's interned booleans (``np.True_``/``np.False_``), which replicas computing a
  comparison get without sharing anything: they become a ``PerReplica``;
* components of one distributed variable -> the variable;
* anything else -> ``PerReplica`` of the N values.

Lists, tuples, namedtuples and dicts are regrouped element-wise and must have the same
structure in every replica.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from towerdist._src import nest
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import ValidationError
from towerdist._src.failures import unworded
from towerdist._src.type_aliases import Nest
from towerdist._src.values.distributed_values import DistributedValues, PerReplica

__all__ = ["local_results", "regroup", "select_replica", "split_for_replicas", "value_container"]


# Containers optree treats as structures; anything else is a leaf. Checking for them first
# lets the common case (a plain value) skip flattening on the per-step hot path.
_CONTAINERS = (list, tuple, dict, collections.deque)


def _is_split(leaf: object) -> bool:
    return isinstance(leaf, DistributedValues) and not leaf._is_distributed_variable


def select_replica(replica_id: int, structure: Nest) -> Nest:
    """``structure`` with each PerReplica/Mirrored leaf replaced by component ``replica_id``."""
    if _is_split(structure):
        return structure._values[replica_id]
    if not isinstance(structure, _CONTAINERS):
        return structure
    leaves, spec = nest.flatten(structure)
    if not any(_is_split(leaf) for leaf in leaves):
        return structure
    return nest.unflatten(spec, [leaf._values[replica_id] if _is_split(leaf) else leaf for leaf in leaves])


def split_for_replicas(structure: Nest, num_replicas: int, name: str) -> list[Nest]:
    """One version of ``structure`` (the argument called ``name``) per replica, as ``select_replica`` makes it.

    When no leaf is distributed, every replica gets ``structure`` itself.

    Raises:
      ValueError: a distributed leaf has a different number of components than replicas
        (unworded: the public method, e.g. ``Strategy.run()``, names itself in front).
    """
    if isinstance(structure, (tuple, dict)) and not structure:
        return [structure] * num_replicas  # no arguments
    if type(structure) is tuple and all(_is_plain_leaf(leaf) for leaf in structure):
        return _split_flat_tuple(structure, num_replicas, name)  # args=(x, y): no nest to walk
    leaves, spec = nest.flatten(structure)
    split_at = [k for k, leaf in enumerate(leaves) if _is_split(leaf)]
    if not split_at:
        return [structure] * num_replicas
    for k in split_at:
        count = len(leaves[k]._values)
        if count != num_replicas:
            paths = nest.flatten_with_paths(structure)[0]  # only needed for the message
            raise unworded(
                ValueError(
                    f"got a {type(leaves[k]).__name__} with {count} components at "
                    f"{name}{nest.format_path(paths[k]) if paths[k] else ''}, but the strategy has "
                    f"{num_replicas} replicas; distributed values must come from the same strategy."
                )
            )
    per_replica = []
    for replica_id in range(num_replicas):
        picked = list(leaves)
        for k in split_at:
            picked[k] = leaves[k]._values[replica_id]
        per_replica.append(nest.unflatten(spec, picked))
    return per_replica


_PLAIN_LEAVES = (np.ndarray, np.generic, int, float, complex, str, bytes, type(None))


def _is_plain_leaf(value: object) -> bool:
    """A value every pytree registry treats as a leaf (a distributed value, an array, a scalar)."""
    return isinstance(value, (DistributedValues, *_PLAIN_LEAVES))


def _split_flat_tuple(args: tuple[Any, ...], num_replicas: int, name: str) -> list[Any]:
    """``split_for_replicas`` of a tuple whose items are leaves (the usual ``args=(x, y)``)."""
    split_at = [k for k, leaf in enumerate(args) if _is_split(leaf)]
    if not split_at:
        return [args] * num_replicas
    for k in split_at:
        count = len(args[k]._values)
        if count != num_replicas:
            raise unworded(
                ValueError(
                    f"got a {type(args[k]).__name__} with {count} components at {name}[{k}], but the strategy "
                    f"has {num_replicas} replicas; distributed values must come from the same strategy."
                )
            )
    if len(split_at) == len(args):
        return list(zip(*(leaf._values for leaf in args)))
    per_replica = []
    for replica_id in range(num_replicas):
        picked = list(args)
        for k in split_at:
            picked[k] = args[k]._values[replica_id]
        per_replica.append(tuple(picked))
    return per_replica


def value_container(value: object) -> object:
    """The distributed variable ``value`` is a component of, else ``value`` itself."""
    container = getattr(value, "_distributed_container", None)
    if container is not None:
        owner = container()
        if owner is not None:
            return owner
    return value


def regroup(
    values: Sequence[Any],
    devices: Sequence[DeviceSpec] | None = None,
    wrap_class: type[DistributedValues] = PerReplica,
    always_wrap: bool = False,
    what: str = "results",

) -> Nest:
    """Merges one value per replica into one value (see the module docstring).

    Args:
      values: replica ``i``'s value at index ``i``.
      devices: the replicas' devices, recorded on the distributed values made.
      wrap_class: the class of the distributed values made (``PerReplica`` or ``Mirrored``).
      always_wrap: wrap leaves even when every replica returned the same object.
      what: what the values are, for error messages ("results", "merge_call arguments").

    Raises:
      ValidationError: the replicas' structures differ; the message names the replica
        and the path of the first difference.
    """
    first = values[0]
    if len(values) == 1 and not always_wrap and _plain(first):
        return first  # one replica, nothing to merge back into a variable: the common case, fast
    if first is None and not always_wrap and all(value is None for value in values):
        return None  # a step that returns nothing
    if not any(isinstance(value, _CONTAINERS) for value in values):
        return _regroup_leaf(list(values), devices, wrap_class, always_wrap)  # plain values
    if all(type(value) in (tuple, dict) and not value for value in values) and len({type(v) for v in values}) == 1:
        return first  # every replica passed no arguments (merge_call's kwargs={}, args=())
    leaves0, spec0 = nest.flatten(first)
    columns = [leaves0]
    for replica_id, value in enumerate(values[1:], start=1):
        leaves, spec = nest.flatten(value)
        if spec != spec0:
            raise ValidationError(
                f"The {what} of the replicas must have the same structure, but replica 0 and "
                f"replica {replica_id} differ {nest.explain_mismatch(first, value)}. Return the "
                f"same nesting of lists/tuples/dicts from every replica."
            )
        columns.append(leaves)
    merged = [
        _regroup_leaf([column[k] for column in columns], devices, wrap_class, always_wrap) for k in range(len(leaves0))
    ]
    return nest.unflatten(spec0, merged)


def _plain(value: Nest) -> bool:
    """True for arrays, None, or a flat list/tuple of arrays (no variable component among them)."""
    kind = type(value)
    if kind is np.ndarray or value is None:
        return True
    if kind is list or kind is tuple:
        for item in value:
            if type(item) is not np.ndarray:
                return False
        return True
    return False


def _regroup_leaf(
    leaves: list[Any], devices: Sequence[DeviceSpec] | None, wrap_class: type[DistributedValues], always_wrap: bool
) -> Nest:
    first = leaves[0]
    # numpy hands out one interned object for each boolean scalar (np.True_, np.False_):
    # replicas that computed one got "the same object" without sharing anything, so it is
    # a per-replica value, as the bool tensors of TensorFlow's replicas are.
    same = all(leaf is first for leaf in leaves) and not (len(leaves) > 1 and type(first) is np.bool_)
    if same and getattr(first, "_is_distributed_variable", False):
        return first
    container = value_container(first)
    if same and not always_wrap and container is first:
        return first
    if container is not first:
        # Components of one distributed variable (one per replica) merge back into it.
        if all(value_container(leaf) is container for leaf in leaves):
            return container
        raise ValidationError(
            "The replicas returned components of different distributed variables at the same "
            "position; return the variable itself (or the same variable's component) from "
            "every replica."
        )
    return wrap_class(leaves, devices)


def local_results(value: Nest, num_replicas: int) -> tuple[Any, ...]:
    """The per-replica parts of ``value`` (``experimental_local_results``).

    A distributed value gives its components; a nested structure gives one copy per
    replica with its distributed leaves selected; any other value gives ``(value,)``.
    """
    if isinstance(value, DistributedValues):
        return value._values
    if nest.is_nested(value):
        return tuple(select_replica(i, value) for i in range(num_replicas))
    return (value,)
