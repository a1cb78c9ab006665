"""The exception vocabulary of towerdist.

Every error towerdist raises on purpose is one of these classes (or a plain builtin
where TensorFlow raises that builtin). Each subclasses the builtin a caller would catch
anyway, so ``except ValueError`` keeps working for code written against TensorFlow:

================================  =========================================  ==========================
class                             raised for                                 also an instance of
================================  =========================================  ==========================
``OpError``                       base of the TensorFlow-style op errors     ``Exception``
``InvalidArgumentError``          bad values: mismatched shapes/dtypes       ``OpError``, ``ValueError``
``OutOfRangeError``               an exhausted iterator (``get_next``)       ``OpError``
``NotFoundError``                 something looked for does not exist        ``OpError``
``DataLossError``                 a checkpoint file is truncated or corrupt  ``OpError``
``DeadlineExceededError``         a replica or collective ran out of time    ``OpError``, ``TimeoutError``
``UnavailableError``              the workers' communicator is broken        ``OpError``
``AbortedError``                  another worker failed a collective step    ``OpError``
``ValidationError``               arguments TensorFlow rejects with a bare   ``ValueError``,
                                  ``AssertionError``                         ``AssertionError``
``ContextError``                  an API called in the wrong context         ``RuntimeError``
``MergeCallCountError``           replicas made different numbers of         ``RuntimeError``
                                  ``merge_call`` calls
``MissingDependencyError``        an optional package is not installed       ``ImportError``
================================  =========================================  ==========================
"""

from __future__ import annotations

from typing import Any

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


class OpError(Exception):
    """Base class of the TensorFlow-style errors (``tf.errors.OpError``).

    Attributes:
      message: the error message.
    """

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        for name, value in details.items():
            setattr(self, name, value)


class InvalidArgumentError(OpError, ValueError):
    """A value is unusable: mismatched shapes or dtypes across replicas, a bad axis, ..."""


class OutOfRangeError(OpError):
    """An iterator has no more elements (``DistributedIterator.get_next()``)."""


class NotFoundError(OpError):
    """Something looked for does not exist, e.g. a file source for ``AutoShardPolicy.FILE``."""


class DataLossError(OpError):
    """Stored data is unreadable: a truncated or corrupt checkpoint.

    Attributes:
      path: the file at fault.
    """


class DeadlineExceededError(OpError, TimeoutError):
    """A replica or a collective did not arrive within its time bound.

    Attributes:
      missing: ids of the replicas (or ranks) that did not arrive, when known.
    """


class UnavailableError(OpError):
    """A service is gone: under ``MultiWorkerMirroredStrategy``, the workers' communicator broke.

    After a collective timed out (or a peer left), later collectives raise this at once
    instead of deadlocking; the job must be restarted (the workers are torn down at exit).
    """


class AbortedError(OpError):
    """An operation was abandoned: under ``MultiWorkerMirroredStrategy``, another worker failed it.

    Attributes:
      ranks: the workers that failed (their own error says why).
    """


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

    def __init__(self, message: str, *, counts: dict[int, int]) -> None:
        super().__init__(message)
        self.counts = counts


class MissingDependencyError(ImportError):
    """An optional dependency (cupy, NCCL, mpi4py) is needed but not installed.

    The message names the package and the ``pip install "towerdist[<extra>]"`` extra
    that provides it.
    """


class ReplicaStallWarning(RuntimeWarning):
    """Some replicas wait at a barrier that others have not reached for a long time."""
