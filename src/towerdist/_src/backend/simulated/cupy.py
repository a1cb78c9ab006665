"""Simulated cupy: a CPU stand-in for ``cupy`` and ``cupy.cuda.nccl``, with simulated GPUs.

:func:`module` builds a module object that behaves like ``cupy`` on a machine with
``num_gpus`` GPUs, backed by numpy, and enforcing the rules of real GPUs that towerdist
relies on (per-thread current device, allocation and kernel launch on it, no peer access,
no implicit host conversion, no non-contiguous copies between devices, streams and events
bound to their device, ordering between streams, cupy's per-stream memory pool, NCCL's
group, threading and initialisation rules). The rules live with the concepts they govern:
``cuda`` (devices, streams, events, ordering), ``memory`` (allocations,
addresses and the pool), ``array`` (arrays and kernel launches),
``nccl`` (with ``nccl_files`` for ranks in other processes), and
``stats`` counts host synchronisations.

Test hooks: ``module(n, cupy_major=13)`` simulates cupy 13, whose NCCL unique ids are tuples
of signed ints (``cupy.__version__`` reads 13.x); a module's ``cupy.cuda.nccl._simulation``
is its simulated NCCL library, whose ``unique_id_format`` (``"bytes"`` or ``"tuple"``) switches
that later; ``cupy.machine`` is its simulated machine (``hang_timeout``, ``stats``).

Besides the functions defined here (``asarray``, ``array``, ``ascontiguousarray``,
``asnumpy``, ...), every numpy function is available as ``cupy.<name>`` and runs as a
simulated kernel; numpy's types and constants (``cupy.float32``, ``cupy.newaxis``) are
numpy's own, as in cupy.

The simulation is switched on for towerdist with ``towerdist.testing.simulate_gpus(n)`` or
the environment variable ``TOWERDIST_SIMULATE_GPUS=n``, through the backend's seam
(``backend/gpu_module.py``), which then makes a module of this file's :func:`module` the array
module of the GPU backend; :func:`owns` tells simulated arrays apart.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src.backend.simulated.array import SimulatedArray, array_type, function_mode, launch, new_array
from towerdist._src.backend.simulated.cuda import (
    CUDARuntimeError,
    Machine,
    SimulatedGPUError,
    Stream,
    UnorderedAccessError,
)
from towerdist._src.backend.simulated.memory import PinnedMemoryPointer
from towerdist._src.backend.simulated.nccl import NCCL_CONSTANTS, Nccl, NcclError
from towerdist._src.type_aliases import DTypeLike, TensorLike

if TYPE_CHECKING:  # the GPU backend loads the simulator: only its name for a GPU array is used here
    from towerdist._src.backend.gpu_module import GpuArray

__all__ = ["module", "owns"]

_MISSING: Any = object()
VERSION = "14.2.0+simulated"
VERSION_13 = "13.6.0+simulated"  # cupy_major=13: NCCL unique ids are tuples of signed ints


def owns(value: object) -> bool:
    """True if ``value`` is an array of a simulated GPU."""
    return isinstance(value, SimulatedArray)


# --- the module ---------------------------------------------------------------------------------


def module(num_gpus: int, cupy_major: int = 14) -> types.ModuleType:
    """A new simulated cupy module on its own machine with ``num_gpus`` GPUs (for tests, or :func:`enable`).

    Args:
      num_gpus: the number of simulated GPUs.
      cupy_major: the cupy version to simulate where towerdist sees a difference: 14 (NCCL
        unique ids are ``bytes``) or 13 (tuples of signed ints). Tests can also switch a
        module later through its test hook, ``cupy.cuda.nccl._simulation.unique_id_format``
        (``"bytes"`` or ``"tuple"``); ``cupy.__version__`` follows it.

    Raises:
      ValueError: ``cupy_major`` is neither 13 nor 14.
    """
    if cupy_major not in (13, 14):
        raise ValueError(f"The simulation has cupy 13 and 14. Got cupy_major={cupy_major!r}.")
    machine = Machine(num_gpus)
    nccl = Nccl(machine)
    nccl.unique_id_format = "tuple" if cupy_major == 13 else "bytes"
    runtime = _namespace(
        "simulated_cupy.cuda.runtime",
        "Simulated CUDA runtime.",
        CUDARuntimeError=CUDARuntimeError,
        getDeviceCount=lambda: machine.num_gpus,
        getDevice=machine.current_device,
        setDevice=machine.set_device,
        deviceSynchronize=lambda: machine.Device()._synchronize("runtime.deviceSynchronize"),
        runtimeGetVersion=lambda: 12080,
        is_hip=False,
    )
    nccl_module = _namespace(
        "simulated_cupy.cuda.nccl",
        "Simulated NCCL: the ranks of one process.",
        available=True,
        NcclError=NcclError,
        NcclCommunicator=nccl.NcclCommunicator,
        get_unique_id=nccl.get_unique_id,
        groupStart=nccl.groupStart,
        groupEnd=nccl.groupEnd,
        get_version=lambda: 23203,
        get_build_version=lambda: 23203,
        _simulation=nccl,  # test hook: the simulated NCCL library (unique_id_format, ...)
        **NCCL_CONSTANTS,
    )
    cuda = _namespace(
        "simulated_cupy.cuda",
        "Simulated CUDA devices, streams and events.",
        Device=machine.Device,
        Stream=machine.Stream,
        Event=machine.Event,
        runtime=runtime,
        nccl=nccl_module,
        get_current_stream=machine.current_stream,
        alloc_pinned_memory=functools.partial(_alloc_pinned_memory, machine),
        PinnedMemoryPointer=PinnedMemoryPointer,
        get_device_id=machine.current_device,
        is_available=lambda: True,
        SimulatedGPUError=SimulatedGPUError,
        UnorderedAccessError=UnorderedAccessError,
    )
    cupy = _SimulatedCupy("simulated_cupy", machine, nccl)
    vars(cupy).update(
        __doc__=f"Simulated cupy with {num_gpus} simulated GPUs (numpy on the CPU).",
        ndarray=array_type(machine),
        machine=machine,
        cuda=cuda,
        SimulatedGPUError=SimulatedGPUError,
    )
    return cupy


def _alloc_pinned_memory(machine: Machine, size: int) -> PinnedMemoryPointer:
    """Page-locked host memory of ``size`` bytes (``cupy.cuda.alloc_pinned_memory``; counted)."""
    machine.stats.count_work("pinned_allocs")
    return PinnedMemoryPointer(int(size))


def _namespace(name: str, doc: str, **attributes: object) -> types.ModuleType:
    namespace = types.ModuleType(name, doc)
    vars(namespace).update(attributes)
    return namespace


class _SimulatedCupy(types.ModuleType):
    """The simulated ``cupy`` namespace of one machine; numpy functions are looked up on demand."""

    def __init__(self, name: str, machine: Machine, nccl: Nccl) -> None:
        super().__init__(name)
        self._machine = machine
        self._nccl = nccl
        self._forward_lock = threading.Lock()

    @property
    def __version__(self) -> str:
        """The simulated cupy's version: 14.x, or 13.x while NCCL unique ids are tuples (cupy 13)."""
        return VERSION_13 if self._nccl.unique_id_format == "tuple" else VERSION

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = _forward(self._machine, name, getattr(np, name, _MISSING), f"cupy.{name}")
        with self._forward_lock:
            setattr(self, name, value)
        return value

    # --- functions with cupy's own semantics ---------------------------------------------

    def array(
        self, obj: TensorLike, dtype: DTypeLike | None = None, copy: bool | None = True, order: str | None = "K", subok: bool = False,
        ndmin: int = 0, *, blocking: bool = False,
    ) -> GpuArray:  # fmt: skip
        """An array on the current device (``cupy.array``): uploads host data, copies device arrays.

        An array of another device is copied over only if it is contiguous (as in cupy).
        """
        machine = self._machine
        order = "K" if order is None else order
        if isinstance(obj, SimulatedArray):
            if obj.device.id == machine.current_device():
                result = obj.astype(obj.dtype if dtype is None else dtype, order=order, copy=bool(copy))
            else:
                result = obj.copy(order=order).astype(obj.dtype if dtype is None else dtype, copy=False)
            if ndmin > result.ndim:
                result = result.view() if result is obj else result
                result.shape = (1,) * (ndmin - result.ndim) + result.shape
            return result
        if _contains_device_arrays(obj):  # a nested sequence of device arrays: a stacking kernel
            return launch(machine, np.array, (obj,), {"dtype": dtype, "ndmin": ndmin}, "cupy.array")
        host = np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin)  # type: ignore[call-overload]
        machine.stats.count_work("h2d")
        return new_array(machine, host, machine.current_device(), "cupy.array (an upload)")

    def asarray(
        self, a: TensorLike, dtype: DTypeLike | None = None, order: str | None = None, *, copy: bool | None = None,
        blocking: bool = False,
    ) -> GpuArray:
        """``a`` as an array on the current device (``cupy.asarray``); itself if it already is one there."""
        return self.array(a, dtype, copy=copy, order=order, blocking=blocking)

    def asanyarray(self, a: TensorLike, dtype: DTypeLike | None = None, order: str | None = None) -> GpuArray:
        """Same as :meth:`asarray`."""
        return self.asarray(a, dtype, order)

    def ascontiguousarray(self, a: object, dtype: DTypeLike | None = None) -> GpuArray:
        """``a`` itself if C-contiguous (on whatever device), else a contiguous copy made on the current device."""
        if not isinstance(a, SimulatedArray):
            raise TypeError(
                f"Argument 'a' has incorrect type (expected cupy.ndarray, got {type(a).__name__}) (simulated GPU: "
                "cupy.ascontiguousarray takes device arrays only; use cupy.asarray for host data)"
            )
        target = a.dtype if dtype is None else np.dtype(dtype)
        if target == a.dtype and a.flags.c_contiguous:
            return a.reshape(1) if a.ndim == 0 else a
        source = a.reshape(1) if a.ndim == 0 else a
        return launch(self._machine, np.ascontiguousarray, (source,), {"dtype": target}, "cupy.ascontiguousarray")

    def asnumpy(
        self, a: TensorLike, stream: Stream | None = None, order: str = "C", out: np.ndarray | None = None, *,
        blocking: bool = True,
    ) -> Any:  # fmt: skip
        """A host (numpy) copy of ``a``; host data is returned as a numpy array."""
        if isinstance(a, SimulatedArray):
            return a._download("cupy.asnumpy", stream=stream, order=order, out=out, blocking=blocking)
        return np.asarray(a, order=order)  # type: ignore[call-overload]

    def get_array_module(self, *args: object) -> types.ModuleType:
        """This module if any argument is a simulated array, else numpy."""
        return self if any(isinstance(a, SimulatedArray) for a in args) else np

    def is_available(self) -> bool:
        """True: the simulated GPUs are always available."""
        return True


def _forward(machine: Machine, name: str, value: object, qualified: str) -> Any:
    """numpy's ``value`` as seen through the simulated cupy namespace."""
    if value is _MISSING:
        raise AttributeError(f"simulated cupy has no attribute {name!r} (numpy has none either)")
    if isinstance(value, types.ModuleType):
        return _Namespace(machine, value, qualified)
    if isinstance(value, np.ufunc):
        return _Ufunc(machine, value)
    if isinstance(value, type) or not callable(value):
        return value  # dtypes, scalar types, constants: numpy's own, as in cupy
    mode = function_mode(name)

    def call(*args: object, **kwargs: object) -> TensorLike:
        return launch(machine, value, args, kwargs, qualified, mode=mode)

    call.__name__ = name
    call.__qualname__ = qualified
    call.__doc__ = f"numpy.{name} as a kernel on the current simulated GPU."
    return call


class _Namespace(types.ModuleType):
    """A numpy submodule (``cupy.linalg``, ``cupy.random``...) whose functions run as simulated kernels."""

    def __init__(self, machine: Machine, wrapped: types.ModuleType, name: str) -> None:
        super().__init__(f"simulated_{name}")
        self._machine, self._wrapped, self._qualified = machine, wrapped, name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _forward(self._machine, name, getattr(self._wrapped, name, _MISSING), f"{self._qualified}.{name}")


class _Ufunc:
    """A numpy ufunc as a simulated cupy ufunc (``cupy.add``, ``cupy.add.reduce``...)."""

    def __init__(self, machine: Machine, ufunc: np.ufunc) -> None:
        self._machine, self._ufunc = machine, ufunc
        self.__name__ = ufunc.__name__
        self.nin, self.nout = ufunc.nin, ufunc.nout

    def __call__(self, *args: object, **kwargs: object) -> TensorLike:
        return launch(self._machine, self._ufunc, args, kwargs, f"cupy.{self.__name__}")

    def _method(self, method: str) -> Callable[..., Any]:
        func = getattr(self._ufunc, method)

        def call(*args: object, **kwargs: object) -> TensorLike:
            return launch(self._machine, func, args, kwargs, f"cupy.{self.__name__}.{method}")

        return call

    @property
    def reduce(self) -> Callable[..., Any]:
        return self._method("reduce")

    @property
    def accumulate(self) -> Callable[..., Any]:
        return self._method("accumulate")

    @property
    def outer(self) -> Callable[..., Any]:
        return self._method("outer")

    @property
    def at(self) -> Callable[..., Any]:
        return self._method("at")

    def __repr__(self) -> str:
        return f"<simulated cupy ufunc '{self.__name__}'>"


def _contains_device_arrays(obj: TensorLike) -> bool:
    if isinstance(obj, SimulatedArray):
        return True
    return type(obj) in (list, tuple) and any(_contains_device_arrays(x) for x in obj)
