"""``tf.distribute.experimental``: CentralStorageStrategy, MultiWorkerMirroredStrategy (TF 2.0's), options, preemption.

``CollectiveHints`` and ``CollectiveCommunication`` (TF 2.2/2.3 names) are served by the alias
table with a one-time ``DeprecationWarning``.
"""

from towerdist._src import aliases as _aliases
from towerdist._src.compat import old_names as _old_names
from towerdist._src.options import CommunicationImplementation as CommunicationImplementation
from towerdist._src.options import CommunicationOptions as CommunicationOptions
from towerdist._src.options import ValueContext as ValueContext
from towerdist._src.preemption.checkpoint_handler import PreemptionCheckpointHandler as PreemptionCheckpointHandler
from towerdist._src.preemption.termination_config import TerminationConfig as TerminationConfig
from towerdist._src.preemption.watcher import PreemptionWatcher as PreemptionWatcher
from towerdist._src.strategies.central_storage import CentralStorageStrategy as CentralStorageStrategy
from towerdist._src.strategies.multi_worker_mirrored import (
    ExperimentalMultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy,
)

__all__ = [
    "CentralStorageStrategy",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "PreemptionCheckpointHandler",
    "PreemptionWatcher",
    "TerminationConfig",
    "ValueContext",
]

__getattr__ = _aliases.module_getattr(__name__, _old_names.DISTRIBUTE_EXPERIMENTAL)
__dir__ = _aliases.module_dir(__name__, __all__)
