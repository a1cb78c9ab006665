"""``tf.data.experimental``: the auto-shard policy and the distribute options."""

from towerdist._src.data.options import AUTOTUNE as AUTOTUNE
from towerdist._src.data.options import INFINITE as INFINITE_CARDINALITY
from towerdist._src.data.options import SHARD_HINT as SHARD_HINT
from towerdist._src.data.options import UNKNOWN as UNKNOWN_CARDINALITY
from towerdist._src.data.options import AutoShardPolicy as AutoShardPolicy
from towerdist._src.data.options import DistributeOptions as DistributeOptions

__all__ = [
    "AUTOTUNE",
    "INFINITE_CARDINALITY",
    "SHARD_HINT",
    "UNKNOWN_CARDINALITY",
    "AutoShardPolicy",
    "DistributeOptions",
]
