"""The watch over MultiWorkerMirroredStrategy's NCCL collectives, and NcclWorkers' refusals (no GPU needed).

The watch (``multi_worker/nccl_workers.py``) runs on fakes here: real events, streams and
communicators need GPUs, and the simulated ones complete every collective at once, so a
stall can only be staged.
"""

from __future__ import annotations

import threading

import pytest

import towerdist as td
from towerdist._src.cross_device_ops import nccl_cliques
from towerdist._src.cross_device_ops.nccl_cliques import Clique
from towerdist._src.multi_worker import nccl_workers


class Event:
    def __init__(self, done: bool = False) -> None:
        self.done = done


class Comm:
    def __init__(self) -> None:
        self.aborted = 0
        self.error: Exception | None = None
        self.locked_while_checked: list[bool] = []

    def check_async_error(self) -> None:
        lock = nccl_cliques._gpu_locks.get(7)
        self.locked_while_checked.append(lock is not None and lock.locked())
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        self.aborted += 1


class Communicator:
    def __init__(self) -> None:
        self.broken: list[str] = []
        self.agreed = 0

    def mark_broken(self, reason: str) -> None:
        self.broken.append(reason)

    def agree(self, *args: object) -> None:
        self.agreed += 1


class Workers:
    rank = 1

    def __init__(self) -> None:
        self.communicator = Communicator()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def make_clique() -> Clique:
    clique = Clique.__new__(Clique)
    clique.device_ids, clique.comms, clique.what = (7,), [Comm()], "test clique"
    clique.broken, clique._aborted, clique._abort_lock = None, False, threading.Lock()
    clique.last_done = [None]
    return clique


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(nccl_workers, "time", fake)
    return fake


def test_the_timeout_counts_from_when_the_stream_reaches_the_collective(clock: Clock) -> None:
    # Counting from the host's launch declared a healthy collective stalled while the GPU
    # was still busy with the caller's earlier work (seen on an H200).
    clique, workers = make_clique(), Workers()
    watch = nccl_workers._Watch(clique, workers)
    started, done = Event(), Event()
    watch._pending.append((started, done, "all_reduce", 1.0, None))
    for _ in range(5):  # 5 s of the caller's work queued ahead: not a stall
        clock.now += 1.0
        watch._check()
    assert watch._failure is None and clique.comms[0].aborted == 0
    started.done = True
    watch._check()
    clock.now += 0.9
    watch._check()
    assert watch._failure is None
    clock.now += 0.2
    watch._check()
    assert "all_reduce did not complete within 1 s" in watch._failure
    assert clique.comms[0].aborted == 1 and clique.broken and workers.communicator.broken
    with pytest.raises(td.errors.DeadlineExceededError, match="all_reduce did not complete within 1 s"):
        watch.raise_if_failed("next collective")


def test_an_asynchronous_nccl_error_aborts_and_breaks_the_workers(clock: Clock) -> None:
    clique, workers = make_clique(), Workers()
    clique.comms[0].error = RuntimeError("NCCL_ERROR_REMOTE_ERROR: peer gone")
    watch = nccl_workers._Watch(clique, workers)
    watch._pending.append((Event(True), Event(), "all_reduce", None, None))
    watch._run()  # one look, then the thread's loop ends on the failure
    assert "asynchronous error on GPU:7" in watch._failure and clique.comms[0].aborted == 1
    assert watch._thread is None
    with pytest.raises(td.errors.UnavailableError, match="peer gone"):
        watch.raise_if_failed("next collective")


def test_the_watch_looks_only_while_holding_the_gpus_launch_lock(clock: Clock) -> None:
    # The watch and a collective's launch used one communicator with no common lock.
    clique = make_clique()
    watch = nccl_workers._Watch(clique, Workers())
    watch._pending.append((Event(True), Event(True), "all_reduce", None, None))
    watch._run()
    assert clique.comms[0].locked_while_checked == [True]


def test_a_failure_while_looking_is_reported_and_does_not_kill_the_watch_silently(clock: Clock) -> None:
    class Broken:
        @property
        def done(self) -> bool:
            raise RuntimeError("cudaErrorIllegalAddress")

    clique, workers = make_clique(), Workers()
    watch = nccl_workers._Watch(clique, workers)
    watch._pending.append((Event(True), Broken(), "all_reduce", None, None))
    watch._run()
    assert "watching the NCCL collectives failed (RuntimeError: cudaErrorIllegalAddress)" in watch._failure
    assert watch._thread is None and clique.comms[0].aborted == 1


def test_a_clique_is_aborted_once_whoever_aborts_it() -> None:
    clique = make_clique()
    clique.abort("first")
    clique.abort("second")
    assert clique.comms[0].aborted == 1 and clique.broken == "first"


def test_a_broken_communicator_refuses_before_the_handshake(clock: Clock) -> None:
    # A rank refusing after the MPI agreement left its peers in NCCL work that cannot end.
    clique, workers = make_clique(), Workers()
    clique.comms[0].error = RuntimeError("NCCL_ERROR_UNHANDLED_CUDA_ERROR")
    sender = nccl_workers.NcclWorkers.__new__(nccl_workers.NcclWorkers)
    sender._workers, sender._device_index, sender._clique = workers, 7, clique
    sender._watch, sender._nccl = nccl_workers._Watch(clique, workers), None
    with pytest.raises(td.errors.UnavailableError, match="asynchronous error on GPU:7"):
        sender.sum([], "all_reduce", None, None)
    assert workers.communicator.agreed == 0 and workers.communicator.broken
