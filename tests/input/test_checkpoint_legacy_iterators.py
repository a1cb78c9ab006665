"""The default strategy's TF 1.x-style iterator (``make_dataset_iterator``) saves and restores as the dataset's own.

Its position is the dataset iterator's; ``initialize()`` starts a new pass, which saves and
restores like any other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.input.legacy_iterators import DefaultInputIterator

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.timeout(60)]


def _iterator(strategy: td.distribute.Strategy) -> Any:
    return strategy.make_dataset_iterator(td.data.Dataset.range(12).shuffle(12, seed=4).batch(2))


def _values(iterator: Any, steps: int | None = None) -> list[list[int]]:
    if steps is None:
        return [np.asarray(v).tolist() for v in iterator]
    return [np.asarray(iterator.get_next()).tolist() for _ in range(steps)]


@pytest.mark.parametrize("steps", [0, 1, 3, 6])
def test_default_strategy_iterator_restores_its_position(default: td.distribute.Strategy, steps: int) -> None:
    saved = _iterator(default)
    assert isinstance(saved, DefaultInputIterator)
    _values(saved, steps)
    state = saved._checkpoint_state()
    rest = _values(saved)
    restored = _iterator(default)
    restored._checkpoint_restorer(state)()
    assert _values(restored) == rest


def test_default_strategy_iterator_saved_after_initialize_restores_the_new_pass(
    default: td.distribute.Strategy,
) -> None:
    saved = _iterator(default)
    first_epoch = _values(saved, 6)
    saved.initialize()  # a new pass: reshuffled
    _values(saved, 2)
    state = saved._checkpoint_state()
    rest = _values(saved)
    restored = _iterator(default)
    restored._checkpoint_restorer(state)()
    assert _values(restored) == rest
    assert len(first_epoch) == 6


def test_a_restored_default_strategy_iterator_initializes_as_the_saved_one_would(
    default: td.distribute.Strategy,
) -> None:
    # initialize() starts the next pass: the restored dataset reshuffles as the saved one does.
    saved = _iterator(default)
    _values(saved, 4)
    state = saved._checkpoint_state()
    saved.initialize()
    expected = _values(saved)
    restored = _iterator(default)
    restored._checkpoint_restorer(state)()
    assert len(_values(restored)) == 2
    restored.initialize()
    assert _values(restored) == expected
