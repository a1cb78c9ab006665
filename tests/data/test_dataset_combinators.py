"""Tests of ``concatenate``, ``apply``, ``scan``, ``unique``, ``take_while``, ``get_single_element``,
``ignore_errors``, ``Dataset.counter``, ``Dataset.random`` (and their ``td.data.experimental``
spellings), and of every new operation, ``interleave``/``flat_map`` included, through the
distribution strategies.

Expected values marked "observed in TensorFlow 2.21" were recorded by running TensorFlow.
"""

from __future__ import annotations

import logging
import threading
import warnings

import numpy as np
import pytest

import towerdist as td

from conftest import mirrored_param

D = td.data.Dataset
INF = td.data.INFINITE_CARDINALITY
UNK = td.data.UNKNOWN_CARDINALITY
E = td.data.experimental


def ints(dataset: D) -> list[int]:
    return [int(v) for v in dataset]


def finite(n: int) -> D:
    """A dataset of cardinality ``n`` (INF: infinite, UNK: unknown)."""
    if n == INF:
        return D.range(3).repeat()
    if n == UNK:
        return D.range(3).filter(lambda v: v >= 0)
    return D.range(n)


TABLE = np.array([10, 20, 30], dtype=np.int64)


def lookup(i):
    """``TABLE[i]``: raises IndexError for an index of 3 or more."""
    return TABLE[i]


# --- concatenate -------------------------------------------------------------------------------


def test_concatenate_documented_example():
    ds = D.range(1, 4).concatenate(D.range(4, 8))
    assert ints(ds) == [1, 2, 3, 4, 5, 6, 7]
    assert ds.cardinality() == 7


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    # observed in TensorFlow 2.21
    [
        (3, INF, INF),
        (INF, 3, INF),
        (3, UNK, UNK),
        (UNK, 3, UNK),
        (INF, UNK, INF),
        (UNK, INF, INF),
        (UNK, UNK, UNK),
        (0, 0, 0),
        (2, 5, 7),
    ],
)
def test_concatenate_cardinality(a, b, expected):
    assert finite(a).concatenate(finite(b)).cardinality() == expected


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    # observed in TensorFlow 2.21
    [
        (D.from_tensors([1, 2]), D.from_tensors([1, 2, 3]), td.TensorSpec((None,), td.int32)),
        (D.from_tensors([1, 2]), D.from_tensors([[1, 2, 3]]), td.TensorSpec(None, td.int32)),
        (
            D.from_tensors([[1, 2]]).batch(2),
            D.from_tensors([[1, 2]]).batch(2, drop_remainder=True),
            td.TensorSpec((None, 1, 2), td.int32),
        ),
        (D.from_tensors([1, 2]), D.from_tensors([3, 4]), td.TensorSpec((2,), td.int32)),
    ],
    ids=["dim", "rank", "batch", "same"],
)
def test_concatenate_relaxes_the_spec_where_the_inputs_differ(first, second, expected):
    assert first.concatenate(second).element_spec == expected


def test_concatenate_dicts_match_by_key():
    ds = D.from_tensors({"a": 1, "b": 2.0}).concatenate(D.from_tensors({"b": 3.0, "a": 4}))
    assert [{k: v.item() for k, v in e.items()} for e in ds] == [{"a": 1, "b": 2.0}, {"a": 4, "b": 3.0}]


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (D.from_tensor_slices([1.0, 2.0]), "at the top level: dtype int64 vs float32"),
        (D.from_tensor_slices([1, 2]), "at the top level: dtype int64 vs int32"),
        (D.zip(D.range(3), D.range(3)), "at the top level: a leaf"),
    ],
    ids=["float", "int32", "structure"],
)
def test_concatenate_incompatible_elements_are_type_errors(other, match):
    # observed in TensorFlow 2.21: TypeError "Incompatible dataset elements"
    with pytest.raises(TypeError, match=rf"Dataset.concatenate\(\) .*Incompatible dataset elements {match}"):
        D.range(3).concatenate(other)


def lazy(value) -> D:
    """Two elements ``value``: a dataset whose spec is known only by running it."""
    return D.from_generator(lambda: iter([value, value]))


@pytest.mark.parametrize(
    ("first", "second", "before_error"),
    [
        (lambda: lazy(np.float32(1.0)), lambda: D.range(2), 0),
        (lambda: D.range(2), lambda: lazy(np.float32(1.0)), 2),
        (lambda: lazy(np.int64(1)), lambda: lazy(np.float32(1.0)), 2),
    ],
    ids=["lazy-first", "lazy-second", "both-lazy"],
)
def test_concatenate_incompatible_elements_known_only_by_running_are_type_errors(first, second, before_error):
    # TensorFlow 2.21 raises TypeError "Incompatible dataset elements" when the dataset is made (it
    # always knows the specs); towerdist learns a generator's spec by running it, so it raises at
    # that input's first element instead of mixing the dtypes.
    iterator = iter(first().concatenate(second()))
    got = [next(iterator) for _ in range(before_error)]
    assert len(got) == before_error
    with pytest.raises(TypeError, match=r"Incompatible dataset elements at the top level: dtype (int64 vs float32|float32 vs int64)"):
        next(iterator)


def test_concatenate_compatible_elements_known_only_by_running():
    assert [int(v) for v in D.range(2).concatenate(lazy(np.int64(5)))] == [0, 1, 5, 5]
    assert [int(v) for v in lazy(np.int64(5)).concatenate(lazy(np.int64(6)))] == [5, 5, 6, 6]


def test_concatenate_dict_keys_and_tuple_lengths_must_match():
    with pytest.raises(TypeError, match="keys 'a' vs a dict with keys 'b'"):
        D.from_tensors({"a": 1}).concatenate(D.from_tensors({"b": 1}))
    with pytest.raises(TypeError, match="length 2 vs a tuple of length 3"):
        D.from_tensors((1, 2)).concatenate(D.from_tensors((1, 2, 3)))


def test_concatenate_needs_a_dataset():
    with pytest.raises(TypeError, match=r"Dataset.concatenate\(\) takes a td.data.Dataset as dataset"):
        D.range(3).concatenate([1, 2])


def test_concatenate_of_mapped_datasets_checks_when_the_spec_is_needed():
    ds = D.range(2).map(lambda x: x * 1.5).concatenate(D.range(2))
    with pytest.raises(TypeError, match="dtype float64 vs int64"):
        _ = ds.element_spec


# --- apply -------------------------------------------------------------------------------------


def test_apply_chains_a_transformation():
    assert ints(D.range(5).apply(lambda d: d.map(lambda x: x * 2))) == [0, 2, 4, 6, 8]


def test_apply_must_return_a_dataset():
    # observed in TensorFlow 2.21: "`transformation_func` must return a `tf.data.Dataset` object. Got <class 'int'>."
    with pytest.raises(
        TypeError, match=r"`transformation_func` must return a `td.data.Dataset` object. Got <class 'int'>"
    ):
        D.range(5).apply(lambda d: 3)


# --- scan --------------------------------------------------------------------------------------


def test_scan_running_sum():
    ds = D.range(5).scan(np.int64(0), lambda s, x: (s + x, s + x))
    assert ints(ds) == [0, 1, 3, 6, 10]  # observed in TensorFlow 2.21
    assert ds.element_spec == td.TensorSpec((), td.int64)
    assert ds.cardinality() == 5


def test_scan_passes_a_tuple_element_as_one_argument():
    ds = D.from_tensor_slices(([1, 2, 3], [4, 5, 6])).scan(0, lambda s, xy: (s + 1, xy[0] * xy[1] + s))
    assert ints(ds) == [4, 11, 20]  # observed in TensorFlow 2.21
    assert ds.element_spec == td.TensorSpec((), td.int32)


def test_scan_with_a_tuple_state():
    ds = D.range(3).scan((np.int64(0), np.int64(1)), lambda s, x: ((s[0] + x, s[1] * 2), s[0] + s[1]))
    assert ints(ds) == [1, 2, 5]  # observed in TensorFlow 2.21


def test_scan_cardinality_follows_the_input():
    assert D.range(3).repeat().scan(0, lambda s, x: (s, x)).cardinality() == INF


def test_scan_of_an_empty_input_still_has_a_spec():
    assert D.range(0).scan(0.0, lambda s, x: (s, (x, s))).element_spec == (
        td.TensorSpec((), td.int64),
        td.TensorSpec((), td.float32),
    )


def _grow(s, x):
    return np.concatenate([s, [x]])


@pytest.mark.parametrize(
    ("initial", "fn", "spec"),
    [
        (np.zeros([0], np.int64), lambda s, x: (_grow(s, x), s), td.TensorSpec((None,), td.int64)),
        (np.zeros([0], np.int64), lambda s, x: (_grow(s, x), _grow(s, x)), td.TensorSpec((None,), td.int64)),
        (np.zeros([0], np.int64), lambda s, x: (_grow(s, x), x), td.TensorSpec((), td.int64)),
        (np.zeros([2], np.int64), lambda s, x: (s + x, s), td.TensorSpec((2,), td.int64)),
        (
            np.zeros([2], np.int64),
            lambda s, x: (s + x, (s, x)),
            (td.TensorSpec((2,), td.int64), td.TensorSpec((), td.int64)),
        ),
        (np.zeros([1, 2], np.int64), lambda s, x: (np.concatenate([s, s]), s), td.TensorSpec((None, 2), td.int64)),
        (np.int64(0), lambda s, x: (np.full([2], x), s), td.TensorSpec(None, td.int64)),
        (
            (np.int64(0), np.zeros([0], np.int64)),
            lambda s, x: ((s[0] + x, _grow(s[1], x)), s[1]),
            td.TensorSpec((None,), td.int64),
        ),
        (
            np.zeros([0], np.int64),
            lambda s, x: (np.concatenate([s, [x, x]]), np.array(s.shape, np.int32)),
            td.TensorSpec((1,), td.int32),
        ),
    ],
    ids=["grows", "grows-new-state", "grows-output-x", "fixed", "fixed-pair", "grows-2d", "rank", "tuple", "shape-of"],
)
def test_scan_spec_relaxes_the_dimensions_that_follow_a_changing_state(initial, fn, spec):
    # observed in TensorFlow 2.21: scan_func is traced again with the changing state dimensions
    # (or rank) relaxed to unknown, e.g. (None,) int64 for a state grown from shape (0,)
    assert D.range(3).scan(initial, fn).element_spec == spec


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda s, x: s, "should return a pair"),
        (lambda s, x: (s, x, x), "should return a pair"),
        (lambda s, x: (np.float32(s) + 1, x), "Expected int32, got float32"),
        (lambda s, x: ((s, s), x), "at the top level"),
    ],
    ids=["one", "three", "dtype", "structure"],
)
def test_scan_func_errors_are_type_errors(fn, match):
    # observed in TensorFlow 2.21: TypeError "Invalid `scan_func`. ..."
    with pytest.raises(TypeError, match=rf"Invalid `scan_func`.*{match}"):
        list(D.range(3).scan(0, fn))


def test_scan_state_of_another_dtype_fails_the_element_spec_with_a_type_error():
    # observed in TensorFlow 2.21: TypeError "Invalid `scan_func`. The element types for the new
    # state must match the initial state. Expected <dtype: 'int32'>, got <dtype: 'int64'>."
    with pytest.raises(TypeError, match=r"Invalid `scan_func`. The element types for the new state"):
        D.range(3).scan(np.int32(0), lambda s, x: (x, s)).element_spec  # noqa: B018


def test_scan_error_comes_after_the_elements_before_it():
    def fn(s, x):
        if int(x) == 2:
            raise KeyError("scan broke")
        return s + x, s

    iterator = iter(D.range(5).scan(np.int64(0), fn))
    assert [int(next(iterator)), int(next(iterator))] == [0, 0]
    with pytest.raises(KeyError) as info:
        next(iterator)
    assert any("Dataset.scan(): raised by the user function on element 2" in n for n in info.value.__notes__)


def test_experimental_scan():
    assert ints(D.range(5).apply(E.scan(np.int64(0), lambda s, x: (s + x, s)))) == [0, 0, 1, 3, 6]


# --- unique ------------------------------------------------------------------------------------


def test_unique_documented_example():
    ds = D.from_tensor_slices([1, 37, 2, 37, 2, 1]).unique()
    assert ints(ds) == [1, 37, 2]  # observed in TensorFlow 2.21
    assert ds.cardinality() == UNK
    assert ds.element_spec == td.TensorSpec((), td.int32)


def test_unique_strings_and_experimental():
    assert list(D.from_tensor_slices(["b", "a", "b"]).apply(E.unique())) == [b"b", b"a"]


def test_unique_vectors_compare_whole_values():
    ds = D.from_tensor_slices([[1, 2], [1, 3], [1, 2]]).unique()
    assert [v.tolist() for v in ds] == [[1, 2], [1, 3]]  # observed in TensorFlow 2.21


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.uint8], ids=lambda d: np.dtype(d).name)
def test_unique_other_dtypes_are_type_errors(dtype):
    # observed in TensorFlow 2.21: "`tf.data.Dataset.unique` does not support type <dtype: 'float32'>"
    with pytest.raises(TypeError, match=rf"does not support type {np.dtype(dtype).name} -- only int32, int64"):
        D.from_tensor_slices(np.array([1, 2], dtype)).unique()


def test_unique_of_several_components_is_invalid_argument():
    with pytest.raises(td.errors.InvalidArgumentError, match="only supports inputs with a single component"):
        D.from_tensor_slices(([1, 2], [1, 2])).unique()


def test_unique_checks_a_mapped_input_when_iterated():
    with pytest.raises(TypeError, match="does not support type float64"):
        list(D.range(3).map(lambda x: x * 0.5).unique())


def test_unique_of_an_empty_dataset():
    assert list(D.range(0).unique()) == []


# --- take_while --------------------------------------------------------------------------------


def test_take_while_stops_at_the_first_false():
    ds = D.range(10).take_while(lambda x: x < 5)
    assert ints(ds) == [0, 1, 2, 3, 4]
    assert ds.cardinality() == UNK  # observed in TensorFlow 2.21
    assert D.range(10).repeat().take_while(lambda x: x < 5).cardinality() == UNK


def test_take_while_unpacks_tuples_and_experimental():
    ds = D.from_tensor_slices(([1, 2, 3], [3, 2, 1])).take_while(lambda a, b: a < b)
    assert [(int(a), int(b)) for a, b in ds] == [(1, 3)]  # observed in TensorFlow 2.21
    assert ints(D.range(10).apply(E.take_while(lambda x: x < 3))) == [0, 1, 2]


def test_take_while_predicate_must_return_a_boolean_scalar():
    with pytest.raises(ValueError, match="Invalid `predicate`. `predicate` must return a `tf.bool` scalar"):
        list(D.range(10).take_while(lambda x: x))


def test_take_while_stops_reading_its_input():
    pulled = []
    ds = D.range(100).map(lambda x: pulled.append(int(x)) or x).take_while(lambda x: x < 3)
    assert ints(ds) == [0, 1, 2]
    assert pulled == [0, 1, 2, 3]


# --- get_single_element ------------------------------------------------------------------------


def test_get_single_element():
    a, b = D.from_tensors((1, 2.0)).get_single_element()
    assert (a.dtype, b.dtype, int(a), float(b)) == (np.int32, np.float32, 1, 2.0)
    assert int(E.get_single_element(D.range(1))) == 0


@pytest.mark.parametrize(("n", "match"), [(0, "was empty"), (2, "had more than one element")])
def test_get_single_element_needs_exactly_one(n, match):
    # observed in TensorFlow 2.21: InvalidArgumentError "Dataset was empty." / "had more than one element."
    with pytest.raises(td.errors.InvalidArgumentError, match=match):
        D.range(n).get_single_element()
    with pytest.raises(td.errors.InvalidArgumentError, match=match):
        E.get_single_element(D.range(n))


def test_experimental_get_single_element_needs_a_dataset():
    with pytest.raises(TypeError, match=r"get_single_element\(\) takes a td.data.Dataset"):
        E.get_single_element([1])


# --- ignore_errors -----------------------------------------------------------------------------


def test_ignore_errors_drops_the_elements_that_failed():
    ds = D.from_tensor_slices([0, 7, 1, 2, 9]).map(lookup).ignore_errors()
    assert ints(ds) == [10, 20, 30]
    assert ints(D.from_tensor_slices([0, 7, 1]).map(lookup).apply(E.ignore_errors())) == [10, 20]


def test_ignore_errors_cardinality_is_unknown_even_without_errors():
    assert D.range(3).ignore_errors().cardinality() == UNK  # observed in TensorFlow 2.21
    assert ints(D.range(3).ignore_errors()) == [0, 1, 2]


def test_ignore_errors_logs_when_asked(caplog):
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        assert ints(D.from_tensor_slices([0, 7]).map(lookup).ignore_errors(log_warning=True)) == [10]
    assert any("ignore_errors() dropped an element" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        assert ints(D.from_tensor_slices([0, 7]).map(lookup).ignore_errors()) == [10]
    assert caplog.records == []


@pytest.mark.timeout(60)
def test_ignore_errors_with_a_parallel_map_and_downstream_operations():
    ds = D.from_tensor_slices([1, 0, 5, 2, 7, 0]).map(lookup, num_parallel_calls=2).take(3).ignore_errors()
    assert ints(ds) == [20, 10, 30]  # take does not count the failed elements (observed in TensorFlow 2.21)


def test_ignore_errors_through_filter_scan_and_take_while():
    def bad_filter(x):
        return TABLE[x] > 10

    assert ints(D.from_tensor_slices([0, 4, 1, 2]).filter(bad_filter).ignore_errors()) == [1, 2]

    def step(s, x):
        return s + TABLE[x], s + TABLE[x]

    # observed in TensorFlow 2.21 (a failing scan_func keeps the state): [1.0, 1.5, 1.75] for 1/x over [1, 2, 0, 4]
    assert ints(D.from_tensor_slices([0, 5, 1]).scan(np.int64(0), step).ignore_errors()) == [10, 30]
    assert ints(D.from_tensor_slices([0, 5, 1, 2]).take_while(lambda x: TABLE[x] < 25).ignore_errors()) == [0, 1]


def test_ignore_errors_through_interleave_and_flat_map():
    # observed in TensorFlow 2.21 (1/x checked for 0 over [1, 2, 0, 4], each repeated twice, cycle 2):
    # a failing map_func skips its input and the next input takes the turn.
    ds = D.from_tensor_slices([0, 1, 5, 2]).interleave(lambda i: D.from_tensors(lookup(i)).repeat(2), cycle_length=2)
    assert ints(ds.ignore_errors()) == [10, 20, 10, 20, 30, 30]
    # Errors inside the inner datasets are skipped and the inner dataset goes on.
    inner = D.from_tensor_slices([0, 4, 1]).flat_map(lambda _: D.from_tensor_slices([0, 9, 2]).map(lookup))
    assert ints(inner.ignore_errors()) == [10, 30, 10, 30, 10, 30]


@pytest.mark.timeout(60)
def test_ignore_errors_through_a_parallel_interleave_keeps_the_order():
    ds = D.from_tensor_slices([0, 1, 5, 2]).interleave(
        lambda i: D.from_tensors(lookup(i)).repeat(2), cycle_length=2, num_parallel_calls=2
    )
    assert ints(ds.ignore_errors()) == [10, 20, 10, 20, 30, 30]


def test_ignore_errors_drops_a_generator_error_and_the_pass_ends_with_the_generator():
    def gen():
        yield 1
        yield 2
        raise KeyError("generator broke")

    ds = D.from_generator(gen, output_signature=td.TensorSpec((), td.int32)).ignore_errors()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the generator has ended: nothing was cut short
        assert ints(ds) == [1, 2]  # observed in TensorFlow 2.21: [1, 2]


def test_ignore_errors_ends_the_pass_where_the_input_cannot_go_on():
    # batch cannot stack rows of two shapes, and cannot skip a failing batch and go on.
    rows = [np.zeros(1), np.ones(1), np.zeros(1), np.zeros(2), np.zeros(1), np.zeros(1)]
    ds = D.from_generator(lambda: iter(rows)).batch(2).ignore_errors()
    with pytest.warns(RuntimeWarning, match="ended the pass early: InvalidArgumentError"):
        assert [b.tolist() for b in ds] == [[[0.0], [1.0]]]


def test_ignore_errors_keeps_a_cache_between_passes():
    calls = []
    ds = D.from_tensor_slices([0, 7, 1]).map(lambda i: calls.append(int(i)) or lookup(i)).cache().ignore_errors()
    assert ints(ds) == ints(ds) == [10, 20]
    assert calls == [0, 7, 1]


# --- counter and random ------------------------------------------------------------------------


def test_counter():
    assert ints(D.counter().take(3)) == [0, 1, 2]
    assert ints(D.counter(5, -2).take(3)) == [5, 3, 1]  # observed in TensorFlow 2.21
    assert D.counter().cardinality() == INF
    assert D.counter(dtype=np.int32).element_spec == td.TensorSpec((), td.int32)
    assert ints(E.Counter(2).take(3)) == [2, 3, 4]


def test_counter_float_and_wraparound():
    assert [float(v) for v in D.counter(1, 2, dtype=np.float32).take(3)] == [1.0, 3.0, 5.0]
    # observed in TensorFlow 2.21: integer counters wrap around
    assert ints(D.counter(126, dtype=np.int8).take(4)) == [126, 127, -128, -127]
    assert ints(D.counter(2**63 - 2).take(3)) == [2**63 - 2, 2**63 - 1, -(2**63)]
    assert ints(D.counter(1, 0).take(3)) == [1, 1, 1]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1.5, 1, np.int64), "start=1.5 to dtype int64"),
        ((1, 1, np.object_), "dtype string"),
        ((300, 1, np.int8), "fit"),
    ],
    ids=["fraction", "string", "range"],
)
def test_counter_values_that_do_not_convert_are_type_errors(args, match):
    # observed in TensorFlow 2.21: TypeError "Cannot convert 1.5 to EagerTensor of dtype int64"
    with pytest.raises(TypeError, match=match):
        D.counter(*args)


def test_random_is_reproducible_with_a_seed():
    ds = D.random(seed=4)
    assert ds.element_spec == td.TensorSpec((), td.int64)
    assert ds.cardinality() == INF
    first = ints(ds.take(1000))
    assert first == ints(D.random(seed=4).take(1000))
    assert first != ints(D.random(seed=5).take(1000))
    assert 0 <= min(first) and max(first) < 2**32 and len(set(first)) > 990


def test_random_repeats_every_pass_unless_rerandomized():
    # observed in TensorFlow 2.21: the same values every pass, also without a seed
    for ds in (
        D.random(seed=4).take(3),
        D.random().take(3),
        D.random(seed=4, rerandomize_each_iteration=False).take(3),
    ):
        assert ints(ds) == ints(ds)
        assert ints(ds.repeat(2)) == ints(ds) * 2
    ds = D.random(seed=4, rerandomize_each_iteration=True).take(3)
    assert ints(ds) != ints(ds)


def test_random_seed_must_be_an_integer():
    with pytest.raises(TypeError, match=r"Dataset.random\(\) takes an integer seed"):
        D.random(seed="a")


# --- early close ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "make",
    [
        lambda: D.counter().prefetch(2).concatenate(D.range(3)),
        lambda: D.random(seed=1).prefetch(2).scan(np.int64(0), lambda s, x: (s, x)),
        lambda: D.counter().prefetch(2).unique(),
        lambda: D.counter().prefetch(2).take_while(lambda x: x >= 0),
        lambda: D.counter().prefetch(2).map(lookup).ignore_errors(),
    ],
    ids=["concatenate", "scan", "unique", "take_while", "ignore_errors"],
)
def test_closing_early_stops_upstream_threads(make):
    before = {t for t in threading.enumerate() if t.name.startswith("towerdist-")}
    iterator = iter(make())
    next(iterator)
    iterator.close()
    for thread in {t for t in threading.enumerate() if t.name.startswith("towerdist-")} - before:
        thread.join(timeout=15)
    assert [t.name for t in threading.enumerate() if t.name.startswith("towerdist-") and t not in before] == []


# --- through the distribution strategies ----------------------------------------------------------


PIPELINES = {
    "interleave": lambda: D.range(5).interleave(lambda x: D.range(10 * x, 10 * x + x), cycle_length=2, block_length=2),
    "interleave-parallel": lambda: D.range(5).interleave(
        lambda x: D.range(10 * x, 10 * x + x), cycle_length=2, num_parallel_calls=2
    ),
    "flat_map": lambda: D.range(5).flat_map(lambda x: D.range(x)),
    "concatenate": lambda: D.range(4).concatenate(D.range(10, 13)),
    "apply": lambda: D.range(7).apply(lambda d: d.map(lambda x: x * 2)),
    "scan": lambda: D.range(7).scan(np.int64(0), lambda s, x: (s + x, s + x)),
    "unique": lambda: D.from_tensor_slices(np.array([1, 1, 2, 3, 2, 4, 5, 5, 6, 7], np.int64)).unique(),
    "take_while": lambda: D.range(10).take_while(lambda x: x < 7),
    "ignore_errors": lambda: D.from_tensor_slices([0, 7, 1, 2, 9, 0, 1]).map(lookup).ignore_errors(),
    "counter": lambda: D.counter(5, 2).take(7),
    "random": lambda: D.random(seed=3).take(7),
}


def _legacy_pieces(batch: np.ndarray, n: int) -> list[list[int]]:
    """TensorFlow's split of a global batch of ``b`` rows: ``n`` pieces of ``ceil(b / n)`` rows."""
    size = -(-len(batch) // n)
    return [batch[min(i * size, len(batch)) : min((i + 1) * size, len(batch))].tolist() for i in range(n)]


def _steps(strategy, dist) -> list[list[list[int]]]:
    return [[np.asarray(p).tolist() for p in strategy.experimental_local_results(step)] for step in dist]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy_name", [mirrored_param(2), mirrored_param(4)])
@pytest.mark.parametrize("name", list(PIPELINES))
def test_distribute_dataset_splits_every_global_batch(request, strategy_name, name):
    strategy = request.getfixturevalue(strategy_name)
    n = strategy.num_replicas_in_sync
    dataset = PIPELINES[name]().batch(3)  # 3 rows over 2 or 4 replicas: uneven and empty pieces
    global_batches = [np.asarray(b) for b in dataset]
    assert len(global_batches) >= 2 and len(global_batches[-1]) < 3  # a partial last batch
    steps = _steps(strategy, strategy.experimental_distribute_dataset(dataset))
    assert steps == [_legacy_pieces(b, n) for b in global_batches]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("drop_remainder", [False, True], ids=["unknown-size", "static-size"])
@pytest.mark.parametrize("name", list(PIPELINES))
def test_datasets_from_function_gives_each_replica_the_next_element(mirrored_strategy, name, drop_remainder):
    strategy = mirrored_strategy
    contexts = []

    def dataset_fn(ctx):
        contexts.append(ctx)
        return PIPELINES[name]().batch(2, drop_remainder=drop_remainder)

    batches = [np.asarray(b).tolist() for b in PIPELINES[name]().batch(2, drop_remainder=drop_remainder)]
    steps = _steps(strategy, strategy.distribute_datasets_from_function(dataset_fn))
    expected = [batches[i : i + 2] for i in range(0, len(batches), 2)]
    if expected and len(expected[-1]) < 2:
        if drop_remainder:
            expected.pop()  # a static batch size: the incomplete last step is dropped
        else:
            expected[-1].append([])  # an unknown batch size: the trailing replica gets an empty batch
    assert steps == expected
    assert len(contexts) == 1 and contexts[0].num_replicas_in_sync == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("calls", [None, 2], ids=["sequential", "parallel"])
def test_ignore_errors_skips_a_missing_file_read_through_interleave(tmp_path, calls):
    for k, n in [(0, 3), (2, 4)]:
        (tmp_path / f"f{k}.txt").write_text("".join(f"f{k}-l{j}\n" for j in range(n)))
    names = [str(tmp_path / name) for name in ("f0.txt", "f1-missing.txt", "f2.txt")]
    ds = D.from_tensor_slices(names).interleave(td.data.TextLineDataset, cycle_length=2, num_parallel_calls=calls)
    # TensorFlow 2.21 retries the missing file forever here; towerdist drops it and goes on.
    expected = [b"f0-l0", b"f0-l1", b"f2-l0", b"f0-l2", b"f2-l1", b"f2-l2", b"f2-l3"]
    assert list(ds.ignore_errors()) == expected
