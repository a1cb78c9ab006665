"""``ClusterResolver``: the base of the cluster resolvers (``tf.distribute.cluster_resolver``).

A cluster resolver says who the tasks of a cluster are (``cluster_spec()``), which task this
process is (``task_type``, ``task_id``), and how to reach a task (``master()``, with
``rpc_layer``). TensorFlow code builds one and passes it to ``MultiWorkerMirroredStrategy``;
under towerdist the MPI launcher starts the workers, and the strategy checks that the
resolver describes the same job (``cluster_resolver.mpi``).
"""

from __future__ import annotations

import abc

from towerdist._src import config
from towerdist._src.cluster_resolver.cluster_spec import ClusterSpec

__all__ = ["ClusterResolver", "format_master_url", "local_accelerators"]


def format_master_url(master: str, rpc_layer: str | None = None) -> str:
    """``"<rpc_layer>://<master>"``, or ``master`` alone without an RPC layer."""
    return f"{rpc_layer}://{master}" if rpc_layer else master


def local_accelerators() -> dict[str, int]:
    """This process's accelerators by type: ``{"GPU": n}``, or ``{}`` without GPUs."""
    count = len(config.local_devices("GPU"))
    return {"GPU": count} if count else {}


class ClusterResolver(abc.ABC):
    """Says who the tasks of a cluster are and which one this process is.

    Subclasses implement ``cluster_spec()`` and ``master()``; ``task_type``, ``task_id``
    and ``rpc_layer`` are settable properties stored on the instance.
    """

    _task_type: str | None = None
    _task_id: int | None = None
    _rpc_layer: str | None = None

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The cluster: a ``td.train.ClusterSpec`` of its jobs and task addresses."""

    @abc.abstractmethod
    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """The address of a task (this one unless ``task_type`` and ``task_id`` are given)."""

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """Accelerators per worker by type, ``{"GPU": n}`` (``{}`` without any).

        towerdist counts this process's GPUs: under MPI every worker runs the same program,
        and a remote task cannot be asked. ``config_proto`` is accepted and not used.
        """
        del task_type, task_id, config_proto
        return local_accelerators()

    @property
    def environment(self) -> str:
        """The environment the cluster runs in: ``""`` (``"google"`` only inside Google)."""
        return ""

    @property
    def task_type(self) -> str | None:
        """This process's job, e.g. ``"worker"`` (None when unknown)."""
        return self._task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """This process's task index within its job (None when unknown)."""
        return self._task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The protocol tasks talk over, e.g. ``"grpc"`` (None: none named)."""
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task_type={self.task_type!r}, task_id={self.task_id!r})"
