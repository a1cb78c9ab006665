"""Simulated GPUs model cupy's memory pool reusing freed blocks on their stream (``cupy/cuda/memory.pyx``).

cupy's ``SingleDeviceMemoryPool`` keeps one arena per stream (``_get_stream_identifier``: the
stream pointer, or one per thread for the per-thread default stream); a freed block returns to
the arena of the stream it was allocated on and is handed, without any synchronisation, to the
next allocation on that stream that it fits (sizes rounded up to 512 bytes, best fit first).
If another stream still uses the block, the new owner's work races with it. Each test names
the behaviour it mirrors.
"""

from __future__ import annotations

import concurrent.futures
import gc

import numpy as np
import pytest

from towerdist._src.backend.simulated import cupy as simulated_cupy
from towerdist._src.backend.simulated.cuda import UnorderedAccessError
from towerdist._src.backend.simulated.memory import FREE_BLOCKS_PER_ARENA

JOIN_SECONDS = 10.0
REUSE = r"unordered reuse of freed memory on the legacy null stream of GPU 0: memory last used by cupy\.ndarray\.sum"


@pytest.fixture
def cp(monkeypatch):
    """A simulated cupy module with 2 GPUs whose default streams are the legacy null streams."""
    monkeypatch.delenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    module = simulated_cupy.module(2)
    module.machine.hang_timeout = 0.3
    return module


def read_elsewhere(cp, size=256):
    """A block allocated on the null stream, read by a non-blocking stream, then freed; returns that stream."""
    block = cp.arange(size, dtype=np.float32)
    reader = cp.cuda.Stream(non_blocking=True)
    reader.wait_event(cp.cuda.get_current_stream().record())
    with reader:
        block.sum()
    del block
    gc.collect()
    return reader


def test_a_block_read_on_another_stream_then_freed_and_reallocated_on_its_stream_raises(cp):
    # cupy: the freed block goes straight to the next allocation of its stream (the null stream)
    # while the reader's kernel may still run on the other stream.
    reader = read_elsewhere(cp)
    with pytest.raises(UnorderedAccessError, match=REUSE + rf".* on stream 0x{reader.ptr:x} on GPU 0 was freed"):
        cp.empty(256, np.float32)


@pytest.mark.parametrize(
    "order",
    [
        pytest.param(lambda cp, reader: cp.cuda.get_current_stream().wait_event(reader.record()), id="wait_event"),
        pytest.param(lambda cp, reader: reader.synchronize(), id="stream.synchronize"),
        pytest.param(lambda cp, reader: reader.record().synchronize(), id="event.synchronize"),
        pytest.param(lambda cp, reader: cp.cuda.Device(0).synchronize(), id="Device.synchronize"),
    ],
)
def test_a_reallocation_ordered_after_the_other_streams_use_is_safe(cp, order):
    # The fixes: make the allocating stream wait for an event recorded after the use, or wait on the host.
    reader = read_elsewhere(cp)
    order(cp, reader)
    assert cp.zeros(256, np.float32).get().tolist() == [0.0] * 256


def test_only_the_allocating_streams_arena_reuses_the_block(cp):
    # cupy: the block returns to the arena of the stream it was allocated on; other streams
    # (and other devices) allocate from their own arenas.
    read_elsewhere(cp)
    with cp.cuda.Stream(non_blocking=True):
        cp.empty(256, np.float32)
    with cp.cuda.Device(1):
        cp.empty(256, np.float32)
    with pytest.raises(UnorderedAccessError, match=REUSE):
        cp.empty(256, np.float32)


def test_the_pool_hands_out_the_best_fitting_block_of_at_least_the_rounded_size(cp):
    # cupy (_round_size, Arena.get_chunk): sizes round up to 512 bytes; a block fits an
    # allocation no larger than it, and a larger allocation gets fresh memory.
    read_elsewhere(cp, size=256)  # 1024 bytes
    cp.empty(257, np.float32)  # 1028 bytes round up to 1536: it does not fit
    with pytest.raises(UnorderedAccessError, match=REUSE + r".*\(the block at 0x[0-9a-f]+ \(512 bytes\)"):
        cp.empty(100, np.float32)  # 400 bytes round up to 512: it takes (part of) the block


def test_an_array_kept_referenced_until_the_other_stream_is_done_is_never_reused(cp):
    # The other fix: hold the array until the reader's work has completed.
    block = cp.arange(256, dtype=np.float32)
    reader = cp.cuda.Stream(non_blocking=True)
    reader.wait_event(cp.cuda.get_current_stream().record())
    with reader:
        total = block.sum()
    fresh = cp.empty(256, np.float32)  # the block is still referenced: fresh memory
    reader.synchronize()
    del block
    assert fresh.size == 256 and cp.empty(256, np.float32).size == 256 and total.get() == 256 * 255 / 2


def test_the_free_lists_are_bounded(cp):
    # The simulation remembers a bounded number of freed blocks per arena (oldest forgotten).
    machine = cp.machine
    arrays = [cp.empty(16, np.uint8) for _ in range(FREE_BLOCKS_PER_ARENA + 10)]
    del arrays
    gc.collect()
    key = machine.stream_key(device_id=0)
    assert machine.allocator.free_count(key) == FREE_BLOCKS_PER_ARENA


@pytest.mark.timeout(30)
def test_with_per_thread_default_streams_each_thread_has_its_own_arena(cp, monkeypatch):
    # cupy (_get_stream_identifier, issue 5069): with CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 the
    # per-thread default stream of each thread is an arena of its own.
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:  # one thread, reused

        def allocate():
            block = cp.arange(256, dtype=np.float32)
            return block, cp.cuda.get_current_stream().record()

        block, ready = worker.submit(allocate).result(timeout=JOIN_SECONDS)
        cp.cuda.get_current_stream().wait_event(ready)
        block.sum()  # read on the main thread's per-thread default stream
        del block
        gc.collect()
        cp.empty(256, np.float32)  # the main thread's arena: another block
        with pytest.raises(UnorderedAccessError, match="unordered reuse of freed memory on the per-thread default"):
            worker.submit(lambda: cp.empty(256, np.float32)).result(timeout=JOIN_SECONDS)


@pytest.mark.parametrize("per_thread", [False, True], ids=["legacy null streams", "per-thread default streams"])
def test_a_block_copied_to_another_device_is_reusable_at_once_only_after_a_null_stream_copy(
    cp, monkeypatch, per_thread
):
    # CUDA (programming guide, "Peer-to-Peer Memory Copy"): a copy between two devices on the
    # legacy NULL stream finishes before any later work of either device starts, so the source
    # block may be reused at once; on any other stream (the per-thread default stream of
    # CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 included) the copy is ordered on its own stream only.
    if per_thread:
        monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    source = cp.arange(256, dtype=np.float32)
    cp.cuda.Device(0).synchronize()  # the copy reads finished data
    with cp.cuda.Device(1):
        copied = cp.asarray(source)  # a copy on GPU 1's current stream, reading GPU 0's block
    del source
    gc.collect()
    if not per_thread:
        assert cp.empty(256, np.float32).size == 256
        return
    with pytest.raises(UnorderedAccessError, match="last used by ndarray.copy.. between devices on the per-thread"):
        cp.empty(256, np.float32)
    with cp.cuda.Device(1):
        cp.cuda.get_current_stream().synchronize()
    assert cp.empty(256, np.float32).size == 256 and copied.device.id == 1
