"""``td.experimental.Optional``: a value that may be absent (what ``get_next_as_optional`` returns)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from towerdist._src.data.spec import ElementSpec, structure_of
from towerdist._src.data.structure import to_element
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.type_aliases import Nest

__all__ = ["Optional"]

_EMPTY = object()


def _read_only_bool(value: bool) -> np.ndarray:
    flag = np.array(value)
    flag.flags.writeable = False  # shared by every Optional: nobody may flip it
    return flag


_HAS_VALUE, _NO_VALUE = _read_only_bool(True), _read_only_bool(False)


class _Deferred:
    """An element spec worked out when it is first asked for (it may cost a pass of the pipeline)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], ElementSpec]) -> None:
        self.make = make


class Optional:
    """Either holds a value or is empty (``tf.experimental.Optional``).

    Example:
      >>> iterator = iter(td.data.Dataset.range(2))
      >>> optional = iterator.get_next_as_optional()
      >>> while optional.has_value():
      ...     print(optional.get_value())
      ...     optional = iterator.get_next_as_optional()
      0
      1
    """

    __slots__ = ("_element_spec", "_value")

    def __init__(self, value: Nest, element_spec: ElementSpec | _Deferred) -> None:
        self._value = value
        self._element_spec = element_spec

    @staticmethod
    def from_value(value: Nest) -> Optional:
        """An Optional holding ``value`` (its ``element_spec`` is that of ``value``, when it is arrays)."""
        try:
            spec = structure_of(to_element(value))
        except (TypeError, ValueError):
            spec = None  # e.g. per-replica values
        return Optional(value, spec)

    @staticmethod
    def empty(element_spec: ElementSpec) -> Optional:
        """An empty Optional for values described by ``element_spec``."""
        return Optional(_EMPTY, element_spec)

    @staticmethod
    def _deferred(value: Nest, make_spec: Callable[[], ElementSpec]) -> Optional:
        """An Optional holding ``value`` whose spec ``make_spec()`` gives when first read.

        Iterators hand out an Optional per step, and most callers never read its spec.
        """
        return Optional(value, _Deferred(make_spec))

    @staticmethod
    def _deferred_empty(make_spec: Callable[[], ElementSpec]) -> Optional:
        """An empty Optional whose spec ``make_spec()`` gives when first read (it may need a pass of the pipeline)."""
        return Optional(_EMPTY, _Deferred(make_spec))

    def has_value(self) -> np.ndarray:
        """Whether the Optional holds a value, as a boolean scalar (TensorFlow returns a bool tensor).

        The result is a read-only 0-d ``bool`` array: ``if``/``while``, ``bool()``,
        ``np.asarray()`` and ``.item()`` all work on it, as on TensorFlow's tensor.

        Returns:
          ``np.array(True)`` when the Optional holds a value, else ``np.array(False)``.
        """
        return _HAS_VALUE if self._value is not _EMPTY else _NO_VALUE

    def get_value(self) -> Nest:
        """The value.

        Raises:
          InvalidArgumentError: the Optional is empty.
        """
        if self._value is _EMPTY:
            raise InvalidArgumentError(
                "The given optional does not have a value. Check has_value() before get_value()."
            )
        return self._value

    @property
    def element_spec(self) -> ElementSpec:
        """The structure of ``td.TensorSpec`` of the value this optional may hold."""
        spec = self._element_spec
        if isinstance(spec, _Deferred):
            spec = self._element_spec = spec.make()
        return spec

    def __repr__(self) -> str:
        return "Optional(<empty>)" if self._value is _EMPTY else f"Optional({self._value!r})"
