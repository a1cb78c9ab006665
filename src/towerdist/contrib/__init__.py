"""``tf.contrib`` (TF 1.x): only ``towerdist.contrib.distribute``, kept so seed-era code runs."""

from towerdist.contrib import distribute as distribute

__all__ = ["distribute"]
