"""Slice assignment: ``v[key].assign(value)`` writes part of a variable (TensorFlow's sliced assign).

Indexing a variable reads it: ``v[1:]`` is the array the key selects from the current
value (a snapshot). On host memory that array is a :class:`VariableSlice`, a numpy
array that also remembers the variable and the key, so that ``v[1:].assign([5.0, 6.0])``
writes those elements. Only the result of indexing a variable can be assigned; arrays
derived from it (``v[0][1]``, ``v[1:] + 1``, ``v[1:].copy()``) cannot, as in TensorFlow,
and TensorFlow has no sliced ``assign_add``/``assign_sub`` either.

The write itself is one more operation of the variables' write protocol: its ``op`` is a
:class:`SliceAssign` (the other ops are the method names ``"assign"``, ...), so a sliced
assign follows every rule of ``assign`` (which components it writes in which context,
aggregation in replica context, all-or-nothing across components).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src.errors import InvalidArgumentError
from towerdist._src.type_aliases import Array, HostArray, TensorLike

if TYPE_CHECKING:  # the variables import this module: only their types are named here
    from towerdist._src.variables.scatter import Scatter
    from towerdist._src.variables.variable import Variable, WriteResult

__all__ = ["SliceAssign", "VariableSlice", "describe_write", "slice_of"]


class SliceAssign:
    """The write ``variable[key].assign(value)``, as an ``op`` of the write protocol.

    A new object per call; it compares and hashes by identity, as write ops are looked up
    in tables keyed by method name.
    """

    __slots__ = ("index", "key")

    def __init__(self, key: object) -> None:  # an index expression numpy takes, kept and shown
        self.key = key
        self.index = f"[{format_key(key)}]"

    def __str__(self) -> str:
        return f"{self.index}.assign"

    def check(self, old: TensorLike, value: Array, name: str) -> None:
        """Raises unless ``value`` broadcasts to the shape of ``old[key]``, as TensorFlow's sliced assign allows.

        Raises:
          InvalidArgumentError: ``value`` does not broadcast to the selected elements' shape.
        """
        selected = tuple(old[self.key].shape)
        shape = tuple(value.shape)
        try:
            fits = np.broadcast_shapes(shape, selected) == selected
        except ValueError:
            fits = False
        if not fits:
            raise InvalidArgumentError(
                f"Cannot assign a value of shape {shape} to the elements {self.index} of variable {name}, of "
                f"shape {selected}: the value must have that shape or broadcast to it. Reshape the value or "
                f"change the key."
            )

    def apply(self, new: TensorLike, value: TensorLike) -> TensorLike:
        """Sets the elements ``key`` selects in ``new`` (a private copy of the old value) to ``value``."""
        new[self.key] = value
        return new


def describe_write(owner: str, op: str | SliceAssign | Scatter) -> str:
    """The call a write op stands for, e.g. ``"v.assign_add()"`` or ``"v[1:].assign()"``."""
    return f"{owner}{op}()" if type(op) is SliceAssign else f"{owner}.{op}()"


def format_key(key: object) -> str:
    """``key`` as Python's indexing syntax writes it: ``0``, ``1:``, ``::2, 0``, ``...``."""
    parts = key if type(key) is tuple else (key,)
    return ", ".join(_format_part(part) for part in parts)


def _format_part(part: object) -> str:
    if isinstance(part, slice):
        text = ":".join("" if x is None else str(x) for x in (part.start, part.stop))
        return text if part.step is None else f"{text}:{part.step}"
    if part is Ellipsis:
        return "..."
    if isinstance(part, (int, np.integer)) and not isinstance(part, (bool, np.bool_)):
        return str(int(part))
    if isinstance(part, np.ndarray):
        return f"<array of shape {part.shape}>"
    return repr(part)


class VariableSlice(np.ndarray):
    """A numpy array read from a variable with ``v[key]``; ``assign`` writes it back.

    In every other respect it is the array it holds: arithmetic and numpy functions give
    plain numpy arrays, and indexing it again gives plain arrays (which cannot be assigned,
    as in TensorFlow).
    """

    # Set on the object ``slice_of`` returns; views and copies numpy derives from it get None.
    _variable: Any
    _key: Any

    def __array_finalize__(self, obj: object) -> None:
        self._variable = None
        self._key = None

    def __array_wrap__(self, array: HostArray, context: object = None, return_scalar: bool = False) -> Any:
        # Results of ufuncs and reductions are plain arrays (or numpy scalars).
        plain = array.view(np.ndarray) if isinstance(array, VariableSlice) else array
        return plain[()] if return_scalar else plain

    def __getitem__(self, key: Any) -> Any:
        return self.view(np.ndarray)[key]

    def __repr__(self) -> str:
        return repr(self.view(np.ndarray))

    def __reduce__(self) -> Any:
        # Pickles (and deep copies) as the plain array: the link to the variable stays here.
        return self.view(np.ndarray).__reduce__()

    @property
    def assign(self) -> Callable[..., WriteResult]:
        """``assign(value, name=None)``: writes ``value`` to the elements this array was read from.

        Returns what ``variable.assign`` returns (the variable, read when used; for a
        distributed variable in cross-replica context, the new values). ``value``
        broadcasts to this array's shape. Writes follow the variable's rules: in a
        distributed variable's cross-replica context every component is written.

        Raises:
          AttributeError: this array was derived from a slice instead of read with ``v[key]``.
          InvalidArgumentError: ``value`` does not broadcast to this array's shape.
        """
        if self._variable is None:
            raise AttributeError(
                "this array has no assign(): only the array read by indexing a variable (v[key]) can be "
                "assigned, not arrays derived from it; index the variable with the whole key instead."
            )
        return self._assign

    def _assign(self, val: TensorLike, name: str | None = None) -> WriteResult:
        del name  # a graph-mode op name: accepted for TensorFlow compatibility
        return self._variable._write(SliceAssign(self._key), val, True)

    def numpy(self) -> Any:
        """A writable host copy (a numpy scalar for a single element), as a tensor's ``numpy()``."""
        copy = np.array(self.view(np.ndarray), copy=True)
        return copy[()] if copy.ndim == 0 else copy


def slice_of(variable: Variable, key: object, value: TensorLike) -> TensorLike:
    """``value`` (read from ``variable`` with ``key``) with ``assign``, when it lives in host memory.

    GPU arrays are returned as they are.
    """
    if isinstance(value, np.generic):
        # An element: a 0-d array of its own (numpy scalars cannot carry the key), writable
        # like the numpy scalar it replaces, so ``total = v[0]; total += 1`` still works.
        value = np.asarray(value)
    elif type(value) is not np.ndarray:
        return value
    result = value.view(VariableSlice)
    result._variable = variable
    result._key = key
    return result
