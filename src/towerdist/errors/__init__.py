"""towerdist's exceptions and error codes (``tf.errors``; TensorFlow's names where it has them)."""

from towerdist._src.errors import ABORTED as ABORTED
from towerdist._src.errors import ALREADY_EXISTS as ALREADY_EXISTS
from towerdist._src.errors import CANCELLED as CANCELLED
from towerdist._src.errors import DATA_LOSS as DATA_LOSS
from towerdist._src.errors import DEADLINE_EXCEEDED as DEADLINE_EXCEEDED
from towerdist._src.errors import FAILED_PRECONDITION as FAILED_PRECONDITION
from towerdist._src.errors import INTERNAL as INTERNAL
from towerdist._src.errors import INVALID_ARGUMENT as INVALID_ARGUMENT
from towerdist._src.errors import NOT_FOUND as NOT_FOUND
from towerdist._src.errors import OK as OK
from towerdist._src.errors import OUT_OF_RANGE as OUT_OF_RANGE
from towerdist._src.errors import PERMISSION_DENIED as PERMISSION_DENIED
from towerdist._src.errors import RESOURCE_EXHAUSTED as RESOURCE_EXHAUSTED
from towerdist._src.errors import UNAUTHENTICATED as UNAUTHENTICATED
from towerdist._src.errors import UNAVAILABLE as UNAVAILABLE
from towerdist._src.errors import UNIMPLEMENTED as UNIMPLEMENTED
from towerdist._src.errors import UNKNOWN as UNKNOWN
from towerdist._src.errors import AbortedError as AbortedError
from towerdist._src.errors import AlreadyExistsError as AlreadyExistsError
from towerdist._src.errors import CancelledError as CancelledError
from towerdist._src.errors import ContextError as ContextError
from towerdist._src.errors import DataLossError as DataLossError
from towerdist._src.errors import DeadlineExceededError as DeadlineExceededError
from towerdist._src.errors import FailedPreconditionError as FailedPreconditionError
from towerdist._src.errors import InternalError as InternalError
from towerdist._src.errors import InvalidArgumentError as InvalidArgumentError
from towerdist._src.errors import MergeCallCountError as MergeCallCountError
from towerdist._src.errors import MissingDependencyError as MissingDependencyError
from towerdist._src.errors import NotFoundError as NotFoundError
from towerdist._src.errors import OperatorNotAllowedInGraphError as OperatorNotAllowedInGraphError
from towerdist._src.errors import OpError as OpError
from towerdist._src.errors import OutOfRangeError as OutOfRangeError
from towerdist._src.errors import OutOfRangeStopIteration as OutOfRangeStopIteration
from towerdist._src.errors import PermissionDeniedError as PermissionDeniedError
from towerdist._src.errors import ReplicaStallWarning as ReplicaStallWarning
from towerdist._src.errors import ResourceExhaustedError as ResourceExhaustedError
from towerdist._src.errors import UnauthenticatedError as UnauthenticatedError
from towerdist._src.errors import UnavailableError as UnavailableError
from towerdist._src.errors import UnimplementedError as UnimplementedError
from towerdist._src.errors import UnknownError as UnknownError
from towerdist._src.errors import ValidationError as ValidationError
from towerdist._src.errors import error_code_from_exception_type as error_code_from_exception_type
from towerdist._src.errors import exception_type_from_error_code as exception_type_from_error_code

__all__ = [
    "ABORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
    "DATA_LOSS",
    "DEADLINE_EXCEEDED",
    "FAILED_PRECONDITION",
    "INTERNAL",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "OK",
    "OUT_OF_RANGE",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "UNAUTHENTICATED",
    "UNAVAILABLE",
    "UNIMPLEMENTED",
    "UNKNOWN",
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "ContextError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "MergeCallCountError",
    "MissingDependencyError",
    "NotFoundError",
    "OpError",
    "OperatorNotAllowedInGraphError",
    "OutOfRangeError",
    "OutOfRangeStopIteration",
    "PermissionDeniedError",
    "ReplicaStallWarning",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "ValidationError",
    "error_code_from_exception_type",
    "exception_type_from_error_code",
]
