"""``tf.types.experimental``: ``DistributedValues``, ``PerReplica`` and ``Mirrored``."""

from towerdist._src.values.distributed_values import DistributedValues as DistributedValues
from towerdist._src.values.distributed_values import Mirrored as Mirrored
from towerdist._src.values.distributed_values import PerReplica as PerReplica

__all__ = ["DistributedValues", "Mirrored", "PerReplica"]
