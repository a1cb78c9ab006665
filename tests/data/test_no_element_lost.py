"""An input pipeline never loses an element it read before an error.

Every element read before the failing one is delivered: before the error where the operation
keeps order; a shuffle buffer drains after the error where the iterator reads the shuffle itself
(TensorFlow's order), before it where another operation reads the shuffle (whose pass ends at the error).
The pass then ends: later calls report the end of the data (TensorFlow reads on after the error
where its input can; ``docs/concepts.md`` lists these differences).

The goldens were observed with TensorFlow 2.21 (CPU, eager) on the same pipelines, the failing
input being ``tf.data.Dataset.from_generator`` over a generator raising ``ValueError`` at element
``k`` (the ``# TF 2.21:`` comments); a case whose towerdist value differs says why. A property test
at the end runs random pipelines of these operations over a failing input.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.data.iterator_checkpoint_helpers import take

import towerdist as td

ERR, END = "ERR", "END"
N = 8  # the elements the failing input would have without its error


class Broken(ValueError):
    """The input's error (a type of its own, so that a test sees it is this one that surfaced)."""


# A generator's ValueError surfaces as TensorFlow's InvalidArgumentError, the original as its cause.
INPUT_ERRORS = (Broken, td.errors.InvalidArgumentError)


def is_input_error(error: BaseException) -> bool:
    return isinstance(error, Broken) or isinstance(error.__cause__, Broken)


def failing(k: int, n: int = N) -> td.data.Dataset:
    """``from_generator`` over ``0, 1, ..., n - 1``, raising ``Broken`` at element ``k``."""

    def gen():
        for i in range(n):
            if i == k:
                raise Broken(f"record {i} is corrupt")
            yield i

    return td.data.Dataset.from_generator(gen, output_signature=td.TensorSpec((), td.int64))


def failing_map(k: int, n: int = N) -> td.data.Dataset:
    """``range(n).map(parse)`` whose ``parse`` raises ``Broken`` at element ``k`` (a pipeline that can be saved)."""

    def parse(x):
        if int(x) == k:
            raise Broken(f"record {int(x)} is corrupt")
        return x

    return td.data.Dataset.range(n).map(parse)


def outcome(dataset: Any, limit: int = 30) -> list[Any]:
    """What successive ``next()`` calls give: each element as a list or int, ``ERR``, ``END``."""
    out: list[Any] = []
    iterator = iter(dataset)
    for _ in range(limit):
        try:
            out.append(np.asarray(next(iterator)).tolist())
        except StopIteration:
            out.append(END)
            break
        except INPUT_ERRORS as error:
            assert is_input_error(error), error
            out.append(ERR)
    return out


# --- parallel map ------------------------------------------------------------------------------


@pytest.mark.parametrize("calls", [2, 4, td.data.AUTOTUNE], ids=["2", "4", "autotune"])
def test_parallel_map_delivers_every_element_before_an_input_error(calls):
    # TF 2.21: [0, 1, 2, 3, ERR, END] for num_parallel_calls 2 and 4 (the generator has ended).
    assert outcome(failing(4).map(lambda x: x * 1, num_parallel_calls=calls)) == [0, 1, 2, 3, ERR, END]


def test_parallel_map_over_a_failing_map_ends_the_pass_after_the_error():
    # TF 2.21: [0, 1, 2, 3, ERR, 5, 6, 7, END]: TensorFlow reads on after the error; towerdist's
    # pass ends there (docs/concepts.md).
    assert outcome(failing_map(4).map(lambda x: x * 1, num_parallel_calls=2)) == [0, 1, 2, 3, ERR, END]


@pytest.mark.parametrize("restored_calls", [4, None], ids=["parallel", "sequential"])
def test_parallel_map_restored_between_reading_the_error_and_raising_it_raises_it(restored_calls):
    # After the first element the window holds the results of 1, 2, 3 and the input's error.
    iterator = iter(failing_map(4).map(lambda x: x * 1, num_parallel_calls=4))
    assert take(iterator, 1) == [0]
    state = iterator._checkpoint_state()
    restored = iter(failing_map(4).map(lambda x: x * 1, num_parallel_calls=restored_calls))
    restored._checkpoint_restorer(state)()
    assert outcome(restored) == [1, 2, 3, ERR, END]


# --- shuffle -----------------------------------------------------------------------------------


def test_shuffle_of_one_reads_no_further_than_tensorflow():
    # TF 2.21: [0, 1, 2, ERR, END]: the buffer is filled to its size before each element, so the
    # error comes after element 2 (reading ahead one more element would raise it before 2).
    assert outcome(failing(3).shuffle(1)) == [0, 1, 2, ERR, END]


@pytest.mark.parametrize(("buffer_size", "before"), [(2, 2), (3, 1), (10, 0)])
def test_shuffle_raises_as_tensorflow_then_drains_its_buffer(buffer_size, before):
    # TF 2.21 (seed=1): shuffle(2) [0, 2, ERR, 1, END], shuffle(3) [1, ERR, 2, 0, END], shuffle(10)
    # [ERR, 1, 2, 0, END]: the error comes when the buffer cannot be filled, then the buffer drains.
    out = outcome(failing(3).shuffle(buffer_size, seed=1))
    assert out[before] == ERR and out[-1] == END, out
    assert sorted(out[:before] + out[before + 1 : -1]) == [0, 1, 2]


@pytest.mark.parametrize("buffer_size", [2, 3, 10])
def test_a_shuffle_read_by_another_operation_drains_its_buffer_before_the_error(buffer_size):
    # The map after it ends at an error: the buffer comes first, so nothing read is lost (docs/input.md).
    out = outcome(failing(3).shuffle(buffer_size, seed=1).map(lambda x: x))
    assert sorted(out[:3]) == [0, 1, 2]
    assert out[3:] == [ERR, END]


def test_shuffle_reads_the_buffer_size_ahead_before_its_first_element():
    read: list[int] = []

    def gen():
        for i in range(10):
            read.append(i)
            yield i

    iterator = iter(td.data.Dataset.from_generator(gen, output_signature=td.TensorSpec((), td.int64)).shuffle(3))
    next(iterator)
    assert read == [0, 1, 2]


def test_shuffle_restored_while_draining_raises_the_error_after_the_buffer():
    # (read by a map, the shuffle drains before raising; a position saved meanwhile keeps the error)
    make = lambda: failing_map(3).shuffle(3, seed=1).map(lambda x: x)  # noqa: E731
    iterator = iter(make())
    head = take(iterator, 1)
    state = iterator._checkpoint_state()
    rest = outcome(iterator)
    restored = iter(make())
    restored._checkpoint_restorer(state)()
    assert outcome(restored) == rest
    assert sorted(head + rest[:2]) == [0, 1, 2]
    assert rest[2:] == [ERR, END]


def test_a_shuffle_restored_after_its_error_drains_the_rest():
    make = lambda: failing_map(3).shuffle(3, seed=1)  # noqa: E731
    iterator = iter(make())
    out = outcome(iterator, limit=2)  # one element, then the error (TF: [1, ERR, 2, 0])
    assert out[1] == ERR, out
    state = iterator._checkpoint_state()
    rest = outcome(iterator)
    restored = iter(make())
    restored._checkpoint_restorer(state)()
    assert outcome(restored) == rest
    assert sorted([out[0], *rest[:-1]]) == [0, 1, 2] and rest[-1] == END


# --- ordered operations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "build", "expected"),
    [
        # TF 2.21: [0, 1, 2, 3, ERR, END]
        ("prefetch", lambda: failing(4).prefetch(2), [0, 1, 2, 3, ERR, END]),
        # TF 2.21: [[0, 1, 2], ERR, END]: TensorFlow drops the 3 it read; towerdist delivers it as a short batch.
        ("batch", lambda: failing(4).batch(3), [[0, 1, 2], [3], ERR, END]),
        # TF 2.21: [[0, 1, 2], ERR, END] (as at the end: drop_remainder drops the short batch)
        ("batch_drop_remainder", lambda: failing(4).batch(3, drop_remainder=True), [[0, 1, 2], ERR, END]),
        # TF 2.21: [[0, 1, 2], ERR, END] (as batch)
        ("batch_parallel", lambda: failing(4).batch(3, num_parallel_calls=2), [[0, 1, 2], [3], ERR, END]),
        # TF 2.21: [[0, 1, 2], ERR, END] (as batch)
        ("padded_batch", lambda: failing(4).padded_batch(3, padded_shapes=[]), [[0, 1, 2], [3], ERR, END]),
        # TF 2.21: [[0, 1, 2], ERR, END] (as batch: its batch drops [4])
        ("rebatch", lambda: failing(5).batch(2).rebatch(3), [[0, 1, 2], [3, 4], ERR, END]),
        # TF 2.21: [[0, 1], [2, 3], ERR, END] (its batch(4) drops [4])
        ("rebatch_smaller", lambda: failing(5).batch(4).rebatch(2), [[0, 1], [2, 3], [4], ERR, END]),
        # TF 2.21: [0, 1, ERR, END] (its batch drops [2])
        ("unbatch", lambda: failing(3).batch(2).unbatch(), [0, 1, 2, ERR, END]),
        # TF 2.21: [0, 2, ERR, END]
        ("filter", lambda: failing(4).filter(lambda x: x % 2 == 0), [0, 2, ERR, END]),
        # TF 2.21: [0, 1, 2, 3, ERR, END]
        ("take_while", lambda: failing(4).take_while(lambda x: x < 6), [0, 1, 2, 3, ERR, END]),
        # TF 2.21: [0, 1, 3, 6, ERR, END]
        ("scan", lambda: failing(4).scan(np.int64(0), lambda s, x: (s + x, s + x)), [0, 1, 3, 6, ERR, END]),
        # TF 2.21: [[0, 1, 2], ERR, END] (its batch drops 3)
        ("prefetch_batch", lambda: failing(4).prefetch(3).batch(3), [[0, 1, 2], [3], ERR, END]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_ordered_operation_delivers_what_it_read_before_an_input_error(name, build, expected):
    assert outcome(build()) == expected


@pytest.mark.parametrize(
    ("name", "build", "k"),
    [
        ("batch", lambda: failing_map(4).batch(3), 2),
        ("padded_batch", lambda: failing_map(4).padded_batch(3, padded_shapes=[]), 2),
        ("rebatch", lambda: failing_map(5).batch(2).rebatch(3), 2),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_batch_restored_after_its_short_batch_raises_the_input_error(name, build, k):
    iterator = iter(build())
    take(iterator, k)  # up to the short batch read before the error
    state = iterator._checkpoint_state()
    restored = iter(build())
    restored._checkpoint_restorer(state)()
    assert outcome(restored) == [ERR, END]


# --- random pipelines --------------------------------------------------------------------------

# Each operation: (name, keeps order, apply). Batching ops are followed by unbatch, so that every
# stage gives scalars and the elements can be compared one by one.
OPERATIONS: list[tuple[str, bool, Any]] = [
    ("map", True, lambda d: d.map(lambda x: x * 1)),
    ("map_parallel", True, lambda d: d.map(lambda x: x * 1, num_parallel_calls=3)),
    ("prefetch", True, lambda d: d.prefetch(2)),
    ("batch", True, lambda d: d.batch(3).unbatch()),
    ("padded_batch", True, lambda d: d.padded_batch(2, padded_shapes=[]).unbatch()),
    ("rebatch", True, lambda d: d.batch(2).rebatch([3, 1]).unbatch()),
    ("filter_all", True, lambda d: d.filter(lambda x: x >= 0)),
    ("take_while_all", True, lambda d: d.take_while(lambda x: x >= 0)),
    ("shuffle", False, lambda d: d.shuffle(3)),
    ("shuffle_unknown", False, lambda d: d.shuffle(td.data.UNKNOWN_CARDINALITY)),
]


@settings(max_examples=50, deadline=None)
@given(
    k=st.integers(min_value=0, max_value=12),
    chain=st.lists(st.sampled_from(range(len(OPERATIONS))), min_size=1, max_size=5),
    source=st.sampled_from([failing, failing_map]),
)
def test_random_pipeline_delivers_every_element_before_the_error_then_raises_it_once(k, chain, source):
    dataset = source(k, n=k + 3)
    ordered = True
    for index in chain:
        _, keeps_order, apply = OPERATIONS[index]
        dataset = apply(dataset)
        ordered = ordered and keeps_order
    out = outcome(dataset, limit=k + 10)
    assert out.count(ERR) == 1, out
    assert out[-1] == END, out
    if not OPERATIONS[chain[-1]][0].startswith("shuffle"):  # (a last shuffle raises, then drains: TF's order)
        assert out[-2] == ERR, out  # the pass ends at the error; a shuffle inside drains before it
    delivered = [value for value in out if value not in (ERR, END)]
    if ordered:
        assert delivered == list(range(k)), out
    else:
        assert collections.Counter(delivered) == collections.Counter(range(k)), out
