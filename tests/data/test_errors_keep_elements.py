"""An input error loses no element read before it: interleave, windows, sampling, cache (DESIGN §10.23).

Each pipeline's input fails at one element (a ``from_generator`` whose generator raises: its
pass then ends, as towerdist's ``map`` and ``from_generator`` passes do). The goldens are
TensorFlow 2.21's outputs of the same programs (marked "TF 2.21: ..."), ``"E"`` standing for
the error. The iterator is read on after an error: operations that hold elements deliver them
after it, as TensorFlow does.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import towerdist as td

D = td.data.Dataset
E = "E"  # where the error comes out
END = "END"


class Bad(ValueError):
    pass


def failing_source(n: int, fail_at: int) -> D:
    """``0 .. n-1`` from a generator that raises instead of yielding ``fail_at`` (its pass then ends)."""

    def generate():
        for i in range(n):
            if i == fail_at:
                raise Bad(f"cannot read element {i}")
            yield np.int64(i)

    return D.from_generator(generate, output_signature=td.TensorSpec((), td.int64))


def failed_here(error: BaseException | None) -> bool:
    """Whether ``error`` is the injected failure (``from_generator`` raises TensorFlow's
    ``InvalidArgumentError`` with the generator's exception as its cause)."""
    while error is not None:
        if isinstance(error, Bad):
            return True
        error = error.__cause__
    return False


def plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return np.asarray(value).tolist()


def outputs(dataset: D, limit: int = 60) -> list[Any]:
    """Every element and error of one pass, reading on after each error, then ``END``."""
    out: list[Any] = []
    iterator = iter(dataset)
    try:
        for _ in range(limit):
            try:
                out.append(plain(next(iterator)))
            except StopIteration:
                out.append(END)
                break
            except Exception as error:
                if not failed_here(error):
                    raise
                out.append(E)
    finally:
        iterator.close()
    return out


def tens(x: Any) -> D:
    return D.range(3).map(lambda y: 10 * x + y)


# --- interleave ------------------------------------------------------------------------------

INTERLEAVE = [
    pytest.param({}, id="sequential"),
    pytest.param({"num_parallel_calls": 2}, id="parallel"),
    pytest.param({"num_parallel_calls": 2, "deterministic": True}, id="parallel-deterministic"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", INTERLEAVE)
def test_interleave_input_error_keeps_the_open_inputs(kwargs):
    ds = failing_source(5, 3).interleave(tens, cycle_length=2, **kwargs)
    # TF 2.21 (with and without num_parallel_calls): [0, 10, 1, 11, 2, 12, 20, error, 21, 22]
    assert outputs(ds) == [0, 10, 1, 11, 2, 12, 20, E, 21, 22, END]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", INTERLEAVE)
def test_interleave_input_error_with_blocks_of_two(kwargs):
    ds = failing_source(5, 3).interleave(tens, cycle_length=2, block_length=2, **kwargs)
    # TF 2.21 (with and without num_parallel_calls): [0, 1, 10, 11, 2, 12, 20, 21, error, 22]
    assert outputs(ds) == [0, 1, 10, 11, 2, 12, 20, 21, E, 22, END]


@pytest.mark.timeout(60)
def test_interleave_input_error_nondeterministic_delivers_every_element():
    ds = failing_source(5, 3).interleave(tens, cycle_length=2, num_parallel_calls=2, deterministic=False)
    got = outputs(ds)
    # TF 2.21 (one run): [0, 10, 1, 11, 2, 20, 12, 21, 22, error]: the same elements, in any order
    assert got.count(E) == 1 and got[-1] == END
    assert sorted(v for v in got if v not in (E, END)) == [0, 1, 2, 10, 11, 12, 20, 21, 22]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", INTERLEAVE)
@pytest.mark.parametrize(
    ("fail_at", "expected"),
    [
        (0, [E, END]),  # TF 2.21: [error]
        (4, [0, 10, 1, 11, 2, 12, 20, 30, 21, 31, 22, 32, E, END]),  # TF 2.21: the same
    ],
    ids=["first", "last"],
)
def test_interleave_input_error_at_the_first_and_last_input(kwargs, fail_at, expected):
    ds = failing_source(5, fail_at).interleave(tens, cycle_length=2, **kwargs)
    assert outputs(ds) == expected


def map_func_failing_at_3(x: Any) -> D:
    if int(x) == 3:
        raise Bad("no dataset for 3")
    return D.range(x * 10, x * 10 + 3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # TF 2.21: [0, 1, 10, 11, 2, 12, 20, 21, error, 40, 41, 22, 42, 50, 51, 52]
        pytest.param({}, [0, 1, 10, 11, 2, 12, 20, 21, E, 40, 41, 22, 42, 50, 51, 52, END], id="sequential"),
        # TF 2.21: [0, 1, 10, 11, 2, 12, 20, 21, error, 22, 40, 41, 50, 51, 42, 52] (the error is
        # its slot's element, so the slot's next input waits for the next turn)
        pytest.param(
            {"num_parallel_calls": 2}, [0, 1, 10, 11, 2, 12, 20, 21, E, 22, 40, 41, 50, 51, 42, 52, END], id="parallel"
        ),
    ],
)
def test_interleave_map_func_error_goes_on_with_the_next_inputs(kwargs, expected):
    ds = D.range(6).interleave(map_func_failing_at_3, cycle_length=2, block_length=2, **kwargs)
    assert outputs(ds) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # TF 2.21 (a from_generator input failing at its element 1): [0, 10, 1, error, 2, 20, 21, 30, 22, 31, 32]
        pytest.param({}, [0, 10, 1, E, 2, 20, 21, 30, 22, 31, 32, END], id="sequential"),
        # TF 2.21: [0, 10, 1, error, 2, 20, 30, 21, 31, 22, 32]
        pytest.param({"num_parallel_calls": 2}, [0, 10, 1, E, 2, 20, 30, 21, 31, 22, 32, END], id="parallel"),
    ],
)
def test_interleave_error_of_an_open_input_keeps_the_others(kwargs, expected):
    def inner(x: Any) -> D:
        return failing_source(3, 1).map(lambda y: 10 * x + y) if int(x) == 1 else tens(x)

    assert outputs(D.range(4).interleave(inner, cycle_length=2, **kwargs)) == expected


# --- group_by_window, bucket_by_sequence_length ------------------------------------------------


def batch_of_ten(key: Any, window: D) -> D:
    return window.batch(10)


@pytest.mark.parametrize(
    ("fail_at", "window_size", "expected"),
    [
        # TF 2.21: [error, [0, 2, 4], [1, 3]]: the open windows come after the error
        (5, 10, [E, [0, 2, 4], [1, 3], END]),
        # TF 2.21: [[0, 2], [1, 3], error, [4]]
        (5, 2, [[0, 2], [1, 3], E, [4], END]),
        # TF 2.21: [error]
        (0, 10, [E, END]),
        # TF 2.21 (the last element fails): [error, [0, 2, 4], [1, 3, 5]]
        (6, 10, [E, [0, 2, 4], [1, 3, 5], END]),
    ],
    ids=["mid-window", "full-windows-first", "first", "last"],
)
def test_group_by_window_keeps_its_windows_after_an_input_error(fail_at, window_size, expected):
    ds = failing_source(7, fail_at).group_by_window(lambda x: x % 2, batch_of_ten, window_size=window_size)
    assert outputs(ds) == expected


def test_group_by_window_key_error_keeps_the_windows():
    def key(x: Any) -> Any:
        if int(x) == 3:
            raise Bad("no key for 3")
        return x % 2

    # TF 2.21 (key_func failing at 3 with py_function): [error, [0, 2, 4, 6], [1, 5]]
    assert outputs(D.range(7).group_by_window(key, batch_of_ten, window_size=10)) == [E, [0, 2, 4, 6], [1, 5], END]


def test_bucket_by_sequence_length_keeps_its_buckets_after_an_input_error():
    ds = failing_source(7, 5).map(lambda x: np.full([int(x) % 3 + 1], x)).bucket_by_sequence_length(
        lambda x: np.int32(np.shape(x)[0]), [2, 3], [10, 10, 10]
    )
    # TF 2.21: [error, [[0], [3]], [[1, 1], [4, 4]], [[2, 2, 2]]]
    assert outputs(ds) == [E, [[0], [3]], [[1, 1], [4, 4]], [[2, 2, 2]], END]


def test_group_by_window_saved_after_an_error_restores_its_windows(tmp_path):
    def fail_at_5(x: Any) -> Any:
        if int(x) == 5:
            raise Bad("cannot read element 5")
        return x

    ds = D.range(7).map(fail_at_5).group_by_window(lambda x: x % 2, batch_of_ten, window_size=10)
    iterator = iter(ds)
    with pytest.raises(Bad):
        next(iterator)
    path = td.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
    assert [plain(w) for w in iterator] == [[0, 2, 4], [1, 3]]
    restored = iter(ds)
    td.train.Checkpoint(iterator=restored).restore(path)
    # The restored map goes on after the element that failed (TensorFlow's map rule; TF 2.21 with
    # a map failing at 5: [error, [0, 2, 4, 6], [1, 3]]): the windows read before the error are kept.
    assert [plain(w) for w in restored] == [[0, 2, 4, 6], [1, 3]]


# --- window ----------------------------------------------------------------------------------


def windows(dataset: D) -> D:
    return dataset.flat_map(lambda w: w.batch(10))


@pytest.mark.parametrize(
    ("kwargs", "expected", "tf"),
    [
        ({"size": 3}, [[0, 1, 2], [3, 4], E, END], "[[0, 1, 2], error]"),
        (
            {"size": 3, "shift": 1},
            [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4], [4], E, END],
            "[[0, 1, 2], [1, 2, 3], [2, 3, 4], error, error, error]",
        ),
        ({"size": 3, "shift": 2}, [[0, 1, 2], [2, 3, 4], [4], E, END], "[[0, 1, 2], [2, 3, 4], error]"),
        ({"size": 2, "drop_remainder": True}, [[0, 1], [2, 3], E, END], "[[0, 1], [2, 3], error]"),
    ],
    ids=["tumbling", "sliding", "shift2", "drop_remainder"],
)
def test_window_delivers_the_partial_windows_before_an_input_error(kwargs, expected, tf):
    # TF 2.21 drops the windows being filled (the elements 3 and 4 are lost): `tf`. towerdist hands
    # them out as the input's last, partial windows (unless drop_remainder), then the error.
    assert outputs(windows(failing_source(7, 5).window(**kwargs))) == expected


def test_window_error_at_the_first_element():
    # TF 2.21: [error]
    assert outputs(windows(failing_source(7, 0).window(3))) == [E, END]


# --- operations that hold no element: the error in order, then the pass ends -----------------


def test_zip_delivers_the_pairs_before_the_error():
    # TF 2.21: [(0, 10), (1, 11), error]
    assert outputs(D.zip((failing_source(4, 2), D.range(10, 14)))) == [(0, 10), (1, 11), E, END]


def test_concatenate_delivers_the_first_inputs_elements_before_the_error():
    # TF 2.21: [0, 1, error, 10, 11] (its pass goes on with the second input); towerdist's pass
    # ends at the error: concatenate holds no element, so none read before the error is lost.
    assert outputs(failing_source(4, 2).concatenate(D.range(10, 12))) == [0, 1, E, END]


def test_choose_from_datasets_delivers_the_elements_before_the_error():
    choice = D.from_tensor_slices(np.array([0, 1] * 4, np.int64))
    # TF 2.21: [0, 10, 1, 11, error, 12] (its pass goes on); towerdist's ends at the error.
    assert outputs(D.choose_from_datasets([failing_source(4, 2), D.range(10, 14)], choice)) == [0, 10, 1, 11, E, END]


@pytest.mark.parametrize("fail_at", [0, 2, 3])
def test_sample_from_datasets_delivers_the_elements_before_the_error(fail_at):
    got = outputs(D.sample_from_datasets([failing_source(4, fail_at), D.range(10, 14)], seed=1))
    # TF 2.21 (seed=1, failing at 2): [10, 0, 1, error, 11, 12, 13]: every element of the failing
    # input before the error comes before it (towerdist's pass then ends).
    assert got[-2:] == [E, END]
    assert [v for v in got if isinstance(v, int) and v < 10] == list(range(fail_at))


def test_rejection_resample_delivers_the_elements_before_the_error():
    ds = failing_source(8, 3).rejection_resample(
        lambda x: (x % 2).astype(np.int32), target_dist=[0.5, 0.5], initial_dist=[0.5, 0.5], seed=1
    )
    # TF 2.21: [(0, 0), (1, 1), (0, 2), error]
    assert outputs(ds) == [(0, 0), (1, 1), (0, 2), E, END]


# --- cache, save: a failed pass is never taken for the whole dataset ---------------------------


@pytest.mark.parametrize("to_file", [False, True], ids=["memory", "file"])
def test_cache_does_not_keep_a_pass_that_failed(tmp_path, to_file):
    ds = failing_source(5, 3).cache(str(tmp_path / "cache") if to_file else "")
    # TF 2.21, memory and file alike: [0, 1, 2, error], then a second pass [0, 1, 2]: TF finishes
    # the cache when the failed input ends, so every later epoch lacks 3 and 4 without an error.
    # towerdist keeps no failed pass: the next pass reads the input again.
    assert outputs(ds) == [0, 1, 2, E, END]
    assert outputs(ds) == [0, 1, 2, E, END]
    if to_file:
        assert os.listdir(tmp_path) == []


def test_save_of_a_failing_input_raises_and_keeps_the_earlier_save(tmp_path):
    D.range(3).save(str(tmp_path))
    # TF 2.21: Dataset.save() of a from_generator failing at 3 never returns (it hangs).
    with pytest.raises(td.errors.InvalidArgumentError) as info:
        failing_source(5, 3).save(str(tmp_path))
    assert failed_here(info.value)
    assert outputs(D.load(str(tmp_path))) == [0, 1, 2, END]


# --- an operation that goes on after an error, read by another operation ---------------------------


def _failing_source(k: int = 5):
    def gen():
        for i in range(10):
            if i == k:
                raise ValueError("record is corrupt")
            yield i

    return td.data.Dataset.from_generator(gen, output_signature=td.TensorSpec((), td.int64))


def _outcome(dataset, limit: int = 30):
    out, iterator = [], iter(dataset)
    for _ in range(limit):
        try:
            out.append(np.asarray(next(iterator)).tolist())
        except StopIteration:
            out.append("END")
            break
        except td.errors.InvalidArgumentError as error:
            assert isinstance(error.__cause__, ValueError), error  # the generator's own error, kept as the cause
            out.append("ERR")
    return out


def _grouped(dataset):
    return dataset.group_by_window(lambda x: x % 2, lambda key, window: window.batch(10), window_size=10)


@pytest.mark.parametrize(
    "after",
    [lambda d: d.map(lambda x: x), lambda d: d.prefetch(2), lambda d: d.batch(1).unbatch()],
    ids=["map", "prefetch", "batch_unbatch"],
)
def test_windows_held_at_an_error_reach_the_iterator_through_later_operations(after):
    # The last operation of the pipeline goes on after the error (TF's order: [ERR, [0, 2, 4], [1, 3]]);
    # one read by another operation (which ends at an error) delivers its windows first, then the
    # error: nothing read before the error is lost on the way up.
    assert _outcome(_grouped(_failing_source())) == ["ERR", [0, 2, 4], [1, 3], "END"]
    assert _outcome(after(_grouped(_failing_source()))) == [[0, 2, 4], [1, 3], "ERR", "END"]


def test_an_interleave_read_by_a_map_delivers_the_open_inputs_then_the_error():
    names = _failing_source(3)
    interleaved = names.interleave(lambda x: td.data.Dataset.range(3).map(lambda y: 10 * x + y), cycle_length=2)
    # TF 2.21 (interleave last): [0, 10, 1, 11, 2, 12, 20, ERR, 21, 22]
    assert _outcome(interleaved) == [0, 10, 1, 11, 2, 12, 20, "ERR", 21, 22, "END"]
    assert _outcome(interleaved.map(lambda x: x)) == [0, 10, 1, 11, 2, 12, 20, 21, 22, "ERR", "END"]


def test_a_position_saved_while_an_error_is_deferred_raises_it_once_restored():
    def make():
        def parse(x):
            if int(x) == 5:
                raise ValueError("record is corrupt")
            return x

        return _grouped(td.data.Dataset.range(10).map(parse)).map(lambda w: w)

    iterator = iter(make())
    first = np.asarray(next(iterator)).tolist()
    state = iterator._checkpoint_state()
    restored = iter(make())
    restored._checkpoint_restorer(state)()
    rest = []
    for _ in range(5):
        try:
            rest.append(np.asarray(next(restored)).tolist())
        except StopIteration:
            rest.append("END")
            break
        except ValueError:  # the map function's own error, saved with the position and raised again
            rest.append("ERR")
    assert [first, *rest] == [[0, 2, 4], [1, 3], "ERR", "END"]
