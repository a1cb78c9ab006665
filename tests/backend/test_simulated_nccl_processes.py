"""Simulated NCCL connects ranks in several processes of one host, through files (``simulated_nccl_files``).

Real NCCL: every process calls ``NcclCommunicator(nranks, uid, rank)`` with the unique id
rank 0 made (``ncclCommInitRank`` blocks until all ranks have joined, and refuses two ranks on
one GPU: "Duplicate GPU detected"); an ``allReduce`` completes on each rank once every rank
has called it; the ranks' calls must match; an aborted rank is seen by the others'
``ncclCommGetAsyncError``. Two simulated machines in one process stand in for two processes
(fast); the last tests start real processes. GPU i of one process is GPU i of another (one host).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import towerdist
from towerdist._src.backend.simulated import cupy as simulated_cupy
from towerdist._src.backend.simulated.cuda import SimulatedGPUError
from towerdist._src.backend.simulated.nccl import NcclError
from towerdist._src.backend.simulated.nccl_files import DIR_ENV_VAR

JOIN_SECONDS = 10.0
PROCESS_SECONDS = 60.0


@pytest.fixture
def machines(monkeypatch, tmp_path):
    """Two simulated machines with 2 GPUs each (two "processes" of one host); ranks meet in ``tmp_path``."""
    monkeypatch.delenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    monkeypatch.setenv(DIR_ENV_VAR, str(tmp_path))
    modules = [simulated_cupy.module(2), simulated_cupy.module(2)]
    for module in modules:
        module.machine.hang_timeout = 5.0  # the other "process" may be slow to arrive
    return modules


def in_parallel(*calls):
    """Runs each call in its own thread (each rank blocks until the others arrive); returns results or raises."""
    results, errors = [None] * len(calls), [None] * len(calls)

    def body(i):
        try:
            results[i] = calls[i]()
        except BaseException as error:  # handed back below
            errors[i] = error

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    return results, errors


def make_rank(cp, uid, rank, device, nranks=2):
    def make():
        with cp.cuda.Device(device):
            return cp.cuda.nccl.NcclCommunicator(nranks, uid, rank)

    return make


def connect(machines, devices=(0, 1)):
    uid = machines[0].cuda.nccl.get_unique_id()
    comms, errors = in_parallel(*(make_rank(cp, uid, r, devices[r]) for r, cp in enumerate(machines)))
    assert errors == [None, None], errors
    return comms


def all_reduce_on(cp, comm, values, count=None):
    """Rank ``comm``'s all-reduce of ``values`` on its GPU's null stream; returns the buffer."""
    nccl = cp.cuda.nccl
    with cp.cuda.Device(comm.device_id()):
        buffer = cp.asarray(np.asarray(values, np.float32))
        n = buffer.size if count is None else count
        comm.allReduce(buffer.data.ptr, buffer.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    return buffer


def finish(cp, comm, buffer):
    with cp.cuda.Device(comm.device_id()):
        cp.cuda.Stream.null.synchronize()
        return buffer.get().tolist()


@pytest.mark.timeout(30)
def test_ranks_of_two_processes_all_reduce_through_files(machines, tmp_path):
    comms = connect(machines)
    assert [(c.rank_id(), c.device_id(), c.size()) for c in comms] == [(0, 0, 2), (1, 1, 2)]
    for step in range(2):
        buffers = [all_reduce_on(cp, c, [r + 1.0, 10.0 * step]) for r, (cp, c) in enumerate(zip(machines, comms))]
        results, errors = in_parallel(*(lambda i=i, b=buffers[i]: finish(machines[i], comms[i], b) for i in range(2)))
        assert errors == [None, None] and results == [[3.0, 20.0 * step]] * 2
    (directory,) = tmp_path.iterdir()
    assert not [p.name for p in directory.iterdir() if p.name.startswith("c")]  # collected contributions removed


@pytest.mark.timeout(30)
def test_a_rank_that_never_contributes_is_reported_instead_of_hanging(machines):
    comms = connect(machines)
    machines[0].machine.hang_timeout = 0.3
    buffer = all_reduce_on(machines[0], comms[0], [1.0])
    with pytest.raises(
        SimulatedGPUError, match=r"would hang.*collective #0\) on rank 0 of 2 .*waiting for ranks \[1\]"
    ):
        finish(machines[0], comms[0], buffer)


@pytest.mark.timeout(30)
def test_mismatched_collectives_across_processes_raise_on_every_rank_naming_each_call(machines):
    comms = connect(machines)
    buffer = all_reduce_on(machines[0], comms[0], [1.0, 2.0])
    with pytest.raises(SimulatedGPUError) as second:
        all_reduce_on(machines[1], comms[1], [1.0])  # every contribution is there: it completes, and fails
    with pytest.raises(SimulatedGPUError) as first:
        finish(machines[0], comms[0], buffer)  # rank 0 finds out when it waits
    for error in (first.value, second.value):
        assert "collective #0 does not match across ranks: rank 0 allReduce(count=2" in str(error)
        assert "rank 1 allReduce(count=1, float32, sum)" in str(error)


@pytest.mark.timeout(30)
def test_an_aborted_rank_is_seen_by_the_other_process_and_ends_its_work(machines):
    comms = connect(machines)
    buffer = all_reduce_on(machines[0], comms[0], [1.0])
    comms[1].abort()
    with pytest.raises(NcclError, match=r"REMOTE_ERROR: rank 1 \(GPU 1, process \d+\) was aborted"):
        comms[0].check_async_error()
    with machines[0].cuda.Device(0):
        assert machines[0].cuda.Stream.null.done  # its queued all-reduce ended
    assert buffer.get().tolist() == [1.0]  # garbage on real GPUs: never summed


@pytest.mark.timeout(30)
def test_two_processes_ranks_on_the_same_gpu_are_refused_on_every_rank(machines):
    uid = machines[0].cuda.nccl.get_unique_id()
    _, errors = in_parallel(make_rank(machines[0], uid, 0, 1), make_rank(machines[1], uid, 1, 1))
    for error in errors:
        assert isinstance(error, NcclError)
        assert "INVALID_USAGE: Duplicate GPU detected: rank 0 (GPU 1 of host" in str(error)
        assert "and rank 1 (GPU 1 of host" in str(error)


@pytest.mark.timeout(30)
def test_a_rank_created_twice_is_refused(machines):
    uid = machines[0].cuda.nccl.get_unique_id()
    assert make_rank(machines[0], uid, 0, 0, nranks=1)().size() == 1
    with pytest.raises(NcclError, match="rank 0 of this unique id was already created, by rank 0 .*process"):
        make_rank(machines[1], uid, 0, 1, nranks=1)()


# --- real processes -----------------------------------------------------------------------------

CHILD = r"""
import json, sys
import numpy as np
from towerdist._src.backend.simulated import cupy as simulated_cupy

uid, rank, device, hang = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cp = simulated_cupy.module(2)
cp.machine.hang_timeout = hang
nccl = cp.cuda.nccl
try:
    with cp.cuda.Device(device):
        comm = nccl.NcclCommunicator(2, uid, rank)
        x = cp.asarray(np.array([rank + 1.0, 10.0 * (rank + 1)], np.float32))
        stream = cp.cuda.Stream(non_blocking=True)
        stream.wait_event(cp.cuda.get_current_stream().record())
        comm.allReduce(x.data.ptr, x.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()
        print(json.dumps({"sum": x.get(stream=stream).tolist()}))
except Exception as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error)}))
"""


def run_ranks(tmp_path, ranks, hang=20.0):
    """Starts one process per (rank, device) with a shared unique id; returns their reports."""
    uid = simulated_cupy.module(1).cuda.nccl.get_unique_id()  # made by this (a third) process
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(towerdist.__file__)))
    env = {**os.environ, "PYTHONPATH": source_root, DIR_ENV_VAR: str(tmp_path)}
    env.pop("TOWERDIST_SIMULATE_GPUS", None)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, uid.hex(), str(rank), str(device), str(hang)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for rank, device in ranks
    ]
    reports = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=PROCESS_SECONDS)
            assert process.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return reports


@pytest.mark.timeout(PROCESS_SECONDS * 2)
def test_two_processes_all_reduce_and_leave_no_files(tmp_path):
    reports = run_ranks(tmp_path, [(0, 0), (1, 1)])
    assert reports == [{"sum": [3.0, 30.0]}] * 2
    assert list(tmp_path.iterdir()) == []  # the last process to leave removed the clique's directory


@pytest.mark.timeout(PROCESS_SECONDS * 2)
def test_two_processes_on_one_gpu_are_refused(tmp_path):
    reports = run_ranks(tmp_path, [(0, 0), (1, 0)])
    for report in reports:
        assert report["error"] == "NcclError" and "Duplicate GPU detected" in report["message"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(PROCESS_SECONDS * 2)
def test_a_process_whose_peer_never_joins_reports_the_missing_rank(tmp_path):
    (report,) = run_ranks(tmp_path, [(0, 0)], hang=0.5)
    assert report["error"] == "SimulatedGPUError"
    assert "ranks [1] have not joined" in report["message"]
    assert list(tmp_path.iterdir()) == []
