"""``tf.nn``'s distribution helpers: loss scaling for data-parallel training."""

import typing as _typing

from towerdist._src import aliases as _aliases
from towerdist._src.losses import compute_average_loss as compute_average_loss
from towerdist._src.losses import scale_regularization_loss as scale_regularization_loss

__all__ = ["compute_average_loss", "scale_regularization_loss"]

# tf.nn.relu, tf.nn.softmax, ...: an AttributeError saying what to use instead (hidden from
# type checkers, which would otherwise take every name for an attribute of the module).
if not _typing.TYPE_CHECKING:
    __getattr__ = _aliases.module_getattr(__name__)
