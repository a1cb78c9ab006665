"""``td.train`` checkpoints that cannot be restored: corrupt, truncated and missing files, shape and dtype mismatches.

Every refused restore is all-or-nothing: the objects keep their values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import towerdist as td

from checkpoint_helpers import (
    DataLossError,
    NotFoundError,
    assert_unchanged,
    data_file,
    data_files,
    index_file,
    make_state,
    read_index,
    saved_counter,
    seal,
    snapshot,
    train,
    variables_of,
)
from conftest import mirrored_param

# --- 6. corrupt, truncated and missing files ----------------------------------------------------


def _edit_index(prefix: Path, edit: Any, reseal: bool = True) -> Path:
    """Edits the index; ``reseal`` gives it a valid checksum (a wrong index written by other means)."""
    index = read_index(prefix)
    edit(index)
    if reseal:
        seal(index)
    path = index_file(prefix)
    path.write_text(json.dumps(index), encoding="utf-8")
    return path


def _truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _flip_byte(path: Path) -> Path:
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x10
    path.write_bytes(bytes(content))
    return path


def _overwrite_index(prefix: Path, content: bytes) -> Path:
    path = index_file(prefix)
    path.write_bytes(content)
    return path


def _delete_data(prefix: Path) -> Path:
    (path,) = data_files(prefix)
    path.unlink()
    return path


def _point_index_at_other_data(prefix: Path) -> Path:
    """An index naming data of another hash (as a newer save's index would, with its data file still pending)."""
    _edit_index(prefix, lambda index: index.update(data_sha256="0123456789abcdef" * 4))
    return data_file(prefix)


def _edit_first_entry(prefix: Path, reseal: bool = True, **fields: Any) -> Path:
    """Edits the entry of ``model/layers/0/w``; the index is at fault."""
    return _edit_index(prefix, lambda index: index["entries"]["model/layers/0/w"].update(fields), reseal)


def _first_entry_shares_a_member(prefix: Path, reseal: bool) -> Path:
    """Points ``model/layers/0/w``'s entry at the array of another entry of the same shape and dtype."""
    index = read_index(prefix)
    other = index["entries"]["optimizer/.slots/model/layers/0/w/m"]["member"]
    return _edit_first_entry(prefix, reseal, member=other)


def _as_format_version_1(index: dict[str, Any]) -> None:
    index.update(format_version=1)
    del index["index_sha256"]


def _duplicate_key(prefix: Path) -> Path:
    path = index_file(prefix)
    text = path.read_text(encoding="utf-8")
    return _overwrite_index(prefix, text.replace('"entries": {', '"data_size": 0,\n "entries": {', 1).encode())


def _drop_entry(index: dict[str, Any]) -> None:
    del index["entries"]["model/scale"]


INDEX_CHECKSUM = r"Checkpoint index .* is corrupt: its content does not match its index_sha256 checksum"
MALFORMED = r"Checkpoint index .* is malformed: "

CORRUPTIONS = {  # name: (corrupt(prefix) -> the file at fault, the message's first words)
    "truncated_data": (lambda p: _truncate(data_files(p)[0]), r"Checkpoint data file .* is truncated or corrupt"),
    "flipped_data_byte": (lambda p: _flip_byte(data_files(p)[0]), r"Checkpoint data file .* is corrupt: its SHA-256"),
    "deleted_data": (_delete_data, r"Checkpoint data file .* named by its index is missing"),
    "index_names_other_data": (_point_index_at_other_data, r"Checkpoint data file .* is corrupt: its SHA-256"),
    "truncated_index": (lambda p: _truncate(index_file(p)), r"Checkpoint index .* is truncated or corrupt"),
    "empty_index": (lambda p: _overwrite_index(p, b""), r"Checkpoint index .* is truncated or corrupt"),
    "garbage_index": (
        lambda p: _overwrite_index(p, bytes(range(256)) * 3), r"Checkpoint index .* is truncated or corrupt"
    ),
    "index_with_a_duplicate_key": (
        _duplicate_key, r"Checkpoint index .* is truncated or corrupt \(duplicate key 'data_size'\)"
    ),
    "index_not_an_object": (lambda p: _overwrite_index(p, b"[1, 2, 3]"), r".* is not a towerdist checkpoint index"),
    "other_format": (
        lambda p: _edit_index(p, lambda i: i.update(format="tensorflow")), r".* is not a towerdist checkpoint index"
    ),
    "newer_format_version": (
        lambda p: _edit_index(p, lambda i: i.update(format_version=4)),
        r"Checkpoint .* has format_version 4; this towerdist reads versions 2 \(in \.index\.json files\) and 3",
    ),
    "version_2_in_an_index_file": (
        lambda p: _edit_index(p, lambda i: i.update(format_version=2)),
        r"Checkpoint .* has format_version 2; this towerdist reads versions 2 \(in \.index\.json files\) and 3",
    ),
    "format_version_1": (
        lambda p: _edit_index(p, _as_format_version_1, reseal=False),
        r"Checkpoint .* has format_version 1, whose index carries no checksum",
    ),
    # Edits made without updating index_sha256, as a corrupted byte would make them.
    "entry_shares_a_member_unsealed": (lambda p: _first_entry_shares_a_member(p, reseal=False), INDEX_CHECKSUM),
    "entry_shape_edited_unsealed": (lambda p: _edit_first_entry(p, reseal=False, shape=[5, 3]), INDEX_CHECKSUM),
    "variable_name_edited_unsealed": (lambda p: _edit_first_entry(p, reseal=False, variable="v:0"), INDEX_CHECKSUM),
    "version_edited_unsealed": (
        lambda p: _edit_index(p, lambda i: i.update(format_version=4), reseal=False),
        INDEX_CHECKSUM + r" \(it says format_version 4",
    ),
    "checksum_edited": (
        lambda p: _edit_index(p, lambda i: i.update(index_sha256="0" * 64), reseal=False), INDEX_CHECKSUM
    ),
    "checksum_removed": (
        lambda p: _edit_index(p, lambda i: i.pop("index_sha256"), reseal=False),
        r"Checkpoint index .* is corrupt: its content has no index_sha256 checksum",
    ),
    # Checksum-valid indexes that are wrong all the same (written by other means).
    "index_without_entries": (lambda p: _edit_index(p, lambda i: i.pop("entries")), MALFORMED + "its fields are"),
    "entry_shares_a_member": (
        lambda p: _first_entry_shares_a_member(p, reseal=True),
        MALFORMED + r"entry '.*' names array 'a\d+', which another entry names too",
    ),
    "index_names_another_prefixs_data": (
        lambda p: _edit_index(p, lambda i: i.update(data_file=i["data_file"].replace("ckpt-1", "ckpt-2"))),
        MALFORMED + r"data_file is 'ckpt-2\.data-00000-of-00001', but the data file of .*ckpt-1 is named "
        r"'ckpt-1\.data-00000-of-00001'",
    ),
    "index_lists_fewer_arrays_than_the_data": (
        lambda p: _edit_index(p, _drop_entry), r"Checkpoint .*: .*\.data-00000-of-00001 holds arrays \['a\d+'\] that its index"
    ),
    "entry_names_missing_member": (
        lambda p: _edit_first_entry(p, member="a999"), r"Checkpoint .*: the index .* names array 'a999'"
    ),
    "entry_shape_disagrees_with_array": (
        lambda p: _edit_first_entry(p, shape=[5, 3]),
        r"Checkpoint .*: entry 'model/layers/0/w' holds an array of shape \(3, 5\)",
    ),
    "entry_dtype_disagrees_with_array": (
        lambda p: _edit_first_entry(p, dtype="float64"),
        r"Checkpoint .*: entry 'model/layers/0/w' holds an array of shape \(3, 5\) and dtype float32",
    ),
    "entry_dtype_is_not_a_dtype": (
        lambda p: _edit_first_entry(p, dtype="flo&t32"), MALFORMED + r"entry '.*' has dtype 'flo&t32', which is not"
    ),
    "entry_dtype_is_object": (
        lambda p: _edit_first_entry(p, dtype="object"), MALFORMED + r"entry '.*' has dtype 'object', which is not"
    ),
    "entry_dtype_is_not_written_so": (
        lambda p: _edit_first_entry(p, dtype="f4"), MALFORMED + r"entry '.*' has dtype 'f4', which is not"
    ),
    "entry_shape_is_negative": (
        lambda p: _edit_first_entry(p, shape=[-3, 5]), MALFORMED + r"entry '.*' has shape \[-3, 5\], not a list"
    ),
}


@pytest.fixture
def saved_and_target(tmp_path, mirrored_strategy):
    """A checkpoint of a trained 2-replica state, and a differently initialised state to restore into."""
    source = make_state(mirrored_strategy)
    train(source, steps=2)
    prefix = Path(source.checkpoint().save(str(tmp_path / "ckpt")))
    target = make_state(mirrored_strategy, seed=4, build=True)
    train(target, steps=1)
    return prefix, target


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_checkpoint_raises_data_loss_naming_the_file_and_changes_nothing(saved_and_target, corruption):
    prefix, target = saved_and_target
    corrupt, first_words = CORRUPTIONS[corruption]
    at_fault = corrupt(prefix)
    ckpt = target.checkpoint()
    before = snapshot(variables_of(target))

    with pytest.raises(DataLossError, match=first_words) as error:
        ckpt.restore(str(prefix))

    assert error.value.path == str(at_fault)
    assert str(at_fault) in str(error.value)
    assert_unchanged(before, snapshot(variables_of(target)))
    assert saved_counter(ckpt) == 0


def two_variable_checkpoint(tmp_path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """A checkpoint of two variables of the same shape and dtype (which a swapped index would mix up)."""
    saved = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([30.0, 40.0], np.float32)}
    path = td.train.Checkpoint(**{k: td.Variable(v) for k, v in saved.items()}).write(str(tmp_path / "ckpt"))
    return path, saved


def test_an_index_with_swapped_members_raises_data_loss_and_changes_nothing(tmp_path):
    path, _ = two_variable_checkpoint(tmp_path)

    def swap(index: dict[str, Any]) -> None:
        a, b = index["entries"]["a"], index["entries"]["b"]
        a["member"], b["member"] = b["member"], a["member"]

    edited = _edit_index(Path(path), swap, reseal=False)
    targets = {"a": td.Variable(np.zeros(2, np.float32)), "b": td.Variable(np.zeros(2, np.float32))}
    with pytest.raises(DataLossError, match=INDEX_CHECKSUM) as error:
        td.train.Checkpoint(**targets).restore(path)
    assert error.value.path == str(edited)
    for variable in targets.values():
        np.testing.assert_array_equal(variable.numpy(), np.zeros(2, np.float32))


@pytest.mark.parametrize("bit", range(8))
def test_every_flipped_bit_of_the_index_raises_data_loss_and_changes_nothing(tmp_path, bit):
    path, saved = two_variable_checkpoint(tmp_path)
    index = index_file(path)
    original = index.read_bytes()
    targets = {"a": td.Variable(np.zeros(2, np.float32)), "b": td.Variable(np.zeros(2, np.float32))}
    ckpt = td.train.Checkpoint(**targets)
    # Every byte, this bit: key names, member names, shapes, dtypes, the data file's name,
    # sizes, hashes, the version, punctuation and whitespace. The index holds no tab or
    # carriage return, so no flip turns whitespace into other whitespace: each one fails.
    for offset in range(len(original)):
        flipped = bytearray(original)
        flipped[offset] ^= 1 << bit
        index.write_bytes(bytes(flipped))
        context = original[max(0, offset - 20):offset + 20]
        where = f"bit {bit} of byte {offset}: {original[offset:offset + 1]!r} in {context!r}"
        with pytest.raises(DataLossError) as error:
            ckpt.read(path)
            pytest.fail(f"restored without error after flipping {where}")
        assert error.value.path == str(index), where
        for variable in targets.values():
            np.testing.assert_array_equal(variable.numpy(), np.zeros(2, np.float32), err_msg=where)
        assert saved_counter(ckpt) == 0, where
    index.write_bytes(original)
    ckpt.read(path).assert_nontrivial_match()  # the intact index restores
    for name, variable in targets.items():
        np.testing.assert_array_equal(variable.numpy(), saved[name])


def test_missing_checkpoint_raises_not_found_naming_the_index(tmp_path):
    v = td.Variable(np.arange(3, dtype=np.float32))
    missing = str(tmp_path / "nothing-1")
    with pytest.raises(NotFoundError, match="Failed to find any matching files for") as error:
        td.train.Checkpoint(v=v).restore(missing)
    assert error.value.path == f"{missing}.index"
    assert f"{missing}.index" in str(error.value) and "Pass the prefix that save() or write() returned" in str(
        error.value
    )
    np.testing.assert_array_equal(v.numpy(), np.arange(3, dtype=np.float32))


def test_a_directory_instead_of_a_prefix_gets_a_hint(tmp_path):
    v = td.Variable(np.float32(1.0))
    ckpt = td.train.Checkpoint(v=v)
    ckpt.save(str(tmp_path / "ckpt"))
    with pytest.raises(NotFoundError, match="Failed to find any matching files") as error:
        ckpt.restore(str(tmp_path))
    assert f"{str(tmp_path)!r} is a directory: pass td.train.latest_checkpoint(" in str(error.value)


@pytest.mark.parametrize("suffix", [".index", ".data-00000-of-00001"])
def test_a_file_name_instead_of_the_prefix_is_not_found_and_the_prefix_is_named(tmp_path, suffix):
    ckpt = td.train.Checkpoint(v=td.Variable(np.float32(1.0)))
    path = ckpt.save(str(tmp_path / "ckpt"))
    with pytest.raises(NotFoundError, match="Failed to find any matching files") as error:
        ckpt.restore(f"{path}{suffix}")
    assert f"names one of the files of the checkpoint {path!r}: pass that prefix instead" in str(error.value)


# --- 7. shape and dtype mismatches --------------------------------------------------------------


class Small(td.Module):
    def __init__(self, b_shape: tuple[int, ...], b_dtype: Any, fill: float) -> None:
        super().__init__()
        self.a = td.Variable(np.full(3, fill, np.float32))
        self.b = td.Variable(np.full(b_shape, fill, b_dtype))
        self.c = td.Variable(np.full((2, 2), fill, np.float32))


@pytest.mark.parametrize("slots", ["built", "deferred"])
@pytest.mark.parametrize("mismatch", ["shape", "dtype"])
@pytest.mark.parametrize("strategy_name", ["default", mirrored_param(2)])
def test_shape_or_dtype_mismatch_raises_naming_the_key_and_changes_nothing(
    request, tmp_path, strategy_name, mismatch, slots
):
    strategy = request.getfixturevalue(strategy_name)
    with strategy.scope():
        model = Small((2,), np.float32, 1.0)
        optimizer = td.optimizers.SGD(0.1, momentum=0.9)
    optimizer.apply_gradients([(np.ones_like(v.numpy()), v) for v in model.trainable_variables])
    path = td.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

    b_shape, b_dtype = ((4,), np.float32) if mismatch == "shape" else ((2,), np.float64)
    with strategy.scope():
        other = Small(b_shape, b_dtype, 7.0)
        other_optimizer = td.optimizers.SGD(0.1, momentum=0.9)
    if slots == "built":
        other_optimizer.build(other.trainable_variables)
    ckpt = td.train.Checkpoint(model=other, optimizer=other_optimizer)
    watched = {"a": other.a, "b": other.b, "c": other.c, "iterations": other_optimizer.iterations,
               "save_counter": ckpt.save_counter}
    before = snapshot(watched)

    with pytest.raises(ValueError, match=r"^Cannot restore .*ckpt-1: 'model/b' \(") as error:
        ckpt.restore(path)
    message = str(error.value)
    detail = "shape (2,), the variable has shape (4,)" if mismatch == "shape" else "dtype float32, the variable has"
    assert detail in message
    assert "'optimizer/.slots/model/b/momentum'" in message  # the slot of b mismatches too, built or not
    assert "'model/a'" not in message and "'model/c'" not in message
    assert "No variable was changed" in message
    assert_unchanged(before, snapshot(watched))  # not even a and c, whose values did match
    other_optimizer.build(other.trainable_variables)
    for variable in other.trainable_variables:  # and no slot value was left waiting for its slot
        np.testing.assert_array_equal(other_optimizer.get_slot(variable, "momentum").numpy(), 0)
