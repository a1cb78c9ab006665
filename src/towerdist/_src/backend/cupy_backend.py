"""The cupy backend: arrays in GPU memory, one device per GPU.

cupy is imported on first use, never when towerdist itself is imported. Every function
has the same name and meaning as in ``numpy_backend``. Functions that take a ``device``
expect a :class:`~towerdist._src.device.DeviceSpec` of type GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from towerdist._src.backend import cupy_streams, gpu_module
from towerdist._src.backend.gpu_module import GpuArray
from towerdist._src.errors import InvalidArgumentError, MissingDependencyError
from towerdist._src.type_aliases import DTypeLike, TensorLike

if TYPE_CHECKING:  # device names import this backend: only the type is named here
    from contextlib import AbstractContextManager

    from towerdist._src.device import DeviceSpec

name = "cupy"


def cupy_module() -> ModuleType:
    """The array module GPUs use: cupy, or the simulated GPUs' (``gpu_module``, the seam, chooses).

    Raises:
      MissingDependencyError: cupy is not installed (and no simulated GPUs are asked for).
    """
    return gpu_module.array_module()


def __getattr__(attr: str) -> ModuleType:
    if attr == "xp":
        return cupy_module()
    raise AttributeError(attr)


def is_available() -> bool:
    """True if cupy imports and sees at least one GPU."""
    return device_count() > 0


def device_count() -> int:
    """The number of visible CUDA GPUs (or simulated ones), 0 when cupy or a driver is missing.

    Raises:
      ValueError: ``TOWERDIST_SIMULATE_GPUS`` is set but is not a positive number (a typo
        must not quietly mean "no GPU").
    """
    try:
        module = cupy_module()
    except MissingDependencyError:
        return 0
    counted = _counted
    if counted is not None and counted[0] is module:
        return counted[1]
    return _count(module)


_counted: tuple[ModuleType, int] | None = None  # the array module and its number of GPUs


def _count(module: ModuleType) -> int:
    global _counted
    try:
        count = int(module.cuda.runtime.getDeviceCount())
    except Exception:  # no driver, no device: both mean "no GPU" here
        count = 0
    _counted = (module, count)
    return count


def owns(value: object) -> bool:
    """True if ``value`` is a cupy array, or a simulated GPU's (checked without importing cupy)."""
    return type(value).__module__.split(".", 1)[0] == "cupy" or gpu_module.is_simulated_array(value)


def nccl() -> ModuleType:
    """cupy's NCCL module (``cupy.cuda.nccl``), or the simulated one; ImportError if it cannot load."""
    simulated = gpu_module.simulated()
    if simulated is not None:
        simulated_nccl: ModuleType = simulated.cuda.nccl
        return simulated_nccl
    from cupy.cuda import nccl as module  # noqa: PLC0415  (an optional dependency)

    loaded: ModuleType = module
    return loaded


_INSTALL = 'pip install "towerdist[cuda12]" (CUDA 12) or "towerdist[cuda13]" (CUDA 13)'
_nccl_checked: tuple[ModuleType, str | None] | None = None  # the array module and why NCCL is unavailable on it


def nccl_unavailable_reason() -> str | None:
    """None if cupy's NCCL bindings load and a GPU is visible; otherwise why not."""
    global _nccl_checked
    try:
        module = cupy_module()
    except MissingDependencyError:
        return f"cupy is not installed ({_INSTALL})"
    checked = _nccl_checked
    if checked is not None and checked[0] is module:
        return checked[1]
    reason: str | None = None
    try:
        library = nccl()
    except ImportError:
        reason = f"cupy cannot load NCCL ({_INSTALL})"
    else:
        if not getattr(library, "available", True):
            reason = f"cupy was built without NCCL ({_INSTALL})"
        elif device_count() == 0:
            reason = "no CUDA GPU is visible"
    _nccl_checked = (module, reason)
    return reason


def _device_id(device: DeviceSpec | _Index | None) -> int:
    """The GPU index of ``device`` (the current GPU for None); refuses CPU devices and missing GPUs."""
    if device is None:
        return int(cupy_module().cuda.runtime.getDevice())
    if getattr(device, "device_type", "GPU") != "GPU":
        raise ValueError(f"The GPU backend was asked to place an array on {device.short_name}, which is not a GPU.")
    index = int(device.device_index)
    if index >= device_count():
        cupy_module()  # a missing cupy is the clearer error
        visible = device_count()
        raise InvalidArgumentError(
            f"GPU:{index} does not exist: {visible} GPU(s) are visible"
            f"{' (cupy found no CUDA driver or device)' if visible == 0 else ''}. Check CUDA_VISIBLE_DEVICES, or "
            f"use a CPU device."
        )
    return index


def asarray(value: TensorLike, dtype: DTypeLike | None = None, device: DeviceSpec | None = None) -> GpuArray:
    cupy = cupy_module()
    with cupy.cuda.Device(_device_id(device)):
        return cupy.asarray(value, dtype=dtype)


def to_device(array: TensorLike, device: DeviceSpec | _Index) -> GpuArray:
    """Returns ``array`` on ``device``: itself if it is already there, else a copy."""
    cupy = cupy_module()
    target = _device_id(device)
    if owns(array):
        if array.device.id == target:
            return array
        return _copy_between(array, target)
    with cupy.cuda.Device(target):
        return cupy.asarray(array)


def to_device_of(value: TensorLike, array: GpuArray) -> GpuArray:
    """``value`` (host data or an array of any GPU) as an array on ``array``'s GPU."""
    target = _Index(int(array.device.id))
    if owns(value):
        return to_device(value, target)
    with cupy_module().cuda.Device(target.device_index):
        return cupy_module().asarray(value)


def copy(array: TensorLike, device: DeviceSpec | None = None) -> GpuArray:
    """A new array with ``array``'s values on ``device`` (default: ``array``'s own GPU, else the current one)."""
    cupy = cupy_module()
    if device is not None:
        target = _device_id(device)
    else:
        target = array.device.id if owns(array) else int(cupy.cuda.runtime.getDevice())
    if owns(array) and array.device.id != target:
        return _copy_between(array, target)
    with cupy.cuda.Device(target):
        return cupy.array(array, copy=True)


def _copy_between(array: GpuArray, target: int) -> GpuArray:
    """A copy of ``array`` (on another GPU) on GPU ``target``, ordered after the work that produced it.

    cupy copies only C-contiguous arrays between GPUs, on the destination's current stream:
    the array is made contiguous on its own GPU, the destination stream waits for the
    source stream (an event, no host wait), and the source stays referenced until the copy
    has run (its memory belongs to its own stream's pool).
    """
    cupy = cupy_module()
    cuda = cupy.cuda
    source = int(array.device.id)
    with cuda.Device(source):
        if not array.flags.c_contiguous:
            array = cupy.ascontiguousarray(array)
        producer = cuda.get_current_stream()
    with cuda.Device(target):
        consumer = cuda.get_current_stream()
        cupy_streams.wait_for_stream(consumer, target, producer, source)
        result = cupy.array(array, copy=True)
    cupy_streams.keep_alive(cupy_streams.record(consumer, target), [array])
    return result


def _contiguous(array: GpuArray) -> GpuArray:
    """``array`` as a C-contiguous array on its own GPU (itself if it already is)."""
    if array.flags.c_contiguous:
        return array
    cupy = cupy_module()
    with cupy.cuda.Device(array.device.id):
        return cupy.ascontiguousarray(array)


def buffer_id(array: GpuArray) -> int:
    """An id of the device memory ``array`` looks at."""
    return int(array.data.mem.ptr) if hasattr(array.data, "mem") else int(array.data.ptr)


def freeze(array: GpuArray) -> GpuArray:
    """A new object looking at ``array``'s memory (cupy has no read-only arrays)."""
    return array.view()


def share(arrays: Sequence[GpuArray]) -> list[GpuArray]:
    """Distinct objects for each destination; GPU copies are never shared between devices."""
    out: list[GpuArray] = []
    seen: set[int] = set()
    for array in arrays:
        out.append(array.view() if id(array) in seen else array)
        seen.add(id(out[-1]))
    return out


def empty(shape: Sequence[int], dtype: DTypeLike, device: DeviceSpec | None = None) -> GpuArray:
    cupy = cupy_module()
    with cupy.cuda.Device(_device_id(device)):
        return cupy.empty(shape, dtype=dtype)


def zeros(shape: Sequence[int], dtype: DTypeLike, device: DeviceSpec | None = None) -> GpuArray:
    cupy = cupy_module()
    with cupy.cuda.Device(_device_id(device)):
        return cupy.zeros(shape, dtype=dtype)


def flat(array: GpuArray) -> GpuArray:
    """``array`` as a contiguous 1-D array, on its own GPU."""
    with cupy_module().cuda.Device(array.device.id):
        return _contiguous(array).reshape(-1)


def accumulate_into(out: GpuArray, inputs: Sequence[GpuArray], start: int, stop: int) -> None:
    cupy = cupy_module()
    target = out[start:stop]
    with cupy.cuda.Device(out.device.id):
        partial = inputs[0][start:stop].astype(inputs[0].dtype, copy=True)
        for x in inputs[1:]:
            partial += x[start:stop]
        target[...] = partial


def divide_into(out: GpuArray, divisor: int, start: int, stop: int) -> None:
    target = out[start:stop]
    with cupy_module().cuda.Device(out.device.id):
        target /= divisor


def add_n(arrays: Sequence[GpuArray]) -> GpuArray:
    cupy = cupy_module()
    with cupy.cuda.Device(arrays[0].device.id):
        total = arrays[0].copy()
        for x in arrays[1:]:
            total += x
        return total


def add(array: GpuArray, other: TensorLike, subtract: bool = False) -> GpuArray:
    """A new array ``array + other`` (or ``-``) with ``array``'s dtype, on ``array``'s GPU."""
    cupy = cupy_module()
    with cupy.cuda.Device(array.device.id):
        combine = cupy.subtract if subtract else cupy.add
        return combine(array, cupy.asarray(other), dtype=array.dtype)


def true_divide(array: GpuArray, divisor: TensorLike) -> GpuArray:
    """``array / divisor`` on ``array``'s GPU."""
    cupy = cupy_module()
    with cupy.cuda.Device(array.device.id):
        return cupy.true_divide(array, divisor)


def unique_rows_sum(indices: GpuArray, values: GpuArray) -> tuple[GpuArray, GpuArray]:
    """As ``numpy_backend.unique_rows_sum`` (the same keys and passes, so the same order of addition), on the arrays' GPU.

    The sizes of the result and the number of passes are read back: host synchronisations.
    """
    cupy = cupy_module()
    with cupy.cuda.Device(values.device.id):
        count = indices.shape[0]
        if count == 0:
            return indices.astype(cupy.int64), values
        shift = count.bit_length()  # key = index << shift | position, distinct: any sort keeps row order
        keys = (indices.astype(cupy.int64) << shift) | cupy.arange(count)
        keys.sort()
        ordered = keys >> shift
        order = keys & ((1 << shift) - 1)
        starts = cupy.empty(count, bool)
        starts[0] = True
        cupy.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
        first = cupy.flatnonzero(starts)
        if first.shape[0] == count:
            return ordered, cupy.take(values, order, axis=0)
        segment = cupy.cumsum(starts) - 1
        rank = cupy.arange(count) - first[segment]
        summed = cupy.take(values, order[first], axis=0)
        for k in range(1, int(rank.max()) + 1):
            at = cupy.flatnonzero(rank == k)
            summed[segment[at]] += cupy.take(values, order[at], axis=0)
        return ordered[first], summed


def concat(arrays: Sequence[TensorLike], axis: int, device: DeviceSpec | None = None) -> GpuArray:
    """The arrays joined along ``axis`` on ``device`` (default: the first array's GPU)."""
    cupy = cupy_module()
    target = _device_id(device) if device is not None else arrays[0].device.id
    with cupy.cuda.Device(target):
        return cupy.concatenate([to_device(a, _Index(target)) for a in arrays], axis=axis)


def split(array: GpuArray, sizes: Sequence[int], axis: int = 0) -> list[GpuArray]:
    """Views of ``array`` cut along ``axis`` into pieces of ``sizes``."""
    cupy = cupy_module()
    boundaries = list(_cumsum(sizes))[:-1]
    with cupy.cuda.Device(array.device.id):
        return list(cupy.split(array, boundaries, axis=axis))


def synchronize(device: DeviceSpec | None = None) -> None:
    """Waits until everything queued on ``device`` (every stream of that GPU) has finished."""
    cupy = cupy_module()
    cupy.cuda.Device(_device_id(device)).synchronize()


class _Index:
    """A stand-in for a DeviceSpec that only carries a GPU index."""

    device_type = "GPU"

    def __init__(self, index: int) -> None:
        self.device_index = index

    @property
    def short_name(self) -> str:
        """``'/gpu:<index>'``, as a DeviceSpec's (for the messages that name a device)."""
        return f"/gpu:{self.device_index}"


def _cumsum(sizes: Sequence[int]) -> list[int]:
    total, out = 0, []
    for size in sizes:
        total += size
        out.append(total)
    return out


def on_device(device: DeviceSpec | None) -> AbstractContextManager[object]:
    """A context in which cupy allocates and launches on ``device`` (a GPU DeviceSpec)."""
    cupy = cupy_module()
    scope: AbstractContextManager[object] = cupy.cuda.Device(_device_id(device))
    return scope


def on_array_device(array: GpuArray) -> AbstractContextManager[object]:
    """A context in which cupy launches on ``array``'s GPU (for kernels reading an array of any GPU)."""
    scope: AbstractContextManager[object] = cupy_module().cuda.Device(array.device.id)
    return scope


def finish(devices: Sequence[DeviceSpec]) -> None:
    """Waits for every stream of each GPU among ``devices`` (CPU devices are skipped).

    Where work changes threads (a replica's results read by the thread that runs a
    ``merge_fn``, or by the caller of ``run``, and back), each thread launched on its own
    stream: without this, the reader's stream is not ordered after the writer's.
    """
    gpus = {int(d.device_index) for d in devices if d.device_type == "GPU"}
    if gpus:
        cupy = cupy_module()
        for index in sorted(gpus):
            cupy.cuda.Device(index).synchronize()
