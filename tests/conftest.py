"""Shared test setup: 8 logical CPU devices, named strategy fixtures, GPU/MPI markers.

Tests marked ``mpi`` are multi-worker test bodies: they run in the default suite (one
worker) and again under ``mpiexec -n 2 python -m pytest -m mpi`` (``.ci/run``). Under a
launcher, every phase of every test agrees its outcome across the ranks: a failure on one
rank fails the test on every rank (rank 0 shows the other ranks' failures), so the ranks
never fall out of step, and each rank writes a summary to ``$TOWERDIST_MPI_REPORT_DIR``
(``.ci/run`` checks them rather than trusting mpiexec's exit status).

Strategy fixtures are session-scoped so their replica threads are reused across tests
(as a training script would); tests that break a strategy on purpose check that it is
usable afterwards, which is part of the contract.

Replica barrier timeouts are on for the whole suite: a replica that never arrives fails
the test with ``DeadlineExceededError`` instead of hanging it (pytest-timeout is the
outer bound).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

import pytest

import towerdist as td
from towerdist._src.backend import cupy_backend
from towerdist._src.multi_worker import mpi_runtime

NUM_CPUS = 8
TEST_REPLICA_WARNING_SECONDS = 20.0
TEST_REPLICA_TIMEOUT_SECONDS = 60.0
MPI_WARNING_SECONDS = 5.0
MPI_TIMEOUT_SECONDS = 20.0


class _MPIAgreement:
    """Under an MPI launcher: agrees test outcomes across the ranks (a duplicate of COMM_WORLD)."""

    def __init__(self) -> None:
        world = mpi_runtime.world()
        assert world is not None
        self.rank, self.size = world.rank, world.size
        self._comm = world.MPI.COMM_WORLD.Dup()
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}

    def broadcast_path(self, path: Any) -> Any:
        """Rank 0's ``path`` on every rank (the ranks run on one machine)."""
        return type(path)(self._comm.bcast(str(path), root=0))

    def agree(self, report: pytest.TestReport) -> None:
        text = str(report.longrepr) if report.failed else ""
        outcomes = self._comm.allgather((report.outcome, text))
        failed = [rank for rank, (outcome, _) in enumerate(outcomes) if outcome == "failed"]
        if failed and not report.failed:
            report.outcome = "failed"
        if failed:
            report.longrepr = "\n".join(
                f"--- rank {rank} of {self.size} ({report.when}): ---\n{outcomes[rank][1]}" for rank in failed
            )
        if report.when == "call" or report.outcome != "passed":
            self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1


_MPI: _MPIAgreement | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    if _MPI is not None:
        _MPI.agree(outcome.get_result())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    directory = os.environ.get("TOWERDIST_MPI_REPORT_DIR")
    if _MPI is not None and directory:
        summary = dict(_MPI.counts, exitstatus=int(exitstatus), rank=_MPI.rank, size=_MPI.size)
        with open(os.path.join(directory, f"rank-{_MPI.rank}.json"), "w") as f:
            json.dump(summary, f)


def pytest_report_header(config: pytest.Config) -> str:
    from towerdist.testing import simulated_gpus_enabled

    if simulated_gpus_enabled():
        return (
            f"GPUs: {cupy_backend.device_count()} SIMULATED (towerdist.testing, TOWERDIST_SIMULATE_GPUS): the GPU "
            f"tests check placement and ordering logic on CPU arrays; this is not GPU verification"
        )
    return f"GPUs: {cupy_backend.device_count()} real"


def pytest_configure(config: pytest.Config) -> None:
    global _MPI
    if mpi_runtime.launcher_size() > 1:
        _MPI = _MPIAgreement()
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * NUM_CPUS)
    if _MPI is not None:
        # A test failing on one rank leaves the others in a collective until this bound.
        td.config.set_replica_timeouts(warning_seconds=MPI_WARNING_SECONDS, timeout_seconds=MPI_TIMEOUT_SECONDS)
        return
    td.config.set_replica_timeouts(
        warning_seconds=TEST_REPLICA_WARNING_SECONDS, timeout_seconds=TEST_REPLICA_TIMEOUT_SECONDS
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = cupy_backend.device_count()
    for item in items:
        if item.get_closest_marker("gpu") and gpus == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU with cupy; none is available"))
        marker = item.get_closest_marker("multi_gpu")
        if marker is not None:
            needed = marker.args[0] if marker.args else 2
            if gpus < needed:
                item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA GPUs; {gpus} available"))
        if item.get_closest_marker("launches_mpi") and not _mpiexec():
            item.add_marker(pytest.mark.skip(reason='needs mpiexec and mpi4py (pip install "towerdist[mpi-mpich]")'))


def _mpiexec() -> str | None:
    """The mpiexec next to this Python (the mpich extra), if mpi4py is installed too."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    candidate = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "mpiexec")
    return candidate if os.access(candidate, os.X_OK) else None


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


@functools.lru_cache(maxsize=None)
def multi_worker(local_replicas: int) -> td.distribute.MultiWorkerMirroredStrategy:
    """A cached MultiWorkerMirroredStrategy with ``local_replicas`` logical CPUs per worker."""
    return td.distribute.MultiWorkerMirroredStrategy._from_local_devices(cpus(local_replicas))


@pytest.fixture(params=[1, 2], ids=lambda n: f"{n}local")
def multi_worker_strategy(request: pytest.FixtureRequest) -> td.distribute.MultiWorkerMirroredStrategy:
    """MultiWorkerMirroredStrategy with 1 and 2 local replicas per worker (workers: 1, or the launcher's)."""
    return multi_worker(request.param)


@pytest.fixture
def shared_tmp_path(tmp_path):
    """A fresh directory that every rank sees (rank 0's ``tmp_path`` under mpiexec)."""
    if _MPI is None:
        return tmp_path
    return _MPI.broadcast_path(tmp_path)


@pytest.fixture
def replica_timeouts():
    """Lets a test change the barrier timeouts; restores the suite's values afterwards."""
    try:
        yield td.config.set_replica_timeouts
    finally:
        if _MPI is not None:
            td.config.set_replica_timeouts(MPI_WARNING_SECONDS, MPI_TIMEOUT_SECONDS)
        else:
            td.config.set_replica_timeouts(TEST_REPLICA_WARNING_SECONDS, TEST_REPLICA_TIMEOUT_SECONDS)
