"""``ClusterSpec``: the jobs of a cluster and the address of each task (``tf.train.ClusterSpec``).

A cluster is a set of named jobs (``"worker"``, ``"chief"``, ``"ps"``, ...), each a set of
tasks numbered from 0 and given by a network address. The task numbers of a job may be
sparse (``{"worker": {1: "host1:2222"}}``). towerdist's workers talk over MPI, not over these
addresses; the spec says who the workers are (``MultiWorkerMirroredStrategy`` checks it
against the MPI job), and TensorFlow code that reads it keeps working.

Example:
  >>> spec = td.train.ClusterSpec({"worker": ["host0:2222", "host1:2222"]})
  >>> spec.jobs, spec.num_tasks("worker"), spec.task_address("worker", 1)
  (['worker'], 2, 'host1:2222')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["ClusterDef", "ClusterSpec", "JobDef"]


class JobDef(NamedTuple):
    """One job of a ``ClusterDef``: its ``name`` and ``tasks`` (``{task index: address}``)."""

    name: str
    tasks: dict[int, str]


class ClusterDef(NamedTuple):
    """A cluster as TensorFlow's ``ClusterDef`` protocol buffer holds it: ``job``, sorted by name.

    towerdist has no protocol buffers; this is the same shape (``cluster_def.job[i].name``,
    ``.tasks``), and ``ClusterSpec`` accepts it, or any object of that shape.
    """

    job: tuple[JobDef, ...]


_CLUSTER_TYPE_ERROR = (
    "td.train.ClusterSpec(cluster) takes a dict mapping job names to lists of network addresses (or "
    "to dicts from task index to address), a ClusterSpec, or a ClusterDef"
)


class ClusterSpec:
    """The jobs and tasks of a cluster (``tf.train.ClusterSpec``).

    Args:
      cluster: ``{job name: [address, ...]}`` or ``{job name: {task index: address}}``, another
        ``ClusterSpec``, or a ``ClusterDef`` (``as_cluster_def()``).

    Raises:
      TypeError: ``cluster`` is none of these, a job's tasks are neither a list nor a dict,
        or a job name or an address is not a string.
    """

    _spec: dict[str, dict[int, str]]

    # cluster: a ClusterSpec, a dict of job -> task addresses, or a ClusterDef (ours or TensorFlow's protocol
    # buffer, which TensorFlow being optional leaves untyped): Any, checked below.
    def __init__(self, cluster: Any) -> None:
        spec: dict[str, dict[int, str]] = {}
        if isinstance(cluster, ClusterSpec):
            spec = {job: dict(tasks) for job, tasks in sorted(cluster._spec.items())}
        elif isinstance(cluster, Mapping):
            for job, tasks in cluster.items():
                if isinstance(tasks, (list, tuple)):
                    spec[job] = dict(enumerate(tasks))
                elif isinstance(tasks, Mapping):
                    spec[job] = {int(i): task for i, task in tasks.items()}
                else:
                    raise TypeError(
                        f"The tasks for job {job!r} must be a list or a dictionary from integers to strings. "
                        f"Got {tasks!r} in td.train.ClusterSpec(); write {{{job!r}: [{tasks!r}]}}."
                    )
        elif hasattr(cluster, "job"):  # a ClusterDef, ours or TensorFlow's protocol buffer
            for job_def in cluster.job:
                spec[str(job_def.name)] = {int(i): task for i, task in dict(job_def.tasks).items()}
        else:
            raise TypeError(f"{_CLUSTER_TYPE_ERROR}. Got cluster={cluster!r}.")
        for job, tasks in spec.items():
            if not isinstance(job, str):
                raise TypeError(f"Job name {job!r} must be a string, in td.train.ClusterSpec({cluster!r}).")
            for address in tasks.values():
                if not isinstance(address, str):
                    raise TypeError(
                        f"Task address {address!r} must be a string, in job {job!r} of td.train.ClusterSpec()."
                    )
        self._spec = spec

    def __bool__(self) -> bool:
        return bool(self._spec)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterSpec) and self._spec == other._spec

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # mutable-looking and unhashable, as in TensorFlow

    def __repr__(self) -> str:
        as_dict = self.as_dict()
        items = ", ".join(f"{job!r}: {as_dict[job]!r}" for job in sorted(as_dict))
        return f"ClusterSpec({{{items}}})"

    @property
    def jobs(self) -> list[str]:
        """The job names, e.g. ``["worker"]``, in the order given."""
        return list(self._spec)

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """``{job: [address, ...]}``; a job with sparse task indices gives ``{index: address}``."""
        result: dict[str, list[str] | dict[int, str]] = {}
        for job, tasks in self._spec.items():
            indices = sorted(tasks)
            if indices and indices[-1] + 1 == len(indices):
                result[job] = [tasks[i] for i in indices]
            else:
                result[job] = {i: tasks[i] for i in indices}
        return result

    def as_cluster_def(self) -> ClusterDef:
        """The spec as a ``ClusterDef``: jobs sorted by name, each with ``{task index: address}``."""
        return ClusterDef(tuple(JobDef(job, dict(sorted(tasks.items()))) for job, tasks in sorted(self._spec.items())))

    def num_tasks(self, job_name: str) -> int:
        """How many tasks ``job_name`` has.

        Raises:
          ValueError: there is no such job.
        """
        return len(self._tasks(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """The task indices of ``job_name``, sorted (``[0, ..., n - 1]`` unless sparse).

        Raises:
          ValueError: there is no such job.
        """
        return sorted(self._tasks(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """The address of task ``task_index`` of ``job_name``.

        Raises:
          ValueError: there is no such job, or it has no task ``task_index``.
        """
        tasks = self._tasks(job_name)
        if task_index not in tasks:
            raise ValueError(
                f"No task with index {task_index!r} in job {job_name!r}; its task indices are "
                f"{sorted(tasks)} (ClusterSpec.task_address())."
            )
        return tasks[task_index]

    def job_tasks(self, job_name: str) -> list[str | None]:
        """The addresses of ``job_name`` by task index; ``None`` where a sparse job has no task.

        Raises:
          ValueError: there is no such job.
        """
        tasks = self._tasks(job_name)
        result: list[str | None] = [None] * (max(tasks) + 1 if tasks else 0)
        for index, address in tasks.items():
            result[index] = address
        return result

    def _tasks(self, job_name: str) -> dict[int, str]:
        if job_name not in self._spec:
            raise ValueError(f"No such job in cluster: {job_name!r}; the jobs are {self.jobs}.")
        return self._spec[job_name]
