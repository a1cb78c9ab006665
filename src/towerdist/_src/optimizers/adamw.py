"""The AdamW optimizer (``td.optimizers.AdamW``): Adam with decoupled weight decay."""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from towerdist._src.optimizers.adam import Adam
from towerdist._src.optimizers.optimizer import LearningRate
from towerdist._src.optimizers.sparse_gradients import SparseRows
from towerdist._src.type_aliases import ArrayModule, TensorLike
from towerdist._src.variables.update_buffers import UpdateBuffers
from towerdist._src.variables.variable import Variable

__all__ = ["AdamW"]


class AdamW(Adam):
    """AdamW (Loshchilov and Hutter, 2019), with Keras's update rule and defaults.

    Each step first decays the variable, then applies Adam's rule (see
    :class:`~towerdist.optimizers.Adam`; slots ``m``, ``v`` and, with ``amsgrad``, ``vhat``)::

        w -= w * weight_decay * lr
        w -= alpha * m / (sqrt(v) + epsilon)           # Adam's step, on the decayed w

    The decay applies to every row of the variable, also for a sparse gradient
    (``IndexedSlices``), as in Keras; variables excluded with
    :meth:`exclude_from_weight_decay` take Adam's step only.

    Args:
      learning_rate: a float >= 0 or a schedule (a callable of the step).
      weight_decay: the decay coefficient (a float), multiplied by the learning rate.
      beta_1: decay of the first moment, in [0, 1).
      beta_2: decay of the second moment, in [0, 1).
      epsilon: a small float >= 0 added to the denominator.
      amsgrad: use the AMSGrad variant (keeps the running maximum of ``v``).
      name: the optimizer's name.
    """

    def __init__(
        self,
        learning_rate: LearningRate = 0.001,
        weight_decay: float = 0.004,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        name: str = "AdamW",
    ) -> None:
        super().__init__(learning_rate, beta_1, beta_2, epsilon, amsgrad, name)
        if isinstance(weight_decay, bool) or not isinstance(weight_decay, numbers.Real):
            raise ValueError(
                f"Argument `weight_decay` must be a float. Received: weight_decay={weight_decay!r}; AdamW decays "
                f"the weights by weight_decay * learning_rate each step (use Adam for no decay)."
            )
        if not np.isfinite(float(weight_decay)):
            raise ValueError(f"Argument `weight_decay` must be a finite float. Received: weight_decay={weight_decay!r}")
        self._weight_decay: float = float(weight_decay)
        self._excluded_ids: set[int] = set()
        self._excluded_variables: list[Variable] = []  # keeps the excluded ids in use
        self._excluded_names: list[str] = []

    @property
    def weight_decay(self) -> float:
        """The weight decay coefficient."""
        return self._weight_decay

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "weight_decay": self._weight_decay}

    def exclude_from_weight_decay(
        self, var_list: Iterable[Variable] | None = None, var_names: Iterable[str] | None = None
    ) -> None:
        """Exempts variables from the weight decay: those of ``var_list``, and those whose name
        matches (``re.search``) one of ``var_names``. Call it before the first step or ``build``.

        Raises:
          ValueError: the optimizer has already built its slots.
        """
        if self._slots:
            raise ValueError(
                "AdamW.exclude_from_weight_decay() can only be called before the optimizer is built (before the "
                "first apply_gradients() or build()). Create the optimizer, exclude, then train."
            )
        for var in var_list or ():
            if id(var) not in self._excluded_ids:
                self._excluded_ids.add(id(var))
                self._excluded_variables.append(var)
        self._excluded_names.extend(str(name) for name in var_names or ())

    def _uses_weight_decay(self, var: Variable) -> bool:
        if id(var) in self._excluded_ids:
            return False
        return not any(re.search(pattern, var.name) for pattern in self._excluded_names)

    def _coefficients(self, learning_rate: float, step: int, dtype: np.dtype[Any]) -> dict[str, Any]:
        return {
            **super()._coefficients(learning_rate, step, dtype),
            "lr": dtype.type(learning_rate),
            "weight_decay": dtype.type(self._weight_decay),
        }

    _coefficients_per_variable = True

    def _variable_coefficients(self, var: Variable, coefficients: dict[str, Any]) -> dict[str, Any]:
        if (self._excluded_ids or self._excluded_names) and not self._uses_weight_decay(var):
            return {**coefficients, "weight_decay": None}
        return coefficients

    def _compute(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: TensorLike,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        return self._rule(xp, self._decayed(xp, var, coefficients, out), grad, None, slots, coefficients, out)

    def _compute_sparse(
        self,
        xp: ArrayModule,
        var: TensorLike,
        grad: SparseRows,
        slots: dict[str, TensorLike],
        coefficients: dict[str, Any],
        out: UpdateBuffers,
    ) -> tuple[TensorLike, dict[str, TensorLike]]:
        return super()._compute_sparse(xp, self._decayed(xp, var, coefficients, out), grad, slots, coefficients, out)

    def _decayed(
        self, xp: ArrayModule, var: TensorLike, coefficients: dict[str, Any], out: UpdateBuffers
    ) -> TensorLike:
        """``var - var * weight_decay * lr`` (Keras's order), in a scratch buffer; ``var`` if excluded."""
        if coefficients["weight_decay"] is None:
            return var
        decay = xp.multiply(var, coefficients["weight_decay"], out=out.scratch("decay", var))
        decay *= coefficients["lr"]
        return xp.subtract(var, decay, out=decay)

    _cost_per_byte = 11
