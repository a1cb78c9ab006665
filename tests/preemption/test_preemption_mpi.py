"""PreemptionCheckpointHandler across two real processes (``mpiexec -n 2``), as TensorFlow 2.21 behaves.

The job (``mpi_preemption_child.py``) trains 20 steps unless stopped. TensorFlow's protocol,
observed with two TF workers (``reference/preemption.md``): a SIGTERM handled while ``run()``
call k is under way (or after it returned) makes every worker save after ``S = k + 1`` calls,
exactly one checkpoint ``ckpt-1`` holding ``checkpointed_runs = S``, then exit 42; a restart
resumes at S and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TEST_PROGRAMS, _mpiexec

CHILD = TEST_PROGRAMS / "mpi_preemption_child.py"
pytestmark = [pytest.mark.launches_mpi, pytest.mark.timeout(240)]
STEPS = 20


class Job:
    """One ``mpiexec -n 2`` run of the child: its exit status, output and each rank's report."""

    def __init__(self, directory: Path, **config: Any) -> None:
        mpiexec = _mpiexec()
        assert mpiexec is not None
        self.directory = directory
        self.command = [mpiexec, "-n", "2", sys.executable, str(CHILD), json.dumps({"dir": str(directory), **config})]
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = ""
        self.status: int | None = None

    def wait(self, timeout: float = 90.0) -> Job:
        try:
            self.output, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.output, _ = self.process.communicate()
            pytest.fail(f"the job did not end within {timeout} s (a hang):\n{self.output}")
        self.status = self.process.returncode
        return self

    def report(self, rank: int) -> dict[str, Any]:
        path = self.directory / f"report-{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report (status {self.status}):\n{self.output}"
        report: dict[str, Any] = json.loads(path.read_text())
        return report


def run(directory: Path, **config: Any) -> Job:
    return Job(directory, steps=STEPS, **config).wait()


def saved(checkpoint_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """The files of ``checkpoint_dir`` and the values of its latest checkpoint, by name."""
    names = sorted(os.listdir(checkpoint_dir))
    state = json.loads((checkpoint_dir / "checkpoint").read_text())
    index = json.loads((checkpoint_dir / f"{state['model_checkpoint_path']}.index").read_text())
    with np.load(checkpoint_dir / index["data_file"]) as data:
        values = {name: data[entry["member"]] for name, entry in index["entries"].items()}
    return names, values


def assert_saved_once_at(job: Job, step: int, number: int = 1) -> None:
    """Both ranks exited 42 after ``step`` runs, and the directory holds one checkpoint, of that step."""
    assert job.status == 42, job.output
    for rank in (0, 1):
        report = job.report(rank)
        assert (report["exit"], report["runs"]) == (42, step), (rank, report, job.output)
    assert job.report(0)["w"] == job.report(1)["w"]
    names, values = saved(job.directory / "ckpt")
    assert names == [
        "checkpoint",
        f"ckpt-{number}.data-00000-of-00001",
        f"ckpt-{number}.index",
    ], names  # one complete checkpoint (TensorFlow's file names), nothing temporary, no workertemp folder
    assert values["checkpointed_runs"] == step
    assert values["w"].tolist() == job.report(0)["w"]
    assert not any(p.name.startswith("workertemp") for p in job.directory.iterdir())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    job = run(tmp_path_factory.mktemp("uninterrupted"))
    assert job.status == 0, job.output
    assert job.report(0)["runs"] == job.report(1)["runs"] == STEPS
    assert job.report(0)["w"] == job.report(1)["w"]
    weights: list[float] = job.report(0)["w"]
    return weights


def test_a_signal_to_worker_1_during_step_10_saves_at_11_on_both_and_a_restart_ends_bit_identical(
    tmp_path: Path, uninterrupted: list[float]
) -> None:
    job = run(tmp_path, signals=[{"rank": 1, "step": 10, "when": "during"}])
    assert_saved_once_at(job, 11)
    assert job.report(0)["w"] != uninterrupted
    # TF's log lines: the signalled worker's notice and proposal, then both workers' save and exit
    assert job.output.count("Member 1 has received termination notice.") == 1, job.output
    assert job.output.count("every worker saves after run() call 11") == 1, job.output
    assert job.output.count("PreemptionCheckpointHandler: checkpoint saved. Exiting.") == 2, job.output

    for rank in (0, 1):
        os.remove(tmp_path / f"report-{rank}.json")
    restarted = run(tmp_path)
    assert restarted.status == 0, restarted.output
    for rank in (0, 1):
        report = restarted.report(rank)
        assert (report["started_at"], report["runs"]) == (11, STEPS), report
        assert report["w"] == uninterrupted  # bit-identical: variable, momentum slots and step restored


def test_a_signal_to_the_chief_between_steps_saves_at_the_next_step(tmp_path: Path) -> None:
    # after run() call 10 returned: 10 calls begun, so S = 11
    assert_saved_once_at(run(tmp_path, signals=[{"rank": 0, "step": 10, "when": "between"}]), 11)


def test_signals_to_both_workers_in_the_same_step_agree_on_one_step(tmp_path: Path) -> None:
    signals = [{"rank": 0, "step": 10, "when": "during"}, {"rank": 1, "step": 10, "when": "during"}]
    assert_saved_once_at(run(tmp_path, signals=signals), 11)


def test_a_later_signal_to_the_other_worker_is_ignored(tmp_path: Path) -> None:
    # worker 1's signal during step 11 comes after the workers agreed on 11: TF ignores it
    signals = [{"rank": 0, "step": 10, "when": "during"}, {"rank": 1, "step": 11, "when": "during"}]
    assert_saved_once_at(run(tmp_path, signals=signals), 11)


def test_a_second_signal_to_the_same_worker_is_ignored(tmp_path: Path) -> None:
    signals = [{"rank": 1, "step": 10, "when": "during"}, {"rank": 1, "step": 10, "when": "between"}]
    assert_saved_once_at(run(tmp_path, signals=signals), 11)


def test_signals_during_the_save_change_nothing_and_exit_fn_and_save_fn_are_honoured(tmp_path: Path) -> None:
    signals = [
        {"rank": 1, "step": 10, "when": "during"},
        {"rank": 0, "step": 11, "when": "save"},
        {"rank": 1, "step": 11, "when": "save"},
    ]
    job = run(tmp_path, signals=signals, save_fn=True, exit_status=77)
    assert job.status == 77, job.output
    for rank in (0, 1):
        report = job.report(rank)
        assert (report["exit"], report["runs"], report["saved_at"]) == (77, 11, [11]), report
    names, values = saved(tmp_path / "ckpt")
    assert values["checkpointed_runs"] == 11
    assert "ckpt-1.index" in names


def test_a_signal_during_the_last_step_is_lost_as_in_tensorflow(tmp_path: Path) -> None:
    job = run(tmp_path, signals=[{"rank": 1, "step": STEPS, "when": "during"}])
    assert job.status == 0, job.output
    assert job.report(0)["runs"] == job.report(1)["runs"] == STEPS
    assert not (tmp_path / "ckpt" / "checkpoint").exists()


def test_with_a_grace_period_both_save_at_once_train_on_and_save_again_before_it_ends(tmp_path: Path) -> None:
    job = Job(
        tmp_path,
        steps=10**7,  # ends by the grace period, long before
        grace_period=1.0,
        save_fn=True,
        signals=[{"rank": 1, "step": 10, "when": "during"}],
    ).wait()
    assert job.status == 42, job.output
    first, second = job.report(0)["saved_at"]
    assert first == 11 and second > first
    for rank in (0, 1):
        report = job.report(rank)
        assert (report["exit"], report["runs"], report["saved_at"]) == (42, second, [first, second]), report
    names, values = saved(tmp_path / "ckpt")
    assert values["checkpointed_runs"] == second
    assert names == ["checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"]


@pytest.mark.parametrize("ranks", [[1], [0, 1]], ids=["worker-1", "both-workers"])
def test_a_sigterm_sent_from_outside_saves_once_on_both_at_the_same_step(tmp_path: Path, ranks: list[int]) -> None:
    # As a scheduler does it (Slurm and Kubernetes signal every process of the job): the job
    # trains on until it is told, at whatever step that lands.
    job = Job(tmp_path, steps=10**7, pid_after=5)
    pids: dict[int, int] = {}
    seen = []
    assert job.process.stdout is not None
    for line in job.process.stdout:  # each rank prints its pid after step 5 (the timeout mark bounds this)
        seen.append(line)
        # the launcher may join the two ranks' lines: read every "pid of rank r: p." in the output so far
        pids = {int(r): int(p) for r, p in re.findall(r"pid of rank (\d+): (\d+)\.", "".join(seen))}
        if len(pids) == 2:
            break
    assert len(pids) == 2, "".join(seen)  # the output ended first: the job died
    for rank in ranks:
        os.kill(pids[rank], signal.SIGTERM)
    job.wait()
    job.output = "".join(seen) + job.output
    assert job.status == 42, job.output
    step = job.report(0)["runs"]
    assert step > 5
    assert_saved_once_at(job, step)


def test_steps_without_a_collective_still_agree_on_the_step(tmp_path: Path) -> None:
    # The step number rides on the workers' collectives; with none in a step, the handler
    # exchanges it at the next run() itself.
    job = run(tmp_path, no_collective=True, signals=[{"rank": 1, "step": 10, "when": "during"}])
    assert_saved_once_at(job, 11)


def test_a_later_handler_in_the_same_job_does_not_inherit_an_earlier_handlers_save_step(tmp_path: Path) -> None:
    job = Job(tmp_path, steps=0, two_handlers=True).wait()
    assert job.status == 0, job.output
    for rank in (0, 1):
        report = job.report(rank)
        assert report["exits"] == ["a at 4"], (report, job.output)  # B never saved or exited
        assert report["b_files"] == [], report
