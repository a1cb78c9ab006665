"""Source datasets: slices and copies of arrays, ranges, generators, and zips of datasets."""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

import numpy as np

from towerdist._src import nest
from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import Saved, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.node import GatherPlan
from towerdist._src.data.seeds import Seeded
from towerdist._src.data.spec import ElementSpec, TensorSpec, dtype_name, shapes_compatible, structure_of
from towerdist._src.data.structure import read_only, read_only_element, to_component, to_element
from towerdist._src.errors import (
    InvalidArgumentError,
    OpError,
    ResourceExhaustedError,
    UnimplementedError,
    UnknownError,
)
from towerdist._src.failures import unworded, worded_at
from towerdist._src.type_aliases import DTypeLike, Nest, TensorLike

__all__ = [
    "CounterDataset",
    "ExternalSource",
    "GeneratorDataset",
    "RandomDataset",
    "RangeDataset",
    "TensorDataset",
    "TensorSliceDataset",
    "ZipDataset",
    "zip_datasets",
    "experimental_counter",
]

# A number where ``counter`` takes its start and step (checked, and converted to its dtype, at run time).
Number: TypeAlias = "float | np.integer[Any] | np.floating[Any]"


def _frozen(component: TensorLike) -> TensorLike:
    """A private read-only copy, so elements can be views that nobody can change."""
    if isinstance(component, np.ndarray):
        if component.flags.writeable or component.base is not None:
            component = component.copy()
        component.flags.writeable = False
    return component


class TensorSliceDataset(Dataset):
    def __init__(self, tensors: Nest) -> None:
        element = to_element(tensors)
        leaves, self._treespec = nest.flatten(element)
        if not leaves:
            raise ValueError("from_tensor_slices() needs at least one component. Got an empty structure.")
        paths, _, _ = nest.flatten_with_paths(element)
        sizes = []
        for path, leaf in zip(paths, leaves, strict=True):
            if np.ndim(leaf) == 0:
                raise ValueError(
                    f"from_tensor_slices() slices every component along dimension 0, but the component at "
                    f"{nest.format_path(path)} is a scalar ({leaf!r}). Use from_tensors() for a single "
                    f"element, or give an array."
                )
            sizes.append(int(np.shape(leaf)[0]))
        if len(set(sizes)) > 1:
            described = ", ".join(f"{nest.format_path(p)}: {n}" for p, n in zip(paths, sizes, strict=True))
            raise ValueError(
                f"from_tensor_slices() needs every component to have the same size along dimension 0. Got {described}."
            )
        self._leaves = [_frozen(leaf) for leaf in leaves]
        self._size = sizes[0]
        self._single = self._treespec.num_leaves == 1 and self._treespec.num_nodes == 1

    def _iterate(self, state: State) -> Iterator[Any]:
        rows = _rows(state, range(self._size))
        if self._single:
            return map(self._leaves[0].__getitem__, rows)
        return self._elements(rows)

    def _elements(self, rows: Iterator[int]) -> Iterator[Any]:
        unflatten = self._treespec.unflatten
        leaves = self._leaves
        for i in rows:
            yield unflatten([leaf[i] for leaf in leaves])

    def _save_state(self, state: State) -> Saved:
        _note_position(state)
        return super()._save_state(state)

    def _spec(self, probe: bool) -> ElementSpec:
        specs = [TensorSpec(np.shape(leaf)[1:], leaf.dtype) for leaf in self._leaves]
        return self._treespec.unflatten(specs)

    def _cardinality(self) -> int:
        return self._size

    def _batch_size(self) -> int | None:
        return None

    def _gather_plan(self) -> GatherPlan:
        leaves, unflatten = self._leaves, self._treespec.unflatten
        return GatherPlan(IndexDataset(self._size), lambda idx: unflatten([leaf[idx] for leaf in leaves]))


class TensorDataset(Dataset):
    def __init__(self, tensors: Nest) -> None:
        self._element = nest.map_structure(_frozen, to_element(tensors))

    def _iterate(self, state: State) -> Iterator[Any]:
        if not state.resumed:
            state.done = False
        if not state.done:
            state.done = True
            yield self._element

    def _spec(self, probe: bool) -> ElementSpec:
        return structure_of(self._element)

    def _cardinality(self) -> int:
        return 1

    def _batch_size(self) -> int | None:
        leaves, _ = nest.flatten(self._element)
        sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
        return sizes.pop() if len(sizes) == 1 else None


class RangeDataset(Dataset):
    def __init__(self, *args: int, output_type: DTypeLike = np.int64) -> None:
        if not 1 <= len(args) <= 3:
            raise TypeError(f"range() takes 1 to 3 arguments (start, stop, step). Got {len(args)}.")
        bounds = [int(a) for a in args]
        if len(bounds) == 3 and bounds[2] == 0:
            raise InvalidArgumentError("range() step must not be zero. Got step=0.")
        self._range = range(*bounds)
        self._dtype = np.dtype(output_type)

    def _iterate(self, state: State) -> Iterator[Any]:
        return map(self._dtype.type, _rows(state, self._range))

    def _save_state(self, state: State) -> Saved:
        _note_position(state)
        return super()._save_state(state)

    def _spec(self, probe: bool) -> ElementSpec:
        return TensorSpec((), self._dtype)

    def _cardinality(self) -> int:
        return len(self._range)

    def _gather_plan(self) -> GatherPlan:
        start, step, dtype = self._range.start, self._range.step, self._dtype
        return GatherPlan(IndexDataset(len(self._range)), lambda idx: (start + step * idx).astype(dtype))


class IndexDataset(Dataset):
    """``0 .. n-1`` as Python ints: the indices a gather plan runs through its transformations."""

    def __init__(self, size: int) -> None:
        self._size = size

    def _iterate(self, state: State) -> Iterator[Any]:
        return _rows(state, range(self._size))

    def _save_state(self, state: State) -> Saved:
        _note_position(state)
        return super()._save_state(state)

    def _spec(self, probe: bool) -> ElementSpec:
        return TensorSpec((), np.int64)

    def _cardinality(self) -> int:
        return self._size


def _rows(state: State, values: range) -> Iterator[int]:
    """``values`` from the pass's position on, for a source that reads rows by index.

    The values come from a C range iterator (no Python step per element); :func:`_note_position`
    reads how far it got when the position is saved.
    """
    start = state.position if state.resumed else 0
    state.position = start  # (brought up to date by _note_position when saved)
    state._size = len(values)
    state._rows = rows = iter(values[start:])
    return rows


def _note_position(state: State) -> None:
    state.position = state._size - operator.length_hint(state._rows)


class ExternalSource(Dataset):
    """A source whose position lives outside the pipeline: a Python generator or iterable, a tf.data iterator.

    As TensorFlow's ``GeneratorDataset``, such a source cannot be checkpointed in the middle of
    a pass: saving then raises ``UnimplementedError`` (after the external-state policy: FAIL, or
    no policy, refuses first). A pass that has not started yet, or has ended, saves as such:
    restored, it starts the source anew, or stays ended, as the saved pass would have.
    Subclasses give the elements of a pass with ``_generate()``.
    """

    def _generate(self) -> Iterator[Any]:
        raise NotImplementedError

    def _iterate(self, state: State) -> Iterator[Any]:
        if state.resumed:  # only a pass that had ended is ever saved (see _save_state)
            return iter(())
        return self._pass(state)

    def _pass(self, state: State) -> Iterator[Any]:
        state.ended = False
        yield from self._generate()
        state.ended = True

    def _save_state(self, state: State) -> Saved:
        if not state.ended:
            raise unworded(
                UnimplementedError(
                    f"cannot save the iterator: {self._external_state()} cannot be saved in the middle of a pass "
                    f'(TensorFlow: "GeneratorDataset does not support checkpointing"). Save before its first element '
                    f"or after its last, or build the input from datasets that read the data themselves "
                    f"(from_tensor_slices, TextLineDataset, Dataset.load, ...)."
                )
            )
        return super()._save_state(state)


class GeneratorDataset(ExternalSource):
    def __init__(
        self,
        generator: Callable[..., Any],
        output_types: Nest,
        output_shapes: Nest,
        args: tuple[Any, ...] | None,
        output_signature: ElementSpec,
    ) -> None:
        if not callable(generator):
            raise TypeError(
                f"from_generator() takes a callable that returns an iterator (e.g. a generator function). "
                f"Got generator={generator!r}; wrap an existing iterable: lambda: iter(items)."
            )
        self._generator = generator
        self._args = tuple(args) if args is not None else ()
        self._signature = _signature(output_types, output_shapes, output_signature)
        if self._signature is not None:
            self._leaf_specs, self._treespec = nest.flatten(self._signature)

    def _external_state(self) -> str | None:
        return f"Dataset.from_generator({_callable_name(self._generator)}): the generator's position"

    def _tolerant(self) -> Dataset | None:
        return copy.copy(self)  # under ignore_errors(): drops the elements that do not fit the signature

    def _generate(self) -> Iterator[Any]:
        # As TensorFlow runs the generator in a py_func: an exception it raises surfaces as the
        # td.errors class TF maps it to (the original is the __cause__), and ends the pass (the
        # generator cannot go on). An element that does not fit the signature is an
        # InvalidArgumentError; under ignore_errors() it is dropped and the generator goes on.
        on_error = getattr(self, "_on_error", None)
        try:
            iterator = iter(self._generator(*self._args))
        except Exception as error:
            raise self._wrapped(error, "calling the generator") from error
        try:
            for index in itertools.count():
                try:
                    value = next(iterator)
                except StopIteration:
                    return
                except Exception as error:
                    wrapped = self._wrapped(error, f"the generator, after {index} element{'' if index == 1 else 's'}")
                    if on_error is not None:
                        on_error(wrapped)
                        return  # the generator raised: it has ended
                    raise wrapped from error
                try:
                    element = self._convert(value, index)
                except InvalidArgumentError as error:
                    if on_error is None:
                        raise
                    on_error(error)
                    continue
                yield element
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def _wrapped(self, error: Exception, where: str) -> OpError:
        """``error``, raised by ``where``, as the td.errors class TensorFlow's py_func maps it to."""
        cls = _py_func_error_class(error)
        wrapped = cls(
            f"{type(error).__name__}: {error}\n(raised in Dataset.from_generator({_callable_name(self._generator)}) "
            f"by {where}; the original exception is this error's __cause__)"
        )
        return wrapped

    def _convert(self, value: Nest, index: int) -> Nest:
        # The generator's arrays may be its own (yielded again next epoch): hand out read-only views.
        if self._signature is None:
            return read_only_element(to_element(value if not isinstance(value, list) else tuple(value)))
        if isinstance(value, list) and self._treespec.num_nodes > 1:
            value = tuple(value)
        try:
            leaves = self._treespec.flatten_up_to(value)
        except (ValueError, TypeError):
            raise InvalidArgumentError(
                f"TypeError: `generator` yielded an element that did not match the expected structure. The "
                f"expected structure was {self._signature}, but element {index} was {_preview(value)}."
            ) from None
        converted = []
        for spec, leaf in zip(self._leaf_specs, leaves, strict=True):
            try:
                array = to_component(leaf)
                text = isinstance(array, bytes) or (isinstance(array, np.ndarray) and array.dtype == np.object_)
                if text and spec.dtype != np.object_:
                    raise TypeError("a string where a number is expected")
                if not isinstance(array, bytes):
                    array = np.asarray(array, dtype=spec.dtype)
            except (TypeError, ValueError, OverflowError):
                raise InvalidArgumentError(
                    f"TypeError: `generator` yielded an element that could not be converted to the expected type. "
                    f"The expected type was {dtype_name(spec.dtype)}, but element {index} was {_preview(leaf)}."
                ) from None
            if not shapes_compatible(spec.shape, np.shape(array)):
                raise InvalidArgumentError(
                    f"TypeError: `generator` yielded an element of shape {np.shape(array)} where an element of "
                    f"shape {_shape_text(spec.shape)} was expected (element {index})."
                )
            if isinstance(array, np.ndarray) and array.ndim == 0:
                array = array[()]
            converted.append(read_only(array))
        return self._treespec.unflatten(converted)

    def _spec(self, probe: bool) -> ElementSpec:
        if self._signature is not None:
            return self._signature
        if not probe:
            return None
        exact = self._probe_spec()
        return nest.map_structure(lambda s: TensorSpec((None,) * len(s.shape), s.dtype), exact)

    def _cardinality(self) -> int:
        return options_lib.UNKNOWN


def _py_func_error_class(error: Exception) -> type[OpError]:
    """The td.errors class TensorFlow's py_func gives an exception raised in Python code (TF 2.21's mapping)."""
    if isinstance(error, (ValueError, TypeError)):
        return InvalidArgumentError
    if isinstance(error, MemoryError):
        return ResourceExhaustedError
    if isinstance(error, NotImplementedError):
        return UnimplementedError
    return UnknownError


def _shape_text(shape: tuple[int | None, ...] | None) -> str:
    return "<unknown>" if shape is None else str(tuple(shape))


def _callable_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _signature(output_types: Nest, output_shapes: Nest, output_signature: ElementSpec) -> ElementSpec:
    if output_signature is not None:
        if output_types is not None or output_shapes is not None:
            raise TypeError("from_generator() takes either output_signature or output_types/output_shapes, not both.")
        leaves, _ = nest.flatten(output_signature)
        for leaf in leaves:
            if not isinstance(leaf, TensorSpec):
                raise TypeError(f"output_signature must be a structure of td.TensorSpec. Got a leaf {leaf!r}.")
        return output_signature
    if output_types is None:
        if output_shapes is not None:
            raise TypeError("from_generator() got output_shapes without output_types.")
        return None
    if output_shapes is None:
        return nest.map_structure(lambda t: TensorSpec(None, t), output_types)
    type_leaves, treespec = nest.flatten(output_types)
    shape_leaves: list[Any] = list(treespec.flatten_up_to(output_shapes))
    specs = [TensorSpec(None if s is None else tuple(s), t) for t, s in zip(type_leaves, shape_leaves, strict=True)]
    return treespec.unflatten(specs)


def _contains_list(structure: object) -> bool:
    if isinstance(structure, list):
        return True
    if isinstance(structure, tuple):
        return any(_contains_list(v) for v in structure)
    if isinstance(structure, dict):
        return any(_contains_list(v) for v in structure.values())
    return False


class ZipDataset(Dataset):
    def __init__(self, structure: Nest) -> None:
        if _contains_list(structure):
            raise TypeError(
                "Invalid input to `zip`. Inputs are expected to be (nested) structures of `td.data.Dataset` "
                "objects. Python `list` is not supported and you should use `tuple` instead."
            )
        leaves, self._treespec = nest.flatten(structure)
        for leaf in leaves:
            if not isinstance(leaf, Dataset):
                raise TypeError(
                    f"Invalid input to `zip`. Inputs are expected to be (nested) structures of "
                    f"`td.data.Dataset` objects. Got a {type(leaf).__name__}: {_preview(leaf)}."
                )
        self._inputs = tuple(leaves)

    def _iterate(self, state: State) -> Iterator[Any]:
        iterators = [state.input(k) for k in range(len(self._inputs))]
        unflatten = self._treespec.unflatten
        try:
            while True:
                try:
                    values = [next(it) for it in iterators]
                except StopIteration:
                    return
                yield unflatten(values)
        finally:
            for it in iterators:
                it.close()

    def _spec(self, probe: bool) -> ElementSpec:
        specs = [node._spec(probe) for node in self._inputs]
        if any(s is None for s in specs):
            return None
        return self._treespec.unflatten(specs)

    def _cardinality(self) -> int:
        # TensorFlow's rule: any UNKNOWN input makes the zip UNKNOWN (even beside an empty one);
        # otherwise the shortest finite input, or INFINITE.
        counts = [node._cardinality() for node in self._inputs]
        if options_lib.UNKNOWN in counts:
            return options_lib.UNKNOWN
        finite = [c for c in counts if c >= 0]
        return min(finite) if finite else options_lib.INFINITE

    def _gather_plan(self) -> GatherPlan | None:
        return None


# --- counter and random ------------------------------------------------------------------------


def _scalar_of(value: Number, dtype: np.dtype[Any], name: str) -> np.generic:
    """``value`` as a numpy scalar of ``dtype``; TypeError where it does not convert exactly."""
    problem = None
    if dtype == np.object_ or dtype.kind not in "iuf":
        problem = f"dtype {dtype_name(dtype)} is not a number type"
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        problem = f"{name} is not a number"
    elif dtype.kind in "iu" and isinstance(value, (float, np.floating)) and not float(value).is_integer():
        problem = f"{name} is not a whole number"
    elif dtype.kind in "iu" and not np.iinfo(dtype).min <= int(value) <= np.iinfo(dtype).max:
        problem = f"{name} does not fit in {dtype_name(dtype)}"
    if problem is not None:
        raise unworded(TypeError(f"cannot convert {name}={value!r} to dtype {dtype_name(dtype)}: {problem}."))
    scalar: np.generic = dtype.type(int(value) if dtype.kind in "iu" else value)
    return scalar


class CounterDataset(Dataset):
    def __init__(self, start: Number, step: Number, dtype: DTypeLike) -> None:
        self._dtype = np.dtype(dtype)
        self._start = _scalar_of(start, self._dtype, "start")
        self._step = _scalar_of(step, self._dtype, "step")

    def _iterate(self, state: State) -> Iterator[Any]:
        if self._dtype.kind in "iu":
            # Python ints, wrapped into the dtype's range: TensorFlow's counter overflows silently.
            info = np.iinfo(self._dtype)
            span, low = int(info.max) - int(info.min) + 1, int(info.min)
            step, scalar = int(self._step), self._dtype.type
            if not state.resumed:
                state.value = int(self._start)
            while True:
                value = state.value
                state.value = (value + step - low) % span + low
                yield scalar(value)
        else:
            if not state.resumed:
                state.value = self._start
            with np.errstate(over="ignore"):
                while True:
                    value = state.value
                    state.value = self._dtype.type(value + self._step)
                    yield value

    def _spec(self, probe: bool) -> ElementSpec:
        return TensorSpec((), self._dtype)

    def _cardinality(self) -> int:
        return options_lib.INFINITE


class RandomDataset(Seeded, Dataset):
    """Uniform int64 values in ``[0, 2**32)`` from numpy's generator (not TensorFlow's stream)."""

    _CHUNK = 1024

    def __init__(self, seed: int | None, rerandomize_each_iteration: bool | None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"Dataset.random() takes an integer seed or None. Got seed={seed!r}.")
        self._init_seed(None if seed is None else int(seed) & (2**64 - 1))
        self._rerandomize = bool(rerandomize_each_iteration)

    def _iterate(self, state: State) -> Iterator[Any]:
        # The epoch is drawn as the pass is created (see cursor); the position is the random
        # generator, its current chunk of values and how many of them were taken.
        if not state.resumed:
            state.epoch = self._seeds.next_epoch() if self._rerandomize else 0
            state.rng = np.random.default_rng([self._seed, state.epoch])
            state.chunk, state.taken = np.empty(0, np.int64), 0
        return self._values(state)

    def _values(self, state: State) -> Iterator[Any]:
        while True:
            if state.taken == len(state.chunk):
                state.chunk, state.taken = state.rng.integers(0, 2**32, size=self._CHUNK, dtype=np.int64), 0
            value = state.chunk[state.taken]
            state.taken += 1
            yield value

    def _spec(self, probe: bool) -> ElementSpec:
        return TensorSpec((), np.int64)

    def _cardinality(self) -> int:
        return options_lib.INFINITE


def experimental_counter(start: Number = 0, step: Number = 1, dtype: DTypeLike = np.int64) -> Dataset:
    """``start, start + step, ...`` forever (``tf.data.experimental.Counter``; see ``Dataset.counter``)."""
    with worded_at("Dataset.counter()"):
        return CounterDataset(start, step, dtype)


def zip_datasets(args: tuple[Nest, ...], datasets: Nest) -> Dataset:
    """``Dataset.zip(*args, datasets=datasets)``: ``zip(a, b)``, ``zip((a, b))`` or ``zip(datasets={"x": a})``."""
    if datasets is not None:
        if args:
            raise TypeError("zip() takes the datasets either positionally or as datasets=, not both.")
        structure = datasets
    else:
        if not args:
            raise TypeError("zip() needs at least one dataset.")
        structure = args[0] if len(args) == 1 else tuple(args)
    return ZipDataset(structure)
