"""``AtomicFile``: a file written under a temporary name beside its target and put in place whole."""

from __future__ import annotations

import os
import sys

import pytest

from towerdist._src.atomic_file import AtomicFile, is_temporary


def test_the_target_keeps_its_old_content_until_the_commit_replaces_it(tmp_path):
    target = tmp_path / "state"
    target.write_bytes(b"old")
    writing = AtomicFile(str(target))
    writing.file.write(b"new content")
    writing.file.flush()
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == sorted(["state", os.path.basename(writing.temporary)])
    assert os.path.dirname(writing.temporary) == str(tmp_path) and is_temporary(os.path.basename(writing.temporary))
    writing.commit()
    assert target.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["state"]


def test_a_with_block_writes_the_file_and_puts_it_in_place(tmp_path):
    target = tmp_path / "state"
    with AtomicFile(str(target)) as file:
        file.write(b"abc")
    assert target.read_bytes() == b"abc" and os.listdir(tmp_path) == ["state"]


def test_a_failure_while_writing_propagates_and_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "state"
    target.write_bytes(b"old")
    failure = KeyError("failed mid-write")
    with pytest.raises(KeyError) as info:
        with AtomicFile(str(target)) as file:
            file.write(b"half of the new")
            raise failure
    assert info.value is failure
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["state"]


def test_a_failing_rename_propagates_and_removes_the_temporary(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_bytes(b"x")  # a directory that is not empty cannot be replaced by a file
    with pytest.raises(OSError):
        with AtomicFile(str(target)) as file:
            file.write(b"new")
    assert os.listdir(tmp_path) == ["taken"] and os.listdir(target) == ["inside"]


def test_a_missing_directory_fails_when_the_file_is_made(tmp_path):
    with pytest.raises(FileNotFoundError):
        AtomicFile(str(tmp_path / "missing" / "state"))
    assert os.listdir(tmp_path) == []


def test_discard_removes_the_temporary_and_leaves_the_target(tmp_path):
    target = tmp_path / "state"
    target.write_bytes(b"old")
    reserved = AtomicFile(str(target))
    reserved.file.write(b"never used")
    reserved.discard()
    reserved.discard()  # again: nothing left to do
    assert reserved.file.closed
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["state"]


def test_text_files_are_written_as_utf8(tmp_path):
    target = tmp_path / "manifest.json"
    with AtomicFile(str(target), text=True) as file:
        file.write('{"name": "naïve"}')
    assert target.read_bytes() == '{"name": "naïve"}'.encode()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="tells a directory's descriptor from a file's (Linux)")
def test_a_durable_file_is_synced_before_the_rename_and_its_directory_after(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        events.append(("fsync", "directory" if os.path.isdir(f"/proc/self/fd/{descriptor}") else "file"))
        real_fsync(descriptor)

    def replace(source: str, destination: str) -> None:
        events.append(("replace", os.path.basename(destination)))
        real_replace(source, destination)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with AtomicFile(str(tmp_path / "state")) as file:
        file.write(b"abc")
    assert events == [("fsync", "file"), ("replace", "state"), ("fsync", "directory")]


def test_a_file_that_is_not_durable_is_renamed_without_a_sync(tmp_path, monkeypatch):
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    with AtomicFile(str(tmp_path / "trace.json"), durable=False) as file:
        file.write(b"abc")
    assert synced == [] and (tmp_path / "trace.json").read_bytes() == b"abc"


def test_an_exclusive_file_is_written_only_where_nothing_is(tmp_path):
    target = tmp_path / "join-r0"
    with AtomicFile(str(target), exclusive=True) as file:
        file.write(b"first")
    with pytest.raises(FileExistsError):
        with AtomicFile(str(target), exclusive=True) as file:
            file.write(b"second")
    assert target.read_bytes() == b"first" and os.listdir(tmp_path) == ["join-r0"]


def test_a_file_named_after_its_content_is_put_in_place_under_the_path_set_before_the_commit(tmp_path):
    writing = AtomicFile(str(tmp_path / "data"))
    with writing as file:
        file.write(b"abc")
        writing.path = str(tmp_path / "data.abc.pending")
    assert os.listdir(tmp_path) == ["data.abc.pending"]


def test_writers_of_one_target_use_their_own_temporaries_and_the_last_commit_wins(tmp_path):
    target = str(tmp_path / "state")
    first, second = AtomicFile(target), AtomicFile(target)
    assert first.temporary != second.temporary
    first.file.write(b"first")
    second.file.write(b"second")
    second.commit()
    first.commit()
    assert (tmp_path / "state").read_bytes() == b"first" and os.listdir(tmp_path) == ["state"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_the_file_gets_the_mode_open_gives_a_new_file(tmp_path):
    with open(tmp_path / "by-open", "wb"):
        pass
    with AtomicFile(str(tmp_path / "atomic")) as file:
        file.write(b"abc")
    assert os.stat(tmp_path / "atomic").st_mode == os.stat(tmp_path / "by-open").st_mode


@pytest.mark.parametrize(
    ("name", "temporary"),
    [(".tmp-0123456789abcdef0123456789abcdef.part", True), (".tmp-crashed_1.part", True), (".tmp-notes.txt", False),
     ("notes.part", False), (".tmp-UPPER.part", False), ("x.tmp-abc.part", False)],
)
def test_is_temporary_recognizes_the_names_of_temporary_files(name, temporary):
    assert is_temporary(name) is temporary
