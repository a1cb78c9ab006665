"""Option records: ``CommunicationOptions``, ``CommunicationImplementation``, ``RunOptions``."""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any, NamedTuple

__all__ = ["CollectiveHints", "CommunicationImplementation", "CommunicationOptions", "RunOptions", "ValueContext"]


class CommunicationImplementation(enum.Enum):
    """Which collective implementation to prefer (``tf.distribute.experimental.CommunicationImplementation``)."""

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"

    def __str__(self) -> str:
        return f"CommunicationImplementation.{self.name}"


class CommunicationOptions:
    """Options for cross-device communication (``tf.distribute.experimental.CommunicationOptions``).

    Args:
      bytes_per_pack: pack small tensors into chunks of about this many bytes for
        ``batch_reduce_to``/``all_reduce``; 0 lets towerdist choose.
      timeout_seconds: bound on every collective, in seconds. As in TensorFlow, 0 or a
        negative number means no bound (TensorFlow's collective ops schedule their timeout
        only when it is positive): the collective waits for its peers however long they
        take, even when ``td.config.set_replica_timeouts`` sets a bound. None (the default)
        means the bound of ``td.config.set_replica_timeouts`` (none unless set); per-call
        options of None keep the strategy's. Only the MPI multi-worker path uses it; a peer
        that does not arrive in time raises ``td.errors.DeadlineExceededError``.
      implementation: a ``CommunicationImplementation`` or its name in any case.

    Raises:
      ValueError: ``bytes_per_pack`` is negative, ``implementation`` is not recognised or
        ``timeout_seconds`` is NaN.
      TypeError: ``timeout_seconds`` is not a number or None.
    """

    __slots__ = ("bytes_per_pack", "implementation", "timeout_seconds")

    def __init__(
        self,
        bytes_per_pack: int = 0,
        timeout_seconds: float | None = None,
        implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO,
    ) -> None:
        if not isinstance(bytes_per_pack, int) or isinstance(bytes_per_pack, bool) or bytes_per_pack < 0:
            raise ValueError(f"Argument `bytes_per_pack` must be >=0, Received {bytes_per_pack}.")
        if isinstance(implementation, str):
            try:
                implementation = CommunicationImplementation(implementation.upper())
            except ValueError:
                raise ValueError(
                    f"Argument `implementation` must be one of AUTO, RING, NCCL. "
                    f"Received implementation={implementation!r}."
                ) from None
        if not isinstance(implementation, CommunicationImplementation):
            raise ValueError(
                "Argument `implementation` must be instance of "
                "`tf.distribute.experimental.CommunicationImplementation`. "
                f"Received implementation={implementation!r}."
            )
        if timeout_seconds is not None:
            if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, numbers.Real):
                raise TypeError(
                    f"Argument `timeout_seconds` must be a number of seconds or None. Received "
                    f"timeout_seconds={timeout_seconds!r} of type {type(timeout_seconds).__name__}."
                )
            if math.isnan(timeout_seconds):
                raise ValueError(
                    "Argument `timeout_seconds` must be a number of seconds or None (0 or less: no bound). "
                    f"Received timeout_seconds={timeout_seconds!r}."
                )
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = implementation

    def merge(self, options: CommunicationOptions | None) -> CommunicationOptions:
        """A copy of these options with every non-default field of ``options`` overriding."""
        merged = CommunicationOptions(self.bytes_per_pack, self.timeout_seconds, self.implementation)
        if options is None:
            return merged
        if options.bytes_per_pack != 0:
            merged.bytes_per_pack = options.bytes_per_pack
        if options.timeout_seconds is not None:
            merged.timeout_seconds = options.timeout_seconds
        if options.implementation != CommunicationImplementation.AUTO:
            merged.implementation = options.implementation
        return merged

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommunicationOptions):
            return NotImplemented
        return (self.bytes_per_pack, self.timeout_seconds, self.implementation) == (
            other.bytes_per_pack,
            other.timeout_seconds,
            other.implementation,
        )

    def __hash__(self) -> int:
        return hash((self.bytes_per_pack, self.timeout_seconds, self.implementation))

    def __str__(self) -> str:
        # TensorFlow's exact layout, including the missing space after the first comma.
        return (
            f"Options(bytes_per_pack={self.bytes_per_pack},timeout_seconds={self.timeout_seconds}, "
            f"implementation={self.implementation})"
        )

    __repr__ = __str__


class CollectiveHints:
    """TF 2.2/2.3's hints for collectives: builds a ``CommunicationOptions`` (deprecated).

    ``CollectiveHints(bytes_per_pack, timeout_seconds)`` returns
    ``CommunicationOptions(bytes_per_pack=..., timeout_seconds=...)``, as TensorFlow does.
    """

    def __new__(cls, bytes_per_pack: int = 0, timeout_seconds: float | None = None) -> CommunicationOptions:  # type: ignore[misc]
        return CommunicationOptions(bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds)


class RunOptions(NamedTuple):
    """Options for ``Strategy.run``; TensorFlow uses them on TPUs only and so does ``run`` ignore them."""

    experimental_enable_dynamic_batch_size: bool = True
    experimental_bucketizing_dynamic_shape: bool = False
    experimental_xla_options: Any = None


class ValueContext:
    """What ``experimental_distribute_values_from_function`` tells ``value_fn`` about its replica.

    Example:
      >>> ctx = ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=4)
      >>> ctx.replica_id_in_sync_group / ctx.num_replicas_in_sync
      0.5
    """

    __slots__ = ("_num_replicas_in_sync", "_replica_id_in_sync_group")

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1) -> None:
        self._replica_id_in_sync_group = replica_id_in_sync_group
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> int:
        """The replica whose value is being made, ``0 .. num_replicas_in_sync - 1``."""
        return self._replica_id_in_sync_group

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas there are."""
        return self._num_replicas_in_sync

    def __str__(self) -> str:
        # TensorFlow prints two spaces before "total".
        return (
            f"tf.distribute.ValueContext(replica id {self._replica_id_in_sync_group},  "
            f"total replicas in sync: {self._num_replicas_in_sync})"
        )

    __repr__ = __str__
