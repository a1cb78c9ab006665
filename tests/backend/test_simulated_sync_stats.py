"""Simulated GPUs count host-blocking synchronisations (``towerdist.testing.simulated_gpu_stats``).

On real GPUs, ``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ``cudaEventSynchronize``
and a blocking device-to-host copy each stall the calling CPU thread until the GPU has
finished; ``cudaStreamQuery``/``cudaEventQuery`` (``done``) return at once, and
``cudaMemcpyAsync`` from pageable host memory (an upload) returns once the data is staged.
The simulation runs kernels eagerly, so it counts the blocking calls instead.
"""

from __future__ import annotations

import inspect
import os
import threading

import numpy as np
import pytest

from towerdist._src.backend import gpu_module
from towerdist._src.backend.simulated import cupy as simulated_cupy
from towerdist._src.backend.simulated.stats import WORK_KINDS
from towerdist.testing import simulated_gpu_stats

JOIN_SECONDS = 10.0


@pytest.fixture
def cp(monkeypatch):
    """A simulated cupy module with 2 GPUs (legacy null default streams), counters at zero."""
    monkeypatch.delenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    module = simulated_cupy.module(2)
    module.machine.hang_timeout = 0.3
    return module


def stats(cp):
    return cp.machine.stats.snapshot()


def on_gpu_1(cp, make):
    with cp.cuda.Device(1):
        return make()


COUNTED = {
    "Device.synchronize": lambda cp, x: cp.cuda.Device(1).synchronize(),
    "runtime.deviceSynchronize": lambda cp, x: on_gpu_1(cp, cp.cuda.runtime.deviceSynchronize),
    "Stream.synchronize": lambda cp, x: on_gpu_1(cp, cp.cuda.Stream.null.synchronize),
    "Event.synchronize": lambda cp, x: on_gpu_1(cp, lambda: cp.cuda.get_current_stream().record().synchronize()),
    "ndarray.get": lambda cp, x: x.get(),
    "cupy.asnumpy": lambda cp, x: cp.asnumpy(x),
    "ndarray.item": lambda cp, x: x[0].item(),
    "ndarray.tolist": lambda cp, x: x.tolist(),
    "ndarray.__bool__": lambda cp, x: bool(x[0]),
    "ndarray.__int__": lambda cp, x: int(x[0]),
    "ndarray.__float__": lambda cp, x: float(x[0]),
    "ndarray.__complex__": lambda cp, x: complex(x[0]),
    "ndarray.__repr__": lambda cp, x: repr(x),
    "ndarray.__str__": lambda cp, x: str(x),
    "ndarray.__format__": lambda cp, x: f"{x[0]:.1f}",
}


@pytest.mark.parametrize("call", list(COUNTED))
def test_each_blocking_call_is_counted_once_on_its_device(cp, call):
    x = on_gpu_1(cp, lambda: cp.arange(3, dtype=np.float32))  # on GPU 1
    COUNTED[call](cp, x)
    counts = stats(cp)
    assert counts["host_syncs"] == {0: 0, 1: 1}
    assert counts["host_syncs_by_call"] == {call: 1}
    assert sum(counts["host_sync_sites"].values()) == 1


NOT_COUNTED = {
    "Stream.done": lambda cp, x: cp.cuda.Stream.null.done,
    "Event.done": lambda cp, x: cp.cuda.get_current_stream().record().done,
    "asarray(numpy) (an upload)": lambda cp, x: cp.asarray(np.ones(3)),
    "ndarray.set (an upload)": lambda cp, x: x.set(np.ones(3, np.float32)),
    "get(blocking=False)": lambda cp, x: x.get(blocking=False),
    "a kernel": lambda cp, x: (x * 2).sum(),
    "Stream.wait_event": lambda cp, x: cp.cuda.Stream().wait_event(cp.cuda.get_current_stream().record()),
}


@pytest.mark.parametrize("call", list(NOT_COUNTED))
def test_queries_uploads_and_kernels_are_not_counted(cp, call):
    x = cp.arange(3, dtype=np.float32)
    NOT_COUNTED[call](cp, x)
    counts = stats(cp)
    assert counts["host_syncs"] == {0: 0, 1: 0} and counts["host_syncs_by_call"] == {}


def test_done_queries_are_counted_apart(cp):
    assert cp.cuda.Stream.null.done
    on_gpu_1(cp, lambda: cp.cuda.get_current_stream().record().done)
    assert stats(cp)["queries"] == {0: 1, 1: 1}


@pytest.mark.timeout(30)
def test_the_simulators_own_wait_for_a_queued_collective_is_not_counted(cp):
    # A kernel reading a buffer that a queued all-reduce writes waits for it (streams run in
    # order); the simulator's wait is not a host synchronisation of the caller's.
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    buffers = [on_device(cp, i, lambda v=v: cp.asarray(np.array([v], np.float32))) for i, v in enumerate([1.0, 2.0])]
    posted, results = threading.Event(), {}

    def rank_0():
        comms[0].allReduce(buffers[0].data.ptr, buffers[0].data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        posted.set()
        results["doubled"] = buffers[0] * 2  # waits inside the simulator until rank 1 has called

    thread = threading.Thread(target=rank_0)
    thread.start()
    try:
        assert posted.wait(JOIN_SECONDS)
        with cp.cuda.Device(1):
            comms[1].allReduce(buffers[1].data.ptr, buffers[1].data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    finally:
        thread.join(JOIN_SECONDS)
    assert not thread.is_alive() and "doubled" in results
    assert stats(cp)["host_syncs"] == {0: 0, 1: 0}
    assert results["doubled"].get().tolist() == [6.0]


def on_device(cp, device, make):
    with cp.cuda.Device(device):
        return make()


def test_the_call_site_is_the_innermost_line_outside_the_simulator(cp):
    x = cp.ones(2)
    line = inspect.currentframe().f_lineno + 1
    x.get()
    (site,) = stats(cp)["host_sync_sites"]
    path = os.path.relpath(__file__)
    assert site == f"{path}:{line} (test_the_call_site_is_the_innermost_line_outside_the_simulator)"


def test_reset_returns_the_counts_and_zeroes_them(cp):
    cp.cuda.Device(0).synchronize()
    assert cp.machine.stats.snapshot(reset=True)["host_syncs"] == {0: 1, 1: 0}
    assert stats(cp) == {
        "host_syncs": {0: 0, 1: 0},
        "host_syncs_by_call": {},
        "host_sync_sites": {},
        "queries": {0: 0, 1: 0},
        "host_work": dict.fromkeys(WORK_KINDS, 0),
        "host_work_sites": {},
    }


@pytest.mark.timeout(30)
def test_counting_is_thread_safe(cp):
    barrier = threading.Barrier(4, timeout=JOIN_SECONDS)

    def sync_often():
        barrier.wait()
        for _ in range(200):
            cp.cuda.Device(1).synchronize()

    threads = [threading.Thread(target=sync_often) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    assert not any(t.is_alive() for t in threads)
    counts = stats(cp)
    assert counts["host_syncs"][1] == 800 and counts["host_syncs_by_call"] == {"Device.synchronize": 800}


# --- the public function (towerdist.testing) -----------------------------------------------------


def test_simulated_gpu_stats_reads_the_process_wide_simulation(cp, monkeypatch):
    monkeypatch.setattr(gpu_module, "_simulated", cp)
    cp.cuda.Device(1).synchronize()
    counts = simulated_gpu_stats(reset=True)
    assert counts["host_syncs"] == {0: 0, 1: 1} and counts["host_syncs_by_call"] == {"Device.synchronize": 1}
    assert simulated_gpu_stats()["host_syncs"] == {0: 0, 1: 0}


def test_simulated_gpu_stats_without_the_simulation_raises(monkeypatch):
    for state in ("_chosen", "_simulated", "_requested", "_owns"):
        monkeypatch.setattr(gpu_module, state, None)
    monkeypatch.delenv(gpu_module.ENV_VAR, raising=False)
    with pytest.raises(RuntimeError, match=r"simulated_gpu_stats\(\) .* the simulation is off; call .*simulate_gpus"):
        simulated_gpu_stats()


# --- the host's other calls into CUDA (host_work) ---------------------------------------------------


def test_kernel_launches_are_counted_and_allocations_and_views_are_not(cp):
    x = cp.arange(6, dtype=np.float32)  # one kernel (cupy.arange fills on the GPU)
    y = x * 2 + 1  # two
    y.reshape(2, 3)[0]  # views: no kernel
    cp.empty(4, np.float32)  # an allocation: no kernel
    assert stats(cp)["host_work"]["kernel_launches"] == 3


def test_events_made_recorded_and_waited_for_are_counted(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    event = stream.record()
    cp.cuda.get_current_stream().wait_event(event)
    event.record(stream)
    work = stats(cp)["host_work"]
    assert (work["events_created"], work["event_records"], work["event_waits"]) == (1, 2, 1)


def test_only_a_change_of_device_counts_as_a_device_switch(cp):
    with cp.cuda.Device(0):  # already current: cupy does not call cudaSetDevice
        pass
    with cp.cuda.Device(1):  # to GPU 1 and back
        with cp.cuda.Device(1):
            pass
    assert stats(cp)["host_work"]["device_switches"] == 2


def test_copies_are_counted_by_direction(cp):
    x = cp.asarray(np.ones(3, np.float32))  # up
    x.get()  # down
    with cp.cuda.Device(1):
        x.copy()  # between the GPUs
    work = stats(cp)["host_work"]
    assert (work["h2d"], work["d2h"], work["d2d"]) == (1, 1, 1)


def test_host_work_is_counted_by_call_site_when_asked(cp):
    cp.machine.stats.work_sites = True
    cp.ones(2) + 1
    sites = stats(cp)["host_work_sites"]
    assert any(site.startswith("kernel_launches at tests/backend/test_simulated_sync_stats.py:") for site in sites), sites


def test_a_reset_zeroes_the_host_work(cp):
    cp.ones(2) + 1
    assert cp.machine.stats.snapshot(reset=True)["host_work"]["kernel_launches"] == 2
    assert set(stats(cp)["host_work"].values()) == {0}
