"""Saving a distributed iterator across real workers: every worker's position in one state.

Marked ``multi_worker``: these bodies run in the default suite (one worker, with one and two
local replicas) and again under ``mpiexec -n 2 python -m pytest -m multi_worker`` (two real
workers), where ``_checkpoint_state()`` is collective: each worker gives its position and
every worker gets the same bytes holding all of them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.data import state_codec
from towerdist.testing.pytest_plugin import broadcast_from_rank_0

pytestmark = pytest.mark.multi_worker

D = td.data.Dataset
GLOBAL_BATCH = 8


def with_policy(dataset: td.data.Dataset, policy: Any) -> td.data.Dataset:
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def data_sharded() -> td.data.Dataset:
    dataset = D.range(100).shuffle(20, seed=6).map(lambda x: (x, x * 3)).batch(GLOBAL_BATCH)
    return with_policy(dataset, td.data.experimental.AutoShardPolicy.DATA)


def global_steps(strategy: td.distribute.Strategy, iterator: Any) -> list[list[int]]:
    """Every later step's examples, all replicas of all workers in order (the same list on every worker)."""
    steps = []
    for value in iterator:
        ids, _ = strategy.gather(value, axis=0)
        steps.append(np.asarray(ids).tolist())
    return steps


@pytest.mark.parametrize("k", [0, 2, 5])
def test_every_worker_saves_every_workers_position_and_restores_its_own(
    request: pytest.FixtureRequest, multi_worker_strategy: td.distribute.MultiWorkerMirroredStrategy, k: int
) -> None:
    strategy = multi_worker_strategy
    iterator = iter(strategy.experimental_distribute_dataset(data_sharded()))
    for _ in range(k):
        strategy.run(lambda x: x, args=(next(iterator),))
    state = iterator._checkpoint_state()
    # every worker holds the same bytes: what the chief writes restores every worker
    digest = hashlib.sha256(state).hexdigest()
    assert broadcast_from_rank_0(request.config, digest) == digest
    workers = strategy.extended._num_workers
    assert len(state_codec.decode(state)["workers"]) == workers
    expected = global_steps(strategy, iterator)
    restored = iter(strategy.experimental_distribute_dataset(data_sharded()))
    restored._checkpoint_restorer(state)()
    assert global_steps(strategy, restored) == expected


def test_a_state_saved_by_every_worker_restores_on_one_worker_of_another_number_of_replicas(
    multi_worker_strategy: td.distribute.MultiWorkerMirroredStrategy,
) -> None:
    strategy = multi_worker_strategy
    iterator = iter(strategy.experimental_distribute_dataset(data_sharded()))
    for _ in range(3):
        strategy.run(lambda x: x, args=(next(iterator),))
    state = iterator._checkpoint_state()
    expected = global_steps(strategy, iterator)
    # one worker of 3 replicas, in this process (as a restarted job of one process would be)
    one = td.distribute.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
    restored = iter(one.experimental_distribute_dataset(data_sharded()))
    restored._checkpoint_restorer(state)()
    assert global_steps(one, restored) == expected
