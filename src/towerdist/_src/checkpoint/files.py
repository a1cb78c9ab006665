"""The on-disk checkpoint format, version 2, crash-safe file writing, and the stale-file sweep.

A checkpoint at prefix ``P`` (e.g. ``/ckpts/ckpt-3``) is two files:

* ``P.data-<hash>.npz`` — one numpy array per saved variable (``numpy.savez``, members
  ``a0``, ``a1``, ...; no pickles). ``<hash>`` is the start of the file's SHA-256, so
  rewriting a prefix never touches the data file its current index points to.
* ``P.index.json`` — what the arrays are::

      {"format": "towerdist-checkpoint", "format_version": 2,
       "towerdist_version": "0.1.0", "data_file": "ckpt-3.data-1f2e....npz",
       "data_sha256": "...", "data_size": 12345,
       "entries": {"model/w": {"member": "a0", "shape": [64, 256], "dtype": "float32",
                               "variable": "w:0", "class": "MirroredVariable",
                               "synchronization": "ON_WRITE", "aggregation": "NONE"}, ...},
       "index_sha256": "..."}

Every byte is covered by a checksum: the data file by ``data_sha256`` (and
``data_size``), the index by ``index_sha256``, the SHA-256 of the index's canonical JSON
without that field (:func:`index_digest`). A data file belongs to one prefix: its name
starts with the prefix's and ends with its own hash, and ``restore`` refuses an index
that names any other file. Version 1 (no ``index_sha256``) is refused: its index cannot
be verified.

The index is the commit point: it is written last, so a checkpoint exists exactly when
its index does. Every file is written to a temporary name in the same directory,
flushed, ``fsync``-ed and renamed over its final name, and the directory is ``fsync``-ed:
a crash at any moment leaves either the old file or the new one, never a mix.

A crash can leave a temporary file (``.tmp-*.part``) or a data file whose index was
never written. Each write sweeps its directory's temporary files and its prefix's
unreferenced data files, but only those not modified for :data:`STALE_SECONDS`: a
younger file may belong to a save that another process is making right now.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from towerdist._src.errors import DataLossError, NotFoundError
from towerdist._src.failures import unworded
from towerdist._src.version import __version__

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "STALE_SECONDS",
    "as_path",
    "atomic_write",
    "checkpoint_exists",
    "data_files",
    "dtype_text",
    "index_digest",
    "index_path",
    "read_checkpoint",
    "remove_checkpoint",
    "sweep_orphans",
    "sweep_temporaries",
    "unstorable_reason",
    "write_checkpoint",
]

FORMAT = "towerdist-checkpoint"
FORMAT_VERSION = 2
# How long a temporary or unreferenced data file must have been left untouched before a
# sweep removes it. A save in progress rewrites its temporary file continuously and then
# only fsyncs and renames; an hour is far beyond the longest fsync of a checkpoint.
STALE_SECONDS = 3600.0
_INDEX_SUFFIX = ".index.json"
_TEMPORARY = re.compile(r"\.tmp-[a-z0-9_]+\.part")  # what tempfile.mkstemp(prefix=".tmp-", suffix=".part") makes
_STORABLE_KINDS = "biufcSUMm"  # bool, integers, floats, complex, bytes, str, datetime64, timedelta64
_INDEX_FIELDS = frozenset(
    {
        "format",
        "format_version",
        "towerdist_version",
        "data_file",
        "data_sha256",
        "data_size",
        "entries",
        "index_sha256",
    }
)
_ENTRY_TEXT_FIELDS = ("variable", "class", "synchronization", "aggregation")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def as_path(value: Any, argument: str) -> str:
    """``value`` (a ``str``, ``bytes`` or ``os.PathLike``) as a ``str`` path (errors unworded)."""
    try:
        path = os.fspath(value)
    except TypeError:
        raise unworded(
            TypeError(
                f"expects {argument} to be a path: a str, bytes or os.PathLike. Got {argument}={value!r} of type "
                f"{type(value).__name__}; pass e.g. '/tmp/ckpts/ckpt'."
            )
        ) from None
    return os.fsdecode(path)


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
    except OSError:
        return []
    own = re.compile(re.escape(base) + r"\.data-[0-9a-f]{16}\.npz")
    return [os.path.join(directory, n) for n in names if own.fullmatch(n)]


def _data_name(prefix: str, sha256: str) -> str:
    return f"{os.path.basename(prefix)}.data-{sha256[:16]}.npz"


# --- dtypes -------------------------------------------------------------------------------


def unstorable_reason(dtype: np.dtype[Any]) -> str | None:
    """Why a variable of ``dtype`` cannot be saved, with the fix; None if it can."""
    if dtype.kind in _STORABLE_KINDS:
        return None
    if dtype.kind == "O":
        return (
            "object arrays can only be stored with pickle, which checkpoints never use; hold strings in a "
            "fixed-width string array instead, e.g. np.array(values, dtype=str)"
        )
    if dtype.kind == "T":
        return (
            "numpy's variable-width StringDType can only be stored with pickle; convert the value to fixed-width "
            "strings, e.g. np.asarray(value, dtype=str)"
        )
    if dtype.kind == "V":
        return (
            "structured and void dtypes have no TensorFlow dtype; save one variable per field, e.g. "
            "td.Variable(value['x'])"
        )
    return f"numpy dtypes of kind {dtype.kind!r} have no TensorFlow dtype; convert the value to a numeric dtype"


def dtype_text(dtype: np.dtype[Any]) -> str:
    """How the index writes ``dtype``: its name where that names it exactly (``float32``), else
    numpy's type string (``<U5``, ``|S3``, ``>f4``)."""
    try:
        if np.dtype(dtype.name) == dtype:
            return dtype.name
    except TypeError:  # names such as 'str160' are not dtype names
        pass
    return dtype.str


def _parse_dtype(text: str) -> np.dtype[Any] | None:
    """The dtype an index entry names, or None unless ``text`` is exactly what a writer writes."""
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError):
        return None
    if unstorable_reason(dtype) is not None or dtype_text(dtype) != text:
        return None
    return dtype


# --- writing ------------------------------------------------------------------------------


def write_checkpoint(prefix: str, arrays: Mapping[str, np.ndarray], entries: Mapping[str, dict[str, Any]]) -> None:
    """Writes ``arrays`` (keyed like ``entries``) as the checkpoint at ``prefix``, atomically.

    ``entries[key]`` is the metadata recorded for ``arrays[key]``. Every array's dtype must
    be storable (:func:`unstorable_reason`); the caller checks, naming the variable.
    """
    directory = os.path.dirname(prefix) or "."
    os.makedirs(directory, exist_ok=True)
    try:
        retired = _referenced_data_file(prefix)  # the data file the index being replaced points to
    except _Unreadable:
        retired = None  # an unreadable index's data file is left to the age rule
    members = {key: f"a{k}" for k, key in enumerate(sorted(arrays))}
    digest = hashlib.sha256()
    size = 0

    def write_data(stream: IO[bytes]) -> None:
        nonlocal size
        hashing = _HashingWriter(stream, digest)
        np.savez(hashing, **{members[key]: np.asarray(arrays[key], order="C") for key in sorted(arrays)})  # type: ignore[arg-type]
        size = hashing.size

    temporary = _write_temporary(directory, write_data)
    data_name = _data_name(prefix, digest.hexdigest())
    os.replace(temporary, os.path.join(directory, data_name))
    index: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "towerdist_version": __version__,
        "data_file": data_name,
        "data_sha256": digest.hexdigest(),
        "data_size": size,
        "entries": {key: {"member": members[key], **entries[key]} for key in sorted(arrays)},
    }
    index["index_sha256"] = index_digest(index)
    atomic_write(index_path(prefix), lambda f: f.write(_format_index(index).encode()))
    sweep_orphans(prefix, current=data_name, retired=retired)
    sweep_temporaries(directory)


def index_digest(index: Mapping[str, Any]) -> str:
    """The ``index_sha256`` of ``index``: the SHA-256 of its canonical JSON without that field.

    Canonical JSON is ``json.dumps(index, sort_keys=True, separators=(",", ":"),
    ensure_ascii=True)`` encoded as ASCII, so the digest depends on the index's content,
    not on its layout.
    """
    content = {k: v for k, v in index.items() if k != "index_sha256"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _format_index(index: dict[str, Any]) -> str:
    """The index as JSON with one line per field and per entry (diff- and grep-friendly)."""
    head = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in index.items() if k not in ("entries", "index_sha256")]
    entries = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in index["entries"].items()]
    return (
        "{\n"
        + ",\n".join(head)
        + ',\n "entries": {\n'
        + ",\n".join(entries)
        + "\n },\n"
        + f' "index_sha256": {json.dumps(index["index_sha256"])}\n}}\n'
    )


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
    index = _read_index(path, prefix)
    data_path = os.path.join(os.path.dirname(prefix), index["data_file"])
    blob = _read_verified(data_path, index)
    entries: dict[str, Any] = index["entries"]
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            for key, entry in entries.items():
                if entry["member"] not in archive.files:
                    raise DataLossError(
                        f"Checkpoint {prefix}: the index {path} names array {entry['member']!r} for entry {key!r}, "
                        f"which {data_path} does not hold. The index is corrupt.",
                        path=path,
                    )
            unlisted = sorted(set(archive.files) - {e["member"] for e in entries.values()})
            if unlisted:
                raise DataLossError(
                    f"Checkpoint {prefix}: {data_path} holds arrays {unlisted} that its index {path} does not list. "
                    f"The index is corrupt; restore an earlier checkpoint.",
                    path=path,
                )
            for key, entry in entries.items():
                array = archive[entry["member"]]
                if list(array.shape) != entry["shape"] or array.dtype != _parse_dtype(entry["dtype"]):
                    raise DataLossError(
                        f"Checkpoint {prefix}: entry {key!r} holds an array of shape {array.shape} and dtype "
                        f"{dtype_text(array.dtype)}, but the index {path} says {tuple(entry['shape'])} and "
                        f"{entry['dtype']}.",
                        path=path,
                    )
                arrays[key] = array
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as error:
        raise DataLossError(
            f"Checkpoint {prefix}: cannot read the arrays in {data_path} ({error}). The file is corrupt; restore "
            f"an earlier checkpoint.",
            path=data_path,
        ) from error
    return entries, arrays


def _read_index(path: str, prefix: str) -> dict[str, Any]:
    """The verified index at ``path``: parsed, its checksum matched, then every field checked."""
    try:
        with open(path, "rb") as stream:
            index = json.loads(stream.read().decode(), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        raise DataLossError(
            f"Checkpoint index {path} is truncated or corrupt ({error}); restore an earlier checkpoint.", path=path
        ) from error
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataLossError(f'{path} is not a towerdist checkpoint index (no "format": {FORMAT!r}).', path=path)
    version = index.get("format_version")
    if version == 1 and type(version) is int and "index_sha256" not in index:
        raise DataLossError(
            f"Checkpoint {path} has format_version 1, whose index carries no checksum, so it cannot be verified; "
            f"this towerdist reads version {FORMAT_VERSION}. Its arrays are a plain .npz file that numpy.load() "
            f"reads (each entry's 'member' names its array): assign them to your variables and save again.",
            path=path,
        )
    recorded = index.get("index_sha256")
    if not isinstance(recorded, str) or recorded != _digest_or_none(index):
        written_by = (
            ""
            if version == FORMAT_VERSION
            else (f" (it says format_version {version!r}: if a newer towerdist wrote it, read it with that version)")
        )
        fault = "has no index_sha256 checksum" if recorded is None else "does not match its index_sha256 checksum"
        raise DataLossError(
            f"Checkpoint index {path} is corrupt: its content {fault}{written_by}. Restore an earlier checkpoint.",
            path=path,
        )
    if type(version) is not int or version != FORMAT_VERSION:
        raise DataLossError(
            f"Checkpoint {path} has format_version {version!r}; this towerdist reads version {FORMAT_VERSION}. "
            f"It was written by towerdist {index.get('towerdist_version', '?')}: read it with that version.",
            path=path,
        )
    problem = _index_problem(index, prefix)
    if problem is not None:
        raise DataLossError(
            f"Checkpoint index {path} is malformed: {problem}. towerdist did not write it so; restore an earlier "
            f"checkpoint.",
            path=path,
        )
    return index


def _digest_or_none(index: dict[str, Any]) -> str | None:
    try:
        return index_digest(index)
    except ValueError:  # a number JSON parsed as infinity: not what any writer wrote
        return None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid in a checkpoint index")


def _index_problem(index: dict[str, Any], prefix: str) -> str | None:
    """What is wrong with the fields of a checksum-valid index (one written by other means), or None."""
    if set(index) != _INDEX_FIELDS:
        return f"its fields are {sorted(index)}, not {sorted(_INDEX_FIELDS)}"
    if not isinstance(index["towerdist_version"], str):
        return "towerdist_version is not a string"
    sha256, size = index["data_sha256"], index["data_size"]
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        return "data_sha256 is not 64 lowercase hex digits"
    if type(size) is not int or size < 0:
        return "data_size is not a non-negative integer"
    expected = _data_name(prefix, sha256)
    if index["data_file"] != expected:
        return (
            f"data_file is {index['data_file']!r}, but the data file of {prefix} is named {expected!r} (a "
            f"checkpoint's files cannot be renamed: restore it and write() it under the new name)"
        )
    entries = index["entries"]
    if not isinstance(entries, dict):
        return "entries is not an object"
    members: set[str] = set()
    for key, entry in entries.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("member"), str):
            return f"entry {key!r} has no member name"
        if entry["member"] in members:
            return f"entry {key!r} names array {entry['member']!r}, which another entry names too"
        members.add(entry["member"])
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            return f"entry {key!r} has shape {shape!r}, not a list of non-negative integers"
        if not isinstance(entry.get("dtype"), str) or _parse_dtype(entry["dtype"]) is None:
            return f"entry {key!r} has dtype {entry.get('dtype')!r}, which is not a dtype a checkpoint holds"
        for field in _ENTRY_TEXT_FIELDS:
            if not isinstance(entry.get(field), str):
                return f"entry {key!r} has {field} {entry.get(field)!r}, not a string"
    return None


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


class _Unreadable(Exception):
    """An index exists but cannot be parsed: which data file it names is unknown."""


def _referenced_data_file(prefix: str) -> str | None:
    """The data file name the index at ``prefix`` points to; None if there is no index.

    Raises:
      _Unreadable: the index exists but does not parse (it may still name any file).
    """
    try:
        with open(index_path(prefix), "rb") as stream:
            index = json.loads(stream.read().decode())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _Unreadable from error
    name = index.get("data_file") if isinstance(index, dict) else None
    if not isinstance(name, str):
        raise _Unreadable
    return name


def sweep_orphans(prefix: str, current: str | None = None, retired: str | None = None) -> None:
    """Removes the data files of ``prefix`` that its index does not point to.

    ``current`` is the data file the index points to (read from it when None); ``retired``
    the one an index just replaced pointed to, removed at once. Any other unreferenced
    data file is removed only once stale (see :data:`STALE_SECONDS`): a younger one may be
    another process's save, its index not yet written. Nothing is removed while the index
    exists but cannot be read. Only the index of ``prefix`` may point to its data files
    (``restore`` refuses any other), so no data file an index points to is ever removed.
    """
    if current is None:
        try:
            current = _referenced_data_file(prefix)
        except _Unreadable:
            return
    now = time.time()
    for path in data_files(prefix):
        name = os.path.basename(path)
        if name != current and (name == retired or _stale(path, now)):
            with contextlib.suppress(OSError):  # a sweep never fails the save that runs it
                os.remove(path)


def sweep_temporaries(directory: str) -> None:
    """Removes the stale temporary files (``.tmp-*.part``) a crashed save left in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(directory, name)
        if _TEMPORARY.fullmatch(name) and _stale(path, now):
            with contextlib.suppress(OSError):  # a sweep never fails the save that runs it
                os.remove(path)


def _stale(path: str, now: float) -> bool:
    """True for a regular file not modified for :data:`STALE_SECONDS` (never a link or directory)."""
    try:
        status = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(status.st_mode) and math.isfinite(status.st_mtime) and now - status.st_mtime > STALE_SECONDS
