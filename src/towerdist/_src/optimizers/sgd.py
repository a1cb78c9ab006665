"""Stochastic gradient descent, with optional (Nesterov) momentum (``td.optimizers.SGD``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from towerdist._src.optimizers.optimizer import LearningRate, Optimizer, check_unit_interval
from towerdist._src.optimizers.sparse_gradients import SparseRows, copy_into
from towerdist._src.type_aliases import ArrayModule, TensorLike
from towerdist._src.variables.update_buffers import UpdateBuffers

__all__ = ["SGD"]


class SGD(Optimizer):
    """Gradient descent with momentum, with Keras's update rule.

    Without momentum: ``w -= lr * g``. With momentum (slot ``"momentum"``)::

        m = momentum * m - lr * g
        w += m                               # nesterov=False
        w += momentum * m - lr * g           # nesterov=True

    A sparse gradient (``IndexedSlices``) changes only its rows without momentum; with
    momentum, as in Keras, the momentum decays on every row, so every row moves.

    Args:
      learning_rate: a float >= 0 or a schedule (a callable of the step).
      momentum: a float in [0, 1]; 0 keeps no slot.
      nesterov: use Nesterov momentum.
      name: the optimizer's name.

    Example:
      >>> with strategy.scope():
      ...     w = td.Variable([1.0, 2.0])
      ...     opt = td.optimizers.SGD(learning_rate=0.1)
      >>> _ = opt.apply_gradients([(np.array([1.0, 1.0], np.float32), w)])  # returns iterations
      >>> w.numpy()
      array([0.9, 1.9], dtype=float32)
    """

    def __init__(
        self, learning_rate: LearningRate = 0.01, momentum: float = 0.0, nesterov: bool = False, name: str = "SGD"
    ) -> None:
        super().__init__(learning_rate, name)
        self._momentum = check_unit_interval("momentum", momentum, closed=True)
        self._nesterov = bool(nesterov)
        self._slot_names = ("momentum",) if self._momentum else ()

    @property
    def momentum(self) -> float:
        """The momentum coefficient."""
        return self._momentum

    @property
    def nesterov(self) -> bool:
        """Whether the update uses Nesterov momentum."""
        return self._nesterov

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self._momentum, "nesterov": self._nesterov}

    _coefficients_depend_on_step = False

    def _coefficients(self, learning_rate: float, step: int, dtype: np.dtype[Any]) -> dict[str, Any]:
        return {"lr": dtype.type(learning_rate), "momentum": dtype.type(self._momentum)}

    def _compute(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: TensorLike,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        lr = coefficients["lr"]
        if not self._momentum:
            new = out.out("var", var)
            scaled = xp.multiply(grad, lr, out=new)  # grad * lr, in the output buffer (no temporary)
            return xp.subtract(var, scaled, out=scaled), {}
        scaled = xp.multiply(grad, lr, out=out.scratch("scaled", grad))  # grad * lr
        momentum = coefficients["momentum"]
        velocity = slots["momentum"]
        m = xp.multiply(velocity, momentum, out=out.out("momentum", velocity))
        xp.subtract(m, scaled, out=m)  # momentum * v - lr * grad
        if self._nesterov:
            step = xp.multiply(m, momentum, out=out.scratch("step", grad))
            xp.subtract(step, scaled, out=step)  # momentum * m - lr * grad
            return xp.add(var, step, out=out.out("var", var)), {"momentum": m}
        return xp.add(var, m, out=out.out("var", var)), {"momentum": m}

    def _compute_sparse(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: SparseRows,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        if self._momentum:  # Keras densifies the gradient into the momentum, which decays on every row
            return super()._compute_sparse(xp, var, grad, slots, coefficients, out)
        new = copy_into(xp, var, out.out("var", var))  # Keras scatters: only the gradient's rows change
        new[grad.indices] -= grad.values * coefficients["lr"]
        return new, {}
