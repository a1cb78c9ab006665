"""``MultiWorkerMirroredStrategy()`` under MPI warns when ``TF_CONFIG`` describes another job.

The strategy takes its workers from MPI and ignores ``TF_CONFIG``; a TensorFlow script that reads
``TF_CONFIG`` itself (the tutorial's ``num_workers = len(tf_config["cluster"]["worker"])``) would
silently compute with another job. Written once for any number of workers: it runs in the default
suite (one worker) and under ``mpiexec -n 2 python -m pytest -m multi_worker`` (two).
"""

from __future__ import annotations

import json
import warnings

import pytest

import towerdist as td

from conftest import cpus

pytestmark = pytest.mark.multi_worker

DISAGREES = "MultiWorkerMirroredStrategy() takes its workers from MPI"


def _rank_and_size() -> tuple[int, int]:
    extended = td.distribute.MultiWorkerMirroredStrategy._from_local_devices(cpus(1)).extended
    return extended._worker_index, extended._num_workers


def _create(monkeypatch, tf_config) -> list[str]:
    """Creates the strategy (collective: every rank does) with ``TF_CONFIG``; returns the warnings' messages."""
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config if isinstance(tf_config, str) else json.dumps(tf_config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy = td.distribute.MultiWorkerMirroredStrategy._from_local_devices(cpus(1))
    assert strategy.cluster_resolver.task_type == "worker"  # the job is MPI's whatever TF_CONFIG says
    return [str(w.message) for w in caught if DISAGREES in str(w.message)]


def _cluster(workers: int, index: int | None) -> dict:
    config: dict = {"cluster": {"worker": [f"localhost:{2222 + i}" for i in range(workers)]}}
    if index is not None:
        config["task"] = {"type": "worker", "index": index}
    return config


def test_a_tf_config_that_describes_the_mpi_job_is_accepted_silently(monkeypatch):
    rank, size = _rank_and_size()
    assert _create(monkeypatch, _cluster(size, rank)) == []
    assert _create(monkeypatch, None) == []
    assert _create(monkeypatch, "{}") == []
    chief_first = {"cluster": {"chief": ["c:1"], "worker": [f"w:{i}" for i in range(size - 1)], "evaluator": ["e:1"]},
                   "task": {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": rank - 1}}
    assert _create(monkeypatch, chief_first) == []


def test_a_tf_config_with_more_workers_than_ranks_warns_on_every_rank(monkeypatch):
    # The tutorial's 2-worker TF_CONFIG under mpiexec -n 1 (here: one worker more than the job has).
    rank, size = _rank_and_size()
    (message,) = _create(monkeypatch, _cluster(size + 1, rank))
    assert f"ignores TF_CONFIG, which disagrees: it lists {size + 1} workers where MPI started {size} process" in message
    assert "Give each rank its own TF_CONFIG (MPICH: mpiexec -n 1 -env TF_CONFIG" in message
    assert "cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver() to make this an error" in message


def test_every_rank_claiming_index_0_warns_on_the_others(monkeypatch):
    rank, size = _rank_and_size()
    messages = _create(monkeypatch, _cluster(size, 0))
    if rank == 0:
        assert messages == []
    else:
        (message,) = messages
        assert f"its task ('worker', index 0) makes this process worker 0, not worker {rank}" in message
        assert f"MPI started this process as rank {rank} of {size}" in message


def test_a_tf_config_that_is_not_json_warns(monkeypatch):
    (message,) = _create(monkeypatch, "{not json")
    assert "ignores TF_CONFIG, which cannot be read: TFConfigClusterResolver reads the environment variable" in message


def test_a_tf_config_with_parameter_servers_warns(monkeypatch):
    rank, size = _rank_and_size()
    config = _cluster(size, rank)
    config["cluster"]["ps"] = ["localhost:3333"]
    (message,) = _create(monkeypatch, config)
    assert "its jobs ['ps'] are not workers" in message


def test_the_explicit_resolver_still_raises(monkeypatch):
    rank, size = _rank_and_size()
    monkeypatch.setenv("TF_CONFIG", json.dumps(_cluster(size + 1, rank)))
    with pytest.raises(ValueError, match=f"which has {size + 1} workers"):
        td.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=td.distribute.cluster_resolver.TFConfigClusterResolver()
        )
