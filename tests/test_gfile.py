"""``td.io.gfile``: the ``tf.io.gfile`` functions TensorFlow's multi-worker tutorials use, with TensorFlow's errors."""

from __future__ import annotations

import os

import pytest

import towerdist as td

gfile = td.io.gfile


def test_makedirs_creates_parents_and_accepts_an_existing_directory(tmp_path):
    target = tmp_path / "a" / "workertemp_1"
    gfile.makedirs(str(target))
    gfile.makedirs(target)  # again, and as a PathLike: nothing to do
    assert gfile.isdir(str(target)) and gfile.exists(str(target))
    assert gfile.listdir(str(tmp_path / "a")) == ["workertemp_1"]


def test_rmtree_removes_a_directory_with_its_content(tmp_path):
    target = tmp_path / "workertemp_1" / "ckpt"
    target.mkdir(parents=True)
    (target / "ckpt-1.index").write_text("{}")
    (target / "sub").mkdir()
    gfile.rmtree(str(target))
    assert not gfile.exists(str(target)) and gfile.isdir(str(tmp_path / "workertemp_1"))


def test_glob_and_remove(tmp_path):
    for name in ("ckpt-1.index", "ckpt-2.index", "ckpt-2.data-00000-of-00001"):
        (tmp_path / name).write_text("x")
    assert gfile.glob(str(tmp_path / "ckpt-*.index")) == [str(tmp_path / "ckpt-1.index"), str(tmp_path / "ckpt-2.index")]
    assert gfile.glob(str(tmp_path / "nothing" / "*")) == []
    gfile.remove(str(tmp_path / "ckpt-1.index"))
    assert sorted(gfile.listdir(str(tmp_path))) == ["ckpt-2.data-00000-of-00001", "ckpt-2.index"]


ERRORS = {  # name: (call, TensorFlow's error class, the message's first words)
    "rmtree_missing": (lambda d: gfile.rmtree(os.path.join(d, "missing")), td.errors.NotFoundError,
                       r"td\.io\.gfile\.rmtree\(\) could not delete .*missing: No such file or directory"),
    "rmtree_file": (lambda d: gfile.rmtree(os.path.join(d, "file")), td.errors.FailedPreconditionError,
                    r"td\.io\.gfile\.rmtree\(\) could not delete .*file: Not a directory"),
    "remove_missing": (lambda d: gfile.remove(os.path.join(d, "missing")), td.errors.NotFoundError,
                       r"td\.io\.gfile\.remove\(\) could not delete"),
    "remove_directory": (lambda d: gfile.remove(os.path.join(d, "dir")), td.errors.FailedPreconditionError,
                         r"td\.io\.gfile\.remove\(\) could not delete .*dir: Is a directory"),
    "listdir_missing": (lambda d: gfile.listdir(os.path.join(d, "missing")), td.errors.NotFoundError,
                        r"td\.io\.gfile\.listdir\(\) could not list"),
    # TensorFlow 2.21: NotFoundError "Could not find directory <d>/file"
    "listdir_file": (lambda d: gfile.listdir(os.path.join(d, "file")), td.errors.NotFoundError,
                     r"td\.io\.gfile\.listdir\(\) could not list .*file: Not a directory"),
    "makedirs_over_a_file": (lambda d: gfile.makedirs(os.path.join(d, "file")), td.errors.AlreadyExistsError,
                             r"td\.io\.gfile\.makedirs\(\) could not create"),
    "makedirs_under_a_file": (lambda d: gfile.makedirs(os.path.join(d, "file", "sub")),
                              td.errors.FailedPreconditionError, r"td\.io\.gfile\.makedirs\(\) could not create"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_failures_raise_tensorflows_error_classes_naming_the_path(tmp_path, case):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    call, cls, first_words = ERRORS[case]
    with pytest.raises(cls, match=f"^{first_words}") as error:
        call(str(tmp_path))
    assert isinstance(error.value, td.errors.OpError) and str(tmp_path) in error.value.path
    assert sorted(os.listdir(tmp_path)) == ["dir", "file"]  # nothing changed


def test_a_path_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"^td\.io\.gfile expects a path: a str, bytes or os\.PathLike\. Got 3"):
        gfile.exists(3)


# --- GFile and the other functions, against TensorFlow 2.21's observed results -------------------


def test_gfile_writes_and_reads_text_and_bytes_as_tensorflow(tmp_path):
    path = str(tmp_path / "a.txt")
    with gfile.GFile(path, "w") as f:
        f.write("hello\n")
        f.write(b"world\n")  # TF: either type in either mode
        assert f.tell() == 12
    assert gfile.GFile(path).read() == "hello\nworld\n"
    assert gfile.GFile(path, "rb").read() == b"hello\nworld\n"
    assert gfile.GFile(path).read(3) == "hel"
    assert gfile.GFile(path).readline() == "hello\n"
    assert gfile.GFile(path).readlines() == ["hello\n", "world\n"]
    assert list(gfile.GFile(path)) == ["hello\n", "world\n"]
    assert gfile.GFile(path).size() == 12
    f = gfile.GFile(path)
    assert (f.name, f.mode) == (path, "r")
    f.seek(6)
    assert (f.read(), f.tell()) == ("world\n", 12)
    f.close()
    assert f.read() == "hello\nworld\n"  # TF: a read after close() opens the file again
    with gfile.GFile(path, "a") as f:
        f.write("!")
    assert gfile.GFile(path).read() == "hello\nworld\n!"
    with gfile.GFile(path + "b", "wb") as f:
        f.write(b"\x00\x01")
    assert gfile.GFile(path + "b", "rb").read() == b"\x00\x01"


def test_gfile_opens_when_first_used(tmp_path):
    # TF: no error for a missing file until it is read; a "w" file never written is never created
    missing = gfile.GFile(str(tmp_path / "missing.txt"))
    with pytest.raises(td.errors.NotFoundError, match=r"^td\.io\.gfile\.GFile could not open .*missing\.txt: No such file"):
        missing.read()
    gfile.GFile(str(tmp_path / "lazy.txt"), "w").close()
    assert not os.path.exists(tmp_path / "lazy.txt")


@pytest.mark.parametrize(
    ("mode", "call", "cls"),
    [
        ("x", None, td.errors.InvalidArgumentError),  # TF: "mode is not 'r' or 'w' or 'a' or 'r+' or 'w+' or 'a+'"
        ("w", "read", td.errors.PermissionDeniedError),  # TF: "File isn't open for reading"
        ("r", "write", td.errors.PermissionDeniedError),  # TF: "File isn't open for writing"
    ],
)
def test_gfile_refuses_what_its_mode_does_not_allow(tmp_path, mode, call, cls):
    path = str(tmp_path / "file")
    (tmp_path / "file").write_text("x")
    with pytest.raises(cls):
        f = gfile.GFile(path, mode)
        f.read() if call == "read" else f.write("y")
    assert (tmp_path / "file").read_text() == "x"


def test_gfile_of_a_directory_is_a_failed_precondition(tmp_path):
    with pytest.raises(td.errors.FailedPreconditionError):  # TF: "<d>/dir; Is a directory"
        gfile.GFile(str(tmp_path)).read()


def test_rename_and_copy_refuse_to_replace_unless_asked(tmp_path):
    a, b, c = (str(tmp_path / n) for n in ("a.txt", "b.txt", "c.txt"))
    (tmp_path / "a.txt").write_text("1")
    gfile.rename(a, b)
    assert not gfile.exists(a) and gfile.GFile(b).read() == "1"
    with pytest.raises(td.errors.NotFoundError, match=r"^td\.io\.gfile\.rename\(\) could not rename"):
        gfile.rename(a, c)
    (tmp_path / "a.txt").write_text("2")
    with pytest.raises(td.errors.AlreadyExistsError, match="file already exists; pass overwrite=True"):
        gfile.rename(a, b)  # TF: AlreadyExistsError "file already exists"
    gfile.rename(a, b, overwrite=True)
    assert gfile.GFile(b).read() == "2"
    gfile.copy(b, c)
    with pytest.raises(td.errors.AlreadyExistsError):
        gfile.copy(b, c)
    gfile.copy(b, c, overwrite=True)
    assert gfile.GFile(c).read() == "2" and gfile.exists(b)
    (tmp_path / "d" / "sub").mkdir(parents=True)
    gfile.rename(str(tmp_path / "d"), str(tmp_path / "e"))  # directories too
    assert gfile.isdir(str(tmp_path / "e" / "sub"))
    with pytest.raises(td.errors.InvalidArgumentError):  # TF: InvalidArgumentError
        gfile.copy(str(tmp_path / "e"), str(tmp_path / "f"))


def test_mkdir_join_stat_and_walk(tmp_path):
    target = str(tmp_path / "m")
    gfile.mkdir(target)
    gfile.mkdir(target)  # TF: nothing to do
    with pytest.raises(td.errors.NotFoundError, match=r"^td\.io\.gfile\.mkdir\(\) could not create"):
        gfile.mkdir(str(tmp_path / "x" / "y"))
    assert gfile.join("a", "b", "c") == "a/b/c"
    (tmp_path / "f.txt").write_text("x")
    found = gfile.stat(str(tmp_path / "f.txt"))
    assert (found.length, found.is_directory, type(found.mtime_nsec)) == (1, False, int)
    assert gfile.stat(target).is_directory
    with pytest.raises(td.errors.NotFoundError):
        gfile.stat(str(tmp_path / "nope"))
    (tmp_path / "m" / "sub").mkdir()
    (tmp_path / "m" / "sub" / "g.txt").write_text("y")
    assert list(gfile.walk(target)) == [(target, ["sub"], []), (os.path.join(target, "sub"), [], ["g.txt"])]
    assert list(gfile.walk(target, topdown=False))[0] == (os.path.join(target, "sub"), [], ["g.txt"])
    assert list(gfile.walk(str(tmp_path / "nope"))) == []  # TF: []
    errors = []
    assert list(gfile.walk(str(tmp_path / "nope"), onerror=errors.append)) == [] and len(errors) == 1
