"""``VariableSynchronization`` and ``VariableAggregation`` with TensorFlow's members and values."""

from __future__ import annotations

import enum

from towerdist._src import aliases

__all__ = ["VariableAggregation", "VariableSynchronization"]


class VariableSynchronization(enum.Enum):
    """When a distributed variable's copies are synchronised (``tf.VariableSynchronization``)."""

    AUTO = 0
    NONE = 1
    ON_WRITE = 2
    ON_READ = 3

    def __repr__(self) -> str:
        return f"VariableSynchronization.{self.name}"


class VariableAggregation(enum.Enum):
    """How replica-context writes to a distributed variable are combined (``tf.VariableAggregation``)."""

    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3

    def __repr__(self) -> str:
        return f"VariableAggregationV2.{self.name}"

    __str__ = __repr__


# TF 1.11-1.15 called ONLY_FIRST_REPLICA "ONLY_FIRST_TOWER"; the alias registry serves the old name.
aliases.install(
    VariableAggregation,
    [
        aliases.Alias(
            f"{aliases.AGGREGATION}.ONLY_FIRST_TOWER",
            "VariableAggregation.ONLY_FIRST_REPLICA",
            VariableAggregation.ONLY_FIRST_REPLICA,
            "1.12",
            "value",
        )
    ],
)
