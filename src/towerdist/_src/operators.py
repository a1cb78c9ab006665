"""Array operators for objects that stand for an array (``Mirrored`` values, variables).

A class mixes in :class:`ArrayOperators` and says which array it stands for in
``_operand()``; indexing, unary, arithmetic and ordering operators then act on that array
(and on the array of another such object on the other side). Equality and hashing are left
to each class: a ``Mirrored`` compares by identity, a variable element-wise.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from towerdist._src import backend
from towerdist._src.type_aliases import TensorLike

__all__ = ["ArrayOperators", "binary", "unary"]

_Binary = Callable[[Any, Any], Any]


def _operand(value: TensorLike) -> TensorLike:
    return value._operand() if isinstance(value, ArrayOperators) else value


def _on_device_of(array: TensorLike) -> Any:  # the backend's context manager
    """A context launching on ``array``'s GPU (whichever GPU the calling thread has current); nothing on the host."""
    return backend.for_array(array).on_array_device(array)


def binary(op: _Binary) -> tuple[_Binary, _Binary]:
    """The forward and reflected operator methods applying ``op`` to the operands' arrays.

    The work runs on the device of the object's array: a variable on GPU 1 read from the
    main thread (whose current GPU is 0) computes on GPU 1. Host arrays go straight through.
    """

    def forward(self: ArrayOperators, other: TensorLike) -> TensorLike:
        mine = self._operand()
        if type(mine) is np.ndarray:
            return op(mine, _operand(other))
        with _on_device_of(mine):
            return op(mine, _operand(other))

    def backward(self: ArrayOperators, other: TensorLike) -> TensorLike:
        mine = self._operand()
        if type(mine) is np.ndarray:
            return op(_operand(other), mine)
        with _on_device_of(mine):
            return op(_operand(other), mine)

    return forward, backward


def unary(op: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The operator method applying ``op`` to the object's array, on that array's device."""

    def apply(self: ArrayOperators) -> TensorLike:
        mine = self._operand()
        if type(mine) is np.ndarray:
            return op(mine)
        with _on_device_of(mine):
            return op(mine)

    return apply


class ArrayOperators:
    """Operators acting on ``self._operand()``, the array the object stands for."""

    # numpy defers binary operators with such an object on the right to the object.
    __array_priority__ = 100

    def __array_ufunc__(self, ufunc: object, method: str, *inputs: object, **kwargs: object) -> TensorLike:
        """numpy's and cupy's ufuncs (``np.sqrt(v)``, ``gpu_array * v``) applied to the array ``self`` stands for."""
        operands = []
        mine = None
        for x in inputs:
            if x is self:
                x = mine = self._operand()
            elif isinstance(x, ArrayOperators):
                x = x._operand()
            operands.append(x)
        if type(mine) is np.ndarray:
            return getattr(ufunc, method)(*operands, **kwargs)
        with _on_device_of(mine):
            return getattr(ufunc, method)(*operands, **kwargs)

    def _operand(self) -> TensorLike:
        raise NotImplementedError

    def __getitem__(self, key: object) -> TensorLike:
        mine = self._operand()
        if type(mine) is np.ndarray:
            return mine[_operand(key)]
        with _on_device_of(mine):
            return mine[_operand(key)]

    __neg__ = unary(operator.neg)
    __pos__ = unary(operator.pos)
    __abs__ = unary(operator.abs)
    __invert__ = unary(operator.invert)

    __add__, __radd__ = binary(operator.add)
    __sub__, __rsub__ = binary(operator.sub)
    __mul__, __rmul__ = binary(operator.mul)
    __truediv__, __rtruediv__ = binary(operator.truediv)
    __floordiv__, __rfloordiv__ = binary(operator.floordiv)
    __mod__, __rmod__ = binary(operator.mod)
    __pow__, __rpow__ = binary(operator.pow)
    __matmul__, __rmatmul__ = binary(operator.matmul)
    __and__, __rand__ = binary(operator.and_)
    __or__, __ror__ = binary(operator.or_)
    __xor__, __rxor__ = binary(operator.xor)
    __lt__ = binary(operator.lt)[0]
    __le__ = binary(operator.le)[0]
    __gt__ = binary(operator.gt)[0]
    __ge__ = binary(operator.ge)[0]
