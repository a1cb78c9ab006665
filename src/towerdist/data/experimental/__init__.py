"""``tf.data.experimental``: the auto-shard policy, the option groups and the experimental operations."""

from towerdist._src.data.cardinality import experimental_assert_cardinality as assert_cardinality
from towerdist._src.data.cardinality import experimental_cardinality as cardinality
from towerdist._src.data.combinators import experimental_get_single_element as get_single_element
from towerdist._src.data.combinators import experimental_ignore_errors as ignore_errors
from towerdist._src.data.combinators import experimental_scan as scan
from towerdist._src.data.combinators import experimental_take_while as take_while
from towerdist._src.data.combinators import experimental_unique as unique
from towerdist._src.data.options import AUTOTUNE as AUTOTUNE
from towerdist._src.data.options import INFINITE as INFINITE_CARDINALITY
from towerdist._src.data.options import SHARD_HINT as SHARD_HINT
from towerdist._src.data.options import UNKNOWN as UNKNOWN_CARDINALITY
from towerdist._src.data.options import AutoShardPolicy as AutoShardPolicy
from towerdist._src.data.options import AutotuneAlgorithm as AutotuneAlgorithm
from towerdist._src.data.options import AutotuneOptions as AutotuneOptions
from towerdist._src.data.options import DistributeOptions as DistributeOptions
from towerdist._src.data.options import ExternalStatePolicy as ExternalStatePolicy
from towerdist._src.data.options import OptimizationOptions as OptimizationOptions
from towerdist._src.data.options import ServiceOptions as ServiceOptions
from towerdist._src.data.options import ThreadingOptions as ThreadingOptions
from towerdist._src.data.persistence import experimental_load as load
from towerdist._src.data.persistence import experimental_save as save
from towerdist._src.data.resampling import experimental_rejection_resample as rejection_resample
from towerdist._src.data.sampling import experimental_choose_from_datasets as choose_from_datasets
from towerdist._src.data.sampling import experimental_sample_from_datasets as sample_from_datasets
from towerdist._src.data.sources import experimental_counter as Counter
from towerdist._src.data.windowing import experimental_bucket_by_sequence_length as bucket_by_sequence_length
from towerdist._src.data.windowing import experimental_group_by_window as group_by_window

__all__ = [
    "AUTOTUNE",
    "INFINITE_CARDINALITY",
    "SHARD_HINT",
    "UNKNOWN_CARDINALITY",
    "AutoShardPolicy",
    "AutotuneAlgorithm",
    "AutotuneOptions",
    "Counter",
    "DistributeOptions",
    "ExternalStatePolicy",
    "OptimizationOptions",
    "ServiceOptions",
    "ThreadingOptions",
    "assert_cardinality",
    "bucket_by_sequence_length",
    "cardinality",
    "choose_from_datasets",
    "get_single_element",
    "group_by_window",
    "ignore_errors",
    "load",
    "rejection_resample",
    "sample_from_datasets",
    "save",
    "scan",
    "take_while",
    "unique",
]
