"""File sources: ``list_files`` and ``TextLineDataset``, the datasets FILE auto-sharding splits."""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import os
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, TypeAlias

import numpy as np

from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.sources import TensorSliceDataset
from towerdist._src.data.spec import ElementSpec, TensorSpec
from towerdist._src.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)

__all__ = ["FileNames", "TextLineDataset", "list_files"]

# One file name or pattern, or several (a list, tuple or numpy array of them): what ``list_files``
# and ``TextLineDataset`` take (checked at run time). ``bytes`` and path objects are decoded.
FileName: TypeAlias = "str | bytes | os.PathLike[str] | os.PathLike[bytes]"
FileNames: TypeAlias = "FileName | Sequence[FileName] | np.ndarray[Any, Any]"


def _names(value: FileNames, what: str) -> list[str]:
    if isinstance(value, (str, bytes, os.PathLike)):
        value = [value]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1).tolist()
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} takes a file name, a list of them, or a dataset of them. Got {value!r}.")
    out = []
    for item in value:
        item = os.fsdecode(item) if isinstance(item, (bytes, os.PathLike)) else item
        if not isinstance(item, str):
            raise TypeError(f"{what} takes file names as strings. Got {item!r}.")
        out.append(item)
    return out


def list_files(file_pattern: FileNames, shuffle: bool | None, seed: int | None) -> Dataset:
    patterns = _names(file_pattern, "list_files()")
    matched = sorted({name for pattern in patterns for name in glob.glob(pattern)})
    if not matched:
        raise InvalidArgumentError(f"No files matched pattern: {', '.join(patterns)}")
    dataset: Dataset = TensorSliceDataset(np.array([os.fsencode(m) for m in matched], dtype=object))
    if shuffle is None or shuffle:
        dataset = dataset.shuffle(len(matched), seed=seed)
    return dataset


class TextLineDataset(Dataset):
    """The lines of text files, as ``bytes`` without the line ending (``tf.data.TextLineDataset``).

    Args:
      filenames: a file name, a list of them, or a dataset of file names (``list_files``).
      compression_type: ``""``/``None``, ``"GZIP"`` or ``"ZLIB"``.
      buffer_size: read buffer in bytes (default 256 KiB).
      num_parallel_reads: accepted; files are read one after another.

    Under multi-worker auto-sharding (``AutoShardPolicy.FILE`` or ``AUTO``) each worker reads
    its own subset of the files.

    A saved iterator holds, as TensorFlow's does, the file it was reading and the offset after
    its last line; restored, it opens that file again and goes on from there (a compressed
    file is decompressed up to the offset).
    """

    def __init__(
        self,
        filenames: FileNames | Dataset,
        compression_type: str | None = None,
        buffer_size: int | None = None,
        num_parallel_reads: int | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(filenames, Dataset):
            self._inputs = (filenames,)
        else:
            names = _names(filenames, "TextLineDataset()")
            self._inputs = (TensorSliceDataset(np.array([os.fsencode(n) for n in names], dtype=object)),)
        kind = (compression_type or "").upper()
        if kind not in ("", "GZIP", "ZLIB"):
            raise ValueError(
                f"compression_type must be '', 'GZIP' or 'ZLIB'. Got compression_type={compression_type!r}."
            )
        self._compression = kind
        self._buffer_size = buffer_size or 256 * 1024

    def _reads_files(self) -> bool:
        return True

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position, as TensorFlow saves it: the file being read (``file``, None between
        # files; the pass over the file names is the child) and the offset after the last line
        # given out (``offset``, in the decompressed text for GZIP and ZLIB files).
        if not state.resumed:
            state.file, state.offset = None, 0
        names = state.input()
        try:
            while True:
                if state.file is None:
                    try:
                        name = next(names)
                    except StopIteration:
                        return
                    state.file, state.offset = os.fsdecode(name if isinstance(name, bytes) else bytes(name)), 0
                path = state.file
                with _reading(path, self._compression), self._open(path, state.offset) as f:
                    offset = state.offset
                    for line in f:
                        offset += len(line)
                        state.offset = offset
                        yield line.rstrip(b"\n").rstrip(b"\r")
                state.file = None
        finally:
            names.close()

    def _open(self, path: str, offset: int) -> BinaryIO:
        """``path`` opened for reading its (decompressed) text from ``offset`` on."""
        f: BinaryIO
        if self._compression == "GZIP":
            f = gzip.open(path, "rb")  # type: ignore[assignment]
        elif self._compression == "ZLIB":
            with open(path, "rb") as compressed:
                f = io.BytesIO(zlib.decompress(compressed.read()))
        else:
            f = open(path, "rb", buffering=self._buffer_size)  # noqa: SIM115 - the caller closes it
        if offset:
            try:
                f.seek(offset)  # a gzip file decompresses up to it
            except BaseException:
                f.close()
                raise
        return f

    def _spec(self, probe: bool) -> ElementSpec:
        return TensorSpec((), np.object_)

    def _cardinality(self) -> int:
        return options_lib.UNKNOWN


@contextlib.contextmanager
def _reading(path: str, compression: str) -> Iterator[None]:
    """Raises the ``td.errors`` class TensorFlow raises for a file that cannot be read."""
    try:
        yield
    except FileNotFoundError:
        raise NotFoundError(f"TextLineDataset: {path}; No such file or directory") from None
    except IsADirectoryError:
        raise FailedPreconditionError(f"TextLineDataset: {path}; Is a directory") from None
    except PermissionError as error:
        raise PermissionDeniedError(f"TextLineDataset: {path}; Permission denied") from error
    except (gzip.BadGzipFile, zlib.error, EOFError) as error:
        raise DataLossError(
            f"TextLineDataset: {path} is not valid {compression} data ({type(error).__name__}: {error}): the file "
            f"is corrupt or truncated, or compression_type={compression!r} does not match how it was written.",
            path=path,
        ) from error
