"""``tf.data``'s subset.

:mod:`~towerdist._src.data.dataset` is imported first: it defines ``Dataset`` and then
imports the operation modules, which subclass it. Importing any module of this package
goes through here, so that order holds whichever module is imported first.
"""

from towerdist._src.data import dataset as dataset
