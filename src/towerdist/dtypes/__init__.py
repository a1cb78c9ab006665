"""``tf.dtypes``: the dtypes (numpy's, under TensorFlow's names), ``DType``, ``as_dtype`` and ``cast``."""

from towerdist._src.array_ops import cast as cast
from towerdist._src.dtypes import DType as DType
from towerdist._src.dtypes import as_dtype as as_dtype
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

__all__ = [
    "DType",
    "as_dtype",
    "bool",
    "cast",
    "complex64",
    "complex128",
    "double",
    "float16",
    "float32",
    "float64",
    "half",
    "int8",
    "int16",
    "int32",
    "int64",
    "string",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]
