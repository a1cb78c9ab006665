"""Distribution-aware optimizers (``tf.keras.optimizers``' API, without autodiff)."""

from towerdist._src.optimizers.adagrad import Adagrad as Adagrad
from towerdist._src.optimizers.adam import Adam as Adam
from towerdist._src.optimizers.adamw import AdamW as AdamW
from towerdist._src.optimizers.optimizer import Optimizer as Optimizer
from towerdist._src.optimizers.rmsprop import RMSprop as RMSprop
from towerdist._src.optimizers.sgd import SGD as SGD

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Optimizer", "RMSprop"]
