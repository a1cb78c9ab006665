"""The simulated GPUs enforce the rules of real cupy and NCCL (``towerdist.testing``).

Each test names the cupy or NCCL behaviour it mirrors (``reference/cupy.md`` has the cupy
source of each rule). Every test builds its own simulated machine, so the tests neither
depend on nor disturb a process-wide simulation.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from towerdist._src.backend import gpu_module
from towerdist._src.backend.simulated import cupy as simulated_cupy
from towerdist._src.backend.simulated.cuda import CUDARuntimeError, SimulatedGPUError, UnorderedAccessError
from towerdist._src.backend.simulated.nccl import NcclError
from towerdist._src.backend.simulated.nccl_files import DIR_ENV_VAR
from towerdist.testing import simulate_gpus, simulated_gpus_enabled

JOIN_SECONDS = 10.0


@pytest.fixture
def cp(monkeypatch, tmp_path):
    """A simulated cupy module on its own machine with 3 GPUs; hangs are reported after 0.3 s.

    Its default streams are the legacy null streams (cupy's default), whatever the environment;
    NCCL ranks made from a unique id meet in ``tmp_path``.
    """
    monkeypatch.delenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    monkeypatch.setenv(DIR_ENV_VAR, str(tmp_path))
    module = simulated_cupy.module(3)
    module.machine.hang_timeout = 0.3
    return module


def on(cp, device, make):
    with cp.cuda.Device(device):
        return make()


def run_in_thread(target):
    """Runs ``target`` in a new thread; returns its result or re-raises its exception."""
    box = {}

    def body():
        try:
            box["result"] = target()
        except BaseException as error:  # handed back to the test
            box["error"] = error

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive(), "the thread did not finish"
    if "error" in box:
        raise box["error"]
    return box.get("result")


# --- devices and threads (cupy/cuda/device.pyx) --------------------------------------------------


def test_the_current_device_is_per_thread_and_starts_at_0(cp):
    # cupy: the current device is thread-local; a new thread starts on device 0.
    with cp.cuda.Device(1):
        assert run_in_thread(cp.cuda.runtime.getDevice) == 0

        def in_thread():
            with cp.cuda.Device(2):
                return cp.cuda.runtime.getDevice(), cp.zeros(2).device.id

        assert run_in_thread(in_thread) == (2, 2)
        assert cp.cuda.runtime.getDevice() == 1  # the other thread's switch did not leak here
    assert cp.cuda.runtime.getDevice() == 0


def test_a_device_scope_restores_the_previous_device_when_its_body_raises(cp):
    # cupy: Device.__exit__ restores the device that was current on entry.
    with pytest.raises(KeyError), cp.cuda.Device(2):
        raise KeyError("boom")
    assert cp.cuda.runtime.getDevice() == 0


def test_an_unknown_device_raises_a_cuda_runtime_error(cp):
    # CUDA: cudaSetDevice with an ordinal past the device count fails with cudaErrorInvalidDevice.
    with pytest.raises(CUDARuntimeError, match="cudaErrorInvalidDevice.*simulated GPU"), cp.cuda.Device(3):
        pass
    assert cp.cuda.runtime.getDeviceCount() == 3


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda cp: cp.asarray(np.ones(3)), id="asarray(numpy)"),
        pytest.param(lambda cp: cp.zeros(3), id="zeros"),
        pytest.param(lambda cp: cp.empty((2, 2)), id="empty"),
        pytest.param(lambda cp: cp.arange(4), id="arange"),
        pytest.param(lambda cp: cp.ones(3) * 2, id="arithmetic"),
        pytest.param(lambda cp: cp.ones(3).sum(), id="reduction"),
        pytest.param(lambda cp: np.maximum(cp.ones(3), 0), id="numpy ufunc"),
    ],
)
def test_arrays_are_allocated_on_the_current_device(cp, make):
    # cupy: allocations (and kernel outputs) go to the calling thread's current device.
    assert on(cp, 2, lambda: make(cp)).device.id == 2
    assert make(cp).device.id == 0


@pytest.mark.parametrize(
    "launch",
    [
        pytest.param(lambda cp, x: x + 1, id="operator"),
        pytest.param(lambda cp, x: cp.add(x, x), id="cupy.add"),
        pytest.param(lambda cp, x: np.maximum(x, 0), id="numpy ufunc"),
        pytest.param(lambda cp, x: x.sum(), id="method"),
        pytest.param(lambda cp, x: x.astype(np.float32), id="astype"),
        pytest.param(lambda cp, x: cp.concatenate([x, x]), id="concatenate"),
        pytest.param(lambda cp, x: x.fill(2.0), id="fill"),
        pytest.param(lambda cp, x: x.__setitem__(0, 5.0), id="setitem"),
        pytest.param(lambda cp, x: x.__iadd__(1), id="in-place"),
    ],
)
def test_an_operand_on_another_device_raises_without_peer_access(cp, launch):
    # cupy (_kernel.pyx, _check_peer_access): a kernel on device 1 reading an array of device 0
    # raises ValueError when peer access is unavailable; the simulated GPUs have none.
    x = cp.arange(4.0)
    with cp.cuda.Device(1), pytest.raises(ValueError, match="Peer access is unavailable.*simulated GPU"):
        launch(cp, x)
    np.testing.assert_array_equal(x.get(), [0.0, 1.0, 2.0, 3.0])  # nothing was written before raising


@pytest.mark.parametrize(
    "view",
    [
        pytest.param(lambda x: x[1:], id="slice"),
        pytest.param(lambda x: x.reshape(2, 2), id="reshape"),
        pytest.param(lambda x: x.reshape(2, 2).T, id="T"),
        pytest.param(lambda x: np.split(x, 2)[1], id="split"),
        pytest.param(lambda x: x.view(np.int64), id="view"),
    ],
)
def test_views_launch_no_kernel_and_stay_on_their_device(cp, view):
    # cupy: creating a view only computes strides, so it works from any current device.
    x = cp.arange(4.0)
    with cp.cuda.Device(1):
        result = view(x)
    assert result.device.id == 0 and result.data.mem is x.data.mem


def test_a_reshape_that_must_copy_is_a_kernel_on_the_current_device(cp):
    # cupy: reshaping a non-contiguous array copies it, a kernel on the current device.
    transposed = cp.arange(6.0).reshape(2, 3).T
    assert on(cp, 0, lambda: transposed.reshape(-1)).data.mem is not transposed.data.mem
    with cp.cuda.Device(1), pytest.raises(ValueError, match="Peer access"):
        transposed.reshape(-1)


# --- host and device (cupy/_core/core.pyx, _scalar.pyx) ------------------------------------------


@pytest.mark.parametrize(
    "convert",
    [
        pytest.param(np.asarray, id="np.asarray"),
        pytest.param(np.array, id="np.array"),
        pytest.param(lambda x: np.testing.assert_array_equal(x, [1, 1]), id="np.testing"),
    ],
)
def test_implicit_conversion_to_numpy_raises(cp, convert):
    # cupy: ndarray.__array__ raises TypeError; .get() is the explicit way.
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed.*simulated GPU"):
        convert(cp.ones(2))


@pytest.mark.parametrize(
    "combine",
    [
        pytest.param(lambda x: x + np.ones(2), id="device + numpy"),
        pytest.param(lambda x: np.ones(2) + x, id="numpy + device"),
        pytest.param(lambda x: x * np.array(2.0), id="0-d numpy"),
        pytest.param(lambda x: np.add(x, np.ones(2)), id="np.add"),
    ],
)
def test_numpy_array_operands_are_refused(cp, combine):
    # cupy (_scalar.pyx): numpy arrays, 0-d ones included, are not kernel operands.
    with pytest.raises(TypeError, match="Unsupported type.*simulated GPU"):
        combine(cp.ones(2))


@pytest.mark.parametrize("scalar", [2, 2.0, np.float32(2.0), np.int64(2)], ids=repr)
def test_python_and_numpy_scalars_are_accepted(cp, scalar):
    # cupy: Python numbers and numpy scalars are kernel operands.
    result = cp.ones(2, dtype=np.float32) * scalar
    np.testing.assert_array_equal(result.get(), [2.0, 2.0])


def test_numpy_functions_on_device_arrays_run_on_the_device(cp):
    # cupy: numpy functions dispatch through __array_ufunc__ / __array_function__ (NEP 13/18).
    x = on(cp, 1, lambda: cp.asarray(np.array([-1.0, 2.0])))
    with cp.cuda.Device(1):
        results = [np.maximum(x, 0), np.concatenate([x, x]), np.sum(x), np.sqrt(x * x)]
    assert all(isinstance(r, cp.ndarray) and r.device.id == 1 for r in results)
    assert [r.get().tolist() for r in results] == [[0.0, 2.0], [-1.0, 2.0, -1.0, 2.0], 1.0, [1.0, 2.0]]


def test_reductions_return_0d_device_arrays(cp):
    # cupy: x.sum() is a 0-d cupy array, not a host scalar.
    total = cp.arange(4.0).sum()
    assert isinstance(total, cp.ndarray) and total.shape == () and float(total) == 6.0


def test_asarray_uploads_and_get_downloads_copies(cp):
    # cupy: asarray(numpy) copies to the current device; .get() returns a new host array.
    host = np.arange(3.0)
    device = on(cp, 2, lambda: cp.asarray(host))
    host[0] = 99.0
    assert device.device.id == 2 and device.get().tolist() == [0.0, 1.0, 2.0]
    fetched = device.get()
    fetched[1] = 99.0
    assert cp.asnumpy(device).tolist() == [0.0, 1.0, 2.0]


def test_asarray_copies_a_contiguous_array_from_another_device(cp):
    # cupy (_array_from_cupy_ndarray): an array of another device is copied to the current one.
    x = cp.arange(4.0)
    y = on(cp, 1, lambda: cp.asarray(x))
    assert y.device.id == 1 and y.data.mem is not x.data.mem and y.get().tolist() == x.get().tolist()
    assert cp.asarray(x) is x  # already on the current device: no copy


@pytest.mark.parametrize(
    "copy",
    [
        pytest.param(lambda cp, x: cp.asarray(x), id="asarray"),
        pytest.param(lambda cp, x: cp.array(x), id="array"),
        pytest.param(lambda cp, x: x.copy(order="K"), id="copy(order=K)"),
    ],
)
def test_non_contiguous_copies_between_devices_raise(cp, copy):
    # cupy (core.pyx, ndarray.copy): "CuPy cannot copy non-contiguous array between devices."
    strided = cp.arange(6.0)[::2]
    with cp.cuda.Device(1), pytest.raises(NotImplementedError, match="non-contiguous array between devices"):
        copy(cp, strided)
    assert on(cp, 1, lambda: copy(cp, cp.arange(6.0).reshape(2, 3).T)).device.id == 1  # F-contiguous is fine


def test_copy_makes_a_contiguous_copy_on_the_source_device_first(cp):
    # cupy (ndarray.copy, order 'C'): made contiguous on its own device, then copied over.
    strided = cp.arange(6.0)[::2]
    copied = on(cp, 1, strided.copy)
    assert copied.device.id == 1 and copied.get().tolist() == [0.0, 2.0, 4.0]


def test_ascontiguousarray_returns_a_contiguous_array_itself_and_copies_others_on_the_current_device(cp):
    # cupy (core.pyx ascontiguousarray): no copy when already C-contiguous, else an elementwise copy.
    x = cp.arange(6.0).reshape(2, 3)
    assert on(cp, 1, lambda: cp.ascontiguousarray(x)) is x
    assert cp.ascontiguousarray(x.T).flags.c_contiguous
    with cp.cuda.Device(1), pytest.raises(ValueError, match="Peer access"):
        cp.ascontiguousarray(x.T)
    with pytest.raises(TypeError, match="incorrect type"):
        cp.ascontiguousarray(np.ones(2))


@pytest.mark.parametrize("host", [np.array(["a", "b"]), np.array([object(), object()])], ids=["str", "object"])
def test_string_and_object_dtypes_are_refused(cp, host):
    # cupy (_dtype.pyx): "Unsupported dtype" for strings and objects.
    with pytest.raises(ValueError, match="Unsupported dtype.*simulated GPU"):
        cp.asarray(host)


def test_data_pointers_address_views_inside_their_allocation(cp):
    # cupy: ndarray.data.ptr is the first element's address; data.mem.ptr the allocation's.
    x = cp.arange(8, dtype=np.float32)
    assert x[2:].data.ptr == x.data.ptr + 8 and x[2:].data.mem.ptr == x.data.mem.ptr
    assert cp.zeros(4).data.ptr != x.data.ptr
    assert cp.empty(0).data.ptr == 0  # an empty allocation has address 0, as in cupy


def test_binary_operators_defer_to_objects_that_opt_out_of_ufuncs(cp):
    # cupy (core.pyx, _should_use_rop): a right operand with __array_ufunc__ = None gets __radd__.
    class OptsOut:
        __array_ufunc__ = None

        def __radd__(self, other):
            return "deferred"

    assert cp.ones(2) + OptsOut() == "deferred"


# --- streams and events (cupy/cuda/stream.pyx) ----------------------------------------------------


def test_streams_and_events(cp):
    # cupy: the default current stream is the null stream (pointer 0); `with stream:` makes a
    # stream current for this thread only; events record a stream's queued work.
    assert cp.cuda.get_current_stream().ptr == 0
    stream = cp.cuda.Stream(non_blocking=True)
    other = cp.cuda.Stream()
    assert stream.ptr not in (0, other.ptr) and stream.done
    with stream:
        assert cp.cuda.get_current_stream() is stream
        assert run_in_thread(lambda: cp.cuda.get_current_stream().ptr) == 0
    assert cp.cuda.get_current_stream().ptr == 0
    event = cp.cuda.Event()
    event.record(stream)
    other.wait_event(event)
    event.synchronize()
    stream.synchronize()
    cp.cuda.Device(0).synchronize()
    assert event.done and stream.record().done


# --- a stream and an event belong to one device (cupy/cuda/stream.pyx, CUDA's event rules) --------


def test_making_a_stream_of_another_device_current_raises(cp):
    # cupy (stream.pyx, check_stream_device_match): `with stream:` and stream.use() raise
    # RuntimeError when the stream was created on another device than the current one.
    stream = on(cp, 1, cp.cuda.Stream)
    expected = r"The device that the stream is created on \(1\) does not match with the current device \(0\).*simulated"
    with pytest.raises(RuntimeError, match=expected), stream:
        pass
    with pytest.raises(RuntimeError, match=expected):
        stream.use()
    assert cp.cuda.get_current_stream().ptr == 0  # nothing changed
    with cp.cuda.Device(1), stream:
        assert cp.cuda.get_current_stream() is stream
    with cp.cuda.Device(2), cp.cuda.Stream.null:  # the default streams belong to whichever device is current
        assert cp.cuda.get_current_stream().ptr == 0


def test_recording_an_event_on_a_stream_of_another_device_raises(cp):
    # CUDA (cudaEventRecord): the event and the stream must belong to the same device, else
    # cudaErrorInvalidResourceHandle; cupy.cuda.Event belongs to the device current at its creation.
    event = cp.cuda.Event()  # GPU 0
    stream = on(cp, 1, cp.cuda.Stream)
    with pytest.raises(CUDARuntimeError, match="cudaErrorInvalidResourceHandle.*made on GPU 0 and recorded on stream"):
        event.record(stream)
    with cp.cuda.Device(1), pytest.raises(CUDARuntimeError, match="cudaErrorInvalidResourceHandle"):
        event.record()  # the null stream of the current device, GPU 1
    with cp.cuda.Device(1):
        assert stream.record().done  # an event made while GPU 1 is current, as Stream.record() does


def test_a_stream_may_wait_for_an_event_of_another_device(cp):
    # CUDA (cudaStreamWaitEvent): the stream and the event may belong to different devices.
    producer = cp.cuda.Stream(non_blocking=True)
    data = produce_on(cp, producer)
    ready = producer.record()
    with cp.cuda.Device(1):
        consumer = cp.cuda.Stream(non_blocking=True)
        with consumer, pytest.raises(UnorderedAccessError):
            cp.asarray(data)  # a copy on GPU 1's stream of data GPU 0's stream wrote
        consumer.wait_event(ready)
        with consumer:
            assert cp.asarray(data).get().tolist() == [0.0, 2.0, 4.0, 6.0]


# --- ordering between streams (cupy.md, "Streams") ----------------------------------------------
# "Work on different streams is unordered: data produced by a replica on its stream must be
# ordered before a collective or a copy on another stream (record an Event,
# stream.wait_event(event)), or synchronised."

UNORDERED = r"unordered (read|write) on .* of data written on .*record an Event on the producer's stream"


def produce_on(cp, stream):
    with stream:
        return cp.arange(4, dtype=np.float32) * 2


def test_using_data_of_another_stream_without_ordering_raises(cp):
    producer, consumer = cp.cuda.Stream(), cp.cuda.Stream()
    data = produce_on(cp, producer)
    with consumer:
        expected = f"unordered read on stream 0x{consumer.ptr:x} on GPU 0 of data written on stream 0x{producer.ptr:x}"
        with pytest.raises(UnorderedAccessError, match=expected):
            data + 1
        with pytest.raises(UnorderedAccessError, match="unordered write"):
            data += 1
        with pytest.raises(UnorderedAccessError, match=UNORDERED):
            data.get()  # a host copy on the consumer stream
    assert issubclass(UnorderedAccessError, SimulatedGPUError)
    assert (data + 1).get().tolist() == [1.0, 3.0, 5.0, 7.0]  # the legacy null stream waits for blocking streams


def test_an_event_recorded_on_the_producer_and_waited_for_orders_the_consumer(cp):
    producer, consumer, third = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(), cp.cuda.Stream()
    data = produce_on(cp, producer)
    ready = cp.cuda.Event()
    ready.record(producer)
    consumer.wait_event(ready)
    with consumer:
        total = data + 1
    with third, pytest.raises(UnorderedAccessError):
        total * 2  # waiting is per stream: the third stream waited for nothing
    handed_on = consumer.record()
    third.wait_event(handed_on)  # ordered after the consumer, and so after the producer (transitively)
    with third:
        assert (total * 2 + data).get().tolist() == [2.0, 8.0, 14.0, 20.0]
    with producer:
        data += 1  # a later write on the producer is not covered by the earlier event
    with consumer, pytest.raises(UnorderedAccessError):
        data.sum()


def test_synchronizing_the_producer_stream_orders_later_work(cp):
    producer, consumer = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    data = produce_on(cp, producer)
    producer.synchronize()
    with consumer:
        assert (data + 1).get().tolist() == [1.0, 3.0, 5.0, 7.0]


def test_synchronizing_the_device_orders_later_work(cp):
    with cp.cuda.Device(1):
        producer = cp.cuda.Stream(non_blocking=True)
        consumer = cp.cuda.Stream(non_blocking=True)
        data = produce_on(cp, producer)
        cp.cuda.Device(0).synchronize()  # another device: no help
        with consumer, pytest.raises(UnorderedAccessError):
            data + 1
    cp.cuda.Device(1).synchronize()
    with cp.cuda.Device(1), consumer:
        assert (data + 1).get().tolist() == [1.0, 3.0, 5.0, 7.0]


def test_the_legacy_null_stream_is_one_stream_shared_by_all_threads(cp):
    # cupy's default (no CUPY_CUDA_PER_THREAD_DEFAULT_STREAM): every thread's current stream is
    # the legacy null stream of the device, so two threads' work is ordered.
    data = run_in_thread(lambda: cp.arange(3, dtype=np.float32))
    assert cp.cuda.get_current_stream() is cp.cuda.Stream.null
    total = data + 1
    # ...but not with a non-blocking stream, which does not synchronise with the null stream.
    with cp.cuda.Stream(non_blocking=True), pytest.raises(UnorderedAccessError, match="legacy null stream"):
        total + 1
    assert total.get().tolist() == [1.0, 2.0, 3.0]


def test_per_thread_default_streams_are_distinct_streams(cp, monkeypatch):
    # CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: each thread's default stream is its own (Stream.ptds).
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    assert cp.cuda.get_current_stream().ptr == 2
    data = run_in_thread(lambda: cp.arange(3, dtype=np.float32))
    with pytest.raises(UnorderedAccessError, match="per-thread default stream of thread 'MainThread'"):
        data + 1
    with pytest.raises(UnorderedAccessError):
        data.get()
    cp.cuda.Device(0).synchronize()  # waits for every stream of the device, other threads' too
    assert (data + 1).get().tolist() == [1.0, 2.0, 3.0]
    # The other direction: the main thread's result, read by a new thread without ordering.
    result = data * 2
    with pytest.raises(UnorderedAccessError, match="data written on the per-thread default stream of thread"):
        run_in_thread(lambda: result.sum())
    ready = cp.cuda.get_current_stream().record()

    def ordered_read():
        cp.cuda.get_current_stream().wait_event(ready)
        return result.sum().item()

    assert run_in_thread(ordered_read) == 6.0


def test_a_copy_between_devices_runs_on_the_destination_stream(cp, monkeypatch):
    # cupy copies between devices on the current stream of the current (destination) device:
    # the source must be finished on its own device first.
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    source = on(cp, 1, lambda: cp.arange(3, dtype=np.float32))
    with pytest.raises(UnorderedAccessError, match="on GPU 0 of data written on .* on GPU 1"):
        cp.asarray(source)
    cp.cuda.Device(1).synchronize()
    assert cp.asarray(source).get().tolist() == [0.0, 1.0, 2.0]


def test_a_collective_reads_and_writes_its_buffers_on_its_stream(cp):
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    buffers = arrays_on_devices(cp, [[1.0], [2.0]])  # written on the legacy null streams
    streams = [on(cp, i, lambda: cp.cuda.Stream(non_blocking=True)) for i in range(2)]

    def group():
        nccl.groupStart()
        for comm, buffer, stream in zip(comms, buffers, streams):
            comm.allReduce(buffer.data.ptr, buffer.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        nccl.groupEnd()

    with pytest.raises(UnorderedAccessError, match="of data written on the legacy null stream of GPU 0: allReduce"):
        group()
    for i, stream in enumerate(streams):
        with cp.cuda.Device(i):
            stream.wait_event(cp.cuda.get_current_stream().record())
    group()
    with pytest.raises(UnorderedAccessError, match="written by NCCL allReduce"):
        buffers[0].get()  # the sum was written on the collective's stream
    for i, stream in enumerate(streams):
        with cp.cuda.Device(i):
            stream.synchronize()
    assert [b.get().tolist() for b in buffers] == [[3.0], [3.0]]


# --- write-after-read (CUDA: a write on one stream may overtake a read queued on another) ---------


def read_on(cp, stream, data):
    with stream:
        return data.sum()


def test_a_write_after_an_unordered_read_on_another_stream_raises(cp):
    # CUDA: streams run concurrently, so a kernel on stream B that overwrites data a kernel on
    # stream A still reads races with it, unless B waits for an event recorded on A after the read.
    data = cp.arange(4, dtype=np.float32)
    cp.cuda.Device(0).synchronize()
    reader, writer = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    total = read_on(cp, reader, data)
    expected = (
        f"unordered write on stream 0x{writer.ptr:x} on GPU 0 of data read on stream 0x{reader.ptr:x} on GPU 0 "
        r"\(write-after-read\): cupy.ndarray.fill writes .* last read by cupy.ndarray.sum"
    )
    with writer, pytest.raises(UnorderedAccessError, match=expected):
        data.fill(0)
    with writer, pytest.raises(UnorderedAccessError, match="write-after-read"):
        data.set(np.zeros(4, np.float32))  # an upload into it is a write too
    writer.wait_event(reader.record())
    with writer:
        data.fill(0)
    reader.synchronize()
    writer.synchronize()
    assert total.get() == 6.0 and data.get().tolist() == [0.0] * 4


def test_a_write_after_a_read_is_ordered_by_the_readers_own_stream_or_a_host_sync(cp):
    # CUDA: work on one stream runs in order; a synchronisation orders later work of every stream.
    data = cp.arange(4, dtype=np.float32)
    cp.cuda.Device(0).synchronize()
    reader, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    read_on(cp, reader, data)
    with reader:
        data.fill(1)  # the reader's own stream
    reader.synchronize()
    read_on(cp, other, data)
    other.synchronize()
    with reader:
        data.fill(2)  # after the host waited for the other stream's read
    assert data.get(stream=reader).tolist() == [2.0] * 4


def test_a_collective_writing_a_buffer_another_stream_still_reads_raises(cp):
    # NCCL writes its receive buffer on the collective's stream: after an unordered read on
    # another stream, that is a write-after-read race.
    nccl = cp.cuda.nccl
    comm = nccl.NcclCommunicator.initAll([0])[0]
    buffer = cp.ones(2, np.float32)
    cp.cuda.Device(0).synchronize()
    reader, stream = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    read_on(cp, reader, buffer)
    with pytest.raises(UnorderedAccessError, match="write-after-read.*allReduce"):
        comm.allReduce(buffer.data.ptr, buffer.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    stream.wait_event(reader.record())
    comm.allReduce(buffer.data.ptr, buffer.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    stream.synchronize()
    assert buffer.get().tolist() == [1.0, 1.0]


# --- NCCL (cupy/cuda/nccl.pyx) -------------------------------------------------------------------


def arrays_on_devices(cp, values, dtype=np.float32):
    return [on(cp, i, lambda v=v: cp.asarray(np.asarray(v, dtype=dtype))) for i, v in enumerate(values)]


def all_reduce(cp, comms, sends, recvs, op=None, dtype=None):
    nccl = cp.cuda.nccl
    kind = dtype or nccl.NCCL_FLOAT32
    for comm, send, recv in zip(comms, sends, recvs):
        comm.allReduce(send.data.ptr, recv.data.ptr, send.size, kind, nccl.NCCL_SUM if op is None else op, 0)


def test_init_all_gives_one_communicator_per_device_ranked_by_position(cp):
    # cupy: NcclCommunicator.initAll(devices) returns one communicator per device, rank = position.
    comms = cp.cuda.nccl.NcclCommunicator.initAll([2, 0])
    assert [(c.device_id(), c.rank_id(), c.size()) for c in comms] == [(2, 0, 2), (0, 1, 2)]


@pytest.mark.parametrize(
    ("op", "expected"),
    [("NCCL_SUM", [6.0, 9.0]), ("NCCL_MAX", [3.0, 4.0]), ("NCCL_MIN", [1.0, 2.0]), ("NCCL_PROD", [6.0, 24.0]),
     ("NCCL_AVG", [2.0, 3.0])],
)  # fmt: skip
def test_all_reduce_in_a_group_combines_every_rank(cp, op, expected):
    # NCCL: allReduce combines the ranks' send buffers into every rank's receive buffer.
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(3)
    sends = arrays_on_devices(cp, [[1, 2], [2, 3], [3, 4]])
    recvs = [on(cp, i, lambda s=s: cp.empty_like(s)) for i, s in enumerate(sends)]
    nccl.groupStart()
    all_reduce(cp, comms, sends, recvs, op=getattr(nccl, op))
    nccl.groupEnd()
    assert [r.get().tolist() for r in recvs] == [expected] * 3


def test_group_calls_launch_only_at_group_end(cp):
    # NCCL: calls between groupStart() and groupEnd() are queued; groupEnd() launches them.
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    buffers = arrays_on_devices(cp, [[1.0], [2.0]])
    nccl.groupStart()
    all_reduce(cp, comms, buffers, buffers)
    assert [b.get().tolist() for b in buffers] == [[1.0], [2.0]]
    nccl.groupEnd()
    assert [b.get().tolist() for b in buffers] == [[3.0], [3.0]]


def test_a_buffer_freed_before_group_end_raises(cp):
    # NCCL: buffers must stay alive until the group is launched at groupEnd(); a temporary
    # dropped earlier may be reused by the allocator for the next rank (a silently wrong sum).
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    sources = arrays_on_devices(cp, [[1.0, 0.0, 2.0], [3.0, 0.0, 4.0]])
    recvs = [on(cp, i, lambda: cp.empty(2, np.float32)) for i in range(2)]
    nccl.groupStart()
    try:
        for i, (comm, source, recv) in enumerate(zip(comms, sources, recvs)):
            with cp.cuda.Device(i):
                contiguous = cp.ascontiguousarray(source[::2])  # a temporary, replaced next iteration
                comm.allReduce(contiguous.data.ptr, recv.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        del contiguous
        gc.collect()
    finally:
        with pytest.raises(SimulatedGPUError, match="freed before groupEnd"):
            nccl.groupEnd()


def test_buffers_kept_alive_until_group_end_are_summed(cp):
    # The fix for the rule above: hold the temporaries until groupEnd() has returned.
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    sources = arrays_on_devices(cp, [[1.0, 0.0, 2.0], [3.0, 0.0, 4.0]])
    recvs = [on(cp, i, lambda: cp.empty(2, np.float32)) for i in range(2)]
    kept = [on(cp, i, lambda s=s: cp.ascontiguousarray(s[::2])) for i, s in enumerate(sources)]
    nccl.groupStart()
    all_reduce(cp, comms, kept, recvs)
    nccl.groupEnd()
    assert [r.get().tolist() for r in recvs] == [[4.0, 6.0]] * 2


def test_a_buffer_on_another_device_than_its_communicator_raises(cp):
    # NCCL: buffers must live on the communicator's GPU (ncclInvalidArgument).
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll([0, 1])
    wrong = arrays_on_devices(cp, [[1.0], [2.0]])[::-1]
    with pytest.raises(NcclError, match="lives on GPU 1, but communicator rank 0 is on GPU 0"):
        all_reduce(cp, comms[:1], wrong[:1], wrong[:1])


def test_an_address_that_is_not_a_live_allocation_raises(cp):
    # NCCL reads raw addresses: one that no allocation holds is an invalid argument here.
    comm = cp.cuda.nccl.NcclCommunicator.initAll([0])[0]
    with pytest.raises(NcclError, match="not a live allocation"):
        comm.allReduce(0x1234, 0x1234, 1, cp.cuda.nccl.NCCL_FLOAT32, cp.cuda.nccl.NCCL_SUM, 0)


def test_count_zero_is_accepted(cp):
    # NCCL discards empty collectives.
    comm = cp.cuda.nccl.NcclCommunicator.initAll([0])[0]
    comm.allReduce(0, 0, 0, cp.cuda.nccl.NCCL_FLOAT32, cp.cuda.nccl.NCCL_SUM, 0)
    assert cp.cuda.Stream.null.done


def test_a_communicator_used_from_two_threads_at_once_raises(cp):
    # NCCL: a communicator is not thread-safe; a thread holds it from its first call in a
    # group until groupEnd(), and another thread's call meanwhile is a race.
    nccl = cp.cuda.nccl
    comm = nccl.NcclCommunicator.initAll([0])[0]
    buffer = cp.ones(2, np.float32)
    queued, release = threading.Event(), threading.Event()

    def hold_in_a_group():
        nccl.groupStart()
        comm.allReduce(buffer.data.ptr, buffer.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        queued.set()
        release.wait(JOIN_SECONDS)
        nccl.groupEnd()

    thread = threading.Thread(target=hold_in_a_group)
    thread.start()
    try:
        assert queued.wait(JOIN_SECONDS)
        with pytest.raises(SimulatedGPUError, match="used from two threads at once"):
            comm.allReduce(buffer.data.ptr, buffer.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    finally:
        release.set()
        thread.join(JOIN_SECONDS)
    assert not thread.is_alive()
    comm.allReduce(buffer.data.ptr, buffer.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)  # free again


def test_ranks_in_their_own_threads_complete_without_a_group(cp):
    # NCCL: one thread per rank needs no group; a collective completes once every rank called it.
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(3)
    buffers = arrays_on_devices(cp, [[1.0], [2.0], [3.0]])
    barrier = threading.Barrier(3, timeout=JOIN_SECONDS)

    def rank(i):
        with cp.cuda.Device(i):
            barrier.wait()
            all_reduce(cp, comms[i : i + 1], buffers[i : i + 1], buffers[i : i + 1])
            cp.cuda.get_current_stream().synchronize()
            return buffers[i].get().tolist()

    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, rank(i))) for i in range(3)]
    results = [None] * 3
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    assert results == [[6.0]] * 3


def test_reading_a_buffer_waits_for_its_queued_collective(cp):
    # CUDA streams run in order: a copy to the host after an all-reduce sees its result.
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    buffers = arrays_on_devices(cp, [[1.0], [2.0]])
    all_reduce(cp, comms[:1], buffers[:1], buffers[:1])  # rank 0 waits for rank 1
    assert not cp.cuda.Stream.null.done
    timer = threading.Timer(0.05, lambda: on(cp, 1, lambda: all_reduce(cp, comms[1:], buffers[1:], buffers[1:])))
    timer.start()
    try:
        assert buffers[0].get().tolist() == [3.0]
    finally:
        timer.join(JOIN_SECONDS)


def test_one_thread_driving_two_ranks_without_a_group_raises(cp):
    # NCCL: a thread managing several GPUs must group their calls, or it deadlocks.
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    buffers = arrays_on_devices(cp, [[1.0], [2.0]])
    all_reduce(cp, comms[:1], buffers[:1], buffers[:1])
    with pytest.raises(SimulatedGPUError, match="deadlocks"):
        all_reduce(cp, comms[1:], buffers[1:], buffers[1:])


def test_a_rank_that_never_calls_is_reported_instead_of_hanging_and_abort_ends_the_wait(cp):
    # NCCL: a collective waits for every rank; abort() ends the communicator's work, and the
    # other ranks see the failure through check_async_error().
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    buffers = arrays_on_devices(cp, [[1.0], [2.0]])
    all_reduce(cp, comms[:1], buffers[:1], buffers[:1])
    stream = cp.cuda.get_current_stream()
    assert not stream.done
    with pytest.raises(SimulatedGPUError, match=r"would hang.*waiting for ranks \[1\]"):
        stream.synchronize()
    comms[0].abort()
    assert stream.done
    with pytest.raises(NcclError, match="rank 0 .* was aborted"):
        comms[1].check_async_error()
    with pytest.raises(NcclError, match="aborted communicator"):
        all_reduce(cp, comms[:1], buffers[:1], buffers[:1])


def test_mismatched_collectives_raise(cp):
    # NCCL: the ranks must issue the same collectives in the same order (else a hang or garbage).
    nccl = cp.cuda.nccl
    comms = nccl.NcclCommunicator.initAll(2)
    buffers = arrays_on_devices(cp, [[1.0, 2.0], [2.0, 3.0]])
    nccl.groupStart()
    comms[0].allReduce(buffers[0].data.ptr, buffers[0].data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    comms[1].allReduce(buffers[1].data.ptr, buffers[1].data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    with pytest.raises(SimulatedGPUError, match="do not match across ranks"):
        nccl.groupEnd()


def test_communicators_from_a_unique_id_form_one_clique(cp):
    # cupy: NcclCommunicator(nranks, uid, rank), one rank per call, inside a group for one thread.
    nccl = cp.cuda.nccl
    uid = nccl.get_unique_id()
    assert len(uid) == 128
    nccl.groupStart()
    comms = [on(cp, i, lambda i=i: nccl.NcclCommunicator(2, uid, i)) for i in range(2)]
    nccl.groupEnd()
    buffers = arrays_on_devices(cp, [[1.0], [5.0]])
    nccl.groupStart()
    all_reduce(cp, comms, buffers, buffers)
    nccl.groupEnd()
    assert [b.get().tolist() for b in buffers] == [[6.0], [6.0]]


# --- unique ids: bytes since cupy 14 (cupy_backends/cuda/libs/nccl.pyx) --------------------------


def test_get_unique_id_returns_128_bytes_as_in_cupy_14(cp):
    # cupy 14: get_unique_id() returns bytes of NCCL_UNIQUE_ID_BYTES (128); before 14.0, a tuple.
    uid = cp.cuda.nccl.get_unique_id()
    assert type(uid) is bytes and len(uid) == 128 and uid != cp.cuda.nccl.get_unique_id()
    assert cp.__version__.startswith("14.")


@pytest.mark.parametrize(
    ("convert", "got"),
    [
        pytest.param(tuple, "tuple", id="tuple"),
        pytest.param(list, "list", id="list"),
        pytest.param(bytearray, "bytearray", id="bytearray"),
        pytest.param(lambda uid: uid.hex(), "str", id="hex str"),
    ],
)
def test_a_unique_id_that_is_not_bytes_is_refused_as_in_cupy_14(cp, convert, got):
    # cupy 14: NcclCommunicator(int ndev, bytes commId, int rank) is typed; Cython raises TypeError.
    uid = cp.cuda.nccl.get_unique_id()
    expected = rf"Argument 'commId' has incorrect type \(expected bytes, got {got}\).*simulated NCCL"
    with pytest.raises(TypeError, match=expected):
        cp.cuda.nccl.NcclCommunicator(1, convert(uid), 0)


def test_a_unique_id_of_another_length_is_refused_as_in_cupy_14(cp):
    # cupy 14: "commId length N != 128." (ValueError).
    with pytest.raises(ValueError, match=r"commId length 127 != 128\."):
        cp.cuda.nccl.NcclCommunicator(1, cp.cuda.nccl.get_unique_id()[:127], 0)


def test_the_cupy_13_switch_makes_unique_ids_tuples_of_signed_chars():
    # cupy 13: get_unique_id() returned a tuple of the id's chars (signed on x86), and the
    # constructor took only a tuple (tuple commId), copying each value into a char.
    cp13 = simulated_cupy.module(2, cupy_major=13)
    nccl = cp13.cuda.nccl
    assert cp13.__version__.startswith("13.") and nccl._simulation.unique_id_format == "tuple"
    uid = nccl.get_unique_id()
    assert type(uid) is tuple and len(uid) == 128 and all(-128 <= v <= 127 for v in uid)
    with pytest.raises(TypeError, match=r"expected tuple, got bytes"):
        nccl.NcclCommunicator(1, bytes(v & 0xFF for v in uid), 0)
    with pytest.raises(OverflowError, match="value too large to convert to char"):
        nccl.NcclCommunicator(1, (200,) + uid[1:], 0)  # an unsigned byte above 127
    comm = nccl.NcclCommunicator(1, tuple(uid), 0)  # passed along as returned
    assert comm.size() == 1


def test_the_test_hook_switches_the_unique_id_format_of_a_module(cp):
    hook = cp.cuda.nccl._simulation
    hook.unique_id_format = "tuple"
    assert cp.__version__.startswith("13.") and type(cp.cuda.nccl.get_unique_id()) is tuple
    hook.unique_id_format = "bytes"
    assert cp.__version__.startswith("14.") and type(cp.cuda.nccl.get_unique_id()) is bytes
    with pytest.raises(ValueError, match="unique_id_format must be 'bytes'"):
        hook.unique_id_format = "list"
    with pytest.raises(ValueError, match="cupy 13 and 14"):
        simulated_cupy.module(1, cupy_major=12)


# --- creating communicators (ncclCommInitRank, ncclCommInitAll) ----------------------------------


def test_creating_a_rank_outside_a_group_waits_for_every_rank_and_reports_a_missing_one(cp):
    # NCCL: ncclCommInitRank blocks until every rank has joined; one thread creating several
    # ranks must do it inside a group. Alone, the wait is reported instead of hanging.
    uid = cp.cuda.nccl.get_unique_id()
    with pytest.raises(SimulatedGPUError, match=r"NcclCommunicator\(2, uid, 0\) on GPU 0 would hang.*ranks \[1\]"):
        cp.cuda.nccl.NcclCommunicator(2, uid, 0)


def test_inside_a_group_creation_waits_at_group_end(cp):
    # NCCL: inside ncclGroupStart/End, ncclCommInitRank returns at once; the wait is at groupEnd.
    nccl = cp.cuda.nccl
    nccl.groupStart()
    comm = nccl.NcclCommunicator(2, nccl.get_unique_id(), 0)
    assert comm.size() == 2
    with pytest.raises(SimulatedGPUError, match=r"ranks \[1\] have not joined"):
        nccl.groupEnd()


@pytest.mark.parametrize("rank", [2, -1])
def test_a_rank_out_of_range_is_refused(cp, rank):
    with pytest.raises(NcclError, match="INVALID_ARGUMENT.*out of range"):
        cp.cuda.nccl.NcclCommunicator(2, cp.cuda.nccl.get_unique_id(), rank)


def test_two_ranks_of_one_communicator_on_the_same_gpu_are_refused(cp):
    # NCCL: "Duplicate GPU detected": every rank needs a GPU of its own (ncclInvalidUsage).
    nccl = cp.cuda.nccl
    uid = nccl.get_unique_id()
    nccl.groupStart()
    nccl.NcclCommunicator(2, uid, 0)
    nccl.NcclCommunicator(2, uid, 1)  # the same current device, GPU 0
    expected = (
        r"NCCL_ERROR_INVALID_USAGE: Duplicate GPU detected: rank 0 \(GPU 0 .*\) and rank 1 \(GPU 0 .*both on GPU 0"
    )
    with pytest.raises(NcclError, match=expected):
        nccl.groupEnd()
    with pytest.raises(NcclError, match="INVALID_USAGE: Duplicate GPU detected: initAll\\(\\[1, 1\\]\\)"):
        nccl.NcclCommunicator.initAll([1, 1])


@pytest.mark.timeout(30)
def test_ranks_in_their_own_threads_create_a_communicator_without_a_group(cp):
    # NCCL: one thread per rank, each calling ncclCommInitRank, which returns once all have joined.
    nccl = cp.cuda.nccl
    uid = nccl.get_unique_id()
    made = {}
    thread = threading.Thread(target=lambda: made.update(rank1=on(cp, 1, lambda: nccl.NcclCommunicator(2, uid, 1))))
    thread.start()
    try:
        made["rank0"] = nccl.NcclCommunicator(2, uid, 0)
    finally:
        thread.join(JOIN_SECONDS)
    comms = [made["rank0"], made["rank1"]]
    assert [(c.rank_id(), c.device_id(), c.size()) for c in comms] == [(0, 0, 2), (1, 1, 2)]
    buffers = arrays_on_devices(cp, [[1.0], [2.0]])
    nccl.groupStart()
    all_reduce(cp, comms, buffers, buffers)
    nccl.groupEnd()
    assert [b.get().tolist() for b in buffers] == [[3.0], [3.0]]


# --- NCCL and the per-thread default stream (cupy issue 4322) -------------------------------------


def test_an_init_all_communicator_on_the_per_thread_default_stream_is_refused(cp, monkeypatch):
    # cupy keeps NCCL on the legacy null stream (pointer 0) because the per-thread stream handle
    # (pointer 2) failed with communicators made by ncclCommInitAll.
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    nccl = cp.cuda.nccl
    comm = nccl.NcclCommunicator.initAll([0])[0]
    buffer = cp.ones(2, np.float32)
    ptr = buffer.data.ptr
    with pytest.raises(NcclError, match=r"INVALID_USAGE: allReduce .*initAll, on the per-thread default stream"):
        comm.allReduce(ptr, ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, cp.cuda.get_current_stream().ptr)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(cp.cuda.get_current_stream().record())
    comm.allReduce(ptr, ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)  # an explicit stream: allowed
    stream.synchronize()
    cp.cuda.Device(0).synchronize()
    comm.allReduce(ptr, ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)  # the legacy null stream: allowed
    assert buffer.get(stream=cp.cuda.Stream.null).tolist() == [1.0, 1.0]


def test_a_unique_id_communicator_may_use_the_per_thread_default_stream(cp, monkeypatch):
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    nccl = cp.cuda.nccl
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    buffer = cp.full(2, 3.0, np.float32)
    comm.allReduce(buffer.data.ptr, buffer.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 2)
    assert buffer.get().tolist() == [3.0, 3.0]


def test_group_end_without_group_start_raises(cp):
    # NCCL: ncclGroupEnd without ncclGroupStart is an invalid usage.
    with pytest.raises(NcclError, match="INVALID_USAGE"):
        cp.cuda.nccl.groupEnd()


# --- the switch (towerdist.testing) ---------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, True, "2", 1.5], ids=repr)
def test_simulate_gpus_needs_a_positive_int(n):
    with pytest.raises(ValueError, match="positive number of GPUs"):
        simulate_gpus(n)


@pytest.mark.parametrize("value", ["true", "0", "two"])
def test_a_malformed_environment_variable_fails_the_library_too(value):
    # The library swallowed it: device_count() read the error as "no GPU", so MirroredStrategy()
    # ran on one CPU and gpus(n) tests were skipped as "0 available"; only `towerdist info` said why.
    code = "import towerdist as td\nprint(td.distribute.MirroredStrategy().num_replicas_in_sync)"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "TOWERDIST_SIMULATE_GPUS": value, "PYTHONPATH": src}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout
    expected = (
        f"ValueError: TOWERDIST_SIMULATE_GPUS must be a positive number of simulated GPUs. Got "
        f"TOWERDIST_SIMULATE_GPUS={value!r}; set it to the number of GPUs to simulate"
    )
    assert expected in done.stderr, done.stderr


def test_the_environment_variable_switches_the_simulation_on(monkeypatch):
    for state in ("_chosen", "_simulated", "_requested", "_owns"):
        monkeypatch.setattr(gpu_module, state, None)
    monkeypatch.delenv(gpu_module.ENV_VAR, raising=False)
    assert gpu_module.simulated() is None and not simulated_gpus_enabled()
    monkeypatch.setenv(gpu_module.ENV_VAR, "two")
    with pytest.raises(ValueError, match="TOWERDIST_SIMULATE_GPUS must be a positive number"):
        gpu_module.simulated()
    monkeypatch.setenv(gpu_module.ENV_VAR, "2")
    module = gpu_module.simulated()
    assert module is not None and module.cuda.runtime.getDeviceCount() == 2 and simulated_gpus_enabled()
    assert simulated_cupy.owns(module.zeros(1)) and not simulated_cupy.owns(np.zeros(1))
    with pytest.raises(RuntimeError, match="simulate_gpus\\(3\\) was called after the simulation started with 2"):
        gpu_module.simulate(3)
