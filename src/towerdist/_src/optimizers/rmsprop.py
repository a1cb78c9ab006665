"""The RMSprop optimizer (``td.optimizers.RMSprop``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from towerdist._src.optimizers.optimizer import LearningRate, Optimizer, check_non_negative, check_unit_interval
from towerdist._src.optimizers.sparse_gradients import SparseRows, copy_into, scatter_rows
from towerdist._src.type_aliases import ArrayModule, TensorLike
from towerdist._src.variables.update_buffers import UpdateBuffers

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop (Hinton, 2012), with Keras's update rule and defaults (plain momentum, optionally centered).

    With the slots ``velocity``, ``momentum`` (when ``momentum > 0``) and
    ``average_gradient`` (when ``centered``)::

        velocity = rho * velocity + (1 - rho) * g**2
        average_gradient = rho * average_gradient + (1 - rho) * g          # centered
        denominator = velocity - average_gradient**2 + epsilon              # centered
        denominator = velocity + epsilon                                    # otherwise
        increment = lr * g / sqrt(denominator)
        momentum = momentum_coefficient * momentum + increment; w -= momentum   # momentum > 0
        w -= increment                                                          # otherwise

    A sparse gradient (``IndexedSlices``) decays ``velocity`` (and ``average_gradient`` and
    ``momentum``) on every row, as Keras does; without momentum the variable changes only
    on the gradient's rows. A row given by several slices adds the sum of their squares to
    ``velocity``.

    Args:
      learning_rate: a float >= 0 or a schedule (a callable of the step).
      rho: the decay of the moving averages, in [0, 1].
      momentum: the momentum coefficient, in [0, 1]; 0 keeps no momentum slot.
      epsilon: a small float >= 0 added under the square root.
      centered: normalise by the estimated variance of the gradient (keeps ``average_gradient``).
      name: the optimizer's name.

    Example:
      >>> w = td.Variable([1.0, 2.0])
      >>> opt = td.optimizers.RMSprop(learning_rate=0.1)
      >>> _ = opt.apply_gradients([(np.array([1.0, 1.0], np.float32), w)])  # returns iterations
      >>> w.numpy()
      array([0.6837724, 1.6837723], dtype=float32)
    """

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        rho: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-7,
        centered: bool = False,
        name: str = "RMSprop",
    ) -> None:
        super().__init__(learning_rate, name)
        self._rho = check_unit_interval("rho", rho, closed=True)
        self._momentum = check_unit_interval("momentum", momentum, closed=True)
        self._epsilon = check_non_negative("epsilon", epsilon)
        self._centered = bool(centered)
        self._slot_names = (
            "velocity",
            *(("momentum",) if self._momentum else ()),
            *(("average_gradient",) if self._centered else ()),
        )

    @property
    def rho(self) -> float:
        """The decay of the moving averages."""
        return self._rho

    @property
    def momentum(self) -> float:
        """The momentum coefficient."""
        return self._momentum

    @property
    def epsilon(self) -> float:
        """The epsilon under the square root."""
        return self._epsilon

    @property
    def centered(self) -> bool:
        """Whether the gradient is normalised by its estimated variance."""
        return self._centered

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "rho": self._rho,
            "momentum": self._momentum,
            "epsilon": self._epsilon,
            "centered": self._centered,
        }

    _coefficients_depend_on_step = False

    def _coefficients(self, learning_rate: float, step: int, dtype: np.dtype[Any]) -> dict[str, Any]:
        # ``1 - rho`` is taken in Python's float, then cast, as Keras does.
        return {
            "lr": dtype.type(learning_rate),
            "rho": dtype.type(self._rho),
            "one_minus_rho": dtype.type(1 - self._rho),
            "momentum": dtype.type(self._momentum),
            "epsilon": dtype.type(self._epsilon),
        }

    def _compute(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: TensorLike,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        square = xp.multiply(grad, grad, out=out.scratch("square", var))
        new_slots = self._averages(xp, var, grad, square, slots, coefficients, out)
        denominator = self._denominator(xp, new_slots, coefficients, out.scratch("denominator", var))
        increment = xp.multiply(grad, coefficients["lr"], out=out.scratch("increment", var))
        increment /= xp.sqrt(denominator, out=denominator)
        return self._step(xp, var, increment, slots, coefficients, out, new_slots)

    def _compute_sparse(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: SparseRows,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        # Keras decays the averages on every row (a dense sum with the scattered slices);
        # the increment exists on the gradient's rows only.
        rows = grad.indices
        dense = grad.dense(xp, var, out.scratch("dense_grad", var)) if self._centered else None
        square = grad.dense_squares(xp, var, out.scratch("square", var))
        new_slots = self._averages(xp, var, dense, square, slots, coefficients, out)
        gathered: dict[str, TensorLike] = {
            name: new_slots[name][rows] for name in ("velocity", "average_gradient") if name in new_slots
        }
        denominator = self._denominator(xp, gathered, coefficients, None)
        increment = grad.values * coefficients["lr"]
        increment /= xp.sqrt(denominator)
        if self._momentum:
            dense_increment = scatter_rows(xp, rows, increment, var, out.scratch("dense_increment", var))
            return self._step(xp, var, dense_increment, slots, coefficients, out, new_slots)
        new = copy_into(xp, var, out.out("var", var))
        new[rows] -= increment
        return new, new_slots

    def _averages(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: TensorLike | None,
        square: TensorLike,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> dict[str, TensorLike]:
        """The new ``velocity`` (and ``average_gradient``), from ``g**2`` (and ``g``)."""
        rho, one_minus_rho = coefficients["rho"], coefficients["one_minus_rho"]
        velocity = xp.multiply(square, one_minus_rho, out=out.out("velocity", slots["velocity"]))
        velocity += xp.multiply(slots["velocity"], rho, out=out.scratch("decayed", var))
        new_slots = {"velocity": velocity}
        if self._centered:
            average = xp.multiply(grad, one_minus_rho, out=out.out("average_gradient", slots["average_gradient"]))
            average += xp.multiply(slots["average_gradient"], rho, out=out.scratch("decayed", var))
            new_slots["average_gradient"] = average
        return new_slots

    def _denominator(
        self, xp: ArrayModule, new_slots: dict[str, TensorLike], coefficients: dict[str, Any], out: TensorLike | None
    ) -> TensorLike:
        """``velocity - average_gradient**2 + epsilon`` (centered) or ``velocity + epsilon``, into ``out`` if a buffer."""
        velocity = new_slots["velocity"]
        if not self._centered:
            return xp.add(velocity, coefficients["epsilon"], out=out)
        average = new_slots["average_gradient"]
        denominator = xp.multiply(average, average, out=out)
        xp.subtract(velocity, denominator, out=denominator)
        denominator += coefficients["epsilon"]
        return denominator

    def _step(
        self,
        xp: ArrayModule,
        var: TensorLike,
        increment: TensorLike,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
        new_slots: dict[str, TensorLike],
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        if self._momentum:
            momentum = xp.multiply(slots["momentum"], coefficients["momentum"], out=out.out("momentum", slots["momentum"]))
            momentum += increment
            new_slots["momentum"] = momentum
            increment = momentum
        return xp.subtract(var, increment, out=out.out("var", var)), new_slots

    _sparse_squares = True
    _cost_per_byte = 9

