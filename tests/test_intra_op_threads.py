"""``td.config.threading``: BLAS threads per operation, and the limit for concurrent CPU replicas."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import towerdist as td
from towerdist._src import intra_op_threads

from conftest import cpus


class FakeController:
    """Stands for threadpoolctl's controller: one BLAS pool with ``threads`` threads."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.limits: list[int] = []

    def info(self) -> list[dict[str, Any]]:
        return [{"user_api": "blas", "internal_api": "openblas", "num_threads": self.threads}]

    def limit(self, *, limits: int, user_api: str) -> FakeLimiter:
        assert user_api == "blas"
        self.limits.append(limits)
        limiter = FakeLimiter(self, self.threads)
        self.threads = limits
        return limiter


class FakeLimiter:
    def __init__(self, controller: FakeController, before: int) -> None:
        self.controller, self.before = controller, before

    def restore_original_limits(self) -> None:
        self.controller.threads = self.before


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not limited anything yet, 4 usable cores, no user setting."""
    monkeypatch.setattr(intra_op_threads, "_limiters", [])
    monkeypatch.setattr(intra_op_threads, "_limited_for", 1)
    monkeypatch.setattr(intra_op_threads, "_said", False)
    monkeypatch.setattr(intra_op_threads, "_chosen", 0)
    monkeypatch.setattr(intra_op_threads.waiting, "usable_cores", lambda: 4)
    for name in intra_op_threads._USER_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def install(controller: FakeController | None) -> None:
        monkeypatch.setattr(intra_op_threads, "_controller", lambda: controller)

    return install


def test_concurrent_replicas_get_their_share_of_the_cores_and_it_is_said_once(fresh, caplog):
    controller = FakeController(threads=4)
    fresh(controller)
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        intra_op_threads.for_concurrent_replicas(2)
        intra_op_threads.for_concurrent_replicas(2)
        intra_op_threads.for_concurrent_replicas(4)
    assert controller.limits == [2, 1]  # 4 cores: 2 replicas get 2 threads each, then 4 get 1
    messages = [r.getMessage() for r in caplog.records if "BLAS threads" in r.getMessage()]
    assert len(messages) == 1
    assert messages[0].startswith("towerdist limited the BLAS threads (openblas) from 4 to 2 per operation: 2 CPU")
    assert "set_intra_op_parallelism_threads" in messages[0]


def test_no_limit_when_the_threads_fit_the_cores(fresh):
    controller = FakeController(threads=2)
    fresh(controller)
    intra_op_threads.for_concurrent_replicas(2)  # 2 x 2 = 4 cores
    assert controller.limits == []


def test_the_users_environment_variable_is_respected(fresh, monkeypatch):
    controller = FakeController(threads=4)
    fresh(controller)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    intra_op_threads.for_concurrent_replicas(4)
    assert controller.limits == []


def test_without_threadpoolctl_it_says_once_that_it_could_not_check(fresh, caplog):
    fresh(None)
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        intra_op_threads.for_concurrent_replicas(2)
        intra_op_threads.for_concurrent_replicas(4)
    messages = [r.getMessage() for r in caplog.records if "could not check" in r.getMessage()]
    assert len(messages) == 1 and "pip install threadpoolctl" in messages[0]


def test_a_number_set_by_the_user_applies_at_once_and_towerdist_no_longer_picks(fresh, monkeypatch):
    controller = FakeController(threads=4)
    fresh(controller)
    td.config.threading.set_intra_op_parallelism_threads(3)
    assert controller.limits == [3]
    assert td.config.threading.get_intra_op_parallelism_threads() == 3
    intra_op_threads.for_concurrent_replicas(4)
    assert controller.limits == [3]
    td.config.threading.set_intra_op_parallelism_threads(2)
    assert controller.threads == 2
    td.config.threading.set_intra_op_parallelism_threads(0)  # back to the libraries' own threads
    assert td.config.threading.get_intra_op_parallelism_threads() == 0
    assert controller.threads == 4


def test_setting_a_number_without_threadpoolctl_names_what_to_install(fresh):
    fresh(None)
    with pytest.raises(ModuleNotFoundError, match="pip install threadpoolctl"):
        td.config.threading.set_intra_op_parallelism_threads(2)
    assert td.config.threading.get_intra_op_parallelism_threads() == 0


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, "needs num_threads >= 0"),
        (1.5, TypeError, "takes the number of threads as an int"),
        (True, TypeError, "takes the number of threads as an int"),
    ],
)
def test_bad_numbers_of_threads_are_refused(value, error, message):
    with pytest.raises(error, match=message):
        td.config.threading.set_intra_op_parallelism_threads(value)


def test_a_strategy_of_several_cpu_replicas_asks_for_the_limit_when_it_is_made(fresh, monkeypatch):
    asked: list[int] = []
    monkeypatch.setattr(intra_op_threads, "for_concurrent_replicas", asked.append)
    td.distribute.MirroredStrategy(cpus(2))
    td.distribute.MirroredStrategy(cpus(4))
    td.distribute.MirroredStrategy(cpus(1))  # one replica: nothing runs at once
    assert asked == [2, 4]
