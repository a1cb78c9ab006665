"""``UnionResolver``: one cluster made of the clusters of several resolvers."""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver, format_master_url
from towerdist._src.cluster_resolver.cluster_spec import ClusterSpec

__all__ = ["UnionOptions", "UnionResolver"]


class UnionOptions(TypedDict, total=False):
    """The keywords of ``UnionResolver`` (TensorFlow's ``**kwargs``): overrides of the first resolver's."""

    task_type: str | None
    task_id: int | None
    rpc_layer: str | None


class UnionResolver(ClusterResolver):
    """Merges the clusters of several resolvers (``tf.distribute.cluster_resolver.UnionResolver``).

    ``cluster_spec()`` joins the jobs of every resolver: the tasks of a job that several
    resolvers have are concatenated in argument order, or merged by task index when any of
    them is sparse. ``task_type``, ``task_id``, ``rpc_layer``, ``environment``, ``master()``
    and ``num_accelerators()`` come from the first resolver unless overridden.

    Args:
      *args: the ``ClusterResolver`` objects.
      **kwargs: ``task_type``, ``task_id``, ``rpc_layer``: overrides.

    Raises:
      ValueError: no resolver, or another keyword argument.
      TypeError: an argument is not a ``ClusterResolver``.
    """

    def __init__(self, *args: ClusterResolver, **kwargs: Unpack[UnionOptions]) -> None:
        self._rpc_layer = kwargs.pop("rpc_layer", None)
        self._task_type = kwargs.pop("task_type", None)
        self._task_id = kwargs.pop("task_id", None)
        if kwargs:
            raise ValueError(
                f"Unexpected kwargs provided {kwargs!r}: UnionResolver() takes task_type, task_id and rpc_layer."
            )
        if not args:
            raise ValueError("At least one ClusterResolver is required: UnionResolver(resolver, ...).")
        for position, resolver in enumerate(args):
            if not isinstance(resolver, ClusterResolver):
                raise TypeError(
                    f"All arguments must be a sub-class of `ClusterResolver`. Got {resolver!r} as argument "
                    f"{position} of UnionResolver()."
                )
        self._cluster_resolvers: tuple[ClusterResolver, ...] = args

    def cluster_spec(self) -> ClusterSpec:
        """The union of the resolvers' clusters.

        Raises:
          KeyError: two resolvers give the same task index of a job with sparse indices.
        """
        dicts = [resolver.cluster_spec().as_dict() for resolver in self._cluster_resolvers]
        sparse = {job for d in dicts for job, tasks in d.items() if isinstance(tasks, dict)}
        merged: dict[str, Any] = {}
        for d in dicts:
            for job, tasks in d.items():
                if job not in sparse:
                    merged.setdefault(job, []).extend(tasks)
                    continue
                by_index = dict(enumerate(tasks)) if isinstance(tasks, list) else dict(tasks)
                target = merged.setdefault(job, {})
                clash = set(by_index) & set(target)
                if clash:
                    raise KeyError(
                        f"Duplicate keys detected when merging two ClusterSpecs: task indices {sorted(clash)} of "
                        f"job {job!r} are given by more than one resolver of UnionResolver."
                    )
                target.update(by_index)
        return ClusterSpec(merged)

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """The first resolver's master, or the address of ``task_type``/``task_id`` in the union."""
        if task_type is not None and task_id is not None:
            return format_master_url(self.cluster_spec().task_address(task_type, task_id), rpc_layer or self._rpc_layer)
        return self._cluster_resolvers[0].master(rpc_layer=rpc_layer)

    @property
    def task_type(self) -> str | None:
        """The override, else the first resolver's ``task_type``."""
        return self._task_type or self._cluster_resolvers[0].task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The override, else the first resolver's ``task_id``."""
        # TensorFlow 2.21 writes `override or first`, which ignores an override of 0; None means "not given".
        return self._task_id if self._task_id is not None else self._cluster_resolvers[0].task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The override, else the first resolver's ``rpc_layer``."""
        return self._rpc_layer or self._cluster_resolvers[0].rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        """The first resolver's ``environment``."""
        return self._cluster_resolvers[0].environment

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """The first resolver's ``num_accelerators()``."""
        return self._cluster_resolvers[0].num_accelerators(task_type, task_id, config_proto)
