"""The Adagrad optimizer (``td.optimizers.Adagrad``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from towerdist._src.optimizers.optimizer import LearningRate, Optimizer, check_non_negative
from towerdist._src.optimizers.sparse_gradients import SparseRows, copy_into
from towerdist._src.type_aliases import ArrayModule, TensorLike
from towerdist._src.variables.update_buffers import UpdateBuffers

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011), with Keras's update rule and defaults.

    With the slot ``accumulator`` (starting at ``initial_accumulator_value``)::

        accumulator += g**2
        w -= lr * g / sqrt(accumulator + epsilon)

    A sparse gradient (``IndexedSlices``) updates only its rows, the variable's and the
    accumulator's; a row given by several slices accumulates the sum of their squares.

    Args:
      learning_rate: a float >= 0 or a schedule (a callable of the step).
      initial_accumulator_value: the accumulator's starting value, a float >= 0.
      epsilon: a small float >= 0 added under the square root.
      name: the optimizer's name.

    Example:
      >>> w = td.Variable([1.0, 2.0])
      >>> opt = td.optimizers.Adagrad(learning_rate=0.1)
      >>> _ = opt.apply_gradients([(np.array([1.0, 1.0], np.float32), w)])  # returns iterations
      >>> w.numpy()
      array([0.9046537, 1.9046538], dtype=float32)
    """

    _slot_names = ("accumulator",)

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
        name: str = "Adagrad",
    ) -> None:
        super().__init__(learning_rate, name)
        self._initial_accumulator_value = check_non_negative("initial_accumulator_value", initial_accumulator_value)
        self._epsilon = check_non_negative("epsilon", epsilon)

    @property
    def initial_accumulator_value(self) -> float:
        """The accumulator's starting value."""
        return self._initial_accumulator_value

    @property
    def epsilon(self) -> float:
        """The epsilon under the square root."""
        return self._epsilon

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "initial_accumulator_value": self._initial_accumulator_value,
            "epsilon": self._epsilon,
        }

    def _slot_initial_value(self, slot_name: str) -> float:
        return self._initial_accumulator_value

    _coefficients_depend_on_step = False

    def _coefficients(self, learning_rate: float, step: int, dtype: np.dtype[Any]) -> dict[str, Any]:
        return {"lr": dtype.type(learning_rate), "epsilon": dtype.type(self._epsilon)}

    def _compute(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: TensorLike,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        accumulator = xp.multiply(grad, grad, out=out.out("accumulator", slots["accumulator"]))
        accumulator += slots["accumulator"]
        denominator = xp.add(accumulator, coefficients["epsilon"], out=out.scratch("denominator", var))
        xp.sqrt(denominator, out=denominator)
        step = xp.multiply(grad, coefficients["lr"], out=out.scratch("step", var))
        step /= denominator
        return xp.subtract(var, step, out=out.out("var", var)), {"accumulator": accumulator}

    def _compute_sparse(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: SparseRows,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        # Keras scatters both updates: only the gradient's rows change (the rest is copied).
        rows = grad.indices
        accumulator = copy_into(xp, slots["accumulator"], out.out("accumulator", slots["accumulator"]))
        accumulated = accumulator[rows] + grad.squares
        accumulator[rows] = accumulated
        step = grad.values * coefficients["lr"]
        step /= xp.sqrt(accumulated + coefficients["epsilon"])
        new = copy_into(xp, var, out.out("var", var))
        new[rows] -= step
        return new, {"accumulator": accumulator}

    _sparse_squares = True
    _cost_per_byte = 6

