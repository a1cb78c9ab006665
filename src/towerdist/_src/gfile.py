"""``td.io.gfile``: the few ``tf.io.gfile`` functions TensorFlow's multi-worker tutorials use, on local paths.

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
from typing import Any

from towerdist._src import errors

__all__ = ["exists", "glob", "isdir", "listdir", "makedirs", "remove", "rmtree"]

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


def _as_path(path: Any) -> str:
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(
            f"td.io.gfile expects a path: a str, bytes or os.PathLike. Got {path!r} of type {type(path).__name__}."
        ) from None


def _op_error(error: OSError, what: str, path: str) -> errors.OpError:
    cls = _CLASS_OF_ERRNO.get(error.errno or 0, errors.UnknownError)
    return cls(f"{what} {path}: {error.strerror or error}", path=path)


def exists(path: Any) -> bool:
    """True if ``path`` exists (a file, a directory, or anything else).

    Args:
      path: a ``str``, ``bytes`` or ``os.PathLike``.
    """
    return os.path.exists(_as_path(path))


def isdir(path: Any) -> bool:
    """True if ``path`` is a directory."""
    return os.path.isdir(_as_path(path))


def listdir(path: Any) -> list[str]:
    """The names of the entries of the directory ``path`` (in no particular order, as TensorFlow's).

    Raises:
      NotFoundError: ``path`` does not exist.
      FailedPreconditionError: ``path`` is not a directory.
    """
    where = _as_path(path)
    try:
        return os.listdir(where)
    except OSError as error:
        raise _op_error(error, "td.io.gfile.listdir() could not list", where) from error


def glob(pattern: Any) -> list[str]:
    """The paths that match ``pattern`` (``*``, ``?`` and ``[...]`` as in ``fnmatch``), sorted; [] if none."""
    return sorted(glob_lib.glob(_as_path(pattern)))


def makedirs(path: Any) -> None:
    """Creates the directory ``path`` and every missing parent; nothing to do if it exists.

    Raises:
      AlreadyExistsError: ``path`` (or a parent) exists and is not a directory.
      PermissionDeniedError: a directory may not be created there.
    """
    where = _as_path(path)
    try:
        os.makedirs(where, exist_ok=True)
    except OSError as error:
        raise _op_error(error, "td.io.gfile.makedirs() could not create", where) from error


def remove(path: Any) -> None:
    """Deletes the file ``path``.

    Raises:
      NotFoundError: ``path`` does not exist.
      FailedPreconditionError: ``path`` is a directory (use :func:`rmtree`).
    """
    where = _as_path(path)
    try:
        if os.path.isdir(where) and not os.path.islink(where):
            raise IsADirectoryError(errno.EISDIR, "Is a directory; use td.io.gfile.rmtree() for directories")
        os.remove(where)
    except OSError as error:
        raise _op_error(error, "td.io.gfile.remove() could not delete", where) from error


def rmtree(path: Any) -> None:
    """Deletes the directory ``path`` and everything in it.

    Raises:
      NotFoundError: ``path`` does not exist.
      FailedPreconditionError: ``path`` is not a directory (use :func:`remove`).
    """
    where = _as_path(path)
    try:
        if not os.path.lexists(where):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        if not os.path.isdir(where) or os.path.islink(where):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory; use td.io.gfile.remove() for files")
        shutil.rmtree(where)
    except OSError as error:
        raise _op_error(error, "td.io.gfile.rmtree() could not delete", where) from error
