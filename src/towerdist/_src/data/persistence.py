"""``Dataset.save`` and ``Dataset.load``: towerdist's own on-disk format for datasets.

The format (``FORMAT``, version ``VERSION`` = 1) is documented here and in docs/input.md. It
holds numbers, booleans and strings only, never pickled objects, so loading a dataset runs
no code from the file. A saved dataset is a directory::

    <path>/
      towerdist_dataset.json           the manifest, written last
      shard-<run>-<index>.tdrec        the elements of shard <index> (".gz" added for GZIP)

The manifest is a JSON object::

    {"format": "towerdist.data.Dataset.save", "version": 1,
     "element_spec": <spec>, "compression": null | "GZIP", "cardinality": <elements in all>,
     "shards": [{"index": <int64 shard index>, "file": <name>, "elements": <n>,
                 "bytes": <file size>, "crc32": <CRC-32 of the file's bytes>}, ...]}

``<spec>`` is ``{"tensor": {"shape": [2, null] or null, "dtype": <dtype>}}``,
``{"tuple": [<spec>, ...]}``, ``{"dict": [[key, <spec>], ...]}`` or
``{"namedtuple": {"name": ..., "fields": [...], "items": [<spec>, ...]}}``, where ``<dtype>`` is
one of ``bool``, ``int8``/``16``/``32``/``64``, ``uint8``/``16``/``32``/``64``,
``float16``/``32``/``64``, ``complex64``/``128`` and ``string``.

A shard file (gzip-compressed as a whole with ``compression="GZIP"``) is the 8 bytes
``TDSHARD1`` followed by one record per element. A record is its payload's length (uint64)
and CRC-32 (uint32), then the payload: for each component, in the order of the flattened
element spec (dict keys sorted), its rank (uint32), its dimensions (uint64 each), then its
data: numbers as the raw little-endian values in C order; strings as, for each item, its
length (uint64) and bytes. Every integer in the format is little-endian.

Saving writes the shard files under new names, then the manifest to a temporary file that
``os.replace`` puts in place: the manifest is the commit point, so a reader sees the old
dataset or the new one, never a mix, and a save that fails leaves the old one intact (the
shard files of the old save are removed after the new manifest is in place; only names of
the form ``shard-<run>-<index>.tdrec[.gz]`` are ever removed, whatever the old manifest lists).

Loading checks the manifest (format, version, fields), the sizes of the shard files, and
while reading each record's length and CRC, each component's size against the bytes left in
its record (before allocating it), each file's CRC and element count; a file that fails a
check raises ``td.errors.DataLossError`` naming it.

Without ``reader_func`` the shards are read as TensorFlow's default reader reads them:
``shards.interleave(lambda s: s, cycle_length=<CPU cores>)`` over the shard datasets in
TensorFlow's shard order, the order of the names ``f"{index % 2**64:08d}"`` (TensorFlow names
a shard's directory by its index as an unsigned 64-bit integer, at least 8 digits, and lists
them sorted: shard 10 comes before shard 9, and negative indices after the positive ones).
"""

from __future__ import annotations

import collections
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from towerdist._src import nest
from towerdist._src.atomic_file import AtomicFile
from towerdist._src.data import options as options_lib
from towerdist._src.data import state_codec
from towerdist._src.data.cursor import Saved, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.interleave import default_cycle_length
from towerdist._src.data.padding import refuse_unrepresentable
from towerdist._src.data.records import ShardPosition, ShardWriter, encode, read_shard
from towerdist._src.data.spec import DatasetSpec, ElementSpec, TensorSpec, dtype_name, shapes_compatible
from towerdist._src.data.structure import call_with_element, close_iterator
from towerdist._src.data.windowing import ElementsDataset
from towerdist._src.errors import DataLossError, InvalidArgumentError, NotFoundError, UnimplementedError
from towerdist._src.failures import unworded, worded_at

__all__ = ["FORMAT", "MANIFEST", "VERSION", "LoadDataset", "ShardFileDataset", "load", "save"]

FORMAT = "towerdist.data.Dataset.save"
VERSION = 1
MANIFEST = "towerdist_dataset.json"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# The dtypes the format holds, by the names the manifest uses (TensorFlow's names). Only these
# exact names are read back: numpy would also accept "O", ">i8", "int" or "float128".
_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(np.object_ if name == "string" else name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128", "string",
    )
}  # fmt: skip
# The names of the shard files save() writes: the only files it ever removes.
_SHARD_FILE = re.compile(r"shard-[0-9a-f]{12}-(0|-?[1-9][0-9]*)\.tdrec(\.gz)?")


# --- arguments ---------------------------------------------------------------------------------


def _compression(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.upper() == "GZIP":
        return "GZIP"
    raise unworded(InvalidArgumentError(f"supports compression=None or 'GZIP'. Got compression={value!r}."))


def _savable_dtype(dtype: np.dtype[Any]) -> bool:
    return dtype_name(dtype) in _DTYPES


# --- element specs as JSON -----------------------------------------------------------------------


def _spec_to_json(spec: ElementSpec) -> dict[str, Any]:
    if isinstance(spec, TensorSpec):
        if not _savable_dtype(spec.dtype):
            raise unworded(
                TypeError(
                    f"saves numbers, booleans and strings ({', '.join(_DTYPES)}). Got a component of dtype "
                    f"{spec.dtype}."
                )
            )
        return {"tensor": {"shape": None if spec.shape is None else list(spec.shape), "dtype": dtype_name(spec.dtype)}}
    if isinstance(spec, DatasetSpec):
        raise unworded(TypeError(f"cannot save a dataset whose elements are datasets (such as windows). Got {spec!r}."))
    if isinstance(spec, tuple) and hasattr(spec, "_fields"):
        return {
            "namedtuple": {
                "name": type(spec).__name__,
                "fields": list(spec._fields),
                "items": [_spec_to_json(s) for s in spec],
            }
        }
    if isinstance(spec, tuple):
        return {"tuple": [_spec_to_json(s) for s in spec]}
    if isinstance(spec, dict):
        for key in spec:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise unworded(TypeError(f"saves dict elements with str or int keys. Got the key {key!r}."))
        return {"dict": [[key, _spec_to_json(value)] for key, value in spec.items()]}
    raise unworded(TypeError(f"cannot save an element component described by {spec!r}."))


def _spec_from_json(value: object) -> ElementSpec:
    """The element spec of a manifest (``ValueError``/``TypeError``/``KeyError`` if malformed)."""
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(f"not a spec: {value!r}")
    ((kind, body),) = value.items()
    if kind == "tensor":
        shape = body["shape"]
        if shape is not None and (not isinstance(shape, list) or not all(_dimension(d) for d in shape)):
            raise ValueError(f"bad shape {shape!r}")
        dtype = body["dtype"]
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise ValueError(f"bad dtype {dtype!r} (the format holds {', '.join(_DTYPES)})")
        return TensorSpec(shape, _DTYPES[dtype])
    if kind == "tuple":
        if not isinstance(body, list):
            raise ValueError(f"bad tuple {body!r}")
        return tuple(_spec_from_json(item) for item in body)
    if kind == "dict":
        keys = [key for key, _ in body]
        if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys) or len(set(keys)) != len(keys):
            raise ValueError(f"bad dict keys {keys!r}")
        return {key: _spec_from_json(item) for key, item in body}
    if kind == "namedtuple":
        cls = _namedtuple_type(body["name"], body["fields"])
        items = body["items"]
        if not isinstance(items, list) or len(items) != len(cls._fields):
            raise ValueError(f"namedtuple {body['name']!r} has fields {cls._fields} but {items!r}")
        return cls(*(_spec_from_json(item) for item in items))
    raise ValueError(f"unknown spec kind {kind!r}")


# The namedtuple types of loaded specs, one per name and fields: the datasets loaded in one process
# (and the shards of a restored iterator) give elements of one type.
_namedtuple_types: dict[tuple[str, tuple[str, ...]], type] = {}


def _namedtuple_type(name: object, fields: object) -> type[Any]:
    if not isinstance(name, str) or not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise ValueError(f"bad namedtuple {name!r} with fields {fields!r}")
    key = (name, tuple(fields))
    cls = _namedtuple_types.get(key)
    if cls is None:
        cls = _namedtuple_types[key] = collections.namedtuple(name, fields)
    return cls


def _dimension(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT64_MAX)


# --- save --------------------------------------------------------------------------------------


class _SpecTracker:
    """The most specific spec of the elements seen (for pipelines whose spec is known only by running them)."""

    def __init__(self) -> None:
        self.treespec: Any = None
        self.dtypes: list[np.dtype[Any]] = []
        self.shapes: list[list[int | None]] = []

    def add(self, leaves: list[Any], treespec: nest.PyTreeSpec, position: int) -> None:
        if self.treespec is None:
            self.treespec = treespec
            self.dtypes = [leaf.dtype for leaf in leaves]
            self.shapes = [list(leaf.shape) for leaf in leaves]
            return
        if treespec != self.treespec:
            raise unworded(
                InvalidArgumentError(
                    f"needs every element to have one structure; element {position} is {treespec}, the first "
                    f"{self.treespec}."
                )
            )
        for index, leaf in enumerate(leaves):
            if leaf.dtype != self.dtypes[index] or leaf.ndim != len(self.shapes[index]):
                raise unworded(
                    InvalidArgumentError(
                        f"needs every element to have one dtype and rank per component; component {index} of "
                        f"element {position} is {dtype_name(leaf.dtype)} of shape {leaf.shape}, of the first element "
                        f"{dtype_name(self.dtypes[index])} of rank {len(self.shapes[index])}."
                    )
                )
            known = self.shapes[index]
            for dim, size in enumerate(leaf.shape):
                if known[dim] != size:
                    known[dim] = None

    def spec(self) -> ElementSpec:
        return self.treespec.unflatten(
            [TensorSpec(shape, dtype) for shape, dtype in zip(self.shapes, self.dtypes, strict=True)]
        )


def _shard_index(value: object, position: int) -> int:
    array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic)) else None
    if array is None or array.dtype != np.int64 or array.ndim != 0:
        raise unworded(
            InvalidArgumentError(
                f"shard_func must return a scalar int64 (as in TensorFlow, where a Python int is an int32), but "
                f"for element {position} it returned {value!r}. Return np.int64(...)."
            )
        )
    return int(array)


def save(
    dataset: Dataset,
    path: str | os.PathLike[str],
    compression: str | None = None,
    shard_func: Callable[..., Any] | None = None,
    checkpoint_args: object = None,
) -> None:
    """See ``Dataset.save``."""
    if not isinstance(dataset, Dataset):
        raise unworded(TypeError(f"saves a td.data.Dataset. Got {dataset!r}."))
    directory = os.fspath(path)
    codec = _compression(compression)
    if shard_func is not None and not callable(shard_func):
        raise unworded(TypeError(f"takes a callable shard_func. Got shard_func={shard_func!r}."))
    if checkpoint_args is not None:
        raise unworded(
            UnimplementedError(
                f"does not support checkpoint_args (saving in checkpointed steps); a save that fails leaves the "
                f"previous save in place. Got checkpoint_args={checkpoint_args!r}."
            )
        )
    if dataset._cardinality() == options_lib.INFINITE:
        raise unworded(InvalidArgumentError("cannot save an infinite dataset; take() a finite part of it first."))
    static = dataset._spec(probe=False)
    static_json = None if static is None else _spec_to_json(static)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise unworded(
            InvalidArgumentError(f"saves into a directory, but {directory!r} is a file. Choose another path.")
        )
    os.makedirs(directory, exist_ok=True)
    old = _previous_files(directory)
    run = uuid.uuid4().hex[:12]
    suffix = ".tdrec.gz" if codec == "GZIP" else ".tdrec"
    writers: dict[int, ShardWriter] = {}
    tracker = _SpecTracker()
    shards: list[dict[str, Any]] = []
    source = dataset._cursor()
    try:
        for position, element in enumerate(source):
            index = 0 if shard_func is None else _shard_index(call_with_element(shard_func, element), position)
            leaves, treespec = nest.flatten(element)
            arrays = [refuse_unrepresentable(leaf, k) for k, leaf in enumerate(leaves)]
            for k, array in enumerate(arrays):
                if not _savable_dtype(array.dtype):
                    raise unworded(
                        TypeError(
                            f"saves numbers, booleans and strings ({', '.join(_DTYPES)}). Component {k} is "
                            f"{array.dtype}."
                        )
                    )
            if static is None:
                tracker.add(arrays, treespec, position)
            writer = writers.get(index)
            if writer is None:
                name = f"shard-{run}-{index}{suffix}"
                writer = writers[index] = ShardWriter(directory, name, codec)
            writer.write(encode(arrays))
        for index in sorted(writers):
            writer = writers[index]
            size, crc = writer.close()
            shards.append(
                {"index": index, "file": writer.name, "elements": writer.elements, "bytes": size, "crc32": crc}
            )
        if static_json is None:
            static_json = _spec_to_json(_probed_spec(dataset) if tracker.treespec is None else tracker.spec())
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "element_spec": static_json,
            "compression": codec,
            "cardinality": sum(s["elements"] for s in shards),
            "shards": shards,
        }
        _write_manifest(directory, manifest)
    except BaseException:
        for writer in writers.values():
            writer.abandon()
        raise
    finally:
        close_iterator(source)
    keep = {s["file"] for s in shards}
    for name in sorted(old - keep):
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass  # a file of the previous save that is already gone or locked: the new manifest does not list it


def _probed_spec(dataset: Dataset) -> ElementSpec:
    """The spec of an empty dataset whose spec is known only by running it (as ``element_spec`` finds it).

    TensorFlow saves such a dataset with its traced spec (observed in TensorFlow 2.21:
    ``range(0).map(lambda x: x * 2)`` loads with ``TensorSpec((), tf.int64)``).
    """
    try:
        return dataset._spec(probe=True)
    except ValueError as error:
        raise unworded(
            ValueError(
                f"cannot save this empty dataset: its element_spec is known only by running it, and it has no "
                f"elements to learn it from ({error})"
            )
        ) from error


def _previous_files(directory: str) -> set[str]:
    """The shard files of the save already in ``directory`` (removed once the new save is in place).

    Only names save() itself writes count: an edited or damaged manifest that lists the
    manifest, or a user's file, must not make a save delete it.
    """
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        return {s["file"] for s in manifest["shards"] if _is_shard_file(s["file"])}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return set()


def _is_shard_file(name: object) -> bool:
    return isinstance(name, str) and _SHARD_FILE.fullmatch(name) is not None


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and os.path.basename(name) == name and "/" not in name


def _write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    with AtomicFile(os.path.join(directory, MANIFEST), text=True) as f:  # durable: the save's commit point
        json.dump(manifest, f, indent=1)


# --- load --------------------------------------------------------------------------------------


def _corrupt(directory: str, why: str) -> DataLossError:
    where = os.path.join(directory, MANIFEST)
    return DataLossError(f"Dataset.load() cannot read {where}: {why}.", path=where)


def _read_manifest(directory: str) -> dict[str, Any]:
    where = os.path.join(directory, MANIFEST)
    if not os.path.isfile(where):
        raise NotFoundError(
            f"Dataset.load() found no saved dataset at {directory!r}: it has no {MANIFEST} (save one with "
            f"Dataset.save()).",
            path=directory,
        )
    try:
        with open(where, encoding="utf-8") as f:
            manifest = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise _corrupt(directory, f"it is not valid JSON ({error})") from None
    except RecursionError:
        raise _corrupt(directory, "it is nested too deeply to be a manifest") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _corrupt(directory, f"it is not a manifest of format {FORMAT!r}")
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _corrupt(directory, f"its version is {version!r}")
    if version > VERSION:
        raise _corrupt(
            directory,
            f"it is format version {version}, written by a newer towerdist; this one reads version {VERSION}. "
            f"Upgrade towerdist to load it",
        )
    try:
        shards = manifest["shards"]
        cardinality = manifest["cardinality"]
        if manifest["compression"] not in (None, "GZIP"):
            raise ValueError(f"unknown compression {manifest['compression']!r}")
        if not isinstance(shards, list) or not isinstance(cardinality, int):
            raise ValueError("shards must be a list and cardinality an int")
        indices = []
        for shard in shards:
            if not _plain_name(shard["file"]):
                raise ValueError(f"shard file {shard['file']!r} is not a plain file name")
            for key in ("index", "elements", "bytes", "crc32"):
                if not isinstance(shard[key], int) or isinstance(shard[key], bool):
                    raise ValueError(f"shard {key} {shard[key]!r} is not an int")
            if shard["elements"] < 0 or shard["bytes"] < 0 or not _INT64_MIN <= shard["index"] <= _INT64_MAX:
                raise ValueError(f"shard {shard!r} has out-of-range fields")
            indices.append(shard["index"])
        if indices != sorted(set(indices)):
            raise ValueError("shard indices must be distinct and ascending")
        if sum(s["elements"] for s in shards) != cardinality:
            raise ValueError(f"cardinality {cardinality} is not the shards' element count")
        manifest["element_spec"] = _spec_from_json(manifest["element_spec"])
        nest.flatten(manifest["element_spec"])  # the structure must also be one optree can walk
    except (KeyError, TypeError, ValueError) as error:
        raise _corrupt(directory, f"a field is missing or malformed ({error})") from None
    except RecursionError:
        raise _corrupt(directory, "its element_spec is nested too deeply") from None
    return manifest


def _check_spec_matches(given: ElementSpec, saved: ElementSpec, directory: str) -> None:
    mismatch = _spec_mismatch(given, saved, ())
    if mismatch:
        raise InvalidArgumentError(
            f"Dataset.load() element_spec does not match the dataset saved at {directory!r}: {mismatch}. Got "
            f"element_spec={given!r}, saved {saved!r}; leave element_spec out to use the saved one."
        )


def _spec_mismatch(given: ElementSpec, saved: ElementSpec, path: tuple[Any, ...]) -> str:
    """Where ``given`` cannot describe the elements of spec ``saved`` ("" if it can).

    A namedtuple matches one of the same type name and fields: the manifest keeps only those,
    so the saved spec's class is a new one, never the class the user saved with.
    """
    where = f"at {nest.format_path(path)}"
    if isinstance(saved, TensorSpec):
        if not isinstance(given, TensorSpec):
            return f"{where}: given {given!r}, saved {saved!r}"
        if given.dtype != saved.dtype or not shapes_compatible(given.shape, saved.shape):
            return f"{where}: given {given!r}, saved {saved!r}"
        return ""
    if isinstance(saved, dict):
        if not isinstance(given, dict) or set(given) != set(saved):
            return f"{where}: given {given!r}, saved a dict with keys {sorted(map(repr, saved))}"
        children: list[tuple[Any, Any, Any]] = [(key, given[key], saved[key]) for key in saved]
    elif isinstance(saved, tuple):
        fields = getattr(saved, "_fields", None)
        if fields is not None:
            same = isinstance(given, tuple) and type(given).__name__ == type(saved).__name__
            if not same or getattr(given, "_fields", None) != fields:
                return f"{where}: given {given!r}, saved a namedtuple {type(saved).__name__}{fields}"
        elif type(given) is not tuple or len(given) != len(saved):
            return f"{where}: given {given!r}, saved a tuple of length {len(saved)}"
        children = [(i, g, s) for i, (g, s) in enumerate(zip(given, saved, strict=True))]
    else:
        return f"{where}: the saved spec holds {saved!r}"
    for key, g, s in children:
        inner = _spec_mismatch(g, s, (*path, key))
        if inner:
            return inner
    return ""


class ShardFileDataset(Dataset):
    """The elements of one shard file (what ``reader_func`` is given a dataset of).

    A pass's position is the number of records read and the stream offset after them
    (``records``, ``offset``); a restored pass opens the file again and goes on from there.
    A shard is itself storable in a saved position (``state_codec``), as the open input of
    the ``interleave`` that reads the shards is.
    """

    def __init__(self, directory: str, manifest: dict[str, Any], spec: ElementSpec, shard: dict[str, Any]) -> None:
        self._directory = directory
        self._manifest = manifest
        self._element_spec = spec
        self._shard = shard

    def _iterate(self, state: State) -> Iterator[Any]:
        if not state.resumed:
            state.records, state.offset = 0, 0
        state._position = position = ShardPosition(state.records, state.offset)
        _, structure = nest.flatten(self._element_spec)
        return read_shard(
            os.path.join(self._directory, self._shard["file"]),
            self._shard,
            self._manifest["element_spec"],
            self._manifest["compression"],
            structure,
            position,
        )

    def _save_state(self, state: State) -> Saved:
        state.records, state.offset = state._position.records, state._position.offset
        return super()._save_state(state)

    def _state_params(self) -> dict[str, Any]:
        return {"file": self._shard["file"]}

    def _spec(self, probe: bool) -> ElementSpec:
        return self._element_spec

    def _cardinality(self) -> int:
        return int(self._shard["elements"])


def _shard_to_tree(shard: ShardFileDataset) -> dict[str, Any]:
    saved = shard._manifest["element_spec"]
    return {
        "directory": shard._directory,
        "shard": shard._shard,
        "compression": shard._manifest["compression"],
        "saved_spec": _spec_to_json(saved),
        "spec": None if shard._element_spec is saved else shard._element_spec,
    }


def _shard_from_tree(tree: dict[str, Any]) -> ShardFileDataset:
    saved = _spec_from_json(tree["saved_spec"])
    manifest = {"element_spec": saved, "compression": tree["compression"]}
    spec = saved if tree["spec"] is None else tree["spec"]
    return ShardFileDataset(tree["directory"], manifest, spec, tree["shard"])


state_codec.register("load_shard", ShardFileDataset, _shard_to_tree, _shard_from_tree)


class LoadDataset(Dataset):
    """A loaded dataset: its shards read by ``reader``, with the saved spec and cardinality.

    The reading pipeline is held, not an input: the loaded dataset is a source (auto-sharding
    shards its elements). A pass's position is the reading pipeline's (the child ``"reader"``).
    """

    def __init__(self, reader: Dataset, spec: ElementSpec, cardinality: int) -> None:
        self._reader = reader
        self._element_spec = spec
        self._count = cardinality

    def _iterate(self, state: State) -> Iterator[Any]:
        return iter(state.open(self._reader, "reader"))

    def _restored_input(self, key: str, state: State) -> Dataset:
        return self._reader

    def _spec(self, probe: bool) -> ElementSpec:
        return self._element_spec

    def _cardinality(self) -> int:
        return self._count


def _tensorflow_shard_order(index: int) -> str:
    """The sort key of shard ``index`` in TensorFlow's reading order (its directory name).

    Observed in TensorFlow 2.21: shard directories are named ``%08llu.shard`` of the index as
    an unsigned 64-bit integer and read in sorted name order, so shard 10 comes before 9 and
    -1 (``18446744073709551615``) after 100 but before 4294967296.
    """
    return f"{index % 2**64:08d}"


def load(
    path: str | os.PathLike[str],
    element_spec: ElementSpec = None,
    compression: str | None = None,
    reader_func: Callable[[Dataset], object] | None = None,
) -> Dataset:
    """See ``Dataset.load``."""
    directory = os.fspath(path)
    codec = _compression(compression)
    if reader_func is not None and not callable(reader_func):
        raise unworded(TypeError(f"takes a callable reader_func. Got reader_func={reader_func!r}."))
    manifest = _read_manifest(directory)
    if manifest["compression"] != codec:
        raise unworded(
            DataLossError(
                f"the dataset at {directory!r} was saved with compression={manifest['compression']!r}, but "
                f"load() was given compression={compression!r}; pass the compression it was saved with.",
                path=directory,
            )
        )
    for shard in manifest["shards"]:
        file = os.path.join(directory, shard["file"])
        try:
            size = os.path.getsize(file)
        except OSError:
            raise unworded(
                DataLossError(f"the shard file {file} listed in the manifest is missing.", path=file)
            ) from None
        if size != shard["bytes"]:
            raise unworded(
                DataLossError(
                    f"the shard file {file} has {size} bytes, the manifest says {shard['bytes']}: it is truncated "
                    f"or was changed after saving.",
                    path=file,
                )
            )
    spec = manifest["element_spec"]
    if element_spec is not None:
        _check_spec_matches(element_spec, spec, directory)
        spec = element_spec
    ordered = sorted(manifest["shards"], key=lambda shard: _tensorflow_shard_order(shard["index"]))
    shards = ElementsDataset(
        [ShardFileDataset(directory, manifest, spec, shard) for shard in ordered], DatasetSpec(spec)
    )
    if reader_func is None:
        # TensorFlow's default reader: interleave(lambda x: x, cycle_length=<cores>, num_parallel_calls=AUTOTUNE),
        # deterministic, so its order is the sequential interleave's.
        reader = shards.interleave(lambda shard: shard, cycle_length=default_cycle_length())
        return LoadDataset(reader, spec, int(manifest["cardinality"]))
    result = reader_func(shards)
    if not isinstance(result, Dataset):
        raise unworded(TypeError(f"reader_func must return a td.data.Dataset. It returned a {type(result).__name__}."))
    return result


def experimental_save(
    dataset: Dataset,
    path: str | os.PathLike[str],
    compression: str | None = None,
    shard_func: Callable[..., Any] | None = None,
    checkpoint_args: object = None,
) -> None:
    """``tf.data.experimental.save``: ``dataset.save(path, ...)``."""
    with worded_at("Dataset.save()"):
        save(dataset, path, compression, shard_func, checkpoint_args)


def experimental_load(
    path: str | os.PathLike[str],
    element_spec: ElementSpec = None,
    compression: str | None = None,
    reader_func: Callable[[Dataset], object] | None = None,
) -> Dataset:
    """``tf.data.experimental.load``: ``Dataset.load(path, ...)``."""
    with worded_at("Dataset.load()"):
        return load(path, element_spec, compression, reader_func)
