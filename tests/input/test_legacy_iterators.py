"""``make_dataset_iterator`` / ``make_input_fn_iterator``: TF 1.x-style iterators that restart.

TensorFlow 2.21, eager, ``range(8).batch(2)``: ``initialize()`` returns ``None`` and the next
``get_next()`` is the first element again; reading ``initializer`` does the same and is
``None``. Observed on MirroredStrategy over two CPUs (the first element ``[[0], [1]]``, or
``[[0, 1], [2, 3]]`` from an input function) and OneDeviceStrategy (``[0, 1]``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import towerdist as td

from conftest import mirrored_param

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.timeout(60)]

STRATEGIES = ["default", "one_device_cpu", mirrored_param(1), mirrored_param(2)]

# The first two elements of range(8).batch(2) through each kind of iterator, per strategy,
# as each replica's list (TF 2.21's values for one_device_cpu and a 2-replica MirroredStrategy).
# By replica count: the default, one_device_cpu and mirrored_param(1) have one replica.
FIRST_OF_DATASET = {
    1: [[[0, 1]], [[2, 3]]],
    2: [[[0], [1]], [[2], [3]]],
}
FIRST_OF_INPUT_FN = {
    1: [[[0, 1]], [[2, 3]]],
    2: [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
}


@pytest.fixture(params=STRATEGIES)
def strategy_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _lists(strategy: td.distribute.Strategy, value: Any) -> list[list[int]]:
    return [np.asarray(part).tolist() for part in strategy.experimental_local_results(value)]


def _make(strategy: td.distribute.Strategy, kind: str) -> Any:
    if kind == "dataset":
        return strategy.make_dataset_iterator(td.data.Dataset.range(8).batch(2))
    return strategy.make_input_fn_iterator(lambda ctx: td.data.Dataset.range(8).batch(2))


@pytest.mark.parametrize("kind", ["dataset", "input_fn"])
def test_initialize_returns_none_and_restarts_from_the_first_element(request, strategy_name, kind):
    strategy = request.getfixturevalue(strategy_name)
    first, second = (FIRST_OF_DATASET if kind == "dataset" else FIRST_OF_INPUT_FN)[strategy.num_replicas_in_sync]
    iterator = _make(strategy, kind)
    assert [_lists(strategy, iterator.get_next()) for _ in range(2)] == [first, second]

    assert iterator.initialize() is None

    assert _lists(strategy, iterator.get_next()) == first
    assert _lists(strategy, iterator.get_next()) == second


@pytest.mark.parametrize("kind", ["dataset", "input_fn"])
def test_reading_initializer_restarts_and_is_none(request, strategy_name, kind):
    strategy = request.getfixturevalue(strategy_name)
    first, _ = (FIRST_OF_DATASET if kind == "dataset" else FIRST_OF_INPUT_FN)[strategy.num_replicas_in_sync]
    iterator = _make(strategy, kind)
    iterator.get_next()
    iterator.get_next()

    assert iterator.initializer is None

    assert _lists(strategy, iterator.get_next()) == first


def test_initialize_after_the_end_starts_a_new_epoch(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    iterator = _make(strategy, "dataset")
    epoch = [_lists(strategy, x) for x in iterator]
    with pytest.raises(td.errors.OutOfRangeError):
        iterator.get_next()

    iterator.initialize()

    assert [_lists(strategy, x) for x in iterator] == epoch
    assert sum(len(step) for step in epoch) == len(epoch) * strategy.num_replicas_in_sync


def test_initialize_keeps_the_get_next_as_optional_protocol(mirrored_strategy):
    iterator = _make(mirrored_strategy, "dataset")
    for _ in range(4):
        iterator.get_next()
    assert not iterator.get_next_as_optional().has_value()
    iterator.initialize()
    optional = iterator.get_next_as_optional()
    assert optional.has_value() and _lists(mirrored_strategy, optional.get_value()) == [[0], [1]]


def test_the_iterators_stay_distributed_iterators(mirrored_strategy):
    iterator = _make(mirrored_strategy, "dataset")
    assert isinstance(iterator, td.distribute.DistributedIterator)
    assert iterator.element_spec == iter(
        mirrored_strategy.experimental_distribute_dataset(td.data.Dataset.range(8).batch(2))
    ).element_spec


def test_initialize_stops_the_read_ahead_of_the_old_pass(mirrored_strategy):
    def prefetchers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "towerdist-prefetch" and t.is_alive()]

    before = set(prefetchers())
    iterator = mirrored_strategy.make_dataset_iterator(td.data.Dataset.range(40).batch(2).prefetch(4))
    iterator.get_next()
    for _ in range(3):
        iterator.initialize()
        assert _lists(mirrored_strategy, iterator.get_next()) == [[0], [1]]
    iterator.initialize()
    for thread in set(prefetchers()) - before:
        thread.join(timeout=20)
    assert set(prefetchers()) - before == set()
