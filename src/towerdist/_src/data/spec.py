"""``TensorSpec``: the shape and dtype of one component of a dataset element.

Shapes are tuples whose entries are ints or ``None`` (unknown); dtypes are numpy dtypes
(``td.string`` is numpy's object dtype holding ``bytes``). The ``repr`` is TensorFlow's, so
printed element specs read the same as in TensorFlow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np

from towerdist._src import nest
from towerdist._src.type_aliases import DTypeLike, Nest, TensorLike

__all__ = [
    "ComponentSpec",
    "DatasetSpec",
    "ElementSpec",
    "EmptyDatasetError",
    "FirstElementCheck",
    "TensorSpec",
    "common_spec",
    "dtype_name",
    "is_fully_defined",
    "mixing_mismatch",
    "relax_batch",
    "spec_of",
    "spec_with_batch",
    "structure_of",
    "unknown_sizes",
]


def dtype_name(dtype: DTypeLike) -> str:
    """TensorFlow's name of a numpy dtype: ``float32``, ``int64``, ``string`` (object), ..."""
    dtype = np.dtype(dtype)
    return "string" if dtype == np.object_ else dtype.name


# The spec of one component of an element, and of a whole element. An element spec is a nest
# (tuples, namedtuples, dicts; see ``type_aliases.Nest``) of ``ComponentSpec`` leaves, or None
# where a node cannot tell it without running user code (``_spec(probe=False)``). It is ``Nest``,
# so ``Any``, for the reason ``Nest`` is: no checker spells a structure's type leaf by leaf.
ComponentSpec: TypeAlias = "TensorSpec | DatasetSpec"
ElementSpec: TypeAlias = Nest


class TensorSpec:
    """Describes an array: its shape (``None`` for unknown dimensions), dtype and name.

    Example:
      >>> td.TensorSpec(shape=(None, 2), dtype=td.float32)
      TensorSpec(shape=(None, 2), dtype=tf.float32, name=None)
    """

    __slots__ = ("_dtype", "_name", "_shape")

    def __init__(
        self, shape: Sequence[int | None] | None, dtype: DTypeLike = np.float32, name: str | None = None
    ) -> None:
        self._shape = None if shape is None else tuple(None if d is None else int(d) for d in shape)
        self._dtype = np.dtype(dtype)
        self._name = name

    @classmethod
    def from_tensor(cls, tensor: TensorLike, name: str | None = None) -> TensorSpec:
        """The spec of an array (exact shape and dtype)."""
        return cls(np.shape(tensor), _dtype_of(tensor), name)

    @property
    def shape(self) -> tuple[int | None, ...] | None:
        """The shape; ``None`` entries are unknown dimensions (``None`` itself: unknown rank)."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype of the described arrays."""
        dtype: np.dtype[Any] = self._dtype
        return dtype

    @property
    def name(self) -> str | None:
        """The optional name given at construction."""
        return self._name

    @property
    def rank(self) -> int | None:
        """The number of dimensions, or None when the shape is unknown."""
        return None if self._shape is None else len(self._shape)

    def is_compatible_with(self, spec_or_value: TensorSpec | TensorLike) -> bool:
        """True if ``spec_or_value`` (a spec or an array) has this dtype and a fitting shape."""
        other = spec_or_value if isinstance(spec_or_value, TensorSpec) else TensorSpec.from_tensor(spec_or_value)
        if other.dtype != self._dtype:
            return False
        return shapes_compatible(self._shape, other.shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorSpec):
            return NotImplemented
        return (self._shape, self._dtype, self._name) == (other._shape, other._dtype, other._name)

    def __hash__(self) -> int:
        return hash((self._shape, self._dtype, self._name))

    def __repr__(self) -> str:
        shape = "<unknown>" if self._shape is None else repr(self._shape)
        return f"TensorSpec(shape={shape}, dtype=tf.{dtype_name(self._dtype)}, name={self._name!r})"


def shapes_compatible(a: tuple[int | None, ...] | None, b: tuple[int | None, ...] | None) -> bool:
    """True if shapes ``a`` and ``b`` could describe the same array."""
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def is_fully_defined(structure: ElementSpec) -> bool:
    """True if every spec in ``structure`` has a known rank and no unknown dimension."""
    leaves, _ = nest.flatten(structure)
    return all(spec.shape is not None and None not in spec.shape for spec in leaves)


def _dtype_of(value: TensorLike) -> DTypeLike:
    if isinstance(value, (bytes, str)):
        return np.object_
    return getattr(value, "dtype", None) or np.asarray(value).dtype


def spec_of(value: TensorLike) -> TensorSpec:
    """The exact spec of one component."""
    return TensorSpec.from_tensor(value)


def structure_of(element: Nest) -> ElementSpec:
    """The structure of specs of a dataset element (exact shapes)."""
    return nest.map_structure(spec_of, element)


class DatasetSpec:
    """The spec of a component that is itself a dataset (``tf.data.DatasetSpec``), e.g. a window.

    Example:
      >>> td.data.Dataset.range(5).window(2).element_spec
      DatasetSpec(TensorSpec(shape=(), dtype=tf.int64, name=None), TensorShape([]))
    """

    __slots__ = ("_element_spec",)

    def __init__(self, element_spec: ElementSpec) -> None:
        self._element_spec = element_spec

    @property
    def element_spec(self) -> ElementSpec:
        """The element spec of the datasets described."""
        return self._element_spec

    @property
    def shape(self) -> tuple[int, ...]:
        """A dataset is one value: its shape is that of a scalar."""
        return ()

    def is_compatible_with(self, other: object) -> bool:
        """True for a ``DatasetSpec`` or dataset with the same element structure and dtypes."""
        other_spec = getattr(other, "element_spec", None) if _is_dataset_or_spec(other) else None
        if other_spec is None:
            return False
        mine, mine_tree = nest.flatten(self._element_spec)
        theirs, their_tree = nest.flatten(other_spec)
        return mine_tree == their_tree and all(a.is_compatible_with(b) for a, b in zip(mine, theirs, strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DatasetSpec):
            return NotImplemented
        return bool(self._element_spec == other._element_spec)

    def __hash__(self) -> int:
        leaves, treespec = nest.flatten(self._element_spec)
        return hash((tuple(leaves), str(treespec)))

    def __repr__(self) -> str:
        return f"DatasetSpec({self._element_spec!r}, TensorShape([]))"


def _is_dataset_or_spec(value: object) -> bool:
    from towerdist._src.data.dataset import Dataset  # noqa: PLC0415  (dataset.py imports this module)

    return isinstance(value, (DatasetSpec, Dataset))


def mixing_mismatch(first: ElementSpec, second: ElementSpec) -> str:
    """Where elements of specs ``first`` and ``second`` cannot go in one dataset ("" where they can).

    Such elements need the same structure and dtypes; shapes may differ (the mixed spec
    relaxes them). ``DatasetSpec`` components (windows) mix with each other.
    """
    mismatch = nest.explain_mismatch(first, second)
    if mismatch:
        return mismatch
    paths, leaves_a, treespec = nest.flatten_with_paths(first)
    for path, a, b in zip(paths, leaves_a, treespec.flatten_up_to(second), strict=True):
        if isinstance(a, TensorSpec) and isinstance(b, TensorSpec):
            if a.dtype != b.dtype:
                return f"at {nest.format_path(path)}: dtype {dtype_name(a.dtype)} vs {dtype_name(b.dtype)}"
        elif type(a) is not type(b):
            return f"at {nest.format_path(path)}: {a!r} vs {b!r}"
    return ""


# --- the spec algebra: what a transformation's element spec is, from its inputs' ---------------


def _relaxed(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    """The most specific spec that both ``a`` and ``b`` fit (``a``'s dtype)."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorSpec(None, a.dtype)
    return TensorSpec(tuple(x if x == y else None for x, y in zip(a.shape, b.shape, strict=True)), a.dtype)


def common_spec(specs: Sequence[ElementSpec]) -> ElementSpec:
    """The most specific spec that every one of ``specs`` fits: sizes (or ranks) that differ become ``None``.

    The specs have one structure (check with :func:`mixing_mismatch` first). Where their
    leaves are ``TensorSpec`` of one dtype they are relaxed; elsewhere (``DatasetSpec``
    windows, differing dtypes) the first spec's leaf stays.
    """
    leaves, treespec = nest.flatten(specs[0])
    for spec in specs[1:]:
        others: list[Any] = list(treespec.flatten_up_to(spec))
        leaves = [
            _relaxed(a, b) if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.dtype == b.dtype else a
            for a, b in zip(leaves, others, strict=True)
        ]
    return treespec.unflatten(leaves)


def unknown_sizes(spec: ElementSpec) -> ElementSpec:
    """``spec`` with every dimension unknown (for specs learnt from one element)."""
    return nest.map_structure(lambda s: TensorSpec(None if s.shape is None else (None,) * len(s.shape), s.dtype), spec)


def spec_with_batch(spec: ElementSpec, batch: int | None) -> ElementSpec:
    """``spec`` with a leading batch dimension added to every component."""
    return nest.map_structure(lambda s: TensorSpec(None if s.shape is None else (batch, *s.shape), s.dtype), spec)


def relax_batch(exact: ElementSpec, input_spec: ElementSpec) -> ElementSpec:
    """A probed spec with the batch dimension unknown where the input's batch dimension is.

    ``map`` is learnt by calling the function on the first element; a leading dimension
    equal to the input's unknown batch dimension is taken to be that batch dimension.
    """
    leaves, _ = nest.flatten(input_spec)
    unknown_batch = any(s.shape and s.shape[0] is None for s in leaves)
    if not unknown_batch:
        return exact
    return nest.map_structure(lambda s: TensorSpec((None, *s.shape[1:]) if s.shape else s.shape, s.dtype), exact)


class EmptyDatasetError(ValueError):
    """The element spec was to be learnt from the first element, and there is none."""


class FirstElementCheck:
    """Checks, while a dataset runs, that the inputs it mixes give elements of one structure and dtypes.

    TensorFlow knows every input's spec when the dataset is made and refuses a mix then
    (``TypeError``); where towerdist learns a spec only by running the input (``map``,
    ``from_generator`` without a signature), the first element of each input is compared with
    the first spec known, and ``describe(a, spec_a, b, spec_b, where)`` words the error, ``a``
    and ``b`` naming the inputs. Inputs of known spec were checked when the dataset was made.
    """

    def __init__(self, describe: Callable[[int, ElementSpec, int, ElementSpec, str], str]) -> None:
        self._describe = describe
        self._reference: tuple[int, ElementSpec] | None = None  # (input, spec)
        self._lock = threading.Lock()  # the inputs of a parallel interleave are checked on its threads

    def known(self, key: int, spec: ElementSpec) -> None:
        """Records input ``key``'s static spec as the reference, if there is none yet."""
        if spec is not None and self._reference is None:
            self._reference = (key, spec)

    def first(self, key: int, element: Nest) -> None:
        """Checks the first element of input ``key``; raises ``TypeError`` where it cannot mix."""
        self.spec(key, structure_of(element))

    def spec(self, key: int, spec: ElementSpec) -> None:
        """Checks input ``key`` of static spec ``spec``; raises ``TypeError`` where it cannot mix."""
        with self._lock:
            if self._reference is None:
                self._reference = (key, spec)
                return
            reference_key, reference = self._reference
        where = mixing_mismatch(reference, spec)
        if where:
            raise TypeError(self._describe(reference_key, reference, key, spec, where))
