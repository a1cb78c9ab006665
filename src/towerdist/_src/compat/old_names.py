"""The one table of old module attributes: each TF 1.x / TF 2.0 name a public module keeps, and its target.

Each public module serves its own entries with ``__getattr__ = aliases.module_getattr(__name__,
old_names.<ITS TABLE>)`` (``towerdist._src.aliases`` warns once per name and registers them).
The table sits in this layer because it names the implementations themselves: strategies,
cross-device ops and the tower dialect, all below ``compat``. Old class members are declared
beside their classes (see ``towerdist._src.aliases``).
"""

from __future__ import annotations

from towerdist._src import context, options
from towerdist._src.aliases import Alias
from towerdist._src.compat import tower_context
from towerdist._src.compat.tower_strategy import MirroredStrategy
from towerdist._src.cross_device_ops.all_reduce_ops import AllReduceCrossDeviceOps
from towerdist._src.cross_device_ops.base import CrossDeviceOps
from towerdist._src.cross_device_ops.reduction_to_one_device import ReductionToOneDevice
from towerdist._src.strategies.one_device import OneDeviceStrategy
from towerdist._src.strategies.strategy import Strategy

__all__ = ["COMPAT_V1", "COMPAT_V1_DISTRIBUTE", "CONTRIB_DISTRIBUTE", "DISTRIBUTE_EXPERIMENTAL"]


def _tower_module_functions(module: str) -> tuple[Alias, ...]:
    """The TF 1.x module-level tower functions, as they appear in ``module``."""
    return (
        Alias(
            f"{module}.get_tower_context",
            "towerdist.distribute.get_replica_context()",
            tower_context.get_tower_context,
            "1.12",
        ),
        Alias(
            f"{module}.get_cross_tower_context",
            "towerdist.distribute.get_cross_replica_context()",
            tower_context.get_cross_tower_context,
            "1.12",
        ),
        Alias(
            f"{module}.get_distribution_strategy", "towerdist.distribute.get_strategy()", context.get_strategy, "1.12"
        ),
        Alias(
            f"{module}.has_distribution_strategy", "towerdist.distribute.has_strategy()", context.has_strategy, "1.12"
        ),
    )


def _contrib(name: str, new: str, target: object, kind: str = "class") -> Alias:
    return Alias(f"towerdist.contrib.distribute.{name}", new, target, "1.14 (tf.contrib removed in 2.0)", kind)


# --- TF 1.x module-level functions ----------------------------------------------------------
COMPAT_V1 = _tower_module_functions("towerdist.compat.v1")
COMPAT_V1_DISTRIBUTE = _tower_module_functions("towerdist.compat.v1.distribute")

# --- tf.contrib.distribute (TF 1.8-1.14) --------------------------------------------------
CONTRIB_DISTRIBUTE = (
    *_tower_module_functions("towerdist.contrib.distribute"),
    _contrib("MirroredStrategy", "towerdist.compat.v1.distribute.MirroredStrategy (the same class)", MirroredStrategy),
    _contrib("TowerContext", "towerdist.distribute.ReplicaContext", tower_context.TowerContext),
    _contrib("DistributionStrategy", "towerdist.distribute.Strategy", Strategy),
    _contrib("OneDeviceStrategy", "towerdist.distribute.OneDeviceStrategy", OneDeviceStrategy),
    _contrib("CrossTowerOps", "towerdist.distribute.CrossDeviceOps", CrossDeviceOps),
    _contrib("ReductionToOneDeviceCrossTowerOps", "towerdist.distribute.ReductionToOneDevice", ReductionToOneDevice),
    _contrib(
        "AllReduceCrossTowerOps",
        "towerdist.distribute.NcclAllReduce or HierarchicalCopyAllReduce",
        AllReduceCrossDeviceOps,
    ),
    _contrib(
        "UpdateContext",
        "towerdist.distribute.get_update_device() inside extended.update()",
        tower_context.UpdateContext,
    ),
    _contrib(
        "get_update_device",
        "towerdist.distribute.get_update_device()",
        context.get_update_device,
        kind="function",
    ),
    _contrib(
        "get_loss_reduction",
        "towerdist.compat.v1.distribute.get_loss_reduction()",
        tower_context.get_loss_reduction,
        kind="function",
    ),
)

# --- TF 2.2/2.3 ---------------------------------------------------------------------------
DISTRIBUTE_EXPERIMENTAL = (
    Alias(
        "towerdist.distribute.experimental.CollectiveHints",
        "towerdist.distribute.experimental.CommunicationOptions",
        options.CollectiveHints,
        "2.4",
        "class",
    ),
    Alias(
        "towerdist.distribute.experimental.CollectiveCommunication",
        "towerdist.distribute.experimental.CommunicationImplementation",
        options.CommunicationImplementation,
        "2.4",
        "class",
    ),
)
