"""Loss scaling for data-parallel training (``td.nn.compute_average_loss`` and friends).

With N replicas each computing the loss of its slice of the global batch, the gradients
are *summed* across replicas (``optimizer.apply_gradients``), so each replica must scale
its loss by ``1 / global_batch_size``, not by its local batch size. These helpers do
that with TensorFlow's exact rules (dtype, rank checks, sample-weight broadcasting).
"""

from __future__ import annotations

import numbers
from types import ModuleType

import numpy as np

from towerdist._src import backend, context
from towerdist._src.array_ops import as_array
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.type_aliases import TensorLike
from towerdist._src.variables.variable import Variable

__all__ = ["compute_average_loss", "scale_regularization_loss"]


def compute_average_loss(
    per_example_loss: TensorLike, sample_weight: TensorLike = None, global_batch_size: TensorLike = None
) -> TensorLike:
    """Returns the sum of ``per_example_loss`` (times ``sample_weight``) over the global batch size.

    Call it in a replica context (inside ``strategy.run``) or with no strategy. Summing the
    replicas' results gives the mean loss over the global batch, which is what the
    gradient all-reduce (a SUM) expects.

    Args:
      per_example_loss: an array of rank >= 1 (one loss per example).
      sample_weight: optional weights multiplied with the losses (numpy broadcasting), after
        a trailing axis is squeezed (weights of one more rank, last axis 1) or added (one
        less rank), as TensorFlow does.
        As in TensorFlow, the weighted losses are computed in float32 and cast back.
      global_batch_size: an integer >= 0; default ``len(per_example_loss) *
        num_replicas_in_sync``. Zero gives zero.

    Returns:
      A scalar array of the loss's dtype (float64 for integer losses).

    Raises:
      ValueError: ``per_example_loss`` is a scalar, or ``global_batch_size`` is not a scalar.
      TypeError: ``global_batch_size`` is not an integer.
      InvalidArgumentError: ``global_batch_size`` is negative, or the weights do not broadcast.
      RuntimeError: called in cross-replica context without ``global_batch_size``.

    Example:
      >>> td.nn.compute_average_loss(np.array([1.0, 2.0, 3.0]), global_batch_size=6)
      array(1.)
    """
    losses = _as_array(per_example_loss)
    impl = backend.for_array(losses)
    if losses.ndim == 0:
        raise ValueError(
            f"Invalid value passed for `per_example_loss`. Expected a tensor with at least rank 1. "
            f"Received per_example_loss={per_example_loss!r} with rank 0"
        )
    input_dtype = losses.dtype
    if sample_weight is not None:
        losses = _scale_by_sample_weight(losses, _as_array(sample_weight), impl).astype(input_dtype)
    if global_batch_size is None:
        if context.has_strategy() and context.in_cross_replica_context():
            raise RuntimeError(
                "You are calling `compute_average_loss` in cross replica context, while it was expected to be "
                "called in replica context. Call it inside strategy.run(), or pass global_batch_size=..."
            )
        global_batch_size = losses.shape[0] * context.get_strategy().num_replicas_in_sync
    batch = _check_global_batch_size(global_batch_size)
    xp = impl.xp
    with impl.on_array_device(losses):  # on the losses' own GPU, whichever is current
        total = xp.sum(losses)
        result_dtype = total.dtype if total.dtype.kind in "fc" else np.dtype(np.float64)
        if batch == 0:
            return xp.zeros((), dtype=result_dtype)
        return xp.asarray(xp.true_divide(total, batch), dtype=result_dtype)


def scale_regularization_loss(regularization_loss: TensorLike) -> TensorLike:
    """Returns the sum of ``regularization_loss`` divided by ``num_replicas_in_sync``.

    Every replica adds the same regularization term to its loss; after the gradient SUM
    across replicas it must count once. Call it in a replica context or with no strategy.

    Raises:
      RuntimeError: called in cross-replica context of a strategy.
    """
    if context.has_strategy() and context.in_cross_replica_context():
        raise RuntimeError(
            "You are calling `scale_regularization_loss` in cross replica context, while it was expected to be "
            "called in replica context. Call it inside strategy.run()."
        )
    loss = _as_array(regularization_loss)
    impl = backend.for_array(loss)
    xp = impl.xp
    with impl.on_array_device(loss):  # on the loss's own GPU, whichever is current
        total = xp.sum(loss)
        result_dtype = total.dtype if total.dtype.kind in "fc" else np.dtype(np.float64)
        return xp.asarray(xp.true_divide(total, context.get_strategy().num_replicas_in_sync), dtype=result_dtype)


def _as_array(value: TensorLike) -> TensorLike:
    if isinstance(value, Variable):
        return value.value()
    if backend.is_array(value):
        return value
    return as_array(value)


def _scale_by_sample_weight(losses: TensorLike, weights: TensorLike, impl: ModuleType) -> TensorLike:
    # TensorFlow computes weighted losses in float32 whatever the loss dtype; so do we.
    losses = losses.astype(np.float32, copy=False)
    weights = impl.to_device(weights, None).astype(np.float32, copy=False)
    if weights.ndim == losses.ndim + 1:
        weights = weights.reshape(weights.shape[:-1]) if weights.shape[-1] == 1 else weights
    elif weights.ndim == losses.ndim - 1 and weights.ndim > 0:
        weights = weights[..., None]
    try:
        np.broadcast_shapes(losses.shape, weights.shape)
    except ValueError:
        raise InvalidArgumentError(
            f"compute_average_loss(): sample_weight of shape {tuple(weights.shape)} does not broadcast with "
            f"per_example_loss of shape {tuple(losses.shape)}. Pass one weight per example (shape "
            f"{tuple(losses.shape[:1])}), a scalar, or weights of the loss's shape."
        ) from None
    return losses * weights


def _check_global_batch_size(value: TensorLike) -> int:
    array = np.asarray(value)
    if array.ndim != 0:
        raise ValueError(f"global_batch_size must be scalar. Got global_batch_size={value!r} with shape {array.shape}.")
    if isinstance(value, bool) or not (isinstance(value, numbers.Integral) or array.dtype.kind in "iu"):
        raise TypeError(
            f"global_batch_size must be an integer. Got global_batch_size={value!r} of type "
            f"{type(value).__name__}; pass the number of examples in the global batch."
        )
    batch = int(array)
    if batch < 0:
        raise InvalidArgumentError(f"global_batch_size must be non-negative. Got global_batch_size={batch}.")
    return batch
