"""``tf.compat.v1`` for towerdist: TF 1.x code runs with ``import towerdist.compat.v1 as tf``.

It holds everything of ``towerdist`` (arrays, dtypes, ``Variable``, ``device``, ``data``,
...), with ``distribute`` replaced by :mod:`towerdist.compat.v1.distribute`, whose
``MirroredStrategy`` speaks the tower-era API of TF 1.x's ``tf.contrib.distribute``.
The TF 1.x module functions ``get_tower_context``, ``get_cross_tower_context``,
``get_distribution_strategy`` and ``has_distribution_strategy`` work here too; each warns
once that it is deprecated (the table is ``towerdist._src.compat.old_names``).

Example:
  >>> import towerdist.compat.v1 as tf
  >>> strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
  >>> def fn():
  ...     return tf.get_tower_context().tower_id
  >>> strategy.unwrap(strategy.call_for_each_tower(fn))
  [0, 1]
"""

from towerdist import config as config
from towerdist import contrib as contrib
from towerdist import data as data
from towerdist import errors as errors
from towerdist import experimental as experimental
from towerdist import metrics as metrics
from towerdist import nn as nn
from towerdist import optimizers as optimizers
from towerdist import train as train
from towerdist import types as types
from towerdist._src import aliases as _aliases
from towerdist._src.array_ops import add_n as add_n
from towerdist._src.array_ops import cast as cast
from towerdist._src.array_ops import constant as constant
from towerdist._src.array_ops import convert_to_tensor as convert_to_tensor
from towerdist._src.array_ops import function as function
from towerdist._src.array_ops import identity as identity
from towerdist._src.array_ops import ones as ones
from towerdist._src.array_ops import range as range  # noqa: A004
from towerdist._src.array_ops import reduce_mean as reduce_mean
from towerdist._src.array_ops import reduce_sum as reduce_sum
from towerdist._src.array_ops import zeros as zeros
from towerdist._src.compat import old_names as _old_names
from towerdist._src.data.spec import TensorSpec as TensorSpec
from towerdist._src.device import device as device
from towerdist._src.dtypes import bool as bool  # noqa: A004
from towerdist._src.dtypes import complex64 as complex64
from towerdist._src.dtypes import complex128 as complex128
from towerdist._src.dtypes import double as double
from towerdist._src.dtypes import float16 as float16
from towerdist._src.dtypes import float32 as float32
from towerdist._src.dtypes import float64 as float64
from towerdist._src.dtypes import half as half
from towerdist._src.dtypes import int8 as int8
from towerdist._src.dtypes import int16 as int16
from towerdist._src.dtypes import int32 as int32
from towerdist._src.dtypes import int64 as int64
from towerdist._src.dtypes import string as string
from towerdist._src.dtypes import uint8 as uint8
from towerdist._src.dtypes import uint16 as uint16
from towerdist._src.dtypes import uint32 as uint32
from towerdist._src.dtypes import uint64 as uint64
from towerdist._src.indexed_slices import IndexedSlices as IndexedSlices
from towerdist._src.module import Module as Module
from towerdist._src.name_scope import name_scope_v1 as name_scope
from towerdist._src.variable_enums import VariableAggregation as VariableAggregation
from towerdist._src.variable_enums import VariableSynchronization as VariableSynchronization
from towerdist._src.variables.variable import Variable as Variable
from towerdist.compat.v1 import distribute as distribute

__all__ = [
    "add_n",
    "bool",
    "cast",
    "complex128",
    "complex64",
    "config",
    "contrib",
    "constant",
    "convert_to_tensor",
    "data",
    "device",
    "distribute",
    "double",
    "errors",
    "experimental",
    "float16",
    "float32",
    "float64",
    "function",
    "half",
    "identity",
    "int16",
    "int32",
    "int64",
    "int8",
    "metrics",
    "Module",
    "name_scope",
    "nn",
    "ones",
    "optimizers",
    "range",
    "reduce_mean",
    "reduce_sum",
    "string",
    "TensorSpec",
    "train",
    "types",
    "uint16",
    "uint32",
    "uint64",
    "uint8",
    "IndexedSlices",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "zeros",
]

__getattr__ = _aliases.module_getattr(__name__, _old_names.COMPAT_V1)
__dir__ = _aliases.module_dir(__name__, __all__)
