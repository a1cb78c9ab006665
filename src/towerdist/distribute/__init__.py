"""Distribution strategies (``tf.distribute``) for numpy and cupy arrays.

Glossary:
  - ``replica``: one copy of the computation. ``MirroredStrategy`` runs one replica per
    device, each on its own thread; replicas are numbered ``0 .. num_replicas_in_sync - 1``.
  - ``worker``: a process driving some replicas. Single-machine strategies have one worker.
  - replica context: inside the function passed to ``strategy.run``;
    ``get_replica_context()`` returns the replica's ``ReplicaContext`` (``merge_call``,
    ``all_reduce``, ``all_gather``).
  - cross-replica context: inside ``strategy.scope()`` or a ``merge_fn``; the code sees
    all replicas at once and may call ``strategy.reduce``, ``extended.reduce_to``,
    ``strategy.run``.
  - default replica context: outside any strategy scope; the default strategy (one
    replica) is current.
  - update context: inside ``extended.update``, per component of a variable;
    ``get_update_device()`` names the device being updated.
  - ``PerReplica`` vs ``Mirrored``: both hold one value per replica. A ``PerReplica``
    holds unrelated values (e.g. each replica's loss); a ``Mirrored`` holds values known
    to be equal (e.g. an all-reduced gradient) and can be read in cross-replica context.
  - sync-on-read: variables whose per-replica copies are updated independently and
    aggregated only when read in cross-replica context (metrics).
"""

from towerdist._src.context import experimental_set_strategy as experimental_set_strategy
from towerdist._src.context import get_cross_replica_context as get_cross_replica_context
from towerdist._src.context import get_replica_context as get_replica_context
from towerdist._src.context import get_strategy as get_strategy
from towerdist._src.context import get_update_device as get_update_device
from towerdist._src.context import has_strategy as has_strategy
from towerdist._src.context import in_cross_replica_context as in_cross_replica_context
from towerdist._src.cross_device_ops.base import CrossDeviceOps as CrossDeviceOps
from towerdist._src.cross_device_ops.hierarchical_copy import HierarchicalCopyAllReduce as HierarchicalCopyAllReduce
from towerdist._src.cross_device_ops.nccl_all_reduce import NcclAllReduce as NcclAllReduce
from towerdist._src.cross_device_ops.reduction_to_one_device import ReductionToOneDevice as ReductionToOneDevice
from towerdist._src.cross_device_ops.shared_memory import SharedMemoryAllReduce as SharedMemoryAllReduce
from towerdist._src.input.distributed_dataset import DistributedDataset as DistributedDataset
from towerdist._src.input.distributed_iterator import DistributedIterator as DistributedIterator
from towerdist._src.input.input_context import InputContext as InputContext
from towerdist._src.input.input_context import InputOptions as InputOptions
from towerdist._src.input.input_context import InputReplicationMode as InputReplicationMode
from towerdist._src.options import RunOptions as RunOptions
from towerdist._src.reduce_op import ReduceOp as ReduceOp
from towerdist._src.strategies.default import default_strategy as _default_strategy
from towerdist._src.strategies.mirrored import MirroredStrategy as MirroredStrategy
from towerdist._src.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy
from towerdist._src.strategies.one_device import OneDeviceStrategy as OneDeviceStrategy
from towerdist._src.strategies.replica_context import ReplicaContext as ReplicaContext
from towerdist._src.strategies.strategy import Strategy as Strategy
from towerdist._src.strategies.strategy_extended import StrategyExtended as StrategyExtended
from towerdist._src.values.distributed_values import DistributedValues as DistributedValues
from towerdist._src.values.distributed_values import Mirrored as Mirrored
from towerdist._src.values.distributed_values import PerReplica as PerReplica
from towerdist.distribute import cluster_resolver as cluster_resolver
from towerdist.distribute import experimental as experimental

del _default_strategy  # imported for its registration with the context module

__all__ = [
    "CrossDeviceOps",
    "DistributedDataset",
    "DistributedIterator",
    "DistributedValues",
    "HierarchicalCopyAllReduce",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "Mirrored",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "NcclAllReduce",
    "OneDeviceStrategy",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "RunOptions",
    "SharedMemoryAllReduce",
    "Strategy",
    "StrategyExtended",
    "cluster_resolver",
    "experimental",
    "experimental_set_strategy",
    "get_cross_replica_context",
    "get_replica_context",
    "get_strategy",
    "get_update_device",
    "has_strategy",
    "in_cross_replica_context",
]
