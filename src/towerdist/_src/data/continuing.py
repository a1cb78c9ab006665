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
pass when its input raises. So only the pass an iterator reads itself goes on after an error
(:class:`Continuing`, TensorFlow's order); a pass read by another operation (or by a
distributed dataset's feed) defers the error instead (:class:`Deferring`): it delivers what it
holds first, then raises the error, so that no element read before the error is lost on the
way up, as ``shuffle`` and ``batch`` do with an error of theirs (``docs/input.md``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from towerdist._src.data.cursor import State
from towerdist._src.data.saved_errors import restore_error, save_error
from towerdist._src.type_aliases import Nest

__all__ = ["Continuing", "Deferring", "Raise", "continuing"]


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

    def __next__(self) -> Nest:
        value = next(self._generator)
        if type(value) is Raise:
            raise value.error
        return value

    def close(self) -> None:
        self._generator.close()


_END: Any = object()


class Deferring:
    """The iterator over such a generator in a pass read by another operation: its errors come last.

    A yielded :class:`Raise` is kept (in the pass's state, ``deferred_error``, so that a
    position saved meanwhile raises it too once restored) and raised when the generator has
    given everything else; an error deferred meanwhile is chained to the first as its context.
    """

    __slots__ = ("_error", "_generator", "_state")

    def __init__(self, generator: Generator[Any, None, None], state: State) -> None:
        self._generator = generator
        self._state = state
        self._error: BaseException | None = None  # the error itself (a restored pass has only its record)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Nest:
        while True:
            value = next(self._generator, _END)
            if value is _END:
                saved = getattr(self._state, "deferred_error", None)
                if saved is None:
                    raise StopIteration
                self._state.deferred_error = None
                raise self._error if self._error is not None else restore_error(saved)  # (its cause kept)
            if type(value) is not Raise:
                return value
            if getattr(self._state, "deferred_error", None) is None:
                self._state.deferred_error = save_error(value.error)
                self._error = value.error

    def close(self) -> None:
        self._generator.close()


def continuing(generator: Generator[Any, None, None], state: State) -> Continuing | Deferring:
    """``generator``'s elements, for the pass ``state``: a yielded ``Raise(error)`` raises ``error``
    and the pass goes on where an iterator reads the pass itself; elsewhere the error is deferred
    to the end of the pass (see the module docstring)."""
    if state._may_continue:
        return Continuing(generator)
    return Deferring(generator, state)
