"""Saving and restoring ``td.data`` iterators at the edges: before the first element, after the end, after an
error, and into a pipeline that is not the saved one (which fails, naming the operation, and leaves the
iterator as it was).

TensorFlow matches a saved iterator to the pipeline by the operations' names only (no arguments are
checked) and raises ``NotFoundError`` "Failed to restore dataset iterator from checkpoint ... Make sure
the dataset definition has not changed"; towerdist also checks the arguments without which a saved
position means nothing (``shard``'s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.data import interleave, state_codec
from towerdist._src.data.cursor import PipelineMismatchError

from iterator_checkpoint_helpers import assert_same_elements, restored_rest, save_after

D = td.data.Dataset


def _failing_scan(s: Any, x: Any) -> Any:
    if x == 3:
        raise ValueError("three")
    return s + x, s


# --- before the first element, after the end, after an error --------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: D.range(5), id="range"),
        pytest.param(lambda: D.range(6).shuffle(3).repeat(2), id="unseeded_shuffle_epochs"),
        pytest.param(lambda: D.random(rerandomize_each_iteration=True).take(3).repeat(2), id="rerandomized"),
        pytest.param(lambda: D.range(4).concatenate(D.range(2)).batch(4), id="concatenate_batch"),
    ],
)
def test_saved_before_the_first_element_restores_the_whole_pass(make: Callable[[], D]) -> None:
    iterator = iter(make())
    state = iterator._checkpoint_state()
    whole = list(iterator)
    assert_same_elements(whole, restored_rest(make, state))


def test_saved_after_the_end_restores_an_ended_iterator() -> None:
    make = lambda: D.range(4).batch(3)  # noqa: E731
    iterator = iter(make())
    assert len(list(iterator)) == 2
    state = iterator._checkpoint_state()
    assert restored_rest(make, state) == []
    moving = iter(make())
    next(moving)
    moving._checkpoint_restorer(state)()  # an ended position ends an iterator in the middle of its pass
    with pytest.raises(td.errors.OutOfRangeError):
        moving.get_next()


def test_saved_after_the_pipeline_raised_restores_an_ended_iterator() -> None:
    # An error ends the pass (towerdist's rule; TensorFlow's iterators go on after some errors).
    make = lambda: D.range(6).scan(np.int64(0), _failing_scan)  # noqa: E731
    iterator = iter(make())
    assert [int(next(iterator)) for _ in range(3)] == [0, 0, 1]
    with pytest.raises(ValueError, match="three"):
        next(iterator)
    state = iterator._checkpoint_state()
    assert restored_rest(make, state) == []


def test_an_iterator_whose_pipeline_raised_restores_a_saved_position() -> None:
    make = lambda: D.range(6).scan(np.int64(0), _failing_scan)  # noqa: E731
    good = iter(make())
    next(good)
    state = good._checkpoint_state()
    failed = iter(make())
    with pytest.raises(ValueError, match="three"):
        list(failed)
    failed._checkpoint_restorer(state)()
    assert [int(next(failed)) for _ in range(2)] == [0, 1]


def test_an_ended_iterator_restores_a_saved_position() -> None:
    make = lambda: D.range(5).shuffle(5, seed=3)  # noqa: E731
    saved = save_after(make, 2)
    iterator = iter(make())
    list(iterator)
    iterator._checkpoint_restorer(saved.state)()
    assert_same_elements(saved.rest, list(iterator))


def test_a_closed_iterator_saves_as_ended() -> None:
    make = lambda: D.range(5)  # noqa: E731
    iterator = iter(make())
    next(iterator)
    iterator.close()
    assert restored_rest(make, iterator._checkpoint_state()) == []


def test_a_restore_commits_only_when_called() -> None:
    make = lambda: D.range(6)  # noqa: E731
    saved = save_after(make, 4)
    iterator = iter(make())
    commit = iterator._checkpoint_restorer(saved.state)
    assert int(next(iterator)) == 0  # prepared, not committed: the iterator goes on as it was
    commit()
    assert [int(v) for v in iterator] == [4, 5]


# --- into a pipeline that is not the saved one ------------------------------------------------------


MISMATCHES = {
    # id: (saved pipeline, restored pipeline, the start of the message)
    "other_operation": (
        lambda: D.range(8).batch(2),
        lambda: D.range(8).shuffle(2, seed=1),
        r"cannot restore the iterator: its pipeline differs from the saved one at operation 1 from the output "
        r"\(ShuffleDataset\): the checkpoint was saved from BatchDataset there",
    ),
    "other_operation_upstream": (
        lambda: D.range(8).skip(1).batch(2),
        lambda: D.range(8).take(7).batch(2),
        r"at operation 2 from the output \(BatchDataset <- TakeDataset\): the checkpoint was saved from SkipDataset",
    ),
    "other_shard_count": (
        lambda: D.range(8).shard(2, 0),
        lambda: D.range(8).shard(3, 0),
        r"the checkpoint was saved from ShardDataset\(num_shards=2, index=0\) there, this pipeline has "
        r"ShardDataset\(num_shards=3, index=0\)",
    ),
    "other_shard_index": (
        lambda: D.range(8).shard(2, 0),
        lambda: D.range(8).shard(2, 1),
        r"ShardDataset\(num_shards=2, index=0\) there, this pipeline has ShardDataset\(num_shards=2, index=1\)",
    ),
    "extra_operation": (
        lambda: D.range(8).batch(2),
        lambda: D.range(8).batch(2).take(3),
        r"at operation 1 from the output \(TakeDataset\): the checkpoint was saved from BatchDataset",
    ),
    "extra_operation_upstream": (
        lambda: D.range(8).batch(2),
        lambda: D.range(8).skip(0).batch(2),
        r"at operation 2 from the output \(BatchDataset <- SkipDataset\): the checkpoint was saved from RangeDataset",
    ),
    "missing_input": (
        lambda: D.zip(D.range(8), D.range(8), D.range(8)),
        lambda: D.zip(D.range(8), D.range(8)),
        r"cannot restore the iterator: its pipeline has 3 operations, the saved one had 4 \(ZipDataset <- "
        r"RangeDataset <- RangeDataset <- RangeDataset\)",
    ),
    "extra_input": (
        lambda: D.zip(D.range(8), D.range(8)),
        lambda: D.zip(D.range(8), D.range(8), D.range(8)),
        r"its pipeline has 4 operations, the saved one had 3",
    ),
}


@pytest.mark.parametrize("name", list(MISMATCHES))
def test_restoring_into_another_pipeline_names_the_operation(name: str) -> None:
    saved_pipeline, other, message = MISMATCHES[name]
    saved = save_after(saved_pipeline, 1)
    iterator = iter(other())
    whole = list(other())
    head = [next(iterator) for _ in range(2)]
    with pytest.raises(td.errors.NotFoundError, match=message) as caught:
        iterator._checkpoint_restorer(saved.state)
    assert isinstance(caught.value, PipelineMismatchError) and isinstance(caught.value.path, tuple)
    assert "Restore into an iterator of the same pipeline" in str(caught.value)
    # the iterator is left as it was: usable, at its own position
    assert_same_elements(whole, head + list(iterator))


def test_a_mismatch_in_a_restored_child_names_the_path() -> None:
    # A child's saved op is checked too (here a position forged for another input).
    make = lambda: D.range(8).enumerate().batch(2)  # noqa: E731
    saved = save_after(make, 1)
    tree = state_codec.decode(saved.state)
    tree["position"]["cursor"]["inputs"]["0"]["op"] = "TakeDataset"
    with pytest.raises(
        td.errors.NotFoundError,
        match="at BatchDataset <- EnumerateDataset: the checkpoint holds the position of a TakeDataset there",
    ):
        iter(make())._checkpoint_restorer(state_codec.encode(tree))


def test_restoring_the_state_of_another_kind_of_object_fails() -> None:
    iterator = iter(D.range(3))
    with pytest.raises(
        td.errors.FailedPreconditionError, match="cannot restore a td.data iterator from the saved state of a variable"
    ):
        iterator._checkpoint_restorer(state_codec.encode({"kind": "variable"}))
    assert [int(v) for v in iterator] == [0, 1, 2]


def test_a_default_cycle_length_that_differs_on_restore_says_to_pass_it(monkeypatch: pytest.MonkeyPatch) -> None:
    make = lambda: D.range(10).interleave(lambda x: D.from_tensors(x).repeat(2))  # noqa: E731
    iterator = iter(make())
    next(iterator)
    state = iterator._checkpoint_state()
    monkeypatch.setattr(interleave, "default_cycle_length", lambda: 7)  # another machine
    with pytest.raises(td.errors.NotFoundError, match="cycle_length was not given, so it is the number of CPU cores"):
        iter(make())._checkpoint_restorer(state)


def test_a_damaged_interleave_position_is_a_data_loss_error() -> None:
    make = lambda: D.range(10).interleave(lambda x: D.from_tensors(x).repeat(3), cycle_length=2)  # noqa: E731
    iterator = iter(make())
    next(iterator)
    tree = state_codec.decode(iterator._checkpoint_state())
    tree["position"]["cursor"]["inputs"] = {
        key: child for key, child in tree["position"]["cursor"]["inputs"].items() if not key.startswith("made")
    }  # the open inputs' passes are gone, their records stay
    restored = iter(make())
    restored._checkpoint_restorer(state_codec.encode(tree))()
    with pytest.raises(td.errors.DataLossError, match="has an open input .* without its pass"):
        next(restored)
