"""td.data.Dataset: sources, transformations, cardinality, specs and errors (TF 2.21's observed values)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import towerdist as td

D = td.data.Dataset
INF, UNK = td.data.INFINITE_CARDINALITY, td.data.UNKNOWN_CARDINALITY


# The cardinality table of TF 2.21 is pinned in test_dataset.py.


def test_len_of_finite_infinite_and_unknown():
    assert len(D.range(4).batch(3)) == 2
    with pytest.raises(TypeError, match="infinite"):
        len(D.range(4).repeat())
    with pytest.raises(TypeError, match="unknown"):
        len(D.range(4).filter(lambda x: True))


def test_element_specs_and_their_repr_match_tensorflow():
    spec = D.from_tensors(([1.0], [2])).repeat(100).batch(16).element_spec
    assert repr(spec) == (
        "(TensorSpec(shape=(None, 1), dtype=tf.float32, name=None), "
        "TensorSpec(shape=(None, 1), dtype=tf.int32, name=None))"
    )
    assert D.range(3).batch(2, drop_remainder=True).element_spec == td.TensorSpec((2,), td.int64)
    assert D.from_tensor_slices({"a": [1, 2], "b": [3.0, 4.0]}).element_spec == {
        "a": td.TensorSpec((), td.int32), "b": td.TensorSpec((), td.float32)}
    assert D.from_tensor_slices([np.ones(2), np.zeros(2)]).element_spec == td.TensorSpec((2,), td.float64)


def test_lists_are_values_and_map_lists_become_tuples():
    assert [int(v) for v in D.from_tensor_slices([1, 2])] == [1, 2]
    assert list(D.range(2).map(lambda x: [x, x * 2])) == [(0, 0), (1, 2)]
    assert list(D.from_tensor_slices(["a", "bb"]).batch(2))[0].tolist() == [b"a", b"bb"]


def test_map_unpacks_plain_tuples_only():
    pairs = D.from_tensor_slices(([1, 2], [3, 4]))
    assert [int(v) for v in pairs.map(lambda a, b: a + b)] == [4, 6]
    dicts = D.from_tensor_slices({"a": [1, 2]})
    assert [int(v) for v in dicts.map(lambda d: d["a"])] == [1, 2]


def test_elements_are_read_only_and_the_source_is_copied():
    source = np.arange(6).reshape(3, 2)
    ds = D.from_tensor_slices(source)
    source[0, 0] = 100
    first = next(iter(ds))
    assert first.tolist() == [0, 1]
    with pytest.raises(ValueError):
        first[0] = 5


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: D.range(3).batch(0), td.errors.InvalidArgumentError, "Batch size must be greater than zero"),
        (lambda: D.range(3).shard(0, 0), td.errors.InvalidArgumentError, "Number of shards must be greater than zero"),
        (lambda: D.range(3).shard(2, 2), td.errors.InvalidArgumentError, "Index must be between 0 and 1"),
        (lambda: D.range(3).shuffle(0), td.errors.InvalidArgumentError, "buffer_size must be greater than zero"),
        (lambda: D.range(3).prefetch(-5), td.errors.InvalidArgumentError, "buffer_size must be >= 0"),
        (lambda: D.range(3).unbatch(), ValueError, "Cannot unbatch an input with scalar components"),
        (lambda: D.from_tensor_slices(([1, 2], [1, 2, 3])), ValueError, "from_tensor_slices\\(\\) needs every"),
        (lambda: D.from_tensor_slices(3), ValueError, "from_tensor_slices\\(\\) slices every component"),
        (lambda: D.zip((D.range(2), [1, 2])), TypeError, "Invalid input to `zip`"),
        (lambda: D.from_generator([1, 2]), TypeError, "from_generator\\(\\) takes a callable"),
        (lambda: D.list_files("/nonexistent/*.txt"), td.errors.InvalidArgumentError, "No files matched pattern"),
        (lambda: D.range(3).with_options(1), TypeError, "with_options\\(\\) takes a td.data.Options"),
    ],
)
def test_bad_arguments_raise_clearly(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: D.from_generator(lambda: iter([np.ones(2), np.ones(3)]),
                                  output_signature=td.TensorSpec((None,), td.float64)).batch(2),
         td.errors.InvalidArgumentError, "Cannot batch tensors with different shapes in component 0"),
        (lambda: D.from_generator(lambda: iter([np.ones(3)]), output_signature=td.TensorSpec((2,), td.float64)),
         td.errors.InvalidArgumentError, "`generator` yielded an element of shape \\(3,\\)"),
        (lambda: D.range(3).filter(lambda x: x), ValueError, "Invalid `predicate`"),
    ],
)
def test_bad_elements_raise_at_iteration(make, error, words):
    with pytest.raises(error, match=words):
        list(make())


def _fails_on_three(x):
    if x == 3:
        raise ZeroDivisionError("boom")
    return x


@pytest.mark.timeout(60)
@pytest.mark.parametrize("parallel", [None, 3])
@pytest.mark.parametrize("prefetch", [False, True])
def test_map_errors_keep_their_type_and_name_the_element(parallel, prefetch):
    ds = D.range(6).map(_fails_on_three, num_parallel_calls=parallel)
    if prefetch:
        ds = ds.prefetch(2)
    with pytest.raises(ZeroDivisionError, match="boom") as info:
        list(ds)
    assert any("element 3" in note for note in info.value.__notes__)
    _assert_no_threads(("towerdist-map", "towerdist-prefetch"))


def _assert_no_threads(prefix):
    for thread in [t for t in threading.enumerate() if t.name.startswith(prefix)]:
        thread.join(timeout=10)
    assert not [t.name for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["close", "drop"])
def test_prefetch_thread_stops_when_the_iterator_is_closed_or_dropped(how):
    iterator = iter(D.range(10).repeat().prefetch(3))
    assert int(next(iterator)) == 0
    assert any(t.name == "towerdist-prefetch" for t in threading.enumerate())
    if how == "close":
        iterator.close()
    del iterator
    gc.collect()
    _assert_no_threads("towerdist-prefetch")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, td.data.AUTOTUNE])
def test_parallel_map_keeps_the_order(workers):
    expected = [int(v) * 3 for v in D.range(50)]
    assert [int(v) for v in D.range(50).map(lambda x: x * 3, num_parallel_calls=workers)] == expected


def test_seeded_shuffle_is_reproducible_and_reshuffles_each_epoch():
    a, b = D.range(20).shuffle(5, seed=7), D.range(20).shuffle(5, seed=7)
    first_a, first_b = [int(v) for v in a], [int(v) for v in b]
    second_a = [int(v) for v in a]
    assert first_a == first_b and sorted(first_a) == list(range(20)) and first_a != list(range(20))
    assert second_a != first_a and sorted(second_a) == list(range(20))
    fixed = D.range(20).shuffle(5, seed=7, reshuffle_each_iteration=False)
    assert [int(v) for v in fixed] == [int(v) for v in fixed]
    assert [int(v) for v in D.range(5).shuffle(1)] == list(range(5))


def test_cache_replays_without_running_the_pipeline_again(tmp_path):
    calls = []
    ds = D.range(4).map(lambda x: calls.append(int(x)) or x).cache()
    assert [int(v) for v in ds] == [0, 1, 2, 3]
    assert [int(v) for v in ds] == [0, 1, 2, 3]
    assert calls == [0, 1, 2, 3]
    path = str(tmp_path / "cache.pkl")
    assert [int(v) for v in D.range(3).cache(path)] == [0, 1, 2]
    assert [int(v) for v in D.range(0).cache(path)] == [0, 1, 2]  # read back from the file


def test_partial_pass_caches_nothing():
    calls = []
    ds = D.range(4).map(lambda x: calls.append(int(x)) or x).cache()
    iterator = iter(ds)
    next(iterator)
    iterator.close()
    assert [int(v) for v in ds] == [0, 1, 2, 3]
    assert calls == [0, 0, 1, 2, 3]


def test_repeat_of_an_empty_dataset_ends():
    assert list(D.range(0).repeat()) == []


def test_text_lines_and_file_listing(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\ntwo\r\n")
    (tmp_path / "b.txt").write_bytes(b"three\n")
    names = D.list_files(str(tmp_path / "*.txt"), shuffle=False)
    assert [n.decode().rsplit("/", 1)[-1] for n in names] == ["a.txt", "b.txt"]
    assert list(td.data.TextLineDataset(names)) == [b"one", b"two", b"three"]


def test_iterator_end_of_sequence_forms():
    iterator = iter(D.range(1))
    assert int(iterator.get_next()) == 0
    optional = iterator.get_next_as_optional()
    assert not optional.has_value()
    with pytest.raises(td.errors.InvalidArgumentError, match="does not have a value"):
        optional.get_value()
    with pytest.raises(td.errors.OutOfRangeError):
        iterator.get_next()


def test_options_carry_the_auto_shard_policy():
    policy = td.data.experimental.AutoShardPolicy
    assert [int(p) for p in policy] == [-1, 0, 1, 2, 3]
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy.OFF
    ds = D.range(4).with_options(options).map(lambda x: x)
    assert ds.options().experimental_distribute.auto_shard_policy == policy.OFF
    assert D.range(4).options().experimental_distribute.auto_shard_policy == policy.AUTO
    with pytest.raises(ValueError, match="auto_shard_policy must be"):
        options.experimental_distribute.auto_shard_policy = 7


def test_batch_then_unbatch_and_rebatch_keep_the_rows():
    rows = [int(v) for v in D.range(11).batch(4).unbatch()]
    assert rows == list(range(11))
    assert [b.tolist() for b in D.range(9).batch(7).rebatch([2, 2, 2, 1])] == [[0, 1], [2, 3], [4, 5], [6], [7, 8]]
