"""``TFConfigClusterResolver``: the cluster described by the ``TF_CONFIG`` environment variable.

``TF_CONFIG`` is JSON, e.g.::

    {"cluster": {"worker": ["host0:2222", "host1:2222"]},
     "task": {"type": "worker", "index": 1},
     "rpc_layer": "grpc"}

It is read at every call, as TensorFlow reads it: ``cluster_spec()`` is the ``"cluster"``
entry (an empty ``ClusterSpec`` without one), ``task_type``/``task_id`` the ``"task"``
entry, ``rpc_layer`` the ``"rpc_layer"`` entry, ``master()`` the ``"session_master"`` entry
or this task's address. An unset ``TF_CONFIG`` reads as ``{}``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver, format_master_url
from towerdist._src.cluster_resolver.cluster_spec import ClusterSpec

__all__ = ["TF_CONFIG", "TFConfigClusterResolver", "load_tf_config"]

TF_CONFIG = "TF_CONFIG"


def load_tf_config() -> dict[str, Any]:
    """``TF_CONFIG`` parsed (``{}`` when unset).

    Raises:
      json.JSONDecodeError: ``TF_CONFIG`` is set but is not JSON (a ``ValueError``, as in TensorFlow).
    """
    text = os.environ.get(TF_CONFIG, "{}")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise json.JSONDecodeError(
            f"TFConfigClusterResolver reads the environment variable TF_CONFIG as JSON, but "
            f"TF_CONFIG={text!r} is not JSON ({error.msg}); unset it or write e.g. "
            f'{{"cluster": {{"worker": ["host0:2222"]}}, "task": {{"type": "worker", "index": 0}}}}',
            error.doc,
            error.pos,
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"TF_CONFIG must hold a JSON object ({{...}}); got TF_CONFIG={text!r}.")
    return config


class TFConfigClusterResolver(ClusterResolver):
    """Reads the cluster from ``TF_CONFIG`` (``tf.distribute.cluster_resolver.TFConfigClusterResolver``).

    Args:
      task_type: overrides ``TF_CONFIG``'s ``task.type``.
      task_id: overrides ``TF_CONFIG``'s ``task.index``.
      rpc_layer: overrides ``TF_CONFIG``'s ``rpc_layer``.
      environment: returned by ``environment`` (TensorFlow does not read it from ``TF_CONFIG``).

    Example:
      >>> os.environ["TF_CONFIG"] = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'
      >>> resolver = td.distribute.cluster_resolver.TFConfigClusterResolver()
      >>> resolver.task_type, resolver.task_id, resolver.cluster_spec().num_tasks("worker")
      ('worker', 1, 2)
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
    ) -> None:
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    @property
    def task_type(self) -> str | None:
        """The override, else ``TF_CONFIG``'s ``task.type`` (None without one)."""
        if self._task_type is not None:
            return str(self._task_type)
        task = load_tf_config().get("task", {})
        return str(task["type"]) if "type" in task else None

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The override, else ``TF_CONFIG``'s ``task.index`` as an int (None without one)."""
        if self._task_id is not None:
            return int(self._task_id)
        task = load_tf_config().get("task", {})
        return int(task["index"]) if "index" in task else None

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The override, else ``TF_CONFIG``'s ``rpc_layer`` (None without one)."""
        if self._rpc_layer is not None:
            return self._rpc_layer
        value = load_tf_config().get("rpc_layer")
        return None if value is None else str(value)

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str | None:  # type: ignore[override]  # TensorFlow's default is None here
        """The ``environment`` given to the constructor (None by default, as in TensorFlow)."""
        return self._environment

    def cluster_spec(self) -> ClusterSpec:
        """``TF_CONFIG``'s ``cluster`` entry; an empty ``ClusterSpec`` without one."""
        return ClusterSpec(load_tf_config().get("cluster", {}))

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """``TF_CONFIG``'s ``session_master``, else ``""`` for a cluster of at most one task, else a task's address.

        The task is ``task_type``/``task_id`` if given, else this one; the address is prefixed
        with ``"<rpc_layer>://"`` when there is an RPC layer.
        """
        session_master = load_tf_config().get("session_master")
        if session_master is not None:
            return str(session_master)
        spec = self.cluster_spec()
        if not spec.jobs or (len(spec.jobs) == 1 and len(spec.job_tasks(spec.jobs[0])) == 1):
            return ""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type is None or task_id is None:
            raise ValueError(
                f"TFConfigClusterResolver.master() needs a task: TF_CONFIG has no 'task' entry and no "
                f"task_type/task_id was given. Got task_type={task_type!r}, task_id={task_id!r}."
            )
        return format_master_url(
            spec.task_address(task_type, task_id), self.rpc_layer if rpc_layer is None else rpc_layer
        )

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: object = None
    ) -> dict[str, int]:
        """This process's accelerators, ``{"GPU": n}`` (``{}`` without GPUs)."""
        return super().num_accelerators(task_type, task_id, config_proto)
