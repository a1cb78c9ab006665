"""The Adam optimizer (``td.optimizers.Adam``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from towerdist._src.optimizers.optimizer import (
    LearningRate,
    Optimizer,
    check_non_negative,
    check_unit_interval,
)
from towerdist._src.optimizers.sparse_gradients import SparseRows
from towerdist._src.type_aliases import ArrayModule, TensorLike
from towerdist._src.variables.update_buffers import UpdateBuffers

__all__ = ["Adam"]


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2014), with Keras's update rule and defaults.

    With ``t = iterations + 1`` and slots ``m`` and ``v`` (and ``vhat`` with ``amsgrad``)::

        alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m += (g - m) * (1 - beta_1)
        v += (g**2 - v) * (1 - beta_2)
        vhat = max(vhat, v)                  # amsgrad only; then v = vhat below
        w -= alpha * m / (sqrt(v) + epsilon)

    A sparse gradient (``IndexedSlices``) is applied as Keras applies it: every row of ``m``
    and ``v`` decays (every row of the variable moves), and a row given by several slices
    adds the sum of their squares to ``v``.

    Args:
      learning_rate: a float >= 0 or a schedule (a callable of the step).
      beta_1: decay of the first moment, in [0, 1).
      beta_2: decay of the second moment, in [0, 1).
      epsilon: a small float >= 0 added to the denominator.
      amsgrad: use the AMSGrad variant (keeps the running maximum of ``v``).
      name: the optimizer's name.
    """

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        name: str = "Adam",
    ) -> None:
        super().__init__(learning_rate, name)
        self._beta_1 = check_unit_interval("beta_1", beta_1, closed=False)
        self._beta_2 = check_unit_interval("beta_2", beta_2, closed=False)
        self._epsilon = check_non_negative("epsilon", epsilon)
        self._amsgrad: bool = bool(amsgrad)
        self._slot_names = ("m", "v", "vhat") if self._amsgrad else ("m", "v")

    @property
    def beta_1(self) -> float:
        """The first-moment decay."""
        return self._beta_1

    @property
    def beta_2(self) -> float:
        """The second-moment decay."""
        return self._beta_2

    @property
    def epsilon(self) -> float:
        """The denominator's epsilon."""
        return self._epsilon

    @property
    def amsgrad(self) -> bool:
        """Whether the AMSGrad variant is used."""
        return self._amsgrad

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "beta_1": self._beta_1,
            "beta_2": self._beta_2,
            "epsilon": self._epsilon,
            "amsgrad": self._amsgrad,
        }

    def _coefficients(self, learning_rate: float, step: int, dtype: np.dtype[Any]) -> dict[str, Any]:
        # Computed in the variable's dtype, as Keras does.
        t = dtype.type(step + 1)
        one = dtype.type(1)
        beta_1, beta_2 = dtype.type(self._beta_1), dtype.type(self._beta_2)
        alpha = dtype.type(learning_rate) * np.sqrt(one - beta_2**t) / (one - beta_1**t)
        return {
            "alpha": dtype.type(alpha),
            # (1 - beta) in Python floats, then the dtype, as Keras computes it: float32(1) - float32(0.999)
            # is 1.3e-5 off float32(0.001)
            "one_minus_beta_1": dtype.type(1.0 - self._beta_1),
            "one_minus_beta_2": dtype.type(1.0 - self._beta_2),
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
        return self._rule(xp, var, grad, None, slots, coefficients, out)

    def _compute_sparse(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: SparseRows,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        # Keras densifies the gradient (and the squares of its slices) into the moments'
        # dense update: every row of m and v decays, every row of the variable moves.
        dense = grad.dense(xp, var, out.scratch("dense_grad", var))
        square = grad.dense_squares(xp, var, out.scratch("dense_square", var))
        return self._rule(xp, var, dense, square, slots, coefficients, out)

    def _rule(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: TensorLike,
        square: TensorLike | None,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        """The update with ``g**2`` given as ``square`` (None: ``grad * grad``)."""
        # Keras's order of operations, into reused buffers (``out``): no allocation in a
        # steady training loop on the host.
        m_old, v_old = slots["m"], slots["v"]
        m = xp.subtract(grad, m_old, out=out.out("m", m_old))
        m *= coefficients["one_minus_beta_1"]
        m += m_old  # m + (g - m) * (1 - beta_1)
        if square is None:
            v = xp.multiply(grad, grad, out=out.out("v", v_old))
            v -= v_old
        else:
            v = xp.subtract(square, v_old, out=out.out("v", v_old))
        v *= coefficients["one_minus_beta_2"]
        v += v_old  # v + (g * g - v) * (1 - beta_2)
        new_slots = {"m": m, "v": v}
        if self._amsgrad:
            v = new_slots["vhat"] = xp.maximum(slots["vhat"], v, out=out.out("vhat", slots["vhat"]))
        denominator = xp.sqrt(v, out=out.scratch("denominator", v))
        denominator += coefficients["epsilon"]
        step = xp.multiply(m, coefficients["alpha"], out=out.scratch("step", m))
        step /= denominator
        return xp.subtract(var, step, out=out.out("var", var)), new_slots

    # m, v, the variable and the gradient are read and written: about three times SGD's traffic.
    _cost_per_byte = 9
    _sparse_squares = True
