"""``td.data`` iterators, and properties of pipelines (hypothesis).

Expected values follow TensorFlow's ``tf.data`` (checked against TensorFlow where the
behaviour is observable).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td

from dataset_helpers import D, assert_threads_gone, ints, rows
from iterator_calls import END, next_by

# --- iterators ------------------------------------------------------------------------------------


def test_iter_starts_a_new_pass_each_time():
    ds = D.range(4)
    a, b = iter(ds), iter(ds)
    assert int(next(a)) == 0 and int(next(a)) == 1
    assert int(next(b)) == 0
    assert isinstance(a, td.data.Iterator)
    assert a is not b


def test_next_raises_stop_iteration_at_end_and_stays_there():
    it = iter(D.range(2))
    assert [int(next(it)), int(next(it))] == [0, 1]
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_get_next_raises_out_of_range():
    it = iter(D.range(1))
    assert int(it.get_next()) == 0
    with pytest.raises(td.errors.OutOfRangeError, match="End of sequence"):
        it.get_next()


def test_get_next_as_optional():
    it = iter(D.from_tensor_slices(([1, 2], [3, 4])))
    opt = it.get_next_as_optional()
    assert isinstance(opt, td.experimental.Optional)
    assert bool(opt.has_value()) is True
    assert tuple(int(v) for v in opt.get_value()) == (1, 3)
    assert it.get_next_as_optional().has_value()
    empty = it.get_next_as_optional()
    assert bool(empty.has_value()) is False
    with pytest.raises(td.errors.InvalidArgumentError, match="The given optional does not have a value"):
        empty.get_value()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: iter(D.range(1)).get_next_as_optional(), True),
        (lambda: iter(D.range(0)).get_next_as_optional(), False),
        (lambda: td.experimental.Optional.from_value(np.float32(2)), True),
        (lambda: td.experimental.Optional.empty(td.TensorSpec((), td.int32)), False),
    ],
    ids=["next", "end", "from_value", "empty"],
)
def test_has_value_is_a_boolean_scalar_array(make, expected):
    # TensorFlow returns a scalar bool tensor: tf.Tensor(True, shape=(), dtype=bool).
    flag = make().has_value()
    assert isinstance(flag, np.ndarray) and flag.shape == () and flag.dtype == np.bool_
    assert bool(flag) is expected
    assert np.asarray(flag).item() is expected and flag.item() is expected
    with pytest.raises(ValueError, match="read-only"):
        flag[...] = not expected


def test_get_next_as_optional_drives_a_while_loop():
    iterator = iter(D.range(3))
    seen = []
    optional = iterator.get_next_as_optional()
    while optional.has_value():
        seen.append(int(optional.get_value()))
        optional = iterator.get_next_as_optional()
    assert seen == [0, 1, 2]


def fail_on_fourth_batch(batch):
    if int(batch[0]) == 6:
        raise ZeroDivisionError("bad batch")
    return batch


def _outcomes(iterator, method: str, calls: int) -> list:
    """What ``calls`` calls of ``method`` give: each element as a list, "error" or "end"."""
    out: list = []
    for _ in range(calls):
        try:
            value = next_by(iterator, method)
        except ZeroDivisionError as error:
            assert any("element 3" in note for note in error.__notes__)
            out.append("error")
        else:
            if value is END:
                out.append("end")
                continue
            out.append(np.asarray(value).tolist())
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["next", "get_next", "get_next_as_optional"])
@pytest.mark.parametrize("calls", [None, 3], ids=["map", "parallel-map"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["no-prefetch", "prefetch"])
def test_pipeline_error_surfaces_in_order_then_the_pass_ends(method, calls, prefetch):
    ds = D.range(12).batch(2).map(fail_on_fourth_batch, num_parallel_calls=calls)
    if prefetch:
        ds = ds.prefetch(2)
    before = set(threading.enumerate())
    iterator = iter(ds)
    assert _outcomes(iterator, method, 6) == [[0, 1], [2, 3], [4, 5], "error", "end", "end"]
    assert_threads_gone("towerdist-", before)


_THREADS = 8
_ELEMENTS = 3000


def _with_python_work(x):
    sum(range(20))  # a little Python work, so that threads switch inside the pipeline
    return x


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "make",
    [
        lambda: D.range(_ELEMENTS).map(_with_python_work),
        lambda: D.from_generator(lambda: (np.int64(i) for i in range(_ELEMENTS))),
        lambda: D.range(_ELEMENTS).map(_with_python_work, num_parallel_calls=2),
        lambda: D.range(_ELEMENTS).map(_with_python_work).prefetch(4),
        lambda: D.range(_ELEMENTS).shuffle(100, seed=0).batch(3).unbatch(),
    ],
    ids=["map", "generator", "parallel-map", "prefetch", "shuffle-batch-unbatch"],
)
@pytest.mark.parametrize("method", ["next", "get_next"])
def test_threads_sharing_one_iterator_get_every_element_exactly_once(make, method):
    iterator = iter(make())
    received: list[list[int]] = [[] for _ in range(_THREADS)]
    errors: list[BaseException] = []
    start = threading.Barrier(_THREADS)
    took_one = threading.Barrier(_THREADS)

    def drain(out: list[int]) -> None:
        try:
            start.wait(timeout=30)
            # every thread takes one element before any takes a second: the iterator is
            # really shared, however the threads are scheduled
            out.append(int(next(iterator) if method == "next" else iterator.get_next()))
            took_one.wait(timeout=30)
            while True:
                try:
                    element = next(iterator) if method == "next" else iterator.get_next()
                except (StopIteration, td.errors.OutOfRangeError):
                    return
                out.append(int(element))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=drain, args=(out,), name=f"drain-{i}") for i, out in enumerate(received)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, inside the pipeline's generators too
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
    finally:
        sys.setswitchinterval(interval)
    assert [t.name for t in threads if t.is_alive()] == []
    assert errors == []
    assert sorted(v for out in received for v in out) == list(range(_ELEMENTS))
    assert all(received)  # the elements really were shared


def test_optional_from_value_and_empty():
    assert td.experimental.Optional.from_value(np.float32(2)).get_value() == 2.0
    assert not td.experimental.Optional.empty(td.TensorSpec((), td.int32)).has_value()
    with pytest.raises(td.errors.InvalidArgumentError, match="The given optional does not have a value"):
        td.experimental.Optional.empty(None).get_value()


def test_get_next_as_optional_has_the_dataset_spec():
    it = iter(D.range(1))
    assert it.get_next_as_optional().element_spec == td.TensorSpec((), td.int64)
    assert it.get_next_as_optional().element_spec == td.TensorSpec((), td.int64)


def test_iterator_element_spec():
    assert iter(D.range(3).batch(2)).element_spec == td.TensorSpec((None,), td.int64)


def test_as_numpy_iterator():
    out = list(D.from_tensor_slices(([1, 2], ["a", "b"])).as_numpy_iterator())
    assert [(int(a), b) for a, b in out] == [(1, b"a"), (2, b"b")]
    assert all(isinstance(a, (np.ndarray, np.generic)) for a, _ in out)


def test_reduce():
    assert int(D.range(5).reduce(np.int64(0), lambda state, x: state + x)) == 10
    pairs = D.from_tensor_slices(([1, 2, 3], [4, 5, 6]))
    assert int(pairs.reduce(0, lambda state, element: state + element[0] * element[1])) == 32
    assert D.range(0).reduce("initial", lambda s, x: "changed") == "initial"


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 40), batch_size=st.integers(1, 12), drop=st.booleans())
def test_property_batch_then_unbatch_is_identity(n, batch_size, drop):
    data = np.arange(n * 2).reshape(n, 2)
    out = list(D.from_tensor_slices(data).batch(batch_size, drop_remainder=drop).unbatch())
    kept = (n // batch_size) * batch_size if drop else n
    assert [v.tolist() for v in out] == data[:kept].tolist()
    assert len(D.from_tensor_slices(data).batch(batch_size, drop_remainder=drop)) == (
        n // batch_size if drop else -(-n // batch_size)
    )


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 60), buffer_size=st.integers(1, 80), seed=st.integers(0, 2**32))
def test_property_shuffle_is_a_permutation(n, buffer_size, seed):
    ds = D.range(n).shuffle(buffer_size, seed=seed)
    first = ints(ds)
    assert sorted(first) == list(range(n))
    assert sorted(ints(ds)) == list(range(n))
    assert ints(D.range(n).shuffle(buffer_size, seed=seed)) == first


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 50), k=st.integers(1, 9))
def test_property_shards_partition_the_data(n, k):
    shards = [ints(D.range(n).shard(k, i)) for i in range(k)]
    assert sorted(v for s in shards for v in s) == list(range(n))
    assert all(s == list(range(i, n, k)) for i, s in enumerate(shards))
    assert [int(D.range(n).shard(k, i).cardinality()) for i in range(k)] == [len(s) for s in shards]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 30), split=st.integers(-1, 35))
def test_property_take_and_skip_split_the_data(n, split):
    ds = D.range(n)
    assert ints(ds.take(split)) + ints(ds.skip(split)) == list(range(n))
    assert int(ds.take(split).cardinality()) + int(ds.skip(split).cardinality()) == n


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 30),
    batch_size=st.integers(1, 7),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
)
def test_property_rebatch_is_unbatch_then_cut(n, batch_size, sizes):
    out = rows(D.range(n).batch(batch_size).rebatch(sizes))
    assert [v for r in out for v in r] == list(range(n))
    expected_sizes, total, i = [], 0, 0
    while total < n:
        size = min(sizes[i % len(sizes)], n - total)
        expected_sizes.append(size)
        total += size
        i += 1
    assert [len(r) for r in out] == expected_sizes


@pytest.mark.parametrize(
    "make, expected",
    [
        # observed in TensorFlow 2.21 (traced, with no element to run)
        (lambda: D.range(0).map(lambda x: x * 2), td.TensorSpec((), np.int64)),
        (lambda: D.range(0).batch(2).map(lambda x: x * 2), td.TensorSpec((None,), np.int64)),
        (
            lambda: D.range(0).map(lambda x: (x, np.float32(1.0))),
            (td.TensorSpec((), np.int64), td.TensorSpec((), np.float32)),
        ),
    ],
)
def test_map_over_an_empty_input_has_the_spec_of_its_function(make, expected):
    ds = make()
    assert ds.element_spec == expected
    assert list(ds) == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda ds: ds.ragged_batch(2), "ragged_batch\\(\\) makes tf.RaggedTensor batches.*padded_batch"),
        (lambda ds: ds.sparse_batch(2, row_shape=[3]), "sparse_batch\\(\\) makes tf.sparse.SparseTensor.*padded_batch"),
    ],
)
def test_ragged_and_sparse_batches_are_refused_with_the_numpy_alternative(call, message):
    with pytest.raises(td.errors.UnimplementedError, match=message):
        call(D.range(4))
    with pytest.raises(NotImplementedError):  # UnimplementedError is a NotImplementedError too
        call(D.range(4))
