"""Saving and restoring iterators of ``window``, ``group_by_window``, ``bucket_by_sequence_length``,
``sample_from_datasets``, ``choose_from_datasets``, ``padded_batch`` and ``rejection_resample``.

Every pipeline is saved after ``k`` elements (before the first, after one, in the middle, at
the boundaries of windows and groups, after an input ended, after the last, after the end),
restored into an iterator of a freshly built identical pipeline, and must yield exactly what
the saved iterator went on to yield. A few are restored in a new process (seeds drawn for a
process, and the datasets held in memory, are gone there).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

import towerdist as td

from iterator_checkpoint_helpers import (
    assert_same_elements,
    restored_rest,
    restored_rest_in_subprocess,
    save_after,
    take,
)

D = td.data.Dataset

pytestmark = pytest.mark.timeout(60)


def varlen(n: int = 60) -> td.data.Dataset:
    """Vectors of 1, 3, 0, 2, 5, 4, 1, ... elements (0, 1, 2, ...): varying lengths from checkpointable operations."""
    return D.range(n).batch(6).rebatch([1, 3, 0, 2, 5, 4])


def two_ranges() -> list[td.data.Dataset]:
    return [D.range(8), D.range(100, 108)]


def length(x: Any) -> np.int32:
    return np.int32(len(x))


class Case(NamedTuple):
    make: Callable[[], td.data.Dataset]
    positions: dict[str, int] = {}  # noqa: RUF012 - a NamedTuple default, never mutated
    random: bool = False  # unseeded: a new pipeline yields other elements


CASES: dict[str, Case] = {
    # --- window ---
    "window": Case(lambda: D.range(10).window(3)),
    "window_shift_stride": Case(
        lambda: D.range(20).window(4, shift=3, stride=2),
        # window k covers inputs 3k .. 3k + 6: after window 2, the buffer holds inputs 9..12
        {"window_boundary": 3},
    ),
    "window_shift_beyond_span": Case(
        lambda: D.range(25).window(2, shift=5),  # inputs 2-4, 7-9, ... are skipped
        {"while_skipping": 2},
    ),
    "window_drop_remainder": Case(lambda: D.range(11).window(4, shift=2, drop_remainder=True)),
    "window_partial_tail": Case(
        lambda: D.range(11).window(4, shift=2),
        # windows 0-3 are full; from window 4 on the input has ended and partial windows drain
        {"input_ended": 5},
    ),
    "window_of_tuples": Case(lambda: D.zip(D.range(10), D.range(10, 20).batch(1)).window(3, shift=2)),
    "window_of_dicts": Case(lambda: D.zip(datasets={"a": D.range(12), "b": varlen(40)}).window(4, drop_remainder=True)),
    "window_of_windows": Case(lambda: D.range(14).window(3).window(2, shift=1)),
    "windows_in_a_shuffle_buffer": Case(lambda: D.range(30).window(3).shuffle(4, seed=5)),
    # --- group_by_window ---
    "group_by_window": Case(
        lambda: D.range(30).group_by_window(lambda x: x % 3, lambda key, w: w.batch(2), window_size=4),
        # the first full window (key 0: 0, 3, 6, 9) gives 2 batches: after 1 the reduction is half
        # done, after 2 it is at its end; the input ends with keys 1 and 2 open (batches 12-15)
        {"mid_reduction": 1, "reduction_done": 2, "flushing": 13},
    ),
    "group_by_window_size_func": Case(
        lambda: D.range(40).group_by_window(
            lambda x: x % 3, lambda key, w: w.batch(2), window_size_func=lambda key: key + 2
        ),
        {"mid_reduction": 3},
    ),
    "group_by_window_of_tuples": Case(
        lambda: D.zip(D.range(24), D.range(24).batch(1)).group_by_window(
            lambda x, y: x % 2, lambda key, w: w.batch(3), window_size=5
        ),
        {"mid_reduction": 2},
    ),
    # --- bucket_by_sequence_length ---
    "bucket_padded": Case(lambda: varlen().bucket_by_sequence_length(length, [2, 4], [2, 3, 2])),
    "bucket_padded_shapes": Case(
        lambda: varlen().bucket_by_sequence_length(
            length, [2, 4], [2, 3, 2], padded_shapes=[6], padding_values=np.int64(-1)
        )
    ),
    "bucket_no_padding": Case(
        lambda: varlen().bucket_by_sequence_length(
            length, [1, 2, 3, 4, 5], [2, 3, 2, 2, 2, 2], no_padding=True, drop_remainder=True
        )
    ),
    "bucket_pad_to_boundary": Case(
        lambda: varlen().bucket_by_sequence_length(length, [2, 4, 7], [3, 4, 3, 2], pad_to_bucket_boundary=True),
        # the input ends with buckets 0 and 2 open: after the first of them is handed out
        {"flushing": 7},
    ),
    "bucket_drop_remainder": Case(
        lambda: varlen(90).bucket_by_sequence_length(length, [3], [3, 2], drop_remainder=True)
    ),
    # --- sample_from_datasets / choose_from_datasets ---
    "sample_seeded": Case(lambda: D.sample_from_datasets([D.range(20), D.range(100, 130)], [0.3, 0.7], seed=4)),
    "sample_unseeded": Case(lambda: D.sample_from_datasets([D.range(20), D.range(100, 130)]), random=True),
    "sample_one_input_exhausted": Case(
        # range(3) ends early: after its last element is drawn, the rest comes from the other input
        lambda: D.sample_from_datasets([D.range(3), D.range(100, 120), D.range(200, 220)], seed=1),
        {"input_exhausted": 12},
    ),
    "sample_stop_on_empty_dataset": Case(
        lambda: D.sample_from_datasets([D.range(6), D.range(100, 150)], seed=1, stop_on_empty_dataset=True)
    ),
    "sample_weights_dataset": Case(
        lambda: D.sample_from_datasets(
            [D.range(30), D.range(100, 130)],
            D.from_tensor_slices(np.array([[0.9, 0.1], [0.1, 0.9]] * 10)),
            seed=2,
        )
    ),
    "sample_rerandomized_epochs": Case(
        lambda: D.sample_from_datasets(two_ranges(), seed=3, rerandomize_each_iteration=True).repeat(3),
        {"second_epoch": 20},
    ),
    "sample_unseeded_rerandomized_epochs": Case(
        lambda: D.sample_from_datasets(two_ranges(), rerandomize_each_iteration=True).repeat(3),
        {"second_epoch": 20},
        random=True,
    ),
    "choose": Case(
        lambda: D.choose_from_datasets(
            [D.range(5), D.range(100, 130)],
            D.from_tensor_slices(np.array([0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1], np.int64)),
            stop_on_empty_dataset=False,
        ),
        # choice 6 takes the last element of range(5) (output 7); choice 7 picks it again: dropped
        {"last_of_an_input": 7, "input_exhausted": 8},
    ),
    "choose_stop_on_empty_dataset": Case(
        lambda: D.choose_from_datasets(
            [D.range(3), D.range(100, 130)], D.from_tensor_slices(np.array([1, 0, 1, 0, 0, 0, 1], np.int64))
        )
    ),
    # --- padded_batch ---
    "padded_batch": Case(lambda: varlen().padded_batch(3)),
    "padded_batch_shapes_values_drop": Case(
        lambda: varlen().padded_batch(4, padded_shapes=[6], padding_values=np.int64(-1), drop_remainder=True)
    ),
    "padded_batch_of_dicts": Case(
        lambda: D.zip(datasets={"x": varlen(), "n": D.range(100)}).padded_batch(
            2, padded_shapes={"x": [None], "n": []}, padding_values={"x": np.int64(7), "n": np.int64(0)}
        )
    ),
    # --- rejection_resample ---
    "rejection_resample_estimated": Case(
        lambda: D.range(200).rejection_resample(lambda x: x % 4 // 3, [0.5, 0.5], seed=1),
        {"second_estimate": 40},
    ),
    "rejection_resample_initial_dist": Case(
        lambda: D.range(200).rejection_resample(lambda x: x % 4 // 3, [0.5, 0.5], initial_dist=[0.75, 0.25], seed=1)
    ),
    "rejection_resample_rejection_only": Case(
        lambda: D.range(60).rejection_resample(lambda x: x % 4 // 3, [1.0, 0.0], initial_dist=[0.75, 0.25], seed=1)
    ),
    "rejection_resample_unseeded": Case(
        lambda: D.range(200).rejection_resample(lambda x: x % 4 // 3, [0.5, 0.5]), random=True
    ),
}

COMMON = {
    "start": lambda n: 0,
    "first": lambda n: 1,
    "middle": lambda n: n // 2,
    "last": lambda n: n - 1,
    "end": lambda n: n,  # every element taken, the end not yet seen
    "past_end": lambda n: n + 1,  # the end seen: the pass is over
}

POSITIONS = [(name, position) for name, case in CASES.items() for position in (*COMMON, *case.positions)]


def position_of(case: Case, position: str) -> int:
    if position in case.positions:
        return case.positions[position]
    return COMMON[position](len(list(case.make())))


@pytest.mark.parametrize(("name", "position"), POSITIONS)
def test_restored_iterator_yields_what_the_saved_one_yields_next(name: str, position: str) -> None:
    case = CASES[name]
    saved = save_after(case.make, position_of(case, position))
    assert_same_elements(saved.rest, restored_rest(case.make, saved.state))


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if not case.random])
def test_saving_does_not_change_what_the_iterator_yields(name: str) -> None:
    case = CASES[name]
    n = len(list(case.make()))
    saved = save_after(case.make, n // 2)
    assert_same_elements(list(case.make()), saved.head + saved.rest)


def test_a_reduction_in_progress_resumes_with_its_own_random_state() -> None:
    # Each dataset reduce_func makes here shuffles with a seed drawn for it, as in an
    # uninterrupted run, so only the reduction in progress has a determined continuation:
    # the restored one continues it from its saved generator.
    def make() -> td.data.Dataset:
        return D.range(30).group_by_window(lambda x: x % 2, lambda key, w: w.shuffle(8), window_size=6)

    saved = save_after(make, 3)  # 3 of the 6 elements of the first reduction
    assert_same_elements(saved.rest[:3], restored_rest(make, saved.state)[:3])


# --- in a new process -----------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))


def source_of(name: str) -> str:
    """Python code defining ``make()`` as ``CASES[name].make``, for a child process."""
    return (
        f"import sys\nsys.path.insert(0, {HERE!r})\nfrom test_checkpoint_windows import CASES\n"
        f"make = CASES[{name!r}].make\n"
    )


@pytest.mark.parametrize(
    ("name", "position"),
    [
        ("window_of_tuples", "middle"),
        ("group_by_window", "mid_reduction"),
        ("bucket_pad_to_boundary", "flushing"),
        ("sample_unseeded", "middle"),
        ("sample_unseeded_rerandomized_epochs", "second_epoch"),
        ("choose", "input_exhausted"),
        ("padded_batch_of_dicts", "first"),
        ("rejection_resample_unseeded", "middle"),
    ],
)
def test_restored_in_a_new_process(name: str, position: str) -> None:
    case = CASES[name]
    saved = save_after(case.make, position_of(case, position))
    assert_same_elements(saved.rest, restored_rest_in_subprocess(source_of(name), saved.state))


def test_a_new_process_draws_the_later_epochs_of_an_unseeded_sample_as_the_saved_run() -> None:
    # The saved run's seed and next epoch number come with the position: a restored run's third
    # epoch (a pass made after the restore) is the one the saved run made.
    saved = save_after(CASES["sample_unseeded_rerandomized_epochs"].make, 3)
    rest = restored_rest_in_subprocess(source_of("sample_unseeded_rerandomized_epochs"), saved.state)
    assert_same_elements(saved.rest, rest)
    assert len(rest) == 45


# --- restoring into another pipeline --------------------------------------------------------------

MISMATCHES = {
    "window": (lambda: D.range(10).window(3), lambda: D.range(10).window(3, shift=2), "WindowDataset"),
    "group_by_window": (
        lambda: D.range(30).group_by_window(lambda x: x % 3, lambda key, w: w.batch(2), window_size=4),
        lambda: D.range(30).group_by_window(lambda x: x % 3, lambda key, w: w.batch(2), window_size=5),
        "GroupByWindowDataset",
    ),
    "bucket_by_sequence_length": (
        lambda: varlen().bucket_by_sequence_length(length, [2, 4], [2, 3, 2]),
        lambda: varlen().bucket_by_sequence_length(length, [3], [2, 3]),
        "BucketBySequenceLengthDataset",
    ),
    "sample_from_datasets": (
        lambda: D.sample_from_datasets([D.range(5), D.range(10)], seed=1),
        lambda: D.sample_from_datasets([D.range(5), D.range(10), D.range(3)], seed=1),
        "SampleFromDatasets",
    ),
    "choose_from_datasets": (
        lambda: D.choose_from_datasets([D.range(5), D.range(9)], D.range(2).repeat(4)),
        lambda: D.range(8).batch(2),
        "ChooseFromDatasets",
    ),
    "padded_batch": (lambda: varlen().padded_batch(3), lambda: varlen().batch(1), "PaddedBatchDataset"),
    "rejection_resample": (
        lambda: D.range(50).rejection_resample(lambda x: x % 2, [0.5, 0.5], seed=1),
        lambda: D.range(50).rejection_resample(lambda x: x % 2, [0.5, 0.5], initial_dist=[0.5, 0.5], seed=1),
        "RejectionResampleDataset",
    ),
}


@pytest.mark.parametrize("op", list(MISMATCHES))
def test_restoring_into_another_pipeline_fails_naming_the_operation_and_changes_nothing(op: str) -> None:
    make, other, name = MISMATCHES[op]
    saved = save_after(make, 2)
    iterator = iter(other())
    head = take(iterator, 1)
    with pytest.raises(td.errors.NotFoundError, match=f"cannot restore the iterator.*{name}"):
        iterator._checkpoint_restorer(saved.state)
    assert_same_elements(list(other()), head + list(iterator))


def test_a_reduce_func_that_makes_another_dataset_fails_to_restore_naming_it() -> None:
    def make(reduce_func: Callable[[Any, td.data.Dataset], td.data.Dataset]) -> td.data.Dataset:
        return D.range(30).group_by_window(lambda x: x % 3, reduce_func, window_size=4)

    saved = save_after(lambda: make(lambda key, w: w.batch(2)), 1)  # in the middle of a reduction
    iterator = iter(make(lambda key, w: w.padded_batch(2)))
    with pytest.raises(td.errors.NotFoundError, match="GroupByWindowDataset <- PaddedBatchDataset"):
        iterator._checkpoint_restorer(saved.state)
    assert len(list(iterator)) == 15


def test_a_reduce_func_that_no_longer_returns_a_dataset_fails_to_restore_naming_the_operation() -> None:
    def make(reduce_func: Callable[[Any, td.data.Dataset], Any]) -> td.data.Dataset:
        return D.range(30).group_by_window(lambda x: x % 3, reduce_func, window_size=4)

    saved = save_after(lambda: make(lambda key, w: w.batch(2)), 1)  # in the middle of a reduction
    iterator = iter(make(lambda key, w: 0))
    with pytest.raises(TypeError, match=r"Dataset.group_by_window\(\) reduce_func must return a single td.data.Dataset"):
        iterator._checkpoint_restorer(saved.state)
