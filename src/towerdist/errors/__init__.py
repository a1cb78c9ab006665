"""towerdist's exceptions (``tf.errors`` names where TensorFlow has them)."""

from towerdist._src.errors import AbortedError as AbortedError
from towerdist._src.errors import ContextError as ContextError
from towerdist._src.errors import DataLossError as DataLossError
from towerdist._src.errors import DeadlineExceededError as DeadlineExceededError
from towerdist._src.errors import InvalidArgumentError as InvalidArgumentError
from towerdist._src.errors import MergeCallCountError as MergeCallCountError
from towerdist._src.errors import MissingDependencyError as MissingDependencyError
from towerdist._src.errors import NotFoundError as NotFoundError
from towerdist._src.errors import OpError as OpError
from towerdist._src.errors import OutOfRangeError as OutOfRangeError
from towerdist._src.errors import ReplicaStallWarning as ReplicaStallWarning
from towerdist._src.errors import UnavailableError as UnavailableError
from towerdist._src.errors import ValidationError as ValidationError

__all__ = [
    "AbortedError",
    "ContextError",
    "DataLossError",
    "DeadlineExceededError",
    "InvalidArgumentError",
    "MergeCallCountError",
    "MissingDependencyError",
    "NotFoundError",
    "OpError",
    "OutOfRangeError",
    "ReplicaStallWarning",
    "UnavailableError",
    "ValidationError",
]
