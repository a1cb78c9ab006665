"""Files that survive a crash whole: written to a temporary name, ``fsync``-ed, renamed; and their sweep.

A file is written to a temporary file in its own directory (``.tmp-*.part``, what
``tempfile.mkstemp`` makes), flushed, ``fsync``-ed and renamed over its final name with
``os.replace`` (atomic on POSIX and Windows), and the directory is ``fsync``-ed so that the
rename itself is durable: a crash at any moment leaves the old file or the new one, never
a mix.

A crash can leave a temporary file behind. :func:`sweep_temporaries` removes those not
modified for :data:`STALE_SECONDS`: a younger one may be another process's write in
progress.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

__all__ = ["STALE_SECONDS", "HashingWriter", "atomic_write", "fsync_directory", "stale", "sweep_temporaries",
           "write_temporary"]

# How long a temporary or unreferenced data file must have been left untouched before a
# sweep removes it. A save in progress rewrites its temporary file continuously and then
# only fsyncs and renames; an hour is far beyond the longest fsync of a checkpoint.
STALE_SECONDS = 3600.0
_TEMPORARY = re.compile(r"\.tmp-[a-z0-9_]+\.part")  # what tempfile.mkstemp(prefix=".tmp-", suffix=".part") makes


def atomic_write(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Writes ``path`` through ``write(stream)`` so that a crash leaves the old file or the new one."""
    directory = os.path.dirname(path) or "."
    temporary = write_temporary(directory, write)
    os.replace(temporary, path)
    fsync_directory(directory)


def write_temporary(directory: str, write: Callable[[IO[bytes]], Any]) -> str:
    """Writes a durable temporary file in ``directory`` through ``write(stream)``; returns its path."""
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
    try:
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600; give the mode open() would
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    return temporary


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (briefly process-wide)
    os.umask(mask)
    return mask


def fsync_directory(directory: str) -> None:
    """Makes a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
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


class HashingWriter(io.RawIOBase):
    """A write-only stream that hashes what passes through (``numpy.savez`` needs no seeking)."""

    def __init__(self, stream: IO[bytes], digest: Any) -> None:
        super().__init__()
        self._stream = stream
        self._digest = digest
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._digest.update(view)
        self._stream.write(view)
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._stream.flush()


def sweep_temporaries(directory: str) -> None:
    """Removes the stale temporary files (``.tmp-*.part``) a crashed save left in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(directory, name)
        if _TEMPORARY.fullmatch(name) and stale(path, now):
            with contextlib.suppress(OSError):  # a sweep never fails the save that runs it
                os.remove(path)


def stale(path: str, now: float) -> bool:
    """True for a regular file not modified for :data:`STALE_SECONDS` (never a link or directory)."""
    try:
        status = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and math.isfinite(status.st_mtime) and now - status.st_mtime > STALE_SECONDS
