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
    "listdir_file": (lambda d: gfile.listdir(os.path.join(d, "file")), td.errors.FailedPreconditionError,
                     r"td\.io\.gfile\.listdir\(\) could not list"),
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
