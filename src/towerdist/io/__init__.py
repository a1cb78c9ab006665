"""``tf.io``: the file functions of ``tf.io.gfile`` that TensorFlow's multi-worker tutorials use."""

from towerdist.io import gfile as gfile

__all__ = ["gfile"]
