"""Dataset elements: converting Python values to arrays, and batching them.

An element is a nested structure (tuples, namedtuples, dicts) of components. As in
``tf.data``, a *list* is a value, not a structure: ``from_tensor_slices([1, 2])`` slices an
int32 array. Components follow TensorFlow's conversion rules: Python floats become float32,
Python ints int32 (int64 when they do not fit), strings ``bytes`` in object arrays
(``td.string``); numpy and cupy arrays keep their dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from towerdist._src import backend, nest
from towerdist._src.data.spec import ElementSpec, TensorSpec
from towerdist._src.dtypes import python_dtype
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.type_aliases import DTypeLike, Nest, TensorLike

if TYPE_CHECKING:
    from towerdist._src.data.dataset import Dataset

__all__ = [
    "call_with_element",
    "close_iterator",
    "normalize_output",
    "placeholder_element",
    "read_only",
    "read_only_element",
    "sample_element",
    "stack",
    "to_component",
    "to_element",
    "unstack_count",
]


_R = TypeVar("_R")


def call_with_element(fn: Callable[..., _R], element: Nest) -> _R:
    """Calls a user function as ``tf.data`` does: a plain tuple element as separate arguments.

    A namedtuple, dict or single array is passed as one argument.
    """
    return fn(*element) if type(element) is tuple else fn(element)


def read_only(component: TensorLike) -> TensorLike:
    """``component`` as a read-only view when it is a writable numpy array, else itself.

    TensorFlow's tensors are immutable. Elements a dataset hands out more than once (those
    of ``cache``) or shares with the caller's own arrays (a generator's, a list of batches)
    are read-only views, so that an in-place write in a step raises numpy's
    ``ValueError: ... is read-only`` instead of changing later epochs. A view costs no copy.
    (``from_tensor_slices`` and ``from_tensors`` copy their input once and freeze the copy.)
    """
    if isinstance(component, np.ndarray) and component.flags.writeable:
        view = component.view()
        view.flags.writeable = False
        return view
    return component


def read_only_element(element: Nest) -> Nest:
    """``element`` with every array in it made a read-only view (see :func:`read_only`)."""
    if isinstance(element, np.ndarray):
        return read_only(element)  # the common single-array element, without a tree walk
    return nest.map_structure(read_only, element)


def to_component(value: TensorLike) -> TensorLike:
    """One component as an array (strings as ``bytes`` in object arrays)."""
    if backend.is_array(value):
        if isinstance(value, np.ndarray) and value.dtype.kind in "US":
            return _bytes_array(value)
        if isinstance(value, np.str_):
            return value.encode()
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    if hasattr(value, "__array__") and not isinstance(value, (list, tuple)):
        return np.asarray(value)
    raw = np.asarray(value)
    if raw.dtype.kind in "US":
        return _bytes_array(raw)
    if raw.dtype == object:
        raise TypeError(
            f"Cannot convert {_preview(value)} to an array: its items are not numbers or strings "
            f"of one shape. Give each component as an array or a list of numbers."
        )
    return raw.astype(python_dtype(raw), copy=False)


def _bytes_array(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1).tolist()):
        flat[i] = item.encode() if isinstance(item, str) else item
    return out


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def to_element(structure: Nest) -> Nest:
    """Converts every component of ``structure`` (lists are components, not structures)."""
    return nest.map_structure(to_component, _lists_as_leaves(structure))


def _lists_as_leaves(structure: Nest) -> Nest:
    # optree treats lists as structures; wrap them so that they convert as one component.
    if isinstance(structure, list):
        return _ListLeaf(structure)
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*(_lists_as_leaves(v) for v in structure))
    if isinstance(structure, tuple):
        return tuple(_lists_as_leaves(v) for v in structure)
    if isinstance(structure, dict):
        return type(structure)((k, _lists_as_leaves(v)) for k, v in structure.items())
    return structure


class _ListLeaf:
    """A list standing for one component (numpy converts it through ``__array__``)."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        del copy
        raw = np.asarray([to_component(i) if isinstance(i, (str, bytes)) else i for i in self.items])
        if dtype is not None:
            return raw.astype(dtype)
        if any(backend.is_array(i) for i in self.items):
            return raw  # a list of arrays stacks with their dtype
        if raw.dtype.kind in "US":
            return _bytes_array(raw)
        return raw.astype(python_dtype(raw), copy=False)


def normalize_output(value: Nest) -> Nest:
    """A user function's result as an element: a top-level list becomes a tuple (as ``tf.data``)."""
    if isinstance(value, list):
        value = tuple(value)
    return to_element(value)


def stack(components: Sequence[TensorLike], index: int, what: str) -> TensorLike:
    """Stacks one component of several elements into a batch.

    Raises:
      InvalidArgumentError: the components' shapes differ (names the component ``index``).
    """
    first = components[0]
    if isinstance(first, bytes):
        out = np.empty(len(components), dtype=object)
        out[:] = list(components)
        return out
    shape0 = np.shape(first)
    for k, component in enumerate(components):
        if np.shape(component) != shape0:
            raise InvalidArgumentError(
                f"Cannot {what} tensors with different shapes in component {index}. First element had "
                f"shape {list(shape0)} and element {k} had shape {list(np.shape(component))}."
            )
    return backend.for_array(first).xp.stack(components)


def unstack_count(element_leaves: Sequence[Any], what: str) -> int:
    """The common leading dimension of an element's components (for unbatch/rebatch)."""
    sizes = []
    for k, leaf in enumerate(element_leaves):
        if np.ndim(leaf) == 0:
            raise ValueError(f"Cannot {what} an input with scalar components (component {k} is a scalar).")
        sizes.append(int(np.shape(leaf)[0]))
    if len(set(sizes)) > 1:
        raise InvalidArgumentError(
            f"Cannot {what} an element whose components have different batch sizes: {sizes}. Every "
            f"component must have the same size along dimension 0."
        )
    return sizes[0] if sizes else 0


def close_iterator(iterator: object) -> None:
    """Closes a generator early, so that nodes upstream release threads and files."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def sample_element(dataset: Dataset, operation: str) -> Nest:
    """What a user function is traced with: ``dataset``'s first element, else zeros of its spec.

    TensorFlow learns a function's output structure by tracing it symbolically; towerdist
    calls it on a real element, or on :func:`placeholder_element` when there is none.
    ``operation`` is the dataset operation whose function is traced (``"map"``), for messages.
    """
    source = dataset._cursor()
    try:
        return next(source)
    except StopIteration:
        return placeholder_element(dataset._spec(probe=True), operation)
    finally:
        close_iterator(source)


def placeholder_element(spec: ElementSpec, operation: str) -> Nest:
    """A zero-valued element of ``spec``: what ``map_func`` is traced with when the input is empty."""
    if spec is None:
        raise ValueError(
            f"Cannot determine the element_spec of Dataset.{operation}(): its input is empty and its structure is "
            f"decided by user code. Give from_generator an output_signature."
        )

    def zeros(s: TensorSpec) -> TensorLike:
        if s.shape is None:
            raise ValueError(
                f"Cannot determine the element_spec of Dataset.{operation}(): its input is empty and has a "
                f"component of unknown rank ({s!r})."
            )
        if s.dtype == np.object_:
            return b"" if not s.shape else np.full([d or 0 for d in s.shape], b"", dtype=object)
        value = np.zeros([d or 0 for d in s.shape], dtype=s.dtype)
        return value[()] if not s.shape else value

    return nest.map_structure(zeros, spec)
