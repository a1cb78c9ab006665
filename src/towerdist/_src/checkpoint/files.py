"""The on-disk checkpoint format, version 1, and crash-safe file writing.

A checkpoint at prefix ``P`` (e.g. ``/ckpts/ckpt-3``) is two files:

* ``P.data-<hash>.npz`` — one numpy array per saved variable (``numpy.savez``, members
  ``a0``, ``a1``, ...; no pickles). ``<hash>`` is the start of the file's SHA-256, so
  rewriting a prefix never touches the data file its current index points to.
* ``P.index.json`` — what the arrays are::

      {"format": "towerdist-checkpoint", "format_version": 1,
       "towerdist_version": "0.1.0", "data_file": "ckpt-3.data-1f2e....npz",
       "data_sha256": "...", "data_size": 12345,
       "entries": {"model/w": {"member": "a0", "shape": [64, 256], "dtype": "float32",
                               "variable": "w:0", "class": "MirroredVariable",
                               "synchronization": "ON_WRITE", "aggregation": "NONE"}, ...}}

The index is the commit point: it is written last, so a checkpoint exists exactly when
its index does. Every file is written to a temporary name in the same directory,
flushed, ``fsync``-ed and renamed over its final name, and the directory is ``fsync``-ed:
a crash at any moment leaves either the old file or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from towerdist._src.errors import DataLossError, NotFoundError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "atomic_write",
    "checkpoint_exists",
    "data_files",
    "index_path",
    "read_checkpoint",
    "remove_checkpoint",
    "write_checkpoint",
]

FORMAT = "towerdist-checkpoint"
FORMAT_VERSION = 1
_INDEX_SUFFIX = ".index.json"
_CHUNK = 1 << 20


def index_path(prefix: str) -> str:
    """The index file of the checkpoint at ``prefix``."""
    return prefix + _INDEX_SUFFIX


def checkpoint_exists(prefix: str) -> bool:
    """True if a checkpoint (its index) exists at ``prefix``."""
    return os.path.isfile(index_path(prefix))


def data_files(prefix: str) -> list[str]:
    """Every data file written for ``prefix`` (the current one and any left by a crash)."""
    directory, base = os.path.split(prefix)
    try:
        names = os.listdir(directory or ".")
    except FileNotFoundError:
        return []
    start = base + ".data-"
    return [os.path.join(directory, n) for n in names if n.startswith(start) and n.endswith(".npz")]


# --- writing ------------------------------------------------------------------------------


def write_checkpoint(prefix: str, arrays: Mapping[str, np.ndarray], entries: Mapping[str, dict[str, Any]]) -> None:
    """Writes ``arrays`` (keyed like ``entries``) as the checkpoint at ``prefix``, atomically.

    ``entries[key]`` is the metadata recorded for ``arrays[key]``.
    """
    from towerdist import __version__  # noqa: PLC0415  (the package imports this module)

    directory = os.path.dirname(prefix) or "."
    os.makedirs(directory, exist_ok=True)
    members = {key: f"a{k}" for k, key in enumerate(sorted(arrays))}
    digest = hashlib.sha256()
    size = 0

    def write_data(stream: IO[bytes]) -> None:
        nonlocal size
        hashing = _HashingWriter(stream, digest)
        np.savez(hashing, **{members[key]: np.asarray(arrays[key], order="C") for key in sorted(arrays)})  # type: ignore[arg-type]
        size = hashing.size

    temporary = _write_temporary(directory, write_data)
    data_name = f"{os.path.basename(prefix)}.data-{digest.hexdigest()[:16]}.npz"
    data_path = os.path.join(directory, data_name)
    os.replace(temporary, data_path)
    index = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "towerdist_version": __version__,
        "data_file": data_name,
        "data_sha256": digest.hexdigest(),
        "data_size": size,
        "entries": {key: {"member": members[key], **entries[key]} for key in sorted(arrays)},
    }
    atomic_write(index_path(prefix), lambda f: f.write(_format_index(index).encode()))
    for stale in data_files(prefix):  # data files of earlier writes of this prefix
        if os.path.basename(stale) != data_name:
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)


def _format_index(index: dict[str, Any]) -> str:
    """The index as JSON with one line per field and per entry (diff- and grep-friendly)."""
    fields = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in index.items() if k != "entries"]
    entries = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in index["entries"].items()]
    return "{\n" + ",\n".join(fields) + ',\n "entries": {\n' + ",\n".join(entries) + "\n }\n}\n"


def atomic_write(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Writes ``path`` through ``write(stream)`` so that a crash leaves the old file or the new one."""
    directory = os.path.dirname(path) or "."
    temporary = _write_temporary(directory, write)
    os.replace(temporary, path)
    _fsync_directory(directory)


def _write_temporary(directory: str, write: Callable[[IO[bytes]], Any]) -> str:
    """Writes a durable temporary file in ``directory``; returns its path."""
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


def _fsync_directory(directory: str) -> None:
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


class _HashingWriter(io.RawIOBase):
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


# --- reading ------------------------------------------------------------------------------


def read_checkpoint(prefix: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads and verifies the checkpoint at ``prefix``: its index entries and arrays by key.

    Raises:
      NotFoundError: no checkpoint at ``prefix``.
      DataLossError: the index or data file is truncated, corrupt, or of another format.
    """
    path = index_path(prefix)
    if not os.path.isfile(path):
        hint = (
            f" {prefix!r} is a directory: pass td.train.latest_checkpoint({prefix!r}) to restore its latest checkpoint."
            if os.path.isdir(prefix)
            else " Pass the prefix that save() or write() returned (without the .index.json suffix)."
        )
        raise NotFoundError(f"Failed to find any matching files for {prefix}: there is no {path}.{hint}", path=path)
    index = _read_index(path)
    data_path = os.path.join(os.path.dirname(prefix), index["data_file"])
    blob = _read_verified(data_path, index)
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            for key, entry in index["entries"].items():
                if entry["member"] not in archive.files:
                    raise DataLossError(
                        f"Checkpoint {prefix}: the index {path} names array {entry['member']!r} for entry {key!r}, "
                        f"which {data_path} does not hold. The index is corrupt.",
                        path=path,
                    )
                array = archive[entry["member"]]
                if list(array.shape) != list(entry["shape"]) or array.dtype != _dtype(entry["dtype"], path):
                    raise DataLossError(
                        f"Checkpoint {prefix}: entry {key!r} holds an array of shape {array.shape} and dtype "
                        f"{array.dtype}, but the index {path} says {tuple(entry['shape'])} and {entry['dtype']}.",
                        path=path,
                    )
                arrays[key] = array
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as error:
        raise DataLossError(
            f"Checkpoint {prefix}: cannot read the arrays in {data_path} ({error}). The file is corrupt; restore "
            f"an earlier checkpoint.",
            path=data_path,
        ) from error
    return index["entries"], arrays


def _dtype(name: str, path: str) -> np.dtype[Any]:
    try:
        return np.dtype(name)
    except TypeError:
        raise DataLossError(f"Checkpoint index {path} is corrupt: {name!r} is not a dtype.", path=path) from None


def _read_index(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as stream:
            index = json.loads(stream.read().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataLossError(
            f"Checkpoint index {path} is truncated or corrupt ({error}); restore an earlier checkpoint.", path=path
        ) from error
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataLossError(f"{path} is not a towerdist checkpoint index (no \"format\": {FORMAT!r}).", path=path)
    version = index.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise DataLossError(
            f"Checkpoint {path} has format_version {version!r}; this towerdist reads version {FORMAT_VERSION}. "
            f"It was written by towerdist {index.get('towerdist_version', '?')}: read it with that version.",
            path=path,
        )
    entries = index.get("entries")
    data_file = index.get("data_file")
    well_formed = (
        isinstance(entries, dict)
        and isinstance(data_file, str)
        and os.path.basename(data_file) == data_file
        and isinstance(index.get("data_sha256"), str)
        and isinstance(index.get("data_size"), int)
        and all(
            isinstance(e, dict) and isinstance(e.get("member"), str) and isinstance(e.get("shape"), list)
            and isinstance(e.get("dtype"), str)
            for e in entries.values()
        )
    )
    if not well_formed:
        raise DataLossError(f"Checkpoint index {path} is malformed (missing or invalid fields).", path=path)
    return index


def _read_verified(data_path: str, index: dict[str, Any]) -> bytes:
    try:
        with open(data_path, "rb") as stream:
            blob = stream.read()
    except FileNotFoundError:
        raise DataLossError(
            f"Checkpoint data file {data_path} named by its index is missing; the checkpoint is incomplete.",
            path=data_path,
        ) from None
    if len(blob) != index["data_size"]:
        raise DataLossError(
            f"Checkpoint data file {data_path} is truncated or corrupt: it has {len(blob)} bytes, its index "
            f"says {index['data_size']}.",
            path=data_path,
        )
    if hashlib.sha256(blob).hexdigest() != index["data_sha256"]:
        raise DataLossError(
            f"Checkpoint data file {data_path} is corrupt: its SHA-256 does not match its index.", path=data_path
        )
    return blob


# --- removing -----------------------------------------------------------------------------


def remove_checkpoint(prefix: str) -> None:
    """Deletes the checkpoint at ``prefix``: its index first, so it never looks valid half-deleted."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(index_path(prefix))
    for path in data_files(prefix):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

