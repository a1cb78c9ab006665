"""``td.io.gfile``: ``tf.io.gfile``'s functions on local paths (``GFile`` is in ``gfile_file.py``).

TensorFlow's tutorial for ``MultiWorkerMirroredStrategy`` makes a ``workertemp_<id>``
directory with ``tf.io.gfile.makedirs`` for a non-chief worker's checkpoints and removes
them with ``tf.io.gfile.rmtree``; scripts test for files with ``exists``, ``glob``,
``isdir`` and ``listdir``. These are thin wrappers over ``os``, ``shutil`` and ``glob``
for local paths (no ``gs://`` or other filesystems), raising TensorFlow's error classes:
an ``OSError`` becomes the ``td.errors`` class TensorFlow gives its ``errno`` (``ENOENT``:
``NotFoundError``, ``EEXIST``: ``AlreadyExistsError``, ``EACCES``/``EPERM``:
``PermissionDeniedError``, ``ENOTDIR``/``EISDIR``/``ENOTEMPTY``: ``FailedPreconditionError``,
``ENOSPC``: ``ResourceExhaustedError``, anything else: ``UnknownError``), with the path as
its ``path`` attribute.
"""

from __future__ import annotations

import errno
import glob as glob_lib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeAlias

from towerdist._src import errors

# What td.io.gfile accepts as a path, as os.fspath does (checked at run time by as_path).
PathLike: TypeAlias = "str | bytes | os.PathLike[str] | os.PathLike[bytes]"

__all__ = [
    "FileStatistics",
    "copy",
    "exists",
    "glob",
    "isdir",
    "join",
    "listdir",
    "makedirs",
    "mkdir",
    "remove",
    "rename",
    "rmtree",
    "stat",
    "walk",
]

# TensorFlow's ErrnoToCode (tensorflow/tsl/platform/errors), for the errnos file operations give.
_CLASS_OF_ERRNO: dict[int, type[errors.OpError]] = {
    errno.ENOENT: errors.NotFoundError,
    errno.EEXIST: errors.AlreadyExistsError,
    errno.EACCES: errors.PermissionDeniedError,
    errno.EPERM: errors.PermissionDeniedError,
    errno.EROFS: errors.PermissionDeniedError,
    errno.ENOTDIR: errors.FailedPreconditionError,
    errno.EISDIR: errors.FailedPreconditionError,
    errno.ENOTEMPTY: errors.FailedPreconditionError,
    errno.EBUSY: errors.FailedPreconditionError,
    errno.ENOSPC: errors.ResourceExhaustedError,
    errno.EFBIG: errors.ResourceExhaustedError,
    errno.ENAMETOOLONG: errors.InvalidArgumentError,
}


def as_path(path: PathLike) -> str:
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(
            f"td.io.gfile expects a path: a str, bytes or os.PathLike. Got {path!r} of type {type(path).__name__}."
        ) from None


def op_error(error: OSError, what: str, path: str) -> errors.OpError:
    cls = _CLASS_OF_ERRNO.get(error.errno or 0, errors.UnknownError)
    return cls(f"{what} {path}: {error.strerror or error}", path=path)


def exists(path: PathLike) -> bool:
    """True if ``path`` exists (a file, a directory, or anything else).

    Args:
      path: a ``str``, ``bytes`` or ``os.PathLike``.
    """
    return os.path.exists(as_path(path))


def isdir(path: PathLike) -> bool:
    """True if ``path`` is a directory."""
    return os.path.isdir(as_path(path))


def listdir(path: PathLike) -> list[str]:
    """The names of the entries of the directory ``path`` (in no particular order, as TensorFlow's).

    Raises:
      NotFoundError: ``path`` does not exist or is not a directory (TensorFlow 2.21: "Could not
        find directory" for both).
    """
    where = as_path(path)
    try:
        return os.listdir(where)
    except NotADirectoryError as error:
        raise errors.NotFoundError(
            f"td.io.gfile.listdir() could not list {where}: Not a directory (TensorFlow: Could not find directory)",
            path=where,
        ) from error
    except OSError as error:
        raise op_error(error, "td.io.gfile.listdir() could not list", where) from error


def glob(pattern: PathLike) -> list[str]:
    """The paths that match ``pattern`` (``*``, ``?`` and ``[...]`` as in ``fnmatch``), sorted; [] if none."""
    return sorted(glob_lib.glob(as_path(pattern)))


def makedirs(path: PathLike) -> None:
    """Creates the directory ``path`` and every missing parent; nothing to do if it exists.

    Raises:
      AlreadyExistsError: ``path`` (or a parent) exists and is not a directory.
      PermissionDeniedError: a directory may not be created there.
    """
    where = as_path(path)
    try:
        os.makedirs(where, exist_ok=True)
    except OSError as error:
        raise op_error(error, "td.io.gfile.makedirs() could not create", where) from error


def remove(path: PathLike) -> None:
    """Deletes the file ``path``.

    Raises:
      NotFoundError: ``path`` does not exist.
      FailedPreconditionError: ``path`` is a directory (use :func:`rmtree`).
    """
    where = as_path(path)
    try:
        if os.path.isdir(where) and not os.path.islink(where):
            raise IsADirectoryError(errno.EISDIR, "Is a directory; use td.io.gfile.rmtree() for directories")
        os.remove(where)
    except OSError as error:
        raise op_error(error, "td.io.gfile.remove() could not delete", where) from error


def rmtree(path: PathLike) -> None:
    """Deletes the directory ``path`` and everything in it.

    Raises:
      NotFoundError: ``path`` does not exist.
      FailedPreconditionError: ``path`` is not a directory (use :func:`remove`).
    """
    where = as_path(path)
    try:
        if not os.path.lexists(where):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        if not os.path.isdir(where) or os.path.islink(where):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory; use td.io.gfile.remove() for files")
        shutil.rmtree(where)
    except OSError as error:
        raise op_error(error, "td.io.gfile.rmtree() could not delete", where) from error


def mkdir(path: PathLike) -> None:
    """Creates the directory ``path``, whose parent must exist; nothing to do if it exists (as TensorFlow 2.21).

    Raises:
      NotFoundError: the parent does not exist (use :func:`makedirs`).
      AlreadyExistsError: ``path`` is a file.
    """
    where = as_path(path)
    try:
        if not os.path.isdir(where):
            os.mkdir(where)
    except OSError as error:
        raise op_error(error, "td.io.gfile.mkdir() could not create", where) from error


def rename(oldname: PathLike, newname: PathLike, overwrite: bool = False) -> None:
    """Renames (moves) the file or directory ``oldname`` to ``newname``.

    Raises:
      AlreadyExistsError: ``newname`` exists and ``overwrite`` is False.
      NotFoundError: ``oldname`` does not exist.
    """
    old, new = as_path(oldname), as_path(newname)
    _refuse_existing(new, overwrite, "rename")
    try:
        os.replace(old, new)
    except OSError as error:
        raise op_error(error, f"td.io.gfile.rename() could not rename {old} to", new) from error


def copy(oldpath: PathLike, newpath: PathLike, overwrite: bool = False) -> None:
    """Copies the file ``oldpath`` to ``newpath``.

    Raises:
      AlreadyExistsError: ``newpath`` exists and ``overwrite`` is False.
      NotFoundError: ``oldpath`` does not exist.
      InvalidArgumentError: ``oldpath`` is a directory.
    """
    old, new = as_path(oldpath), as_path(newpath)
    _refuse_existing(new, overwrite, "copy")
    if os.path.isdir(old):
        raise errors.InvalidArgumentError(
            f"td.io.gfile.copy() copies files, and {old} is a directory; copy its files one by one "
            f"(td.io.gfile.walk()), or use shutil.copytree().",
            path=old,
        )
    try:
        shutil.copyfile(old, new)
    except OSError as error:
        raise op_error(error, f"td.io.gfile.copy() could not copy {old} to", new) from error


def _refuse_existing(path: str, overwrite: bool, api: str) -> None:
    if not overwrite and os.path.lexists(path):
        raise errors.AlreadyExistsError(
            f"td.io.gfile.{api}() will not replace {path}: file already exists; pass overwrite=True to replace it.",
            path=path,
        )


def join(path: PathLike, *paths: PathLike) -> str:
    """``path`` and ``paths`` joined with ``/`` (``os.path.join``)."""
    return os.path.join(as_path(path), *(as_path(p) for p in paths))


class FileStatistics(NamedTuple):
    """What :func:`stat` returns (TensorFlow's ``FileStatistics``)."""

    length: int
    mtime_nsec: int
    is_directory: bool


def stat(path: PathLike) -> FileStatistics:
    """The size, modification time (ns) and kind of ``path``.

    Raises:
      NotFoundError: ``path`` does not exist.
    """
    where = as_path(path)
    try:
        found = os.stat(where)
    except OSError as error:
        raise op_error(error, "td.io.gfile.stat() could not read", where) from error
    return FileStatistics(found.st_size, found.st_mtime_ns, os.path.isdir(where))


def walk(
    top: PathLike, topdown: bool = True, onerror: Callable[[errors.OpError], Any] | None = None
) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(directory, subdirectories, files)`` for ``top`` and every directory below it (nothing if ``top`` is missing).

    Args:
      top: the directory to start from.
      topdown: yield a directory before (True) or after (False) those below it.
      onerror: called with the error when a directory cannot be listed; it is then skipped.
    """
    where = as_path(top)
    try:
        names = listdir(where)
    except errors.OpError as error:
        if onerror is not None:
            onerror(error)
        return
    subdirectories = [name for name in names if os.path.isdir(os.path.join(where, name))]
    files = [name for name in names if name not in subdirectories]
    if topdown:
        yield where, subdirectories, files
    for name in subdirectories:
        yield from walk(os.path.join(where, name), topdown, onerror)
    if not topdown:
        yield where, subdirectories, files
