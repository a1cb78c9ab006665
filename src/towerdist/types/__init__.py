"""``tf.types``: the distributed value types, under ``towerdist.types.experimental``."""

from towerdist.types import experimental as experimental

__all__ = ["experimental"]
