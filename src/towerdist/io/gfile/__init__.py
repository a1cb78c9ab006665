"""``tf.io.gfile`` on local paths: ``GFile`` and the file and directory functions."""

from towerdist._src.gfile import copy as copy
from towerdist._src.gfile import exists as exists
from towerdist._src.gfile import glob as glob
from towerdist._src.gfile import isdir as isdir
from towerdist._src.gfile import join as join
from towerdist._src.gfile import listdir as listdir
from towerdist._src.gfile import makedirs as makedirs
from towerdist._src.gfile import mkdir as mkdir
from towerdist._src.gfile import remove as remove
from towerdist._src.gfile import rename as rename
from towerdist._src.gfile import rmtree as rmtree
from towerdist._src.gfile import stat as stat
from towerdist._src.gfile import walk as walk
from towerdist._src.gfile_file import GFile as GFile

__all__ = [
    "GFile",
    "copy",
    "exists",
    "glob",
    "isdir",
    "join",
    "listdir",
    "makedirs",
    "mkdir",
    "remove",
    "rename",
    "rmtree",
    "stat",
    "walk",
]
