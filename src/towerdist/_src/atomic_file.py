"""``AtomicFile``: a file written under a temporary name beside its target, then put in place whole.

Use it for every file that a reader (another thread, another process, or this program after
a crash) may open while it is being written: a checkpoint's index and data, the checkpoint
state file, a saved dataset's manifest, a cache file, a trace, the simulated NCCL's
rendezvous files. The reader sees the old file or the new one, never a part of either.

The temporary file is made in the target's directory (a rename is atomic only within one
file system) under a name of its own, ``.tmp-<32 hex digits>.part``, so any number of
threads and processes, on one host or on several sharing a directory, may write the same
target at once: the last rename wins. It gets the mode ``open()`` gives a new file
(``0o666`` less the umask).

With ``durable=True`` (the default) the file is flushed and ``fsync``-ed before the rename
and its directory after it, so the rename itself survives a power loss. A crash at any moment
leaves the old file or the new one, and perhaps a stray temporary file, which
:func:`is_temporary` recognizes so that a sweep can remove it.

If writing, syncing or renaming fails, the temporary file is removed, the target is left as
it was and the error propagates unchanged.

Example::

    with AtomicFile(path) as file:  # text=True for a str file (UTF-8)
        file.write(data)
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from types import TracebackType
from typing import IO, AnyStr, Generic, Literal, overload

__all__ = ["AtomicFile", "fsync_directory", "is_temporary"]

# The names drawn here, and those of the same form from other writers (what
# tempfile.mkstemp(prefix=".tmp-", suffix=".part") makes), so that a sweep recognizes them all.
_TEMPORARY = re.compile(r"\.tmp-[a-z0-9_]+\.part")
# O_EXCL: a name drawn twice is an error, never another writer's file overwritten. O_BINARY:
# no newline translation below the file object on Windows (0 elsewhere).
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)


class AtomicFile(Generic[AnyStr]):
    """A new file for ``path``, written under a temporary name in its directory and put in place whole.

    Used as a context manager it yields the open file and, when the block ends, puts the
    file in place (:meth:`commit`) or, if the block raised, removes it (:meth:`discard`).
    Without ``with`` the caller decides when, for a file made before what goes into it is
    known (so that an unwritable directory fails first).

    Args:
      path: the target; its directory must exist.
      text: open the file for ``str`` (UTF-8) rather than ``bytes``.
      durable: ``fsync`` the file before the rename and the directory after it.
      exclusive: put the file in place only if ``path`` does not exist (a hard link, then
        the temporary name removed), else raise ``FileExistsError`` and write nothing.
      prefix: how the temporary file's name begins. The default's names are what
        :func:`is_temporary` recognizes, which a checkpoint's sweep removes once an hour
        old: a file held open longer before it is written (a cache file reserved when its
        pass starts) needs a prefix of its own.

    Attributes:
      file: the open temporary file.
      path: the target. A file named after what it holds (its hash, say) is given its name
        here once it is written, before the commit; it must stay in the same directory.
      temporary: the temporary file's path.

    Raises:
      OSError: the temporary file cannot be made (``FileNotFoundError`` for a missing
        directory, ``PermissionError``, ...).
    """

    file: IO[AnyStr]

    @overload
    def __init__(
        self: AtomicFile[bytes], path: str, *, text: Literal[False] = False, durable: bool = True,
        exclusive: bool = False, prefix: str = ".tmp-",
    ) -> None: ...

    @overload
    def __init__(
        self: AtomicFile[str], path: str, *, text: Literal[True], durable: bool = True, exclusive: bool = False,
        prefix: str = ".tmp-",
    ) -> None: ...

    def __init__(
        self, path: str, *, text: bool = False, durable: bool = True, exclusive: bool = False, prefix: str = ".tmp-"
    ) -> None:
        self.path = path
        self._durable = durable
        self._exclusive = exclusive
        # 128 random bits: no two writers draw the same name, across processes and hosts.
        self.temporary = os.path.join(os.path.dirname(path), f"{prefix}{uuid.uuid4().hex}.part")
        descriptor = os.open(self.temporary, _CREATE, 0o666)  # the mode open() gives, less the umask
        try:
            self.file = os.fdopen(descriptor, "w" if text else "wb", encoding="utf-8" if text else None)
        except BaseException:
            os.close(descriptor)
            _remove(self.temporary)
            raise

    def __enter__(self) -> IO[AnyStr]:
        return self.file

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()

    def commit(self) -> None:
        """Closes the file and puts it in place at :attr:`path`, replacing what is there.

        Raises:
          FileExistsError: ``exclusive`` was given and the target exists; nothing was written.
          OSError: flushing, syncing or renaming failed; the temporary file is removed.
        """
        target = self.path
        try:
            self.file.flush()
            if self._durable:
                os.fsync(self.file.fileno())
            self.file.close()
            if self._exclusive:
                os.link(self.temporary, target)  # fails if the target exists, unlike a rename
                _remove(self.temporary)
            else:
                os.replace(self.temporary, target)
        except BaseException:
            self.discard()
            raise
        if self._durable:
            fsync_directory(os.path.dirname(target) or ".")

    def discard(self) -> None:
        """Closes and removes the temporary file, leaving the target as it is (again: nothing to do)."""
        with contextlib.suppress(OSError):  # a failed flush of what is discarded anyway; the descriptor is closed
            self.file.close()
        _remove(self.temporary)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):  # already removed, or renamed
        os.remove(path)


def is_temporary(name: str) -> bool:
    """True if the file name ``name`` (no directory) has the form of an :class:`AtomicFile`'s temporary file."""
    return _TEMPORARY.fullmatch(name) is not None


def fsync_directory(directory: str) -> None:
    """Makes a rename in ``directory`` durable (a no-op where directories cannot be opened or synced)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
