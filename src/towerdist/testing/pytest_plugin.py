"""towerdist's pytest plugin: strategy fixtures, device markers, bounded replicas, MPI runs.

Installed with towerdist (a ``pytest11`` entry point): nothing to import or register.

Fixtures:
  ``replicas``: the number of replicas a test wants: ``@pytest.mark.replicas(n)``, else 2.
    ``@pytest.mark.replicas(1, 2, 4)`` runs the test once per count (ids ``1``, ``2``, ``4``),
    as does ``@pytest.mark.parametrize("replicas", [1, 2, 4], indirect=True)`` (which wins over
    the marker) or a parametrized ``replicas`` fixture in a ``conftest.py``. On a ``pytest.param``
    the marker chooses the count of a test that asks for ``mirrored_strategy`` by name
    (``request.getfixturevalue``), so one parametrization can mix it with other strategies.
  ``mirrored_strategy``: a ``MirroredStrategy`` over ``replicas`` devices: the first GPUs when
    at least that many (real or simulated) are present, else logical CPU devices. One strategy
    per count is kept for the whole session (its replica threads are reused).
  ``other_mirrored_strategy``: a second ``MirroredStrategy`` over 2 devices (chosen as for
    ``mirrored_strategy``), never one of the session's: for tests of what must not cross from
    one strategy to another (scopes, variables, optimizers). One per test module.

Markers (registered, so ``--strict-markers`` passes):
  ``replicas(n, ...)``: see the fixture.
  ``gpus(n)``: skipped, with the reason, unless ``n`` GPUs (real or simulated) are present.
  ``mpi(n)``: skipped unless the session runs under an MPI launcher with at least ``n`` ranks
    (``mpiexec -n 2 python -m pytest``).

What it changes in the session, and nothing else:

* the replica wait bounds (``td.config.set_replica_timeouts``): replicas wait for each other
  at most ``towerdist_replica_timeout`` seconds (an ini option; 60, or 20 under MPI) and
  warn after ``towerdist_replica_warning``, so a hang fails the test with the stall
  diagnosis naming the missing replicas instead of blocking CI;
* nothing of the devices a test sees: when a selected test runs ``mirrored_strategy`` on
  more CPU replicas than there are GPUs, the fixture's strategy runs on ``CPU:0`` ...
  ``CPU:<n-1>``, made usable by name only (``td.config.list_logical_devices()`` and a
  ``MirroredStrategy()`` a test builds itself are what ``python script.py`` gets);
* under an MPI launcher, the ranks agree on the collected tests and on the outcome of every
  phase (setup, call, teardown) of every test: a failure on any rank fails the test on every
  rank (rank 0 shows the others' failures), a skip on one rank skips it on every rank, and a
  collection error on any rank stops every rank, shown by rank 0, so the ranks stay in step.
  Each agreement waits at most ``towerdist_mpi_agreement_timeout`` seconds (300 by default;
  0: no bound) for the other ranks, then fails the test naming the missing ranks, stops the
  session and aborts the MPI job at exit. Only rank 0 prints the report. With
  ``TOWERDIST_MPI_REPORT_DIR`` set, each rank writes ``rank-<r>.json`` with its counts when
  the session ends (CI can check every rank rather than the launcher's exit status).

A malformed ``TOWERDIST_SIMULATE_GPUS`` stops the session with a usage error.

Example (``test_mine.py``)::

    import pytest
    import towerdist as td

    @pytest.mark.replicas(4)
    def test_sum(mirrored_strategy):
        result = mirrored_strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", 1.0))
        assert [float(x) for x in mirrored_strategy.experimental_local_results(result)] == [4.0] * 4

    @pytest.mark.replicas(1, 2, 4)
    def test_every_count(mirrored_strategy, replicas):
        assert mirrored_strategy.num_replicas_in_sync == replicas

    @pytest.mark.gpus(2)
    def test_on_two_gpus(mirrored_strategy):
        assert all("GPU" in d for d in mirrored_strategy.extended.worker_devices)
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

import towerdist as td
from towerdist._src import config as config_lib
from towerdist._src import mpi_runtime
from towerdist._src.backend import cupy_backend, simulation
from towerdist._src.device import DeviceSpec
from towerdist._src.testing.rank_agreement import AgreementError, RankAgreement

if TYPE_CHECKING:
    from pluggy import Result

__all__ = ["mirrored_strategy_for", "pytest_addoption", "pytest_configure", "pytest_generate_tests"]

_DEFAULT_REPLICAS = 2
_AGREEMENT_TIMEOUT = 300.0


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's ini options (bounds on replica waits inside tests, and on the ranks' agreements)."""
    parser.addini(
        "towerdist_replica_timeout", "seconds replicas may wait for each other in a test (0: never)", default=""
    )
    parser.addini("towerdist_replica_warning", "seconds after which waiting replicas warn", default="")
    parser.addini(
        "towerdist_mpi_agreement_timeout",
        "under MPI, seconds a rank waits for the others to finish a test phase (0: never)",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Registers the markers, bounds replica waits, and joins the other ranks under MPI."""
    config.addinivalue_line(
        "markers", "replicas(n, ...): the number of replicas of the mirrored_strategy fixture (several: one test each)"
    )
    config.addinivalue_line("markers", "gpus(n): needs n GPUs, real or simulated (skipped otherwise)")
    config.addinivalue_line("markers", "mpi(n): needs an MPI launcher with at least n ranks (skipped otherwise)")
    try:
        simulation.simulated_gpus_enabled()  # a malformed TOWERDIST_SIMULATE_GPUS stops the session here
    except ValueError as error:
        raise pytest.UsageError(str(error)) from error
    under_mpi = mpi_runtime.launcher_size() > 1
    timeout = _seconds(config, "towerdist_replica_timeout", 20.0 if under_mpi else 60.0)
    warning = _seconds(config, "towerdist_replica_warning", 5.0 if under_mpi else 20.0)
    td.config.set_replica_timeouts(warning_seconds=warning, timeout_seconds=timeout)
    config.stash[_BOUNDS] = (warning, timeout)
    if under_mpi:
        world = mpi_runtime.world()
        assert world is not None  # a launcher with several processes: world() returns the job or raises
        bound = _seconds(config, "towerdist_mpi_agreement_timeout", _AGREEMENT_TIMEOUT)
        config.stash[_AGREEMENT] = _MPIAgreement(RankAgreement(world, bound), config)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under MPI only rank 0 reports; the other ranks' failures reach it through the agreement."""
    agreement = session.config.stash.get(_AGREEMENT, None)
    if agreement is not None and agreement.rank != 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            session.config.pluginmanager.unregister(reporter)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``replicas`` marker with several counts runs the test once per count (an explicit parametrize wins)."""
    if "replicas" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("replicas")
    if marker is None or len(marker.args) < 2:
        return
    if any("replicas" in _argnames(mark) for mark in metafunc.definition.iter_markers("parametrize")):
        return
    metafunc.parametrize("replicas", [int(n) for n in marker.args], indirect=True)


def _argnames(parametrize: pytest.Mark) -> list[str]:
    names = parametrize.args[0] if parametrize.args else parametrize.kwargs.get("argnames", ())
    return [name.strip() for name in names.split(",")] if isinstance(names, str) else list(names)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only the tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips what the machine cannot run, and configures the logical CPUs the strategy fixtures need."""
    gpus = cupy_backend.device_count()
    ranks = mpi_runtime.launcher_size()
    cpus_needed = 1
    for item in items:
        marker = item.get_closest_marker("gpus")
        if marker is not None:
            wanted = int(marker.args[0]) if marker.args else 1
            if gpus < wanted:
                item.add_marker(pytest.mark.skip(reason=f"needs {wanted} GPU(s); {gpus} available"))
                continue
        marker = item.get_closest_marker("mpi")
        if marker is not None:
            wanted = int(marker.args[0]) if marker.args else 2
            if ranks < wanted:
                where = "not under an MPI launcher" if ranks == 1 else f"{ranks} ranks"
                item.add_marker(pytest.mark.skip(reason=f"needs mpiexec with at least {wanted} ranks; {where}"))
                continue
        replicas = _replicas_wanted(item)
        if "other_mirrored_strategy" in getattr(item, "fixturenames", ()):
            replicas = max(replicas, 2)
        if replicas > gpus:  # mirrored_strategy_for() runs it on logical CPUs
            cpus_needed = max(cpus_needed, replicas)
    if cpus_needed > 1:  # usable by the fixture's strategies, invisible to the tests' own (config.py)
        config_lib.reserve_cpus_by_name(cpus_needed)


@pytest.fixture
def replicas(request: pytest.FixtureRequest) -> int:
    """The number of replicas: the ``replicas`` marker, an indirect parameter, else 2."""
    if hasattr(request, "param"):
        return int(request.param)
    marker = request.node.get_closest_marker("replicas")
    return int(marker.args[0]) if marker is not None and marker.args else _DEFAULT_REPLICAS


@pytest.fixture
def mirrored_strategy(replicas: int) -> td.distribute.MirroredStrategy:
    """A ``MirroredStrategy`` over ``replicas`` GPUs if there are that many, else logical CPUs."""
    return mirrored_strategy_for(replicas)


@pytest.fixture(scope="module")
def other_mirrored_strategy() -> td.distribute.MirroredStrategy:
    """A second ``MirroredStrategy`` over 2 devices, not one of the session's (see the module's docstring)."""
    return td.distribute.MirroredStrategy(_devices_for(2))


@functools.lru_cache(maxsize=None)
def mirrored_strategy_for(n: int) -> td.distribute.MirroredStrategy:
    """The session's ``MirroredStrategy`` over ``n`` devices (GPUs when at least ``n``, else logical CPUs).

    Raises:
      pytest.UsageError: there are fewer than ``n`` logical CPU devices (configure more
        before the tests, or let the plugin do it).
    """
    return td.distribute.MirroredStrategy(_devices_for(n))


def _devices_for(n: int) -> list[str]:
    if cupy_backend.device_count() >= n:
        return [f"GPU:{i}" for i in range(n)]
    cpus = sum(config_lib.device_exists(DeviceSpec(device_type="CPU", device_index=i)) for i in range(n))
    if cpus < n:
        raise pytest.UsageError(
            f"mirrored_strategy needs {n} replicas but there are {cpus} logical CPU devices: configure at least {n} "
            f"with td.config.set_logical_device_configuration() before any test uses a device (or leave it to "
            f"towerdist's pytest plugin)."
        )
    return [f"CPU:{i}" for i in range(n)]


# --- agreement across MPI ranks ----------------------------------------------------------------


class _MPIAgreement:
    """Under an MPI launcher: agrees the collected tests and each test phase's outcome across the ranks."""

    def __init__(self, ranks: RankAgreement, config: pytest.Config) -> None:
        self.ranks = ranks
        self.rank, self.size = ranks.rank, ranks.size
        self.config = config
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.collect_errors: list[tuple[str, str]] = []  # (node id, error) of this rank's collection

    def agree_on_collection(self, session: pytest.Session) -> None:
        """Every rank learns every rank's collection errors and tests; an error or a difference stops every rank.

        The other ranks' errors become collection errors of this rank too (rank 0 prints them),
        so every rank stops with pytest's "errors during collection".
        """
        mine = (self.collect_errors, [item.nodeid for item in session.items])
        try:
            everyone = self.ranks.exchange("the end of collection", mine)
        except AgreementError as error:
            self._say(str(error))
            problems = [("<collection>", str(error))]
        else:
            problems = [
                (f"{nodeid} (on rank {rank} of {self.size})", text)
                for rank, (errors, _) in enumerate(everyone)
                if rank != self.rank
                for nodeid, text in errors
            ]
            if not any(errors for errors, _ in everyone) and any(ids != everyone[0][1] for _, ids in everyone):
                problems.append(("<collection>", _describe_differences([ids for _, ids in everyone])))
        for nodeid, text in problems:
            session.ihook.pytest_collectreport(report=pytest.CollectReport(nodeid, "failed", text, None))

    def agree(self, item: pytest.Item, report: pytest.TestReport) -> None:
        if self.ranks.broken is not None:  # the session is stopping: this rank's own outcome stands
            self._count(report)
            return
        mine = (report.outcome, str(report.longrepr) if report.failed else "", _skip_reason(report))
        try:
            outcomes = self.ranks.exchange(f"{item.nodeid} ({report.when})", mine)
        except AgreementError as error:
            self._say(str(error))
            report.outcome = "failed"
            report.longrepr = f"--- rank {self.rank} of {self.size} ({report.when}): ---\n{error}"
            item.session.shouldfail = "towerdist: the MPI ranks are out of step"
            self._count(report)
            return
        failed = [rank for rank, (outcome, _, _) in enumerate(outcomes) if outcome == "failed"]
        skipped = [rank for rank, (outcome, _, _) in enumerate(outcomes) if outcome == "skipped"]
        if failed:
            report.outcome = "failed"
            report.longrepr = "\n".join(
                f"--- rank {rank} of {self.size} ({report.when}): ---\n{outcomes[rank][1]}" for rank in failed
            )
        elif skipped and report.outcome == "passed":
            # Skipped elsewhere (e.g. a skipif on the rank): every rank skips, so every rank runs the same phases.
            rank = skipped[0]
            path, line, reason = outcomes[rank][2] or (str(item.path), 0, "skipped")
            report.outcome = "skipped"
            report.longrepr = (path, line, f"Skipped on rank {rank} of {self.size}: {reason}")
        self._count(report)

    def _count(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1

    def _say(self, message: str) -> None:
        """Writes ``message`` to this rank's terminal even if it does not report (ranks other than 0)."""
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        line = f"towerdist pytest plugin, rank {self.rank} of {self.size}: {message}\n"
        if capture is None:
            os.write(2, line.encode())
            return
        with capture.global_and_fixture_disabled():
            os.write(2, line.encode())


def _skip_reason(report: pytest.TestReport) -> tuple[str, int, str] | None:
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, line, reason = longrepr
        return str(path), int(line or 0), str(reason).removeprefix("Skipped: ")
    return None


def _describe_differences(everyone: list[list[str]]) -> str:
    """What each rank collected that rank 0 did not, and the reverse (node ids, in rank order)."""
    first = everyone[0]
    lines = []
    for rank, nodeids in enumerate(everyone[1:], start=1):
        if nodeids == first:
            continue
        extra = [n for n in nodeids if n not in set(first)]
        lacking = [n for n in first if n not in set(nodeids)]
        detail = f"{len(nodeids)} tests against rank 0's {len(first)}"
        if extra:
            detail += f"; only rank {rank} has {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        if lacking:
            detail += f"; rank {rank} lacks {', '.join(lacking[:5])}{' ...' if len(lacking) > 5 else ''}"
        if not extra and not lacking:
            detail += " (the same tests, in another order)"
        lines.append(f"rank {rank} collected {detail}")
    return (
        "The MPI ranks collected different tests: " + "; ".join(lines) + ". Every rank must collect the same tests in "
        "the same order (a skipif that depends on the rank is fine; a parametrization, -k or path that depends on it "
        "is not)."
    )


_AGREEMENT = pytest.StashKey[_MPIAgreement]()
_T = TypeVar("_T")  # what broadcast_from_rank_0 hands back
_BOUNDS = pytest.StashKey[tuple[float | None, float | None]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Result[pytest.CollectReport], None]:
    """Under MPI, records this rank's collection errors, for the agreement after collection."""
    outcome = yield
    agreement = collector.config.stash.get(_AGREEMENT, None)
    report = outcome.get_result()
    if agreement is not None and report.failed:
        agreement.collect_errors.append((report.nodeid, str(report.longrepr)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under MPI, the ranks agree on what they collected: an error or a difference on one rank stops every rank."""
    agreement = session.config.stash.get(_AGREEMENT, None)
    if agreement is not None:
        agreement.agree_on_collection(session)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, Result[pytest.TestReport], None]:
    """Under MPI, every rank's outcome of each phase (setup, call, teardown) becomes the same."""
    outcome = yield
    agreement = item.config.stash.get(_AGREEMENT, None)
    if agreement is not None:
        agreement.agree(item, outcome.get_result())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under MPI with ``TOWERDIST_MPI_REPORT_DIR``, writes this rank's counts."""
    agreement = session.config.stash.get(_AGREEMENT, None)
    directory = os.environ.get("TOWERDIST_MPI_REPORT_DIR")
    if agreement is not None and directory:
        summary = dict(agreement.counts, exitstatus=int(exitstatus), rank=agreement.rank, size=agreement.size)
        with open(os.path.join(directory, f"rank-{agreement.rank}.json"), "w") as f:
            json.dump(summary, f)


def replica_bounds(config: pytest.Config) -> tuple[float | None, float | None]:
    """``(warning, timeout)`` seconds the plugin set for this session."""
    return config.stash[_BOUNDS]


def broadcast_from_rank_0(config: pytest.Config, value: _T) -> _T:
    """Rank 0's ``value`` on every rank (under MPI; the value itself otherwise).

    Raises:
      AgreementError: a rank did not get there within ``towerdist_mpi_agreement_timeout``.
    """
    agreement = config.stash.get(_AGREEMENT, None)
    return value if agreement is None else agreement.ranks.exchange("broadcast_from_rank_0()", value)[0]


def _replicas_wanted(item: pytest.Item) -> int:
    """How many replicas the test's ``mirrored_strategy`` (or ``replicas``) asks for (0: it uses neither).

    A ``replicas`` marker counts even where the test asks for the fixture by name only.
    """
    marker = item.get_closest_marker("replicas")
    if "replicas" not in getattr(item, "fixturenames", ()) and marker is None:
        return 0
    wanted = _DEFAULT_REPLICAS
    if marker is not None and marker.args:
        wanted = max(int(n) for n in marker.args)
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "replicas" in callspec.params:
        wanted = int(callspec.params["replicas"])
    return wanted


def _seconds(config: pytest.Config, name: str, default: float) -> float | None:
    text = str(config.getini(name)).strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise pytest.UsageError(
            f"The ini option {name} takes a number of seconds (0: no bound). Got {text!r}."
        ) from None
    if value < 0:
        raise pytest.UsageError(f"The ini option {name} takes a number of seconds (0: no bound). Got {text!r}.")
    return None if value == 0 else value
