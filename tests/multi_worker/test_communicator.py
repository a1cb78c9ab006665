"""The workers' communicator: a small sum's check rides in the message that carries its payload.

Written against the strategy's ``Workers`` and its ``Communicator``; with one worker (no
launcher) there is no communicator and these tests skip. Under ``mpiexec -n 2`` every rank
runs them in step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.multi_worker import communicator as communicator_module

from conftest import multi_worker

pytestmark = pytest.mark.multi_worker

SMALL = 1024  # elements: a sum that travels beside the handshake
# Elements: past the exchange and past the host window's payload, whatever the dtype.
LARGE = max(communicator_module._EXCHANGE_BYTES, communicator_module._WINDOW_PAYLOAD_BYTES)


def _workers(mode: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The test strategy's ``Workers``, their handshakes travelling as MPI messages or in the host's window."""
    strategy = multi_worker(1)
    workers = strategy.extended._workers
    if workers.communicator is None:
        pytest.skip("one worker has no communicator (run under mpiexec -n 2)")
    communicator = workers.communicator
    if mode == "messages":
        monkeypatch.setattr(communicator, "_window", None)  # every rank alike: the tests run in step
    elif communicator._window is None:
        pytest.skip("the ranks do not share one host (or TOWERDIST_HOST_WINDOW=0): no host window")
    return workers


@pytest.fixture(params=["messages", "window"])
def workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each test runs on both paths: MPI messages (ranks on several hosts) and the host's shared window."""
    return _workers(request.param, monkeypatch)


@pytest.fixture
def message_workers(monkeypatch: pytest.MonkeyPatch) -> Any:
    return _workers("messages", monkeypatch)


class _Recorder:
    """Stands in for the communicator's MPI communicator and ``Testall``, recording each call in order."""

    def __init__(self, comm: Any, testall: Any) -> None:
        self._comm = comm
        self._testall = testall
        self.calls: list[str] = []
        self.sent: list[int] = []  # the bytes of each Isend

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._comm, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            if name == "Isend":
                self.sent.append(int(args[0].nbytes))
            self.calls.append(name)
            return method(*args, **kwargs)

        return recorded

    def testall(self, requests: list[Any]) -> bool:
        done = bool(self._testall(requests))
        if done:
            self.calls.append("done")
        return done


@pytest.fixture
def recorder(message_workers: Any) -> Iterator[_Recorder]:
    communicator = message_workers.communicator
    comm, testall = communicator._comm, communicator._Testall
    recorder = _Recorder(comm, testall)
    communicator._comm, communicator._Testall = recorder, recorder.testall
    try:
        yield recorder
    finally:
        communicator._comm, communicator._Testall = comm, testall


def _rank_values(dtype: np.dtype[Any], size: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s values: small numbers (exact sums in every dtype), with zeros for bool."""
    values = (np.arange(size) * 7 + 3 * rank) % 11
    return (values % 2 == 0) if dtype == np.bool_ else values.astype(dtype)


def _want(dtype: np.dtype[Any], size: int, ranks: int) -> np.ndarray:
    parts = [_rank_values(dtype, size, r) for r in range(ranks)]
    if dtype == np.bool_:
        return np.logical_or.reduce(parts)
    return np.sum(parts, axis=0, dtype=dtype)


# --- one message latency ----------------------------------------------------------------------


def test_a_small_sum_is_one_message_to_each_peer_carrying_header_and_payload(message_workers, recorder):
    workers = message_workers
    peers = workers.size - 1
    x = np.ones(SMALL, np.float32)
    (result,) = workers.sum([x], "test_communicator", None)
    np.testing.assert_array_equal(result, np.full(SMALL, workers.size, np.float32))
    # No collective of its own for the check, no message after the verdict: one exchange.
    assert sorted(recorder.calls) == sorted(["Irecv", "Isend"] * peers + ["done"]), recorder.calls
    assert recorder.sent == [communicator_module._PAYLOAD_AT + x.nbytes] * peers


def test_a_large_sum_moves_its_payload_after_the_header(message_workers, recorder):
    workers = message_workers
    peers = workers.size - 1
    x = np.ones(LARGE, np.float32)
    (result,) = workers.sum([x], "test_communicator", None)
    np.testing.assert_array_equal(result, np.full(LARGE, workers.size, np.float32))
    calls, header = recorder.calls, communicator_module._HEADER_BYTES
    if workers.size == 2:  # the halves: this rank's half of the input, then its half of the sum
        assert calls.count("Isend") == calls.count("Irecv") == 3 and "Iallreduce" not in calls, calls
        assert recorder.sent == [header, x.nbytes // 2, x.nbytes // 2]
    else:
        assert calls.count("Iallreduce") == 1 and calls.count("Isend") == peers, calls
        assert recorder.sent == [header] * peers
    before_the_headers = calls[: calls.index("done")]
    assert before_the_headers.count("Isend") == peers and "Iallreduce" not in before_the_headers, calls


# --- the check still catches every mismatch ---------------------------------------------------


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["small", "large"])
def test_a_mismatch_of_the_same_byte_count_raises_on_every_rank_naming_both(workers, size):
    # The payloads have the same bytes, so they travel and sum without complaint: only the
    # header's digest, carried by the same exchange, can tell the shapes apart.
    shape = (size,) if workers.rank == 0 else (size // 4, 4)
    with pytest.raises(td.errors.InvalidArgumentError, match=rf"rank 0 called .*float32\[{size}\].*rank 1 called"):
        workers.sum([np.ones(shape, np.float32)], "test_communicator", None)
    (result,) = workers.sum([np.ones(8, np.float32)], "test_communicator", None)
    np.testing.assert_array_equal(result, np.full(8, workers.size, np.float32))


@pytest.mark.parametrize("sizes", [(SMALL, 3 * SMALL), (SMALL, LARGE)], ids=["small-small", "small-large"])
def test_payloads_of_different_sizes_raise_on_every_rank_and_the_next_sum_works(workers, sizes):
    # Each rank receives exactly what its peer's header announced: no truncation, no message left over.
    size = sizes[min(workers.rank, 1)]
    with pytest.raises(td.errors.InvalidArgumentError, match="do not match"):
        workers.sum([np.ones(size, np.int64)], "test_communicator", None)
    (result,) = workers.sum([np.ones(SMALL, np.int64)], "test_communicator", None)
    np.testing.assert_array_equal(result, np.full(SMALL, workers.size, np.int64))


def test_a_rank_failing_before_a_small_sum_fails_every_rank_and_they_stay_in_step(workers):
    seq = workers.seq
    if workers.rank == 1:
        error = ValueError("rank 1 could not prepare its gradient")
        workers.failed_before(seq, "test_communicator", error)  # rank 0's payload is received and dropped
    else:
        with pytest.raises(td.errors.AbortedError, match=r"rank\(s\) 1 failed while preparing it"):
            workers.sum([np.ones(SMALL, np.float32)], "test_communicator", None)
    (result,) = workers.sum([np.ones(SMALL, np.float32)], "test_communicator", None)
    np.testing.assert_array_equal(result, np.full(SMALL, workers.size, np.float32))


# --- every dtype sums right, on both paths --------------------------------------------------------

DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16, np.float32, np.float64]
DTYPES += [np.complex64, np.bool_]


@pytest.mark.parametrize("size", [SMALL, LARGE, LARGE + 3], ids=["small", "large", "large-odd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_sums_exactly(workers, dtype, size):
    dtype = np.dtype(dtype)
    x = _rank_values(dtype, size, workers.rank)
    kept = x.copy()
    (result,) = workers.sum([x], "test_communicator", None)
    assert result.dtype == dtype
    np.testing.assert_array_equal(result, _want(dtype, size, workers.size))
    np.testing.assert_array_equal(x, kept)  # the input is sent as it is, never written


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["small", "large"])
def test_a_pack_of_several_dtypes_sums_each_exactly(workers, size):
    dtypes = [np.dtype(np.int32), np.dtype(np.float16), np.dtype(np.int32), np.dtype(np.float64)]
    arrays = [_rank_values(dtype, size // 4 + k, workers.rank) for k, dtype in enumerate(dtypes)]
    results = workers.sum(arrays, "test_communicator", None)
    for k, (dtype, result) in enumerate(zip(dtypes, results)):
        assert result.dtype == dtype
        np.testing.assert_array_equal(result, _want(dtype, size // 4 + k, workers.size))


@pytest.mark.parametrize("size", [SMALL, LARGE, LARGE + 3], ids=["small", "large", "large-odd"])
def test_a_sum_into_its_own_input_is_right(workers, size):
    x = _rank_values(np.dtype(np.int32), size, workers.rank)
    (result,) = workers.sum([x], "test_communicator", None, out=[x])
    assert result is x or np.shares_memory(result, x)
    np.testing.assert_array_equal(x, _want(np.dtype(np.int32), size, workers.size))


# --- the host's shared window ---------------------------------------------------------------


@pytest.fixture
def window_workers(monkeypatch: pytest.MonkeyPatch) -> Any:
    return _workers("window", monkeypatch)


def test_a_small_sum_in_the_host_window_makes_no_mpi_call(window_workers, monkeypatch):
    workers = window_workers
    communicator = workers.communicator
    recorder = _Recorder(communicator._comm, communicator._Testall)
    monkeypatch.setattr(communicator, "_comm", recorder)
    x = np.ones(SMALL, np.float32) * (workers.rank + 1)
    (result,) = workers.sum([x], "test_communicator", None)
    np.testing.assert_array_equal(result, np.full(SMALL, workers.size * (workers.size + 1) / 2, np.float32))
    assert recorder.calls == []


def test_a_rank_waiting_in_the_host_window_blocks_instead_of_polling(window_workers):
    """Rank 0 arrives ~0.3 s before the others: it waits on its doorbell, using almost no CPU."""
    import time

    workers = window_workers
    workers.sum([np.ones(4, np.float32)], "test_communicator", None)  # in step
    if workers.rank != 0:
        deadline = time.perf_counter() + 0.3
        while time.perf_counter() < deadline:  # computing (the wait is rank 0's, not a synchronisation)
            pass
    cpu, wall = time.process_time(), time.perf_counter()
    (result,) = workers.sum([np.ones(4, np.float32)], "test_communicator", None)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    np.testing.assert_array_equal(result, np.full(4, workers.size, np.float32))
    if workers.rank == 0:
        assert wall > 0.2, wall  # it did wait for the others
        assert cpu < 0.25 * wall, (cpu, wall)  # ... blocked, not polling: a polling rank uses its core throughout


def test_turning_the_host_window_off_on_one_rank_turns_it_off_for_all(window_workers, monkeypatch):
    from towerdist._src.multi_worker import host_window

    communicator = window_workers.communicator

    def allgather(value: Any) -> list[Any]:
        return communicator.local_allgather(value, 60.0, None)

    if window_workers.rank == window_workers.size - 1:
        monkeypatch.setenv("TOWERDIST_HOST_WINDOW", "0")
    assert host_window.open_window(communicator._MPI, communicator._local, 4096, allgather) is None
    monkeypatch.delenv("TOWERDIST_HOST_WINDOW", raising=False)
    window = host_window.open_window(communicator._MPI, communicator._local, 4096, allgather)
    assert window is not None
    window.close()
