"""Passes that raise an error and then go on: TensorFlow's rule for operations that hold elements.

A Python generator that raises is over. An operation that holds elements read before an
error (``group_by_window``'s windows, ``interleave``'s open inputs) must still deliver them
after the error, as TensorFlow does, so its pass must survive raising. Such a node writes its
``_iterate`` generator as usual and, where the error belongs, yields ``Raise(error)`` instead
of raising; :func:`continuing` wraps the generator into the iterator its cursor runs, which
raises that error from ``next()`` and leaves the generator suspended, so the next ``next()``
goes on. The generator keeps the cursor rule (see :mod:`~towerdist._src.data.cursor`): when it
yields ``Raise``, its state says where the pass stands *after* the error.

An operation downstream that does not hold elements (``map``, ``batch``, ...) still ends its
pass when its input raises; the iterator then reports the end of the data.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

__all__ = ["Continuing", "Raise", "continuing"]


class Raise:
    """Yielded by a node's generator in place of an element: ``next()`` raises ``error`` there."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Continuing:
    """The iterator a cursor runs over a generator that may yield :class:`Raise` (see the module)."""

    __slots__ = ("_generator",)

    def __init__(self, generator: Generator[Any, None, None]) -> None:
        self._generator = generator

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        value = next(self._generator)
        if type(value) is Raise:
            raise value.error
        return value

    def close(self) -> None:
        self._generator.close()


def continuing(generator: Generator[Any, None, None]) -> Continuing:
    """``generator``'s elements; a yielded ``Raise(error)`` raises ``error`` and the pass goes on."""
    return Continuing(generator)
