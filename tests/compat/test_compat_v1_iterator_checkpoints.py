"""``distribute_dataset``'s iterators (TF 1.9-1.11's ``make_one_shot_iterator``/``make_initializable_iterator``) are
checkpointable: their position is the dataset iterator's, so a restored iterator's next step starts at the next
element, whatever the number of towers.
"""

from __future__ import annotations

from typing import Any

import pytest

import towerdist as td

from compat_v1_helpers import tower

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _dataset() -> td.data.Dataset:
    return td.data.Dataset.range(13).shuffle(13, seed=2)


def _steps(strategy: Any, iterator: Any) -> list[list[int]]:
    return [[int(x) for x in strategy.unwrap(group)] for group in iterator]


@pytest.mark.parametrize("kind", ["make_one_shot_iterator", "make_initializable_iterator"])
@pytest.mark.parametrize(("saved_towers", "restored_towers"), [(2, 2), (2, 4), (4, 1)])
def test_restored_iterator_goes_on_at_the_next_element(kind: str, saved_towers: int, restored_towers: int) -> None:
    saved_strategy, restored_strategy = tower(saved_towers), tower(restored_towers)
    saved = getattr(saved_strategy.distribute_dataset(_dataset()), kind)()
    head = [int(x) for _ in range(2) for x in saved_strategy.unwrap(saved.get_next())]
    state = saved._checkpoint_state()
    order = [int(x) for x in _dataset()]
    assert head == order[: len(head)]
    restored = getattr(restored_strategy.distribute_dataset(_dataset()), kind)()
    restored._checkpoint_restorer(state)()
    rest = order[len(head) :]
    whole_steps = len(rest) // restored_towers
    expected = [rest[k * restored_towers : (k + 1) * restored_towers] for k in range(whole_steps)]
    assert _steps(restored_strategy, restored) == expected


def test_restored_initializable_iterator_initializes_as_the_saved_one_would() -> None:
    strategy = tower(2)
    saved = strategy.distribute_dataset(_dataset()).make_initializable_iterator()
    saved.get_next()
    state = saved._checkpoint_state()
    saved.initialize()
    expected = _steps(strategy, saved)
    restored = strategy.distribute_dataset(_dataset()).make_initializable_iterator()
    restored._checkpoint_restorer(state)()
    restored.initialize()
    assert _steps(strategy, restored) == expected
