"""The bytes of a saved iterator position (``state_codec``): every value it stores comes back, nothing else goes in.

Values are compared by type, dtype, shape and value: a restored position must hold exactly what
was saved, or a restored pipeline would yield other elements.
"""

from __future__ import annotations

import collections
import io
import json
import os
import subprocess
import sys
import zipfile
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.data import state_codec
from towerdist._src.data.persistence import ShardFileDataset

from dataset_helpers import Point

D = td.data.Dataset


def roundtrip(value: Any) -> Any:
    return state_codec.decode(state_codec.encode(value))


def assert_identical(expected: Any, actual: Any, where: str = "value") -> None:
    """Same types all the way down, same dtypes and shapes, same values."""
    assert type(actual) is type(expected), (
        f"{where}: a {type(actual).__name__} where a {type(expected).__name__} was saved"
    )
    if isinstance(expected, (np.ndarray, np.generic)):
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype}, saved {expected.dtype}"
        assert np.shape(actual) == np.shape(expected), f"{where}: shape {np.shape(actual)}, saved {np.shape(expected)}"
        assert np.array_equal(actual, expected, equal_nan=expected.dtype.kind in "fc"), f"{where}: {actual!r}"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)}, saved {list(expected)}"
        for key in expected:
            assert_identical(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple, collections.deque)):
        assert len(actual) == len(expected), f"{where}: {len(actual)} items, saved {len(expected)}"
        for k, (a, b) in enumerate(zip(expected, actual, strict=True)):
            assert_identical(a, b, f"{where}[{k}]")
    elif isinstance(expected, np.random.Generator):
        assert type(actual.bit_generator) is type(expected.bit_generator)
        assert actual.random(4).tolist() == expected.random(4).tolist()
    elif isinstance(expected, float) and expected != expected:
        assert actual != actual
    else:
        assert actual == expected, f"{where}: {actual!r}, saved {expected!r}"


VALUES: dict[str, Any] = {
    "none": None,
    "bool": True,
    "int": -(2**70),
    "float": 0.1,
    "float_nan": float("nan"),
    "str": "héllo",
    "bytes": b"\x00\xffbytes",
    "list": [1, "a", None],
    "tuple": (1, (2.5, b"x")),
    "empty_tuple": (),
    "dict_str_keys": {"a": 1, "b": [2]},
    "dict_other_keys": {1: "one", (2, 3): "pair", b"k": None},
    "dict_with_the_tag_key": {"~": "not a tag", "v": 1},
    "ordered_dict": collections.OrderedDict([("z", 1), ("a", 2)]),
    "deque": collections.deque([1, 2, 3]),
    "set": {1, (2, b"x"), "s"},
    "namedtuple": Point(np.int64(1), np.arange(3)),
    "array_int": np.arange(6, dtype=np.int32).reshape(2, 3),
    "array_uint": np.array([1, 2**63], dtype=np.uint64),
    "array_float": np.array([[0.5, np.nan]], dtype=np.float16),
    "array_complex": np.array([1 + 2j], dtype=np.complex128),
    "array_bool": np.array([True, False]),
    "array_empty": np.zeros((0, 3), dtype=np.float32),
    "array_0d": np.array(7, dtype=np.int8),
    "array_fortran": np.asfortranarray(np.arange(6).reshape(2, 3)),
    "array_view": np.arange(10)[::3],
    "array_bytes_fixed": np.array([b"ab", b"c"], dtype="S2"),
    "array_unicode": np.array(["ab", "ç"]),
    "array_datetime": np.array(["2024-01-01"], dtype="datetime64[D]"),
    "array_timedelta": np.array([3], dtype="timedelta64[s]"),
    "array_strings": np.array([[b"a", b"bc"], [b"", b"d"]], dtype=object),
    "scalar_int64": np.int64(-3),
    "scalar_float32": np.float32(2.5),
    "scalar_bool": np.bool_(True),
    "rng_pcg64": np.random.default_rng(5),
    "rng_philox": np.random.Generator(np.random.Philox(3)),
    "tensor_spec": td.TensorSpec((None, 3), np.float32, name="x"),
    "tensor_spec_unknown_rank": td.TensorSpec(None, np.object_),
    "dataset_spec": td.data.DatasetSpec({"a": td.TensorSpec((2,), np.int64)}),
    # a list of elements of one structure is stored column-wise (stacked)
    "stacked_scalars": [np.int64(i) for i in range(6)],
    "stacked_arrays": [np.full((2,), i, dtype=np.float32) for i in range(5)],
    "stacked_0d_arrays": [np.array(i) for i in range(5)],
    "stacked_dicts": [{"a": np.int64(i), "b": np.arange(i, i + 2)} for i in range(4)],
    "stacked_namedtuples": [Point(np.int32(i), np.float64(i / 2)) for i in range(4)],
    "stacked_tuples_of_strings": [(np.int64(i), b"s%d" % i) for i in range(4)],
    "unstackable_mixed_shapes": [np.zeros(i) for i in range(5)],
    "unstackable_mixed_dtypes": [np.int64(1), np.int32(2), np.int64(3), np.int64(4)],
    "unstackable_scalars_and_0d": [np.int64(1), np.array(2), np.int64(3), np.int64(4)],
}


@pytest.mark.parametrize("name", list(VALUES))
def test_value_round_trips(name: str) -> None:
    value = VALUES[name]
    if isinstance(value, np.random.Generator):  # a generator moves on as it is compared: compare copies
        saved = state_codec.encode(value)
        assert_identical(state_codec.decode(saved), state_codec.decode(saved))
        twin = np.random.Generator(type(value.bit_generator)())
        twin.bit_generator.state = value.bit_generator.state
        assert_identical(twin, state_codec.decode(saved))
        return
    assert_identical(value, roundtrip(value))


def test_a_frozenset_comes_back_as_a_set() -> None:
    assert roundtrip(frozenset({1, 2})) == {1, 2}


def test_restored_arrays_are_read_only() -> None:
    restored = roundtrip({"array": np.arange(3), "stacked": [np.arange(2) for _ in range(4)]})
    assert not restored["array"].flags.writeable
    assert not restored["stacked"][0].flags.writeable


def test_a_load_shard_round_trips_as_a_dataset_of_its_file(tmp_path: Any) -> None:
    path = str(tmp_path / "saved")
    D.from_tensor_slices({"x": np.arange(4), "y": np.array([b"a", b"b", b"c", b"d"], dtype=object)}).save(path)
    shards = list(D.load(path, reader_func=lambda shards: shards))
    assert len(shards) == 1 and isinstance(shards[0], ShardFileDataset)
    restored = roundtrip(shards[0])
    assert isinstance(restored, ShardFileDataset)
    assert [(int(e["x"]), bytes(e["y"])) for e in restored] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


GPU_PROGRAM = """
import numpy as np
from towerdist._src.backend import gpu_module
from towerdist._src.data import state_codec

xp = gpu_module.array_module()
with xp.cuda.Device(0):
    array = xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    restored = state_codec.decode(state_codec.encode({"one": array, "stacked": [array] * 4}))
for value in [restored["one"], *restored["stacked"]]:
    assert type(value) is type(array), type(value)
    assert value.dtype == np.float32 and value.get().tolist() == [[0, 1, 2], [3, 4, 5]], value
print("ok")
"""


@pytest.mark.timeout(120)
def test_a_gpu_array_round_trips_onto_the_gpu() -> None:
    # Through host memory, on the simulated GPUs (the same code path as cupy's).
    env = {**os.environ, "TOWERDIST_SIMULATE_GPUS": "1"}
    done = subprocess.run([sys.executable, "-c", GPU_PROGRAM], env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_stacked_lists_store_one_array_per_component() -> None:
    data = state_codec.encode([{"a": np.int64(i), "b": np.zeros(3)} for i in range(100)])
    members = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert sorted(members) == ["0.npy", "1.npy", "state.json"]


def test_nothing_is_pickled() -> None:
    data = state_codec.encode({"strings": np.array([b"a"], dtype=object), "set": {1}})
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in archive.namelist():
            if name.endswith(".npy"):
                header = archive.read(name)[:128]
                assert b"'descr': '|O'" not in header


# --- what cannot be saved -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "named"),
    [
        pytest.param(object(), "builtins:object", id="object"),
        pytest.param(Fraction(1, 3), "fractions:Fraction", id="fraction"),
        pytest.param(lambda x: x, "function", id="lambda"),
        pytest.param([1, iter([2])], "list_iterator", id="iterator_in_a_list"),
        pytest.param(np.zeros(2, dtype="V3"), "dtype |V3", id="void_array"),
        pytest.param(np.array([Fraction(1, 2)], dtype=object), "fractions:Fraction", id="object_array_of_objects"),
        pytest.param(collections.defaultdict(int), "collections:defaultdict", id="defaultdict"),
    ],
)
def test_an_unsavable_value_raises_type_error_naming_its_type(value: Any, named: str) -> None:
    with pytest.raises(TypeError, match="cannot be saved") as caught:
        state_codec.encode({"position": value})
    assert named in str(caught.value)


def test_an_iterator_holding_an_unsavable_value_raises_type_error_naming_it() -> None:
    dataset = D.range(5).scan(np.array(Fraction(1, 2), dtype=object), lambda s, x: (s, x))
    iterator = iter(dataset)
    next(iterator)
    with pytest.raises(TypeError, match="cannot save the iterator's position: a value of type fractions:Fraction"):
        iterator._checkpoint_state()
    assert [int(v) for v in iterator] == [1, 2, 3, 4]  # the iterator goes on


# --- what cannot be read --------------------------------------------------------------------------


SAVED = state_codec.encode({"buffer": [np.arange(3) for _ in range(5)], "n": 3})


def _rewritten(document: dict[str, Any]) -> bytes:
    """``SAVED`` with its JSON replaced by ``document``."""
    source = zipfile.ZipFile(io.BytesIO(SAVED))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in source.namelist():
            archive.writestr(name, json.dumps(document) if name == "state.json" else source.read(name))
    return buffer.getvalue()


def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(zipfile.ZipFile(io.BytesIO(SAVED)).read("state.json"))
    return loaded


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(SAVED[: len(SAVED) // 2], "cannot be read", id="truncated"),
        pytest.param(SAVED[:-1], "cannot be read", id="last_byte_missing"),
        pytest.param(b"", "cannot be read", id="empty"),
        pytest.param(b"not a state at all", "cannot be read", id="garbage"),
        pytest.param(_rewritten({**_document(), "format": "other"}), "not an iterator state", id="other_format"),
        pytest.param(_rewritten({**_document(), "format_version": 99}), "format version 99", id="newer_version"),
        pytest.param(_rewritten({**_document(), "state": {"~": "nonsense"}}), "unknown value tag", id="unknown_tag"),
        pytest.param(
            _rewritten({**_document(), "state": {"~": "namedtuple", "type": "nowhere:Gone", "v": []}}),
            "cannot be imported here",
            id="namedtuple_not_importable",
        ),
        pytest.param(
            _rewritten({**_document(), "state": {"~": "array", "i": 42}}), "cannot be read", id="missing_array"
        ),
    ],
)
def test_a_damaged_state_raises_data_loss_error(data: bytes, match: str) -> None:
    with pytest.raises(td.errors.DataLossError, match=match):
        state_codec.decode(data)


def test_a_truncated_iterator_state_fails_to_restore_and_leaves_the_iterator_as_it_was() -> None:
    saved = iter(D.range(10).shuffle(4, seed=1))
    next(saved)
    state = saved._checkpoint_state()
    iterator = iter(D.range(10).shuffle(4, seed=1))
    first = int(next(iterator))
    with pytest.raises(td.errors.DataLossError, match="The saved iterator state cannot be read"):
        iterator._checkpoint_restorer(state[:-10])
    assert sorted([first, *(int(v) for v in iterator)]) == list(range(10))
