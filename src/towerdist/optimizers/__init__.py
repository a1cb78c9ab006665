"""Distribution-aware optimizers (``tf.keras.optimizers``' API, without autodiff)."""

from towerdist._src.optimizers.adam import Adam as Adam
from towerdist._src.optimizers.optimizer import Optimizer as Optimizer
from towerdist._src.optimizers.sgd import SGD as SGD

__all__ = ["SGD", "Adam", "Optimizer"]
