"""``tf.train``'s checkpointing: ``Checkpoint``, ``CheckpointManager``, ``latest_checkpoint``."""

from towerdist._src.checkpoint.checkpoint import Checkpoint as Checkpoint
from towerdist._src.checkpoint.checkpoint import CheckpointLoadStatus as CheckpointLoadStatus
from towerdist._src.checkpoint.manager import CheckpointManager as CheckpointManager
from towerdist._src.checkpoint.manager import latest_checkpoint as latest_checkpoint

__all__ = ["Checkpoint", "CheckpointLoadStatus", "CheckpointManager", "latest_checkpoint"]
