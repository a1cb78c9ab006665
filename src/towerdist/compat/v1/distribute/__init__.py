"""``tf.compat.v1.distribute``, whose ``MirroredStrategy`` is TF 1.x's tower-era class (``tf.contrib.distribute``).

``MirroredStrategy`` here is the same class as ``towerdist.contrib.distribute.MirroredStrategy``:
a ``towerdist.distribute.MirroredStrategy`` that also has ``call_for_each_tower``,
``tower_local_var_scope``, ``unwrap``, ``fetch``, ``map``, ``distribute_dataset``, TF 1.x's
``reduce(method_string, value, destinations=None)`` and the rest of TF 1.x contrib's API. The other
names are those of ``towerdist.distribute``. The tower functions (``get_tower_context``, ...)
are served by the alias table with a one-time ``DeprecationWarning``.
"""

from towerdist._src import aliases as _aliases
from towerdist._src.compat import old_names as _old_names
from towerdist._src.compat.tower_context import get_loss_reduction as get_loss_reduction
from towerdist._src.compat.tower_strategy import MirroredStrategy as MirroredStrategy
from towerdist.distribute import CrossDeviceOps as CrossDeviceOps
from towerdist.distribute import HierarchicalCopyAllReduce as HierarchicalCopyAllReduce
from towerdist.distribute import InputContext as InputContext
from towerdist.distribute import InputReplicationMode as InputReplicationMode
from towerdist.distribute import NcclAllReduce as NcclAllReduce
from towerdist.distribute import OneDeviceStrategy as OneDeviceStrategy
from towerdist.distribute import ReduceOp as ReduceOp
from towerdist.distribute import ReductionToOneDevice as ReductionToOneDevice
from towerdist.distribute import ReplicaContext as ReplicaContext
from towerdist.distribute import RunOptions as RunOptions
from towerdist.distribute import Strategy as Strategy
from towerdist.distribute import StrategyExtended as StrategyExtended
from towerdist.distribute import experimental as experimental
from towerdist.distribute import experimental_set_strategy as experimental_set_strategy
from towerdist.distribute import get_replica_context as get_replica_context
from towerdist.distribute import get_strategy as get_strategy
from towerdist.distribute import get_update_device as get_update_device
from towerdist.distribute import has_strategy as has_strategy
from towerdist.distribute import in_cross_replica_context as in_cross_replica_context

__all__ = [
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "InputContext",
    "InputReplicationMode",
    "MirroredStrategy",
    "NcclAllReduce",
    "OneDeviceStrategy",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "RunOptions",
    "Strategy",
    "StrategyExtended",
    "experimental",
    "experimental_set_strategy",
    "get_loss_reduction",
    "get_replica_context",
    "get_strategy",
    "get_update_device",
    "has_strategy",
    "in_cross_replica_context",
]

__getattr__ = _aliases.module_getattr(__name__, _old_names.COMPAT_V1_DISTRIBUTE)
__dir__ = _aliases.module_dir(__name__, __all__)
