"""``tf.io.gfile`` on local paths: ``exists``, ``glob``, ``isdir``, ``listdir``, ``makedirs``, ``remove``, ``rmtree``."""

from towerdist._src.gfile import exists as exists
from towerdist._src.gfile import glob as glob
from towerdist._src.gfile import isdir as isdir
from towerdist._src.gfile import listdir as listdir
from towerdist._src.gfile import makedirs as makedirs
from towerdist._src.gfile import remove as remove
from towerdist._src.gfile import rmtree as rmtree

__all__ = ["exists", "glob", "isdir", "listdir", "makedirs", "remove", "rmtree"]
