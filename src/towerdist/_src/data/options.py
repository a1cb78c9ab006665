"""``td.data.Options``: options carried by a dataset, and the auto-shard policy.

As in TensorFlow (``tf.data.Options``), every option is type-checked when set (a value of
another type is a ``TypeError``; ``None`` is never a value to set: an option is unset until
it is given one), an unknown option name is an ``AttributeError``, the option groups
(``experimental_distribute``, ``experimental_optimization``, ``threading``, ``autotune``,
``experimental_service``) are objects of their own for each ``Options``, and the options a
dataset reports (``dataset.options()``) are read-only.

Merging (``Options.merge``, and a dataset's options): an option set to its default value in
the later object leaves the earlier value; otherwise the later value wins, recursively
inside the option groups (``framework_type`` lists are joined). A dataset's options are those
of its inputs merged in order (``zip((a, b))``, ``a.concatenate(b)``: ``b``'s win), then its
own ``with_options``; the datasets an ``interleave``/``flat_map`` function makes do not
contribute.
"""

from __future__ import annotations

import copy
import difflib
import enum
import logging
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar, overload

__all__ = [
    "AUTOTUNE",
    "AutoShardPolicy",
    "AutotuneAlgorithm",
    "AutotuneOptions",
    "DistributeOptions",
    "ExternalStatePolicy",
    "INFINITE",
    "OptimizationOptions",
    "Options",
    "OptionsBase",
    "SHARD_HINT",
    "ServiceOptions",
    "ThreadingOptions",
    "UNKNOWN",
    "merge_options",
]

logger = logging.getLogger("towerdist")
T = TypeVar("T")

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


class AutotuneAlgorithm(enum.Enum):
    """The algorithm autotuning uses (``tf.data.experimental.AutotuneAlgorithm``); accepted, unused."""

    DEFAULT = 0
    HILL_CLIMB = 1
    GRADIENT_DESCENT = 2
    MAX_PARALLELISM = 3
    STAGE_BASED = 4


# --- the option machinery --------------------------------------------------------------------

_OptionsT = TypeVar("_OptionsT", bound="OptionsBase")


def _type_name(ty: type) -> str:
    return ty.__name__


class _Option(Generic[T]):
    """A type-checked option of an ``OptionsBase`` (TensorFlow's ``create_option``).

    Unset, it reads as ``default_factory()`` (None unless given), created on first read so
    that option groups are never shared between two ``Options``.
    """

    def __init__(self, ty: type, doc: str, default_factory: Callable[[], Any] | None = None) -> None:
        self.ty = ty
        self.__doc__ = doc
        self.default_factory = default_factory
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _Option[T]: ...
    @overload
    def __get__(self, obj: OptionsBase, objtype: type | None = None) -> T: ...
    def __get__(self, obj: OptionsBase | None, objtype: type | None = None) -> _Option[T] | T:
        if obj is None:
            return self
        values = obj._options
        if self.name not in values:
            made = None if self.default_factory is None else self.default_factory()
            if isinstance(made, OptionsBase) and not obj._mutable:
                made._set_mutable(False)
            values[self.name] = made
        value: T = values[self.name]
        return value

    def __set__(self, obj: OptionsBase, value: T) -> None:
        obj._require_mutable()
        if not isinstance(value, self.ty):
            raise TypeError(
                f'Property "{self.name}" of td.data.{type(obj).__name__} must be of type {_type_name(self.ty)}. '
                f"Got {self.name}={value!r} (type {type(value).__name__}){_fix(self.ty, value)}."
            )
        obj._options[self.name] = value


def _fix(ty: type, value: object) -> str:
    """How to give a value of type ``ty`` instead of ``value``, for the message of a bad one."""
    if value is None:
        return "; an option is unset until given a value: leave it, or use a new td.data.Options()"
    if isinstance(ty, type) and issubclass(ty, enum.Enum):
        named = [member for member in ty if member.value == value] if isinstance(value, int) else []
        if named:
            return f"; pass td.data.experimental.{ty.__name__}.{named[0].name}"
        return f"; pass one of td.data.experimental.{ty.__name__}: {', '.join(m.name for m in ty)}"
    return ""


class _Alias:
    """A deprecated name of another option (``experimental_deterministic`` -> ``deterministic``)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.__doc__ = f"DEPRECATED: the same option as ``{target}``."

    # Any: the value of the option this alias names, whose type depends on that name.
    def __get__(self, obj: OptionsBase | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj, self.target)

    def __set__(self, obj: OptionsBase, value: object) -> None:
        setattr(obj, self.target, value)


class OptionsBase:
    """A set of options (``tf.data`` ``OptionsBase``): type-checked, compared by value, merged by ``merge_options``."""

    _options: dict[str, Any]
    _mutable: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_options", {})
        object.__setattr__(self, "_mutable", True)

    @classmethod
    def _option_names(cls) -> list[str]:
        return sorted(
            name for klass in cls.__mro__ for name, value in vars(klass).items() if isinstance(value, _Option)
        )

    def __setattr__(self, name: str, value: object) -> None:
        self._require_mutable()
        if not isinstance(getattr(type(self), name, None), (_Option, _Alias)):
            names = self._option_names()
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise AttributeError(
                f"Cannot set the property {name} on {type(self).__name__}: td.data.{type(self).__name__} has no "
                f"option {name!r}; {hint}its options are {', '.join(names)}."
            )
        object.__setattr__(self, name, value)

    def _require_mutable(self) -> None:
        if not self._mutable:
            raise ValueError(
                "Mutating `td.data.Options()` returned by `td.data.Dataset.options()` has no effect. Use "
                "`td.data.Dataset.with_options(options)` to set or update dataset options."
            )

    def _set_mutable(self, mutable: bool) -> None:
        object.__setattr__(self, "_mutable", mutable)
        for value in self._options.values():
            if isinstance(value, OptionsBase):
                value._set_mutable(mutable)

    def _copy(self) -> Self:
        """A deep, mutable copy."""
        made = copy.deepcopy(self)
        made._set_mutable(True)
        return made

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, self.__class__):
            return NotImplemented
        names = set(self._options) | set(other._options)
        return all(getattr(self, name) == getattr(other, name) for name in names)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        # The options set to something other than their default, as TF's proto text would show.
        default = type(self)()
        shown = []
        for name in self._option_names():
            if name in self._options and getattr(self, name) != getattr(default, name):
                shown.append(f"{name}={getattr(self, name)!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


def merge_options(*options_list: _OptionsT) -> _OptionsT:
    """New options: ``options_list`` merged in order (TensorFlow's ``merge_options``).

    An option at its default value in a later object leaves the value so far; otherwise the
    later value wins (logged when it changes one), option groups are merged recursively, and
    ``framework_type`` lists are joined.

    Raises:
      TypeError: the objects are not all of the first one's type, a subclass of ``OptionsBase``.
    """
    if not options_list:
        raise ValueError("merge_options() takes at least one options object.")
    result_type = type(options_list[0])
    for options in options_list:
        if not isinstance(options, result_type):
            raise TypeError(
                f"Could not merge incompatible options of type {type(options)} and {result_type}. Got "
                f"options={options!r}; pass a td.data.{result_type.__name__}."
            )
    if not isinstance(options_list[0], OptionsBase):
        raise TypeError(
            f"All options to be merged should inherit from `OptionsBase` but found option of type {result_type} "
            f"which does not."
        )
    default = result_type()
    result = result_type()
    for options in options_list:
        for name in list(options._options):
            this, that, unset = getattr(result, name), getattr(options, name), getattr(default, name)
            if that == unset:
                continue
            if this == unset:
                setattr(result, name, copy.deepcopy(that) if isinstance(that, (OptionsBase, list)) else that)
            elif isinstance(this, OptionsBase):
                setattr(result, name, merge_options(this, that))
            elif name == "framework_type":
                setattr(result, name, this + that)
            elif this != that:
                logger.warning("Changing the value of option %s from %r to %r.", name, this, that)
                setattr(result, name, that)
    result._set_mutable(True)
    return result


# --- the option groups -----------------------------------------------------------------------


class AutotuneOptions(OptionsBase):
    """Autotuning options (``tf.data.experimental.AutotuneOptions``); accepted and kept, unused by towerdist."""

    enabled: _Option[bool | None] = _Option(bool, "Whether to tune performance knobs (None: True).")
    cpu_budget: _Option[int | None] = _Option(int, "The CPU budget of autotuning (None: the schedulable cores).")
    ram_budget: _Option[int | None] = _Option(int, "The RAM budget of autotuning in bytes (None: half the RAM).")
    autotune_algorithm: _Option[AutotuneAlgorithm | None] = _Option(AutotuneAlgorithm, "The autotuning algorithm.")
    initial_parallelism: _Option[int | None] = _Option(int, "The parallelism before autotuning runs (None: 16).")
    min_parallelism: _Option[int | None] = _Option(int, "The least parallelism of AUTOTUNE map/batch.")


class DistributeOptions(OptionsBase):
    """The ``experimental_distribute`` options of a dataset (``tf.data.experimental.DistributeOptions``).

    Attributes:
      auto_shard_policy: an ``AutoShardPolicy`` (default ``AUTO``): how a distributed dataset
        is sharded across workers.
      num_devices: accepted for compatibility; unused.
    """

    auto_shard_policy: _Option[AutoShardPolicy] = _Option(
        AutoShardPolicy,
        "How a distributed dataset is sharded across workers (``AutoShardPolicy``; AUTO by default).",
        lambda: AutoShardPolicy.AUTO,
    )
    num_devices: _Option[int | None] = _Option(int, "The number of devices of the pipeline; unused.")


class OptimizationOptions(OptionsBase):
    """Graph optimizations (``tf.data.experimental.OptimizationOptions``); accepted and kept.

    towerdist runs the pipeline as written: there is no graph to rewrite, so these change
    nothing.
    """

    apply_default_optimizations: _Option[bool | None] = _Option(bool, "Whether to apply the default optimizations.")
    filter_fusion: _Option[bool | None] = _Option(bool, "Whether to fuse filter transformations.")
    filter_parallelization: _Option[bool | None] = _Option(bool, "Whether to parallelize filter.")
    inject_prefetch: _Option[bool | None] = _Option(bool, "Whether to add a prefetch after the last transformation.")
    seq_interleave_prefetch: _Option[bool | None] = _Option(bool, "Whether to prefetch in sequential interleaves.")
    map_and_batch_fusion: _Option[bool | None] = _Option(bool, "Whether to fuse map and batch.")
    map_and_filter_fusion: _Option[bool | None] = _Option(bool, "Whether to fuse map and filter.")
    map_fusion: _Option[bool | None] = _Option(bool, "Whether to fuse map transformations.")
    map_parallelization: _Option[bool | None] = _Option(bool, "Whether to parallelize stateless maps.")
    noop_elimination: _Option[bool | None] = _Option(bool, "Whether to remove no-op transformations.")
    parallel_batch: _Option[bool | None] = _Option(bool, "Whether to batch in parallel.")
    shuffle_and_repeat_fusion: _Option[bool | None] = _Option(bool, "Whether to fuse shuffle and repeat.")


class ServiceOptions(OptionsBase):
    """tf.data service options (``tf.data.experimental.ServiceOptions``); accepted and kept, unused."""

    pinned: _Option[bool | None] = _Option(bool, "Whether the service client allocates pinned memory.")


class ThreadingOptions(OptionsBase):
    """Threading options (``tf.data.ThreadingOptions``); accepted and kept, unused by towerdist."""

    max_intra_op_parallelism: _Option[int | None] = _Option(int, "The maximum degree of intra-op parallelism.")
    private_threadpool_size: _Option[int | None] = _Option(int, "The size of a private thread pool.")


class Options(OptionsBase):
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

    The other options TensorFlow has are accepted, type-checked and kept (and merged) so that
    code setting them runs. ``experimental_deterministic`` and ``experimental_threading`` are
    TensorFlow's deprecated names of ``deterministic`` and ``threading``. The module docstring
    gives the merging rules.

    Raises (when setting an option):
      TypeError: a value of another type than the option's (``None`` included).
      AttributeError: an option name ``td.data.Options`` does not have.
      ValueError: the options are those a dataset reports (``dataset.options()``), read-only.

    Example:
      >>> options = td.data.Options()
      >>> options.experimental_distribute.auto_shard_policy = td.data.experimental.AutoShardPolicy.OFF
      >>> options.deterministic = False
      >>> dataset = td.data.Dataset.range(8).batch(4).with_options(options)
      >>> dataset.options().experimental_deterministic
      False
    """

    autotune: _Option[AutotuneOptions] = _Option(AutotuneOptions, "The autotuning options.", AutotuneOptions)
    deterministic: _Option[bool | None] = _Option(
        bool, "Whether the outputs must come in a deterministic order (None: True)."
    )
    experimental_deterministic = _Alias("deterministic")
    experimental_distribute: _Option[DistributeOptions] = _Option(
        DistributeOptions, "The distribution options (``DistributeOptions``).", DistributeOptions
    )
    experimental_external_state_policy: _Option[ExternalStatePolicy | None] = _Option(
        ExternalStatePolicy,
        "What saving an iterator does with state kept outside the pipeline (None: ``FAIL``, as in TensorFlow).",
    )
    experimental_optimization: _Option[OptimizationOptions] = _Option(
        OptimizationOptions, "The optimization options (``OptimizationOptions``).", OptimizationOptions
    )
    experimental_slack: _Option[bool | None] = _Option(bool, "Whether to add slack to the last prefetch; unused.")
    experimental_symbolic_checkpoint: _Option[bool | None] = _Option(
        bool, "Whether iterator checkpoints are symbolic (refused for ``cache``, as in TensorFlow)."
    )
    experimental_service: _Option[ServiceOptions] = _Option(
        ServiceOptions, "The tf.data service options; unused.", ServiceOptions
    )
    experimental_threading = _Alias("threading")
    experimental_warm_start: _Option[bool | None] = _Option(bool, "Whether to start background threads early; unused.")
    dataset_name: _Option[str | None] = _Option(str, "A name for the dataset, for debugging.")
    framework_type: _Option[list[str] | None] = _Option(
        list, "The frameworks that made the pipeline (joined by merge)."
    )
    threading: _Option[ThreadingOptions] = _Option(ThreadingOptions, "The threading options.", ThreadingOptions)

    def merge(self, options: Options) -> Options:
        """New options: these merged with ``options`` (its non-default values win; see ``merge_options``).

        Raises:
          TypeError: ``options`` is not a ``td.data.Options``.
        """
        merged: Options = merge_options(self, options)
        return merged
