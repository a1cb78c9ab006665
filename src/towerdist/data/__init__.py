"""``tf.data`` for numpy: lazily iterated datasets of array structures.

Build a pipeline from a source and transformations, and iterate it, or hand it to
``strategy.experimental_distribute_dataset`` to split each global batch across replicas::

    ds = td.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=0).batch(64).prefetch(td.data.AUTOTUNE)
"""

from towerdist._src.data.dataset import Dataset as Dataset
from towerdist._src.data.files import TextLineDataset as TextLineDataset
from towerdist._src.data.iterator import DatasetIterator as Iterator
from towerdist._src.data.options import AUTOTUNE as AUTOTUNE
from towerdist._src.data.options import INFINITE as INFINITE_CARDINALITY
from towerdist._src.data.options import UNKNOWN as UNKNOWN_CARDINALITY
from towerdist._src.data.options import Options as Options
from towerdist._src.data.options import ThreadingOptions as ThreadingOptions
from towerdist._src.data.spec import DatasetSpec as DatasetSpec
from towerdist.data import experimental as experimental

__all__ = [
    "AUTOTUNE",
    "INFINITE_CARDINALITY",
    "UNKNOWN_CARDINALITY",
    "Dataset",
    "DatasetSpec",
    "Iterator",
    "Options",
    "TextLineDataset",
    "ThreadingOptions",
    "experimental",
]
