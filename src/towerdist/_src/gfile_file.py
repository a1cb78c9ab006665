"""``td.io.gfile.GFile``: TensorFlow's file object (``tf.io.gfile.GFile``) on local paths.

As TensorFlow 2.21's ``FileIO``: the file is opened when first read or written (a ``"w"``
file that is never written is never created; a missing file raises ``NotFoundError`` at the
first read, not when the object is made); text modes return ``str`` and binary modes
(``"rb"``, ...) ``bytes``, while ``write`` takes either in every mode; ``read(n)`` reads ``n``
bytes; after ``close()`` a read opens the file again from its start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO, Any

from towerdist._src import errors
from towerdist._src.gfile import PathLike, as_path, op_error

__all__ = ["GFile"]

_MODES = ("r", "w", "a", "r+", "w+", "a+")


class GFile:
    """A file on a local path (``tf.io.gfile.GFile``; also ``tf.io.gfile.Open`` in TF 1.x).

    Args:
      name: the path (``str``, ``bytes`` or ``os.PathLike``).
      mode: ``"r"``, ``"w"``, ``"a"``, ``"r+"``, ``"w+"`` or ``"a+"``, with ``"b"`` for bytes.

    Raises:
      InvalidArgumentError: another mode.

    Example:
      >>> with td.io.gfile.GFile("/tmp/notes.txt", "w") as f:
      ...     f.write("hello\\n")
      >>> td.io.gfile.GFile("/tmp/notes.txt").read()
      'hello\\n'
    """

    def __init__(self, name: PathLike, mode: str = "r") -> None:
        path = as_path(name)
        if not isinstance(mode, str) or mode.replace("b", "", 1) not in _MODES:
            raise errors.InvalidArgumentError(
                f"mode is not 'r' or 'w' or 'a' or 'r+' or 'w+' or 'a+': td.io.gfile.GFile() got mode={mode!r} "
                f"for {path}; add 'b' for bytes (e.g. 'rb')."
            )
        self._name = path
        self._mode = mode
        self._binary = "b" in mode
        self._file: IO[bytes] | None = None

    @property
    def name(self) -> str:
        """The path, as given."""
        return self._name

    @property
    def mode(self) -> str:
        """The mode, as given."""
        return self._mode

    # --- reading -----------------------------------------------------------------------------

    def read(self, n: int = -1) -> Any:
        """The next ``n`` bytes (all the rest with -1), as ``str`` in text modes and ``bytes`` in binary ones.

        Raises:
          NotFoundError: the file does not exist.
          PermissionDeniedError: the file was opened for writing only.
        """
        return self._decode(self._reader().read(-1 if n is None else n))

    def readline(self) -> Any:
        """The next line with its newline (empty at the end of the file)."""
        return self._decode(self._reader().readline())

    def readlines(self) -> list[Any]:
        """Every line left."""
        return [self._decode(line) for line in self._reader().readlines()]

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    # --- writing -----------------------------------------------------------------------------

    def write(self, file_content: str | bytes | bytearray | memoryview) -> None:
        """Writes ``file_content`` (``str``, encoded as UTF-8, or ``bytes``), creating the file on the first write.

        Raises:
          PermissionDeniedError: the file was opened for reading only.
        """
        data = file_content.encode("utf-8") if isinstance(file_content, str) else bytes(file_content)
        self._writer().write(data)

    def flush(self) -> None:
        """Pushes what was written to the file."""
        if self._file is not None:
            self._file.flush()

    # --- position ------------------------------------------------------------------------------

    def seek(self, offset: int | None = None, whence: int = 0, position: int | None = None) -> int:
        """Moves to ``offset`` (``position`` is its old name) from the start, the current position or the end."""
        if position is not None:
            offset = position
        return self._handle().seek(0 if offset is None else offset, whence)

    def tell(self) -> int:
        """The current position, in bytes."""
        return self._handle().tell()

    def size(self) -> int:
        """The file's length in bytes (what was written included)."""
        self.flush()
        try:
            return os.stat(self._name).st_size
        except OSError as error:
            raise op_error(error, "td.io.gfile.GFile.size() could not read the size of", self._name) from error

    def seekable(self) -> bool:
        """True: a local file can seek."""
        return True

    def readable(self) -> bool:
        """Whether the mode reads (``"r"`` or a ``"+"`` mode)."""
        return self._mode.startswith("r") or "+" in self._mode

    def writable(self) -> bool:
        """Whether the mode writes (``"w"``, ``"a"`` or a ``"+"`` mode)."""
        return not self._mode.startswith("r") or "+" in self._mode

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the file; a later read opens it again from its start."""
        if self._file is not None:
            file, self._file = self._file, None
            file.close()

    def __enter__(self) -> GFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<td.io.gfile.GFile name={self._name!r} mode={self._mode!r}>"

    # --- helpers -------------------------------------------------------------------------------

    # str or bytes, as the mode says: Any, so that callers use either without a cast (as TF's GFile).
    def _decode(self, data: bytes) -> Any:
        return data if self._binary else data.decode("utf-8")

    def _reader(self) -> IO[bytes]:
        if not self.readable():
            raise errors.PermissionDeniedError(
                f"td.io.gfile.GFile {self._name} was opened with mode={self._mode!r}, which does not read; "
                f"open it with 'r' (or 'r+', 'w+', 'a+').",
                path=self._name,
            )
        return self._handle()

    def _writer(self) -> IO[bytes]:
        if not self.writable():
            raise errors.PermissionDeniedError(
                f"td.io.gfile.GFile {self._name} was opened with mode={self._mode!r}, which does not write; "
                f"open it with 'w' or 'a' (or 'r+').",
                path=self._name,
            )
        return self._handle()

    def _handle(self) -> IO[bytes]:
        if self._file is None:
            try:
                self._file = open(self._name, self._mode.replace("b", "", 1) + "b")  # noqa: SIM115  (closed by close())
            except OSError as error:
                raise op_error(error, "td.io.gfile.GFile could not open", self._name) from error
        return self._file
