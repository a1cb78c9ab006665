"""``SimpleClusterResolver``: a cluster resolver over a given ``ClusterSpec``."""

from __future__ import annotations

from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver, format_master_url
from towerdist._src.cluster_resolver.cluster_spec import ClusterSpec

__all__ = ["SimpleClusterResolver"]


class SimpleClusterResolver(ClusterResolver):
    """Returns the cluster, master and task it was given (``tf.distribute.cluster_resolver.SimpleClusterResolver``).

    Args:
      cluster_spec: a ``td.train.ClusterSpec``.
      master: the session master's address (``""``: none).
      task_type: this process's job, e.g. ``"worker"``.
      task_id: this process's index in its job.
      environment: returned by ``environment``.
      num_accelerators: returned by ``num_accelerators()`` (None: ``{}``).
      rpc_layer: the protocol, e.g. ``"grpc"``; ``master()`` prefixes it.

    Raises:
      TypeError: ``cluster_spec`` is not a ``ClusterSpec`` or ``master`` is not a string.
    """

    def __init__(
        self,
        cluster_spec: ClusterSpec,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: dict[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        if not isinstance(cluster_spec, ClusterSpec):
            raise TypeError(
                f"cluster_spec must be a `tf.train.ClusterSpec`. Got cluster_spec={cluster_spec!r}; "
                f"write SimpleClusterResolver(td.train.ClusterSpec({cluster_spec!r}))."
            )
        if not isinstance(master, str):
            raise TypeError(f"master must be a string, in SimpleClusterResolver(). Got master={master!r}.")
        self._cluster_spec = cluster_spec
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = num_accelerators
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        """The ``ClusterSpec`` given to the constructor."""
        return self._cluster_spec

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """The given master, or the address of task ``task_id`` of ``task_type`` when both are given."""
        if task_type is not None and task_id is not None:
            master = self._cluster_spec.task_address(task_type, task_id)
        else:
            master = self._master
        return format_master_url(master, rpc_layer or self._rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """The ``num_accelerators`` given to the constructor (``{}`` if None); the arguments are unused."""
        del task_type, task_id, config_proto
        return {} if self._num_accelerators is None else self._num_accelerators

    @property
    def environment(self) -> str:
        """The ``environment`` given to the constructor."""
        return self._environment
