"""``MultiWorkerMirroredStrategy``: synchronous data parallelism over several processes (MPI).

Launch one process per worker with ``mpiexec -n N python train.py``. Each process runs its
local devices as replicas, exactly as ``MirroredStrategy`` does; the collectives combine the
local replicas first and then the workers (``multi_worker.workers``), checked across the
workers before any result is used (``multi_worker.communicator``). Started without a launcher,
the program is one worker and behaves as ``MirroredStrategy`` over its local devices.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from towerdist._src import array_ops, backend, config, profiler
from towerdist._src import device as device_lib
from towerdist._src.backend.cupy_backend import nccl_unavailable_reason
from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver
from towerdist._src.cluster_resolver.mpi import resolve_for_mpi
from towerdist._src.cross_device_ops import sparse
from towerdist._src.cross_device_ops.gather import axis_index
from towerdist._src.cross_device_ops.placement import ResolvedDevices, mirror, validate_components
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import ValidationError
from towerdist._src.failures import API, name_api, unworded
from towerdist._src.indexed_slices import IndexedSlices, check_reducible, summed
from towerdist._src.input.distributed_dataset import InputWorker
from towerdist._src.multi_worker import gpu_assignment
from towerdist._src.multi_worker.nccl_workers import NCCL_DTYPES, NcclWorkers
from towerdist._src.multi_worker.workers import Workers
from towerdist._src.options import CommunicationImplementation, CommunicationOptions, ValueContext
from towerdist._src.reduce_op import ReduceOp
from towerdist._src.strategies.mirrored import MirroredExtended, _MirroredReplicaContext
from towerdist._src.strategies.replica_step import Step
from towerdist._src.strategies.strategy import Strategy
from towerdist._src.type_aliases import AxisLike, Destinations, DeviceLike, Nest, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, Mirrored
from towerdist._src.values.regroup import local_results, regroup
from towerdist._src.variables import creation
from towerdist._src.variables.variable import Variable

__all__ = ["ExperimentalMultiWorkerMirroredStrategy", "MultiWorkerMirroredStrategy"]


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous training on several workers (processes), each with its local devices.

    ``tf.distribute.MultiWorkerMirroredStrategy`` over MPI. Start one process per worker
    with an MPI launcher::

        mpiexec -n 2 python train.py

    Each worker runs one replica per local GPU, or one CPU replica (as TensorFlow), or one
    per logical CPU device configured before the strategy is created. Replica ids are global
    (``worker * local_replicas + local id``) and ``num_replicas_in_sync`` counts every
    worker's replicas; ``extended.worker_devices`` lists this worker's devices. Variables
    start from worker 0's values; ``all_reduce``, ``reduce``, ``gather``, variable writes
    and sync-on-read reads combine every worker's replicas. Worker 0 is the chief: it alone
    writes checkpoints (``extended.should_checkpoint``). Without a launcher the program is one
    worker.

    Every collective is checked across the workers before its data moves: different calls,
    shapes or dtypes raise ``InvalidArgumentError`` on every worker, and a worker that does
    not arrive within ``CommunicationOptions(timeout_seconds=...)`` makes the others raise
    ``DeadlineExceededError`` naming it. See the docs page "Training on several processes".

    Args:
      cluster_resolver: None (MPI says who the workers are: ``MPIClusterResolver``), or a
        cluster resolver (e.g. ``TFConfigClusterResolver``) that lists one worker per MPI rank
        and places this process at its rank; one with an empty cluster counts as None.
      communication_options: a ``td.distribute.experimental.CommunicationOptions``.

    Raises:
      ValueError: ``communication_options`` is not a ``CommunicationOptions``, or the cluster
        resolver disagrees with MPI.
      MissingDependencyError: started by an MPI launcher without mpi4py installed.
      RuntimeError: the launcher started several processes that each see an MPI job of one.
    """

    def __init__(
        self, cluster_resolver: ClusterResolver | None = None, communication_options: CommunicationOptions | None = None
    ) -> None:
        super().__init__(MultiWorkerExtended(self, None, cluster_resolver, communication_options))

    @classmethod
    def _from_local_devices(
        cls, devices: Sequence[DeviceLike], communication_options: CommunicationOptions | None = None
    ) -> MultiWorkerMirroredStrategy:
        """A strategy whose workers each run replicas on ``devices`` (TensorFlow's test hook)."""
        strategy = cls.__new__(cls)
        Strategy.__init__(strategy, MultiWorkerExtended(strategy, devices, None, communication_options))
        return strategy

    @property
    def cluster_resolver(self) -> ClusterResolver:
        """Who the workers are: by default ``task_type`` ``"worker"``, ``task_id`` (the rank), ``cluster_spec()``."""
        extended = self._extended
        assert isinstance(extended, MultiWorkerExtended)
        resolver: ClusterResolver = extended._cluster_resolver
        return resolver

    def _reduce_along_axis(self, op: ReduceOp, value: Nest, axis: AxisLike) -> TensorLike:
        # Computed as a SUM of per-replica sums (and, for MEAN, a count): the workers compare
        # the op the user asked for, so MEAN on one worker and SUM on another fail on both.
        extended = self._extended
        assert isinstance(extended, MultiWorkerExtended)
        with extended._comparing(op.value):
            return super()._reduce_along_axis(op, value, axis)


class MultiWorkerExtended(MirroredExtended):
    """``StrategyExtended`` of ``MultiWorkerMirroredStrategy``: local replicas, then the workers."""

    _between_graph = True

    def __init__(
        self,
        container_strategy: Strategy,
        devices: Sequence[DeviceLike] | None,
        cluster_resolver: ClusterResolver | None,
        communication_options: CommunicationOptions | None,
    ) -> None:
        if communication_options is None:
            communication_options = CommunicationOptions()
        if not isinstance(communication_options, CommunicationOptions):
            raise ValueError(
                "communication_options must be an instance of tf.distribute.experimental.CommunicationOptions. "
                f"Got communication_options={communication_options!r}; write "
                f"td.distribute.experimental.CommunicationOptions(...)."
            )
        self._options = communication_options
        self._workers = Workers(communication_options)
        self._cluster_resolver = resolve_for_mpi(cluster_resolver, self._workers.rank, self._workers.size)
        config.mark_initialized("MultiWorkerMirroredStrategy()")
        gpus = self._this_workers_gpus()  # collective over this host's workers: called whatever `devices` is
        super().__init__(container_strategy, gpus if devices is None else devices, None)
        self._mw_init_args = (devices, cluster_resolver, communication_options)
        # One CPU replica (the common worker without GPUs): a host result is its own placement.
        self._one_cpu = len(self._devices) == 1 and self._devices[0].device_type == "CPU"
        self._nccl: NcclWorkers | None = None
        self._compared = threading.local()  # the user's op when a reduce is computed as a SUM (see _comparing)
        if self._workers.size > 1:
            self._join_cluster()

    def _join_cluster(self) -> None:
        """Names this process's devices by its task in the job and learns every worker's (collective).

        As TensorFlow once a worker joins its cluster: variables, ``non_slot_devices`` and
        ``td.config.list_logical_devices()`` say ``/job:worker/replica:0/task:<rank>/...``.
        """
        cpus, gpus = config.logical_cpu_count(), len(config.local_devices("GPU"))
        # One handshake carries both counts: (CPUs << 16) | GPUs (both far below 2**16).
        packed = self._workers.agree_extra("MultiWorkerMirroredStrategy() (logical devices)", (cpus << 16) | gpus, None)
        config.join_cluster("worker", self._workers.rank, [(int(p) >> 16, int(p) & 0xFFFF) for p in packed])

    # --- who is where -------------------------------------------------------------------------

    def _this_workers_gpus(self) -> list[str] | None:
        """This worker's GPUs when there are several workers (``gpu_assignment.py``); None: the default devices.

        Collective over the workers of this host (bounded by the strategy's timeout): every
        one of them takes part, GPUs or not, devices passed explicitly or not.
        """
        communicator = self._workers.communicator
        if communicator is None:
            return None
        gpus = config.local_devices("GPU")

        def properties(index: int) -> Any:
            return backend.cupy_backend.xp.cuda.runtime.getDeviceProperties(index)

        names = gpu_assignment.visible_gpu_names(len(gpus), properties if gpus else None)
        everyone = communicator.local_allgather(names, *self._workers.bounds(None))
        if not gpus:
            return None
        return [gpus[index].short_name for index in gpu_assignment.assign_gpus(communicator.local_rank, everyone)]

    def _workers_on_this_host(self) -> int:
        # The ranks on this host share its cores (and its BLAS threads' budget).
        communicator = self._workers.communicator
        return 1 if communicator is None else communicator.local_size

    @property
    def _num_workers(self) -> int:
        return self._workers.size

    @property
    def _worker_index(self) -> int:
        return self._workers.rank

    @property
    def _num_replicas_in_sync(self) -> int:
        return len(self._devices) * self._workers.size

    @property
    def _first_replica_id(self) -> int:
        return self._workers.rank * len(self._devices)

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """This worker's replica devices, named as TensorFlow names them on worker ``rank``."""
        return tuple(self._worker_device_name(d) for d in self._devices)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """Where this worker keeps its copies of the variables (its replica devices)."""
        return self.worker_devices

    def _worker_device_name(self, device: DeviceSpec) -> str:
        return f"/job:worker/replica:0/task:{self._workers.rank}/device:{device.device_type}:{device.device_index}"

    @property
    def should_checkpoint(self) -> bool:
        """True on the chief (worker 0) only: it alone writes checkpoints."""
        return self._workers.rank == 0

    @property
    def should_save_summary(self) -> bool:
        """True on the chief (worker 0) only."""
        return self._workers.rank == 0

    def _non_slot_devices(self, var_list: list[Variable]) -> tuple[str, ...]:
        return tuple(d.name for d in self._devices)

    def _local_results(self, value: Nest) -> tuple[Any, ...]:
        return local_results(value, len(self._devices))

    def _describe(self) -> str:
        local = tuple(d.short_name for d in self._devices)
        return f"MultiWorkerMirroredStrategy(worker {self._workers.rank} of {self._workers.size}, devices={local!r})"

    def _deepcopy_strategy(self) -> Strategy:
        devices, cluster_resolver, options = self._mw_init_args
        if devices is not None:
            return MultiWorkerMirroredStrategy._from_local_devices(devices, options)
        return MultiWorkerMirroredStrategy(cluster_resolver, options)

    # --- replicas --------------------------------------------------------------------------------

    def _replica_context(self, strategy: Strategy, i: int, step: Step | None) -> _MirroredReplicaContext:
        return _MultiWorkerReplicaContext(strategy, i, step, self._devices[i], self._first_replica_id)

    def _distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Nest:
        n, first = self._num_replicas_in_sync, self._first_replica_id
        values = []
        for i, device in enumerate(self._devices):
            with device_lib.device(device):
                values.append(value_fn(ValueContext(first + i, n)))
        return regroup(values, self._devices, always_wrap=True)

    def _input_worker(self) -> InputWorker:
        workers = self._workers
        if workers.size == 1:
            return InputWorker(self._devices)
        return InputWorker(
            self._devices,
            workers.size,
            workers.rank,
            lambda has_data: workers.flags(has_data, "the distributed dataset's next step (which workers have data?)"),
            lambda state: workers.gather_bytes(state, "the distributed iterator's saved position (every worker's)"),
        )

    # --- collectives -----------------------------------------------------------------------------

    def _collective_seq(self) -> int:
        return self._workers.seq

    def _failed_before(self, seq: int, collective: str, error: BaseException) -> None:
        self._workers.failed_before(seq, collective, error)

    @contextlib.contextmanager
    def _comparing(self, op: str) -> Iterator[None]:
        """Makes this thread's reductions tell the other workers ``op`` (what the user asked for) as their op."""
        previous = getattr(self._compared, "op", None)
        self._compared.op = op
        try:
            yield
        finally:
            self._compared.op = previous

    # ``collective`` (see ``StrategyExtended._reduce_to``) is the name the workers compare and
    # their messages show: the public method the user called. A failure before the workers
    # meet is worded with it (``name_api``) before the other workers are told about it, so
    # they read the same message.

    def _reduce_to(
        self,
        reduce_op: ReduceOp,
        value: TensorLike,
        destinations: Destinations,
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> TensorLike:
        if self._workers.size == 1 or isinstance(value, Mirrored) or getattr(value, "_is_mirrored", False):
            # One worker: MirroredStrategy's reduction. A Mirrored value: MEAN is itself, SUM refused.
            return super()._reduce_to(reduce_op, value, destinations, options, collective=collective)
        seq = self._workers.seq
        try:
            devices = ResolvedDevices(self._destinations(destinations))
            column = self._column(value)
        except Exception as error:
            name_api(error, collective)
            self._workers.failed_before(seq, collective, error)  # the other workers raise too, not wait
            raise
        if isinstance(column[0], IndexedSlices):
            slices = self._reduce_sparse_columns(reduce_op, [list(column)], options, collective)[0]
            return sparse.mirror_slices(slices, devices)
        reduced = self._reduce_columns(reduce_op, [column], options, collective)[0]
        return self._collectives._broadcast_to(reduced, devices)

    def _batch_reduce_to(
        self, reduce_op: ReduceOp, pairs: list[tuple[TensorLike, Destinations]], options: CommunicationOptions | None
    ) -> list[Any]:
        if self._workers.size == 1:
            return super()._batch_reduce_to(reduce_op, pairs, options)
        collective = "StrategyExtended.batch_reduce_to()"  # its only caller
        results: list[Any] = [None] * len(pairs)
        columns, targets, where = [], [], []
        seq = self._workers.seq
        try:
            for k, (value, destinations) in enumerate(pairs):
                if isinstance(value, Mirrored) or getattr(value, "_is_mirrored", False):
                    results[k] = super()._reduce_to(reduce_op, value, destinations, options, collective=collective)
                    continue
                columns.append(self._column(value, f" (value {k})"))
                targets.append(ResolvedDevices(self._destinations(destinations)))
                where.append(k)
        except Exception as error:
            name_api(error, collective)
            self._workers.failed_before(seq, collective, error)  # the other workers raise too, not wait
            raise
        sparse_at = [j for j, column in enumerate(columns) if isinstance(column[0], IndexedSlices)]
        dense_at = [j for j in range(len(columns)) if j not in set(sparse_at)]
        if dense_at:
            reduced = self._reduce_columns(reduce_op, [columns[j] for j in dense_at], options, collective)
            for j, array in zip(dense_at, reduced):
                results[where[j]] = self._collectives._broadcast_to(array, targets[j])
        if sparse_at:
            merged = self._reduce_sparse_columns(reduce_op, [columns[j] for j in sparse_at], options, collective)
            for j, slices in zip(sparse_at, merged):
                results[where[j]] = sparse.mirror_slices(slices, targets[j])
        return results

    def _all_reduce(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        out: list[Any] | None = None,
        *,
        collective: str,
    ) -> list[list[Any]]:
        if self._workers.size == 1:
            return super()._all_reduce(reduce_op, columns, options, out, collective=collective)
        reduced = self._reduce_columns(reduce_op, columns, options, collective, out)
        return [self._place_everywhere(array) for array in reduced]

    def _reduce_columns(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        collective: str,
        out: list[Any] | None = None,
    ) -> list[np.ndarray]:
        """Each column (one array per local replica) reduced over every replica of every worker.

        The local replicas are summed first (in process), then the workers (one MPI
        ``Allreduce`` per pack); MEAN divides by ``num_replicas_in_sync``. The workers
        compare ``collective`` and ``reduce_op`` (not the sum it is computed with), so
        workers asking for different ops raise. New host arrays out (GPU arrays with NCCL),
        or ``out[k]`` (see ``CrossDeviceOps._all_reduce``).
        """
        op = getattr(self._compared, "op", None) or reduce_op.value
        seq = self._workers.seq
        try:
            if len(self._devices) > 1:
                local = super()._all_reduce(ReduceOp.SUM, columns, options, collective=collective)
                sums = [results[0] for results in local]
            else:
                sums = [column[0] for column in columns]
            if self._uses_nccl(sums, options):
                if self._nccl is None:  # collective: every worker gets here at the same collective
                    self._nccl = NcclWorkers(self._workers, self._devices[0].device_index)
                    seq = self._workers.seq  # what fails from here on fails before the sum's handshake
                totals = self._nccl_sum(self._nccl, sums, collective, options, op)
            else:
                totals = self._workers.sum([_to_host(s) for s in sums], collective, options, out, op)
        except Exception as error:
            self._workers.failed_before(seq, collective, error)  # failed before the workers met: they raise too
            raise
        if reduce_op is ReduceOp.MEAN:
            n = self._num_replicas_in_sync
            totals = [_mean(total, n) for total in totals]
        return totals

    def _all_reduce_sparse(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        *,
        collective: str,
    ) -> list[list[Any]]:
        if self._workers.size == 1:
            return super()._all_reduce_sparse(reduce_op, columns, options, collective=collective)
        reduced = self._reduce_sparse_columns(reduce_op, columns, options, collective)
        return [list(sparse.all_reduce_placed(slices, self._devices)) for slices in reduced]

    def _reduce_sparse_columns(
        self,
        reduce_op: ReduceOp,
        columns: list[list[Any]],
        options: CommunicationOptions | None,
        collective: str,
    ) -> list[IndexedSlices]:
        """Each column of ``IndexedSlices`` (one per local replica) reduced over every replica of every worker.

        The local replicas' rows are merged first (in process), then the workers exchange
        their distinct rows (``Workers.sparse_sum``); MEAN divides by
        ``num_replicas_in_sync``. Host results, canonical.
        """
        op = getattr(self._compared, "op", None) or reduce_op.value
        seq = self._workers.seq
        try:
            if len(self._devices) > 1:
                local = super()._all_reduce_sparse(ReduceOp.SUM, columns, options, collective=collective)
                sums = [sparse.to_device(results[0], None) for results in local]
            else:
                sums = [sparse.to_device(summed(column[0]), None) for column in columns]
        except Exception as error:
            self._workers.failed_before(seq, collective, error)  # failed before the workers met: they raise too
            raise
        totals = []
        for total in sums:
            shape = [None if d is None else int(d) for d in total.shape]
            with profiler.Span(f"sparse all-reduce across workers: {collective}") as span:
                indices, values, path = self._workers.sparse_sum(
                    total.indices, total.values, shape, collective, options, op
                )
                span.args = {"path": path, "rows_sent": int(total.indices.shape[0]), "rows_received": len(indices)}
            if reduce_op is ReduceOp.MEAN:
                values = _mean(values, self._num_replicas_in_sync)
            totals.append(IndexedSlices(values, indices, total.dense_shape))
        return totals

    def _uses_nccl(self, sums: list[Any], options: CommunicationOptions | None) -> bool:
        """Whether the workers sum with NCCL: GPU replicas only, NCCL usable, dtypes NCCL can sum."""
        if any(d.device_type != "GPU" for d in self._devices) or nccl_unavailable_reason() is not None:
            return False
        if self._options.merge(options).implementation is CommunicationImplementation.RING:
            return False
        return all(s.dtype.name in NCCL_DTYPES for s in sums)

    def _nccl_sum(
        self, nccl: NcclWorkers, sums: list[Any], collective: str, options: CommunicationOptions | None, op: str
    ) -> list[Any]:
        """The workers' sums of GPU arrays, on this worker's first GPU (NCCL; unverified without GPUs)."""
        device = self._devices[0]
        impl = backend.for_device(device)
        cupy = impl.xp
        results: list[Any] = [None] * len(sums)
        by_dtype: dict[str, list[int]] = {}
        for k, array in enumerate(sums):
            by_dtype.setdefault(array.dtype.name, []).append(k)
        packs = []
        with cupy.cuda.Device(device.device_index):
            for dtype, indices in by_dtype.items():
                buffer = cupy.empty(sum(int(sums[k].size) for k in indices), dtype)
                offset = 0
                for k in indices:
                    size = int(sums[k].size)
                    buffer[offset : offset + size] = impl.to_device(sums[k], device).reshape(-1)
                    results[k] = buffer[offset : offset + size].reshape(sums[k].shape)
                    offset += size
                packs.append(buffer)
        nccl.sum(packs, collective, *self._workers.bounds(options), op=op)
        return results

    def _column(self, value: TensorLike, which: str = "") -> list[Any]:
        """This worker's replicas' arrays of ``value`` (a plain value stands for every local replica); unworded.

        ``which`` tells the value apart in a batch (``" (value 3)"``), after the API's name.
        """
        if isinstance(value, DistributedValues):
            return validate_components(self._as_value(value, which), which)
        if isinstance(value, IndexedSlices):
            check_reducible([value], f"{API}{which}")
            return [value] * len(self._devices)
        array = array_ops.as_array(value)
        if array.dtype.kind not in "iufc":
            raise unworded(
                ValidationError(f"{API}{which} reduces numbers; got a value of dtype {array.dtype}: {value!r}.")
            )
        return [array] * len(self._devices)

    def _place_everywhere(self, array: np.ndarray) -> list[Any]:
        """``array`` on every local replica device (shared read-only on the host)."""
        if self._one_cpu and type(array) is np.ndarray:  # one CPU replica: the array itself (every training step)
            return [array]
        placed = mirror([array] * len(self._devices), self._devices)
        return list(placed.values) if isinstance(placed, DistributedValues) else [placed]

    def _gather_to(self, value: TensorLike, destinations: Destinations, axis: int, *, collective: str) -> TensorLike:
        if self._workers.size == 1:
            return super()._gather_to(value, destinations, axis, collective=collective)
        seq = self._workers.seq
        try:
            devices = ResolvedDevices(self._destinations(destinations))
            if isinstance(value, DistributedValues):
                host = ResolvedDevices((DeviceSpec(device_type="CPU", device_index=0),))
                local = super()._gather_to(value, host, axis, collective=collective)
            else:
                local = array_ops.as_array(value)
            local = _to_host(local)
            if local.ndim == 0:
                raise unworded(
                    ValidationError("cannot gather scalars: give each replica's value at least one dimension.")
                )
            axis = axis_index(axis, local.ndim)
        except Exception as error:
            name_api(error, collective)
            self._workers.failed_before(seq, collective, error)  # the other workers raise too, not wait
            raise
        gathered = self._workers.gather(local, axis, collective, None)
        return self._collectives._broadcast_to(gathered, devices)

    def _sum_counts(self, count: int, collective: str) -> int:
        if self._workers.size == 1:
            return count
        return int(sum(self._workers.agree_extra(f"{collective} (element count)", count, None)))

    def _first_replica_value(self, value: Nest, collective: str) -> TensorLike:
        first = super()._first_replica_value(value, collective)
        if self._workers.size == 1:
            return first
        seq = self._workers.seq
        try:
            array = _to_host(array_ops.as_array(first))
        except Exception as error:
            self._workers.failed_before(seq, collective, error)  # the other workers raise too, not wait
            raise
        return self._workers.broadcast([array], f"{collective} (global replica 0's value)", None)[0]

    # --- variables -------------------------------------------------------------------------------

    def _create_variable(self, spec: creation.VariableSpec) -> Any:
        if self._workers.size == 1:
            return super()._create_variable(spec)
        # Every worker computes its initial value; worker 0's is the one every worker keeps.
        seq = self._workers.seq
        try:
            array = _to_host(creation.materialize(spec, self._devices[0]))
        except Exception as error:  # e.g. the initializer failed on this worker only
            self._workers.failed_before(seq, "td.Variable() creation", error)
            raise
        (initial,) = self._workers.broadcast([array], "td.Variable() creation", None, detail=f"name={spec.name!r}")
        return super()._create_variable(spec._replace(initial_value=initial))


class _MultiWorkerReplicaContext(_MirroredReplicaContext):
    """A replica of one worker: ``replica_id_in_sync_group`` counts every worker's replicas."""

    def __init__(self, strategy: Strategy, replica_id: int, step: Step | None, device: DeviceSpec, first: int) -> None:
        super().__init__(strategy, replica_id, step, device)
        self._first = first

    @property
    def replica_id_in_sync_group(self) -> int | np.int32:
        """This replica's global id: ``worker * local replicas + local id``, as a numpy int32 scalar."""
        return np.int32(self._first + self._replica_id)


def _to_host(array: TensorLike) -> np.ndarray:
    """``array`` as a numpy array (GPU arrays are copied to the host)."""
    if type(array) is np.ndarray:
        return array
    host: np.ndarray = np.asarray(array) if backend.for_array(array) is backend.host() else np.asarray(array.get())
    return host


def _mean(total: TensorLike, n: int) -> TensorLike:
    """``total / n``: in place for floating point, float64 for integers (TensorFlow's integer mean).

    On ``total``'s own GPU, whichever GPU the thread running the collective has current.
    """
    impl = backend.for_array(total)
    xp = impl.xp
    with impl.on_array_device(total):
        if total.dtype.kind in "iu":
            return xp.true_divide(total, n)
        xp.true_divide(total, n, out=total, casting="unsafe")
        return total


class ExperimentalMultiWorkerMirroredStrategy(MultiWorkerMirroredStrategy):
    """``tf.distribute.experimental.MultiWorkerMirroredStrategy``: the TF 2.0-2.3 spelling.

    Takes ``communication`` (a ``CommunicationImplementation`` or its name) instead of
    ``communication_options``; otherwise it is ``MultiWorkerMirroredStrategy``.

    Raises:
      ValueError: ``communication`` is not a ``CommunicationImplementation`` or its name.
    """

    def __init__(
        self,
        communication: CommunicationImplementation | str = CommunicationImplementation.AUTO,
        cluster_resolver: ClusterResolver | None = None,
    ) -> None:
        super().__init__(cluster_resolver, CommunicationOptions(implementation=communication))
