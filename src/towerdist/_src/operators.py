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

__all__ = ["ArrayOperators", "binary"]

_Binary = Callable[[Any, Any], Any]


def _operand(value: Any) -> Any:
    return value._operand() if isinstance(value, ArrayOperators) else value


def binary(op: _Binary) -> tuple[_Binary, _Binary]:
    """The forward and reflected operator methods applying ``op`` to the operands' arrays."""

    def forward(self: ArrayOperators, other: Any) -> Any:
        return op(self._operand(), _operand(other))

    def backward(self: ArrayOperators, other: Any) -> Any:
        return op(_operand(other), self._operand())

    return forward, backward


class ArrayOperators:
    """Operators acting on ``self._operand()``, the array the object stands for."""

    # numpy defers binary operators with such an object on the right to the object.
    __array_priority__ = 100

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """numpy's and cupy's ufuncs (``np.sqrt(v)``, ``gpu_array * v``) applied to the array ``self`` stands for."""
        return getattr(ufunc, method)(*(_operand(x) for x in inputs), **kwargs)

    def _operand(self) -> Any:
        raise NotImplementedError

    def __getitem__(self, key: Any) -> Any:
        return self._operand()[_operand(key)]

    def __neg__(self) -> Any:
        return -self._operand()

    def __pos__(self) -> Any:
        return +self._operand()

    def __abs__(self) -> Any:
        return abs(self._operand())

    def __invert__(self) -> Any:
        return ~self._operand()

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
