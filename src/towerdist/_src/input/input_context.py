"""``InputContext``, ``InputOptions`` and ``InputReplicationMode``: what input functions are told."""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

__all__ = ["InputContext", "InputOptions", "InputReplicationMode"]


class InputReplicationMode(enum.Enum):
    """How ``distribute_datasets_from_function`` calls its function (``tf.distribute.InputReplicationMode``).

    * ``PER_WORKER``: once per worker; the worker's replicas take consecutive elements.
    * ``PER_REPLICA``: once per replica; each replica iterates its own dataset.
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


class InputContext:
    """What ``dataset_fn`` is told about the input pipeline it builds (``tf.distribute.InputContext``).

    Example:
      >>> def dataset_fn(ctx):
      ...     batch = ctx.get_per_replica_batch_size(64)
      ...     ds = td.data.Dataset.range(1000).batch(batch)
      ...     return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    """

    __slots__ = ("_input_pipeline_id", "_num_input_pipelines", "_num_replicas_in_sync")

    def __init__(self, num_input_pipelines: int = 1, input_pipeline_id: int = 0, num_replicas_in_sync: int = 1) -> None:
        self._num_input_pipelines = num_input_pipelines
        self._input_pipeline_id = input_pipeline_id
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        """How many input pipelines (workers, or replicas with ``PER_REPLICA``) there are."""
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        """This pipeline's index in ``[0, num_input_pipelines)``."""
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas take part in each step."""
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size // num_replicas_in_sync``.

        Raises:
          ValueError: ``global_batch_size`` is not divisible by ``num_replicas_in_sync``.
        """
        if global_batch_size % self._num_replicas_in_sync != 0:
            raise ValueError(
                f"The `global_batch_size` {global_batch_size!r} is not divisible by `num_replicas_in_sync` "
                f"{self._num_replicas_in_sync!r}; choose a global batch size that is a multiple of "
                f"{self._num_replicas_in_sync}."
            )
        return global_batch_size // self._num_replicas_in_sync

    def __str__(self) -> str:
        return f"tf.distribute.InputContext(input pipeline id {self._input_pipeline_id}, total: {self._num_input_pipelines})"

    __repr__ = __str__


class _InputOptionsFields(NamedTuple):
    experimental_fetch_to_device: bool
    experimental_replication_mode: InputReplicationMode
    experimental_place_dataset_on_device: bool
    experimental_per_replica_buffer_size: int


class InputOptions(_InputOptionsFields):
    """How a distributed dataset is fed to the replicas (``tf.distribute.InputOptions``).

    Attributes:
      experimental_fetch_to_device: place each replica's piece on its replica's device
        (default True; free on CPU devices). False keeps pieces in host memory.
      experimental_replication_mode: ``InputReplicationMode.PER_WORKER`` (default) or
        ``PER_REPLICA`` (``distribute_datasets_from_function`` only).
      experimental_place_dataset_on_device: build the dataset on the replica's device;
        needs ``PER_REPLICA`` and ``experimental_fetch_to_device=False``.
      experimental_per_replica_buffer_size: how many steps the iterator prepares ahead
        (placed on the devices); 0 disables it.

    Raises:
      TypeError, ValueError: a field has the wrong type or a negative buffer size.
    """

    __slots__ = ()

    def __new__(
        cls,
        experimental_fetch_to_device: bool | None = None,
        experimental_replication_mode: InputReplicationMode | str = InputReplicationMode.PER_WORKER,
        experimental_place_dataset_on_device: bool = False,
        experimental_per_replica_buffer_size: int = 1,
    ) -> InputOptions:
        fetch = True if experimental_fetch_to_device is None else experimental_fetch_to_device
        _check_bool(fetch, "experimental_fetch_to_device")
        _check_bool(experimental_place_dataset_on_device, "experimental_place_dataset_on_device")
        mode = _replication_mode(experimental_replication_mode)
        size = experimental_per_replica_buffer_size
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(
                f"InputOptions.experimental_per_replica_buffer_size must be an integer >= 0. Got {size!r}."
            )
        return super().__new__(cls, bool(fetch), mode, bool(experimental_place_dataset_on_device), int(size))


def _check_bool(value: object, name: str) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"InputOptions.{name} must be a bool. Got {name}={value!r}.")


def _replication_mode(value: object) -> InputReplicationMode:
    if isinstance(value, InputReplicationMode):
        return value
    if isinstance(value, str) and value.upper() in InputReplicationMode.__members__:
        return InputReplicationMode[value.upper()]
    raise ValueError(
        f"InputOptions.experimental_replication_mode must be a td.distribute.InputReplicationMode "
        f"(PER_WORKER or PER_REPLICA). Got {value!r}."
    )
