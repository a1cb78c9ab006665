"""Tests of ``td.data``: sources, transformations, cardinality, element specs, options and iterators.

Expected values follow TensorFlow's ``tf.data`` (checked against TensorFlow where the
behaviour is observable).
"""

from __future__ import annotations

import collections
import gc
import gzip
import pickle
import sys
import threading
import time
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td

from iterator_calls import END, next_by

D = td.data.Dataset
INF = td.data.INFINITE_CARDINALITY
UNK = td.data.UNKNOWN_CARDINALITY

Point = collections.namedtuple("Point", ["x", "y"])


# --- helpers ---------------------------------------------------------------------------------


def ints(dataset: D) -> list[int]:
    """The elements of a dataset of scalars, as Python ints."""
    return [int(v) for v in dataset]


def rows(dataset: D) -> list[list[int]]:
    """The elements of a dataset of vectors, as lists of Python ints."""
    return [np.asarray(v).tolist() for v in dataset]


def named_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def assert_threads_gone(prefix: str, before: set[threading.Thread], timeout: float = 15.0) -> None:
    """Every thread named ``prefix*`` started after ``before`` was taken has ended (bounded joins)."""
    deadline = time.monotonic() + timeout
    for thread in named_threads(prefix):
        if thread not in before:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in named_threads(prefix) if t not in before and t.is_alive()]
    assert alive == [], f"threads still alive: {alive}"


def new_threads(prefix: str, before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in named_threads(prefix) if t not in before and t.is_alive()]


def failing_at(index: int, error: BaseException):
    """A map function that returns its argument, except at ``index`` where it raises ``error``."""

    def fn(x):
        if int(x) == index:
            raise error
        return x

    return fn


def generator_failing_after(count: int):
    def gen():
        yield from range(count)
        raise KeyError("generator broke")

    return gen


# --- from_tensor_slices ----------------------------------------------------------------------


def test_from_tensor_slices_tuple():
    ds = D.from_tensor_slices(([1, 2, 3], [4.0, 5.0, 6.0]))
    out = list(ds)
    assert len(out) == 3
    assert all(type(e) is tuple and len(e) == 2 for e in out)
    assert [(int(a), float(b)) for a, b in out] == [(1, 4.0), (2, 5.0), (3, 6.0)]
    assert out[0][0].dtype == np.int32 and out[0][1].dtype == np.float32


def test_from_tensor_slices_dict():
    out = list(D.from_tensor_slices({"b": [1, 2], "a": np.array([[1.0, 2.0], [3.0, 4.0]])}))
    assert [set(e) for e in out] == [{"a", "b"}, {"a", "b"}]
    assert [int(e["b"]) for e in out] == [1, 2]
    np.testing.assert_array_equal(out[1]["a"], [3.0, 4.0])
    assert out[1]["a"].dtype == np.float64
    assert D.from_tensor_slices({"a": [1, 2], "b": [3.0, 4.0]}).element_spec == {
        "a": td.TensorSpec((), td.int32), "b": td.TensorSpec((), td.float32)}


def test_from_tensor_slices_namedtuple_keeps_type():
    out = list(D.from_tensor_slices(Point([1, 2], [3.0, 4.0])))
    assert all(type(e) is Point for e in out)
    assert [(int(p.x), float(p.y)) for p in out] == [(1, 3.0), (2, 4.0)]
    assert D.from_tensor_slices(Point([1, 2], [3.0, 4.0])).element_spec == Point(
        td.TensorSpec((), td.int32), td.TensorSpec((), td.float32)
    )


def test_from_tensor_slices_list_is_a_value_not_a_structure():
    ds = D.from_tensor_slices([1, 2])
    out = list(ds)
    assert [int(v) for v in out] == [1, 2]
    assert all(np.ndim(v) == 0 and np.asarray(v).dtype == np.int32 for v in out)
    assert ds.element_spec == td.TensorSpec((), td.int32)


def test_from_tensor_slices_nested_list_gives_int32_rows():
    ds = D.from_tensor_slices([[1, 2], [3, 4], [5, 6]])
    assert ds.element_spec == td.TensorSpec((2,), td.int32)
    assert rows(ds) == [[1, 2], [3, 4], [5, 6]]


@pytest.mark.parametrize(
    "value, dtype",
    [
        ([1.0, 2.5], np.float32),
        (np.array([1.0, 2.5]), np.float64),
        (np.array([1.0, 2.5], dtype=np.float16), np.float16),
        ([1, 2**40], np.int64),
        ([True, False], np.bool_),
    ],
    ids=["py-float", "np-float64", "np-float16", "big-int", "py-bool"],
)
def test_from_tensor_slices_dtypes(value, dtype):
    ds = D.from_tensor_slices(value)
    assert ds.element_spec == td.TensorSpec((), dtype)
    assert all(np.asarray(v).dtype == dtype for v in ds)


def test_from_tensor_slices_list_of_float64_arrays_keeps_float64():
    ds = D.from_tensor_slices([np.zeros(2), np.ones(2)])
    assert ds.element_spec == td.TensorSpec((2,), td.float64)
    out = list(ds)
    assert [v.dtype for v in out] == [np.float64, np.float64]
    np.testing.assert_array_equal(out[1], [1.0, 1.0])


@pytest.mark.parametrize("value", [["a", "bc"], np.array(["a", "bc"]), [b"a", b"bc"]], ids=["str", "np-str", "bytes"])
def test_from_tensor_slices_strings_become_bytes(value):
    ds = D.from_tensor_slices(value)
    assert list(ds) == [b"a", b"bc"]
    assert ds.element_spec.dtype == td.string
    assert repr(ds.element_spec) == "TensorSpec(shape=(), dtype=tf.string, name=None)"


def test_from_tensor_slices_mismatched_sizes_names_them():
    with pytest.raises(ValueError, match=r"from_tensor_slices\(\) needs every component to have the same size") as info:
        D.from_tensor_slices(([1, 2], [1, 2, 3]))
    assert ": 2" in str(info.value) and ": 3" in str(info.value)


@pytest.mark.parametrize("value", [2.5, np.float32(3), (np.arange(3), 4)], ids=["float", "np", "tuple"])
def test_from_tensor_slices_scalar_component_is_rejected(value):
    with pytest.raises(ValueError, match=r"from_tensor_slices\(\) slices every component along dimension 0"):
        D.from_tensor_slices(value)


def test_from_tensor_slices_elements_are_read_only():
    source = np.arange(6).reshape(3, 2)
    ds = D.from_tensor_slices(source)
    first = next(iter(ds))
    assert not first.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 100
    assert rows(ds) == [[0, 1], [2, 3], [4, 5]]


def test_from_tensor_slices_is_isolated_from_later_changes_to_the_source():
    source = np.arange(6).reshape(3, 2)
    ds = D.from_tensor_slices((source, source[:, 0]))
    source[:] = -1
    assert source.flags.writeable  # the caller's array is left alone
    out = list(ds)
    assert [e[0].tolist() for e in out] == [[0, 1], [2, 3], [4, 5]]
    assert [int(e[1]) for e in out] == [0, 2, 4]
    with pytest.raises(ValueError, match="read-only"):
        out[0][0][0] = 7


def test_from_tensors_single_element():
    ds = D.from_tensors(([1.0], [2]))
    out = list(ds)
    assert len(out) == 1 and len(ds) == 1
    x, y = out[0]
    assert x.dtype == np.float32 and y.dtype == np.int32
    assert x.tolist() == [1.0] and y.tolist() == [2]
    assert ds.element_spec == (td.TensorSpec((1,), td.float32), td.TensorSpec((1,), td.int32))


def test_from_tensors_element_is_read_only_copy():
    source = np.zeros(3)
    ds = D.from_tensors(source)
    source[0] = 5.0
    element = next(iter(ds))
    assert element.tolist() == [0.0, 0.0, 0.0]
    assert not element.flags.writeable


# --- range ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [(5,), (2, 10, 3), (5, 0, -2), (0,), (3, 1)])
def test_range_matches_python_range(args):
    ds = D.range(*args)
    assert ints(ds) == list(range(*args))
    assert ds.cardinality() == len(range(*args))


def test_range_defaults_to_int64():
    ds = D.range(3)
    assert ds.element_spec == td.TensorSpec((), td.int64)
    assert all(np.asarray(v).dtype == np.int64 for v in ds)


@pytest.mark.parametrize("dtype", [td.int32, td.float32])
def test_range_output_type(dtype):
    ds = D.range(1, 4, output_type=dtype)
    assert ds.element_spec == td.TensorSpec((), dtype)
    out = list(ds)
    assert [np.asarray(v).dtype for v in out] == [dtype] * 3
    assert [int(v) for v in out] == [1, 2, 3]


def test_range_argument_errors():
    with pytest.raises(TypeError, match=r"range\(\) takes 1 to 3 arguments"):
        D.range()
    with pytest.raises(TypeError, match=r"range\(\) takes 1 to 3 arguments"):
        D.range(1, 2, 3, 4)


def test_range_zero_step_is_invalid_argument():
    with pytest.raises(td.errors.InvalidArgumentError, match=r"range\(\) step must not be zero"):
        D.range(0, 5, 0)


# --- from_generator --------------------------------------------------------------------------


def test_from_generator_converts_to_the_signature():
    signature = (td.TensorSpec((), td.float32), td.TensorSpec((2,), td.int64))
    ds = D.from_generator(lambda: iter([(1, [1, 2]), (2.5, [3, 4])]), output_signature=signature)
    assert ds.element_spec == signature
    out = list(ds)
    assert [float(a) for a, _ in out] == [1.0, 2.5]
    assert [b.tolist() for _, b in out] == [[1, 2], [3, 4]]
    assert all(np.asarray(a).dtype == np.float32 and b.dtype == np.int64 for a, b in out)


def test_from_generator_unknown_dims_accept_any_size():
    ds = D.from_generator(lambda: (np.arange(n) for n in (1, 3)), output_signature=td.TensorSpec((None,), td.int32))
    assert rows(ds) == [[0], [0, 1, 2]]
    assert all(v.dtype == np.int32 for v in ds)


def test_from_generator_shape_mismatch_is_invalid_argument():
    ds = D.from_generator(lambda: iter([np.zeros(2), np.zeros(3)]), output_signature=td.TensorSpec((2,), td.float64))
    it = iter(ds)
    assert next(it).shape == (2,)
    with pytest.raises(td.errors.InvalidArgumentError, match=r"`generator` yielded an element of shape \(3,\)"):
        next(it)


def test_from_generator_structure_mismatch_is_type_error():
    signature = (td.TensorSpec((), td.int32), td.TensorSpec((), td.int32))
    ds = D.from_generator(lambda: iter([1]), output_signature=signature)
    with pytest.raises(TypeError, match="`generator` yielded an element that did not match the expected structure"):
        list(ds)


def test_from_generator_without_signature_learns_structure_with_unknown_dims():
    ds = D.from_generator(lambda: iter([(np.zeros((2, 3)), 1), (np.ones((4, 1)), 2)]))
    assert ds.element_spec == (td.TensorSpec((None, None), td.float64), td.TensorSpec((), td.int32))
    out = list(ds)
    assert [a.shape for a, _ in out] == [(2, 3), (4, 1)]
    assert [int(b) for _, b in out] == [1, 2]


def test_from_generator_without_signature_empty_has_no_spec():
    with pytest.raises(ValueError, match="Cannot determine the element_spec"):
        D.from_generator(lambda: iter([])).element_spec  # noqa: B018


def test_from_generator_args_and_new_call_per_pass():
    calls = []

    def gen(n, step):
        calls.append((n, step))
        yield from range(0, n, step)

    ds = D.from_generator(gen, args=(7, 3), output_signature=td.TensorSpec((), td.int64))
    assert ints(ds) == [0, 3, 6]
    assert ints(ds) == [0, 3, 6]
    assert calls == [(7, 3), (7, 3)]


def test_from_generator_output_types_and_shapes():
    ds = D.from_generator(
        lambda: iter([(np.zeros((2, 3)), 1)]), output_types=(td.float32, td.int64), output_shapes=((2, None), ())
    )
    assert ds.element_spec == (td.TensorSpec((2, None), td.float32), td.TensorSpec((), td.int64))
    (x, y), = list(ds)
    assert x.dtype == np.float32 and x.shape == (2, 3)
    assert np.asarray(y).dtype == np.int64


def test_from_generator_output_types_only_has_unknown_rank():
    ds = D.from_generator(lambda: iter([np.zeros((2, 2))]), output_types=td.float32)
    assert ds.element_spec.shape is None and ds.element_spec.dtype == td.float32
    assert [v.shape for v in ds] == [(2, 2)]


@pytest.mark.parametrize("generator", [[1, 2, 3], iter([1, 2])], ids=["list", "iterator"])
def test_from_generator_needs_a_callable(generator):
    with pytest.raises(TypeError, match=r"from_generator\(\) takes a callable"):
        D.from_generator(generator, output_signature=td.TensorSpec((), td.int32))


def test_from_generator_rejects_signature_and_types_together():
    with pytest.raises(TypeError, match=r"from_generator\(\) takes either output_signature or output_types"):
        D.from_generator(lambda: iter([1]), output_types=td.int32, output_signature=td.TensorSpec((), td.int32))


def test_from_generator_exception_keeps_type_and_notes_element_count():
    ds = D.from_generator(generator_failing_after(2), output_signature=td.TensorSpec((), td.int64))
    it = iter(ds)
    assert [int(next(it)), int(next(it))] == [0, 1]
    with pytest.raises(KeyError, match="generator broke") as info:
        next(it)
    assert any("after 2 elements" in note for note in info.value.__notes__)


def test_from_generator_cardinality_is_unknown():
    assert D.from_generator(lambda: iter([1]), output_signature=td.TensorSpec((), td.int32)).cardinality() == UNK


# --- zip ----------------------------------------------------------------------------------------


def test_zip_positional_and_tuple_are_the_same():
    a, b = D.range(3), D.range(10, 13)
    expected = [(0, 10), (1, 11), (2, 12)]
    assert [(int(x), int(y)) for x, y in D.zip(a, b)] == expected
    assert [(int(x), int(y)) for x, y in D.zip((a, b))] == expected
    assert [(int(x), int(y)) for x, y in D.zip(datasets=(a, b))] == expected
    assert D.zip(a, b).element_spec == (td.TensorSpec((), td.int64),) * 2


def test_zip_dict_and_nested():
    out = list(D.zip({"x": D.range(2), "y": D.from_tensor_slices(["a", "b"])}))
    assert [(int(e["x"]), e["y"]) for e in out] == [(0, b"a"), (1, b"b")]
    nested = list(D.zip((D.range(2), (D.range(2, 4), D.range(4, 6)))))
    assert [(int(a), int(b), int(c)) for a, (b, c) in nested] == [(0, 2, 4), (1, 3, 5)]


def test_zip_single_dataset_is_not_wrapped():
    assert ints(D.zip(D.range(3))) == [0, 1, 2]


def test_zip_stops_at_shortest():
    out = list(D.zip(D.range(3), D.range(100).repeat()))
    assert [(int(a), int(b)) for a, b in out] == [(0, 0), (1, 1), (2, 2)]


@pytest.mark.parametrize(
    "make", [lambda: D.zip([D.range(2), D.range(2)]), lambda: D.zip((D.range(2), [D.range(2)]))], ids=["list", "nested"]
)
def test_zip_rejects_lists(make):
    with pytest.raises(TypeError, match="Invalid input to `zip`.*Python `list` is not supported"):
        make()


@pytest.mark.parametrize("other", [3, np.arange(3)], ids=["int", "array"])
def test_zip_rejects_non_datasets(other):
    with pytest.raises(TypeError, match="Invalid input to `zip`"):
        D.zip(D.range(2), other)


def test_zip_needs_a_dataset():
    with pytest.raises(TypeError, match=r"zip\(\) needs at least one dataset"):
        D.zip()


# --- list_files and TextLineDataset -------------------------------------------------------------


@pytest.fixture
def text_files(tmp_path):
    names = ["c.txt", "a.txt", "e.txt", "b.txt", "d.txt"]
    for name in names:
        (tmp_path / name).write_bytes(f"{name[0]}1\n{name[0]}2\n".encode())
    (tmp_path / "other.log").write_bytes(b"log\n")
    return tmp_path, sorted(str(tmp_path / n).encode() for n in names)


def test_list_files_unshuffled_is_sorted_bytes(text_files):
    directory, expected = text_files
    ds = D.list_files(str(directory / "*.txt"), shuffle=False)
    assert list(ds) == expected
    assert ds.element_spec == td.TensorSpec((), td.string)


def test_list_files_shuffles_by_default_and_is_seeded(text_files):
    directory, expected = text_files
    pattern = str(directory / "*.txt")
    first = list(D.list_files(pattern, seed=7))
    assert sorted(first) == expected
    assert list(D.list_files(pattern, seed=7)) == first
    orders = {tuple(D.list_files(pattern, seed=s)) for s in range(6)}
    assert len(orders) > 1  # the default shuffles


def test_list_files_list_of_patterns(text_files):
    directory, expected = text_files
    ds = D.list_files([str(directory / "*.log"), str(directory / "a.txt")], shuffle=False)
    assert list(ds) == sorted([str(directory / "a.txt").encode(), str(directory / "other.log").encode()])


def test_list_files_without_match(tmp_path):
    with pytest.raises(td.errors.InvalidArgumentError, match="No files matched pattern"):
        D.list_files(str(tmp_path / "*.nothing"))


def test_text_line_dataset_strips_line_endings(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_bytes(b"first\nsecond\r\n\nlast")
    ds = td.data.TextLineDataset(str(path))
    assert list(ds) == [b"first", b"second", b"", b"last"]
    assert ds.element_spec == td.TensorSpec((), td.string)
    assert ds.cardinality() == UNK


def test_text_line_dataset_several_files_in_order(text_files):
    directory, _ = text_files
    names = [str(directory / "b.txt"), str(directory / "a.txt")]
    assert list(td.data.TextLineDataset(names)) == [b"b1", b"b2", b"a1", b"a2"]
    assert list(td.data.TextLineDataset(directory / "a.txt")) == [b"a1", b"a2"]  # a PathLike


def test_text_line_dataset_from_a_dataset_of_names(text_files):
    directory, expected = text_files
    ds = td.data.TextLineDataset(D.list_files(str(directory / "*.txt"), shuffle=False))
    assert list(ds) == [f"{c}{i}".encode() for c in "abcde" for i in (1, 2)]
    names = D.from_tensor_slices([str(directory / "e.txt"), str(directory / "c.txt")])
    assert list(td.data.TextLineDataset(names)) == [b"e1", b"e2", b"c1", b"c2"]


@pytest.mark.parametrize(
    "kind, compress",
    [("GZIP", gzip.compress), ("ZLIB", zlib.compress), ("gzip", gzip.compress), (None, lambda b: b)],
)
def test_text_line_dataset_compression(tmp_path, kind, compress):
    path = tmp_path / "data.bin"
    path.write_bytes(compress(b"alpha\r\nbeta\ngamma\n"))
    assert list(td.data.TextLineDataset(str(path), compression_type=kind)) == [b"alpha", b"beta", b"gamma"]


def test_text_line_dataset_bad_compression(tmp_path):
    with pytest.raises(ValueError, match="compression_type must be"):
        td.data.TextLineDataset(str(tmp_path / "x"), compression_type="BZIP2")


def test_text_line_dataset_missing_file_is_not_found(tmp_path):
    with pytest.raises(td.errors.NotFoundError, match="No such file or directory"):
        list(td.data.TextLineDataset(str(tmp_path / "missing.txt")))


def test_text_line_dataset_directory_is_a_failed_precondition(tmp_path):
    # TensorFlow 2.21 raises FailedPreconditionError for a directory.
    with pytest.raises(td.errors.FailedPreconditionError, match="Is a directory"):
        list(td.data.TextLineDataset(str(tmp_path)))


@pytest.mark.parametrize(
    "kind, payload",
    [
        ("GZIP", b"not gzip at all\n"),
        ("GZIP", gzip.compress(b"alpha\nbeta\n" * 100)[:-12]),  # truncated
        ("ZLIB", b"not zlib\n"),
    ],
    ids=["gzip-garbage", "gzip-truncated", "zlib-garbage"],
)
def test_text_line_dataset_corrupt_compressed_file_is_data_loss(tmp_path, kind, payload):
    # TensorFlow 2.21 raises DataLossError for corrupt compressed input.
    path = tmp_path / "data.bin"
    path.write_bytes(payload)
    with pytest.raises(td.errors.DataLossError, match=f"data.bin is not valid {kind} data") as info:
        list(td.data.TextLineDataset(str(path), compression_type=kind))
    assert info.value.path == str(path)


def test_text_line_dataset_unreadable_file_is_permission_denied(tmp_path, monkeypatch):
    # chmod does not stop root (CI runs as root), so the refusal is the operating system's error itself.
    from towerdist._src.data import files

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(files, "open", refuse, raising=False)
    with pytest.raises(td.errors.PermissionDeniedError, match="secret.txt; Permission denied"):
        list(td.data.TextLineDataset(str(tmp_path / "secret.txt")))


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
    with pytest.raises(KeyError, match="generator broke") as info:
        next(it)
    assert any("after 3 elements" in note for note in info.value.__notes__)
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


# --- cardinality ---------------------------------------------------------------------------------


def _shuffled():
    return D.range(10).shuffle(4, seed=0)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: D.range(10), 10),
        (lambda: D.range(10).batch(3), 4),
        (lambda: D.range(10).batch(3, drop_remainder=True), 3),
        (lambda: D.range(10).filter(lambda x: True), UNK),
        (lambda: D.range(10).repeat(), INF),
        (lambda: D.range(10).repeat(3), 30),
        (lambda: D.range(10).repeat(0), 0),
        (lambda: D.range(10).take(3), 3),
        (lambda: D.range(10).skip(3), 7),
        (lambda: D.range(10).skip(30), 0),
        (lambda: D.range(10).repeat().take(5), 5),
        (lambda: D.range(10).repeat().skip(5), INF),
        (lambda: D.range(10).take(-1), 10),
        (lambda: D.range(10).skip(-1), 0),
        (lambda: D.range(10).shard(3, 0), 4),
        (lambda: D.range(10).shard(3, 1), 3),
        (lambda: D.range(10).shard(3, 2), 3),
        (lambda: D.range(10).batch(3).unbatch(), UNK),
        (lambda: D.from_generator(lambda: iter([1]), output_signature=td.TensorSpec((), td.int32)), UNK),
        (lambda: D.zip(D.range(3), D.range(5)), 3),
        (lambda: D.zip(D.range(3).repeat(), D.range(5)), 5),
        (lambda: D.zip(D.range(3).repeat(), D.range(5).repeat()), INF),
        (lambda: D.range(10).enumerate(), 10),
        (lambda: D.range(10).cache(), 10),
        (_shuffled, 10),
        (lambda: D.range(10).map(lambda x: x), 10),
        (lambda: D.range(10).prefetch(2), 10),
        (lambda: D.range(0).repeat(), 0),
        (lambda: D.range(10).filter(lambda x: True).repeat(3), UNK),
        (lambda: D.range(10).filter(lambda x: True).repeat(), INF),
        (lambda: D.range(10).repeat().batch(4), INF),
        (lambda: D.range(10).repeat().shard(2, 1), INF),
        (lambda: D.range(10).repeat().take(0), 0),
        (lambda: D.from_tensors([1, 2]), 1),
        (lambda: D.range(10).with_options(td.data.Options()), 10),
    ],
)
def test_cardinality(make, expected):
    ds = make()
    n = ds.cardinality()
    assert isinstance(n, np.int64)
    assert n == expected


@pytest.mark.parametrize(
    "make",
    [lambda: D.range(10).repeat(3), lambda: D.range(10).shard(3, 2), lambda: D.range(10).batch(4).take(2)],
)
def test_cardinality_matches_element_count(make):
    ds = make()
    assert ds.cardinality() == len(list(ds))


def test_cardinality_constants():
    assert td.data.INFINITE_CARDINALITY == -1 == td.data.experimental.INFINITE_CARDINALITY
    assert td.data.UNKNOWN_CARDINALITY == -2 == td.data.experimental.UNKNOWN_CARDINALITY


def test_cardinality_skip_all_of_infinite_stays_infinite():
    assert D.range(3).repeat().skip(-1).cardinality() == INF


def test_len_of_finite():
    assert len(D.range(10).batch(3)) == 4
    assert len(D.range(0)) == 0


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: D.range(3).repeat(), "The dataset is infinite"),
        (lambda: D.range(3).filter(lambda x: True), "The dataset length is unknown"),
    ],
)
def test_len_of_infinite_or_unknown(make, message):
    with pytest.raises(TypeError, match=message):
        len(make())


def test_empty_dataset_is_truthy():
    assert bool(D.range(0)) is True


# --- element_spec and TensorSpec -----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, text",
    [
        (td.TensorSpec((None, 1), td.float32), "TensorSpec(shape=(None, 1), dtype=tf.float32, name=None)"),
        (td.TensorSpec((), td.int64), "TensorSpec(shape=(), dtype=tf.int64, name=None)"),
        (td.TensorSpec([3], td.string, name="s"), "TensorSpec(shape=(3,), dtype=tf.string, name='s')"),
        (td.TensorSpec((2, None, 4), td.bool), "TensorSpec(shape=(2, None, 4), dtype=tf.bool, name=None)"),
        (td.TensorSpec((5,)), "TensorSpec(shape=(5,), dtype=tf.float32, name=None)"),
    ],
)
def test_tensor_spec_repr_like_tensorflow(spec, text):
    assert repr(spec) == text


def test_tensor_spec_repr_unknown_rank():
    assert repr(td.TensorSpec(None, td.float32)) == "TensorSpec(shape=<unknown>, dtype=tf.float32, name=None)"


def test_element_spec_of_batched_repeat():
    spec = D.from_tensors(([1.0], [2])).repeat(100).batch(16).element_spec
    assert spec == (td.TensorSpec((None, 1), td.float32), td.TensorSpec((None, 1), td.int32))
    assert repr(spec) == (
        "(TensorSpec(shape=(None, 1), dtype=tf.float32, name=None), "
        "TensorSpec(shape=(None, 1), dtype=tf.int32, name=None))"
    )


def test_tensor_spec_properties():
    spec = td.TensorSpec([None, 2], td.int32, name="x")
    assert spec.shape == (None, 2)
    assert spec.dtype == np.int32
    assert spec.rank == 2
    assert spec.name == "x"
    assert td.TensorSpec(None).rank is None


@pytest.mark.parametrize(
    "other, expected",
    [
        (td.TensorSpec((3, 2), td.float32), True),
        (td.TensorSpec((None, 2), td.float32), True),
        (td.TensorSpec(None, td.float32), True),
        (td.TensorSpec((3, 2), td.float32, name="other"), True),
        (td.TensorSpec((3, 3), td.float32), False),
        (td.TensorSpec((3, 2), td.float64), False),
        (np.zeros((7, 2), np.float32), True),
        (np.zeros((7, 2), np.float64), False),
        (np.zeros((7, 2, 1), np.float32), False),
    ],
)
def test_tensor_spec_is_compatible_with(other, expected):
    assert td.TensorSpec((None, 2), td.float32).is_compatible_with(other) is expected


def test_tensor_spec_equality_and_hash():
    a = td.TensorSpec((None, 2), td.float32)
    b = td.TensorSpec([None, 2], np.float32)
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != td.TensorSpec((None, 2), td.float32, name="n")
    assert a != td.TensorSpec((None, 3), td.float32)
    assert a != td.TensorSpec((None, 2), td.int32)
    assert a != "TensorSpec"


def test_tensor_spec_from_tensor():
    assert td.TensorSpec.from_tensor(np.zeros((2, 3), np.int16)) == td.TensorSpec((2, 3), td.int16)


def test_dataset_repr_shows_spec():
    assert repr(D.range(3)) == "<RangeDataset element_spec=TensorSpec(shape=(), dtype=tf.int64, name=None)>"


# --- options ---------------------------------------------------------------------------------------


def test_options_default_auto():
    assert td.data.Options().experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO
    assert D.range(3).options().experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO


@pytest.mark.parametrize("name, value", [("OFF", -1), ("AUTO", 0), ("FILE", 1), ("DATA", 2), ("HINT", 3)])
def test_auto_shard_policy_values(name, value):
    policy = getattr(td.data.experimental.AutoShardPolicy, name)
    assert int(policy) == value
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    ds = D.range(6).with_options(options).batch(2).map(lambda x: x)
    assert ds.options().experimental_distribute.auto_shard_policy == policy
    assert rows(ds) == [[0, 1], [2, 3], [4, 5]]


def test_auto_shard_policy_accepts_int():
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = 2
    assert options.experimental_distribute.auto_shard_policy is td.data.experimental.AutoShardPolicy.DATA


@pytest.mark.parametrize("value", [7, "DATA"])
def test_auto_shard_policy_invalid(value):
    options = td.data.Options()
    with pytest.raises(ValueError, match="auto_shard_policy must be"):
        options.experimental_distribute.auto_shard_policy = value
    assert options.experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO


@pytest.mark.parametrize("value", [None, {"auto_shard_policy": 1}])
def test_with_options_needs_options(value):
    with pytest.raises(TypeError, match=r"with_options\(\) takes a td.data.Options"):
        D.range(3).with_options(value)


def test_options_do_not_leak_to_the_input():
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = td.data.experimental.AutoShardPolicy.OFF
    base = D.range(3)
    base.with_options(options)
    assert base.options().experimental_distribute.auto_shard_policy == td.data.experimental.AutoShardPolicy.AUTO


def test_later_with_options_overrides_earlier():
    policy = td.data.experimental.AutoShardPolicy
    off, data = td.data.Options(), td.data.Options()
    off.experimental_distribute.auto_shard_policy = policy.OFF
    data.experimental_distribute.auto_shard_policy = policy.DATA
    ds = D.range(3).with_options(off).map(lambda x: x).with_options(data)
    assert ds.options().experimental_distribute.auto_shard_policy == policy.DATA


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
