"""Simulated GPU arrays (``cupy.ndarray``) and the rules of a kernel launch.

A simulated array is a numpy view into a :class:`~.memory.Memory` of one
simulated GPU. Everything that computes goes through :func:`launch`, which applies the
rules cupy applies to a kernel launch (``cupy/_core/_kernel.pyx``):

* the kernel runs, and its outputs are allocated, on the calling thread's **current
  device**;
* an array operand on another device raises ``ValueError`` ("Peer access is unavailable"):
  the simulated GPUs have no peer-to-peer link (``_check_peer_access``), which is the
  strict case; real machines with NVLink would only warn and read across the link;
* a numpy array operand raises ``TypeError`` (``_scalar.pyx``: "Unsupported type"); Python
  and numpy scalars are accepted;
* operations that only create a view (slicing, ``reshape``, ``T``, ``split``...) launch no
  kernel, so they work on arrays of any device and return views on that device;
* a kernel runs on the calling thread's current stream of the current device: it may read
  operands last written on another stream, and write operands last written or read on
  another stream, only once something orders it after that use (``Machine.check_order``);
  it then reads its operands, and writes its outputs and the operands it writes in place, on
  that stream. Its outputs are allocated on that stream too (``Machine.allocate``: cupy's
  pool may hand them blocks freed on that stream). Host transfers (``get``, ``set``) and
  copies between devices follow the same rules, on the current stream of the array's device
  and of the current device;
* blocking copies to the host (``get``, ``item``, ``tolist``, ``float()``, ``repr``...) are
  counted as host synchronisations (``Machine.stats``).

Like cupy arrays, simulated arrays refuse implicit conversion to numpy (``__array__``
raises ``TypeError``; use ``.get()``), and numpy functions called on them dispatch to the
simulated implementation (``__array_ufunc__``, ``__array_function__``). Reductions return
0-d arrays, as in cupy. Floating-point warnings are not emitted (GPU kernels do not).
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from towerdist._src.backend.simulated.cuda import Device, Machine, SimulatedGPUError, Stream, StreamKey, Work
from towerdist._src.backend.simulated.memory import Memory, MemoryPointer, PinnedMemoryPointer, pinned_base
from towerdist._src.type_aliases import DTypeLike, TensorLike

if TYPE_CHECKING:  # the GPU backend loads the simulator: only its name for a GPU array is used here
    from towerdist._src.backend.gpu_module import GpuArray

__all__ = ["Flags", "LaunchMode", "SimulatedArray", "array_type", "function_mode", "launch", "new_array"]

LaunchMode = Literal["kernel", "view", "shape"]
"""How a function uses its array operands: ``kernel`` reads or writes them on the current
device (all must be there); ``view`` may return a view of one (no kernel, unless a copy had
to be made); ``shape`` only looks at their shape and dtype (``empty_like``)."""

# dtypes cupy refuses ("Unsupported dtype", cupy/_core/_dtype.pyx): objects, strings, dates.
_UNSUPPORTED_KINDS = frozenset("OSUMm")
_SCALARS = (int, float, bool, complex, np.generic)
_NO_FORWARD = frozenset({"tofile", "dump", "dumps", "tobytes", "setflags", "resize", "itemset", "ctypes"})


class Flags:
    """The contiguity flags of a simulated array (``cupy.ndarray.flags``)."""

    def __init__(self, c_contiguous: bool, f_contiguous: bool, owndata: bool) -> None:
        self.c_contiguous = c_contiguous
        self.f_contiguous = f_contiguous
        self.owndata = owndata

    def __getitem__(self, name: str) -> bool:
        keys = {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous, "OWNDATA": self.owndata}
        return keys[name]

    def __repr__(self) -> str:
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}\n  OWNDATA : {self.owndata}"


def _should_use_rop(x: object, y: object) -> bool:
    """cupy's rule for deferring a binary operator to the right operand (``core.pyx``)."""
    y_ufunc = getattr(y, "__array_ufunc__", _MISSING)
    if y_ufunc is not _MISSING:
        return y_ufunc is None
    return bool(getattr(x, "__array_priority__", 0) < getattr(y, "__array_priority__", 0))


_MISSING = object()


def _binary(ufunc: np.ufunc) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The forward, reflected and in-place operators of ``ufunc``, dispatched as cupy does."""

    def forward(self: SimulatedArray, other: TensorLike) -> TensorLike:
        if isinstance(other, SimulatedArray) or not _should_use_rop(self, other):
            return ufunc(self, other)  # through numpy's dispatch to __array_ufunc__
        return NotImplemented

    def reflected(self: SimulatedArray, other: TensorLike) -> TensorLike:
        if _should_use_rop(self, other):
            return NotImplemented
        return ufunc(other, self)

    def inplace(self: SimulatedArray, other: TensorLike) -> TensorLike:
        return ufunc(self, other, out=self)

    return forward, reflected, inplace


def _unary(ufunc: np.ufunc) -> Callable[[SimulatedArray], Any]:
    def apply(self: SimulatedArray) -> TensorLike:
        return ufunc(self)

    return apply


def _compare(ufunc: np.ufunc) -> Callable[[SimulatedArray, Any], Any]:
    def apply(self: SimulatedArray, other: TensorLike) -> TensorLike:
        if isinstance(other, SimulatedArray) or not _should_use_rop(self, other):
            return ufunc(self, other)
        return NotImplemented

    return apply


class SimulatedArray:
    """An array on a simulated GPU (``cupy.ndarray``).

    Create arrays through the simulated cupy module (``cupy.asarray``, ``cupy.zeros``...), or
    as cupy does with ``cupy.ndarray(shape, dtype)`` (allocated on the current device).
    Each simulated machine has its own subclass (``cupy.ndarray`` of that machine).
    """

    _machine: ClassVar[Machine]
    __slots__ = ("__weakref__", "_array", "_base", "_memory")
    __array_priority__ = 100
    __hash__ = None  # type: ignore[assignment]  # unhashable, as cupy arrays

    _array: np.ndarray
    _memory: Memory
    _base: SimulatedArray | None

    def __init__(
        self,
        shape: int | Sequence[int],
        dtype: DTypeLike = float,
        memptr: MemoryPointer | None = None,
        strides: Sequence[int] | None = None,
        order: str = "C",
    ) -> None:
        if memptr is not None:
            memory, offset = memptr.mem, memptr.ptr - memptr.mem.ptr
            buffer = memory.byte_view()
            self._array = np.ndarray(shape, dtype, buffer=buffer, offset=offset, strides=strides, order=order)  # type: ignore[arg-type]
            self._memory, self._base = memory, None
            return
        device = self._machine.current_device()
        self._machine.check_device(device)
        host = np.empty(shape, dtype=dtype, order=order)  # type: ignore[call-overload]
        _check_dtype(host.dtype)
        memory = self._machine.allocate(host, device, "cupy.ndarray()", written=False)
        self._array, self._memory, self._base = host, memory, None

    @classmethod
    def _wrap(cls, array: np.ndarray, memory: Memory, base: SimulatedArray | None) -> SimulatedArray:
        new = cls.__new__(cls)
        new._array, new._memory, new._base = array, memory, base
        return new

    def _view(self, array: np.ndarray) -> SimulatedArray:
        return self._wrap(array, self._memory, self._base if self._base is not None else self)

    # --- attributes ----------------------------------------------------------------------

    @property
    def device(self) -> Device:
        """The simulated GPU holding the array (``cupy.cuda.Device``)."""
        return self._machine.Device(self._memory.device_id)

    @property
    def data(self) -> MemoryPointer:
        """The array's first element in device memory (``.ptr``; ``.mem`` is the allocation)."""
        return MemoryPointer(self._memory, self._memory.address_of(self._array))

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._array.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @shape.setter
    def shape(self, value: int | Sequence[int]) -> None:
        self._array.shape = value

    @property
    def strides(self) -> tuple[int, ...]:
        return self._array.strides

    @property
    def size(self) -> int:
        return self._array.size

    @property
    def ndim(self) -> int:
        return self._array.ndim

    @property
    def itemsize(self) -> int:
        return self._array.itemsize

    @property
    def nbytes(self) -> int:
        return self._array.nbytes

    @property
    def base(self) -> SimulatedArray | None:
        """The array owning the memory this one views, or None if it owns it."""
        return self._base

    @property
    def flags(self) -> Flags:
        flags = self._array.flags
        return Flags(bool(flags.c_contiguous), bool(flags.f_contiguous), self._base is None)

    @property
    def T(self) -> SimulatedArray:  # noqa: N802  (numpy's name)
        return self if self.ndim < 2 else self._view(self._array.T)

    @property
    def mT(self) -> SimulatedArray:  # noqa: N802  (numpy's name)
        if self.ndim < 2:
            raise ValueError("matrix transpose with ndim < 2 is undefined")
        return self._view(self._array.swapaxes(-1, -2))

    @property
    def real(self) -> GpuArray:
        return launch(self._machine, np.real, (self,), {}, "cupy.ndarray.real", mode="view")

    @property
    def imag(self) -> GpuArray:
        return launch(self._machine, np.imag, (self,), {}, "cupy.ndarray.imag", mode="view")

    # --- host transfers --------------------------------------------------------------------

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
            "array explicitly. (simulated GPU: like cupy, a simulated GPU array never turns into a host array "
            "implicitly; call .get() or cupy.asnumpy().)"
        )

    def get(
        self, stream: Stream | None = None, order: str = "C", out: np.ndarray | None = None, blocking: bool = True
    ) -> np.ndarray:
        """Copies the array to the host (blocking: after the queued work that writes it).

        The copy runs on ``stream``, default the calling thread's current stream of the array's
        device; a blocking copy then synchronizes that stream, as in cupy (a counted host
        synchronisation).
        """
        return self._download("ndarray.get", stream, order, out, blocking)

    def _download(
        self, call: str, stream: Stream | None = None, order: str = "C", out: np.ndarray | None = None, blocking: bool = True
    ) -> np.ndarray:
        machine = self._machine
        key = machine.stream_key(stream, self._memory.device_id)
        machine.check_order(key, [self._memory], f"{call}()")
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self.dtype or out.shape != self.shape:
                raise ValueError(f"get(out=) needs a {self.dtype} array of shape {self.shape}.")
        machine.stats.count_work("d2h")
        if blocking:
            machine.stats.count_sync(self._memory.device_id, call)
        machine.wait_for_memory([self._memory], f"{call}()")
        machine.mark_accessed(key, [self._memory], f"{call}() (a copy to the host)")
        if blocking:
            machine.stream_synchronized(key)  # cupy synchronizes the stream of a blocking copy
        if out is None:
            return np.array(self._array, order=order, copy=True)  # type: ignore[call-overload, no-any-return]
        out[...] = self._array
        return out

    def set(self, arr: np.ndarray, stream: Stream | None = None) -> None:
        """Copies the host array ``arr`` (same dtype and shape) into this array (an upload: not a host synchronisation).

        From pinned memory (``cupy.cuda.alloc_pinned_memory``) with a ``stream`` the copy is
        asynchronous, as ``cudaMemcpyAsync`` from page-locked memory is: it is queued on
        ``stream`` and reads ``arr`` when it completes (:func:`_pinned_upload`). From pageable
        memory the bytes are staged before ``set`` returns.
        """
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._array.flags.c_contiguous or self._array.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        machine = self._machine
        key = machine.stream_key(stream, self._memory.device_id)
        machine.check_order(key, [self._memory], "ndarray.set()", writes=[self._memory])
        machine.wait_for_memory([self._memory], "ndarray.set()")
        pinned = pinned_base(arr) if stream is not None else None
        if pinned is not None:
            _pinned_upload(machine, self, arr, pinned, key)
            return
        machine.stats.count_work("h2d")
        self._array[...] = arr
        machine.mark_written(key, [self._memory], "ndarray.set()")

    def item(self, *args: int) -> Any:
        """The element as a Python scalar (a blocking copy to the host)."""
        return self._download("ndarray.item").item(*args)

    def tolist(self) -> Any:
        """The array as nested Python lists (a blocking copy to the host)."""
        return self._download("ndarray.tolist").tolist()

    def __bool__(self) -> bool:
        return bool(self._download("ndarray.__bool__"))

    def __int__(self) -> int:
        return int(self._download("ndarray.__int__"))

    def __float__(self) -> float:
        return float(self._download("ndarray.__float__"))

    def __complex__(self) -> complex:
        return complex(self._download("ndarray.__complex__"))

    def __repr__(self) -> str:
        return repr(self._download("ndarray.__repr__"))

    def __str__(self) -> str:
        return str(self._download("ndarray.__str__"))

    def __format__(self, spec: str) -> str:
        return format(self._download("ndarray.__format__"), spec)

    # --- copies and views ------------------------------------------------------------------

    def copy(self, order: str = "C") -> GpuArray:
        """A copy on the current device; an array on another device is copied over (``ndarray.copy``).

        As in cupy, the copy is first made contiguous on the array's own device; a
        non-contiguous result (``order='K'``) cannot cross devices.
        """
        machine = self._machine
        device = machine.current_device()
        if self.size == 0 or self._memory.device_id == device:
            return self.astype(self.dtype, order=order)
        with machine.Device(self._memory.device_id):
            source = self.astype(self.dtype, order=order, copy=False)
        # The copy runs on the current stream of the current (destination) device.
        key = machine.stream_key(device_id=device)
        what = "ndarray.copy() between devices"
        machine.check_order(key, [source._memory], what)
        machine.wait_for_memory([source._memory], "ndarray.copy()")
        if not (source._array.flags.c_contiguous or source._array.flags.f_contiguous):
            raise NotImplementedError(
                "CuPy cannot copy non-contiguous array between devices. (simulated GPU: the array on "
                f"GPU {self._memory.device_id} has strides {self.strides}; make it contiguous on its own "
                f"device first, e.g. cupy.ascontiguousarray() under cupy.cuda.Device({self._memory.device_id}).)"
            )
        machine.stats.count_work("d2d")
        copied = new_array(machine, np.array(source._array, order="K", copy=True), device, what)
        machine.mark_accessed(key, [source._memory], what)
        return copied

    def astype(
        self, dtype: DTypeLike, order: str = "K", casting: str | None = None, subok: bool | None = None, copy: bool = True
    ) -> GpuArray:
        """The array cast to ``dtype`` (a kernel on the current device unless no copy is needed)."""
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype and _order_satisfied(self._array, order):
            return self
        if self.size == 0:
            empty = self._array.astype(dtype, order=order)  # type: ignore[call-overload]
            return new_array(self._machine, empty, self._machine.current_device(), "cupy.ndarray.astype")
        kwargs: dict[str, Any] = {"order": order, "copy": True}
        if casting is not None:
            kwargs["casting"] = casting
        return launch(self._machine, np.ndarray.astype, (self, dtype), kwargs, "cupy.ndarray.astype")

    def view(self, dtype: DTypeLike | None = None) -> SimulatedArray:
        """A view of the same memory, optionally reinterpreted as ``dtype``."""
        array: np.ndarray = self._array.view() if dtype is None else self._array.view(dtype)
        return self._view(array)

    def reshape(self, *shape: int | Sequence[int], order: str = "C") -> GpuArray:
        """A view with a new shape (a copy on the current device if the layout needs one)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return launch(self._machine, np.reshape, (self, shape), {"order": order}, "cupy.ndarray.reshape", mode="view")

    def ravel(self, order: str = "C") -> GpuArray:
        return launch(self._machine, np.ravel, (self,), {"order": order}, "cupy.ndarray.ravel", mode="view")

    def transpose(self, *axes: int | Sequence[int] | None) -> SimulatedArray:
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = () if axes[0] is None else tuple(axes[0])
        return self._view(self._array.transpose(*axes))

    def swapaxes(self, axis1: int, axis2: int) -> SimulatedArray:
        return self._view(self._array.swapaxes(axis1, axis2))

    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> SimulatedArray:
        return self._view(self._array.squeeze(axis))

    def flatten(self, order: str = "C") -> GpuArray:
        return launch(self._machine, np.ndarray.flatten, (self,), {"order": order}, "cupy.ndarray.flatten")

    def fill(self, value: complex | np.generic) -> None:
        """Sets every element to the scalar ``value`` (a kernel on the current device)."""
        launch(self._machine, np.ndarray.fill, (self, value), {}, "cupy.ndarray.fill")

    def __copy__(self) -> GpuArray:
        with self._machine.Device(self._memory.device_id):
            return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> GpuArray:
        return copy_module.copy(self)

    def __getattr__(self, name: str) -> Any:
        # The remaining numpy methods (sum, mean, max, argmax, clip, dot...) run as kernels.
        method = getattr(np.ndarray, name, None) if not name.startswith("_") and name not in _NO_FORWARD else None
        if method is None or not callable(method):
            raise AttributeError(f"'cupy.ndarray' (simulated GPU array) has no attribute {name!r}")
        machine = self._machine

        def call(*args: object, **kwargs: object) -> TensorLike:
            return launch(machine, method, (self, *args), kwargs, f"cupy.ndarray.{name}")

        return call

    # --- indexing ----------------------------------------------------------------------------

    def __getitem__(self, key: object) -> GpuArray:
        # Basic indexing is a view (no kernel, any device); advanced indexing is a kernel. Index
        # arrays may be numpy arrays (cupy uploads them).
        return launch(self._machine, _getitem, (self, key), {}, "cupy.ndarray.__getitem__", mode="view", host_ok=True)

    def __setitem__(self, key: object, value: TensorLike) -> None:
        launch(self._machine, _setitem, (self, key, value), {}, "cupy.ndarray.__setitem__", host_ok=True)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return int(self.shape[0])

    def __iter__(self) -> Iterator[Any]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    # --- numpy protocols ---------------------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: TensorLike, **kwargs: object) -> TensorLike:
        if method not in ("__call__", "outer", "at", "reduce", "accumulate", "reduceat"):
            return NotImplemented
        out = kwargs.get("out")
        if isinstance(out, tuple):
            if len(out) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            kwargs["out"] = out = out[0]
        for x in (*inputs, out) if out is not None else inputs:
            if not isinstance(x, (SimulatedArray, np.ndarray, *_SCALARS)):
                return NotImplemented
        func = ufunc if method == "__call__" else getattr(ufunc, method)
        name = f"cupy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        return launch(self._machine, func, inputs, kwargs, name)

    def __array_function__(
        self, func: Callable[..., Any], types: Collection[type], args: Sequence[object], kwargs: dict[str, object]
    ) -> TensorLike:
        if not all(issubclass(t, (SimulatedArray, np.ndarray)) for t in types):
            return NotImplemented
        name = getattr(func, "__name__", "function")
        return launch(self._machine, func, args, kwargs, f"cupy.{name}", mode=function_mode(name))

    # --- operators (cupy's dispatch: defer to the right operand only where cupy does) --------

    __add__, __radd__, __iadd__ = _binary(np.add)
    __sub__, __rsub__, __isub__ = _binary(np.subtract)
    __mul__, __rmul__, __imul__ = _binary(np.multiply)
    __truediv__, __rtruediv__, __itruediv__ = _binary(np.true_divide)
    __floordiv__, __rfloordiv__, __ifloordiv__ = _binary(np.floor_divide)
    __mod__, __rmod__, __imod__ = _binary(np.remainder)
    __pow__, __rpow__, __ipow__ = _binary(np.power)
    __matmul__, __rmatmul__, __imatmul__ = _binary(np.matmul)
    __and__, __rand__, __iand__ = _binary(np.bitwise_and)
    __or__, __ror__, __ior__ = _binary(np.bitwise_or)
    __xor__, __rxor__, __ixor__ = _binary(np.bitwise_xor)
    __lshift__, __rlshift__, __ilshift__ = _binary(np.left_shift)
    __rshift__, __rrshift__, __irshift__ = _binary(np.right_shift)
    __divmod__, __rdivmod__ = _binary(np.divmod)[:2]
    __neg__ = _unary(np.negative)
    __pos__ = _unary(np.positive)
    __abs__ = _unary(np.absolute)
    __invert__ = _unary(np.invert)
    __lt__ = _compare(np.less)
    __le__ = _compare(np.less_equal)
    __gt__ = _compare(np.greater)
    __ge__ = _compare(np.greater_equal)
    __eq__ = _compare(np.equal)
    __ne__ = _compare(np.not_equal)


def _getitem(array: np.ndarray, key: Any) -> Any:
    result = array[key]
    if isinstance(result, np.ndarray):
        return result
    # A full integer index: cupy returns a 0-d view, numpy a scalar copy.
    keys = key if isinstance(key, tuple) else (key,)
    return array[(*keys, Ellipsis)]


def _setitem(array: np.ndarray, key: Any, value: TensorLike) -> None:
    array[key] = value


_VIEW_FUNCTIONS = frozenset(
    {
        "reshape", "ravel", "transpose", "swapaxes", "moveaxis", "rollaxis", "squeeze", "expand_dims",
        "broadcast_to", "broadcast_arrays", "split", "array_split", "hsplit", "vsplit", "dsplit",
        "atleast_1d", "atleast_2d", "atleast_3d", "diagonal", "real", "imag", "flip", "fliplr", "flipud",
        "permute_dims", "matrix_transpose", "unstack",
    }
)  # fmt: skip
_SHAPE_FUNCTIONS = frozenset(
    {
        "empty_like", "zeros_like", "ones_like", "full_like", "shape", "ndim", "size", "result_type",
        "may_share_memory", "shares_memory", "iscomplexobj", "isrealobj", "can_cast", "min_scalar_type",
    }
)  # fmt: skip


_ALLOCATIONS = frozenset({"cupy.empty", "cupy.empty_like"})  # they allocate and launch no kernel


def function_mode(name: str) -> LaunchMode:
    """How the numpy function ``name`` uses its operands (views and shape queries launch no kernel)."""
    if name in _VIEW_FUNCTIONS:
        return "view"
    if name in _SHAPE_FUNCTIONS:
        return "shape"
    return "kernel"


def launch(
    machine: Machine,
    func: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    name: str,
    mode: LaunchMode = "kernel",
    host_ok: bool = False,
) -> TensorLike:
    """Runs the numpy function ``func`` as a simulated kernel on the current device.

    Args:
      machine: the simulated machine.
      func: a numpy function; it receives the numpy views of the simulated arrays.
      args, kwargs: its arguments, simulated arrays anywhere in them (in lists and tuples too).
      name: the cupy name of the operation, for messages.
      mode: how ``func`` uses its operands (see :data:`LaunchMode`).
      host_ok: accept numpy arrays among the arguments (cupy uploads index arrays and values
        of ``__setitem__``).

    Returns:
      ``func``'s result with numpy arrays turned into simulated arrays: views of an operand
      stay views of it (on its device); new arrays are allocated on the current device; numpy
      scalars become 0-d arrays.

    Raises:
      ValueError: an operand lives on another device than the current one (no peer access).
      TypeError: a numpy array operand (unless ``host_ok``).
    """
    device = machine.current_device()
    operands: list[SimulatedArray] = []
    host_args = [_unwrap(a, operands, name, host_ok) for a in args]
    host_kwargs = {k: _unwrap(v, operands, name, host_ok) for k, v in kwargs.items()}
    memories = list({id(o._memory): o._memory for o in operands}.values())
    written = _written_memories(func, args, kwargs)
    key = machine.stream_key(device_id=device)
    if mode == "kernel":
        _check_devices(operands, device, name)
        machine.check_order(key, memories, name, written)
        if name not in _ALLOCATIONS:
            machine.stats.count_work("kernel_launches")
    if mode != "shape":
        machine.wait_for_memory(memories, name)
    with np.errstate(all="ignore"):
        result = func(*host_args, **host_kwargs)
    wrapped = _wrap_result(machine, result, operands, device, name, mode)
    if mode == "view" and _has_new_array(wrapped, memories):
        machine.check_order(key, memories, name)  # not a view after all: a copy kernel read the operands
        machine.stats.count_work("kernel_launches")
        machine.mark_accessed(key, memories, name)
    elif mode == "kernel":
        machine.mark_accessed(key, memories, name, written)
    return wrapped


def _pinned_upload(
    machine: Machine, target: SimulatedArray, source: np.ndarray, pinned: PinnedMemoryPointer, key: StreamKey
) -> None:
    """Queues an asynchronous copy of ``source`` (a view of ``pinned``) into ``target`` on the stream ``key``.

    The copy is queued work (``Work``) that completes when something waits for or queries it:
    an event recorded after it (``done``, ``synchronize``), the stream's ``synchronize``, or
    a kernel that reads ``target`` (work on a stream runs in order). Only then are the bytes
    read, as the device reads them some time before the copy completes; if the host wrote
    them since the copy was issued, real hardware would have copied a mix of old and new
    bytes: :class:`SimulatedGPUError`. Earlier copies from the same pinned memory are polled
    first, so reusing a staging buffer before its copy is known to be done is caught at the
    latest when the buffer is uploaded again.
    """
    for earlier in list(pinned.copies):
        with machine.condition:
            machine._poll([earlier])  # raises if the host overwrote the bytes of an unfinished copy
    issued = np.array(source, copy=True)  # what the bytes were when the copy was issued
    what = f"an asynchronous upload from {pinned!r} to {target._memory!r}"

    def transfer() -> None:
        pinned.copies.remove(work)
        machine.complete(work)
        target._array[...] = source
        if not np.array_equal(source, issued, equal_nan=source.dtype.kind in "fc"):
            raise SimulatedGPUError(
                f"The host wrote into pinned memory while {what} from it was in flight: the device would read a mix "
                "of old and new bytes. (simulated GPU: an upload from pinned memory with a stream is asynchronous; "
                "before writing the staging buffer again, wait for an event recorded after the copy "
                "(event.synchronize(), or event.done returning True) or synchronise the stream.)"
            )

    work = Work(lambda: what, [target._memory], poll=transfer)
    pinned.copies.append(work)
    machine.stats.count_work("h2d_async")
    with machine.condition:
        machine.enqueue(key.device, key.ptr, work)
    machine.mark_written(key, [target._memory], "ndarray.set() (an asynchronous upload from pinned memory)")


def new_array(machine: Machine, host: np.ndarray, device: int, what: str = "cupy") -> SimulatedArray:
    """A simulated array on ``device`` adopting the numpy array ``host`` (which nothing else views).

    It is allocated from, and written by ``what`` (the kernel or copy that made it) on, the
    calling thread's current stream of ``device`` (``Machine.allocate``: cupy's pool may
    hand it a block freed on that stream).
    """
    _check_dtype(host.dtype)
    root = host
    while isinstance(root.base, np.ndarray):
        root = root.base
    memory = machine.allocate(root, device, what)
    return array_type(machine)._wrap(host, memory, None)


def array_type(machine: Machine) -> type[SimulatedArray]:
    """``machine``'s ``cupy.ndarray``: the subclass of :class:`SimulatedArray` bound to it."""
    with machine.condition:
        if machine.ndarray is None:
            machine.ndarray = type("ndarray", (SimulatedArray,), {"_machine": machine, "__slots__": ()})
        cls: type[SimulatedArray] = machine.ndarray
    return cls


# Functions that write their first argument in place (besides ``out=``).
_WRITE_FIRST: frozenset[Any] = frozenset(
    {_setitem, np.ndarray.fill, np.copyto, np.put, np.place, np.putmask, np.fill_diagonal, np.put_along_axis}
)


def _written_memories(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Memory]:
    """The operand memories a kernel writes in place: ``out=``, and the first argument of in-place functions."""
    targets: list[Any] = []
    out = kwargs.get("out")
    targets.extend(out if isinstance(out, tuple) else [out])
    if args and (func in _WRITE_FIRST or getattr(func, "__name__", "") == "at"):
        targets.append(args[0])
    return list({id(t._memory): t._memory for t in targets if isinstance(t, SimulatedArray)}.values())


def _has_new_array(result: TensorLike, memories: list[Memory]) -> bool:
    if isinstance(result, SimulatedArray):
        return not any(result._memory is m for m in memories)
    return type(result) in (list, tuple) and any(_has_new_array(r, memories) for r in result)


def _unwrap(value: TensorLike, operands: list[SimulatedArray], name: str, host_ok: bool) -> TensorLike:
    if isinstance(value, SimulatedArray):
        operands.append(value)
        return value._array
    if isinstance(value, np.ndarray) and not host_ok:
        raise TypeError(
            f"Unsupported type {type(value)}: {name} got a numpy array operand of shape {value.shape}. "
            "(simulated GPU: like cupy, a simulated GPU kernel refuses host arrays, 0-d ones included; "
            "upload it with cupy.asarray() or pass a Python scalar.)"
        )
    if type(value) in (list, tuple):
        return type(value)(_unwrap(v, operands, name, host_ok) for v in value)
    return value


def _check_devices(operands: list[SimulatedArray], device: int, name: str) -> None:
    for operand in operands:
        where = operand._memory.device_id
        if where != device:
            raise ValueError(
                f"The device where the array resides ({where}) is different from the current device "
                f"({device}). Peer access is unavailable between these devices. (simulated GPU: {name} "
                f"launches on the calling thread's current device, GPU {device}, and the simulated GPUs "
                f"have no peer access; run it under cupy.cuda.Device({where}) or copy the operand to "
                f"GPU {device} first.)"
            )


def _wrap_result(
    machine: Machine, result: TensorLike, operands: list[SimulatedArray], device: int, name: str, mode: LaunchMode
) -> TensorLike:
    if isinstance(result, np.ndarray):
        for operand in operands:
            if result is operand._array:
                return operand  # an out= argument, or the input itself
        for operand in operands:
            if operand._memory.size and np.may_share_memory(result, operand._memory.host):
                return operand._view(result)
        if mode == "view":
            _check_devices(operands, device, name)  # not a view after all: a copy kernel ran
        return new_array(machine, result, device, name)
    if isinstance(result, np.generic):
        return new_array(machine, np.asarray(result), device, name)
    if type(result) in (list, tuple):
        return type(result)(_wrap_result(machine, r, operands, device, name, mode) for r in result)
    return result


def _check_dtype(dtype: np.dtype[Any]) -> None:
    if dtype.kind in _UNSUPPORTED_KINDS:
        raise ValueError(
            f"Unsupported dtype {dtype} (simulated GPU: like cupy, simulated GPU arrays hold numbers and "
            "booleans only; keep strings and objects on the host)"
        )


def _order_satisfied(array: np.ndarray, order: str) -> bool:
    if order == "C":
        return bool(array.flags.c_contiguous)
    if order == "F":
        return bool(array.flags.f_contiguous)
    return True
