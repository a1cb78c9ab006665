"""Saving and restoring iterators of the operations that run user code or threads: ``map``
(sequential and parallel), ``filter``, ``prefetch``, ``interleave`` (sequential and parallel)
and ``flat_map``.

Each pipeline is saved after ``k`` elements (the start, the first element, the middle, a
block or cycle boundary, the last element, the end) and restored into an iterator of a
freshly built identical pipeline, in this process and (a few) in a new one; the restored
iterator must yield exactly what the saved one went on to yield. Then: saves taken while
threads are busy or blocked in user code, errors buffered by threads, the ``ignore_errors``
copies of these operations, and restores into a different pipeline.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import numpy as np
import pytest

import towerdist as td
from towerdist._src import nest
from towerdist._src.data import prefetch as prefetch_lib
from towerdist._src.data import saved_errors, state_codec, workers
from towerdist._src.data.node import tolerant

from iterator_checkpoint_helpers import (
    assert_same_elements,
    restored_rest,
    restored_rest_in_subprocess,
    save_after,
    take,
)

pytestmark = pytest.mark.timeout(60)

D = td.data.Dataset
PREFIXES = ("towerdist-map", "towerdist-prefetch", "towerdist-interleave", "towerdist-flat_map")

# Each pipeline is Python source defining make(), run here and in the subprocess tests.
PRELUDE = """
import time
import numpy as np
import towerdist as td
D = td.data.Dataset

def pair(x):
    return x * 2, np.float32(x) / 2

def uneven(x):
    time.sleep(0.002 * int(x % 3 == 0))  # some calls finish after later ones
    return {"x": x, "y": np.full((2,), x, np.int32)}

def inner(x):  # input x: x % 4 + 1 elements
    return D.range(x % 4 + 1).map(lambda y: 100 * x + y)
"""

PIPELINES = {
    "map": "D.range(12).map(pair)",
    "map-parallel": "D.range(12).map(uneven, num_parallel_calls=3)",
    "map-parallel-nondeterministic": "D.range(12).map(pair, num_parallel_calls=4, deterministic=False)",
    "map-of-batches": "D.range(20).batch(3).map(lambda b: b + 1, num_parallel_calls=2)",
    "filter": "D.range(20).filter(lambda x: x % 3 != 1)",
    "filter-then-parallel-map": "D.range(20).filter(lambda x: x % 2 == 0).map(pair, num_parallel_calls=2)",
    "prefetch": "D.range(12).map(pair).prefetch(3)",
    "prefetch-autotune-batches": "D.range(20).batch(4).prefetch(td.data.AUTOTUNE)",
    "prefetch-0": "D.range(10).prefetch(0)",
    "prefetch-of-shuffle": "D.range(30).shuffle(8, seed=3).prefetch(5)",
    "interleave": "D.range(7).interleave(inner, cycle_length=3, block_length=2)",
    "interleave-cycle-2": "D.range(6).interleave(inner, cycle_length=2)",
    "flat_map": "D.range(6).flat_map(inner)",
    "interleave-parallel": "D.range(7).interleave(inner, cycle_length=3, block_length=2, num_parallel_calls=3)",
    "interleave-parallel-2-of-3": "D.range(8).interleave(inner, cycle_length=3, num_parallel_calls=2)",
    "interleave-autotune": "D.range(6).interleave(inner, cycle_length=2, num_parallel_calls=td.data.AUTOTUNE)",
    "interleave-of-prefetch": (
        "D.range(6).interleave(lambda x: inner(x).prefetch(2), cycle_length=2, block_length=3, num_parallel_calls=2)"
    ),
    "prefetch-of-interleave": "D.range(6).interleave(inner, cycle_length=3, num_parallel_calls=3).prefetch(4)",
    "repeated-prefetch-of-map": "D.range(5).map(uneven, num_parallel_calls=2).prefetch(2).repeat(2)",
}

# Positions beyond 0, 1, the middle, the last element and the end: block and cycle boundaries.
BOUNDARIES = {
    "interleave": [2, 6],  # the first block; the first full cycle
    "interleave-cycle-2": [2, 3],
    "flat_map": [1, 3],  # the first input's end; the second's
    "interleave-parallel": [2, 6],
    "interleave-parallel-2-of-3": [3],
    "map-of-batches": [6],  # the last batch (short)
    "repeated-prefetch-of-map": [5],  # the end of the first pass
}

NONDETERMINISTIC = {"map-parallel-nondeterministic"}


def source_of(name: str) -> str:
    return PRELUDE + f"\ndef make():\n    return {PIPELINES[name]}\n"


def maker(name: str):
    namespace: dict[str, object] = {}
    exec(source_of(name), namespace)
    return namespace["make"]


def positions(name: str) -> list[tuple[str, int]]:
    n = len(list(maker(name)()))
    named = {"start": 0, "first": 1, "middle": n // 2, "last": n - 1, "end": n, "after-end": n + 1}
    named.update({f"boundary-{k}": k for k in BOUNDARIES.get(name, [])})
    return list(named.items())


CASES = [pytest.param(name, k, id=f"{name}-{where}") for name in PIPELINES for where, k in positions(name)]


def key(element) -> tuple:
    return tuple(np.asarray(leaf).tobytes() for leaf in nest.flatten(element)[0])


def assert_same_multiset(expected: list, actual: list) -> None:
    assert sorted(map(key, actual)) == sorted(map(key, expected))


def named_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(PREFIXES)}


def assert_threads_gone(before: set[threading.Thread], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    for thread in named_threads() - before:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in named_threads() - before if t.is_alive()]
    assert alive == [], f"threads still alive: {alive}"


# --- every operation, saved at every position ------------------------------------------------


@pytest.mark.parametrize("name, k", CASES)
def test_restored_iterator_yields_what_the_saved_one_went_on_to_yield(name, k):
    make = maker(name)
    saved = save_after(make, k)
    rest = restored_rest(make, saved.state)
    if name in NONDETERMINISTIC:
        assert_same_multiset(saved.rest, rest)
    else:
        assert_same_elements(saved.rest, rest)


@pytest.mark.parametrize("name", ["map-parallel", "prefetch-of-shuffle", "interleave", "interleave-of-prefetch"])
def test_restored_in_a_new_process(name):
    make = maker(name)
    saved = save_after(make, 5)
    assert_same_elements(saved.rest, restored_rest_in_subprocess(source_of(name), saved.state))


def test_a_restored_iterator_can_be_saved_and_restored_again():
    make = maker("interleave-parallel")
    first = save_after(make, 3)
    iterator = iter(make())
    iterator._checkpoint_restorer(first.state)()
    head = take(iterator, 4)
    again = iterator._checkpoint_state()
    assert_same_elements(first.rest[4:], restored_rest(make, again))
    assert_same_elements(first.rest, head + list(iterator))


def test_saving_a_restored_iterator_before_its_next_element_saves_the_restored_position():
    make = maker("prefetch-of-interleave")
    first = save_after(make, 4)
    iterator = iter(make())
    iterator._checkpoint_restorer(first.state)()
    assert_same_elements(first.rest, restored_rest(make, iterator._checkpoint_state()))


@pytest.mark.parametrize(
    "saved_as, restored_as",
    [
        pytest.param("num_parallel_calls=3", "", id="parallel-into-sequential"),
        pytest.param("", "num_parallel_calls=3", id="sequential-into-parallel"),
        pytest.param("num_parallel_calls=4", "num_parallel_calls=2", id="4-threads-into-2"),
    ],
)
def test_a_map_restores_into_another_number_of_threads(saved_as, restored_as):
    # num_parallel_calls=AUTOTUNE is one thread on one core, several on more: a position
    # saved on one machine restores on the other.
    saved = save_after(lambda: D.range(15).map(lambda x: x + 1, **_kwargs(saved_as)), 5)
    rest = restored_rest(lambda: D.range(15).map(lambda x: x + 1, **_kwargs(restored_as)), saved.state)
    assert_same_elements(saved.rest, rest)


@pytest.mark.parametrize("saved_size, restored_size", [(3, 0), (0, 3), (6, 1), (1, 6)])
def test_a_prefetch_restores_into_another_buffer_size(saved_size, restored_size):
    saved = save_after(lambda: D.range(12).map(lambda x: x * 3).prefetch(saved_size), 4)
    rest = restored_rest(lambda: D.range(12).map(lambda x: x * 3).prefetch(restored_size), saved.state)
    assert_same_elements(saved.rest, rest)


def test_a_parallel_interleave_restores_into_another_block_length_and_order():
    # block_length and deterministic change the order from the restored position on, not what it means.
    saved = save_after(lambda: D.range(6).interleave(_inner, cycle_length=2, num_parallel_calls=2), 3)
    rest = restored_rest(
        lambda: D.range(6).interleave(_inner, cycle_length=2, block_length=3, num_parallel_calls=2, deterministic=False),
        saved.state,
    )
    assert_same_multiset(saved.rest, rest)


def _kwargs(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in (part.split("=") for part in text.split(",") if part)}


def _inner(x):
    return D.range(x % 4 + 1).map(lambda y: 100 * x + y)


# --- what is saved, and what a restore runs again --------------------------------------------


def test_a_restored_interleave_calls_map_func_again_only_for_its_open_inputs():
    calls: list[int] = []

    def make():
        def opened(x):
            calls.append(int(x))
            return _inner(x)

        return D.range(8).interleave(opened, cycle_length=3)

    # 0 100 200 101 201 300: input 0 ended; 1 gave its last element (the cycle has not come
    # back to find it ended); 2 and 3 are under way.
    saved = save_after(make, 6)
    calls.clear()
    iterator = iter(make())
    iterator._checkpoint_restorer(saved.state)()
    assert sorted(calls) == [1, 2, 3]  # made again while restoring, for their saved positions
    assert_same_elements(saved.rest, list(iterator))
    assert sorted(calls) == [1, 2, 3, 4, 5, 6, 7]


def test_a_parallel_map_saves_its_completed_results_and_maps_the_others_again():
    started = {k: threading.Event() for k in range(10)}
    release = threading.Event()
    calls: list[int] = []

    def slow_at_2(x):
        calls.append(int(x))
        started[int(x)].set()
        if int(x) == 2:
            assert release.wait(timeout=30)
        return x * 10

    iterator = iter(D.range(10).map(slow_at_2, num_parallel_calls=2))
    assert [int(v) for v in take(iterator, 2)] == [0, 10]  # calls 2..5 are now submitted; 2 is blocked
    assert started[4].wait(timeout=10)  # the other thread finished 3 (then took 4)
    start = time.monotonic()
    state = iterator._checkpoint_state()
    assert time.monotonic() - start < 2.0  # the save does not wait for the blocked call
    release.set()
    rest = list(iterator)
    calls.clear()
    restored = restored_rest(lambda: D.range(10).map(slow_at_2, num_parallel_calls=2), state)
    assert_same_elements(rest, restored)
    assert 2 in calls and 3 not in calls  # element 3's result was saved; element 2 was mapped again


def test_a_parallel_interleave_saves_an_input_whose_map_func_is_blocked_as_not_opened():
    release = threading.Event()
    entered = threading.Event()

    def open_slowly(x):
        if int(x) == 2:
            entered.set()
            assert release.wait(timeout=30)
        return _inner(x)

    def make():
        return D.range(5).interleave(open_slowly, cycle_length=2, num_parallel_calls=2)

    iterator = iter(make())
    head = take(iterator, 2)  # inputs 0 and 1 are open; 2 and 3 are being opened ahead
    assert entered.wait(timeout=10)
    start = time.monotonic()
    state = iterator._checkpoint_state()
    assert time.monotonic() - start < 2.0  # the save does not wait for map_func
    release.set()
    rest = list(iterator)
    assert_same_elements(rest, restored_rest(make, state))
    assert len(head) == 2


def test_a_saved_open_input_that_its_cycle_does_not_hold_is_a_data_loss_error():
    make = maker("interleave")
    tree = state_codec.decode(save_after(make, 3).state)
    fields = tree["position"]["cursor"]["fields"]
    fields["slots"] = [None] * len(fields["slots"])  # the open inputs' passes are still saved
    iterator = iter(make())
    with pytest.raises(td.errors.DataLossError, match="none of its saved inputs is that element"):
        iterator._checkpoint_restorer(state_codec.encode(tree))()


# --- saving while a thread is busy or blocked ----------------------------------------------


def _save_while_a_thread_is_in_user_code(build, taken, blocked_at, monkeypatch):
    """Saves after ``taken`` elements while a worker thread is inside ``gate`` (blocked until the save says it waits).

    ``build(gate)`` makes the pipeline; ``gate(i, y)`` blocks at element ``blocked_at`` (one the
    elements taken do not need), and a log handler releases it once the save reports that it
    waits for that thread: the save deterministically waits for an element being made.
    """
    monkeypatch.setattr(workers, "_SAVE_WARNING_SECONDS", 0.05)
    monkeypatch.setattr(workers, "SAVE_SECONDS", 30.0)
    entered, release = threading.Event(), threading.Event()
    warned: list[str] = []

    def gate(i, y):
        if (int(i), int(y)) == blocked_at:
            entered.set()
            assert release.wait(timeout=30)
        return 10 * i + y

    class ReleaseOnTheWarning(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Saving the iterator has waited" in record.getMessage():
                warned.append(record.getMessage())
                release.set()

    iterator = iter(build(gate))
    head = take(iterator, taken)
    assert entered.wait(timeout=10)  # a thread is making an element now
    handler = ReleaseOnTheWarning()
    logging.getLogger("towerdist").addHandler(handler)
    try:
        state = iterator._checkpoint_state()
    finally:
        logging.getLogger("towerdist").removeHandler(handler)
        release.set()
    assert warned, "the save did not wait for the thread making an element"
    plain = lambda: build(lambda i, y: 10 * i + y)  # noqa: E731
    rest = list(iterator)
    assert_same_elements(list(plain()), head + rest)
    assert_same_elements(rest, restored_rest(plain, state))


def test_a_save_waits_for_the_element_a_prefetch_thread_is_making(monkeypatch):
    # 3 taken, 3 buffered, 4 being made
    _save_while_a_thread_is_in_user_code(
        lambda gate: D.range(8).map(lambda x: gate(0, x)).prefetch(2), 3, (0, 4), monkeypatch
    )


def test_a_save_waits_for_the_elements_parallel_interleave_threads_are_making(monkeypatch):
    _save_while_a_thread_is_in_user_code(
        lambda gate: D.range(6).interleave(
            lambda x: D.range(3).map(lambda y: gate(x, y)), cycle_length=3, num_parallel_calls=3
        ),
        4,
        (1, 1),  # taken 0, 10, 20, 1; the thread of input 1 makes 11
        monkeypatch,
    )


# Each pipeline is given gate(i, y), called on element y of input i (0 for prefetch), and
# blocks in it at ``BLOCKED_AT`` once ``TAKEN`` elements were taken.
BLOCKED = {
    "prefetch": (
        "the Dataset.prefetch() thread",
        lambda gate: D.range(5).map(lambda y: gate(0, y)).prefetch(2),
        (0, 2),  # 0 taken, 1 buffered, 2 being made
        1,
    ),
    "interleave": (
        "the Dataset.interleave() thread reading the input made of element 1",
        lambda gate: D.range(3).interleave(
            lambda i: D.range(3).map(lambda y: gate(i, y)), cycle_length=2, num_parallel_calls=2
        ),
        (1, 1),  # (0, 0) and (1, 0) taken, (0, 1) buffered, (1, 1) being made
        2,
    ),
}


@pytest.mark.parametrize("op", sorted(BLOCKED))
def test_a_save_fails_after_a_bounded_wait_naming_a_thread_blocked_in_user_code(op, monkeypatch):
    monkeypatch.setattr(workers, "SAVE_SECONDS", 0.3)
    what, build, blocked_at, taken = BLOCKED[op]
    release, entered = threading.Event(), threading.Event()

    def gate(i, y):
        if (int(i), int(y)) == blocked_at:
            entered.set()
            assert release.wait(timeout=30)
        return 10 * i + y

    iterator = iter(build(gate))
    head = take(iterator, taken)
    assert entered.wait(timeout=10)
    expected = f"cannot save the iterator: it waited 0.3 s for {what} to finish the element it is making"
    with pytest.raises(td.errors.DeadlineExceededError, match=re.escape(expected)):
        iterator._checkpoint_state()
    release.set()
    state = iterator._checkpoint_state()  # the thread got past its element: saving works again
    rest = list(iterator)  # and the iterator went on, unchanged
    assert_same_elements(list(build(lambda i, y: 10 * i + y)), head + rest)
    assert_same_elements(rest, restored_rest(lambda: build(lambda i, y: 10 * i + y), state))


def test_a_save_that_waits_long_for_a_thread_says_so_in_the_log(monkeypatch, caplog):
    monkeypatch.setattr(workers, "_SAVE_WARNING_SECONDS", 0.1)
    monkeypatch.setattr(workers, "SAVE_SECONDS", 30.0)
    entered, release = threading.Event(), threading.Event()

    def slow_at_two(x):
        if int(x) == 2:
            entered.set()
            assert release.wait(timeout=30)
        return x

    class ReleaseOnTheWarning(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Saving the iterator has waited" in record.getMessage():
                release.set()  # the save said it waits: let the thread finish its element

    def make():
        return D.range(4).map(slow_at_two).prefetch(1)

    iterator = iter(make())
    head = take(iterator, 2)
    assert entered.wait(timeout=10)  # the thread is making element 2
    handler = ReleaseOnTheWarning()
    logging.getLogger("towerdist").addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING, logger="towerdist"):
            state = iterator._checkpoint_state()
    finally:
        logging.getLogger("towerdist").removeHandler(handler)
        release.set()
    assert "Saving the iterator has waited 0.1 s for the Dataset.prefetch() thread to finish" in caplog.text
    assert_same_elements(list(iterator), restored_rest(lambda: D.range(4).map(lambda x: x).prefetch(1), state))
    assert len(head) == 2


# --- errors buffered by threads --------------------------------------------------------------


class _Boom(ValueError):
    pass


def _failing_at(n: int, reached: threading.Event):
    def fn(x):
        if int(x) == n:
            reached.set()  # (a save waits for the thread's element: the error is buffered before it copies)
            raise _Boom(f"bad element {n}")
        return x

    return fn


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda fn: D.range(10).map(fn).prefetch(8), id="prefetch"),
        pytest.param(
            lambda fn: D.range(2).interleave(lambda i: D.range(5 * i, 5 * i + 5).map(fn), cycle_length=2,
                                             block_length=5, num_parallel_calls=2),
            id="interleave",
        ),
    ],
)
def test_an_error_a_thread_buffered_is_saved_and_raised_after_the_same_elements(build):
    reached = threading.Event()
    iterator = iter(build(_failing_at(3, reached)))
    head = take(iterator, 1)
    assert reached.wait(timeout=10)
    state = iterator._checkpoint_state()
    before_error = []
    with pytest.raises(_Boom, match="bad element 3"):
        for element in iterator:
            before_error.append(element)
    restored = iter(build(_failing_at(3, threading.Event())))
    restored._checkpoint_restorer(state)()
    got = []
    with pytest.raises(_Boom, match="bad element 3") as raised:
        for element in restored:
            got.append(element)
    assert_same_elements(before_error, got)
    assert any("restored with it" in note for note in raised.value.__notes__)
    assert len(head) == 1


def test_a_prefetch_error_restored_into_a_pass_without_a_thread_is_raised_after_the_same_elements():
    reached = threading.Event()
    iterator = iter(D.range(10).map(_failing_at(4, reached)).prefetch(8))
    head = take(iterator, 1)
    assert reached.wait(timeout=10)
    state = iterator._checkpoint_state()
    restored = iter(D.range(10).map(_failing_at(4, threading.Event())).prefetch(0))
    restored._checkpoint_restorer(state)()
    assert [int(v) for v in take(restored, 3)] == [1, 2, 3]
    with pytest.raises(_Boom, match="bad element 4"):
        next(restored)
    assert [int(v) for v in head] == [0]


def test_a_map_func_error_under_way_in_a_parallel_interleave_is_raised_again_by_a_restored_pass():
    def opened(x):
        if int(x) == 3:
            raise KeyError("no input 3")
        return _inner(x)

    def make():
        return D.range(6).interleave(opened, cycle_length=2, num_parallel_calls=2)

    iterator = iter(make())
    head = take(iterator, 3)
    state = iterator._checkpoint_state()
    restored = iter(make())
    restored._checkpoint_restorer(state)()
    expected, got = [], []
    with pytest.raises(KeyError, match="no input 3"):
        for element in iterator:
            expected.append(element)
    with pytest.raises(KeyError, match="no input 3") as raised:
        for element in restored:
            got.append(element)
    assert_same_elements(expected, got)
    assert not any("restored with it" in note for note in raised.value.__notes__)  # made again, not saved
    assert len(head) == 3


class _TwoArguments(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


@pytest.mark.parametrize(
    "error, restored_type, message",
    [
        pytest.param(ValueError("bad value"), ValueError, "bad value", id="builtin"),
        pytest.param(KeyError("k"), KeyError, "'k'", id="builtin-with-repr"),
        pytest.param(ValueError(np.int64(3)), ValueError, "3", id="arguments-not-plain-values"),
        pytest.param(td.errors.InvalidArgumentError("bad shape"), td.errors.InvalidArgumentError, "bad shape", id="td"),
        pytest.param(_TwoArguments(1, 2), td.errors.UnknownError, r"_TwoArguments: 1 and 2", id="unbuildable"),
        pytest.param(KeyboardInterrupt("stop"), td.errors.UnknownError, "KeyboardInterrupt: stop", id="not-exception"),
    ],
)
def test_a_saved_error_is_rebuilt_as_its_type_or_named_by_an_unknown_error(error, restored_type, message):
    error.add_note("raised on element 4")
    restored = saved_errors.restore_error(saved_errors.save_error(error))
    assert type(restored) is restored_type
    assert message in str(restored)
    assert restored.__notes__[0] == "raised on element 4"


def test_a_saved_error_of_a_type_that_cannot_be_imported_is_named_by_an_unknown_error():
    class Local(Exception):
        pass

    saved = saved_errors.save_error(Local("lost"))
    restored = saved_errors.restore_error(saved)
    assert isinstance(restored, td.errors.UnknownError)
    assert "Local: lost" in str(restored)


# --- the ignore_errors copies --------------------------------------------------------------

TOLERANT = {
    "map": "D.range(14).map(lambda x: 10 // int(x % 4))",
    "map-parallel": "D.range(14).map(lambda x: 10 // int(x % 4), num_parallel_calls=3)",
    "filter": "D.range(14).filter(lambda x: 10 // int(x % 4) > 2)",
    "interleave": "D.range(8).interleave(lambda x: D.range(3).map(lambda y: 10 // int((x + y) % 4)), cycle_length=2)",
    "interleave-map-func": (
        "D.range(8).interleave(lambda x: D.range(1 + 6 // int(x % 3)), cycle_length=3, num_parallel_calls=2)"
    ),
    "interleave-parallel": (
        "D.range(8).interleave(lambda x: D.range(3).map(lambda y: 10 // int((x + y) % 4)), cycle_length=2, "
        "block_length=2, num_parallel_calls=2)"
    ),
}


@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("name", sorted(TOLERANT))
def test_an_ignore_errors_copy_resumes_without_the_elements_it_dropped(name, k):
    namespace: dict[str, object] = {}
    exec(PRELUDE + f"\ndef make():\n    return {TOLERANT[name]}\n", namespace)
    errors: list[BaseException] = []

    def make():
        return tolerant(namespace["make"](), errors.append)  # what ignore_errors() iterates

    saved = save_after(make, k)
    assert errors  # some elements were dropped
    assert_same_elements(saved.rest, restored_rest(make, saved.state))


# --- threads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["prefetch", "map-parallel", "interleave-parallel", "prefetch-of-interleave"])
def test_restoring_into_a_running_iterator_stops_its_threads(name):
    make = maker(name)
    before = named_threads()
    saved = save_after(make, 2)
    iterator = iter(make())
    take(iterator, 3)  # its threads are running
    iterator._checkpoint_restorer(saved.state)()
    assert_same_elements(saved.rest, list(iterator))
    iterator.close()
    assert_threads_gone(before)


@pytest.mark.timeout(60)
def test_closing_a_prefetch_whose_thread_is_blocked_in_user_code_warns_and_leaves_the_input_to_it(monkeypatch):
    monkeypatch.setattr(prefetch_lib, "_STOP_SECONDS", 0.2)
    release, started = threading.Event(), threading.Event()

    def gen():
        yield 0
        started.set()
        release.wait(timeout=30)  # bounded: the test releases it below
        yield 1

    before = named_threads()
    iterator = iter(D.from_generator(gen, output_signature=td.TensorSpec((), np.int64)).prefetch(1))
    assert int(next(iterator)) == 0
    assert started.wait(timeout=10)
    with pytest.warns(ResourceWarning, match="did not stop within"):
        iterator.close()  # (closing the input the thread runs would fail: "generator already executing")
    release.set()
    assert_threads_gone(before)


# --- restoring into another pipeline ---------------------------------------------------------

MISMATCHES = {
    "map-into-filter": ("D.range(9).map(lambda x: x)", "D.range(9).filter(lambda x: x >= 0)", "FilterDataset"),
    "prefetch-into-none": ("D.range(9).prefetch(2)", "D.range(9)", "PrefetchDataset"),
    "cycle-length": (
        "D.range(9).interleave(lambda x: D.range(x), cycle_length=2)",
        "D.range(9).interleave(lambda x: D.range(x), cycle_length=3)",
        "cycle_length=2",
    ),
    "parallel-into-sequential-interleave": (
        "D.range(9).interleave(lambda x: D.range(x), cycle_length=2, num_parallel_calls=2)",
        "D.range(9).interleave(lambda x: D.range(x), cycle_length=2)",
        "ParallelInterleaveDataset",
    ),
    "interleave-into-flat_map": (
        "D.range(9).interleave(lambda x: D.range(x), cycle_length=1)",
        "D.range(9).flat_map(lambda x: D.range(x))",
        "FlatMapDataset",
    ),
    "made-dataset": (
        "D.range(9).interleave(lambda x: D.range(x), cycle_length=2)",
        "D.range(9).interleave(lambda x: D.range(x).map(lambda y: y), cycle_length=2)",
        "MapDataset",
    ),
}


@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_restoring_into_a_different_pipeline_names_the_operation_and_leaves_the_iterator_unchanged(name):
    saved_as, restored_as, named = MISMATCHES[name]
    state = save_after(maker_of(saved_as), 4).state
    other = maker_of(restored_as)
    iterator = iter(other())
    head = take(iterator, 2)
    with pytest.raises(td.errors.NotFoundError, match="cannot restore the iterator") as raised:
        iterator._checkpoint_restorer(state)()
    assert named in str(raised.value)
    assert_same_elements(list(other())[2:], list(iterator))
    assert len(head) == 2


def maker_of(expression: str):
    namespace: dict[str, object] = {}
    exec(PRELUDE + f"\ndef make():\n    return {expression}\n", namespace)
    return namespace["make"]
