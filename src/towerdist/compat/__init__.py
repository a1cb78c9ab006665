"""``tf.compat``: older dialects of the API. ``towerdist.compat.v1`` is TF 1.x's."""

from towerdist.compat import v1 as v1

__all__ = ["v1"]
