"""What the ``test_compat_v1_*.py`` files share: cached tower strategies, the ``strategy`` fixture, expected values.

Together, those files test the following.

The TF 1.x tower dialect: ``towerdist.compat.v1`` / ``towerdist.contrib.distribute``.

Covers the examples of TF 1.x's ``DistributionStrategy`` docs (``tf.contrib.distribute``) as
written (with ``import towerdist.compat.v1 as tf``), each tower-era member against its TF 2
equivalent on 1, 2 and 4 towers, ``call_for_each_tower(..., run_concurrently=False)``, the one-time
``DeprecationWarning`` of every old name (the alias table ``towerdist._src.aliases``) and
the errors of the dialect, each followed by a successful step on the same strategy.

Expected values are computed independently in the tests (plain Python/numpy over the
per-tower inputs), never copied from a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import numpy as np
import pytest

import towerdist as td
import towerdist.compat.v1 as tf
from towerdist._src import aliases
from towerdist._src import device as device_lib

from conftest import cpus

TOWER_COUNTS = [1, 2, 4]
ReduceOp = td.distribute.ReduceOp


@lru_cache(maxsize=None)
def tower(n: int) -> Any:
    """A cached ``compat.v1`` MirroredStrategy over ``n`` logical CPUs."""
    return tf.distribute.MirroredStrategy(cpus(n))


@pytest.fixture(params=TOWER_COUNTS, ids=lambda n: f"{n}towers")
def strategy(request: pytest.FixtureRequest) -> Any:
    return tower(request.param)


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    """Every old name warns again in each test (the warning is once per process)."""
    aliases.reset_warnings()
    yield


def canonical(device: Any) -> str:
    return device_lib.canonicalize(device)


def current_device() -> str | None:
    spec = device_lib.current()
    return None if spec is None else spec.name


def tower_values(n: int) -> list[np.ndarray]:
    """What tower ``i`` contributes in the reduce tests: ``arange(3) * (i + 1)`` as float32."""
    return [np.arange(3, dtype=np.float32) * (i + 1) for i in range(n)]


def per_tower_arrays(strategy: Any) -> Any:
    """``tower_values`` produced by ``call_for_each_tower`` (a PerReplica, or the array for one tower)."""
    return strategy.call_for_each_tower(lambda: np.arange(3, dtype=np.float32) * (tf.get_tower_context().tower_id + 1))


def assert_usable(strategy: Any) -> None:
    """A full step with a merge_call still works on ``strategy``."""
    n = strategy.num_replicas_in_sync

    def fn() -> int:
        ctx = tf.get_tower_context()
        total = ctx.merge_call(lambda dist, v: sum(dist.unwrap(v)), ctx.tower_id)
        return total + ctx.tower_id

    expected_total = sum(range(n))
    assert strategy.unwrap(strategy.call_for_each_tower(fn)) == [expected_total + i for i in range(n)]
