"""What keeps checkpoint files whole across crashes, beside :class:`~towerdist._src.atomic_file.AtomicFile`.

Every checkpoint file is written through ``AtomicFile`` (durable: ``fsync``-ed, renamed, the
directory ``fsync``-ed), so a crash at any moment leaves the old file or the new one. A
crash can leave its temporary file (``.tmp-*.part``) behind: :func:`sweep_temporaries`
removes those not modified for :data:`STALE_SECONDS`, as a younger one may be another
process's write in progress. :class:`HashingWriter` hashes a data file as it is written.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import stat
import time
from typing import IO, TYPE_CHECKING, Protocol

from towerdist._src.atomic_file import is_temporary

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer  # what io's streams write: bytes, bytearray, memoryview, arrays

__all__ = ["STALE_SECONDS", "Digest", "HashingWriter", "stale", "sweep_temporaries"]


class Digest(Protocol):
    """A running hash, e.g. ``hashlib.sha256()``: what :class:`HashingWriter` feeds."""

    def update(self, data: memoryview, /) -> None: ...

# How long a temporary or unreferenced data file must have been left untouched before a
# sweep removes it. A save in progress rewrites its temporary file continuously and then
# only fsyncs and renames; an hour is far beyond the longest fsync of a checkpoint.
STALE_SECONDS = 3600.0


class HashingWriter(io.RawIOBase):
    """A write-only stream that hashes what passes through (``numpy.savez`` needs no seeking)."""

    def __init__(self, stream: IO[bytes], digest: Digest) -> None:
        super().__init__()
        self._stream = stream
        self._digest = digest
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
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
        if is_temporary(name) and stale(path, now):
            with contextlib.suppress(OSError):  # a sweep never fails the save that runs it
                os.remove(path)


def stale(path: str, now: float) -> bool:
    """True for a regular file not modified for :data:`STALE_SECONDS` (never a link or directory)."""
    try:
        status = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and math.isfinite(status.st_mtime) and now - status.st_mtime > STALE_SECONDS
