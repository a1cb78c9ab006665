"""The type aliases towerdist's signatures share, so readers and type checkers see one meaning.

* ``Nest``: an array or scalar, or lists, tuples, dicts and namedtuples of them (optree's
  pytrees); what ``strategy.run`` passes and returns.
* ``ReplicaFn``: the function ``strategy.run`` calls once per replica.
* ``MergeFn``: the function ``ReplicaContext.merge_call`` calls once, as
  ``merge_fn(strategy, *args, **kwargs)``, in cross-replica context.
* ``Destinations``: where a reduction or broadcast puts its result: a device name or
  ``DeviceSpec``, a distributed value or variable (its devices), or an array (its device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

__all__ = ["Destinations", "MergeFn", "Nest", "ReplicaFn"]

Nest: TypeAlias = Any
ReplicaFn: TypeAlias = Callable[..., Any]
MergeFn: TypeAlias = Callable[..., Any]
Destinations: TypeAlias = Any
