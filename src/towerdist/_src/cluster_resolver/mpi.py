"""``MPIClusterResolver``: the cluster of an MPI job, and the check of a given resolver against it.

Under MPI the launcher decides the cluster: one ``"worker"`` task per rank, the task id being
the rank. ``MultiWorkerMirroredStrategy`` uses this resolver unless it is given one; a given
resolver (TensorFlow code passes a ``TFConfigClusterResolver``) must describe the same job:
as many workers (``"chief"`` and ``"worker"`` tasks) as MPI ranks, and this process's task at
this rank's place. TensorFlow numbers the workers chief first: the chief is worker 0 and
``"worker"`` task ``i`` is worker ``i + 1`` when there is a chief, ``i`` otherwise.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

from towerdist._src import mpi_runtime
from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver
from towerdist._src.cluster_resolver.cluster_spec import ClusterSpec
from towerdist._src.cluster_resolver.tf_config import TF_CONFIG, TFConfigClusterResolver, load_tf_config

__all__ = ["MPIClusterResolver", "resolve_for_mpi"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep

# The jobs whose tasks are workers of MultiWorkerMirroredStrategy, in TensorFlow's order.
_WORKER_JOBS = ("chief", "worker")


class MPIClusterResolver(ClusterResolver):
    """The cluster of an MPI job: task type ``"worker"``, task id = rank, one task per rank.

    MPI ranks have no network address; ``cluster_spec()`` names task ``i`` ``"mpi-rank-<i>"``
    and ``master()`` is ``""``.

    Args:
      rank: this process's rank; None: ask MPI (0 when the program was not launched by MPI).
      size: the number of ranks; None: ask MPI (1 when not launched by MPI).

    Example:
      >>> resolver = strategy.cluster_resolver  # under mpiexec -n 2, on rank 0
      >>> resolver.task_type, resolver.task_id, resolver.cluster_spec().num_tasks("worker")
      ('worker', 0, 2)
    """

    def __init__(self, rank: int | None = None, size: int | None = None) -> None:
        if rank is None or size is None:
            world = mpi_runtime.world()
            rank = (0 if world is None else world.rank) if rank is None else rank
            size = (1 if world is None else world.size) if size is None else size
        if not 0 <= rank < size:
            raise ValueError(f"MPIClusterResolver needs 0 <= rank < size. Got rank={rank}, size={size}.")
        self._task_type = "worker"
        self._task_id = rank
        self._size = size

    def cluster_spec(self) -> ClusterSpec:
        """One ``"worker"`` job with a task per MPI rank."""
        return ClusterSpec({"worker": [f"mpi-rank-{i}" for i in range(self._size)]})

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """The session master's address: ``""`` (MPI jobs have none)."""
        return ""

    def __repr__(self) -> str:
        return f"MPIClusterResolver(task_type='worker', task_id={self.task_id}, num_workers={self._size})"


def resolve_for_mpi(resolver: ClusterResolver | None, rank: int, size: int) -> ClusterResolver:
    """The resolver ``MultiWorkerMirroredStrategy`` reports on MPI rank ``rank`` of ``size``.

    None, or a resolver whose cluster is empty (``TFConfigClusterResolver`` without
    ``TF_CONFIG``), gives ``MPIClusterResolver(rank, size)``; any other resolver is returned
    if it describes this MPI job.

    Raises:
      ValueError: the resolver's cluster has another number of workers than MPI has ranks,
        has parameter servers, or puts this process at another place than its rank.
    """
    if resolver is None:
        _warn_if_tf_config_disagrees(rank, size)
        return MPIClusterResolver(rank, size)
    spec = resolver.cluster_spec()
    if not spec.jobs:
        return MPIClusterResolver(rank, size)
    counts = {job: spec.num_tasks(job) for job in _WORKER_JOBS if job in spec.jobs}
    workers = sum(counts.values())
    task_type, task_id = resolver.task_type, resolver.task_id
    where = f"MPI started this process as rank {rank} of {size}"
    fix = (
        "towerdist takes the workers from the MPI launcher: pass cluster_resolver=None, or a resolver that "
        "lists one worker per MPI rank and whose task is this process's rank"
    )
    shown = f"cluster_resolver={resolver!r} (cluster {spec!r}, task_type={task_type!r}, task_id={task_id!r})"
    others = [job for job in spec.jobs if job not in (*_WORKER_JOBS, "evaluator")]
    if others:
        raise ValueError(
            f"MultiWorkerMirroredStrategy got {shown}, whose jobs {others} are not workers; the strategy runs "
            f"'chief' and 'worker' tasks only ({where}). {fix}."
        )
    if workers != size:
        raise ValueError(
            f"MultiWorkerMirroredStrategy got {shown}, which has {workers} workers, but {where}. "
            f"Launch with mpiexec -n {workers}, or {fix[0].lower()}{fix[1:]}."
        )
    if task_type is None and task_id is None and size == 1:
        return resolver
    index = _worker_index(spec, task_type, task_id)
    if index != rank:
        place = "no worker" if index is None else f"worker {index}"
        raise ValueError(
            f"MultiWorkerMirroredStrategy got {shown}, which makes this process {place}, but {where}. {fix}."
        )
    return resolver


def _warn_if_tf_config_disagrees(rank: int, size: int) -> None:
    """Warns when ``TF_CONFIG`` describes another job than MPI's: the strategy ignores it, the script may not.

    A TensorFlow script often reads ``TF_CONFIG`` itself (``num_workers =
    len(tf_config["cluster"]["worker"])`` to size the global batch, ``task.index == 0`` for the
    chief); under ``mpiexec`` with one ``TF_CONFIG`` for every rank, or another number of
    workers, it would then compute with another job than the one that runs.
    """
    text = os.environ.get(TF_CONFIG, "").strip()
    if not text:
        return
    fix = (
        "Give each rank its own TF_CONFIG (MPICH: mpiexec -n 1 -env TF_CONFIG '<rank 0's>' python train.py "
        ": -n 1 -env TF_CONFIG '<rank 1's>' python train.py), or unset it and read the job from "
        "strategy.cluster_resolver (task_id, cluster_spec()); pass "
        "cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver() to make this an error"
    )
    where = (
        "this process runs as the only worker (no MPI launcher, or mpiexec -n 1)"
        if size == 1
        else f"MPI started this process as rank {rank} of {size}"
    )
    try:
        load_tf_config()
    except ValueError as error:
        warnings.warn(
            f"MultiWorkerMirroredStrategy() takes its workers from MPI ({where}) and ignores TF_CONFIG, "
            f"which cannot be read: {getattr(error, 'msg', error)} {fix}.",
            UserWarning,
            stacklevel=_user_stack_level(),
        )
        return
    resolver = TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    if not spec.jobs:
        return
    problems = []
    others = [job for job in spec.jobs if job not in (*_WORKER_JOBS, "evaluator")]
    if others:
        problems.append(f"its jobs {others} are not workers")
    workers = sum(spec.num_tasks(job) for job in _WORKER_JOBS if job in spec.jobs)
    task_type, task_id = resolver.task_type, resolver.task_id
    if workers != size:
        problems.append(f"it lists {workers} worker{'s' * (workers != 1)} where MPI started {size} process{'es' * (size != 1)}")
    elif not (task_type is None and task_id is None and size == 1):
        index = _worker_index(spec, task_type, task_id)
        if index != rank:
            place = "no worker" if index is None else f"worker {index}"
            problems.append(f"its task ({task_type!r}, index {task_id!r}) makes this process {place}, not worker {rank}")
    if problems:
        warnings.warn(
            f"MultiWorkerMirroredStrategy() takes its workers from MPI ({where}) and ignores TF_CONFIG, "
            f"which disagrees: {'; '.join(problems)} (TF_CONFIG={text}). Code that reads TF_CONFIG (num_workers "
            f"= len(tf_config['cluster']['worker']), task.index == 0 for the chief) sees another job than the "
            f"one that runs. {fix}.",
            UserWarning,
            stacklevel=_user_stack_level(),
        )


def _user_stack_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside towerdist (the user's call)."""
    frame: FrameType | None = sys._getframe(1)  # 1: the function that warns (stacklevel 1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def _worker_index(spec: ClusterSpec, task_type: str | None, task_id: int | None) -> int | None:
    """The worker index of a task in TensorFlow's order (chief first), or None if it is no worker."""
    if task_type not in _WORKER_JOBS or task_type not in spec.jobs or task_id is None:
        return None
    indices = spec.task_indices(task_type)
    if int(task_id) not in indices:
        return None
    offset = spec.num_tasks("chief") if task_type == "worker" and "chief" in spec.jobs else 0
    return offset + indices.index(int(task_id))
