"""``td.data`` transformations: ``batch``/``unbatch``/``rebatch``, ``map``, ``filter``, ``shuffle``, ``repeat``/``take``/``skip``/``shard``.

Expected values follow TensorFlow's ``tf.data`` (checked against TensorFlow where the
behaviour is observable).
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import towerdist as td

from dataset_helpers import UNK, D, Point, assert_threads_gone, failing_at, ints, new_threads, rows

# --- batch / unbatch / rebatch ------------------------------------------------------------------


def test_batch_keeps_remainder():
    ds = D.range(10).batch(3)
    assert rows(ds) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert ds.element_spec == td.TensorSpec((None,), td.int64)


def test_batch_drop_remainder_static_spec():
    ds = D.range(10).batch(3, drop_remainder=True)
    assert rows(ds) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert ds.element_spec == td.TensorSpec((3,), td.int64)


def test_batch_structures():
    ds = D.from_tensor_slices({"x": np.arange(8).reshape(4, 2), "s": ["a", "b", "c", "d"]}).batch(3)
    out = list(ds)
    assert [e["x"].shape for e in out] == [(3, 2), (1, 2)]
    assert out[0]["s"].tolist() == [b"a", b"b", b"c"] and out[0]["s"].dtype == object
    assert ds.element_spec == {"s": td.TensorSpec((None,), td.string), "x": td.TensorSpec((None, 2), td.int64)}


def test_batch_of_generator_matches_batch_of_slices():
    data = np.arange(14).reshape(7, 2)
    sliced = list(D.from_tensor_slices((data, data[:, 0])).batch(3))
    generated = list(
        D.from_generator(
            lambda: ((row, row[0]) for row in data),
            output_signature=(td.TensorSpec((2,), td.int64), td.TensorSpec((), td.int64)),
        ).batch(3)
    )
    assert len(sliced) == len(generated) == 3
    for (a1, b1), (a2, b2) in zip(sliced, generated):
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(b1, b2)


def test_batch_after_shuffle_cuts_the_shuffled_order():
    order = ints(D.range(11).shuffle(11, seed=5))
    batches = rows(D.range(11).shuffle(11, seed=5).batch(4))
    assert batches == [order[0:4], order[4:8], order[8:11]]


@pytest.mark.parametrize("size", [0, -1])
def test_batch_size_must_be_positive(size):
    with pytest.raises(td.errors.InvalidArgumentError, match="Batch size must be greater than zero"):
        D.range(3).batch(size)


def test_batch_ragged_elements():
    ds = D.range(1, 4).map(lambda x: np.arange(x)).batch(2)
    with pytest.raises(td.errors.InvalidArgumentError, match="Cannot batch tensors with different shapes in component 0"):
        list(ds)


def test_unbatch_inverts_batch():
    ds = D.from_tensor_slices((np.arange(10), np.arange(20).reshape(10, 2))).batch(3).unbatch()
    out = list(ds)
    assert [int(a) for a, _ in out] == list(range(10))
    assert [b.tolist() for _, b in out] == np.arange(20).reshape(10, 2).tolist()
    assert ds.element_spec == (td.TensorSpec((), td.int64), td.TensorSpec((2,), td.int64))
    assert ds.cardinality() == UNK


def test_unbatch_dict_of_matrices():
    out = list(D.from_tensors({"a": np.arange(4).reshape(2, 2)}).unbatch())
    assert [e["a"].tolist() for e in out] == [[0, 1], [2, 3]]


def test_unbatch_scalar_input_fails_at_construction():
    with pytest.raises(ValueError, match="Cannot unbatch an input with scalar components"):
        D.range(3).unbatch()


def test_unbatch_mismatched_leading_dims():
    with pytest.raises(td.errors.InvalidArgumentError, match="Cannot unbatch an element whose components"):
        list(D.from_tensors((np.zeros(2), np.zeros(3))).unbatch())


@pytest.mark.parametrize(
    "sizes, drop, expected",
    [
        (3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
        (3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
        (5, False, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]),
        ([1, 2, 3], False, [[0], [1, 2], [3, 4, 5], [6], [7, 8], [9]]),
        ([1, 2, 3], True, [[0], [1, 2], [3, 4, 5], [6], [7, 8]]),
        ([4, 1], False, [[0, 1, 2, 3], [4], [5, 6, 7, 8], [9]]),
    ],
)
def test_rebatch_cuts_rows_across_element_boundaries(sizes, drop, expected):
    ds = D.range(10).batch(4).rebatch(sizes, drop_remainder=drop)
    assert rows(ds) == expected


def test_rebatch_matches_tensorflow_example():
    assert rows(D.range(8).batch(4).rebatch([1, 2, 3])) == [[0], [1, 2], [3, 4, 5], [6], [7]]


def test_rebatch_structures_and_spec():
    ds = D.from_tensor_slices((np.arange(6), np.arange(12).reshape(6, 2))).batch(4).rebatch(3)
    out = list(ds)
    assert [a.tolist() for a, _ in out] == [[0, 1, 2], [3, 4, 5]]
    assert out[1][1].tolist() == [[6, 7], [8, 9], [10, 11]]
    assert ds.element_spec == (td.TensorSpec((None,), td.int64), td.TensorSpec((None, 2), td.int64))
    assert D.range(8).batch(4).rebatch(2, drop_remainder=True).element_spec == td.TensorSpec((2,), td.int64)


@pytest.mark.parametrize("sizes", [0, [], [2, -1]])
def test_rebatch_invalid_sizes(sizes):
    with pytest.raises(td.errors.InvalidArgumentError, match=r"rebatch\(\) needs non-negative batch sizes"):
        D.range(4).batch(2).rebatch(sizes)


# --- map -----------------------------------------------------------------------------------------


def test_map_unpacks_tuples():
    ds = D.from_tensor_slices(([1, 2], [10, 20])).map(lambda a, b: a + b)
    assert ints(ds) == [11, 22]


def test_map_does_not_unpack_namedtuples():
    seen = []

    def fn(p):
        seen.append(type(p))
        return p.x * 100 + p.y

    assert ints(D.from_tensor_slices(Point([1, 2], [3, 4])).map(fn)) == [103, 204]
    assert seen == [Point, Point]


def test_map_passes_dicts_whole():
    ds = D.from_tensor_slices({"a": [1, 2], "b": [5, 6]}).map(lambda d: d["a"] * d["b"])
    assert ints(ds) == [5, 12]


def test_map_list_result_becomes_tuple():
    out = list(D.range(2).map(lambda x: [x, x * 2]))
    assert all(type(e) is tuple for e in out)
    assert [(int(a), int(b)) for a, b in out] == [(0, 0), (1, 2)]
    assert D.range(2).map(lambda x: [x, x * 2]).element_spec == (td.TensorSpec((), td.int64),) * 2


def test_map_python_float_result_is_float32():
    ds = D.range(2).map(lambda x: 1.5)
    out = list(ds)
    assert [np.asarray(v).dtype for v in out] == [np.float32, np.float32]
    assert [float(v) for v in out] == [1.5, 1.5]
    assert ds.element_spec == td.TensorSpec((), td.float32)


def test_map_spec_keeps_unknown_batch_dim():
    ds = D.from_tensors(([1.0], [2])).repeat(100).batch(16)
    mapped = ds.map(lambda x, y: (x * 2, y))
    assert mapped.element_spec == (td.TensorSpec((None, 1), td.float32), td.TensorSpec((None, 1), td.int32))
    static = D.from_tensors(([1.0], [2])).repeat(100).batch(16, drop_remainder=True).map(lambda x, y: x)
    assert static.element_spec == td.TensorSpec((16, 1), td.float32)


def test_map_rejects_non_callable():
    with pytest.raises(TypeError, match=r"map\(\) takes a callable"):
        D.range(3).map(42)


@pytest.mark.parametrize("calls, error", [(0, ValueError), (True, TypeError), (2.0, TypeError)])
def test_map_num_parallel_calls_validation(calls, error):
    with pytest.raises(error, match=r"map\(\)"):
        D.range(3).map(lambda x: x, num_parallel_calls=calls)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("calls", [1, 2, 4, td.data.AUTOTUNE])
def test_map_parallel_matches_sequential(calls):
    def fn(x, y):
        return {"sum": x + y, "prod": np.full(3, x * y)}

    source = D.from_tensor_slices((np.arange(50), np.arange(50, 100)))
    expected = list(source.map(fn))
    got = list(source.map(fn, num_parallel_calls=calls))
    assert len(got) == len(expected) == 50
    for a, b in zip(got, expected):
        assert int(a["sum"]) == int(b["sum"])
        np.testing.assert_array_equal(a["prod"], b["prod"])


@pytest.mark.timeout(60)
def test_map_parallel_keeps_order_when_calls_finish_out_of_order():
    release = threading.Event()
    finished = []
    lock = threading.Lock()

    def fn(x):
        if int(x) == 0:
            assert release.wait(timeout=20), "element 3 never ran concurrently with element 0"
        if int(x) == 3:
            release.set()
        with lock:
            finished.append(int(x))
        return x * 10

    before = set(threading.enumerate())
    assert ints(D.range(12).map(fn, num_parallel_calls=4)) == [10 * i for i in range(12)]
    assert finished.index(3) < finished.index(0)  # the calls really completed out of order
    assert_threads_gone("towerdist-map", before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("calls", [None, 4, td.data.AUTOTUNE], ids=["sequential", "4", "autotune"])
def test_map_exception_surfaces_at_next_with_note(calls):
    before = set(threading.enumerate())
    it = iter(D.range(20).map(failing_at(5, KeyError("bad element")), num_parallel_calls=calls))
    got = [int(next(it)) for _ in range(5)]
    assert got == [0, 1, 2, 3, 4]
    with pytest.raises(KeyError, match="bad element") as info:
        next(it)
    assert any("element 5" in note for note in info.value.__notes__)
    it.close()
    assert_threads_gone("towerdist-map", before)


@pytest.mark.timeout(60)
def test_map_parallel_threads_stop_on_close():
    before = set(threading.enumerate())
    it = iter(D.range(10_000).map(lambda x: x + 1, num_parallel_calls=4))
    assert [int(next(it)) for _ in range(3)] == [1, 2, 3]
    assert new_threads("towerdist-map", before), "the parallel map started no thread"
    it.close()
    assert_threads_gone("towerdist-map", before)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.timeout(60)
def test_map_parallel_threads_stop_when_iterator_is_dropped():
    before = set(threading.enumerate())
    it = iter(D.range(10_000).map(lambda x: x + 1, num_parallel_calls=3))
    assert int(next(it)) == 1
    assert new_threads("towerdist-map", before)
    del it
    gc.collect()
    assert_threads_gone("towerdist-map", before)


# --- filter --------------------------------------------------------------------------------------


def test_filter_keeps_matching():
    assert ints(D.range(10).filter(lambda x: x % 3 == 0)) == [0, 3, 6, 9]
    assert ints(D.range(5).filter(lambda x: bool(x > 2))) == [3, 4]


def test_filter_unpacks_tuples():
    ds = D.from_tensor_slices(([1, 2, 3], [3, 2, 1])).filter(lambda a, b: a < b)
    assert [(int(a), int(b)) for a, b in ds] == [(1, 3)]


@pytest.mark.parametrize(
    "predicate", [lambda x: x, lambda x: np.array([True]), lambda x: 1.0, lambda x: (True, True)],
    ids=["int", "vector", "float", "tuple"],
)
def test_filter_predicate_must_return_bool_scalar(predicate):
    with pytest.raises(ValueError, match="Invalid `predicate`"):
        list(D.range(3).filter(predicate))


def test_filter_exception_notes_element():
    with pytest.raises(ZeroDivisionError) as info:
        list(D.range(5).filter(lambda x: 1 / (int(x) - 3) > 0))
    assert any("element 3" in note for note in info.value.__notes__)


def test_filter_rejects_non_callable():
    with pytest.raises(TypeError, match=r"filter\(\) takes a callable"):
        D.range(3).filter(None)


# --- shuffle -----------------------------------------------------------------------------------


def test_shuffle_seeded_is_reproducible_across_datasets():
    a = ints(D.range(30).shuffle(30, seed=42))
    b = ints(D.range(30).shuffle(30, seed=42))
    assert a == b
    assert sorted(a) == list(range(30))
    assert a != list(range(30))
    assert ints(D.range(30).shuffle(30, seed=43)) != a


def test_shuffle_reshuffles_each_iteration():
    ds = D.range(30).shuffle(30, seed=1)
    first, second = ints(ds), ints(ds)
    assert first != second
    assert sorted(first) == sorted(second) == list(range(30))


def test_shuffle_without_reshuffle_repeats_the_order():
    ds = D.range(30).shuffle(30, seed=1, reshuffle_each_iteration=False)
    first = ints(ds)
    assert ints(ds) == first == ints(ds)
    assert first != list(range(30))


@pytest.mark.parametrize("buffer_size", [1, 2, 19, 20, 100])
def test_shuffle_yields_every_element_once(buffer_size):
    out = ints(D.range(20).shuffle(buffer_size, seed=3))
    assert sorted(out) == list(range(20))
    if buffer_size == 1:
        assert out == list(range(20))


def test_shuffle_structures():
    out = list(D.from_tensor_slices((np.arange(10), np.arange(10) * 2)).shuffle(4, seed=0))
    assert all(int(b) == 2 * int(a) for a, b in out)
    assert sorted(int(a) for a, _ in out) == list(range(10))


@pytest.mark.parametrize("buffer_size", [0, -1, -3])
def test_shuffle_buffer_must_be_positive_or_unknown_cardinality(buffer_size):
    # TensorFlow 2.21: "buffer_size must be greater than zero or UNKNOWN_CARDINALITY" (AUTOTUNE, -1, included).
    message = rf"Dataset.shuffle\(\) buffer_size must be greater than zero .* Got buffer_size={buffer_size};"
    with pytest.raises(td.errors.InvalidArgumentError, match=message):
        D.range(3).shuffle(buffer_size)


def test_shuffle_with_unknown_cardinality_buffers_every_element():
    # As in TensorFlow, buffer_size=UNKNOWN_CARDINALITY (-2) is a buffer as large as the data.
    out = ints(D.range(50).shuffle(UNK, seed=2))
    assert sorted(out) == list(range(50))
    assert out == ints(D.range(50).shuffle(50, seed=2))


# --- repeat / take / skip / shard ----------------------------------------------------------------


@pytest.mark.parametrize("count, expected", [(0, []), (1, [0, 1, 2]), (3, [0, 1, 2] * 3)])
def test_repeat_count(count, expected):
    assert ints(D.range(3).repeat(count)) == expected


@pytest.mark.parametrize("count", [None, -1])
def test_repeat_forever(count):
    assert ints(D.range(3).repeat(count).take(10)) == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]


@pytest.mark.timeout(30)
def test_repeat_of_empty_terminates():
    assert list(D.range(0).repeat()) == []
    assert list(D.range(5).filter(lambda x: x > 10).repeat()) == []


def test_repeat_reshuffles_each_repetition():
    out = ints(D.range(20).shuffle(20, seed=9).repeat(3))
    blocks = [out[0:20], out[20:40], out[40:60]]
    assert all(sorted(b) == list(range(20)) for b in blocks)
    assert len({tuple(b) for b in blocks}) == 3


def test_repeat_invalid_count():
    with pytest.raises(td.errors.InvalidArgumentError, match=r"repeat\(\) count must be >= 0"):
        D.range(3).repeat(-2)


@pytest.mark.parametrize(
    "count, expected", [(0, []), (3, [0, 1, 2]), (10, list(range(10))), (30, list(range(10))), (-1, list(range(10)))]
)
def test_take(count, expected):
    assert ints(D.range(10).take(count)) == expected


@pytest.mark.parametrize(
    "count, expected", [(0, list(range(10))), (3, list(range(3, 10))), (10, []), (30, []), (-1, [])]
)
def test_skip(count, expected):
    assert ints(D.range(10).skip(count)) == expected


@pytest.mark.parametrize("make", [lambda: D.range(3).take(-2), lambda: D.range(3).skip(-2)], ids=["take", "skip"])
def test_take_skip_reject_counts_below_minus_one(make):
    with pytest.raises(td.errors.InvalidArgumentError, match="count must be >= 0, or -1"):
        make()


@pytest.mark.parametrize("index, expected", [(0, [0, 3, 6, 9]), (1, [1, 4, 7]), (2, [2, 5, 8])])
def test_shard(index, expected):
    ds = D.range(10).shard(3, index)
    assert ints(ds) == expected
    assert ds.cardinality() == len(expected)


@pytest.mark.parametrize("num_shards", [0, -2])
def test_shard_number_must_be_positive(num_shards):
    with pytest.raises(td.errors.InvalidArgumentError, match="Number of shards must be greater than zero"):
        D.range(10).shard(num_shards, 0)


@pytest.mark.parametrize("index", [3, -1])
def test_shard_index_must_be_in_range(index):
    with pytest.raises(td.errors.InvalidArgumentError, match=r"Index must be between 0 and 2 \(currently index ="):
        D.range(10).shard(3, index)
