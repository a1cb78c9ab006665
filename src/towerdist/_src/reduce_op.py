"""``ReduceOp`` and the parsing of reduce operations given as enums or strings."""

from __future__ import annotations

import enum

from towerdist._src.variable_enums import VariableAggregation

__all__ = ["ReduceOp", "parse_reduce_op"]


class ReduceOp(enum.Enum):
    """How values are combined across replicas (``tf.distribute.ReduceOp``).

    ``ReduceOp("SUM")`` works; ``ReduceOp("sum")`` raises ``ValueError`` as in TensorFlow.
    Strategy-level APIs (``Strategy.reduce``, ``reduce_to``, ``batch_reduce_to``,
    ``all_reduce``) also accept the strings ``"sum"``/``"mean"`` in any case.
    """

    SUM = "SUM"
    MEAN = "MEAN"

    @staticmethod
    def from_variable_aggregation(aggregation: VariableAggregation) -> ReduceOp:
        """Maps ``VariableAggregation.SUM``/``MEAN`` to the ReduceOp of the same name.

        Raises:
          ValueError: for NONE and ONLY_FIRST_REPLICA, which do not reduce.
        """
        if aggregation == VariableAggregation.SUM:
            return ReduceOp.SUM
        if aggregation == VariableAggregation.MEAN:
            return ReduceOp.MEAN
        raise ValueError(
            f"Could not convert from `tf.VariableAggregation` {aggregation} to "
            f"`tf.distribute.ReduceOp` type: only SUM and MEAN aggregations reduce values."
        )

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    __str__ = __repr__


_BY_STRING = {
    "sum": ReduceOp.SUM,
    "SUM": ReduceOp.SUM,
    "Sum": ReduceOp.SUM,
    "mean": ReduceOp.MEAN,
    "MEAN": ReduceOp.MEAN,
    "Mean": ReduceOp.MEAN,
}


def parse_reduce_op(reduce_op: object, api: str) -> ReduceOp:
    """Returns ``reduce_op`` as a ReduceOp; strings are matched case-insensitively.

    ``VariableAggregation.SUM``/``MEAN`` are accepted too (TF 1.x-era optimizer code
    passes a variable's aggregation to ``reduce_to``).

    Raises:
      ValueError: an unknown string such as ``"MAX"``.
      TypeError: anything else that is not a ReduceOp.
    """
    if isinstance(reduce_op, ReduceOp):
        return reduce_op
    if isinstance(reduce_op, str):
        known = _BY_STRING.get(reduce_op)
        if known is not None:
            return known
        try:
            return ReduceOp(reduce_op.upper())
        except ValueError:
            raise ValueError(
                f"{reduce_op.upper()!r} is not a valid ReduceOp. {api} got reduce_op={reduce_op!r}; use "
                f"td.distribute.ReduceOp.SUM or ReduceOp.MEAN (or the strings 'sum'/'mean')."
            ) from None
    if isinstance(reduce_op, VariableAggregation):
        return ReduceOp.from_variable_aggregation(reduce_op)
    raise TypeError(
        f"Expected `reduce_op` to be a `tf.distribute.ReduceOp`, not: {reduce_op!r}. {api} "
        f"accepts ReduceOp.SUM, ReduceOp.MEAN or the strings 'sum'/'mean'."
    )
