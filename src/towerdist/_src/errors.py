"""The exception vocabulary of towerdist: ``tf.errors``' classes and codes, and a few of its own.

Every error towerdist raises on purpose is one of these classes (or a plain builtin
where TensorFlow raises that builtin). TensorFlow's 16 ``OpError`` subclasses are all
here, with TensorFlow's names, hierarchy and ``error_code``; where towerdist raises one
in a place a Python caller would catch a builtin, the class subclasses that builtin too,
so ``except ValueError`` keeps working:

====================================  ====  ==========================================  =============================
class                                 code  raised by towerdist for                     also an instance of
====================================  ====  ==========================================  =============================
``OpError``                           --    base of the TensorFlow-style errors         ``Exception``
``CancelledError``                    1     (not raised: nothing is cancelled)          ``OpError``
``UnknownError``                      2     an exception of a ``from_generator``        ``OpError``
                                            generator with no better class
``InvalidArgumentError``              3     bad values: mismatched shapes/dtypes        ``OpError``, ``ValueError``
``DeadlineExceededError``             4     a replica or collective ran out of time     ``OpError``, ``TimeoutError``
``NotFoundError``                     5     a missing checkpoint or input file          ``OpError``
``AlreadyExistsError``                6     a second profiler started                   ``OpError``
``PermissionDeniedError``             7     an input file that may not be read          ``OpError``
``ResourceExhaustedError``            8     a ``MemoryError`` of a ``from_generator``   ``OpError``
                                            generator
``FailedPreconditionError``           9     a directory given as an input file          ``OpError``
``AbortedError``                      10    another worker failed a collective step     ``OpError``
``OutOfRangeError``                   11    an exhausted iterator (``get_next``)        ``OpError``
``UnimplementedError``                12    a feature towerdist does not provide        ``OpError``,
                                            (a GPU split into logical GPUs,             ``NotImplementedError``
                                            ``Dataset.save(checkpoint_args=...)``)
``InternalError``                     13    a length beyond the last bucket boundary    ``OpError``
                                            (``pad_to_bucket_boundary``); a towerdist
                                            bug
``UnavailableError``                  14    the workers' communicator is broken; no     ``OpError``
                                            profiler to stop
``DataLossError``                     15    a truncated or corrupt checkpoint, saved    ``OpError``
                                            dataset or compressed input file; an
                                            element larger than ``padded_shapes``
``UnauthenticatedError``              16    (not raised)                                ``OpError``
``OperatorNotAllowedInGraphError``          (not raised: there are no graphs)           ``TypeError``
``ValidationError``                         arguments TensorFlow rejects with a bare    ``ValueError``,
                                            ``AssertionError``                          ``AssertionError``
``ContextError``                            an API called in the wrong context          ``RuntimeError``
``MergeCallCountError``                     replicas made different numbers of          ``RuntimeError``
                                            ``merge_call`` calls
``MissingDependencyError``                  an optional package is not installed        ``ImportError``
====================================  ====  ==========================================  =============================

The codes are module constants (``OK`` = 0 ... ``UNAUTHENTICATED`` = 16);
``exception_type_from_error_code`` and ``error_code_from_exception_type`` map between
codes and classes (TensorFlow has them in ``tf.compat.v1.errors``).

Each ``OpError`` is constructed as TensorFlow code does, ``OutOfRangeError(None, None,
"message")``, or as towerdist does, ``OutOfRangeError("message", **details)``.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

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


# --- error codes (TensorFlow's canonical codes, ``tf.errors.OK`` ... ``tf.errors.UNAUTHENTICATED``) ---

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16


class OpError(Exception):
    """Base class of the TensorFlow-style errors (``tf.errors.OpError``).

    Constructed as TensorFlow code does, ``OpError(node_def, op, message, error_code)``
    (``node_def`` and ``op`` are ``None`` in towerdist: there are no graph nodes), or as
    towerdist does, ``OpError("message", **details)``, each detail becoming an attribute.
    The subclasses take ``(node_def, op, message)`` or ``("message", **details)`` and
    supply their own ``error_code``; for them a fourth argument is ``experimental_payloads``.

    Attributes:
      message: the error message (also ``str(error)``).
      op: the operation that failed; ``None`` (towerdist has no graph operations).
      node_def: the failed operation's ``NodeDef``; ``None`` here too.
      error_code: one of the ``td.errors`` codes, e.g. ``td.errors.OUT_OF_RANGE``.
      experimental_payloads: a dict of extra data (empty unless one was given).
    """

    _code: ClassVar[int | None] = None  # a subclass's fixed error code; OpError takes it as an argument

    def __init__(
        self,
        node_def: object = None,
        op: object = None,
        message: str | None = None,
        *args: Any,  # TensorFlow's (error_code, payloads): read as int and dict at run time
        **details: Any,  # attributes of the error (e.g. path=...): whatever the raiser attaches
    ) -> None:
        if message is None and op is None and isinstance(node_def, str):
            node_def, message = None, node_def  # towerdist's form: OpError("message", **details)
        code = self._code
        if code is None:  # OpError itself: (node_def, op, message, error_code, *args)
            code = details.pop("error_code", None)
            if code is None and args:
                code, args = args[0], args[1:]
        text = "" if message is None else str(message)
        super().__init__(text)
        self._message = text
        self._op = op
        self._node_def = node_def
        self._error_code = UNKNOWN if code is None else int(code)
        payloads = args[0] if args and isinstance(args[0], dict) else {}
        self._experimental_payloads: dict[Any, Any] = dict(payloads)
        for name, value in details.items():
            setattr(self, name, value)

    @property
    def message(self) -> str:
        """The error message."""
        return self._message

    @property
    def op(self) -> object:
        """The operation that failed: ``None`` (towerdist runs no graph operations)."""
        return self._op

    @property
    def node_def(self) -> object:
        """The failed operation's ``NodeDef``: ``None`` (towerdist has no graphs)."""
        return self._node_def

    @property
    def error_code(self) -> int:
        """The error's code, e.g. ``td.errors.INVALID_ARGUMENT`` (3)."""
        return self._error_code

    @property
    def experimental_payloads(self) -> dict[Any, Any]:
        """Extra data attached to the error (a dict; empty unless one was given)."""
        return self._experimental_payloads

    def __str__(self) -> str:
        return self._message


class CancelledError(OpError):
    """An operation or step was cancelled (``tf.errors.CancelledError``)."""

    _code = CANCELLED


class UnknownError(OpError):
    """An error with no better class (``tf.errors.UnknownError``)."""

    _code = UNKNOWN


class InvalidArgumentError(OpError, ValueError):
    """A value is unusable: mismatched shapes or dtypes across replicas, a bad axis, ..."""

    _code = INVALID_ARGUMENT


class DeadlineExceededError(OpError, TimeoutError):
    """A replica or a collective did not arrive within its time bound.

    Attributes:
      missing: ids of the replicas (or ranks) that did not arrive, when known.
    """

    _code = DEADLINE_EXCEEDED


class NotFoundError(OpError):
    """Something looked for does not exist, e.g. a file source for ``AutoShardPolicy.FILE``."""

    _code = NOT_FOUND


class AlreadyExistsError(OpError):
    """What was to be created already exists, e.g. a second running profiler."""

    _code = ALREADY_EXISTS


class PermissionDeniedError(OpError):
    """The caller may not run the operation (``tf.errors.PermissionDeniedError``)."""

    _code = PERMISSION_DENIED


class ResourceExhaustedError(OpError):
    """A resource ran out: memory, a quota, disk (``tf.errors.ResourceExhaustedError``)."""

    _code = RESOURCE_EXHAUSTED


class FailedPreconditionError(OpError):
    """The system is not in the state the operation needs (``tf.errors.FailedPreconditionError``)."""

    _code = FAILED_PRECONDITION


class AbortedError(OpError):
    """An operation was abandoned: under ``MultiWorkerMirroredStrategy``, another worker failed it.

    Attributes:
      ranks: the workers that failed (their own error says why).
    """

    _code = ABORTED


class OutOfRangeError(OpError):
    """An iterator has no more elements (``DistributedIterator.get_next()``)."""

    _code = OUT_OF_RANGE


class OutOfRangeStopIteration(OutOfRangeError, StopIteration):
    """A ``StopIteration`` that escaped a ``td.function``: an ``OutOfRangeError`` that is a ``StopIteration`` too.

    TensorFlow raises ``OutOfRangeError`` when ``next(iterator)`` inside a ``tf.function``
    runs out of data, so its training loops end an epoch with ``except
    tf.errors.OutOfRangeError``; code written for towerdist's pass-through ``td.function``
    may catch ``StopIteration`` instead. This class satisfies both. Where a generator or
    coroutine is on the stack, a plain ``OutOfRangeError`` is raised instead, since Python
    turns a ``StopIteration`` leaving one into ``RuntimeError`` (PEP 479) and TensorFlow's
    error passes through it unchanged.
    """


class UnimplementedError(OpError, NotImplementedError):
    """The operation is not implemented or not supported, e.g. splitting a GPU into logical GPUs."""

    _code = UNIMPLEMENTED


class InternalError(OpError):
    """An invariant the system relies on is broken (``tf.errors.InternalError``)."""

    _code = INTERNAL


class UnavailableError(OpError):
    """A service is gone: under ``MultiWorkerMirroredStrategy``, the workers' communicator broke.

    After a collective timed out (or a peer left), later collectives raise this at once
    instead of deadlocking; the job must be restarted (the workers are torn down at exit).
    Also raised by ``td.profiler.experimental.stop()`` when no profiler is running.
    """

    _code = UNAVAILABLE


class DataLossError(OpError):
    """Stored data is unreadable: a truncated or corrupt checkpoint.

    Attributes:
      path: the file at fault.
    """

    _code = DATA_LOSS


class UnauthenticatedError(OpError):
    """The request has no valid credentials (``tf.errors.UnauthenticatedError``)."""

    _code = UNAUTHENTICATED


class OperatorNotAllowedInGraphError(TypeError):
    """A Python operation a TensorFlow graph cannot run (``tf.errors.OperatorNotAllowedInGraphError``).

    towerdist runs eagerly and never raises it; it exists so that ``except`` clauses
    written for TensorFlow keep working.
    """


_CODE_TO_CLASS: dict[int, type[OpError]] = {
    CANCELLED: CancelledError,
    UNKNOWN: UnknownError,
    INVALID_ARGUMENT: InvalidArgumentError,
    DEADLINE_EXCEEDED: DeadlineExceededError,
    NOT_FOUND: NotFoundError,
    ALREADY_EXISTS: AlreadyExistsError,
    PERMISSION_DENIED: PermissionDeniedError,
    RESOURCE_EXHAUSTED: ResourceExhaustedError,
    FAILED_PRECONDITION: FailedPreconditionError,
    ABORTED: AbortedError,
    OUT_OF_RANGE: OutOfRangeError,
    UNIMPLEMENTED: UnimplementedError,
    INTERNAL: InternalError,
    UNAVAILABLE: UnavailableError,
    DATA_LOSS: DataLossError,
    UNAUTHENTICATED: UnauthenticatedError,
}
_CLASS_TO_CODE: dict[type[BaseException], int] = {cls: code for code, cls in _CODE_TO_CLASS.items()}


def exception_type_from_error_code(error_code: int) -> type[OpError]:
    """The ``OpError`` subclass of ``error_code`` (``tf.compat.v1.errors.exception_type_from_error_code``).

    Raises:
      KeyError: no class has this code (``OK``, 0, has none), as in TensorFlow.
    """
    try:
        return _CODE_TO_CLASS[error_code]
    except (KeyError, TypeError):
        raise KeyError(
            f"td.errors.exception_type_from_error_code() knows the codes {CANCELLED}..{UNAUTHENTICATED} "
            f"(td.errors.CANCELLED .. td.errors.UNAUTHENTICATED). Got error_code={error_code!r}."
        ) from None


def error_code_from_exception_type(cls: type[BaseException]) -> int:
    """The error code of an ``OpError`` subclass (``tf.compat.v1.errors.error_code_from_exception_type``).

    Only TensorFlow's own classes have codes, as in TensorFlow. For any other class this
    warns ("Unknown class exception") and returns ``UNKNOWN``; TensorFlow 2.21 warns the
    same and returns an ``UnknownError`` instance instead of a code.
    """
    code = _CLASS_TO_CODE.get(cls)
    if code is None:
        warnings.warn(
            f"Unknown class exception: td.errors.error_code_from_exception_type() knows TensorFlow's OpError "
            f"subclasses, not {cls!r}; returning td.errors.UNKNOWN.",
            UserWarning,
            stacklevel=2,
        )
        return UNKNOWN
    return code


class ValidationError(ValueError, AssertionError):
    """An argument that TensorFlow rejects with a bare ``AssertionError``.

    towerdist raises it with a message that says what is wrong and how to fix it. It is a
    ``ValueError`` (the natural class for a bad argument) and also an ``AssertionError``,
    so code written against TensorFlow's behaviour still catches it.
    """


class ContextError(RuntimeError):
    """An API was called in a context where it is not allowed.

    Examples: ``strategy.run`` inside a replica function, ``merge_call`` outside
    ``strategy.run``, entering one strategy's scope inside another's.

    Attributes:
      api: the API that was called, e.g. ``"Strategy.run()"``.
    """

    def __init__(self, message: str, *, api: str | None = None) -> None:
        super().__init__(message)
        self.api = api


class MergeCallCountError(RuntimeError):
    """Replicas of one ``strategy.run`` made different numbers of ``merge_call`` calls.

    Attributes:
      counts: ``{replica_id: number of merge_call calls made}`` at the point of failure.
    """

    def __init__(self, message: str, *, counts: dict[int, int] | None = None) -> None:
        super().__init__(message)
        # (``counts`` may be left out so that unpickling, which passes the message alone, works.)
        self.counts: dict[int, int] = {} if counts is None else counts


class MissingDependencyError(ImportError):
    """An optional dependency (cupy, NCCL, mpi4py) is needed but not installed.

    The message names the package and the ``pip install "towerdist[<extra>]"`` extra
    that provides it.
    """


class ReplicaStallWarning(RuntimeWarning):
    """Some replicas wait at a barrier that others have not reached for a long time."""


# Tracebacks, reprs and pickles name a class by its ``__module__``: show the public path
# (``towerdist.errors.ContextError``), where users import and catch it, rather than this
# private module. Pickles stay loadable: ``towerdist.errors`` exports each of these names.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = "towerdist.errors"
del _name, _obj
