"""Saved iterator positions as bytes, and back: JSON for the structure, ``.npy`` for the arrays.

A saved position (:mod:`~towerdist._src.data.cursor`) is a tree of plain values, arrays and
dataset elements. :func:`encode` writes it as a zip archive (stored, not compressed) of
``state.json`` and one ``<k>.npy`` member per array; nothing is pickled, so reading a
state runs no code from the file. In the JSON, values JSON has no word for are objects
tagged by the key ``"~"`` (a tuple, bytes, an array member, a random generator, ...).

A list of elements of one structure, shapes and dtypes (a shuffle buffer, a window) is
stored *column-wise*: one stacked array per component instead of one member per element,
so that a buffer of 10,000 examples is a few large arrays. Restored elements are read-only
views of those arrays, as the elements of a dataset are.

Values the format has no tag for raise ``TypeError`` naming their type; the cursor that
holds them words it.
"""

from __future__ import annotations

import base64
import collections
import importlib
import io
import json
import zipfile
from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np

from towerdist._src import backend, nest
from towerdist._src.backend import gpu_module
from towerdist._src.data.spec import DatasetSpec, TensorSpec
from towerdist._src.errors import DataLossError
from towerdist._src.type_aliases import Nest, TensorLike

__all__ = ["FORMAT", "FORMAT_VERSION", "decode", "encode", "import_type", "register", "type_name"]

FORMAT = "towerdist-iterator-state"
FORMAT_VERSION = 1
_TAG = "~"
_STACK_AT_LEAST = 4  # lists shorter than this are stored item by item
_STORABLE_KINDS = "biufcSUMm"  # what a .npy member holds without pickling

# A JSON value, the stored form of a position (its arrays aside): None, a bool, int, float or str,
# or a list or str-keyed dict of them. ``object``, not the recursive union: lists and dicts are
# invariant, so the union would reject the ``list[int]`` and ``dict[str, list[...]]`` built here.
Json: TypeAlias = object

# Dataset values a position may hold (a window is a small dataset): tag -> (class, to tree, from tree).
_values: dict[str, tuple[type, Callable[[Any], Any], Callable[[Any], Any]]] = {}


def register(tag: str, cls: type, to_tree: Callable[[Any], Any], from_tree: Callable[[Any], Any]) -> None:
    """Makes instances of ``cls`` storable: ``to_tree(value)`` is saved, ``from_tree(tree)`` rebuilds it."""
    _values[tag] = (cls, to_tree, from_tree)


# --- encoding ----------------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def array(self, value: np.ndarray) -> int:
        self.arrays.append(value)
        return len(self.arrays) - 1

    def encode(self, value: object) -> Json:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)) and type(value) in (int, float):
            return value
        if isinstance(value, np.ndarray):
            return self._ndarray(value)
        if isinstance(value, np.generic):
            if value.dtype.kind == "O":
                return {_TAG: "object_scalar", "v": self.encode(value.item())}
            return {_TAG: "scalar", "i": self.array(np.asarray(value))}
        if isinstance(value, bytes):
            return {_TAG: "bytes", "b64": base64.b64encode(value).decode("ascii")}
        if isinstance(value, list):
            return self._list(value)
        if isinstance(value, tuple):
            fields = getattr(type(value), "_fields", None)
            if fields is not None:
                return {_TAG: "namedtuple", "type": type_name(type(value)), "v": [self.encode(v) for v in value]}
            return {_TAG: "tuple", "v": [self.encode(v) for v in value]}
        if isinstance(value, dict):
            return self._dict(value)
        if isinstance(value, collections.deque):
            return {_TAG: "deque", "v": self._list(list(value))}
        if isinstance(value, (set, frozenset)):
            return {_TAG: "set", "v": [self.encode(v) for v in value]}
        if isinstance(value, np.random.Generator):
            bit_generator = value.bit_generator
            return {_TAG: "rng", "bit_generator": type(bit_generator).__name__, "state": self.encode(bit_generator.state)}
        if isinstance(value, _Leaf):
            return {_TAG: "leaf", "k": value.k}
        if isinstance(value, TensorSpec):
            shape = None if value.shape is None else list(value.shape)
            return {_TAG: "tensor_spec", "shape": shape, "dtype": value.dtype.str, "name": value.name}
        if isinstance(value, DatasetSpec):
            return {_TAG: "dataset_spec", "v": self.encode(value.element_spec)}
        for tag, (cls, to_tree, _) in _values.items():
            if type(value) is cls:
                return {_TAG: tag, "v": self.encode(to_tree(value))}
        if backend.is_array(value):  # a GPU array: saved through host memory, restored onto the GPU
            host = np.asarray(backend.host().to_device(value, None))
            return {_TAG: "gpu_array", "i": self.array(host)}
        raise TypeError(f"a value of type {type_name(type(value))} ({_preview(value)}) cannot be saved")

    def _ndarray(self, value: np.ndarray) -> Json:
        if value.dtype.kind in _STORABLE_KINDS:
            return {_TAG: "array", "i": self.array(value)}
        if value.dtype.kind == "O":  # strings: bytes objects in an object array
            return {_TAG: "object_array", "shape": list(value.shape), "v": [self.encode(v) for v in value.reshape(-1)]}
        raise TypeError(f"an array of dtype {value.dtype} cannot be saved")

    def _dict(self, value: dict[Any, Any]) -> Json:
        if type(value) is dict and _TAG not in value and all(type(k) is str for k in value):
            return {k: self.encode(v) for k, v in value.items()}
        items = [[self.encode(k), self.encode(v)] for k, v in value.items()]
        if type(value) is dict:
            return {_TAG: "dict", "items": items}
        if type(value) is collections.OrderedDict:
            return {_TAG: "ordered_dict", "items": items}
        raise TypeError(f"a mapping of type {type_name(type(value))} cannot be saved")

    def _list(self, value: list[Any]) -> Json:
        stacked = self._stacked(value) if len(value) >= _STACK_AT_LEAST else None
        if stacked is not None:
            return stacked
        return [self.encode(v) for v in value]

    def _stacked(self, items: list[Any]) -> Json:
        """``items`` column-wise, if they are elements of one structure, shapes and dtypes; else None."""
        first = items[0]
        if not _is_element(first):
            return None
        leaves, treespec = nest.flatten(first)
        if not leaves or not all(_stackable(leaf) for leaf in leaves):
            return None
        kinds = [(np.shape(leaf), leaf.dtype, isinstance(leaf, np.generic)) for leaf in leaves]
        columns: list[list[Any]] = [[] for _ in leaves]
        for item in items:
            try:
                item_leaves = treespec.flatten_up_to(item) if item is not first else leaves
            except (ValueError, TypeError):
                return None
            for column, leaf, (shape, dtype, scalar) in zip(columns, item_leaves, kinds, strict=True):
                if not _stackable(leaf) or leaf.dtype != dtype or np.shape(leaf) != shape:
                    return None
                if isinstance(leaf, np.generic) != scalar:
                    return None
                column.append(leaf)
        template = treespec.unflatten([_Leaf(k) for k in range(len(leaves))])
        return {
            _TAG: "stacked",
            "n": len(items),
            "template": self.encode(template),
            "columns": [self.array(np.stack(column)) for column in columns],
            "scalars": [scalar for _, _, scalar in kinds],
        }


class _Leaf:
    """Where component ``k`` goes in the template of a stacked list."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k


def _is_element(value: object) -> bool:
    return isinstance(value, (np.ndarray, np.generic, tuple)) or type(value) in (dict, collections.OrderedDict)


def _stackable(leaf: object) -> bool:
    return isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype.kind in _STORABLE_KINDS


def encode(tree: object) -> bytes:
    """``tree`` as bytes (see the module docstring).

    Raises:
      TypeError: a value in ``tree`` has no stored form.
    """
    writer = _Writer()
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, "state": writer.encode(tree)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("state.json", json.dumps(document, separators=(",", ":")))
        for k, array in enumerate(writer.arrays):
            with archive.open(f"{k}.npy", "w", force_zip64=True) as member:
                # (np.ascontiguousarray would make a 0-d array, a saved scalar, 1-d.)
                contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
                np.lib.format.write_array(member, contiguous, allow_pickle=False)
    return buffer.getvalue()


# --- decoding ----------------------------------------------------------------------------------


class _Reader:
    def __init__(self, archive: zipfile.ZipFile) -> None:
        self._archive = archive
        self._arrays: dict[int, np.ndarray] = {}

    def array(self, k: int) -> np.ndarray:
        if k not in self._arrays:
            with self._archive.open(f"{k}.npy") as member:
                array = np.lib.format.read_array(member, allow_pickle=False)
            array.flags.writeable = False
            self._arrays[k] = array
        return self._arrays[k]

    def decode(self, value: Json) -> Any:  # Any: the value the position held, of whatever type it was
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        tag = value.get(_TAG)
        if tag is None:
            return {k: self.decode(v) for k, v in value.items()}
        decoder = getattr(self, "_" + tag, None)
        if decoder is not None:
            return decoder(value)
        if tag in _values:
            return _values[tag][2](self.decode(value["v"]))
        raise ValueError(f"unknown value tag {tag!r}")

    def _array(self, value: dict[str, Any]) -> np.ndarray:
        return self.array(value["i"])

    def _scalar(self, value: dict[str, Any]) -> object:  # a numpy scalar
        return self.array(value["i"])[()]

    def _object_scalar(self, value: dict[str, Any]) -> object:  # a numpy object scalar
        return np.array(self.decode(value["v"]), dtype=object)[()]

    def _gpu_array(self, value: dict[str, Any]) -> TensorLike:
        return gpu_module.array_module().asarray(self.array(value["i"]))

    def _bytes(self, value: dict[str, Any]) -> bytes:
        return base64.b64decode(value["b64"])

    def _tuple(self, value: dict[str, Any]) -> tuple[object, ...]:
        return tuple(self.decode(v) for v in value["v"])

    def _namedtuple(self, value: dict[str, Any]) -> object:  # a namedtuple of the saved type
        cls = _import_namedtuple(value["type"])
        return cls(*(self.decode(v) for v in value["v"]))

    def _dict(self, value: dict[str, Any]) -> dict[object, object]:
        return {self._key(k): self.decode(v) for k, v in value["items"]}

    def _ordered_dict(self, value: dict[str, Any]) -> collections.OrderedDict[object, object]:
        return collections.OrderedDict((self._key(k), self.decode(v)) for k, v in value["items"])

    def _key(self, key: Json) -> object:
        decoded = self.decode(key)
        return tuple(decoded) if isinstance(decoded, list) else decoded

    def _deque(self, value: dict[str, Any]) -> collections.deque[object]:
        return collections.deque(self.decode(value["v"]))

    def _set(self, value: dict[str, Any]) -> set[object]:
        return {self._key(v) for v in value["v"]}

    def _rng(self, value: dict[str, Any]) -> np.random.Generator:
        bit_generator = getattr(np.random, value["bit_generator"])()
        bit_generator.state = self.decode(value["state"])
        return np.random.Generator(bit_generator)

    def _tensor_spec(self, value: dict[str, Any]) -> TensorSpec:
        return TensorSpec(value["shape"], np.dtype(value["dtype"]), value["name"])

    def _dataset_spec(self, value: dict[str, Any]) -> DatasetSpec:
        return DatasetSpec(self.decode(value["v"]))

    def _object_array(self, value: dict[str, Any]) -> np.ndarray:
        items = [self.decode(v) for v in value["v"]]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(value["shape"])

    def _stacked(self, value: dict[str, Any]) -> list[Nest]:
        columns = [self.array(k) for k in value["columns"]]
        template = self.decode(value["template"])
        leaves, treespec = nest.flatten(template)
        order = [leaf.k for leaf in leaves]
        rows = []
        for row in range(value["n"]):
            picked = []
            for k, scalar in zip(order, value["scalars"], strict=True):
                column = columns[k]
                picked.append(column[row] if scalar or column.ndim > 1 else column[row : row + 1].reshape(()))
            rows.append(treespec.unflatten(picked))
        return rows

    def _leaf(self, value: dict[str, Any]) -> _Leaf:
        return _Leaf(value["k"])


def decode(data: bytes) -> Any:  # Any: the tree encode() was given, whose shape its writer knows
    """The tree :func:`encode` wrote.

    Raises:
      DataLossError: ``data`` is not a saved iterator position (or is damaged).
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        document = json.loads(archive.read("state.json"))
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ValueError("not an iterator state")
        if document.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"format version {document.get('format_version')!r}; this towerdist reads version {FORMAT_VERSION}"
            )
        return _Reader(archive).decode(document["state"])
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError, OSError) as error:
        raise DataLossError(f"The saved iterator state cannot be read: {error}.") from None


def type_name(cls: type) -> str:
    """``module:qualname`` of a class: how a saved position names a type it must import again."""
    return f"{cls.__module__}:{cls.__qualname__}"


def import_type(name: str) -> object:
    """The object a :func:`type_name` names, imported; None where it cannot be imported here."""
    module_name, _, qualname = name.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    return value


def _import_namedtuple(name: str) -> type:
    value = import_type(name)
    if value is None:
        raise ValueError(
            f"the saved elements are namedtuples of type {name}, which cannot be imported here; import the module "
            f"that defines it (at the top level of a module) before restoring"
        )
    if not (isinstance(value, type) and issubclass(value, tuple)):
        raise ValueError(f"{name} is not a namedtuple type")
    return value


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
