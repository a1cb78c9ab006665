"""``tf.experimental``: ``Optional``, the value ``get_next_as_optional`` returns."""

from towerdist._src.data.optional import Optional as Optional

__all__ = ["Optional"]
