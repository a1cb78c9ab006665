"""What one package asks of another: the seams between towerdist's packages, as typed protocols.

A leading underscore means "this package only", with one exception: the members a protocol
of this module names. Those are what a package may use of another package's objects, and
nothing else (``tests/project/test_private_reads.py`` checks it). They keep their underscore
because the objects are the user's too: a ``td.Variable``, a ``StrategyExtended``, a
``ReplicaContext``, a ``Dataset`` show TensorFlow's public API, and TensorFlow reserves the
names without one (several of these are TensorFlow's own extension points, which a user's
TF-style subclass overrides: ``_reduce_to``, ``_call_for_each_replica``, ``_create_variable``).

Each protocol says who implements it and who uses it. A value typed ``TensorLike`` or ``Nest``
here is an array, a distributed value, or a nest of them, of the user's (``type_aliases``).

See ``docs/contributing.md`` ("Seams").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from towerdist._src.reduce_op import ReduceOp
from towerdist._src.type_aliases import Destinations, MergeFn, Nest, ReplicaFn, TensorLike

if TYPE_CHECKING:  # the implementations sit above this layer: only their types are named here
    import numpy as np

    from towerdist._src.cross_device_ops.base import CrossDeviceOps
    from towerdist._src.data.cursor import Cursor, Saved
    from towerdist._src.data.dataset import Dataset
    from towerdist._src.data.optional import Optional
    from towerdist._src.device import DeviceSpec
    from towerdist._src.options import CommunicationOptions
    from towerdist._src.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy
    from towerdist._src.strategies.replica_context import ReplicaContext
    from towerdist._src.strategies.strategy import Strategy
    from towerdist._src.variables.creation import VariableSpec
    from towerdist._src.variables.variable import ResourceVariable, Variable, WriteOp

__all__ = [
    "CheckpointSeam",
    "CollectivesSeam",
    "DatasetSeam",
    "DefaultStrategySeam",
    "DistributedValuesSeam",
    "DistributedVariableSeam",
    "IndexedSlicesSeam",
    "MirroredSeam",
    "MultiWorkerSeam",
    "OptimizerSlotsSeam",
    "OptionalSeam",
    "PerReplicaSeam",
    "ReplicaSeam",
    "ShardSeam",
    "StorageSeam",
    "StrategySeam",
    "WordedErrorSeam",
]

_Payload = TypeVar("_Payload")  # what one replica brings to an internal collective
_Part = TypeVar("_Part")  # what it gets back


class StrategySeam(Protocol):
    """What variables, optimizers, checkpoints and the TF 1.x dialect ask of ``strategy.extended``.

    Implemented by ``StrategyExtended`` (``strategies/``) and its subclasses.
    """

    @property
    def _replica_devices(self) -> tuple[DeviceSpec, ...]:
        """This worker's replicas' devices, in replica order."""

    @property
    def _num_workers(self) -> int:
        """The processes of the job (MultiWorkerMirroredStrategy; 1 otherwise)."""

    @property
    def _worker_index(self) -> int:
        """This process's index among them."""

    def _create_variable(self, spec: VariableSpec) -> Variable:
        """Creates the variable ``spec`` describes in cross-replica context (TF's hook)."""

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: TensorLike,
        destinations: Destinations,
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> TensorLike:
        """``reduce_to`` without its checks (TF's hook); ``collective`` names it to the other workers."""

    def _reduce(self, reduce_op: ReduceOp, value: TensorLike) -> TensorLike:
        """The element-wise reduction of ``value`` across replicas onto the current device."""

    def _gather_to(self, value: TensorLike, destinations: Destinations, axis: int, *, collective: str) -> TensorLike:
        """Concatenates the replicas' components along ``axis`` onto ``destinations``."""

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: list[list[TensorLike]],
        options: CommunicationOptions | None,
        out: list[TensorLike] | None = None,
        *,
        collective: str,
    ) -> list[list[TensorLike]]:
        """All-reduces checked values: ``columns[k][r]`` is value ``k`` of replica ``r``."""

    def _all_reduce_sparse(
        self,
        reduce_op: ReduceOp,
        columns: list[list[TensorLike]],
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> list[list[TensorLike]]:
        """All-reduces checked ``IndexedSlices``, as ``_all_reduce`` does arrays."""

    def _sums_host_arrays_in_order(self) -> bool:
        """Whether ``_all_reduce(SUM)`` of small host arrays is their plain sum in replica order."""

    def _first_replica_value(self, value: Nest, collective: str) -> Nest:
        """``value`` as the first replica of the job has it (broadcast from worker 0's)."""


class MirroredSeam(StrategySeam, Protocol):
    """What the TF 1.x dialect and variables ask of a mirrored strategy's ``extended`` (``MirroredExtended``)."""

    @property
    def _cross_device_ops(self) -> CrossDeviceOps:
        """The ``CrossDeviceOps`` the strategy reduces with."""

    def _call_for_each_replica(
        self, fn: ReplicaFn, args: tuple[Any, ...], kwargs: dict[str, Any], sequential: bool | None = None
    ) -> Nest:
        """Runs ``fn`` once per replica (TF's hook); ``sequential``: one replica at a time (TF 1.x), None: the default."""


class DefaultStrategySeam(Protocol):
    """What the context queries ask of the default strategy's ``extended`` (``strategies/default.py``)."""

    @property
    def _default_replica_context(self) -> ReplicaContext:
        """The replica context outside any strategy scope."""


class MultiWorkerSeam(Protocol):
    """What the ``towerdist`` command asks of ``MultiWorkerMirroredStrategy`` (the class)."""

    def _from_local_devices(self, devices: Sequence[str]) -> MultiWorkerMirroredStrategy:
        """A strategy over ``devices`` of this process, without a cluster resolver."""


class ReplicaSeam(Protocol):
    """What variables, optimizers, the context queries and the TF 1.x dialect ask of a ``ReplicaContext``.

    Implemented by ``ReplicaContext`` (``strategies/replica_context.py``) and its subclasses.
    """

    @property
    def _replica_id(self) -> int | np.integer[Any]:
        """This replica's id in its sync group (an int, or a numpy integer)."""

    @property
    def _device(self) -> DeviceSpec | None:
        """The device this replica runs on (None: the default strategy's)."""

    def _merge_call(
        self, merge_fn: MergeFn, args: tuple[Any, ...], kwargs: dict[str, Any], api: str
    ) -> Nest:
        """``merge_call`` named ``api`` in its errors."""

    def _collective(
        self,
        fn: Callable[[Any, list[_Payload]], list[_Part]],
        payload: _Payload,
        api: str,
        snapshot: Callable[[Any, int], tuple[Any, Any]] | None = None,
    ) -> _Part:
        """Meets the other replicas; ``fn(strategy, payloads)`` gives each replica its part (see ``round_requests``)."""


class CollectivesSeam(Protocol):
    """What a mirrored strategy asks of its collectives (``cross_device_ops/collectives.py``)."""

    @property
    def _all_reduces_batches(self) -> bool:
        """Whether a batch reduction goes through the all-reduce (a user's ops without its own ``batch_reduce``)."""


class DistributedValuesSeam(Protocol):
    """What strategies, collectives and variables ask of a ``DistributedValues`` (``values/``)."""

    @property
    def _devices(self) -> tuple[DeviceSpec, ...] | None:
        """The components' devices, in replica order (None: not placed)."""

    _is_distributed_variable: bool

    def _get(self) -> TensorLike:
        """The component of the current replica (or the primary in cross-replica context)."""


class PerReplicaSeam(DistributedValuesSeam, Protocol):
    """What variables and array helpers ask of a ``PerReplica``."""

    def _local(self) -> TensorLike:
        """The component of the current replica; raises outside a replica context."""


class StorageSeam(Protocol):
    """What an optimizer's update and a checkpoint's restore ask of a single-device variable.

    Implemented by ``ResourceVariable`` (``variables/variable.py``): its value is ``_array``,
    a read-only array replaced (never written into) by a write.
    """

    @property
    def _array(self) -> TensorLike:
        """The current value (a read-only numpy array on the host, a device array on a GPU)."""

    @property
    def _impl(self) -> ModuleType:
        """The array backend of the variable's device (``backend.for_device``)."""

    @property
    def _device(self) -> DeviceSpec:
        """The variable's device."""

    def _adopt(self, array: TensorLike) -> None:
        """Makes ``array`` (of the variable's shape, dtype and device) its value, under its lock."""

    def _adopt_moved(self, array: TensorLike) -> None:
        """As ``_adopt``, for an array that may have to move to the variable's device first."""

    def _share(self, array: TensorLike, replacing: TensorLike) -> bool:
        """Holds ``array`` instead of ``replacing`` (a view of the same memory) unless written meanwhile; whether it did."""

    def _write(self, op: WriteOp, value: TensorLike, read_value: bool) -> Any:
        """One write of the write protocol (``op``: ``"assign"``, ``"assign_add"``, ...)."""


class DistributedVariableSeam(Protocol):
    """What optimizers, strategies, checkpoints and array helpers ask of a distributed variable."""

    @property
    def _components(self) -> tuple[ResourceVariable, ...]:
        """The single-device variables it is made of, in replica order."""

    @property
    def _distribute_strategy(self) -> Strategy:
        """The strategy it was created under."""

    def _read_cross_replica(self) -> TensorLike:
        """Its value as read in cross-replica context (aggregated for a sync-on-read variable)."""

    def _write_cross_replica(self, op: WriteOp, value: TensorLike, read_value: bool) -> Any:
        """One write in cross-replica context, to every component."""

    def _towerdist_value(self) -> TensorLike:
        """Its value in the current context (what converting it to an array gives; a plain variable's too)."""


class IndexedSlicesSeam(Protocol):
    """What array helpers (``array_ops.as_array``) ask of an ``IndexedSlices``: its dense value."""

    def _towerdist_dense(self) -> TensorLike:
        """The dense array it stands for, as TensorFlow converts an ``IndexedSlices``."""


class OptimizerSlotsSeam(Protocol):
    """What checkpoints ask of an optimizer: its slots, and those restored before they exist."""

    _slots: dict[Any, dict[str, Any]]
    _deferred_slots: dict[Any, Any]


class CheckpointSeam(Protocol):
    """What the preemption handler asks of a ``Checkpoint``: to track a variable of its own."""

    def _track(self, name: str, value: object) -> None:
        """Tracks ``value`` under ``name``, as a keyword argument of the constructor would."""

    def _tracked(self, name: str) -> Any:
        """The object tracked under ``name``, or None."""


class DatasetSeam(Protocol):
    """What input distribution (``input/``) asks of a dataset (``data/``): its graph and its positions.

    Implemented by ``Dataset`` and its operations.
    """

    @property
    def _inputs(self) -> tuple[Dataset, ...]:
        """The datasets this one reads (none for a source)."""

    def _clone(self, inputs: tuple[Dataset, ...]) -> Dataset:
        """This operation over other ``inputs``."""

    def _reads_files(self) -> bool:
        """Whether it reads files (a file-based source, which auto-sharding shards by file)."""

    def _cardinality(self) -> int:
        """Its number of elements, or ``INFINITE``/``UNKNOWN``."""

    def _cursor(self, saved: Saved | None = None, may_continue: bool = False) -> Cursor:
        """An iterator with a position that can be saved (restored from ``saved``)."""

    def _batch_rows(self) -> tuple[int | None, str | None]:
        """The rows of its batches (None: not known) and why they are not known (for splitting batches)."""


class ShardSeam(DatasetSeam, Protocol):
    """What auto-sharding asks of a ``Dataset.shard`` (``ShardDataset``)."""

    _is_hint: bool  # an auto-shard hint, not a shard the user asked for


class OptionalSeam(Protocol):
    """What distributed iterators ask of ``Optional`` (``data/optional.py``): values made when read."""

    def _deferred(self, value: Nest, make_spec: Callable[[], Any]) -> Optional:
        """An ``Optional`` holding ``value`` whose element spec ``make_spec()`` gives when first read."""

    def _deferred_empty(self, make_spec: Callable[[], Any]) -> Optional:
        """An empty ``Optional`` whose element spec ``make_spec()`` gives when first read."""


class WordedErrorSeam(Protocol):
    """What error wording (``failures.py``) asks of TensorFlow's error classes (``errors.py``)."""

    _message: str


if TYPE_CHECKING:  # mypy proves that each implementation implements its seams (this never runs)
    from towerdist._src.checkpoint.checkpoint import Checkpoint
    from towerdist._src.cross_device_ops.collectives import UserOps
    from towerdist._src.data.transforms import ShardDataset
    from towerdist._src.errors import OpError
    from towerdist._src.indexed_slices import IndexedSlices
    from towerdist._src.optimizers.optimizer import Optimizer
    from towerdist._src.strategies.default import DefaultExtended
    from towerdist._src.strategies.mirrored import MirroredExtended
    from towerdist._src.strategies.strategy_extended import StrategyExtended
    from towerdist._src.values.distributed_values import DistributedValues, PerReplica
    from towerdist._src.variables.distributed_variable import DistributedVariable

    def implementations(
        extended: StrategyExtended,
        mirrored: MirroredExtended,
        default: DefaultExtended,
        multi_worker: type[MultiWorkerMirroredStrategy],
        replica: ReplicaContext,
        collectives: UserOps,
        values: DistributedValues[object],
        per_replica: PerReplica[object],
        storage: ResourceVariable,
        variable: DistributedVariable,
        slices: IndexedSlices,
        optimizer: Optimizer,
        checkpoint: Checkpoint,
        dataset: Dataset,
        shard: ShardDataset,
        optional: type[Optional],
        error: OpError,
    ) -> tuple[
        StrategySeam, MirroredSeam, DefaultStrategySeam, MultiWorkerSeam, ReplicaSeam, CollectivesSeam,
        DistributedValuesSeam, PerReplicaSeam, StorageSeam, DistributedVariableSeam, IndexedSlicesSeam,
        OptimizerSlotsSeam, CheckpointSeam, DatasetSeam, ShardSeam, OptionalSeam, WordedErrorSeam,
    ]:
        return (
            extended, mirrored, default, multi_worker, replica, collectives, values, per_replica, storage, variable,
            slices, optimizer, checkpoint, dataset, shard, optional, error,
        )
