"""Shared test setup: 8 logical CPU devices and the project's strategies other than mirrored.

towerdist's own pytest plugin (``towerdist.testing.pytest_plugin``, installed with the
package) is the one source of mirrored strategies: ``mirrored_strategy`` (with ``replicas``:
``@pytest.mark.replicas(4)``, or ``@pytest.mark.replicas(1, 2, 4)`` for one test per count),
``other_mirrored_strategy`` and ``mirrored_strategy_for(n)``; it also gives the ``gpus(n)``
and ``mpi(n)`` markers, bounded replica waits, and the agreement of outcomes across MPI
ranks. Here: the default, one-device, central-storage and multi-worker strategies,
``any_strategy`` (each kind, the mirrored ones the plugin's), and ``mirrored_param(n)`` to
name the plugin's mirrored strategy among other strategies in a parametrization. Tests marked ``multi_worker`` are multi-worker test
bodies: they run in the default suite (one worker) and again under
``mpiexec -n 2 python -m pytest -m multi_worker`` (``.ci/run``).

Strategy fixtures are session-scoped so their replica threads are reused across tests
(as a training script would); tests that break a strategy on purpose check that it is
usable afterwards, which is part of the contract.

Replica barrier timeouts are on for the whole suite: a replica that never arrives fails
the test with ``DeadlineExceededError`` instead of hanging it (pytest-timeout is the
outer bound).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

_PLUGIN = "towerdist.testing.pytest_plugin"


def _plugin_loads_itself() -> bool:
    """Whether pytest loads towerdist's plugin through the installed package's entry point."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(point.value == _PLUGIN for point in importlib.metadata.entry_points(group="pytest11"))


# From a plain checkout (``PYTHONPATH=src python -m pytest``) the entry point is not installed:
# load the plugin here, so that its markers and fixtures exist; never twice. (Registered for
# assertion rewriting before this file imports it, as pytest does for plugins it loads.)
pytest_plugins = [] if _plugin_loads_itself() else [_PLUGIN]
if pytest_plugins:
    pytest.register_assert_rewrite(_PLUGIN)

import towerdist as td  # noqa: E402  (after the plugin's registration above)
from towerdist._src.backend import cupy_backend  # noqa: E402
from towerdist._src.multi_worker.launcher import find_mpiexec  # noqa: E402
from towerdist.testing.pytest_plugin import broadcast_from_rank_0, replica_bounds  # noqa: E402

NUM_CPUS = 8
# The programs tests run in child processes (under mpiexec or plain Python): not tests, so not under tests/.
TEST_PROGRAMS = Path(__file__).resolve().parents[1] / "tools" / "test_programs"
# The replica wait bounds towerdist's pytest plugin sets for a one-process session.
TEST_REPLICA_WARNING_SECONDS = 20.0
TEST_REPLICA_TIMEOUT_SECONDS = 60.0


def load_program(name: str) -> types.ModuleType:
    """The test program ``tools/test_programs/<name>.py`` as a module (for a test that also calls its functions)."""
    module = sys.modules.get(f"test_programs.{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"test_programs.{name}", TEST_PROGRAMS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def pytest_report_header(config: pytest.Config) -> str:
    from towerdist.testing import simulated_gpus_enabled

    if simulated_gpus_enabled():
        return (
            f"GPUs: {cupy_backend.device_count()} SIMULATED (towerdist.testing, TOWERDIST_SIMULATE_GPUS): the GPU "
            f"tests check placement and ordering logic on CPU arrays; this is not GPU verification"
        )
    return f"GPUs: {cupy_backend.device_count()} real"


def pytest_configure(config: pytest.Config) -> None:
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * NUM_CPUS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("launches_mpi") and not _mpiexec():
            item.add_marker(pytest.mark.skip(reason='needs mpiexec and mpi4py (pip install "towerdist[mpi-mpich]")'))


def _mpiexec() -> str | None:
    """The mpiexec to launch test jobs with (next to this Python, else on PATH), if mpi4py is installed too."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return find_mpiexec()


def cpus(n: int) -> list[str]:
    """The names of the first ``n`` logical CPU devices."""
    return [f"CPU:{i}" for i in range(n)]


@pytest.fixture(scope="session")
def default() -> td.distribute.Strategy:
    return td.distribute.get_strategy()


@pytest.fixture(scope="session")
def one_device_cpu() -> td.distribute.OneDeviceStrategy:
    return td.distribute.OneDeviceStrategy("/cpu:0")


@pytest.fixture(scope="session")
def central_storage_2cpu() -> td.distribute.experimental.CentralStorageStrategy:
    return td.distribute.experimental.CentralStorageStrategy(compute_devices=cpus(2), parameter_device="CPU:0")


def mirrored_param(n: int) -> Any:
    """The plugin's ``mirrored_strategy`` over ``n`` replicas, as a parameter among strategies named by fixture (``request.getfixturevalue``)."""
    return pytest.param("mirrored_strategy", marks=pytest.mark.replicas(n), id=f"mirrored_{n}cpu")


@pytest.fixture(params=["default", "one_device_cpu", mirrored_param(1), mirrored_param(2), mirrored_param(4)])
def any_strategy(request: pytest.FixtureRequest) -> td.distribute.Strategy:
    """Every kind of strategy, one test each: the default, one device, and the plugin's mirrored on 1, 2, 4."""
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
def shared_tmp_path(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """A fresh directory that every rank sees (rank 0's ``tmp_path`` under mpiexec)."""
    return type(tmp_path)(broadcast_from_rank_0(request.config, str(tmp_path)))


@pytest.fixture
def replica_timeouts(request: pytest.FixtureRequest):
    """Lets a test change the barrier timeouts; restores the session's values afterwards."""
    try:
        yield td.config.set_replica_timeouts
    finally:
        warning, timeout = replica_bounds(request.config)
        td.config.set_replica_timeouts(warning, timeout)
