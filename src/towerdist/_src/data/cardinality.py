"""``td.data.experimental.assert_cardinality`` and ``cardinality``: a dataset's number of elements.

``assert_cardinality(n)`` makes ``cardinality()`` report ``n`` and checks it while the
dataset runs, as TensorFlow's ``AssertCardinalityDataset`` does: the elements pass through,
and where the input ends early, or gives an element past the ``n``-th, ``next()`` raises
``td.errors.FailedPreconditionError`` in that element's place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import State
from towerdist._src.data.dataset import Dataset
from towerdist._src.errors import FailedPreconditionError

__all__ = ["AssertCardinalityDataset", "experimental_assert_cardinality", "experimental_cardinality"]


def _elements(n: int) -> str:
    return f"{n} element{'' if n == 1 else 's'}"


class AssertCardinalityDataset(Dataset):
    """The input's elements, checked to be ``expected`` in number (``INFINITE``: never ending)."""

    def __init__(self, input_dataset: Dataset, expected: int) -> None:
        if isinstance(expected, bool) or not isinstance(expected, (int, np.integer)):
            raise TypeError(
                f"assert_cardinality() takes an integer number of elements (or td.data.INFINITE_CARDINALITY). "
                f"Got expected_cardinality={expected!r}."
            )
        self._inputs = (input_dataset,)
        self._expected = int(expected)

    def _state_params(self) -> dict[str, Any]:
        return {"expected": self._expected}

    def _expected_text(self) -> str:
        return "an infinite number of elements" if self._expected == options_lib.INFINITE else _elements(self._expected)

    def _iterate(self, state: State) -> Iterator[Any]:
        if not state.resumed:
            state.count = 0
        source = state.input()
        try:
            for element in source:
                if self._expected != options_lib.INFINITE and state.count >= self._expected:
                    raise FailedPreconditionError(
                        f"Input dataset was expected to contain {self._expected_text()} but contained at least "
                        f"{_elements(state.count + 1)}."
                    )
                state.count += 1
                yield element
            if self._expected == options_lib.INFINITE or state.count < self._expected:
                raise FailedPreconditionError(
                    f"Input dataset was expected to contain {self._expected_text()} but contained only "
                    f"{_elements(state.count)}."
                )
        finally:
            source.close()

    def _cardinality(self) -> int:
        return self._expected


def experimental_assert_cardinality(expected_cardinality: int) -> Callable[[Dataset], Dataset]:
    """``td.data.experimental.assert_cardinality``: for ``apply``, a dataset that reports and checks
    ``expected_cardinality`` elements (see the module docstring).

    Example:
      >>> ds = td.data.Dataset.range(5).filter(lambda x: True)
      >>> int(ds.apply(td.data.experimental.assert_cardinality(5)).cardinality())
      5
    """
    return lambda dataset: AssertCardinalityDataset(dataset, expected_cardinality)


def experimental_cardinality(dataset: Dataset) -> np.int64:
    """``td.data.experimental.cardinality``: ``dataset.cardinality()``."""
    return dataset.cardinality()
