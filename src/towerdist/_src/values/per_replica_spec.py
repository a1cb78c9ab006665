"""``PerReplicaSpec``: the spec of a ``PerReplica`` value, one spec per replica."""

from __future__ import annotations

from typing import Any

__all__ = ["PerReplicaSpec"]


class PerReplicaSpec:
    """Describes a ``PerReplica`` value: one ``TensorSpec`` per local replica.

    ``DistributedDataset.element_spec`` holds these where the dataset's elements hold arrays.
    """

    __slots__ = ("_value_specs",)

    def __init__(self, *value_specs: object) -> None:  # TensorSpecs, compared and printed only
        self._value_specs = tuple(value_specs)

    @property
    def value_specs(self) -> tuple[Any, ...]:
        """The replicas' specs, in replica order."""
        return self._value_specs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PerReplicaSpec):
            return NotImplemented
        return self._value_specs == other._value_specs

    def __hash__(self) -> int:
        return hash(self._value_specs)

    def __repr__(self) -> str:
        return f"PerReplicaSpec({', '.join(repr(s) for s in self._value_specs)})"
