"""``td.data.Options``: options carried by a dataset, and the auto-shard policy."""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "AUTOTUNE",
    "AutoShardPolicy",
    "DistributeOptions",
    "ExternalStatePolicy",
    "INFINITE",
    "Options",
    "SHARD_HINT",
    "UNKNOWN",
]

AUTOTUNE = -1
"""Let towerdist choose a buffer size or degree of parallelism (``tf.data.AUTOTUNE``)."""

INFINITE = -1
"""``cardinality()`` of a dataset that never ends (``tf.data.INFINITE_CARDINALITY``)."""

UNKNOWN = -2
"""``cardinality()`` that cannot be known without iterating (``tf.data.UNKNOWN_CARDINALITY``)."""

SHARD_HINT = -1
"""Placeholder for ``shard(SHARD_HINT, SHARD_HINT)``, filled in under ``AutoShardPolicy.HINT``."""


class AutoShardPolicy(enum.IntEnum):
    """How a dataset is split between workers (``tf.data.experimental.AutoShardPolicy``).

    * ``AUTO``: by file when the dataset reads files (and there are at least as many files
      as workers), otherwise by data.
    * ``FILE``: each worker reads its own subset of the files.
    * ``DATA``: each worker runs the whole pipeline and keeps its share of each global batch.
    * ``HINT``: only ``shard(SHARD_HINT, SHARD_HINT)`` calls are filled in.
    * ``OFF``: no sharding.

    As in TensorFlow, sharding by data splits each global batch into per-replica pieces on its
    own; every other outcome (FILE, also on one worker, HINT and OFF) re-cuts each worker's
    stream by the cycling rule of ``experimental_distribute_dataset``.
    """

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3


class ExternalStatePolicy(enum.IntEnum):
    """What saving an iterator does with state its pipeline keeps outside itself
    (``tf.data.experimental.ExternalStatePolicy``).

    A ``from_generator`` source or a foreign iterable (its position lives in Python, not in
    the pipeline) is such state. As in TensorFlow, where the option is unset a checkpoint
    applies ``FAIL``:

    * ``FAIL``: saving raises ``td.errors.FailedPreconditionError`` naming the operation.
    * ``WARN``: log a warning and save what can be saved.
    * ``IGNORE``: the same, without the warning.

    What can be saved: such a source before its first element or after its end (restored, it
    starts anew or stays ended, as the saved pass would have). In the middle of its pass it
    cannot be saved under any policy: saving raises ``td.errors.UnimplementedError``, as
    TensorFlow's ``GeneratorDataset`` does.
    """

    WARN = 0
    IGNORE = 1
    FAIL = 2


class DistributeOptions:
    """The ``experimental_distribute`` options of a dataset.

    Attributes:
      auto_shard_policy: an ``AutoShardPolicy`` (default ``AUTO``).
      num_devices: accepted for compatibility; unused.
    """

    def __init__(self) -> None:
        self._auto_shard_policy = AutoShardPolicy.AUTO
        self.num_devices: int | None = None

    @property
    def auto_shard_policy(self) -> AutoShardPolicy:
        """How a distributed dataset is sharded across workers (``AutoShardPolicy``; AUTO by default)."""
        return self._auto_shard_policy

    @auto_shard_policy.setter
    def auto_shard_policy(self, value: Any) -> None:
        try:
            self._auto_shard_policy = AutoShardPolicy(value)
        except ValueError:
            raise ValueError(
                f"auto_shard_policy must be a td.data.experimental.AutoShardPolicy "
                f"(OFF, AUTO, FILE, DATA, HINT). Got {value!r}."
            ) from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DistributeOptions):
            return NotImplemented
        return (self._auto_shard_policy, self.num_devices) == (other._auto_shard_policy, other.num_devices)

    def __repr__(self) -> str:
        return f"DistributeOptions(auto_shard_policy={self._auto_shard_policy!r})"


class Options:
    """Options for a dataset (``tf.data.Options``); attach them with ``dataset.with_options``.

    These change behaviour:

    * ``experimental_distribute.auto_shard_policy``: how a distributed dataset is split
      between workers (``AutoShardPolicy``).
    * ``experimental_external_state_policy``: what saving an iterator does with state the
      pipeline keeps outside itself (``ExternalStatePolicy``; unset means ``FAIL``).
    * ``experimental_symbolic_checkpoint``: as in TensorFlow, saving an iterator whose
      pipeline holds an operation that cannot be checkpointed symbolically (``cache``) raises
      ``td.errors.UnimplementedError``; the saved position is otherwise the same (it restores
      to the same continuation either way).

    The other attributes TensorFlow has are accepted and kept so that code setting them runs.

    Example:
      >>> options = td.data.Options()
      >>> options.experimental_distribute.auto_shard_policy = td.data.experimental.AutoShardPolicy.OFF
      >>> dataset = td.data.Dataset.range(8).batch(4).with_options(options)
    """

    def __init__(self) -> None:
        self.experimental_distribute = DistributeOptions()
        self.experimental_deterministic: bool | None = None
        self.deterministic: bool | None = None
        self.experimental_optimization: Any = None
        self.experimental_threading: Any = None
        self.threading: Any = None
        self._external_state_policy: ExternalStatePolicy | None = None
        self.experimental_symbolic_checkpoint: bool | None = None

    @property
    def experimental_external_state_policy(self) -> ExternalStatePolicy | None:
        """What saving an iterator does with state kept outside the pipeline (None: ``FAIL``, as in TensorFlow)."""
        return self._external_state_policy

    @experimental_external_state_policy.setter
    def experimental_external_state_policy(self, value: Any) -> None:
        if value is None:
            self._external_state_policy = None
            return
        try:
            self._external_state_policy = ExternalStatePolicy(value)
        except ValueError:
            raise ValueError(
                f"experimental_external_state_policy must be a td.data.experimental.ExternalStatePolicy (WARN, "
                f"IGNORE, FAIL). Got {value!r}."
            ) from None

    def merge(self, options: Options) -> Options:
        """New options: these, overridden by every non-default field of ``options``."""
        merged = Options()
        for source in (self, options):
            for name, value in vars(source).items():
                if name == "experimental_distribute":
                    if value.auto_shard_policy != AutoShardPolicy.AUTO:
                        merged.experimental_distribute.auto_shard_policy = value.auto_shard_policy
                    if value.num_devices is not None:
                        merged.experimental_distribute.num_devices = value.num_devices
                elif value is not None:
                    setattr(merged, name, value)
        return merged

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Options):
            return NotImplemented
        return vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"Options(experimental_distribute={self.experimental_distribute!r})"
