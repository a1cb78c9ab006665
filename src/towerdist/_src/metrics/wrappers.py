"""Metrics defined by a per-sample function: accuracy and squared error."""

from __future__ import annotations

import numpy as np

from towerdist._src import backend
from towerdist._src.metrics.metric import MeanMetricWrapper, _same_rank
from towerdist._src.type_aliases import DTypeLike, TensorLike

__all__ = ["MeanSquaredError", "SparseCategoricalAccuracy", "mean_squared_error", "sparse_categorical_accuracy"]


def sparse_categorical_accuracy(y_true: TensorLike, y_pred: TensorLike) -> TensorLike:
    """1.0 where ``argmax(y_pred, -1)`` equals the integer label ``y_true``, else 0.0 (float32).

    ``y_true`` has shape ``(n,)`` or ``(n, 1)``; ``y_pred`` has shape ``(n, classes)``; the
    result has shape ``(n,)``.
    """
    impl = backend.for_array(y_pred)
    xp = impl.xp
    with impl.on_array_device(y_pred):  # on the predictions' own GPU, whichever is current
        y_true = impl.to_device_of(y_true, y_pred)
        squeezed = y_true.ndim == y_pred.ndim and y_true.shape[-1] == 1
        labels = y_true.reshape(y_true.shape[:-1]) if squeezed else y_true
        predicted = xp.argmax(y_pred, axis=-1)
        matches = (labels.astype(y_pred.dtype) == predicted.astype(y_pred.dtype)).astype(np.float32)
        if matches.ndim > 1 and matches.shape[-1] == 1:  # as Keras: (n, 1) -> (n,)
            matches = matches.reshape(matches.shape[:-1])
        return matches


def mean_squared_error(y_true: TensorLike, y_pred: TensorLike) -> TensorLike:
    """``mean((y_true - y_pred) ** 2, axis=-1)``, with ``y_true`` cast to ``y_pred``'s dtype."""
    impl = backend.for_array(y_pred)
    xp = impl.xp
    with impl.on_array_device(y_pred):  # on the predictions' own GPU, whichever is current
        y_true = impl.to_device_of(y_true, y_pred).astype(y_pred.dtype)
        y_true, y_pred = _same_rank(y_true, y_pred)
        return xp.mean(xp.square(y_true - y_pred), axis=-1)


class SparseCategoricalAccuracy(MeanMetricWrapper):
    """How often the highest-scoring class equals the integer label.

    Example:
      >>> m = td.metrics.SparseCategoricalAccuracy()
      >>> m.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]])
      >>> m.result()
      array(0.5, dtype=float32)
    """

    def __init__(self, name: str = "sparse_categorical_accuracy", dtype: DTypeLike | None = None) -> None:
        super().__init__(sparse_categorical_accuracy, name, dtype)


class MeanSquaredError(MeanMetricWrapper):
    """The mean over samples of the mean squared error along the last axis.

    Example:
      >>> m = td.metrics.MeanSquaredError()
      >>> m.update_state([[0, 1], [0, 0]], [[1, 1], [0, 0]])
      >>> m.result()
      array(0.25, dtype=float32)
    """

    def __init__(self, name: str = "mean_squared_error", dtype: DTypeLike | None = None) -> None:
        super().__init__(mean_squared_error, name, dtype)
