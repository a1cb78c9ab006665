"""``Dataset.save`` and ``Dataset.load`` (and ``td.data.experimental.save``/``load``): towerdist's
versioned on-disk format, round trips, atomic replacement, and refusal of damaged input.

The round-trip facts (element spec and cardinality known after load, strings kept, an empty
dataset keeps its spec, a second save replaces the first) were observed in TensorFlow 2.21; the
format itself is towerdist's own (TensorFlow's snapshot files cannot be read).
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import struct
import zlib

import numpy as np
import pytest

import towerdist as td
from towerdist._src import nest
from towerdist._src.atomic_file import is_temporary
from towerdist._src.data import persistence
from towerdist._src.data.interleave import default_cycle_length

D = td.data.Dataset
TS = td.TensorSpec

pytestmark = pytest.mark.timeout(60)

Point = collections.namedtuple("Point", ["x", "y"])


def mixed() -> D:
    """The dataset TensorFlow 2.21 was checked with: a dict with int64 and strings, and float32 rows."""
    return D.from_tensor_slices(
        (
            {"x": np.arange(6), "s": np.array([b"a", b"bb", b"", b"c", b"d", b"e"], dtype=object)},
            np.arange(6.0, dtype=np.float32).reshape(6, 1),
        )
    )


def same_elements(a: D, b: D) -> None:
    left, right = list(a), list(b)
    assert len(left) == len(right)
    for x, y in zip(left, right, strict=True):
        lx, tx = nest.flatten(x)
        ly, ty = nest.flatten(y)
        assert tx == ty
        for u, v in zip(lx, ly, strict=True):
            assert np.asarray(u).dtype == np.asarray(v).dtype
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def manifest_of(path) -> dict:
    with open(os.path.join(path, persistence.MANIFEST), encoding="utf-8") as f:
        return json.load(f)


def write_manifest(path, manifest: dict) -> None:
    with open(os.path.join(path, persistence.MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f)


def shard_path(path, number: int = 0) -> str:
    return os.path.join(path, manifest_of(path)["shards"][number]["file"])


@pytest.fixture
def cycle_length(monkeypatch):
    """Pins the default reader's cycle length (the CPU cores) to what a test passes to it."""

    def pin(value: int) -> None:
        monkeypatch.setattr(persistence, "default_cycle_length", lambda: value)

    return pin


def interleaved(shards: list[list[int]], cycle: int) -> list[int]:
    """``interleave(lambda s: s, cycle_length=cycle)`` over ``shards`` (block length 1), as TensorFlow runs it.

    A slot finds its input exhausted only when the cycle next comes to it: it gives up that turn
    and takes the next input on the turn after.
    """
    pending = [iter(shard) for shard in shards]
    slots: list[object] = [None] * cycle
    out: list[int] = []
    i = 0
    while pending or any(slot is not None for slot in slots):
        slot = slots[i]
        if slot is None:
            if pending:
                slots[i] = pending.pop(0)
                continue
        else:
            try:
                out.append(next(slot))  # type: ignore[call-overload]
            except StopIteration:
                slots[i] = None
        i = (i + 1) % cycle
    return out


# --- round trips ------------------------------------------------------------------------------------


def test_round_trip_keeps_elements_spec_and_cardinality(tmp_path):
    # observed in TensorFlow 2.21: the spec and cardinality 6 come back with the elements
    path = tmp_path / "saved"
    mixed().save(str(path))
    loaded = D.load(str(path))
    assert loaded.element_spec == mixed().element_spec
    assert loaded.cardinality() == 6
    same_elements(loaded, mixed())
    first = next(iter(loaded))
    assert first[0]["s"] == b"a"
    assert isinstance(first[0]["x"], np.int64)


def test_loaded_string_arrays_are_read_only(tmp_path):
    D.from_tensors(np.array([b"a", b"b"], dtype=object)).save(str(tmp_path / "d"))
    row = next(iter(D.load(str(tmp_path / "d"))))
    with pytest.raises(ValueError, match="read-only"):
        row[0] = b"c"


def test_loaded_arrays_are_read_only(tmp_path):
    D.from_tensor_slices(np.ones((2, 3))).save(str(tmp_path / "d"))
    row = next(iter(D.load(str(tmp_path / "d"))))
    with pytest.raises(ValueError, match="read-only"):
        row[0] = 2.0


def test_cardinality_is_known_after_load_even_when_it_was_not(tmp_path):
    # observed in TensorFlow 2.21: range(10).filter(x < 5) loads with cardinality 5
    D.range(10).filter(lambda x: x < 5).save(str(tmp_path / "f"))
    loaded = D.load(str(tmp_path / "f"))
    assert loaded.cardinality() == 5
    assert [int(v) for v in loaded] == [0, 1, 2, 3, 4]


def test_empty_dataset_round_trip(tmp_path):
    # observed in TensorFlow 2.21: cardinality 0, spec kept
    D.range(0).save(str(tmp_path / "e"))
    loaded = D.load(str(tmp_path / "e"))
    assert list(loaded) == []
    assert loaded.cardinality() == 0
    assert loaded.element_spec == TS((), np.int64)


def test_spec_learnt_from_the_elements_when_not_static(tmp_path):
    # map's spec is known only by running it: the saved spec is the elements' common one
    D.range(1, 4).map(lambda x: (np.full(int(x), x), np.float32(x))).save(str(tmp_path / "m"))
    loaded = D.load(str(tmp_path / "m"))
    assert loaded.element_spec == (TS((None,), np.int64), TS((), np.float32))
    assert [a.tolist() for a, _ in loaded] == [[1], [2, 2], [3, 3, 3]]


def test_empty_dataset_whose_spec_is_known_only_by_running_it_is_saved(tmp_path):
    # observed in TensorFlow 2.21: range(3).map(x * 2).filter(x > 100) saves; it loads empty with
    # TensorSpec((), tf.int64)
    D.range(3).map(lambda x: x * 2).filter(lambda x: x > 100).save(str(tmp_path / "u"))
    loaded = D.load(str(tmp_path / "u"))
    assert loaded.element_spec == TS((), np.int64)
    assert loaded.cardinality() == 0
    assert list(loaded) == []


def test_empty_map_is_saved_with_its_traced_spec(tmp_path):
    # observed in TensorFlow 2.21: range(0).map(x * 2) saves and loads with TensorSpec((), tf.int64)
    D.range(0).map(lambda x: x * 2).save(str(tmp_path / "u"))
    assert D.load(str(tmp_path / "u")).element_spec == TS((), np.int64)


def test_empty_dataset_of_undeterminable_spec_cannot_be_saved(tmp_path):
    with pytest.raises(ValueError, match="cannot save this empty dataset: its element_spec is known only by running"):
        D.from_generator(lambda: iter([])).save(str(tmp_path / "u"))
    assert not os.path.exists(tmp_path / "u" / persistence.MANIFEST)


@pytest.mark.parametrize(
    "element",
    [
        np.array([[1, 2], [3, 4]], np.uint16),
        np.array([True, False]),
        np.array([1 + 2j], np.complex64),
        np.float16(1.5),
        np.array([[b"x", b"yz"]], dtype=object),
        np.zeros((0, 3), np.int8),
    ],
    ids=["uint16", "bool", "complex64", "float16-scalar", "strings", "empty-rows"],
)
def test_dtypes_and_shapes_round_trip(tmp_path, element):
    D.from_tensors(element).save(str(tmp_path / "t"))
    (back,) = list(D.load(str(tmp_path / "t")))
    assert np.asarray(back).dtype == np.asarray(element).dtype
    assert np.asarray(back).shape == np.shape(element)
    np.testing.assert_array_equal(np.asarray(back), np.asarray(element))


def test_namedtuple_elements_come_back_as_namedtuples(tmp_path):
    # observed in TensorFlow 2.21: without element_spec, a namedtuple class named Point with the fields
    D.from_tensor_slices(Point(np.arange(2), np.arange(2.0))).save(str(tmp_path / "p"))
    loaded = D.load(str(tmp_path / "p"))
    first = next(iter(loaded))
    assert type(first).__name__ == "Point" and first._fields == ("x", "y")
    assert int(first.x) == 0


def test_load_accepts_the_namedtuple_spec_it_was_saved_with(tmp_path):
    # observed in TensorFlow 2.21: load(element_spec=Point(...)) returns elements of the user's class Point
    path = str(tmp_path / "p")
    D.from_tensor_slices(Point(np.arange(2), np.arange(2.0))).save(path)
    spec = Point(TS((), np.int64), TS((), np.float64))
    loaded = D.load(path, element_spec=spec)
    assert loaded.element_spec == spec
    first = next(iter(loaded))
    assert type(first) is Point
    assert (int(first.x), float(first.y)) == (0, 0.0)


def test_load_builds_nested_namedtuples_with_the_given_classes(tmp_path):
    path = str(tmp_path / "p")
    D.from_tensors({"p": Point(np.int64(1), np.arange(3.0)), "n": np.int32(2)}).save(path)
    spec = {"n": TS((), np.int32), "p": Point(TS((), np.int64), TS((None,), np.float64))}
    (element,) = list(D.load(path, element_spec=spec))
    assert type(element["p"]) is Point and list(element) == ["n", "p"]
    assert element["p"].y.tolist() == [0.0, 1.0, 2.0]


Pair = collections.namedtuple("Pair", ["x", "y"])
PointXZ = collections.namedtuple("Point", ["x", "z"])


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (Pair(TS((), np.int64), TS((), np.float64)), r"at the top level: given Pair\(.*saved a namedtuple Point"),
        (PointXZ(TS((), np.int64), TS((), np.float64)), r"at the top level: .*saved a namedtuple Point\('x', 'y'\)"),
        ((TS((), np.int64), TS((), np.float64)), "at the top level: .*saved a namedtuple Point"),
        (Point(TS((), np.int64), TS((), np.float32)), r"at \[1\]: given TensorSpec\(shape=\(\), dtype=tf.float32"),
    ],
    ids=["other-name", "other-fields", "plain-tuple", "component-dtype"],
)
def test_load_refuses_a_namedtuple_spec_of_another_name_or_fields(tmp_path, spec, match):
    # TensorFlow 2.21 accepts any structure with the same components (it returned Pair and tuple elements);
    # towerdist checks the name and fields the manifest keeps
    path = str(tmp_path / "p")
    D.from_tensor_slices(Point(np.arange(2), np.arange(2.0))).save(path)
    with pytest.raises(td.errors.InvalidArgumentError, match="element_spec does not match") as info:
        D.load(path, element_spec=spec)
    assert info.match(match)


def test_gzip_round_trip_and_the_file_is_gzip(tmp_path):
    # observed in TensorFlow 2.21: compression="GZIP" round trips
    path = str(tmp_path / "g")
    mixed().save(path, compression="GZIP")
    same_elements(D.load(path, compression="GZIP"), mixed())
    with gzip.open(shard_path(path), "rb") as f:
        assert f.read(8) == b"TDSHARD1"


def test_load_with_another_compression_is_data_loss(tmp_path):
    # observed in TensorFlow 2.21: loading a GZIP save without compression raises DataLossError
    path = str(tmp_path / "g")
    mixed().save(path, compression="GZIP")
    with pytest.raises(td.errors.DataLossError, match="saved with compression='GZIP'"):
        D.load(path)


def test_unknown_compression_is_refused(tmp_path):
    # TensorFlow 2.21 accepts any string silently; towerdist names the ones it supports
    with pytest.raises(td.errors.InvalidArgumentError, match="compression=None or 'GZIP'"):
        D.range(3).save(str(tmp_path / "z"), compression="ZLIB")


def test_shard_func_writes_one_file_per_shard(tmp_path):
    # observed in TensorFlow 2.21: 3 shard files, cardinality 10 after load
    path = str(tmp_path / "s")
    D.range(10).save(path, shard_func=lambda x: x % 3)
    manifest = manifest_of(path)
    assert [s["index"] for s in manifest["shards"]] == [0, 1, 2]
    assert [s["elements"] for s in manifest["shards"]] == [4, 3, 3]
    assert D.load(path).cardinality() == 10


@pytest.mark.parametrize(
    ("modulus", "cycle", "observed"),
    [(2, 2, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), (3, 2, [0, 1, 3, 4, 6, 7, 9, 2, 5, 8])],
    ids=["2-shards", "3-shards"],
)
def test_default_reader_order_is_tensorflows_on_two_cores(tmp_path, cycle_length, modulus, cycle, observed):
    # observed in TensorFlow 2.21 on 2 CPU cores: load() of range(10).save(shard_func=x % modulus)
    cycle_length(cycle)
    path = str(tmp_path / "s")
    D.range(10).save(path, shard_func=lambda x: x % modulus)
    assert [int(v) for v in D.load(path)] == observed


def uneven(x):
    """Shards of 3, 3, 10, 2 and 2 elements: which slot runs out first matters."""
    return x % 5 if x < 12 else np.int64(2)


UNEVEN_SHARDS = [[0, 5, 10], [1, 6, 11], [2, 7, *range(12, 20)], [3, 8], [4, 9]]

# observed in TensorFlow 2.21: load(reader_func=lambda ds: ds.interleave(lambda x: x, cycle_length=c,
# num_parallel_calls=AUTOTUNE)) of range(20).save(shard_func=uneven); "default" (no reader_func, 2 cores) gave
# the c=2 order
TF_UNEVEN_ORDERS = {
    1: [0, 5, 10, 1, 6, 11, 2, 7, 12, 13, 14, 15, 16, 17, 18, 19, 3, 8, 4, 9],
    2: [0, 1, 5, 6, 10, 11, 2, 3, 7, 8, 12, 13, 4, 14, 9, 15, 16, 17, 18, 19],
    3: [0, 1, 2, 5, 6, 7, 10, 11, 12, 13, 3, 4, 14, 8, 9, 15, 16, 17, 18, 19],
    4: [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 4, 14, 9, 15, 16, 17, 18, 19],
    16: list(range(20)),
}


@pytest.mark.parametrize("cycle", sorted(TF_UNEVEN_ORDERS))
def test_the_interleave_model_is_tensorflows(cycle):
    assert interleaved(UNEVEN_SHARDS, cycle) == TF_UNEVEN_ORDERS[cycle]


@pytest.mark.parametrize("cycle", sorted(TF_UNEVEN_ORDERS))
def test_default_reader_interleaves_the_shards_over_the_cycle_length(tmp_path, cycle_length, cycle):
    # TensorFlow's default reader: interleave(lambda s: s, cycle_length=<CPU cores>, deterministic)
    cycle_length(cycle)
    path = str(tmp_path / "s")
    D.range(20).save(path, shard_func=uneven)
    assert [int(v) for v in D.load(path)] == TF_UNEVEN_ORDERS[cycle]


def test_default_reader_cycle_length_is_the_cpu_cores(tmp_path):
    path = str(tmp_path / "s")
    D.range(20).save(path, shard_func=uneven)
    assert [int(v) for v in D.load(path)] == interleaved(UNEVEN_SHARDS, default_cycle_length())


@pytest.mark.parametrize(
    ("indices", "observed"),
    [
        ([-2, -1, 0, 1], [2, 3, 0, 1]),
        ([10, 9, 100, 11], [1, 0, 3, 2]),
        ([0x20000000, 0x100000000, 2, -1, 7, 2**63 - 1], [2, 4, 3, 1, 0, 5]),
    ],
    ids=["negative", "decimal-names", "wide-names"],
)
def test_shards_are_read_in_tensorflows_shard_order(tmp_path, cycle_length, indices, observed):
    # observed in TensorFlow 2.21 (2 cores): element i goes to shard indices[i]; TensorFlow names a shard
    # f"{index % 2**64:08d}" and reads the names sorted
    cycle_length(2)
    path = str(tmp_path / "s")
    D.range(len(indices)).save(path, shard_func=lambda x: np.int64(indices[int(x)]))
    assert [int(v) for v in D.load(path)] == observed


def test_shard_func_must_return_an_int64_scalar(tmp_path):
    # observed in TensorFlow 2.21: InvalidArgumentError "`shard_func` must return a scalar int64" (a Python
    # int is an int32 there)
    for fn in (lambda x: (x % 3).astype(np.int32), lambda x: -1):
        with pytest.raises(td.errors.InvalidArgumentError, match="shard_func must return a scalar int64"):
            D.range(10).save(str(tmp_path / "bad"), shard_func=fn)
    assert not os.path.exists(tmp_path / "bad" / persistence.MANIFEST)
    assert os.listdir(tmp_path / "bad") == []  # nothing left behind


def test_negative_int64_shard_indices_are_accepted(tmp_path):
    # observed in TensorFlow 2.21: tf.constant(-1, tf.int64) is a valid shard index
    D.range(4).save(str(tmp_path / "n"), shard_func=lambda x: np.int64(-1) if x < 2 else np.int64(5))
    assert sorted(int(v) for v in D.load(str(tmp_path / "n"))) == [0, 1, 2, 3]


def test_reader_func_gets_a_dataset_of_shard_datasets(tmp_path):
    # observed in TensorFlow 2.21: reader_func=lambda ds: ds.interleave(lambda x: x, cycle_length=1) gives
    # 0 3 6 9 1 4 7 2 5 8 for range(10) sharded by x % 3
    path = str(tmp_path / "r")
    D.range(10).save(path, shard_func=lambda x: x % 3)
    loaded = D.load(path, reader_func=lambda shards: shards.interleave(lambda s: s, cycle_length=1))
    assert [int(v) for v in loaded] == [0, 3, 6, 9, 1, 4, 7, 2, 5, 8]
    with pytest.raises(TypeError, match="reader_func must return a td.data.Dataset"):
        D.load(path, reader_func=lambda shards: 3)


def test_second_save_replaces_the_first(tmp_path):
    # observed in TensorFlow 2.21: load after a second save gives the second dataset
    path = str(tmp_path / "o")
    D.range(10).save(path, shard_func=lambda x: x % 2)
    old_files = {s["file"] for s in manifest_of(path)["shards"]}
    D.range(3).save(path)
    assert [int(v) for v in D.load(path)] == [0, 1, 2]
    assert not old_files & set(os.listdir(path))  # the old shards are removed


def test_a_loaded_dataset_whose_shards_a_later_save_replaced_is_data_loss(tmp_path):
    # TensorFlow 2.21 keeps reading the first save's files (it leaves them in place); towerdist's
    # second save removes them, so the dataset loaded before it says so and how to fix it.
    path = str(tmp_path / "o")
    D.range(5).save(path)
    loaded = D.load(path)
    assert [int(v) for v in loaded] == [0, 1, 2, 3, 4]
    old_file = os.path.join(path, manifest_of(path)["shards"][0]["file"])
    D.range(7).save(path)
    with pytest.raises(td.errors.DataLossError, match=r"the shard file .* is gone\. A later save\(\)") as info:
        list(loaded)
    assert info.value.path == old_file
    assert [int(v) for v in D.load(path)] == list(range(7))


def test_save_removes_only_shard_files_of_its_own_naming(tmp_path):
    # an edited manifest that lists the manifest itself and a user's files must not make save delete them
    path = str(tmp_path / "o")
    D.range(5).save(path)
    old_shard = shard_path(path)
    for name in ("notes.txt", "shard-data.csv"):
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            f.write("user data")
    manifest = manifest_of(path)
    for number, name in enumerate(("notes.txt", persistence.MANIFEST, "shard-data.csv"), start=1):
        manifest["shards"].append({"index": number, "file": name, "elements": 0, "bytes": 9, "crc32": 0})
    write_manifest(path, manifest)
    D.range(2).save(path)
    assert [int(v) for v in D.load(path)] == [0, 1]
    names = set(os.listdir(path))
    assert {"notes.txt", "shard-data.csv", persistence.MANIFEST} <= names
    assert os.path.basename(old_shard) not in names


def test_a_failed_save_leaves_the_previous_one_intact(tmp_path):
    path = str(tmp_path / "a")
    D.range(5).save(path)
    before = sorted(os.listdir(path))

    def boom(x):
        if int(x) == 3:
            raise KeyError("failed mid-save")
        return x

    with pytest.raises(KeyError, match="failed mid-save"):
        D.range(10).map(boom).save(path)
    assert sorted(os.listdir(path)) == before
    assert [int(v) for v in D.load(path)] == [0, 1, 2, 3, 4]


def test_the_manifest_is_put_in_place_with_os_replace(tmp_path, monkeypatch):
    calls = []
    real = os.replace

    def spy(src, dst):
        calls.append((os.path.basename(src), os.path.basename(dst)))
        return real(src, dst)

    monkeypatch.setattr(persistence.os, "replace", spy)
    D.range(3).save(str(tmp_path / "m"))
    assert len(calls) == 1 and calls[0][1] == persistence.MANIFEST and is_temporary(calls[0][0])


def test_experimental_save_and_load(tmp_path):
    path = str(tmp_path / "x")
    td.data.experimental.save(D.range(4), path)
    assert [int(v) for v in td.data.experimental.load(path)] == [0, 1, 2, 3]


def test_element_spec_given_to_load(tmp_path):
    # observed in TensorFlow 2.21: load(element_spec=...) uses it; a wrong dtype fails (TF: InvalidArgumentError
    # "Data type mismatch at component 0" while iterating; towerdist when loading)
    path = str(tmp_path / "e")
    D.from_tensor_slices(np.ones((3, 2), np.float32)).save(path)
    relaxed = D.load(path, element_spec=TS((None,), np.float32))
    assert relaxed.element_spec == TS((None,), np.float32)
    assert len(list(relaxed)) == 3
    with pytest.raises(td.errors.InvalidArgumentError, match="element_spec does not match"):
        D.load(path, element_spec=TS((), np.int64))


# --- what cannot be saved ----------------------------------------------------------------------------


def test_infinite_dataset_is_refused(tmp_path):
    with pytest.raises(td.errors.InvalidArgumentError, match="cannot save an infinite dataset"):
        D.range(3).repeat().save(str(tmp_path / "i"))


def test_dataset_of_windows_is_refused(tmp_path):
    with pytest.raises(TypeError, match="elements are datasets"):
        D.range(4).window(2).save(str(tmp_path / "w"))


def test_ragged_stand_in_is_refused(tmp_path):
    rows = np.empty(2, dtype=object)
    rows[0], rows[1] = np.ones(2), np.ones(3)
    with pytest.raises(TypeError, match="ragged"):
        D.from_tensors(rows).save(str(tmp_path / "r"))


def test_checkpoint_args_are_unimplemented(tmp_path):
    with pytest.raises(td.errors.UnimplementedError, match="does not support checkpoint_args"):
        D.range(3).save(str(tmp_path / "c"), checkpoint_args={"max_to_keep": 1})


def test_saving_onto_a_file_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("not a directory")
    with pytest.raises(td.errors.InvalidArgumentError, match="is a file"):
        D.range(3).save(str(target))


# --- damaged input ---------------------------------------------------------------------------------


def test_missing_dataset_is_not_found(tmp_path):
    # observed in TensorFlow 2.21: NotFoundError naming the path
    with pytest.raises(td.errors.NotFoundError, match="found no saved dataset") as info:
        D.load(str(tmp_path / "missing"))
    assert info.value.path == str(tmp_path / "missing")


@pytest.fixture
def saved(tmp_path) -> str:
    path = str(tmp_path / "saved")
    D.from_tensor_slices(np.arange(40, dtype=np.int64).reshape(10, 4)).save(path)
    return path


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m.update(version=2), "format version 2, written by a newer towerdist"),
        (lambda m: m.update(version=0), "its version is 0"),
        (lambda m: m.update(format="tf.data.snapshot"), "not a manifest of format"),
        (lambda m: m.pop("shards"), "missing or malformed"),
        (lambda m: m.update(cardinality=11), "not the shards' element count"),
        (lambda m: m["shards"][0].update(file="../elsewhere"), "not a plain file name"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [4], "dtype": "object_thing"}}), "malformed"),
        (lambda m: m.update(element_spec={"pickle": "x"}), "malformed"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [4], "dtype": "O"}}), "bad dtype 'O'"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [4], "dtype": ">i8"}}), "bad dtype '>i8'"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [4], "dtype": "int"}}), "bad dtype 'int'"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [2], "dtype": "float128"}}), "bad dtype 'float128'"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [4], "dtype": "object"}}), "bad dtype 'object'"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [True], "dtype": "int64"}}), "bad shape"),
        (lambda m: m.update(element_spec={"tensor": {"shape": [2**63], "dtype": "int64"}}), "bad shape"),
        (lambda m: m.update(element_spec={"tensor": {"shape": 4, "dtype": "int64"}}), "bad shape"),
        (
            lambda m: m.update(element_spec={"namedtuple": {"name": "P", "fields": ["a", "b"], "items": []}}),
            "namedtuple 'P' has fields",
        ),
        (lambda m: m.update(element_spec={"dict": [["a", {"tuple": []}], ["a", {"tuple": []}]]}), "bad dict keys"),
    ],
    ids=[
        "newer",
        "zero",
        "format",
        "no-shards",
        "cardinality",
        "escaping-name",
        "dtype",
        "spec-kind",
        "dtype-O",
        "dtype-big-endian",
        "dtype-int",
        "dtype-float128",
        "dtype-object",
        "shape-bool",
        "shape-2**63",
        "shape-not-list",
        "namedtuple-items",
        "dict-duplicate-keys",
    ],
)
def test_bad_manifest_is_data_loss_naming_it(saved, change, match):
    manifest = manifest_of(saved)
    change(manifest)
    write_manifest(saved, manifest)
    with pytest.raises(td.errors.DataLossError, match=match) as info:
        D.load(saved)
    assert info.value.path == os.path.join(saved, persistence.MANIFEST)


@pytest.mark.parametrize("depth", [600, 5000])
def test_deeply_nested_manifest_spec_is_data_loss(saved, depth):
    # raised RecursionError from the JSON parser before (450 levels still load)
    text = json.dumps(manifest_of(saved))
    spec = '{"tuple": [' * depth + '{"tensor": {"shape": [4], "dtype": "int64"}}' + "]}" * depth
    start = text.index('"element_spec": ') + len('"element_spec": ')
    end = text.index(', "compression"')
    with open(os.path.join(saved, persistence.MANIFEST), "w", encoding="utf-8") as f:
        f.write(text[:start] + spec + text[end:])
    with pytest.raises(td.errors.DataLossError, match="nested too deeply") as info:
        D.load(saved)
    assert info.value.path == os.path.join(saved, persistence.MANIFEST)


def test_manifest_that_is_not_json_is_data_loss(saved):
    with open(os.path.join(saved, persistence.MANIFEST), "w", encoding="utf-8") as f:
        f.write('{"format": "towerdist.data.Dataset.save", "vers')
    with pytest.raises(td.errors.DataLossError, match="not valid JSON"):
        D.load(saved)


def test_truncated_shard_is_data_loss_when_loading(saved):
    file = shard_path(saved)
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) - 5)
    with pytest.raises(td.errors.DataLossError, match="truncated") as info:
        D.load(saved)
    assert info.value.path == file


def test_missing_shard_is_data_loss(saved):
    file = shard_path(saved)
    os.unlink(file)
    with pytest.raises(td.errors.DataLossError, match="is missing"):
        D.load(saved)


def test_flipped_byte_is_data_loss_before_the_damaged_element(saved):
    file = shard_path(saved)
    data = bytearray(open(file, "rb").read())
    record = 8 + 12 + 4 + 8 + 4 * 8  # magic, then the first record: head, rank, one dimension, four int64
    data[8 + record + 12 + 4 + 8 + 3] ^= 0xFF  # a value of the second element
    open(file, "wb").write(bytes(data))
    iterator = iter(D.load(saved))
    assert next(iterator).tolist() == [0, 1, 2, 3]
    with pytest.raises(td.errors.DataLossError, match="fails its CRC-32 check") as info:
        next(iterator)
    assert info.value.path == file


def test_corrupt_record_length_is_data_loss(saved):
    file = shard_path(saved)
    data = bytearray(open(file, "rb").read())
    data[8:16] = (2**40).to_bytes(8, "little")  # the first record's length
    open(file, "wb").write(bytes(data))
    with pytest.raises(td.errors.DataLossError, match="corrupt"):
        list(D.load(saved))


def test_wrong_magic_is_data_loss(saved):
    file = shard_path(saved)
    data = bytearray(open(file, "rb").read())
    data[0:8] = b"PICKLE!!"
    open(file, "wb").write(bytes(data))
    with pytest.raises(td.errors.DataLossError, match="not a towerdist dataset shard"):
        list(D.load(saved))


def test_corrupt_gzip_shard_is_data_loss(tmp_path):
    path = str(tmp_path / "g")
    D.range(200).save(path, compression="GZIP")
    file = shard_path(path)
    data = bytearray(open(file, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(file, "wb").write(bytes(data))
    with pytest.raises(td.errors.DataLossError):
        list(D.load(path, compression="GZIP"))


def craft(path, dtype: str, shape: list, payload: bytes) -> str:
    """Replaces the one-shard save at ``path`` with one record ``payload`` whose CRCs all check out."""
    record = struct.pack("<QI", len(payload), zlib.crc32(payload)) + payload
    data = b"TDSHARD1" + record
    file = shard_path(path)
    with open(file, "wb") as f:
        f.write(data)
    manifest = manifest_of(path)
    manifest["element_spec"] = {"tensor": {"shape": shape, "dtype": dtype}}
    manifest["shards"] = [dict(manifest["shards"][0], elements=1, bytes=len(data), crc32=zlib.crc32(data))]
    manifest["cardinality"] = 1
    write_manifest(path, manifest)
    return file


def dims(*sizes: int) -> bytes:
    return struct.pack("<I", len(sizes)) + b"".join(struct.pack("<Q", d) for d in sizes)


@pytest.mark.parametrize(
    ("dtype", "shape", "payload", "match"),
    [
        ("string", [None], dims(2**40) + struct.pack("<Q", 1) + b"a", "needs at least 8796093022208 bytes"),
        ("string", [None], dims(1) + struct.pack("<Q", 2**60) + b"a", "ends in the middle of a component"),
        ("float32", [None, None], dims(2**32, 2**32), "needs at least 73786976294838206464 bytes"),
        ("int64", [None, None], dims(2**63 + 5, 0), "has shape"),
        ("int64", [None, None], dims(2**62, 0), r"has shape \(4611686018427387904, 0\)"),
        ("string", [None, None, None], dims(2**62, 2**62, 0), "has shape"),
        ("int64", [2], dims(3) + bytes(24), r"has shape \(3,\)"),
        ("int64", None, struct.pack("<I", 2**31) + bytes(8), "has rank 2147483648"),
    ],
    ids=[
        "huge-string-count",
        "huge-string-length",
        "shape-product-overflow",
        "dimension-over-int64",
        "zero-size-too-big-for-numpy",
        "zero-size-strings-too-big-for-numpy",
        "shape-not-the-spec",
        "huge-rank",
    ],
)
def test_crafted_record_with_a_valid_crc_is_data_loss(saved, dtype, shape, payload, match):
    # before: MemoryError, ValueError (numpy) or an 8 TiB allocation attempt
    file = craft(saved, dtype, shape, payload)
    with pytest.raises(td.errors.DataLossError, match=match) as info:
        list(D.load(saved))
    assert info.value.path == file


def test_crafted_record_that_is_valid_loads(saved):
    # the crafting above writes what save() writes: a correct record loads
    craft(saved, "string", [None], dims(2) + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 0))
    (element,) = list(D.load(saved))
    assert element.tolist() == [b"a", b""]


@pytest.mark.skipif(np.dtype(np.longdouble).name == "float64", reason="long double is float64 on this platform")
def test_long_double_is_refused_when_saving(tmp_path):
    with pytest.raises(TypeError, match="saves numbers, booleans and strings"):
        D.from_tensors(np.ones(2, np.longdouble)).save(str(tmp_path / "l"))


def test_shard_with_extra_records_is_data_loss(saved):
    manifest = manifest_of(saved)
    manifest["shards"][0]["elements"] = 9
    manifest["cardinality"] = 9
    write_manifest(saved, manifest)
    with pytest.raises(td.errors.DataLossError, match="data after its 9 records"):
        list(D.load(saved))


# --- distribution ----------------------------------------------------------------------------------


def _steps(strategy, dist) -> list:
    return [[np.asarray(p).tolist() for p in strategy.experimental_local_results(step)] for step in dist]


def test_distribute_a_loaded_dataset(tmp_path, mirrored_strategy):
    path = str(tmp_path / "d")
    D.range(5).save(path)
    dist = mirrored_strategy.experimental_distribute_dataset(D.load(path).batch(3))
    assert _steps(mirrored_strategy, dist) == [[[0, 1], [2]], [[3], [4]]]


def test_distribute_datasets_from_function_over_a_loaded_dataset(tmp_path, mirrored_strategy, cycle_length):
    cycle_length(1)  # the shards one after the other
    path = str(tmp_path / "d")
    D.range(8).save(path, shard_func=lambda x: x % 2)

    def dataset_fn(ctx):
        return D.load(path).batch(ctx.get_per_replica_batch_size(4), drop_remainder=True)

    assert _steps(mirrored_strategy, mirrored_strategy.distribute_datasets_from_function(dataset_fn)) == [
        [[0, 2], [4, 6]],
        [[1, 3], [5, 7]],
    ]
