"""A preempted job resumes its input exactly, on the same or another number of workers (``mpiexec``).

The job (``tools/test_programs/mpi_resume_child.py``) trains 24 steps of a linear regression
with a ``PreemptionCheckpointHandler`` whose checkpoint holds the weights, the optimizer and
the distributed iterator, in TensorFlow's loop shape ``handler.run(train_step,
next(iterator))``: the batch of the step at which the handler saves is drawn before ``run()``
decides to save, so the iterator must carry it. Each test signals one worker during step 10
of a job, which every worker then leaves after step 11 with status 42; the same job started
again on another number of workers (same global batch) must train steps 12 to 24 on exactly
the examples an uninterrupted run trains on, step by step, and end with its weights (bit for
bit on the same number of workers, to float summation order on another).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TEST_PROGRAMS, _mpiexec

CHILD = TEST_PROGRAMS / "mpi_resume_child.py"
pytestmark = [pytest.mark.launches_mpi, pytest.mark.timeout(300)]
STEPS, GLOBAL_BATCH, SIGNALLED_STEP = 24, 12, 10


def job(directory: Path, workers: int, **config: Any) -> tuple[int, str]:
    """Runs the child under ``mpiexec -n workers``; its exit status and output."""
    mpiexec = _mpiexec()
    assert mpiexec is not None
    command = [
        mpiexec,
        "-n",
        str(workers),
        sys.executable,
        str(CHILD),
        json.dumps({"dir": str(directory), "steps": STEPS, "global_batch": GLOBAL_BATCH, **config}),
    ]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job did not end within 120 s (a hang):\n{expired.stdout}\n{expired.stderr}")
    return completed.returncode, completed.stdout + completed.stderr


def trained_steps(directory: Path) -> dict[int, list[int]]:
    """The examples each step trained on (from every run in ``directory``); a step trained twice fails."""
    steps: dict[int, list[int]] = {}
    for log in sorted(directory.glob("steps-*.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            assert record["step"] not in steps, f"step {record['step']} was trained twice"
            steps[record["step"]] = record["ids"]
    return steps


def report(directory: Path, rank: int) -> dict[str, Any]:
    path = directory / f"report-{rank}.json"
    assert path.exists(), f"rank {rank} wrote no report"
    result: dict[str, Any] = json.loads(path.read_text())
    path.unlink()  # the next run writes its own
    return result


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, list[int]], list[float]]:
    directory = tmp_path_factory.mktemp("uninterrupted")
    status, output = job(directory, 2)
    assert status == 0, output
    weights: list[float] = report(directory, 0)["w"]
    steps = trained_steps(directory)
    assert sorted(steps) == list(range(1, STEPS + 1))
    return steps, weights


@pytest.mark.parametrize(
    ("saved_on", "restored_on"),
    [((2, 1), (1, 1)), ((2, 1), (2, 1)), ((2, 1), (1, 2)), ((2, 1), (3, 1)), ((1, 2), (2, 1))],
    ids=["2x1-to-1x1", "2x1-to-2x1", "2x1-to-1x2", "2x1-to-3x1", "1x2-to-2x1"],
)
def test_a_preempted_job_resumes_on_exactly_the_examples_an_uninterrupted_one_trains_on(
    tmp_path: Path,
    uninterrupted: tuple[dict[int, list[int]], list[float]],
    saved_on: tuple[int, int],
    restored_on: tuple[int, int],
) -> None:
    expected_steps, expected_weights = uninterrupted
    (workers, local), (new_workers, new_local) = saved_on, restored_on
    status, output = job(tmp_path, workers, local=local, signal={"rank": workers - 1, "step": SIGNALLED_STEP})
    assert status == 42, output
    for rank in range(workers):
        assert (report(tmp_path, rank)["runs"], status) == (SIGNALLED_STEP + 1, 42)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    assert "Exception ignored" not in output  # a worker leaving with a live input pipeline leaves quietly

    status, output = job(tmp_path, new_workers, local=new_local)
    assert status == 0, output
    assert "Exception ignored" not in output
    resumed = report(tmp_path, 0)
    assert (resumed["started_at"], resumed["runs"]) == (SIGNALLED_STEP + 1, STEPS - SIGNALLED_STEP - 1)
    steps = trained_steps(tmp_path)
    assert sorted(steps) == list(range(1, STEPS + 1))
    for step in sorted(steps):  # no example repeated or skipped: every step trained on the same examples
        assert steps[step] == expected_steps[step], f"step {step}"
    if (new_workers, new_local) == (workers, local):
        assert resumed["w"] == expected_weights  # bit for bit
    else:
        np.testing.assert_allclose(resumed["w"], expected_weights, rtol=1e-12, atol=1e-12)
