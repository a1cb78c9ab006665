"""Reference results computed with plain numpy: reductions, and Keras's optimizer update rules."""

from __future__ import annotations

import functools

import numpy as np

import towerdist as td


def numpy_reduce(op: td.distribute.ReduceOp, arrays: list[np.ndarray]) -> np.ndarray:
    """TensorFlow's result: the element-wise sum in the inputs' dtype, taken in replica order;
    MEAN divides it by the replica count (integers give float64, reference 3.9, DESIGN 5)."""
    total = np.asarray(functools.reduce(np.add, arrays))
    if op is td.distribute.ReduceOp.SUM:
        return total
    out_dtype = np.float64 if total.dtype.kind in "iu" else total.dtype
    return np.asarray(np.true_divide(total, len(arrays), dtype=out_dtype))


class NumpyReference:
    """Keras's update rules on one device, in plain numpy, computed in each variable's dtype."""

    def __init__(
        self, kind: str, learning_rate=0.01, momentum=0.0, nesterov=False, beta_1=0.9, beta_2=0.999,
        epsilon=1e-7, amsgrad=False,
    ) -> None:
        self.kind = kind
        self.learning_rate = learning_rate
        self.momentum, self.nesterov = momentum, nesterov
        self.beta_1, self.beta_2, self.epsilon, self.amsgrad = beta_1, beta_2, epsilon, amsgrad
        self.iterations = 0
        self.slots: dict[int, dict[str, np.ndarray]] = {}

    def apply(self, weights: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        rate = self.learning_rate
        rate = rate(self.iterations) if callable(rate) else rate
        new = [self._one(k, w, g, rate) for k, (w, g) in enumerate(zip(weights, grads))]
        self.iterations += 1
        return new

    def _one(self, k: int, w: np.ndarray, g: np.ndarray, rate: float) -> np.ndarray:
        t = w.dtype.type
        g = np.asarray(g, dtype=w.dtype)
        lr = t(rate)
        if self.kind == "SGD":
            if self.momentum == 0:
                return np.asarray(w - lr * g)
            slots = self.slots.setdefault(k, {"momentum": np.zeros_like(w)})
            mu = t(self.momentum)
            m = mu * slots["momentum"] - lr * g
            slots["momentum"] = np.asarray(m)
            return np.asarray(w + (mu * m - lr * g) if self.nesterov else w + m)
        names = ("m", "v", "vhat") if self.amsgrad else ("m", "v")
        slots = self.slots.setdefault(k, {name: np.zeros_like(w) for name in names})
        step = t(self.iterations + 1)
        b1, b2, one = t(self.beta_1), t(self.beta_2), t(1)
        alpha = lr * np.sqrt(one - b2**step) / (one - b1**step)
        # (1 - beta) in Python floats, then the dtype: Keras 3's arithmetic
        m = slots["m"] + (g - slots["m"]) * t(1.0 - self.beta_1)
        v = slots["v"] + (g * g - slots["v"]) * t(1.0 - self.beta_2)
        slots["m"], slots["v"] = np.asarray(m), np.asarray(v)
        if self.amsgrad:
            v = slots["vhat"] = np.asarray(np.maximum(slots["vhat"], v))
        return np.asarray(w - alpha * m / (np.sqrt(v) + t(self.epsilon)))
