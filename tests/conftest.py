"""Shared test setup: 8 logical CPU devices, named strategy fixtures, GPU/MPI markers.

Strategy fixtures are session-scoped so their replica threads are reused across tests
(as a training script would); tests that break a strategy on purpose check that it is
usable afterwards, which is part of the contract.

Replica barrier timeouts are on for the whole suite: a replica that never arrives fails
the test with ``DeadlineExceededError`` instead of hanging it (pytest-timeout is the
outer bound).
"""

from __future__ import annotations

import functools

import pytest

import towerdist as td
from towerdist._src.backend import cupy_backend

NUM_CPUS = 8
TEST_REPLICA_WARNING_SECONDS = 20.0
TEST_REPLICA_TIMEOUT_SECONDS = 60.0


def pytest_configure(config: pytest.Config) -> None:
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * NUM_CPUS)
    td.config.set_replica_timeouts(
        warning_seconds=TEST_REPLICA_WARNING_SECONDS, timeout_seconds=TEST_REPLICA_TIMEOUT_SECONDS
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = cupy_backend.device_count()
    try:
        import mpi4py  # noqa: F401

        have_mpi = True
    except ImportError:
        have_mpi = False
    for item in items:
        if item.get_closest_marker("gpu") and gpus == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU with cupy; none is available"))
        marker = item.get_closest_marker("multi_gpu")
        if marker is not None:
            needed = marker.args[0] if marker.args else 2
            if gpus < needed:
                item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA GPUs; {gpus} available"))
        if item.get_closest_marker("mpi") and not have_mpi:
            item.add_marker(pytest.mark.skip(reason="needs mpi4py (pip install towerdist[mpi])"))


def cpus(n: int) -> list[str]:
    """The names of the first ``n`` logical CPU devices."""
    return [f"CPU:{i}" for i in range(n)]


@functools.lru_cache(maxsize=None)
def mirrored(n: int) -> td.distribute.MirroredStrategy:
    """A cached MirroredStrategy over ``n`` logical CPUs (for property tests over 1..8 replicas)."""
    return td.distribute.MirroredStrategy(cpus(n))


@pytest.fixture(scope="session")
def default() -> td.distribute.Strategy:
    return td.distribute.get_strategy()


@pytest.fixture(scope="session")
def one_device_cpu() -> td.distribute.OneDeviceStrategy:
    return td.distribute.OneDeviceStrategy("/cpu:0")


@pytest.fixture(scope="session")
def mirrored_1cpu() -> td.distribute.MirroredStrategy:
    return mirrored(1)


@pytest.fixture(scope="session")
def mirrored_2cpu() -> td.distribute.MirroredStrategy:
    return mirrored(2)


@pytest.fixture(scope="session")
def mirrored_4cpu() -> td.distribute.MirroredStrategy:
    return mirrored(4)


@pytest.fixture(scope="session")
def central_storage_2cpu() -> td.distribute.experimental.CentralStorageStrategy:
    return td.distribute.experimental.CentralStorageStrategy(compute_devices=cpus(2), parameter_device="CPU:0")


ALL_STRATEGIES = ["default", "one_device_cpu", "mirrored_1cpu", "mirrored_2cpu", "mirrored_4cpu"]
MIRRORED_STRATEGIES = ["mirrored_1cpu", "mirrored_2cpu", "mirrored_4cpu"]
MULTI_REPLICA_STRATEGIES = ["mirrored_2cpu", "mirrored_4cpu"]


@pytest.fixture(params=ALL_STRATEGIES)
def any_strategy(request: pytest.FixtureRequest) -> td.distribute.Strategy:
    """Every named strategy, one test per strategy."""
    return request.getfixturevalue(request.param)


@pytest.fixture(params=MIRRORED_STRATEGIES)
def mirrored_strategy(request: pytest.FixtureRequest) -> td.distribute.MirroredStrategy:
    """MirroredStrategy on 1, 2 and 4 logical CPUs."""
    return request.getfixturevalue(request.param)


@pytest.fixture(params=MULTI_REPLICA_STRATEGIES)
def multi_replica(request: pytest.FixtureRequest) -> td.distribute.MirroredStrategy:
    """MirroredStrategy on 2 and 4 logical CPUs."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def replica_timeouts():
    """Lets a test change the barrier timeouts; restores the suite's values afterwards."""
    try:
        yield td.config.set_replica_timeouts
    finally:
        td.config.set_replica_timeouts(TEST_REPLICA_WARNING_SECONDS, TEST_REPLICA_TIMEOUT_SECONDS)
