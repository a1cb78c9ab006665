"""Simulated GPUs model uploads from pinned host memory: asynchronous, ordered by events, read late.

``cupy.cuda.alloc_pinned_memory`` gives page-locked host memory; ``ndarray.set(view, stream)``
from it is ``cudaMemcpyAsync``: queued on the stream, reading the host bytes some time before
it completes. So the device array is written on that stream (other streams must wait for an
event), and the host must not write the bytes again before the copy is known to be done.
Each test builds its own simulated machine.
"""

from __future__ import annotations

import numpy as np
import pytest

from towerdist._src.backend.simulated import cupy as simulated_cupy
from towerdist._src.backend.simulated.cuda import SimulatedGPUError, UnorderedAccessError


@pytest.fixture
def cp(monkeypatch):
    """A simulated cupy module with 1 GPU whose default stream is the legacy null stream."""
    monkeypatch.delenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    return simulated_cupy.module(1)


def staged(cp, values):
    """A float32 host array over new pinned memory, holding ``values``."""
    memory = cp.cuda.alloc_pinned_memory(4 * len(values))
    view = np.frombuffer(memory, np.float32, len(values))
    view[...] = values
    return view


def upload(cp, view, stream):
    with stream:
        target = cp.empty(view.shape, view.dtype)
    target.set(view, stream=stream)
    return target


def test_an_upload_from_pinned_memory_arrives_for_a_stream_that_waited_for_its_event(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    target = upload(cp, staged(cp, [1, 2, 3]), stream)
    cp.cuda.get_current_stream().wait_event(stream.record())
    assert (target * 2).get().tolist() == [2.0, 4.0, 6.0]


def test_reading_an_upload_from_pinned_memory_on_another_stream_without_an_event_is_unordered(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    target = upload(cp, staged(cp, [1, 2, 3]), stream)
    with pytest.raises(UnorderedAccessError, match="unordered read"):
        cp.sum(target)


def test_writing_pinned_memory_before_its_copy_is_known_done_is_detected_at_the_next_upload(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    view = staged(cp, [1, 2, 3])
    upload(cp, view, stream)
    view[...] = [7, 8, 9]  # the copy may not have read the bytes yet
    with pytest.raises(SimulatedGPUError, match="The host wrote into pinned memory while an asynchronous upload"):
        upload(cp, view, stream)


def test_writing_pinned_memory_while_its_copy_is_in_flight_is_detected_when_the_copy_completes(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    view = staged(cp, [1, 2, 3])
    upload(cp, view, stream)
    event = stream.record()
    view[...] = [7, 8, 9]
    with pytest.raises(SimulatedGPUError, match="in flight"):
        event.synchronize()


@pytest.mark.parametrize("wait", ["event.done", "event.synchronize", "stream.synchronize"])
def test_pinned_memory_may_be_written_again_once_its_copy_is_known_done(cp, wait):
    stream = cp.cuda.Stream(non_blocking=True)
    view = staged(cp, [1, 2, 3])
    first = upload(cp, view, stream)
    event = stream.record()
    if wait == "event.done":
        assert event.done
    elif wait == "event.synchronize":
        event.synchronize()
    else:
        stream.synchronize()
    view[...] = [7, 8, 9]
    second = upload(cp, view, stream)
    stream.synchronize()
    assert first.get().tolist() == [1.0, 2.0, 3.0]
    assert second.get().tolist() == [7.0, 8.0, 9.0]


def test_an_upload_from_pageable_memory_is_staged_at_once(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    host = np.array([1, 2, 3], np.float32)
    target = upload(cp, host, stream)
    host[...] = 0  # pageable: the driver staged the bytes before set() returned
    stream.synchronize()
    assert target.get().tolist() == [1.0, 2.0, 3.0]


def test_pinned_allocations_and_both_kinds_of_upload_are_counted(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    cp.machine.stats.snapshot(reset=True)
    upload(cp, staged(cp, [1, 2]), stream)
    upload(cp, np.ones(2, np.float32), stream)
    work = cp.machine.stats.snapshot()["host_work"]
    assert (work["pinned_allocs"], work["h2d_async"], work["h2d"]) == (1, 1, 1)
    assert work["kernel_launches"] == 0  # cupy.empty allocates without a kernel
