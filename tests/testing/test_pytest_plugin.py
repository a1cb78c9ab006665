"""towerdist's pytest plugin, exercised as a user's test suite would use it (pytest's ``pytester``).

Each test writes a small test file into a fresh directory and runs pytest on it in a
subprocess (the plugin sets process-wide replica timeouts and device configurations).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import _mpiexec

pytest_plugins = ["pytester"]

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(autouse=True)
def this_checkouts_towerdist(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest subprocesses import this checkout's towerdist (a relative PYTHONPATH breaks in their directory)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))

USER_TESTS = '''
import pytest
import towerdist as td


def test_default_is_two_replicas(mirrored_strategy):
    assert mirrored_strategy.num_replicas_in_sync == 2


@pytest.mark.replicas(4)
def test_marker_chooses_the_count(mirrored_strategy):
    result = mirrored_strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", 1.0))
    assert [float(x) for x in mirrored_strategy.experimental_local_results(result)] == [4.0] * 4


@pytest.mark.parametrize("replicas", [1, 3], indirect=True)
def test_parametrized_counts(mirrored_strategy, replicas):
    assert mirrored_strategy.num_replicas_in_sync == replicas
    assert all("CPU" in d for d in mirrored_strategy.extended.worker_devices)


@pytest.mark.gpus(2)
def test_needs_two_gpus(mirrored_strategy):
    assert False, "must be skipped on a machine without GPUs"


@pytest.mark.mpi(2)
def test_needs_mpi():
    assert False, "must be skipped outside mpiexec"
'''


def test_fixtures_markers_and_skips_with_reasons(pytester: pytest.Pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("--strict-markers", "-rs", timeout=120)
    result.assert_outcomes(passed=4, skipped=2)
    result.stdout.fnmatch_lines(["*needs 2 GPU(s); 0 available*", "*needs mpiexec with at least 2 ranks*"])


SEVERAL_COUNTS = '''
import pytest
import towerdist as td

pytestmark = pytest.mark.replicas(1, 3)


def test_module_counts(mirrored_strategy, replicas):
    assert mirrored_strategy.num_replicas_in_sync == replicas


@pytest.mark.replicas(2, 4)
def test_own_counts_win(mirrored_strategy, replicas):
    assert mirrored_strategy.num_replicas_in_sync == replicas


@pytest.mark.replicas(5)
def test_own_single_count_wins(mirrored_strategy):
    assert mirrored_strategy.num_replicas_in_sync == 5


@pytest.mark.parametrize("replicas", [6], indirect=True)
def test_parametrize_wins(mirrored_strategy):
    assert mirrored_strategy.num_replicas_in_sync == 6


def test_no_replicas_no_parametrization():
    pass


@pytest.mark.parametrize("name", ["one_device", pytest.param("mirrored_strategy", marks=pytest.mark.replicas(7), id="m7")])
def test_by_name(request, name):
    if name == "one_device":
        return
    strategy = request.getfixturevalue(name)
    assert strategy.num_replicas_in_sync == 7
    assert strategy.extended.worker_devices[-1].endswith("CPU:6")
'''


def test_a_replicas_marker_with_several_counts_runs_the_test_per_count(pytester: pytest.Pytester):
    pytester.makepyfile(test_counts=SEVERAL_COUNTS)
    result = pytester.runpytest_subprocess("--strict-markers", "-v", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines_random([
        "*test_module_counts?1? PASSED*", "*test_module_counts?3? PASSED*",
        "*test_own_counts_win?2? PASSED*", "*test_own_counts_win?4? PASSED*",
        "*test_own_single_count_wins PASSED*", "*test_parametrize_wins?6? PASSED*",
        "*test_no_replicas_no_parametrization PASSED*", "*test_by_name?m7? PASSED*",
    ])  # fmt: skip


def test_a_hanging_test_fails_with_the_stall_diagnosis(pytester: pytest.Pytester):
    pytester.makeini("[pytest]\ntowerdist_replica_timeout = 1\ntowerdist_replica_warning = 0.5\n")
    pytester.makepyfile(test_hang='''
import threading
import towerdist as td

stuck = threading.Event()


def test_one_replica_never_reaches_the_merge_call(mirrored_strategy):
    def step():
        ctx = td.distribute.get_replica_context()
        if ctx.replica_id_in_sync_group == 1:
            stuck.wait(20)  # a replica stuck in its own code, far longer than the 1 s bound
            return None
        return ctx.merge_call(lambda strategy: None)

    try:
        mirrored_strategy.run(step)
    finally:
        stuck.set()
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*DeadlineExceededError*", "*replica 1*"])


def test_strict_markers_accepts_the_plugins_markers(pytester: pytest.Pytester):
    pytester.makepyfile(test_marks='''
import pytest

@pytest.mark.replicas(2)
@pytest.mark.gpus(1)
@pytest.mark.mpi(2)
def test_marked():
    pass
''')
    result = pytester.runpytest_subprocess("--strict-markers", "--collect-only", "-q", timeout=60)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_marked*"])


NO_REPLICA_TESTS = """
import towerdist as td


def test_a_strategy_built_by_the_test_is_the_scripts():
    cpu = td.config.list_physical_devices("CPU")[0]
    assert td.config.get_logical_device_configuration(cpu) is None
    assert td.distribute.MirroredStrategy().num_replicas_in_sync == 1
"""

THREE_REPLICAS = """
import pytest
import towerdist as td


@pytest.mark.replicas(3)
def test_three(mirrored_strategy):
    assert mirrored_strategy.num_replicas_in_sync == 3


def test_a_strategy_the_test_builds_is_what_a_script_gets():
    # in the same session as a 3-replica fixture test
    assert len(td.config.list_logical_devices("CPU")) == 1
    assert td.distribute.MirroredStrategy().num_replicas_in_sync == 1
"""

ON_GPUS = """
import towerdist as td


def test_on_gpus(mirrored_strategy):
    assert all("GPU" in d for d in mirrored_strategy.extended.worker_devices)
    assert len(td.config.list_logical_devices("CPU")) == 1
"""


def test_without_replica_tests_the_plugin_configures_no_logical_devices(pytester: pytest.Pytester):
    # The plugin split the CPU into 2 logical devices in every session, so a MirroredStrategy()
    # had 2 replicas under pytest and 1 under `python script.py`.
    pytester.makepyfile(test_plain=NO_REPLICA_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)


def test_replica_tests_get_their_cpus_and_the_tests_own_strategies_are_unchanged(pytester: pytest.Pytester):
    # The plugin split the CPU for the whole session: a MirroredStrategy() the test built got 3 replicas.
    pytester.makepyfile(test_three=THREE_REPLICAS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2)


SELECTED_BY_K = """
import towerdist as td

def test_uses_fixture(mirrored_strategy):
    assert mirrored_strategy.num_replicas_in_sync == 2

def test_user_builds_own():
    assert td.distribute.MirroredStrategy().num_replicas_in_sync == 1
"""


def test_a_test_deselected_with_k_configures_nothing(pytester: pytest.Pytester):
    # The plugin counted the tests -k left out: test_user_builds_own failed (2 == 1) when selected by -k
    # and passed when selected by its node id.
    pytester.makepyfile(test_selection=SELECTED_BY_K)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "user_builds_own", timeout=120)
    result.assert_outcomes(passed=1, deselected=1)


def test_replica_tests_on_gpus_configure_no_logical_cpus(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TOWERDIST_SIMULATE_GPUS", "2")
    pytester.makepyfile(test_gpus=ON_GPUS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)


def test_a_malformed_simulation_variable_stops_the_session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    # It read as "no GPU": gpus(n) tests were skipped as "0 available".
    monkeypatch.setenv("TOWERDIST_SIMULATE_GPUS", "true")
    pytester.makepyfile(test_marks=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(
        ["*TOWERDIST_SIMULATE_GPUS must be a positive number*Got TOWERDIST_SIMULATE_GPUS='true'*"]
    )


def docs_plugin_example() -> str:
    """The user's test file in docs/testing.md's section on the plugin."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    section = text[text.index("## The pytest plugin") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


@pytest.mark.parametrize(("gpus", "passed", "skipped"), [("", 7, 2), ("4", 8, 1)], ids=["cpus", "4-simulated-gpus"])
def test_the_docs_plugin_example_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, gpus: str, passed: int, skipped: int
):
    # On 4 simulated GPUs its `==` compared arrays on different GPUs and failed.
    monkeypatch.setenv("TOWERDIST_SIMULATE_GPUS", gpus)
    pytester.makepyfile(test_docs_example=docs_plugin_example())
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=passed, skipped=skipped)


def test_the_projects_own_suite_collects_from_a_plain_checkout():
    # `PYTHONPATH=src python -m pytest` with no installed entry point failed to collect:
    # "'gpus' not found in `markers`". The suite's conftest loads the plugin then.
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(root / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_timeout", "-p", "no:cacheprovider", "--collect-only", "-q",
         "tests/backend/test_gpu.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests/backend/test_gpu.py::test_cupy_backend_places_arrays_on_the_device" in done.stdout


# --- under mpiexec -n 2 ---------------------------------------------------------------------------


def run_under_mpi(directory: Path, *args: str, timeout: float = 60.0) -> tuple[str, dict[int, dict], float]:
    """``mpiexec -n 2 python -m pytest`` in ``directory`` with the plugin; its output, each rank's summary, seconds."""
    mpiexec = _mpiexec()
    assert mpiexec is not None
    reports = directory / "reports"
    reports.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "TOWERDIST_MPI_REPORT_DIR": str(reports),
    }
    start = time.monotonic()
    done = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, "-m", "pytest", "-p", "towerdist.testing.pytest_plugin",
         "-p", "no:cacheprovider", "-q", "-rs", *args],
        cwd=directory, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    seconds = time.monotonic() - start
    summaries = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in reports.glob("rank-*.json")}
    return done.stdout + done.stderr, summaries, seconds


@pytest.mark.launches_mpi
def test_under_mpi_a_test_skipped_on_one_rank_is_skipped_on_every_rank(tmp_path):
    # Rank 1 skipped at setup and went on to the teardown while rank 0 ran the test: the ranks'
    # agreements paired different phases and the session hung.
    (tmp_path / "test_skip.py").write_text(
        "import pytest\n"
        "from mpi4py import MPI\n"
        "\n"
        "@pytest.mark.skipif(MPI.COMM_WORLD.Get_rank() == 1, reason='not on rank 1')\n"
        "def test_skipped_on_rank_1():\n"
        "    pass\n"
        "\n"
        "def test_after():\n"
        "    pass\n"
    )
    output, summaries, _ = run_under_mpi(tmp_path)
    assert "Skipped on rank 1 of 2: not on rank 1" in output, output
    assert "1 passed, 1 skipped" in output, output
    for rank in (0, 1):
        assert summaries[rank] == {"passed": 1, "failed": 0, "skipped": 1, "exitstatus": 0, "rank": rank, "size": 2}


@pytest.mark.launches_mpi
def test_under_mpi_a_collection_error_on_one_rank_is_shown_and_stops_every_rank(tmp_path):
    # Rank 1 failed to collect and stopped; its error was never printed (only rank 0 reports)
    # and rank 0 waited for it at the first test forever.
    (tmp_path / "test_collect.py").write_text(
        "from mpi4py import MPI\n"
        "\n"
        "if MPI.COMM_WORLD.Get_rank() == 1:\n"
        "    raise ImportError('rank 1 cannot import this module')\n"
        "\n"
        "def test_fine():\n"
        "    pass\n"
    )
    output, summaries, _ = run_under_mpi(tmp_path)
    assert "ERROR collecting test_collect.py (on rank 1 of 2)" in output, output
    assert "ImportError: rank 1 cannot import this module" in output, output
    assert "Interrupted: 1 error during collection" in output, output
    assert sorted(summaries) == [0, 1], output
    assert all(summary["exitstatus"] != 0 and summary["passed"] == 0 for summary in summaries.values()), summaries


@pytest.mark.launches_mpi
def test_under_mpi_ranks_that_collect_different_tests_stop_naming_the_difference(tmp_path):
    (tmp_path / "test_differ.py").write_text(
        "import pytest\n"
        "from mpi4py import MPI\n"
        "\n"
        "@pytest.mark.parametrize('n', range(MPI.COMM_WORLD.Get_rank() + 1))\n"
        "def test_per_rank(n):\n"
        "    pass\n"
    )
    output, summaries, _ = run_under_mpi(tmp_path)
    assert "The MPI ranks collected different tests: rank 1 collected 2 tests against rank 0's 1" in output, output
    assert "only rank 1 has test_differ.py::test_per_rank[1]" in output, output
    assert all(summary["exitstatus"] != 0 and summary["passed"] == 0 for summary in summaries.values()), summaries


@pytest.mark.launches_mpi
def test_under_mpi_a_rank_stuck_in_a_test_fails_it_within_the_agreement_bound(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ntowerdist_mpi_agreement_timeout = 2\n")
    (tmp_path / "test_stuck.py").write_text(
        "import threading\n"
        "from mpi4py import MPI\n"
        "\n"
        "def test_rank_1_is_stuck():\n"
        "    if MPI.COMM_WORLD.Get_rank() == 1:\n"
        "        threading.Event().wait(100)  # stuck in its own code, far past the 2 s bound\n"
        "\n"
        "def test_never_reached():\n"
        "    pass\n"
    )
    output, summaries, seconds = run_under_mpi(tmp_path, timeout=90)
    assert "rank(s) 1 did not reach test_stuck.py::test_rank_1_is_stuck (call) within 2 s" in output, output
    assert "the MPI ranks are out of step" in output and "passed" not in output, output
    assert summaries[0]["failed"] == 1, summaries  # rank 1 never ends its test: the job's abort ends it
    assert seconds < 60, output


@pytest.mark.launches_mpi
def test_under_mpi_a_multi_worker_strategy_has_one_replica_per_worker(tmp_path):
    # The plugin split every session's CPU into 2 logical devices, so each worker ran 2 replicas: 4 in all.
    (tmp_path / "test_workers.py").write_text(
        "import pytest\n"
        "import towerdist as td\n"
        "\n"
        "@pytest.mark.mpi(2)\n"
        "def test_two_workers():\n"
        "    assert td.distribute.MultiWorkerMirroredStrategy().num_replicas_in_sync == 2\n"
    )
    output, summaries, _ = run_under_mpi(tmp_path)
    assert "1 passed" in output, output
    assert [summaries[rank]["passed"] for rank in (0, 1)] == [1, 1], summaries
