"""``td.data``: ``prefetch``, ``cache`` and ``enumerate``.

Expected values follow TensorFlow's ``tf.data`` (checked against TensorFlow where the
behaviour is observable).
"""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time

import numpy as np
import pytest

import towerdist as td

from dataset_helpers import D, assert_threads_gone, generator_failing_after, ints, new_threads, rows

# --- prefetch --------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("buffer_size", [0, 1, 2, 16, td.data.AUTOTUNE])
def test_prefetch_same_elements(buffer_size):
    before = set(threading.enumerate())
    ds = D.from_tensor_slices((np.arange(25), np.arange(25) * 2)).prefetch(buffer_size)
    out = list(ds)
    assert [(int(a), int(b)) for a, b in out] == [(i, 2 * i) for i in range(25)]
    assert [int(a) for a, _ in ds] == list(range(25))  # a second pass
    assert_threads_gone("towerdist-prefetch", before)


@pytest.mark.timeout(60)
def test_prefetch_produces_on_a_background_thread():
    seen = []

    def gen():
        for i in range(3):
            seen.append(threading.current_thread().name)
            yield i

    ds = D.from_generator(gen, output_signature=td.TensorSpec((), td.int64)).prefetch(2)
    assert ints(ds) == [0, 1, 2]
    assert seen == ["towerdist-prefetch"] * 3


@pytest.mark.timeout(60)
def test_prefetch_surfaces_upstream_exception():
    before = set(threading.enumerate())
    ds = D.from_generator(generator_failing_after(3), output_signature=td.TensorSpec((), td.int64)).prefetch(2)
    it = iter(ds)
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(td.errors.UnknownError, match="KeyError: 'generator broke'") as info:
        next(it)
    assert "after 3 elements" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)
    assert_threads_gone("towerdist-prefetch", before)


@pytest.mark.timeout(60)
def test_prefetch_thread_stops_on_close():
    before = set(threading.enumerate())
    it = iter(D.range(10**9).prefetch(2))
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    assert new_threads("towerdist-prefetch", before), "prefetch started no thread"
    it.close()
    assert_threads_gone("towerdist-prefetch", before)
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.timeout(60)
def test_prefetch_thread_stops_when_iterator_is_dropped():
    before = set(threading.enumerate())
    it = iter(D.range(10**9).repeat().prefetch(4))
    assert int(next(it)) == 0
    assert new_threads("towerdist-prefetch", before)
    del it
    gc.collect()
    assert_threads_gone("towerdist-prefetch", before)


@pytest.mark.timeout(60)
def test_prefetch_under_take_stops_its_thread():
    before = set(threading.enumerate())
    assert ints(D.range(10**9).prefetch(2).take(4)) == [0, 1, 2, 3]
    assert_threads_gone("towerdist-prefetch", before)


def test_prefetch_negative_buffer():
    with pytest.raises(td.errors.InvalidArgumentError, match="buffer_size must be >= 0"):
        D.range(3).prefetch(-2)


# --- cache --------------------------------------------------------------------------------------


def counting_map(calls: list[int]):
    def fn(x):
        calls.append(int(x))
        return x * 2

    return fn


def test_cache_replays_without_rerunning_upstream():
    calls: list[int] = []
    ds = D.range(5).map(counting_map(calls)).cache()
    assert ints(ds) == [0, 2, 4, 6, 8]
    assert calls == [0, 1, 2, 3, 4]
    assert ints(ds) == [0, 2, 4, 6, 8]
    assert ints(ds.repeat(2)) == [0, 2, 4, 6, 8] * 2
    assert calls == [0, 1, 2, 3, 4]


def test_cache_partial_pass_caches_nothing():
    calls: list[int] = []
    ds = D.range(5).map(counting_map(calls)).cache()
    it = iter(ds)
    assert [int(next(it)), int(next(it))] == [0, 2]
    it.close()
    assert ints(ds.take(3)) == [0, 2, 4]
    assert calls == [0, 1, 0, 1, 2]
    assert ints(ds) == [0, 2, 4, 6, 8]
    assert ints(ds) == [0, 2, 4, 6, 8]
    assert calls == [0, 1, 0, 1, 2, 0, 1, 2, 3, 4]


def test_cache_freezes_a_shuffle():
    ds = D.range(20).shuffle(20, seed=4).cache()
    first = ints(ds)
    assert ints(ds) == first
    assert sorted(first) == list(range(20))


def test_cache_to_file_is_read_by_a_new_dataset(tmp_path):
    path = tmp_path / "cache.bin"
    calls: list[int] = []
    assert ints(D.range(4).map(counting_map(calls)).cache(str(path))) == [0, 2, 4, 6]
    assert path.exists()
    other_calls: list[int] = []
    again = D.range(4).map(counting_map(other_calls)).cache(str(path))
    assert ints(again) == [0, 2, 4, 6]
    assert other_calls == []


def test_cache_to_file_partial_pass_writes_nothing(tmp_path):
    path = tmp_path / "cache.bin"
    ds = D.range(4).cache(str(path))
    assert ints(ds.take(2)) == [0, 1]
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []
    assert ints(ds) == [0, 1, 2, 3]
    assert path.exists()


def test_cache_to_a_missing_directory_fails_at_the_first_element(tmp_path):
    # observed in TensorFlow 2.21: NotFoundError ("<dir>/missing/train_0.lockfile; No such file or
    # directory") from the first next(), before any element is read
    calls: list[int] = []
    iterator = iter(D.range(4).map(counting_map(calls)).cache(str(tmp_path / "missing" / "train")))
    with pytest.raises(td.errors.NotFoundError, match=r"Dataset.cache\(\) cannot write its file .*does not exist") as info:
        next(iterator)
    assert info.value.path == str(tmp_path / "missing" / "train")
    assert calls == []


def test_cache_to_file_abandoned_pass_leaves_no_temporary_file(tmp_path):
    iterator = iter(D.range(4).cache(str(tmp_path / "cache.bin")))
    assert int(next(iterator)) == 0
    assert len(list(tmp_path.iterdir())) == 1  # the pass's temporary file, made when it started
    iterator.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content", [b"", b"garbage!" * 4, pickle.dumps([np.int64(1)])[:-3], pickle.dumps({"not": "a list"})],
    ids=["empty", "garbage", "truncated", "not-a-list"],
)
def test_cache_file_that_is_corrupt_is_a_data_loss_error_naming_it(tmp_path, content):
    # TensorFlow 2.21 raises DataLossError for a damaged cache file (its checksum fails)
    path = tmp_path / "cache.bin"
    path.write_bytes(content)
    with pytest.raises(td.errors.DataLossError, match=r"Dataset.cache\(\) cannot read its file .*cache.bin") as info:
        next(iter(D.range(4).cache(str(path))))
    assert info.value.path == str(path)


def _write_zeros(element) -> int:
    """Writes zeros into every array of ``element`` in place, as a careless step would.

    Returns how many of the writes numpy refused with its read-only ``ValueError``.
    """
    refused = 0
    for array in element if isinstance(element, tuple) else (element,):
        try:
            array *= 0
        except ValueError as error:
            assert "read-only" in str(error)
            refused += 1
    return refused


def _values(element):
    return [np.asarray(a).tolist() for a in (element if isinstance(element, tuple) else (element,))]


_FLOATS = np.arange(1.0, 9.0).reshape(4, 2)


def _generated_from_floats():
    rows_of = [row.copy() for row in _FLOATS]  # the generator's own arrays, yielded again every pass
    return D.from_generator(lambda: iter(rows_of))


@pytest.mark.parametrize(
    ("make", "read_only"),
    [
        (lambda path: D.from_tensor_slices(_FLOATS).batch(2).cache(), True),
        (lambda path: D.from_tensor_slices(_FLOATS).batch(2).cache(str(path)), True),
        (lambda path: D.from_tensor_slices((_FLOATS, _FLOATS[:, 0])).map(lambda x, y: (x * 2, y)).cache(), True),
        (lambda path: D.from_tensor_slices(_FLOATS).batch(2).cache().unbatch(), True),
        (lambda path: D.from_tensor_slices(_FLOATS).batch(2).cache().map(lambda x: x), True),
        (lambda path: D.from_tensor_slices(_FLOATS).batch(2).cache().rebatch(1), True),
        (lambda path: D.from_tensor_slices(_FLOATS).map(lambda x: x * 1).cache().batch(2), False),
        (lambda path: D.from_tensor_slices(_FLOATS).batch(2).cache().shuffle(4, reshuffle_each_iteration=False),
         True),
        (lambda path: _generated_from_floats(), True),
    ],
    ids=["cache", "cache-to-file", "map-then-cache", "cache-then-unbatch", "cache-then-map",
         "cache-then-rebatch", "cache-then-batch", "cache-then-shuffle", "generator"],
)
@pytest.mark.parametrize("written_pass", [0, 1], ids=["first-pass", "replayed-pass"])
def test_writing_into_an_element_never_changes_a_later_epoch(tmp_path, make, read_only, written_pass):
    # TensorFlow's tensors are immutable. Elements a dataset keeps or shares are read-only
    # views (a write raises numpy's ValueError); fresh ones may be written, harmlessly.
    # (from_tensor_slices and from_tensors are pinned by their own tests above.)
    ds = make(tmp_path / "cache.bin")
    expected = [_values(e) for e in ds]
    if written_pass == 1:
        list(ds)  # a complete pass, so that a cache replays from here on
    refused = [_write_zeros(e) for e in ds]
    assert all(refused) if read_only else not any(refused)
    assert [_values(e) for e in ds] == expected


def test_cache_to_file_elements_read_back_are_read_only(tmp_path):
    path = str(tmp_path / "cache.bin")
    assert rows(D.range(4).batch(2).cache(path)) == [[0, 1], [2, 3]]
    first = next(iter(D.range(0).cache(path)))  # a new dataset: the elements come from the file
    with pytest.raises(ValueError, match="read-only"):
        first += 1
    assert rows(D.range(0).cache(path)) == [[0, 1], [2, 3]]


# --- enumerate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [0, 5])
def test_enumerate(start):
    ds = D.from_tensor_slices(["a", "b", "c"]).enumerate(start)
    out = list(ds)
    assert [(int(i), s) for i, s in out] == [(start, b"a"), (start + 1, b"b"), (start + 2, b"c")]
    assert all(np.asarray(i).dtype == np.int64 for i, _ in out)
    assert ds.element_spec == (td.TensorSpec((), td.int64), td.TensorSpec((), td.string))


@pytest.mark.parametrize("start", [2**63, -(2**63) - 1, 10**30])
def test_enumerate_start_must_fit_in_int64(start):
    message = rf"Dataset.enumerate\(\) counts in int64.*Got start={start}\."
    with pytest.raises(td.errors.InvalidArgumentError, match=message):
        D.range(3).enumerate(start)


def test_enumerate_ends_before_the_count_leaves_int64():
    # TensorFlow zips the input with range(start, int64 max): the count never overflows.
    top = 2**63 - 1
    ds = D.range(5).enumerate(top - 3)
    assert [(int(i), int(x)) for i, x in ds] == [(top - 3, 0), (top - 2, 1), (top - 1, 2)]
    assert ds.cardinality() == 3
    assert list(D.range(5).enumerate(top)) == []
    assert [int(i) for i, _ in D.range(2).enumerate(-(2**63))] == [-(2**63), -(2**63) + 1]


def test_a_checkpoint_saved_beside_a_long_first_cache_pass_leaves_its_file_alone(tmp_path):
    # The pass reserves its file when it starts and writes it when it ends; a checkpoint's sweep
    # removes temporary files an hour old from its directory, and must not take this one.
    cache = str(tmp_path / "train.cache")
    iterator = iter(td.data.Dataset.range(6).cache(cache))
    first = [int(next(iterator)) for _ in range(3)]
    reserved = [name for name in os.listdir(tmp_path) if name != "train.cache"]
    assert len(reserved) == 1
    two_hours_ago = time.time() - 2 * 3600
    os.utime(tmp_path / reserved[0], (two_hours_ago, two_hours_ago))
    td.train.Checkpoint(v=td.Variable(np.zeros(2, np.float32))).save(str(tmp_path / "ckpt"))
    rest = [int(x) for x in iterator]  # the end of the first pass writes the cache file
    assert first + rest == list(range(6))
    assert [int(x) for x in td.data.Dataset.range(0).cache(cache)] == list(range(6))  # read from the file
