"""What a replica brings to a round of the step's barrier: a ``merge_call`` or an internal collective.

A replica that calls ``merge_call`` (or ``all_reduce``, ``all_gather``, an optimizer step:
towerdist's own collectives) arrives at the barrier of its :class:`~towerdist._src.strategies.replica_step.Step`
with a request. The last replica to arrive settles the round with the requests of every
replica, in replica order (``settle``): a :class:`MergeRequest` runs replica 0's ``merge_fn``
once on the regrouped arguments, a :class:`CollectiveRequest` runs its function once on the
list of payloads. ``replica_step.py`` describes the rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from towerdist._src.strategies.watchdog import name_of
from towerdist._src.values.regroup import regroup, select_replica

if TYPE_CHECKING:  # the step settles the requests: only its type is named here
    from towerdist._src.strategies.replica_step import Step

__all__ = ["CollectiveRequest", "MergeRequest"]


class MergeRequest:
    """A replica's ``merge_call(merge_fn, args, kwargs)``."""

    __slots__ = ("args", "collective", "kwargs", "merge_fn")

    snapshot = None  # a merge_fn's result goes back to every replica: nobody hands one over

    def __init__(
        self, merge_fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], collective: str
    ) -> None:
        self.merge_fn = merge_fn
        self.args = args
        self.kwargs = kwargs
        self.collective = collective

    def describe(self) -> str:
        return f"merge_call() (merge_fn={name_of(self.merge_fn)})"

    @staticmethod
    def settle(step: Step, requests: list[Any]) -> list[Any]:
        """Runs replica 0's ``merge_fn`` on the regrouped arguments; one part per replica."""
        first = requests[0]
        devices = step.devices
        args = regroup([r.args for r in requests], devices, what="merge_call() arguments")
        kwargs = regroup([r.kwargs for r in requests], devices, what="merge_call() keyword arguments")
        result = first.merge_fn(step.strategy, *args, **kwargs)
        return [select_replica(r, result) for r in range(step.num_replicas)]


class CollectiveRequest:
    """A replica's part of an internal collective: ``fn(strategy, payloads)`` gives the parts."""

    __slots__ = ("collective", "fn", "payload", "snapshot")

    def __init__(
        self,
        fn: Callable[[Any, list[Any]], list[Any]],
        payload: object,
        collective: str,
        snapshot: Callable[[Any, int], tuple[Any, Collection[int]]] | None = None,
    ) -> None:
        self.fn = fn
        self.payload = payload
        self.collective = collective
        # ``snapshot(payload, replica)``: a private copy of the payload, taken when the replica
        # hands the request over instead of parking (see "Handing over"), and the ids of the
        # single-device variables the request's function writes (the replica's fence); None:
        # the replica parks.
        self.snapshot = snapshot

    def describe(self) -> str:
        return self.collective

    @staticmethod
    def settle(step: Step, requests: list[Any]) -> list[Any]:
        """Runs replica 0's function once on every replica's payload, in replica order."""
        parts: list[Any] = requests[0].fn(step.strategy, [r.payload for r in requests])
        return parts
