"""``tf.nn``'s distribution helpers: loss scaling for data-parallel training."""

from towerdist._src.losses import compute_average_loss as compute_average_loss
from towerdist._src.losses import scale_regularization_loss as scale_regularization_loss

__all__ = ["compute_average_loss", "scale_regularization_loss"]
