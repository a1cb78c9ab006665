"""Tests of ``Dataset.interleave`` and ``Dataset.flat_map``: order, parallelism, errors, threads.

Expected orders are TensorFlow 2.21's, observed by running it (marked "observed in TensorFlow
2.21"), and a small reference model of TensorFlow's cycle/block rule checked against those
observations and then, by hypothesis, against the implementation. (Their use through the
distribution strategies is tested with the other new operations in test_dataset_combinators.py;
FILE auto-sharding through interleave in test_multi_worker_file_sharding.py.)
"""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td
from towerdist._src.data import interleave as interleave_lib

D = td.data.Dataset
UNK = td.data.UNKNOWN_CARDINALITY
PREFIXES = ("towerdist-interleave", "towerdist-flat_map")


# --- helpers ---------------------------------------------------------------------------------


def ints(dataset: D) -> list[int]:
    return [int(v) for v in dataset]


def interleave_model(lengths: list[int], cycle: int, block: int) -> list[tuple[int, int]]:
    """TensorFlow's cycle/block order over inputs of ``lengths``, as (input, position) pairs.

    Each of ``cycle`` slots holds one open input; the cycle visits the slots in turn, and a slot
    gives up to ``block`` elements per visit. An exhausted input gives up its turn; an empty
    slot takes the next input when the cycle visits it, and that input gives its block at once.
    """
    slots: list[list[int] | None] = [None] * cycle  # [input, next position]
    out: list[tuple[int, int]] = []
    next_input, index, taken = 0, 0, 0
    while next_input < len(lengths) or any(s is not None for s in slots):
        slot = slots[index]
        if slot is None:
            if next_input == len(lengths):
                index, taken = (index + 1) % cycle, 0
                continue
            slot = slots[index] = [next_input, 0]
            next_input += 1
        if slot[1] == lengths[slot[0]]:
            slots[index] = None
            index, taken = (index + 1) % cycle, 0
            continue
        out.append((slot[0], slot[1]))
        slot[1] += 1
        taken += 1
        if taken == block:
            index, taken = (index + 1) % cycle, 0
    return out


def encoded(lengths: list[int]) -> D:
    """Input ``i`` yields ``1000 * i + j`` for ``j < lengths[i]``."""
    table = np.array(lengths, dtype=np.int64)
    return D.range(len(lengths)).map(lambda i: (i, table[i]))


def make_input(i, n):
    return D.range(1000 * i, 1000 * i + n)


def decode(values: list[int]) -> list[tuple[int, int]]:
    return [(v // 1000, v % 1000) for v in values]


def named_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(PREFIXES)}


def assert_threads_gone(before: set[threading.Thread], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    for thread in named_threads() - before:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in named_threads() - before if t.is_alive()]
    assert alive == [], f"threads still alive: {alive}"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[str]:
    """The reference example's files: 3, 1, 4 and 2 lines."""
    directory = tmp_path_factory.mktemp("interleave")
    paths = []
    for k, n in enumerate([3, 1, 4, 2]):
        path = directory / f"f{k}.txt"
        path.write_text("".join(f"f{k}-l{j}\n" for j in range(n)))
        paths.append(str(path))
    return paths


PARALLEL = [
    pytest.param({}, id="sequential"),
    pytest.param({"num_parallel_calls": 2}, id="parallel2"),
    pytest.param({"num_parallel_calls": 2, "deterministic": True}, id="parallel2-deterministic"),
    pytest.param({"num_parallel_calls": td.data.AUTOTUNE}, id="autotune"),
]


# --- order -------------------------------------------------------------------------------------


def test_documented_example_cycle_2_block_4():
    ds = D.range(1, 6).interleave(lambda x: D.from_tensors(x).repeat(6), cycle_length=2, block_length=4)
    # TensorFlow's documented example (observed in TensorFlow 2.21).
    assert ints(ds) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", PARALLEL)
def test_files_of_3_1_4_2_lines_refill_a_slot_only_when_the_cycle_returns(files, kwargs):
    ds = D.from_tensor_slices(files).interleave(td.data.TextLineDataset, cycle_length=2, block_length=1, **kwargs)
    # observed in TensorFlow 2.21 (sequential and num_parallel_calls=2 alike)
    expected = [b"f0-l0", b"f1-l0", b"f0-l1", b"f0-l2", b"f2-l0", b"f2-l1", b"f3-l0", b"f2-l2", b"f3-l1", b"f2-l3"]
    assert list(ds) == expected
    assert [f"f{i}-l{j}".encode() for i, j in interleave_model([3, 1, 4, 2], 2, 1)] == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", [*PARALLEL, pytest.param({"num_parallel_calls": 3}, id="parallel3")])
def test_uneven_inputs_cycle_3_block_2(kwargs):
    ds = D.range(10).interleave(
        lambda x: D.range(x * 10, x * 10 + (x * 7) % 5), cycle_length=3, block_length=2, **kwargs
    )
    # observed in TensorFlow 2.21, sequential, num_parallel_calls=3 and AUTOTUNE alike
    assert ints(ds) == [10, 11, 20, 21, 30, 22, 23, 40, 41, 42, 60, 61, 70, 71, 80, 72, 73, 90, 91, 92]


@pytest.mark.timeout(60)
def test_nondeterministic_parallel_keeps_every_element_once():
    ds = D.range(10).interleave(
        lambda x: D.range(x * 10, x * 10 + (x * 7) % 5),
        cycle_length=3,
        block_length=2,
        num_parallel_calls=3,
        deterministic=False,
    )
    assert sorted(ints(ds)) == [10, 11, 20, 21, 22, 23, 30, 40, 41, 42, 60, 61, 70, 71, 72, 73, 80, 90, 91, 92]


@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), max_size=9),
    cycle=st.integers(1, 4),
    block=st.integers(1, 3),
    mode=st.sampled_from(["sequential", "parallel", "autotune"]),
)
def test_deterministic_order_is_the_cycle_block_model(lengths, cycle, block, mode):
    calls = {"sequential": None, "parallel": cycle, "autotune": td.data.AUTOTUNE}[mode]
    ds = encoded(lengths).interleave(make_input, cycle_length=cycle, block_length=block, num_parallel_calls=calls)
    assert decode(ints(ds)) == interleave_model(lengths, cycle, block)


@pytest.mark.timeout(120)
@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), max_size=9), cycle=st.integers(1, 4), block=st.integers(1, 3))
def test_nondeterministic_order_has_every_element_exactly_once(lengths, cycle, block):
    ds = encoded(lengths).interleave(
        make_input, cycle_length=cycle, block_length=block, num_parallel_calls=cycle, deterministic=False
    )
    assert sorted(decode(ints(ds))) == sorted((i, j) for i, n in enumerate(lengths) for j in range(n))


def test_default_cycle_length_is_the_schedulable_cpu_count():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert interleave_lib.default_cycle_length() == expected
    lengths = [2, 0, 3, 1, 4, 2, 5, 1, 3]
    ds = encoded(lengths).interleave(make_input)  # cycle_length=None, block_length=None
    assert decode(ints(ds)) == interleave_model(lengths, expected, 1)


def test_cycle_length_autotune_is_the_default(monkeypatch):
    monkeypatch.setattr(interleave_lib, "default_cycle_length", lambda: 3)
    lengths = [2, 0, 3, 1, 4]
    ds = encoded(lengths).interleave(make_input, cycle_length=td.data.AUTOTUNE)
    assert decode(ints(ds)) == interleave_model(lengths, 3, 1)


def test_default_two_cores_matches_tensorflow_on_two_cores(monkeypatch):
    monkeypatch.setattr(interleave_lib, "default_cycle_length", lambda: 2)
    ds = D.range(4).interleave(lambda x: D.from_tensors(x).repeat(2))
    # observed in TensorFlow 2.21 on a machine with 2 schedulable cores
    assert ints(ds) == [0, 1, 0, 1, 2, 3, 2, 3]


# --- structures, specs, cardinality --------------------------------------------------------------


def test_tuple_element_is_passed_as_separate_arguments():
    ds = D.from_tensor_slices(([1, 2], [3.0, 4.0])).interleave(
        lambda a, b: D.from_tensors((a, b)).repeat(2), cycle_length=2
    )
    # observed in TensorFlow 2.21
    assert ds.element_spec == (td.TensorSpec((), td.int32), td.TensorSpec((), td.float32))
    assert [(int(a), float(b)) for a, b in ds] == [(1, 3.0), (2, 4.0), (1, 3.0), (2, 4.0)]


def test_dict_element_is_passed_as_one_argument():
    ds = D.from_tensor_slices({"a": [1, 2]}).interleave(lambda d: D.from_tensors(d).repeat(2), cycle_length=2)
    assert ds.element_spec == {"a": td.TensorSpec((), td.int32)}
    assert [int(e["a"]) for e in ds] == [1, 2, 1, 2]


def test_cardinality_is_unknown_even_for_an_infinite_input():
    assert D.range(3).interleave(lambda x: D.range(x), cycle_length=1).cardinality() == UNK
    assert D.range(3).repeat().interleave(lambda x: D.range(x), cycle_length=1).cardinality() == UNK
    with pytest.raises(TypeError, match="length is unknown"):
        len(D.range(3).interleave(lambda x: D.range(x), cycle_length=1))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("source", "inner"),
    [(D.range(0), lambda x: D.range(x)), (D.range(5), lambda x: D.range(0))],
    ids=["empty-input", "empty-inner"],
)
def test_empty_inputs_give_an_empty_dataset(source, inner):
    # observed in TensorFlow 2.21: [] for both
    assert list(source.interleave(inner, cycle_length=2)) == []
    assert list(source.interleave(inner, cycle_length=2, num_parallel_calls=2)) == []


def test_empty_input_still_has_an_element_spec():
    # observed in TensorFlow 2.21: TensorSpec(shape=(), dtype=tf.int64)
    assert D.range(0).interleave(lambda x: D.range(x)).element_spec == td.TensorSpec((), td.int64)


def test_repr_does_not_run_the_pipeline():
    calls = []
    ds = D.range(3).interleave(lambda x: calls.append(x) or D.range(x), cycle_length=1)
    assert "unknown until iterated" in repr(ds)
    assert calls == []


# --- argument errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cycle_length": 0}, "cycle_length must be greater than zero"),
        ({"cycle_length": -5}, "cycle_length must be greater than zero"),
        ({"block_length": 0}, "block_length must be greater than zero"),
        ({"block_length": -1}, "block_length must be greater than zero"),
        ({"num_parallel_calls": 0}, "num_parallel_calls must be greater than zero"),
        ({"num_parallel_calls": -5}, "num_parallel_calls must be greater than zero"),
        ({"num_parallel_calls": 2, "cycle_length": 1}, r"num_parallel_calls=2 and cycle_length=1"),
        ({"num_parallel_calls": 3, "cycle_length": 2}, r"num_parallel_calls=3 and cycle_length=2"),
    ],
)
def test_invalid_lengths_raise_invalid_argument(kwargs, match):
    # observed in TensorFlow 2.21: InvalidArgumentError for each of these
    with pytest.raises(td.errors.InvalidArgumentError, match=match):
        D.range(3).interleave(lambda x: D.range(x), **kwargs)


def test_num_parallel_calls_above_the_default_cycle_length_names_the_cpu_count(monkeypatch):
    monkeypatch.setattr(interleave_lib, "default_cycle_length", lambda: 2)
    # observed in TensorFlow 2.21 with 2 cores: "`num_parallel_calls` is 8 and `cycle_length` is 2"
    with pytest.raises(td.errors.InvalidArgumentError, match="resolves to 2 CPU cores"):
        D.range(3).interleave(lambda x: D.range(x), num_parallel_calls=8)


@pytest.mark.timeout(60)
def test_autotune_parallelism_is_accepted_with_cycle_length_1():
    ds = D.range(3).interleave(lambda x: D.range(x), cycle_length=1, num_parallel_calls=td.data.AUTOTUNE)
    assert ints(ds) == [0, 0, 1]  # observed in TensorFlow 2.21


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"cycle_length": 1.5}, TypeError), ({"block_length": "2"}, TypeError), ({"num_parallel_calls": True}, TypeError)],
)
def test_non_integer_lengths_are_type_errors(kwargs, error):
    with pytest.raises(error, match=r"Dataset.interleave\(\) takes an integer"):
        D.range(3).interleave(lambda x: D.range(x), **kwargs)


@pytest.mark.parametrize("api", ["interleave", "flat_map"])
def test_map_func_must_be_callable(api):
    with pytest.raises(TypeError, match=rf"Dataset.{api}\(\) takes a callable map_func"):
        getattr(D.range(3), api)(3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["interleave", "flat_map", "interleave-parallel"])
@pytest.mark.parametrize(
    ("fn", "kind"),
    [
        (lambda x: [x], "list"),
        (lambda x: (D.range(2), D.range(3)), "tuple"),
        (lambda x: {"a": D.range(2)}, "dict"),
        (lambda x: 3, "int"),
    ],
    ids=["list", "tuple", "dict", "int"],
)
def test_map_func_returning_a_non_dataset_is_a_type_error(api, fn, kind):
    ds = {
        "interleave": lambda: D.range(3).interleave(fn, cycle_length=1),
        "flat_map": lambda: D.range(3).flat_map(fn),
        "interleave-parallel": lambda: D.range(3).interleave(fn, cycle_length=2, num_parallel_calls=2),
    }[api]()
    with pytest.raises(
        TypeError, match=rf"the `map_func` argument must return a `Dataset` object. Got <class '{kind}'>"
    ):
        list(ds)


# --- errors while iterating ------------------------------------------------------------------


def failing_map_func(x):
    if int(x) == 3:
        raise KeyError("no dataset for 3")
    return D.range(x * 10, x * 10 + 3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", PARALLEL[:2])
def test_error_in_map_func_comes_after_the_elements_before_it(kwargs):
    iterator = iter(D.range(6).interleave(failing_map_func, cycle_length=2, block_length=2, **kwargs))
    # observed in TensorFlow 2.21 (an assertion on x < 3 in map_func): these, then the error
    assert [int(next(iterator)) for _ in range(8)] == [0, 1, 10, 11, 2, 12, 20, 21]
    with pytest.raises(KeyError, match="no dataset for 3") as info:
        next(iterator)
    assert any("raised by map_func on element 3" in note for note in info.value.__notes__)
    # TF 2.21: the pass goes on after the error (sequential: the failed input's slot is served again;
    # parallel: the error was that slot's element)
    rest = [40, 41, 22, 42, 50, 51, 52] if not kwargs else [22, 40, 41, 50, 51, 42, 52]
    assert [int(x) for x in iterator] == rest


def failing_inner(x):
    def check(y):
        if int(y) + int(x) * 10 >= 12:
            raise ValueError(f"bad value {int(y) + int(x) * 10}")
        return y + x * 10

    return D.range(4).map(check)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", PARALLEL[:2])
def test_error_inside_an_input_comes_after_the_elements_before_it(kwargs):
    iterator = iter(D.range(3).interleave(failing_inner, cycle_length=2, block_length=1, **kwargs))
    assert [int(next(iterator)) for _ in range(5)] == [0, 10, 1, 11, 2]  # observed in TensorFlow 2.21
    with pytest.raises(ValueError, match="bad value 12"):
        next(iterator)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", PARALLEL[:2])
def test_missing_file_raises_not_found_after_the_lines_before_it(files, kwargs):
    names = [files[0], files[1], files[0] + ".missing", files[2]]
    iterator = iter(D.from_tensor_slices(names).interleave(td.data.TextLineDataset, cycle_length=2, **kwargs))
    assert [next(iterator) for _ in range(4)] == [b"f0-l0", b"f1-l0", b"f0-l1", b"f0-l2"]  # observed in TF 2.21
    with pytest.raises(td.errors.NotFoundError, match="No such file"):
        next(iterator)


# --- threads ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_parallel_inputs_run_on_worker_threads():
    seen: set[str] = set()
    lock = threading.Lock()

    def inner(x):
        def record(y):
            with lock:
                seen.add(threading.current_thread().name)
            return y

        return D.range(3).map(record)

    before = named_threads()
    assert len(ints(D.range(4).interleave(inner, cycle_length=2, num_parallel_calls=2))) == 12
    assert seen and all(name.startswith("towerdist-interleave") for name in seen)
    assert_threads_gone(before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("deterministic", [True, False])
def test_closing_early_stops_every_thread(deterministic):
    before = named_threads()
    ds = D.range(100).interleave(
        lambda x: D.from_tensors(x).repeat(), cycle_length=4, num_parallel_calls=4, deterministic=deterministic
    )
    iterator = iter(ds)
    assert len([next(iterator) for _ in range(50)]) == 50
    assert named_threads() - before  # the pool is running
    iterator.close()
    assert_threads_gone(before)


@pytest.mark.timeout(60)
def test_dropping_the_iterator_stops_every_thread():
    before = named_threads()
    iterator = iter(D.range(100).interleave(lambda x: D.range(x).repeat(), cycle_length=3, num_parallel_calls=3))
    next(iterator)
    next(iterator)
    del iterator
    gc.collect()
    assert_threads_gone(before)


@pytest.mark.timeout(60)
def test_closing_after_an_error_stops_every_thread():
    # The pass goes on after an error (as in TensorFlow), so its threads run until it is closed.
    before = named_threads()
    iterator = iter(D.range(6).interleave(failing_map_func, cycle_length=2, num_parallel_calls=2))
    with pytest.raises(KeyError):
        list(iterator)
    iterator.close()
    assert_threads_gone(before)


@pytest.mark.timeout(60)
def test_dropping_the_iterator_after_an_error_stops_every_thread():
    before = named_threads()
    with pytest.raises(KeyError) as info:
        list(D.range(6).interleave(failing_map_func, cycle_length=2, num_parallel_calls=2))
    del info
    gc.collect()
    assert_threads_gone(before)


@pytest.mark.timeout(60)
def test_every_pass_is_a_new_pass():
    ds = D.range(4).interleave(lambda x: D.range(x), cycle_length=2, num_parallel_calls=2)
    assert ints(ds) == ints(ds) == [0, 0, 1, 0, 1, 2]


# --- flat_map --------------------------------------------------------------------------------


def test_flat_map_chains_the_datasets_in_order():
    ds = D.range(4).flat_map(lambda x: D.range(x))
    assert ints(ds) == [0, 0, 1, 0, 1, 2]  # observed in TensorFlow 2.21
    assert ds.cardinality() == UNK


def test_flat_map_documented_example_unbatches():
    ds = D.from_tensor_slices(np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])).flat_map(D.from_tensor_slices)
    assert ints(ds) == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_flat_map_len_is_a_type_error():
    with pytest.raises(TypeError, match="length is unknown"):
        len(D.range(4).flat_map(lambda x: D.range(x)))


def test_flat_map_passes_a_tuple_as_separate_arguments():
    ds = D.from_tensor_slices(([1, 2], [3, 4])).flat_map(lambda a, b: D.from_tensors(a + b))
    assert ds.element_spec == td.TensorSpec((), td.int32)  # observed in TensorFlow 2.21
    assert ints(ds) == [4, 6]


def test_flat_map_passes_a_dict_as_one_argument():
    assert ints(D.from_tensor_slices({"a": [1, 2]}).flat_map(lambda d: D.from_tensors(d["a"]))) == [1, 2]


def test_flat_map_of_windows_of_batches():
    ds = D.range(6).batch(2).flat_map(lambda b: D.from_tensor_slices(b).batch(1))
    assert [v.tolist() for v in ds] == [[0], [1], [2], [3], [4], [5]]


def test_flat_map_error_comes_after_the_elements_before_it():
    iterator = iter(D.range(5).flat_map(failing_map_func))
    assert [int(next(iterator)) for _ in range(9)] == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    with pytest.raises(KeyError) as info:
        next(iterator)
    assert any("Dataset.flat_map(): raised by map_func on element 3" in note for note in info.value.__notes__)


def test_flat_map_over_an_infinite_input_is_lazy():
    assert ints(D.range(5).repeat().flat_map(lambda x: D.from_tensors(x)).take(7)) == [0, 1, 2, 3, 4, 0, 1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs", PARALLEL)
@pytest.mark.parametrize("known", [False, True], ids=["lazy-spec", "static-spec"])
def test_map_func_datasets_of_different_dtypes_are_a_type_error(kwargs, known):
    # TensorFlow traces map_func once, so its datasets cannot differ; towerdist runs it per element
    # and raises TypeError (as TensorFlow does for datasets that cannot mix) instead of mixing dtypes.
    def make(i):
        value = np.float32(2.0) if int(i) == 1 else np.int64(1)
        return D.from_tensors(value) if known else D.from_generator(lambda: iter([value]))

    with pytest.raises(TypeError, match=r"Dataset.interleave\(\): map_func must return datasets of one structure and dtypes"):
        list(D.range(3).interleave(make, cycle_length=2, **kwargs))


@pytest.mark.timeout(60)
def test_closing_while_an_input_is_blocked_in_user_code_is_bounded_and_warns(monkeypatch):
    monkeypatch.setattr(interleave_lib, "_STOP_SECONDS", 0.2)
    release = threading.Event()
    started = threading.Event()

    def blocking(_):
        def gen():
            yield 0
            started.set()
            release.wait(timeout=30)  # bounded: the test releases it below
            yield 1

        return td.data.Dataset.from_generator(gen, output_signature=td.TensorSpec((), np.int64))

    before = set(threading.enumerate())
    ds = td.data.Dataset.range(2).interleave(blocking, cycle_length=1, block_length=1, num_parallel_calls=1)
    iterator = iter(ds)
    assert int(next(iterator)) == 0
    assert started.wait(timeout=30)
    with pytest.warns(ResourceWarning, match="did not stop within"):
        iterator.close()
    release.set()
    assert_threads_gone(before)


@pytest.mark.parametrize(
    "calls, cores, expected",
    [(None, 2, 2), (1, 2, 1), (2, 2, 2), (1, 16, 1), (4, 16, 4), (-1, 2, 1), (-1, 3, 1), (-1, 4, 2), (-1, 16, 6)],
)
def test_default_cycle_length_follows_tensorflows_rule(monkeypatch, calls, cores, expected):
    monkeypatch.setattr(interleave_lib, "default_cycle_length", lambda: cores)
    ds = D.range(1).interleave(lambda x: D.from_tensors(x), num_parallel_calls=calls)
    assert ds._cycle == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "calls, expected",
    [
        # observed in TensorFlow 2.21 on a 2-core machine
        (None, [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]),
        (1, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]),
        (2, [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]),
        (td.data.AUTOTUNE, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]),
    ],
)
def test_default_cycle_length_order_matches_tensorflow_on_two_cores(monkeypatch, calls, expected):
    monkeypatch.setattr(interleave_lib, "default_cycle_length", lambda: 2)
    ds = D.range(4).interleave(lambda x: D.from_tensors(x).repeat(3), num_parallel_calls=calls)
    assert ints(ds) == expected


def test_more_parallel_calls_than_cores_is_refused_as_tensorflow_does(monkeypatch):
    # TensorFlow 2.21 (2 cores), num_parallel_calls=3 and 8: InvalidArgumentError.
    monkeypatch.setattr(interleave_lib, "default_cycle_length", lambda: 2)
    with pytest.raises(td.errors.InvalidArgumentError, match="num_parallel_calls=3"):
        D.range(4).interleave(lambda x: D.from_tensors(x), num_parallel_calls=3)
