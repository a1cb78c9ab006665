"""MultiWorkerMirroredStrategy across real processes: failures end the job, never hang it.

Each test starts ``mpiexec -n 2 python tools/test_programs/mpi_child.py <scenario>`` (or plain Python
processes) with a hard subprocess timeout, and checks what every rank printed (mpiexec's
exit status alone is not trusted: with ``os._exit(0)`` on one rank it can be 0 although
another rank was killed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import towerdist as td

from conftest import TEST_PROGRAMS, _mpiexec

CHILD = TEST_PROGRAMS / "mpi_child.py"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.launches_mpi


def run_mpi(*args: str, timeout: float = 60.0) -> tuple[dict[int, list], str, float, int]:
    """Runs the child under ``mpiexec -n 2``; returns each rank's results, the output, the seconds and mpiexec's rc.

    The output of a rank the job's abort kills may be cut short (hydra stops forwarding it):
    tests read what the ranks reported in their files, and the output only for messages.
    """
    mpiexec = _mpiexec()
    assert mpiexec is not None
    with tempfile.TemporaryDirectory() as results_dir:
        start = time.monotonic()
        done = subprocess.run(
            [mpiexec, "-n", "2", sys.executable, str(CHILD), *args],
            capture_output=True, text=True, timeout=timeout, env={**os.environ, "MPI_CHILD_RESULTS": results_dir},
        )
        seconds = time.monotonic() - start
        results: dict[int, list] = {}
        for path in sorted(Path(results_dir).glob("rank-*.jsonl")):
            for line in path.read_text().splitlines():
                fields = json.loads(line)
                results.setdefault(fields["rank"], []).append(fields)
    return results, done.stdout + done.stderr, seconds, done.returncode


def test_a_stuck_rank_is_named_within_the_timeout_and_the_job_ends(tmp_path):
    results, output, seconds, returncode = run_mpi("stuck", timeout=50)
    first, then = results[0]
    assert first["outcome"] == "DeadlineExceededError" and first["missing"] == [1], output
    assert 2.0 <= first["seconds"] < 3.5, first  # the 2 s timeout, plus at most ~1 s
    assert "rank(s) 1 did not reach ReplicaContext.all_reduce()" in first["message"]
    assert then["outcome"] == "then UnavailableError" and "broken" in then["message"]
    assert 1 not in results  # rank 1 (asleep for 60 s) never woke up: the job was aborted
    assert seconds < 20, output
    assert returncode != 0


def test_a_timeout_of_zero_or_less_means_no_bound_as_in_tensorflow():
    # TensorFlow 2.21, two workers, worker 1 six seconds late: timeout_seconds=-1 and 0 both
    # return [2.] after 6 s (its collective ops schedule a timeout only when it is positive);
    # timeout_seconds=2 raises DeadlineExceededError after 2 s.
    results, output, _, _ = run_mpi("unbounded", timeout=50)
    (rank0,), (rank1,) = results[0], results[1]
    for result, seconds in rank0["results"]:
        assert result == [2.0] * 4, output
        assert seconds > 1.0  # waited for rank 1, past the 0.5 s bounds that do not apply
    assert [r for r, _ in rank1["results"]] == [[2.0] * 4] * 2


def test_without_a_timeout_a_late_rank_is_named_in_stall_warnings():
    results, output, _, _ = run_mpi("slow", timeout=50)
    (rank0,), (rank1,) = results[0], results[1]
    assert rank0["result"] == rank1["result"] == [2.0] * 4, output  # the collective completed
    assert len(rank0["warnings"]) >= 1, output
    assert "rank(s) 1 have not reached it" in rank0["warnings"][0]
    # collective #0 is the strategy's creation (the workers tell each other their devices)
    assert "ReplicaContext.all_reduce() (collective #1)" in rank0["warnings"][0]
    assert rank1["warnings"] == []  # rank 1 arrived last: it never waited


def test_an_uncaught_exception_on_one_rank_ends_the_job(tmp_path):
    results, output, seconds, returncode = run_mpi("uncaught", timeout=50)
    assert [r["outcome"] for r in results[1]] == ["raising"], output
    assert [r["outcome"] for r in results[0]] == ["entering all_reduce"], output  # never returned
    assert seconds < 20, output
    assert returncode != 0


def test_the_traceback_of_an_uncaught_exception_survives_the_abort_every_time():
    # hydra stops forwarding a rank's output once the job aborts: before the abort waited for the
    # launcher to read the pipes, the traceback was cut (0-177 bytes) in about 1 run in 8.
    runs = 20
    start = time.monotonic()
    for run in range(runs):
        _, output, _, returncode = run_mpi("uncaught", timeout=30)
        assert returncode != 0, output
        assert "RuntimeError: rank 1 failed on purpose" in output, f"run {run + 1} of {runs} lost the traceback:\n{output}"
        assert "towerdist: rank 1 of 2 aborts the MPI job: uncaught RuntimeError" in output, f"run {run + 1}:\n{output}"
    assert time.monotonic() - start < 60


def test_a_rank_that_exits_early_makes_the_others_raise_instead_of_waiting():
    results, output, seconds, _ = run_mpi("exit", timeout=50)
    (rank0,) = results[0]
    assert rank0["outcome"] == "AbortedError" and rank0["ranks"] == [1], output
    assert "rank(s) 1 ended their program without reaching ReplicaContext.all_reduce()" in rank0["message"]
    assert rank0["seconds"] < 5
    assert seconds < 20, output


def test_an_interrupted_wait_breaks_the_communication_instead_of_pairing_stale_messages():
    results, output, _, _ = run_mpi("interrupted", timeout=50)
    (rank0,) = results[0]
    assert rank0["outcome"].startswith("UnavailableError"), output
    assert "interrupted on rank 0 by ReplicaStallWarning" in rank0["outcome"]


def test_creating_the_strategy_is_bounded_by_the_timeout():
    results, output, seconds, _ = run_mpi("late_start", timeout=50)
    (rank0,) = results[0]
    assert rank0["outcome"] == "DeadlineExceededError", output
    assert 2.0 <= rank0["seconds"] < 3.5
    assert "every process must create it" in rank0["message"]
    assert seconds < 20, output  # rank 1, asleep for 30 s, was torn down


def test_a_killed_rank_does_not_leave_the_others_waiting(tmp_path):
    results, output, seconds, returncode = run_mpi("killed", timeout=50)
    assert all(r["outcome"] != "all_reduce returned" for r in results.get(0, []))
    assert 1 not in results
    assert seconds < 20, output
    assert returncode != 0


def test_a_rank_failing_mid_save_leaves_the_previous_checkpoint(tmp_path):
    results, output, _, _ = run_mpi("failed_save", str(tmp_path), timeout=60)
    (rank0,), (rank1,) = results[0], results[1]
    assert rank1["outcome"] == "OSError", output  # its own error
    assert rank0["outcome"] == "AbortedError", output  # the chief names rank 1 and writes nothing
    for rank in (rank0, rank1):
        assert rank["latest"] == rank["first"]
        assert rank["restored"] == [1.0, 1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-2")) == []


@pytest.mark.parametrize("local", [1, 2])
def test_a_checkpoint_saved_by_two_workers_restores_on_one(tmp_path, local):
    results, output, _, _ = run_mpi("save", str(tmp_path), timeout=60)
    (rank0,), (rank1,) = results[0], results[1]
    assert rank0["path"] == rank1["path"] and rank0["w"] == rank1["w"], output
    # Both workers' gradients (1 and 2) were summed: w = arange(4) - 0.5 * 3.
    np.testing.assert_allclose(rank0["w"], np.arange(4) - 1.5)
    strategy = td.distribute.MultiWorkerMirroredStrategy._from_local_devices([f"CPU:{i}" for i in range(local)])
    with strategy.scope():
        w = td.Variable(np.zeros(4, np.float32), name="w")
        optimizer = td.optimizers.SGD(0.5, momentum=0.9)
    checkpoint = td.train.Checkpoint(w=w, optimizer=optimizer)
    checkpoint.restore(rank0["path"])
    strategy.run(lambda: optimizer.apply_gradients([(np.zeros(4, np.float32), w)]))  # creates the slot
    momentum = optimizer.get_slot(w, "momentum")
    expected_w = np.array(rank0["w"]) + 0.9 * np.array(rank0["momentum"])  # one more step with a zero gradient
    for component in w.values:
        np.testing.assert_allclose(component.numpy(), expected_w, rtol=1e-6)
    for component in momentum.values:
        np.testing.assert_allclose(component.numpy(), 0.9 * np.array(rank0["momentum"]), rtol=1e-6)


def _names(task: int, cpus: int) -> list[str]:
    return [f"/job:worker/replica:0/task:{task}/device:CPU:{i}" for i in range(cpus)]


@pytest.mark.parametrize("cpus", [1, 2])
def test_devices_are_named_by_the_workers_task_as_in_tensorflow(cpus):
    results, output, _, _ = run_mpi("device_names", str(cpus), timeout=60)
    (rank0,), (rank1,) = results[0], results[1]
    # TensorFlow 2.21, two workers: list_logical_devices("CPU") lists every worker's CPUs, its own first.
    if cpus == 1:
        assert rank1["logical"] == ["/job:worker/replica:0/task:1/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:0"]
    else:
        assert rank0["logical"] == [
            "/job:worker/replica:0/task:0/device:CPU:0",
            "/job:worker/replica:0/task:0/device:CPU:1",
            "/job:worker/replica:0/task:1/device:CPU:0",
            "/job:worker/replica:0/task:1/device:CPU:1",
        ]
    assert rank0["logical"] == _names(0, cpus) + _names(1, cpus), output
    assert rank1["logical"] == _names(1, cpus) + _names(0, cpus), output
    for task, fields in enumerate([rank0, rank1]):
        assert fields["device"] == f"/job:worker/replica:0/task:{task}/device:CPU:0", output
        assert fields["components"] == fields["non_slot"] == fields["worker_devices"] == _names(task, cpus), output
        assert fields["constant_on_own_name"] == 2.0


def test_a_launcher_that_gives_every_process_a_world_of_one_is_refused():
    code = "import towerdist as td; td.distribute.MultiWorkerMirroredStrategy()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMPI_COMM_WORLD_SIZE": "2"})
    assert done.returncode != 0
    assert "the launcher started 2 processes, but MPI says this one is alone" in done.stderr


def test_a_launcher_without_mpi4py_names_the_extras():
    code = "import sys; sys.modules['mpi4py'] = None\nimport towerdist as td\ntd.distribute.MultiWorkerMirroredStrategy()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PMI_SIZE": "2"})
    assert "MissingDependencyError" in done.stderr
    assert 'towerdist[mpi]' in done.stderr and 'towerdist[mpi-mpich]' in done.stderr


def test_towerdist_imports_mpi4py_only_for_the_multi_worker_strategy():
    code = ("import sys\nimport towerdist as td\ntd.distribute.MirroredStrategy()\nprint('mpi4py' in sys.modules)\n"
            "td.distribute.MultiWorkerMirroredStrategy()\nprint('mpi4py' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.split() == ["False", "False"], done.stderr  # one process without a launcher: no MPI


def test_one_process_without_a_launcher_needs_no_mpi():
    code = ("import sys; sys.modules['mpi4py'] = None\nimport towerdist as td\n"
            "s = td.distribute.MultiWorkerMirroredStrategy()\nprint(s.num_replicas_in_sync, s.cluster_resolver.task_id)")
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0"]


@pytest.mark.slow
def test_the_main_job_trains_to_the_same_accuracy_on_two_processes(tmp_path):
    mpiexec = _mpiexec()
    assert mpiexec is not None
    command = [str(EXAMPLES / "train_digits.py"), "--no-progress", "--epochs", "12"]
    two = subprocess.run([mpiexec, "-n", "2", sys.executable, *command, "--checkpoint-dir", str(tmp_path / "mpi")],
                         capture_output=True, text=True, timeout=300)
    one = subprocess.run([sys.executable, *command, "--replicas", "2", "--checkpoint-dir", str(tmp_path / "threads")],
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0 and one.returncode == 0, two.stderr + one.stderr
    last_two = [line for line in two.stdout.splitlines() if line.startswith("epoch  12/12")]
    last_one = [line for line in one.stdout.splitlines() if line.startswith("epoch  12/12")]
    assert len(last_two) == 1, two.stdout  # only the chief reports

    def accuracy(line: str) -> float:
        return float(line.split("test acc")[1].split()[0])

    assert accuracy(last_two[0]) == pytest.approx(accuracy(last_one[0]), abs=0.01)
    assert accuracy(last_two[0]) > 0.9
    assert (tmp_path / "mpi" / "checkpoint").exists()
