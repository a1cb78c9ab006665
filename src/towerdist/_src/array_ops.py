"""A few TensorFlow-named array helpers, so documented tf.distribute examples run verbatim.

They return numpy arrays (cupy arrays on a GPU device) where TensorFlow returns tensors,
and follow TensorFlow's dtype rules for Python values: Python floats become float32 and
Python ints int32 (int64 if they do not fit). Arrays keep their dtype. Functions that
create arrays from scratch place them on the current ``td.device``.

This is not a TensorFlow replacement: there is no autodiff and no graph.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from towerdist._src import backend
from towerdist._src import device as device_lib
from towerdist._src.dtypes import python_dtype
from towerdist._src.errors import OutOfRangeError, OutOfRangeStopIteration
from towerdist._src.type_aliases import AxisLike, DTypeLike, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, Mirrored, PerReplica

__all__ = [
    "add_n",
    "as_array",
    "cast",
    "constant",
    "convert_to_tensor",
    "function",
    "identity",
    "ones",
    "range",
    "reduce_mean",
    "reduce_sum",
    "zeros",
]

_HOST_ONLY_KINDS = "OSUVMm"  # objects, strings, bytes, void, datetimes: cupy holds numbers only


def from_python(value: object, api: str) -> np.ndarray:
    """``value`` (a Python number, string or nested list of them) as a host array.

    Raises:
      ValueError: ``value`` is ragged (nested lists of different lengths), or is not
        something an array of numbers or strings can hold (None, a dict, a function, ...),
        as TensorFlow refuses to make a tensor of it.
    """
    try:
        raw = np.asarray(value)
    except ValueError as error:
        if not (isinstance(value, (list, tuple)) and "sequence" in str(error)):
            raise  # e.g. a PerReplica element refusing conversion outside a replica
        raise ValueError(
            f"Can't convert non-rectangular Python sequence to an array: {api} got {_short(value)}, whose "
            f"nested lists have different lengths. Pad the rows to one length, or keep the rows as separate "
            f"arrays."
        ) from None
    if raw.dtype.kind in "OV":
        raise ValueError(
            f"Attempt to convert a value ({_short(value)}) with an unsupported type ({type(value)}) to an array: "
            f"{api} takes numbers, strings, arrays, or nested lists/tuples of them."
        )
    return raw


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _backend_for_new() -> ModuleType:
    return backend.for_device(device_lib.current())


def constant(
    value: TensorLike, dtype: DTypeLike | None = None, shape: Sequence[int] | None = None, name: str | None = None
) -> TensorLike:
    """Creates an array from ``value`` on the current device (``tf.constant``).

    Python floats give float32 and Python ints int32 unless ``dtype`` says otherwise.
    With ``shape``, a scalar is broadcast to it and other values are reshaped to it.

    Example:
      >>> td.constant(3.0)
      array(3., dtype=float32)
    """
    del name
    here = device_lib.current()
    if backend.is_array(value):
        # An array goes to the scope's device (as tf.constant does); without a scope it stays where it is.
        impl = backend.for_array(value) if here is None else backend.for_device(here)
        array = impl.asarray(impl.to_device(value, here) if here is not None else value, dtype=dtype, device=here)
    else:
        impl = _backend_for_new()
        raw = from_python(value, "td.constant()")
        array = impl.asarray(raw, dtype=dtype if dtype is not None else python_dtype(raw), device=device_lib.current())
    if shape is not None:
        shape = tuple(shape)
        if array.ndim == 0 or array.size == 1:
            array = impl.xp.broadcast_to(array.reshape(()), shape).copy()
        else:
            array = array.reshape(shape)
    elif backend.is_array(value):
        array = impl.copy(array)  # a constant never aliases the caller's array
    return array


def convert_to_tensor(
    value: TensorLike, dtype: DTypeLike | None = None, dtype_hint: DTypeLike | None = None, name: str | None = None
) -> TensorLike:
    """Returns ``value`` as an array (``tf.convert_to_tensor``).

    Arrays of the right dtype are returned as they are, wherever they live (TensorFlow
    returns an existing tensor unchanged). Host data (Python values, numpy arrays) inside a
    ``td.device("GPU:k")`` scope is placed on that GPU, as ``td.constant`` places it. A
    ``PerReplica`` or ``Mirrored`` converts to its local component inside a replica; a
    variable to its value (``v.value()``); an ``IndexedSlices`` to its dense array (repeated
    indices summed).
    """
    del name
    array = as_array(value, dtype, dtype_hint)
    if type(array) is not np.ndarray or array.dtype.kind in _HOST_ONLY_KINDS:
        return array
    here = device_lib.current()
    if here is not None and here.device_type == "GPU":
        return backend.for_device(here).to_device(array, here)
    return array


def as_array(value: TensorLike, dtype: DTypeLike | None = None, dtype_hint: DTypeLike | None = None) -> TensorLike:
    """``value`` as an array where it is, for towerdist's own use (``convert_to_tensor`` without the device scope).

    A ``PerReplica`` or ``Mirrored`` converts to its local component inside a replica; a
    variable to its value; Python values become arrays of the current device.
    """
    if hasattr(value, "_towerdist_dense"):
        value = value._towerdist_dense()  # an IndexedSlices: its dense value, as TensorFlow converts it
    elif hasattr(value, "_towerdist_value") and not isinstance(value, Mirrored):
        value = value._towerdist_value()  # a variable: its value in this context
    elif isinstance(value, PerReplica):
        value = value._local()  # raises outside a replica context
    elif isinstance(value, DistributedValues):
        value = value._get()
    if backend.is_array(value) and not np.isscalar(value):
        if dtype is None or value.dtype == np.dtype(dtype):
            return value
        return cast(value, dtype)
    if hasattr(value, "__array__") and not backend.is_array(value):
        array = np.asarray(value)
        return array if dtype is None else array.astype(dtype, copy=False)
    return constant(value, dtype=dtype if dtype is not None else dtype_hint)


def cast(x: TensorLike, dtype: DTypeLike, name: str | None = None) -> TensorLike:
    """``x`` converted to ``dtype`` (a new array), on the scope's device when there is a ``td.device`` scope."""
    del name
    array = as_array(x)
    here = device_lib.current()
    if here is not None:
        impl = backend.for_device(here)
        if backend.for_array(array) is not impl or (
            impl is not backend.host() and array.device.id != here.device_index
        ):
            array = impl.to_device(array, here)
    impl = backend.for_array(array)
    with impl.on_array_device(array):
        return array.astype(dtype)


def identity(x: TensorLike, name: str | None = None) -> TensorLike:
    """A new array with the value of ``x`` (later changes to ``x`` do not show through).

    Inside a ``td.device`` scope the copy is made on that device, as ``tf.identity`` is
    placed there; otherwise on ``x``'s own device.
    """
    del name
    if hasattr(x, "_towerdist_dense"):  # an IndexedSlices: a new one, of copies (TensorFlow keeps it sparse)
        return type(x)(identity(x.values), identity(x.indices), x.dense_shape)
    array = as_array(x)
    here = device_lib.current()
    if here is None or (type(array) is np.ndarray and array.dtype.kind in _HOST_ONLY_KINDS):
        return backend.for_array(array).copy(array)  # strings, objects, datetimes: host memory, as in TF
    impl = backend.for_device(here)
    moved = impl.to_device(array, here)
    return moved if moved is not array else impl.copy(moved, here)


def add_n(inputs: Sequence[TensorLike], name: str | None = None) -> TensorLike:
    """The element-wise sum of same-shaped arrays (``tf.math.add_n``)."""
    del name
    arrays = [convert_to_tensor(x) for x in inputs]
    if not arrays:
        raise ValueError("add_n() needs at least one input. Got inputs=[].")
    return backend.for_array(arrays[0]).add_n(arrays)


def _axis(axis: AxisLike | None) -> AxisLike | None:
    if axis is None or isinstance(axis, (int, np.integer)):
        return axis
    return tuple(int(a) for a in axis)


def reduce_sum(
    input_tensor: TensorLike, axis: AxisLike | None = None, keepdims: bool = False, name: str | None = None
) -> TensorLike:
    """Sum over ``axis`` (all axes when None), keeping the dtype."""
    del name
    array = convert_to_tensor(input_tensor)
    impl = backend.for_array(array)
    with impl.on_array_device(array):  # on the array's own GPU, whichever is current
        return impl.xp.asarray(impl.xp.sum(array, axis=_axis(axis), keepdims=keepdims, dtype=array.dtype))


def reduce_mean(
    input_tensor: TensorLike, axis: AxisLike | None = None, keepdims: bool = False, name: str | None = None
) -> TensorLike:
    """Mean over ``axis``; integer inputs give a truncated integer mean, as in TensorFlow."""
    del name
    array = convert_to_tensor(input_tensor)
    impl = backend.for_array(array)
    xp = impl.xp
    with impl.on_array_device(array):  # on the array's own GPU, whichever is current
        if array.dtype.kind in "iu":
            total = xp.sum(array, axis=_axis(axis), keepdims=keepdims, dtype=np.int64)
            count = array.size // max(total.size, 1) if array.size else 0
            if count == 0:
                raise ValueError("reduce_mean() of an empty integer array is undefined.")
            quotient = xp.abs(total) // count * xp.sign(total)
            return xp.asarray(quotient.astype(array.dtype))
        return xp.asarray(xp.mean(array, axis=_axis(axis), keepdims=keepdims, dtype=array.dtype))


def zeros(shape: int | Sequence[int], dtype: DTypeLike = np.float32, name: str | None = None) -> TensorLike:
    """An array of zeros on the current device (float32 by default)."""
    del name
    return _backend_for_new().zeros(_shape(shape), dtype, device_lib.current())


def ones(shape: int | Sequence[int], dtype: DTypeLike = np.float32, name: str | None = None) -> TensorLike:
    """An array of ones on the current device (float32 by default)."""
    del name
    array = _backend_for_new().zeros(_shape(shape), dtype, device_lib.current())
    array[...] = 1
    return array


def range(  # noqa: A001
    start: TensorLike, limit: TensorLike = None, delta: TensorLike = 1, dtype: DTypeLike | None = None, name: str | None = None
) -> TensorLike:
    """``tf.range``: ``start, start + delta, ...`` below ``limit`` (int32 or float32 by default)."""
    del name
    if limit is None:
        start, limit = 0, start
    if dtype is None:
        is_float = any(
            isinstance(v, float) or (backend.is_array(v) and np.dtype(v.dtype).kind == "f")
            for v in (start, limit, delta)
        )
        dtype = np.float32 if is_float else np.int32
    return _backend_for_new().xp.arange(start, limit, delta, dtype=dtype)


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def function(func: Callable[..., Any] | None = None, **options: object) -> Any:
    """Accepts ``tf.function`` and its keyword arguments, and returns ``func`` run eagerly.

    towerdist runs everything eagerly; replicas are concurrent without compilation.
    Works both as ``@td.function`` and ``@td.function(jit_compile=True, ...)``. The
    result is what ``func`` returns, with one difference TensorFlow code can tell by its
    ``except`` clauses: a ``StopIteration`` escaping ``func`` (``next(iterator)`` on an
    exhausted iterator) is raised as ``td.errors.OutOfRangeError``, as from a
    ``tf.function``, so ``try: while True: step(iterator)`` / ``except
    td.errors.OutOfRangeError:`` ends an epoch. The error is a ``StopIteration`` too
    (``td.errors.OutOfRangeStopIteration``), except where a generator or coroutine is on
    the stack (Python would turn it into ``RuntimeError`` there).
    """
    del options
    if func is None:
        return _step_function
    return _step_function(func)


def _step_function(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with TensorFlow's error for a ``StopIteration`` escaping it (``td.function``)."""
    if getattr(func, "_towerdist_function", False):
        return func  # already wrapped: td.function(td.function(f)) calls f through one wrapper

    @functools.wraps(func)
    def step(*args: object, **kwargs: object) -> Any:
        # A try block costs nothing until it raises (Python 3.11+): this stays a plain call.
        try:
            return func(*args, **kwargs)
        except StopIteration as stop:
            if isinstance(stop, OutOfRangeError):
                raise  # from an inner td.function
            raise _out_of_range(func) from stop

    step._towerdist_function = True  # type: ignore[attr-defined]
    step.python_function = func  # type: ignore[attr-defined]  # as tf.function's attribute
    return step


_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _out_of_range(func: Callable[..., Any]) -> OutOfRangeError:
    """The error for a ``StopIteration`` out of ``func``: a ``StopIteration`` too unless PEP 479 would mangle it."""
    name = getattr(func, "__qualname__", repr(func))
    message = (
        f"End of sequence: a StopIteration escaped the td.function {name}() (next() on an exhausted iterator), "
        f"raised as OutOfRangeError, as from a tf.function; catch td.errors.OutOfRangeError to end the epoch, "
        f"or check for the end with iterator.get_next_as_optional()."
    )
    frame = sys._getframe(2)  # the caller of the td.function
    while frame is not None:
        if frame.f_code.co_flags & _GENERATOR_FLAGS:
            return OutOfRangeError(message)  # leaves a generator unchanged, as TensorFlow's does
        frame = frame.f_back  # type: ignore[assignment]
    return OutOfRangeStopIteration(message)
