"""MultiWorkerMirroredStrategy on SIMULATED GPUs across two real processes (``mpiexec -n 2``).

Each process simulates the same 2-GPU host (``TOWERDIST_SIMULATE_GPUS=2``); the simulator's
NCCL connects the two processes' ranks through files. This checks towerdist's multi-worker
GPU path end to end — the unique id in cupy 14's form (N1), a GPU per worker of a host (N2),
NCCL on its own stream without host waits, the watch that aborts a stalled collective — as
far as a simulation can: it is not GPU verification.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import TEST_PROGRAMS, _mpiexec

CHILD = TEST_PROGRAMS / "mpi_gpu_child.py"
pytestmark = [pytest.mark.launches_mpi, pytest.mark.timeout(180)]


def run(scenario: str, timeout: float = 90.0, gpus: int = 2) -> tuple[dict[int, list], str]:
    mpiexec = _mpiexec()
    assert mpiexec is not None
    with tempfile.TemporaryDirectory() as results, tempfile.TemporaryDirectory() as nccl_files:
        env = {
            **os.environ,
            "MPI_CHILD_RESULTS": results,
            "TOWERDIST_SIMULATE_GPUS": str(gpus),
            "TOWERDIST_SIMULATED_NCCL_DIR": nccl_files,
        }
        done = subprocess.run(
            [mpiexec, "-n", "2", sys.executable, str(CHILD), scenario],
            capture_output=True, text=True, timeout=timeout, env=env,
        )  # fmt: skip
        found: dict[int, list] = {}
        for path in sorted(Path(results).glob("rank-*.jsonl")):
            for line in path.read_text().splitlines():
                fields = json.loads(line)
                found.setdefault(fields["rank"], []).append(fields)
    return found, done.stdout + done.stderr


def test_workers_of_one_host_train_on_gpus_of_their_own_summing_with_nccl():
    # N1 (the unique id as cupy 14 wants it) and N2 (both workers used GPU 0).
    results, output = run("train")
    assert sorted(results) == [0, 1], output
    for rank in (0, 1):
        (outcome,) = results[rank]
        assert outcome["outcome"] == "trained", output
        assert outcome["gpu"] == rank and outcome["nccl"], outcome
        # three SGD steps of lr 0.1 on the summed gradient 1 + 2 = 3
        assert outcome["w"] == pytest.approx([-0.9] * 4), outcome
        assert max(outcome["host_syncs"].values(), default=0) <= 2 * 2, outcome  # two steps


def test_workers_with_two_gpus_each_reduce_on_the_right_gpus():
    # Two GPUs per worker (4 on the host): in-process NCCL, then across the workers; the MEAN and
    # the update on every replica's own GPU (the division's device: test_gpu.py, N4).
    results, output = run("two_local_gpus", gpus=4)
    for rank in (0, 1):
        (outcome,) = results[rank]
        assert outcome["gpus"] == [2 * rank, 2 * rank + 1], output
        assert outcome["means"] == [[1.5, 1.5]] * 2, outcome  # (0 + 1 + 2 + 3) / 4
        assert outcome["w"] == [[-6.0, -6.0]] * 2, outcome  # SGD(1.0) on the summed gradient 6


def test_two_workers_forced_onto_one_gpu_get_a_clear_error_on_both():
    results, output = run("same_gpu")
    for rank in (0, 1):
        (outcome,) = results.get(rank, [{}]) or [{}]
        assert outcome.get("outcome") == "UnavailableError", output
        assert "GPU:0" in outcome["message"] and "Duplicate GPU" in outcome["message"], outcome


def test_cupy_13s_tuple_unique_ids_work_too():
    results, output = run("cupy_13")
    assert [results[r][0]["result"] for r in (0, 1)] == [[3.0, 3.0]] * 2, output


def test_workers_asking_for_different_reduce_ops_raise_on_both_before_nccl_runs():
    results, output = run("mismatched_ops")
    for rank in (0, 1):
        raised, summed = results[rank]
        assert raised["outcome"] == "InvalidArgumentError", raised
        assert "rank 0 called ReplicaContext.all_reduce() MEAN over NCCL" in raised["message"], raised
        assert "rank 1 called ReplicaContext.all_reduce() SUM over NCCL" in raised["message"], raised
        assert summed == {"rank": rank, "outcome": "summed", "result": [2.0, 2.0], "nccl": True}, output


def test_a_worker_failing_while_packing_the_first_nccl_sum_fails_both_and_they_stay_in_step():
    # The first NCCL sum creates the NCCL communicator (a collective) first; a failure after that
    # went unreported: rank 0's sum paired with rank 1's next one.
    results, output = run("fails_before_first_nccl")
    (failed0, next0), (failed1, next1) = results[0], results[1]
    assert failed0["outcome"] == "AbortedError" and "rank(s) 1 failed while preparing it" in failed0["message"], output
    assert failed1["outcome"] == "RuntimeError" and "out of memory" in failed1["message"], output
    assert next0["result"] == next1["result"] == [2.0] * 4, output


def test_a_stalled_nccl_collective_is_aborted_past_the_timeout_and_the_next_one_raises():
    # N5 for the workers: the wait was an unbounded busy loop; now a watch thread aborts it.
    results, output = run("stalled_nccl", timeout=120)
    watched, raised = results[0]
    assert watched["outcome"] == "watched" and "did not complete within 1 s" in watched["broken"], output
    assert raised["outcome"] in ("DeadlineExceededError", "UnavailableError"), raised
    assert "did not complete within 1 s" in raised["message"], raised
