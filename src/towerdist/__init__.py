"""towerdist: TensorFlow's ``tf.distribute`` programming model for numpy and cupy.

Code written against ``tf.distribute`` runs with ``import towerdist as tf``, with numpy
(CPU) or cupy (GPU) arrays where TensorFlow has tensors::

    import towerdist as tf

    cpu = tf.config.list_physical_devices("CPU")[0]   # split the host CPU into 2 logical devices
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    per_replica = strategy.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
    strategy.reduce("sum", per_replica, axis=None)   # -> 1

See ``towerdist.distribute`` for the concepts (replicas, contexts, distributed values).
"""

import typing as _typing

from towerdist import compat as compat
from towerdist import config as config
from towerdist import contrib as contrib
from towerdist import data as data
from towerdist import distribute as distribute
from towerdist import dtypes as dtypes
from towerdist import errors as errors
from towerdist import experimental as experimental
from towerdist import io as io
from towerdist import metrics as metrics
from towerdist import nn as nn
from towerdist import optimizers as optimizers
from towerdist import profiler as profiler
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
from towerdist._src.name_scope import name_scope as name_scope
from towerdist._src.variable_enums import VariableAggregation as VariableAggregation
from towerdist._src.variable_enums import VariableSynchronization as VariableSynchronization
from towerdist._src.variables.variable import Variable as Variable
from towerdist._src.version import __version__ as __version__

__all__ = [
    "IndexedSlices",
    "Module",
    "TensorSpec",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "add_n",
    "bool",
    "cast",
    "complex64",
    "complex128",
    "compat",
    "config",
    "constant",
    "contrib",
    "convert_to_tensor",
    "data",
    "device",
    "distribute",
    "double",
    "dtypes",
    "errors",
    "experimental",
    "float16",
    "float32",
    "float64",
    "function",
    "half",
    "identity",
    "int8",
    "int16",
    "int32",
    "int64",
    "io",
    "metrics",
    "name_scope",
    "nn",
    "ones",
    "optimizers",
    "profiler",
    "range",
    "reduce_mean",
    "reduce_sum",
    "string",
    "train",
    "types",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "zeros",
]

# TensorFlow names towerdist lacks (tf.keras, tf.GradientTape, tf.matmul) raise an
# AttributeError saying what to use instead. Hidden from type checkers, which would
# otherwise take every name for an attribute of the module.
if not _typing.TYPE_CHECKING:
    __getattr__ = _aliases.module_getattr(__name__)
