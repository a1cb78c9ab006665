"""Input batches reach GPU replicas through pinned staging buffers reused across steps.

A distributed iterator uploads each step's host arrays through page-locked buffers
(``backend/pinned_staging.py``), asynchronously on its copy stream, and writes a buffer
again only once the event recorded after its copy has completed. The values tests run on
any GPUs (``gpus(n)``: real or simulated); the tests that read the simulator's counters or
rely on its checks run on simulated GPUs only (``TOWERDIST_SIMULATE_GPUS=2``). The unit tests
of the reuse rule drive :class:`PinnedStaging` with stand-in events and run everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td
from towerdist._src.backend import pinned_staging
from towerdist._src.backend.pinned_staging import PinnedStaging
from towerdist.testing import simulated_gpus_enabled

BATCH = 8
STEPS = 6

simulated_only = pytest.mark.skipif(
    not simulated_gpus_enabled(),
    reason="reads the simulated GPUs' counters and checks: run with TOWERDIST_SIMULATE_GPUS=2",
)


def gpu_strategy(n: int) -> td.distribute.MirroredStrategy:
    return td.distribute.MirroredStrategy([d.name for d in td.config.list_logical_devices("GPU")[:n]])


def host_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((BATCH * 20, 5), dtype=np.float32), rng.integers(0, 10, BATCH * 20)


def distributed_iterator(strategy):
    x, y = host_data()
    dataset = td.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    return iter(strategy.experimental_distribute_dataset(dataset))


def host_work(reset: bool = False) -> dict[str, int]:
    from towerdist.testing import simulated_gpu_stats

    return simulated_gpu_stats(reset=reset)["host_work"]


def on_host(value) -> np.ndarray:
    return np.asarray(value.get() if hasattr(value, "get") else value)


# --- through a distributed iterator ----------------------------------------------------------------


@pytest.mark.parametrize("replicas", [pytest.param(1, marks=pytest.mark.gpus(1)), pytest.param(2, marks=pytest.mark.gpus(2))])
def test_every_batch_arrives_on_its_replicas_gpu_with_the_right_values(replicas):
    strategy = gpu_strategy(replicas)
    x, y = host_data()
    iterator = distributed_iterator(strategy)
    per_replica = BATCH // replicas
    for step in range(STEPS):
        features, labels = next(iterator)
        xs = strategy.experimental_local_results(features)
        ys = strategy.experimental_local_results(labels)
        for replica in range(replicas):
            start = step * BATCH + replica * per_replica
            assert xs[replica].device.id == replica
            np.testing.assert_array_equal(on_host(xs[replica]), x[start : start + per_replica])
            np.testing.assert_array_equal(on_host(ys[replica]), y[start : start + per_replica])


@simulated_only
@pytest.mark.gpus(2)
def test_uploads_are_asynchronous_from_pinned_buffers_and_no_step_allocates_after_warm_up():
    strategy = gpu_strategy(2)
    iterator = distributed_iterator(strategy)

    def step(features, labels):
        return td.reduce_sum(features) + td.cast(td.reduce_sum(labels), td.float32)

    for _ in range(3):  # warm-up: the staging buffers are allocated here
        strategy.run(step, args=next(iterator))
    host_work(reset=True)
    for _ in range(STEPS):
        strategy.run(step, args=next(iterator))
    work = host_work()
    assert work["pinned_allocs"] == 0
    assert work["h2d_async"] == STEPS * 2 * 2  # two arrays per replica per step, each from a staging buffer
    assert work["h2d"] == 0  # nothing from pageable memory


@simulated_only
@pytest.mark.gpus(1)
def test_a_staging_that_ignored_its_events_would_be_caught_by_the_simulated_gpus(monkeypatch):
    # The rule the library keeps, shown to be checked: reuse the first buffer whatever its event says.
    from towerdist._src.backend.simulated.cuda import SimulatedGPUError

    def careless(self, nbytes):
        return self._buffers[0] if self._buffers else original(self, nbytes)

    original = PinnedStaging._free_buffer
    monkeypatch.setattr(PinnedStaging, "_free_buffer", careless)
    iterator = distributed_iterator(gpu_strategy(1))
    with pytest.raises(SimulatedGPUError, match="The host wrote into pinned memory"):
        for _ in range(STEPS):
            next(iterator)


# --- the reuse rule, with stand-in events --------------------------------------------------------


class StandInEvent:
    """An event whose completion the test decides; it records whether the host waited for it."""

    def __init__(self, done: bool) -> None:
        self.finished = done
        self.waited = False

    @property
    def done(self) -> bool:
        return self.finished

    def synchronize(self) -> None:
        self.waited = True
        self.finished = True


class StandInTarget:
    def __init__(self, shape, dtype) -> None:
        self.shape, self.dtype, self.sources = shape, dtype, []

    def set(self, source, stream=None) -> None:
        self.sources.append((source, stream))


class StandInCupy:
    """Pinned allocations as bytearrays, device arrays that remember what was set into them."""

    def __init__(self) -> None:
        self.allocated: list[bytearray] = []
        self.cuda = self

    def alloc_pinned_memory(self, size: int) -> bytearray:
        self.allocated.append(bytearray(size))
        return self.allocated[-1]

    def empty(self, shape, dtype) -> StandInTarget:
        return StandInTarget(shape, dtype)


@pytest.fixture
def cupy(monkeypatch):
    module = StandInCupy()
    monkeypatch.setattr(pinned_staging.cupy_backend, "cupy_module", lambda: module)
    return module


def test_a_buffer_is_reused_once_its_copys_event_has_completed(cupy):
    staging = PinnedStaging(0)
    first = staging.upload(np.arange(4, dtype=np.float32), stream="copy stream")
    event = StandInEvent(done=True)
    staging.uploaded(event)
    second = staging.upload(np.arange(4, 8, dtype=np.float32), stream="copy stream")
    assert staging.allocations == 1 and not event.waited
    (staged_first, stream), (staged_second, _) = first.sources[0], second.sources[0]
    assert stream == "copy stream" and np.shares_memory(staged_first, staged_second)
    assert staged_second.tolist() == [4.0, 5.0, 6.0, 7.0]


def test_a_buffer_whose_copy_is_in_flight_is_not_written_a_new_one_is_allocated(cupy):
    staging = PinnedStaging(0)
    first = staging.upload(np.arange(4, dtype=np.float32), stream=None)
    staging.uploaded(StandInEvent(done=False))
    staging.upload(np.zeros(4, np.float32), stream=None)
    assert staging.allocations == 2
    assert first.sources[0][0].tolist() == [0.0, 1.0, 2.0, 3.0]  # the in-flight copy's bytes are untouched


def test_buffers_used_in_one_step_are_never_handed_out_twice_in_it(cupy):
    staging = PinnedStaging(0)
    a = staging.upload(np.ones(4, np.float32), stream=None)
    b = staging.upload(np.full(4, 2, np.float32), stream=None)
    assert staging.allocations == 2
    assert not np.shares_memory(a.sources[0][0], b.sources[0][0])


def test_with_the_pool_full_the_host_waits_for_the_oldest_copy_before_reusing_its_buffer(cupy, monkeypatch):
    monkeypatch.setattr(pinned_staging, "MAX_BUFFERS", 2)
    staging = PinnedStaging(0)
    events = []
    for _ in range(2):
        staging.upload(np.ones(4, np.float32), stream=None)
        events.append(StandInEvent(done=False))
        staging.uploaded(events[-1])
    staging.upload(np.ones(4, np.float32), stream=None)
    assert staging.allocations == 2
    assert events[0].waited and not events[1].waited


def test_an_empty_array_needs_no_staging_buffer(cupy):
    staging = PinnedStaging(0)
    target = staging.upload(np.zeros((0, 3), np.float32), stream=None)
    assert staging.allocations == 0 and target.sources == [] and target.shape == (0, 3)
