"""Per-thread state: the distribution-mode stack, device scopes, update contexts, colocations.

TensorFlow keeps the distribution-strategy stack in thread-local storage; so do we. The
state lives in one object so that the replica scheduler can run a ``merge_fn`` on a
replica thread *as if* it ran on the caller's thread: it snapshots the caller's state
when ``run`` starts and installs that snapshot around ``merge_fn``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from towerdist._src.device import DeviceSpec


class Mode(NamedTuple):
    """One entry of the mode stack (TensorFlow's ``_ThreadMode``).

    Exactly one of ``cross_replica`` and ``replica_context`` is set.
    """

    strategy: Any
    cross_replica: Any  # the strategy, in cross-replica context; else None
    replica_context: Any  # the ReplicaContext, in a replica context; else None


class UpdateEntry(NamedTuple):
    """An active update context (inside ``StrategyExtended.update``)."""

    device: DeviceSpec | None
    replica_id: int | None


class Snapshot(NamedTuple):
    """An immutable copy of one thread's state."""

    modes: tuple[Mode, ...]
    devices: tuple[DeviceSpec | None, ...]
    updates: tuple[UpdateEntry, ...]
    sync_on_read: tuple[Any, ...] = ()


class _State(threading.local):
    def __init__(self) -> None:
        self.modes: list[Mode] = []
        self.devices: list[DeviceSpec | None] = []
        self.updates: list[UpdateEntry] = []
        # The scope entered by experimental_set_strategy, if any.
        self.global_scope: Any = None
        # How many default-strategy scopes this thread is in (they push no mode).
        self.default_scopes = 0
        # Threads that may run parts of a parallel job for this thread (see parallel.py).
        self.helpers: Any = None
        # ``(strategy, target)`` of active ``colocate_vars_with`` blocks (innermost last).
        self.colocations: list[Any] = []
        # ``(strategy, aggregation)`` of active TF 1.x ``tower_local_var_scope`` blocks
        # (innermost last): variables created there are sync-on-read.
        self.sync_on_read: list[Any] = []

    def save(self) -> tuple[Any, ...]:
        """Every field, for :meth:`restore` (a replica or a merge runs on a borrowed thread)."""
        return (self.modes, self.devices, self.updates, self.sync_on_read, self.helpers, self.colocations,
                self.global_scope, self.default_scopes)

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Puts back what :meth:`save` returned, in one assignment."""
        (self.modes, self.devices, self.updates, self.sync_on_read, self.helpers, self.colocations,
         self.global_scope, self.default_scopes) = saved


state = _State()


def snapshot() -> Snapshot:
    """Returns a copy of the calling thread's state."""
    return Snapshot(tuple(state.modes), tuple(state.devices), tuple(state.updates), tuple(state.sync_on_read))
