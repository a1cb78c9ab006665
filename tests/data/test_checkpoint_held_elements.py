"""A td.data iterator's elements handed out for a step a preemption handler never ran.

Once a ``PreemptionCheckpointHandler`` exists (``steps.track()``), a ``td.data`` iterator keeps
what it hands out until a step begins, and the handler's save (``steps.preemption_save()``)
saves it as not used: the restored iterator hands it out first. Any other save counts it as
used; an element read while a step runs is that step's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest

import towerdist as td
from towerdist._src import steps

D = td.data.Dataset


@pytest.fixture(autouse=True)
def tracking() -> Iterator[None]:
    was = steps.tracking()
    steps.track()  # what the handler does when it is made
    yield
    steps.track(was)


def ints(iterator: td.data.Iterator) -> list[int]:
    return [int(x) for x in iterator]


def restored(state: bytes) -> list[int]:
    iterator = iter(D.range(10))
    iterator._checkpoint_restorer(state)()
    return ints(iterator)


def preemption_state(iterator: td.data.Iterator) -> bytes:
    with steps.preemption_save():
        return iterator._checkpoint_state()


def test_an_element_drawn_for_a_step_not_run_is_kept_by_a_preemption_save_only() -> None:
    strategy = td.distribute.get_strategy()
    iterator = iter(D.range(10))
    for _ in range(2):
        strategy.run(lambda x: x, args=(next(iterator),))
    next(iterator)  # drawn for the step the handler saves instead of running
    assert restored(preemption_state(iterator)) == list(range(2, 10))
    assert restored(iterator._checkpoint_state()) == list(range(3, 10))


def test_an_element_read_inside_a_step_is_that_steps() -> None:
    strategy = td.distribute.get_strategy()
    iterator = iter(D.range(10))
    used: list[int] = []
    for _ in range(3):
        strategy.run(lambda: used.append(int(next(iterator))))
    assert used == [0, 1, 2]
    assert restored(preemption_state(iterator)) == list(range(3, 10))


def test_more_elements_than_it_keeps_are_counted_as_used_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    iterator = iter(D.range(10))
    for _ in range(6):
        next(iterator)
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        state = preemption_state(iterator)
    assert "the 2 oldest are counted as used" in caplog.text
    assert restored(state) == list(range(2, 10))


def test_an_error_a_distributed_iterator_read_ahead_comes_again_from_the_td_data_iterator() -> None:
    def fails_at_five(x: np.ndarray) -> np.ndarray:
        if x == 5:
            raise ValueError("a bad record")
        return x

    make = lambda: D.range(10).map(fails_at_five)  # noqa: E731
    strategy = td.distribute.MirroredStrategy(["CPU:0"])
    options = td.distribute.InputOptions(experimental_per_replica_buffer_size=8)  # reads up to the error
    distributed = iter(strategy.experimental_distribute_dataset(make(), options))
    strategy.run(lambda x: x, args=(next(distributed),))
    iterator = iter(make())
    iterator._checkpoint_restorer(distributed._checkpoint_state())()
    assert [int(next(iterator)) for _ in range(4)] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="a bad record"):
        next(iterator)
    assert ints(iterator) == []
