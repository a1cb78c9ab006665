"""The on-disk checkpoint format, version 3, crash-safe file writing, and the stale-file sweep.

A checkpoint at prefix ``P`` (e.g. ``/ckpts/ckpt-3``) is two files, named as TensorFlow
names its own (so ``os.path.exists(P + ".index")`` and ``glob("ckpt-*.index")`` find it),
though what they hold is towerdist's format:

* ``P.data-00000-of-00001`` — one numpy array per saved entry (``numpy.savez``, members
  ``a0``, ``a1``, ...; no pickles).
* ``P.index`` — what the arrays are (JSON)::

      {"format": "towerdist-checkpoint", "format_version": 3,
       "towerdist_version": "0.1.0", "data_file": "ckpt-3.data-00000-of-00001",
       "data_sha256": "...", "data_size": 12345,
       "entries": {"model/w": {"member": "a0", "shape": [64, 256], "dtype": "float32",
                               "kind": "variable", "variable": "w:0",
                               "class": "MirroredVariable", "synchronization": "ON_WRITE",
                               "aggregation": "NONE"},
                   "iterator": {"member": "a1", "shape": [812], "dtype": "uint8",
                                "kind": "object", "class": "DatasetIterator"}, ...},
       "index_sha256": "..."}

  An entry of kind ``variable`` is a variable's value; one of kind ``object`` is the
  opaque state of an object saved as bytes (an input iterator), a uint8 array.

Every byte is covered by a checksum: the data file by ``data_sha256`` (and
``data_size``), the index by ``index_sha256``, the SHA-256 of the index's canonical JSON
without that field (:func:`index_digest`).

**Writing, and why a crash leaves the old checkpoint or the new one.** The index is the
commit point: a checkpoint exists exactly when its index does. Every file is first
written to a temporary name in the same directory, flushed and ``fsync``-ed, then
renamed, and the directory ``fsync``-ed (an ``AtomicFile``). Because the data
file's name is fixed, rewriting a prefix cannot write the new data beside the old under
its final name; a write therefore goes:

1. the data, to a temporary file, then renamed to ``P.data-00000-of-00001.<hash>.pending``
   (``<hash>``: the first 16 hex digits of its SHA-256);
2. the index, naming that SHA-256, renamed over ``P.index`` — the commit;
3. the pending data file renamed over ``P.data-00000-of-00001``.

Killed before 2, the old index and its data are untouched. Killed between 2 and 3, the
new index is in place and ``P.data-00000-of-00001`` still holds the old data (or does not
exist): a reader whose data file does not match the index's hash reads
``P.data-00000-of-00001.<hash>.pending`` instead, which the index's hash names. A
later write of the prefix supersedes it.

**Version 2** (``P.index.json`` and ``P.data-<hash>.npz``, the same content with entries
that have no ``kind``) is still read, and superseded by a write of version 3 to its
prefix. Version 1 (no ``index_sha256``) is refused: its index cannot be verified.

A crash can leave a temporary file (``.tmp-*.part``) or a pending data file no index
names. Each write sweeps its directory's temporary files and its prefix's unreferenced
data files, but only those not modified for :data:`STALE_SECONDS`: a younger file may
belong to a save that another process is making right now.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import time
import zipfile
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import numpy as np

from towerdist._src.atomic_file import AtomicFile, fsync_directory
from towerdist._src.checkpoint import durable
from towerdist._src.checkpoint.durable import STALE_SECONDS, sweep_temporaries
from towerdist._src.errors import DataLossError, NotFoundError
from towerdist._src.failures import unworded
from towerdist._src.version import __version__

__all__ = [
    "DATA_SUFFIX",
    "FORMAT",
    "FORMAT_VERSION",
    "INDEX_SUFFIX",
    "KIND_OBJECT",
    "KIND_VARIABLE",
    "STALE_SECONDS",
    "as_path",
    "checkpoint_exists",
    "data_files",
    "data_path",
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
FORMAT_VERSION = 3
INDEX_SUFFIX = ".index"
DATA_SUFFIX = ".data-00000-of-00001"
KIND_VARIABLE = "variable"
KIND_OBJECT = "object"
_READ_VERSIONS = (2, 3)
_V2_INDEX_SUFFIX = ".index.json"
_PENDING = re.compile(r"\.([0-9a-f]{16})\.pending")  # after DATA_SUFFIX: the pending data of a write
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
_VARIABLE_TEXT_FIELDS = ("variable", "class", "synchronization", "aggregation")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def as_path(value: str | bytes | os.PathLike[Any], argument: str) -> str:
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
    """The index file of the checkpoint at ``prefix`` (as written now, format version 3)."""
    return prefix + INDEX_SUFFIX


def data_path(prefix: str) -> str:
    """The data file of the checkpoint at ``prefix`` (as written now, format version 3)."""
    return prefix + DATA_SUFFIX


def checkpoint_exists(prefix: str) -> bool:
    """True if a checkpoint (its index, of any version read) exists at ``prefix``."""
    return os.path.isfile(index_path(prefix)) or os.path.isfile(prefix + _V2_INDEX_SUFFIX)


def data_files(prefix: str) -> list[str]:
    """Every data file written for ``prefix``: the current one, pending ones, and version 2's."""
    directory, base = os.path.split(prefix)
    return [os.path.join(directory, name) for name in _own_data_names(base, _listdir(directory or "."))]


def _own_data_names(base: str, names: Iterable[str]) -> list[str]:
    own = re.compile(re.escape(base) + r"(" + re.escape(DATA_SUFFIX) + r"(\.[0-9a-f]{16}\.pending)?|\.data-[0-9a-f]{16}\.npz)")
    return sorted(name for name in names if own.fullmatch(name))


def _pending_path(prefix: str, sha256: str) -> str:
    return f"{data_path(prefix)}.{sha256[:16]}.pending"


def _v2_data_name(prefix: str, sha256: str) -> str:
    return f"{os.path.basename(prefix)}.data-{sha256[:16]}.npz"


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


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

    ``entries[key]`` is the metadata recorded for ``arrays[key]`` (its ``kind`` and what
    describes it). Every array's dtype must be storable (:func:`unstorable_reason`); the
    caller checks, naming the variable. The steps, and why a crash leaves the old
    checkpoint or the new one, are in this module's docstring.
    """
    directory = os.path.dirname(prefix) or "."
    os.makedirs(directory, exist_ok=True)
    try:
        retired = _current_data(prefix)  # what the index being replaced names
    except _Unreadable:
        retired = None  # an unreadable index's data is left to the age rule
    members = {key: f"a{k}" for k, key in enumerate(sorted(arrays))}
    digest = hashlib.sha256()
    data = AtomicFile(data_path(prefix))
    with data as stream:
        hashing = durable.HashingWriter(stream, digest)
        np.savez(hashing, **{members[key]: np.asarray(arrays[key], order="C") for key in sorted(arrays)})  # type: ignore[arg-type]
        size = hashing.size
        sha256 = digest.hexdigest()
        data.path = pending = _pending_path(prefix, sha256)  # put in place under the name its hash gives
    index: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "towerdist_version": __version__,
        "data_file": os.path.basename(data_path(prefix)),
        "data_sha256": sha256,
        "data_size": size,
        "entries": {key: {"member": members[key], **entries[key]} for key in sorted(arrays)},
    }
    index["index_sha256"] = index_digest(index)
    with AtomicFile(index_path(prefix)) as stream:  # the commit point
        stream.write(_format_index(index).encode())
    with contextlib.suppress(FileNotFoundError):  # (gone only if another writer of this prefix moved it)
        os.replace(pending, data_path(prefix))
    fsync_directory(directory)
    _remove_version_2(prefix)
    sweep_orphans(prefix, retired=retired)
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


# --- reading ------------------------------------------------------------------------------


def read_checkpoint(prefix: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads and verifies the checkpoint at ``prefix``: its index entries and arrays by key.

    Every entry has a ``kind`` (a version 2 checkpoint's entries are variables).

    Raises:
      NotFoundError: no checkpoint at ``prefix``.
      DataLossError: the index or data file is truncated, corrupt, or of another format.
    """
    path = index_path(prefix)
    if not os.path.isfile(path):
        if os.path.isfile(prefix + _V2_INDEX_SUFFIX):
            path = prefix + _V2_INDEX_SUFFIX
        else:
            raise NotFoundError(
                f"Failed to find any matching files for {prefix}: there is no {path}.{_not_found_hint(prefix)}",
                path=path,
            )
    index, blob, data_file = _read_index_and_data(path, prefix)
    entries: dict[str, Any] = {key: {"kind": KIND_VARIABLE, **entry} for key, entry in index["entries"].items()}
    return entries, _arrays(blob, entries, prefix, path, data_file)


def _not_found_hint(prefix: str) -> str:
    if os.path.isdir(prefix):
        return f" {prefix!r} is a directory: pass td.train.latest_checkpoint({prefix!r}) to restore its latest checkpoint."
    stem = re.sub(r"(\.index(\.json)?|\.data-.*)$", "", prefix)
    if stem != prefix and checkpoint_exists(stem):
        return f" {prefix!r} names one of the files of the checkpoint {stem!r}: pass that prefix instead."
    return " Pass the prefix that save() or write() returned (without the .index suffix)."


def _read_index_and_data(path: str, prefix: str) -> tuple[dict[str, Any], bytes, str]:
    """The verified index at ``path`` and the verified bytes of its data file (and that file's path).

    If the data does not verify and the index changed meanwhile (another process rewrote
    the checkpoint), both are read once more.
    """
    raw = _read_bytes(path)
    index = _parse_index(raw, path, prefix)
    try:
        blob, data_file = _read_data(prefix, index)
    except DataLossError:
        again = _read_bytes(path, missing_ok=True)
        if not again or again == raw:
            raise
        index = _parse_index(again, path, prefix)
        blob, data_file = _read_data(prefix, index)
    return index, blob, data_file


def _read_bytes(path: str, missing_ok: bool = False) -> bytes:
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except FileNotFoundError:
        if missing_ok:
            return b""
        raise NotFoundError(f"Failed to find any matching files for {path}: it was removed while being read.",
                            path=path) from None


def _read_data(prefix: str, index: dict[str, Any]) -> tuple[bytes, str]:
    """The data file's verified bytes: the file the index names, else (version 3) the pending file of its hash."""
    if index["format_version"] == 2:
        data_file = os.path.join(os.path.dirname(prefix), index["data_file"])
        return _read_verified(data_file, index), data_file
    data_file = data_path(prefix)
    try:
        return _read_verified(data_file, index), data_file
    except DataLossError as error:
        pending = _pending_path(prefix, index["data_sha256"])
        if not os.path.isfile(pending):
            raise
        try:
            return _read_verified(pending, index), pending
        except DataLossError:
            raise error from None


def _arrays(blob: bytes, entries: dict[str, Any], prefix: str, path: str, data_file: str) -> dict[str, np.ndarray]:
    """The arrays of the data file's bytes, checked against the index's entries."""
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            for key, entry in entries.items():
                if entry["member"] not in archive.files:
                    raise DataLossError(
                        f"Checkpoint {prefix}: the index {path} names array {entry['member']!r} for entry {key!r}, "
                        f"which {data_file} does not hold. The index is corrupt.",
                        path=path,
                    )
            unlisted = sorted(set(archive.files) - {e["member"] for e in entries.values()})
            if unlisted:
                raise DataLossError(
                    f"Checkpoint {prefix}: {data_file} holds arrays {unlisted} that its index {path} does not list. "
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
            f"Checkpoint {prefix}: cannot read the arrays in {data_file} ({error}). The file is corrupt; restore "
            f"an earlier checkpoint.",
            path=data_file,
        ) from error
    return arrays


def _parse_index(raw: bytes, path: str, prefix: str) -> dict[str, Any]:
    """The verified index in ``raw`` (read from ``path``): parsed, its checksum matched, then every field checked."""
    try:
        index = json.loads(raw.decode(), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        foreign = (
            " It is not JSON, as towerdist's indexes are: if TensorFlow wrote this checkpoint, towerdist cannot read "
            "it (its format is its own)."
            if not raw.lstrip().startswith(b"{")
            else ""
        )
        raise DataLossError(
            f"Checkpoint index {path} is truncated or corrupt ({error}); restore an earlier checkpoint.{foreign}",
            path=path,
        ) from error
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataLossError(f'{path} is not a towerdist checkpoint index (no "format": {FORMAT!r}).', path=path)
    version = index.get("format_version")
    if version == 1 and type(version) is int and "index_sha256" not in index:
        raise DataLossError(
            f"Checkpoint {path} has format_version 1, whose index carries no checksum, so it cannot be verified; "
            f"this towerdist reads versions 2 and {FORMAT_VERSION}. Its arrays are a plain .npz file that "
            f"numpy.load() reads (each entry's 'member' names its array): assign them to your variables and save "
            f"again.",
            path=path,
        )
    recorded = index.get("index_sha256")
    if not isinstance(recorded, str) or recorded != _digest_or_none(index):
        written_by = (
            ""
            if version in _READ_VERSIONS
            else (f" (it says format_version {version!r}: if a newer towerdist wrote it, read it with that version)")
        )
        fault = "has no index_sha256 checksum" if recorded is None else "does not match its index_sha256 checksum"
        raise DataLossError(
            f"Checkpoint index {path} is corrupt: its content {fault}{written_by}. Restore an earlier checkpoint.",
            path=path,
        )
    if type(version) is not int or version not in _READ_VERSIONS or path.endswith(_V2_INDEX_SUFFIX) != (version == 2):
        raise DataLossError(
            f"Checkpoint {path} has format_version {version!r}; this towerdist reads versions 2 (in .index.json "
            f"files) and {FORMAT_VERSION} (in .index files). It was written by towerdist "
            f"{index.get('towerdist_version', '?')}: read it with that version.",
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


def _no_constant(name: str) -> NoReturn:
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
    version = index["format_version"]
    expected = _v2_data_name(prefix, sha256) if version == 2 else os.path.basename(data_path(prefix))
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
        problem = _entry_problem(key, entry, version)
        if problem is not None:
            return problem
    return None


def _entry_problem(key: str, entry: dict[str, Any], version: int) -> str | None:
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        return f"entry {key!r} has shape {shape!r}, not a list of non-negative integers"
    if not isinstance(entry.get("dtype"), str) or _parse_dtype(entry["dtype"]) is None:
        return f"entry {key!r} has dtype {entry.get('dtype')!r}, which is not a dtype a checkpoint holds"
    kind = entry.get("kind", KIND_VARIABLE if version == 2 else None)
    if version == 2 and "kind" in entry:
        return f"entry {key!r} has a kind, which version 2 entries do not have"
    if kind == KIND_OBJECT:
        if entry["dtype"] != "uint8" or len(shape) != 1:
            return f"entry {key!r} is an object's state, but not a 1-D uint8 array"
        text_fields: tuple[str, ...] = ("class",)
    elif kind == KIND_VARIABLE:
        text_fields = _VARIABLE_TEXT_FIELDS
    else:
        return f"entry {key!r} has kind {kind!r}, not {KIND_VARIABLE!r} or {KIND_OBJECT!r}"
    for field in text_fields:
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
    """Deletes the checkpoint at ``prefix``: its indexes first, so it never looks valid half-deleted."""
    for index in (index_path(prefix), prefix + _V2_INDEX_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.remove(index)
    for path in data_files(prefix):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _remove_version_2(prefix: str) -> None:
    """Removes a version 2 checkpoint at ``prefix``, superseded by the version 3 one just written."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(prefix + _V2_INDEX_SUFFIX)
    for path in data_files(prefix):
        if path.endswith(".npz"):
            with contextlib.suppress(OSError):
                os.remove(path)


class _Unreadable(Exception):
    """An index exists but cannot be parsed: which data it names is unknown."""


def _current_data(prefix: str) -> tuple[int, str] | None:
    """What the index at ``prefix`` names: ``(3, data SHA-256)`` or ``(2, data file name)``; None without index.

    Raises:
      _Unreadable: the index exists but does not parse (it may still name any file).
    """
    for version, path, field in ((3, index_path(prefix), "data_sha256"), (2, prefix + _V2_INDEX_SUFFIX, "data_file")):
        try:
            with open(path, "rb") as stream:
                index = json.loads(stream.read().decode())
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise _Unreadable from error
        named = index.get(field) if isinstance(index, dict) else None
        if not isinstance(named, str):
            raise _Unreadable
        return version, named
    return None


def sweep_orphans(prefix: str, retired: tuple[int, str] | None = None, names: Iterable[str] | None = None) -> None:
    """Removes the data files of ``prefix`` that its index does not name.

    ``retired`` is what an index just replaced named (:func:`_current_data`): its pending
    or version 2 data file goes at once. Any other unnamed data file is removed only once
    stale (see :data:`STALE_SECONDS`): a younger one may be another process's save, its
    index not yet written. A version 2 checkpoint beside a version 3 index of the same
    prefix was superseded and goes. Nothing is removed while an index exists but cannot
    be read. ``names`` is the directory's listing, if the caller has it.
    """
    directory, base = os.path.split(prefix)
    try:
        current = _current_data(prefix)
    except _Unreadable:
        return
    now = time.time()
    listing = _listdir(directory or ".") if names is None else names
    for name in _own_data_names(base, listing):
        path = os.path.join(directory, name)
        if _named_by(current, base, name):
            continue
        if _named_by(retired, base, name) or (current is not None and current[0] == 3 and name.endswith(".npz")):
            removable = True
        else:
            removable = durable.stale(path, now)
        if removable:
            with contextlib.suppress(OSError):  # a sweep never fails the save that runs it
                os.remove(path)


def _named_by(named: tuple[int, str] | None, base: str, name: str) -> bool:
    """Whether the data file ``name`` of prefix ``base`` is the one ``named`` (see :func:`_current_data`) names."""
    if named is None:
        return False
    version, value = named
    if version == 2:
        return name == value
    if name == base + DATA_SUFFIX:
        return True  # the fixed name: named by every version 3 index (its content is checked on reading)
    pending = _PENDING.fullmatch(name[len(base + DATA_SUFFIX) :]) if name.startswith(base + DATA_SUFFIX) else None
    return pending is not None and pending.group(1) == value[:16]
