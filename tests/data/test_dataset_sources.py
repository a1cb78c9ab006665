"""``td.data`` sources: ``from_tensor_slices``, ``range``, ``from_generator``, ``zip``, ``list_files`` and ``TextLineDataset``.

Expected values follow TensorFlow's ``tf.data`` (checked against TensorFlow where the
behaviour is observable).
"""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest

import towerdist as td

from dataset_helpers import UNK, D, Point, generator_failing_after, ints, rows

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


def test_from_generator_structure_mismatch_is_invalid_argument():
    # TF 2.21: InvalidArgumentError("... TypeError: `generator` yielded an element that did not match the
    # expected structure. The expected structure was (...), but the yielded element was 1.")
    signature = (td.TensorSpec((), td.int32), td.TensorSpec((), td.int32))
    ds = D.from_generator(lambda: iter([1]), output_signature=signature)
    with pytest.raises(
        td.errors.InvalidArgumentError,
        match="TypeError: `generator` yielded an element that did not match the expected structure",
    ):
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


def test_from_generator_exception_is_tensorflows_class_with_the_original_as_cause():
    # TF 2.21: UnknownError("... KeyError: 'generator broke' ...") (a KeyError has no better class).
    ds = D.from_generator(generator_failing_after(2), output_signature=td.TensorSpec((), td.int64))
    it = iter(ds)
    assert [int(next(it)), int(next(it))] == [0, 1]
    with pytest.raises(td.errors.UnknownError, match="^KeyError: 'generator broke'") as info:
        next(it)
    assert "by the generator, after 2 elements" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)
    assert list(it) == []  # the generator has ended (TF 2.21: end of sequence)


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
