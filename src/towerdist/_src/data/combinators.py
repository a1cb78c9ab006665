"""Datasets that combine, fold or filter elements, and the infinite ``counter``/``random`` sources.

``concatenate``, ``scan``, ``unique``, ``take_while``, ``ignore_errors``, ``Dataset.counter``,
``Dataset.random``, ``get_single_element``, and the ``td.data.experimental`` functions that
return them as transformations for ``Dataset.apply``.

``ignore_errors`` drops the elements whose production raised. TensorFlow's iterators go on
after an error; a Python generator cannot, so ``ignore_errors`` iterates a copy of its input
pipeline in which the operations that run user code per element (``map``, ``filter``,
``scan``, ``take_while``, ``interleave``/``flat_map`` and the datasets their ``map_func``
makes) skip a failing element instead of raising. An error from any other operation (a
generator, a file reader, a ``batch`` of unequal shapes) ends the pass, with a warning.
"""

from __future__ import annotations

import copy
import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from towerdist._src import nest
from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.node import ErrorHandler, tolerant
from towerdist._src.data.spec import (
    ElementSpec,
    FirstElementCheck,
    common_spec,
    dtype_name,
    mixing_mismatch,
    structure_of,
)
from towerdist._src.data.structure import (
    call_with_element,
    close_iterator,
    normalize_output,
    sample_element,
    to_element,
)
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import unworded, worded_at
from towerdist._src.type_aliases import Nest

__all__ = [
    "ConcatenateDataset",
    "IgnoreErrorsDataset",
    "ScanDataset",
    "TakeWhileDataset",
    "UniqueDataset",
    "apply",
    "experimental_get_single_element",
    "experimental_ignore_errors",
    "experimental_scan",
    "experimental_take_while",
    "experimental_unique",
    "get_single_element",
]

INFINITE, UNKNOWN = options_lib.INFINITE, options_lib.UNKNOWN

logger = logging.getLogger("towerdist")


def _check_dataset(value: object, name: str) -> Dataset:
    if not isinstance(value, Dataset):
        raise unworded(TypeError(f"takes a td.data.Dataset as {name}. Got {name}={_preview(value)} ({type(value)})."))
    return value


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- concatenate -------------------------------------------------------------------------------


def _concatenated_spec(first: ElementSpec, second: ElementSpec) -> ElementSpec:
    """The element spec of ``first`` followed by ``second``; TypeError where they cannot mix."""
    mismatch = mixing_mismatch(first, second)
    if mismatch:
        raise TypeError(
            f"Dataset.concatenate() needs elements of the same structure and dtypes. Incompatible dataset elements "
            f"{mismatch}. Got {first!r} vs. {second!r}; cast or restructure one dataset with map() first."
        )
    return common_spec([first, second])


_NOTHING = object()


def _concatenate_mismatch(a: int, spec_a: ElementSpec, b: int, spec_b: ElementSpec, where: str) -> str:
    names = ("the dataset", "the dataset passed to concatenate()")
    return (
        f"Dataset.concatenate() needs elements of the same structure and dtypes. Incompatible dataset elements "
        f"{where}: {names[a]} gives {spec_a!r}, {names[b]} {spec_b!r}; cast or restructure one dataset with map() "
        f"first."
    )


class ConcatenateDataset(Dataset):
    def __init__(self, input_dataset: Dataset, dataset: object) -> None:
        other = _check_dataset(dataset, "dataset")
        self._inputs = (input_dataset, other)
        first, second = input_dataset._spec(probe=False), other._spec(probe=False)
        if first is not None and second is not None:
            _concatenated_spec(first, second)  # TensorFlow checks at construction

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the input being read (``current``, its pass the child under its index),
        # whether its first element was checked, and the spec the first input's first element
        # showed (the reference the second input's first element is checked against).
        if not state.resumed:
            state.current, state.checked, state.reference = 0, False, None
        specs = [node._spec(probe=False) for node in self._inputs]
        check = None
        if None in specs:  # a spec known only by running its input: check the first elements
            check = FirstElementCheck(_concatenate_mismatch)
            for key, spec in enumerate(specs):
                check.known(key, spec)
            if state.reference is not None:
                check.spec(0, state.reference)
        while state.current < len(self._inputs):
            key = state.current
            source = state.input(key)
            try:
                if check is not None and specs[key] is None and not state.checked:
                    first = next(source, _NOTHING)
                    if first is not _NOTHING:
                        check.first(key, first)
                        state.checked = True
                        if key == 0:
                            state.reference = structure_of(first)
                        yield first
                yield from source
            finally:
                source.close()
            state.drop(str(key))  # that input's pass is over: nothing of it is saved any more
            state.current, state.checked = key + 1, False

    def _spec(self, probe: bool) -> ElementSpec:
        first, second = (node._spec(probe) for node in self._inputs)
        if first is None or second is None:
            return None
        return _concatenated_spec(first, second)

    def _cardinality(self) -> int:
        counts = [node._cardinality() for node in self._inputs]
        if INFINITE in counts:
            return INFINITE
        if UNKNOWN in counts:
            return UNKNOWN
        return sum(counts)

    def _batch_size(self) -> int | None:

        sizes = {node._batch_size() for node in self._inputs}
        return sizes.pop() if len(sizes) == 1 else None


# --- scan --------------------------------------------------------------------------------------


class ScanDataset(Dataset):
    _op = "scan"

    def __init__(self, input_dataset: Dataset, initial_state: Nest, scan_func: Callable[..., Any]) -> None:
        if not callable(scan_func):
            raise TypeError(f"Dataset.scan() takes a callable scan_func. Got scan_func={scan_func!r}.")
        self._inputs = (input_dataset,)
        self._initial = to_element(initial_state)
        self._state_spec = structure_of(self._initial)
        self._fn = scan_func
        self._on_error: ErrorHandler | None = None

    def _step(self, state: Nest, element: Nest, index: int) -> tuple[Nest, Nest]:
        try:
            result = self._fn(state, element)  # a tuple element is ONE argument here, as in TensorFlow
        except Exception as error:
            self._note_failed_element(error, index)
            raise
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            shown = structure_of(normalize_output(result)) if not isinstance(result, Dataset) else result
            raise TypeError(
                f"Invalid `scan_func`. `scan_func` should return a pair consisting of new state and the output "
                f"value but its return type is {shown!r} (element {index})."
            )
        new_state, output = to_element(result[0]), normalize_output(result[1])
        mismatch = nest.explain_mismatch(self._state_spec, structure_of(new_state))
        if mismatch:
            raise TypeError(
                f"Invalid `scan_func`. The new state must have the structure of the initial state; "
                f"{mismatch} (element {index})."
            )
        paths, expected, _ = nest.flatten_with_paths(self._state_spec)
        got, _ = nest.flatten(structure_of(new_state))
        for path, want, have in zip(paths, expected, got, strict=True):
            if want.dtype != have.dtype:
                raise TypeError(
                    f"Invalid `scan_func`. The element types for the new state must match the initial state. "
                    f"Expected {dtype_name(want.dtype)}, got {dtype_name(have.dtype)} at {nest.format_path(path)} "
                    f"(element {index}); cast the new state, or give initial_state that dtype."
                )
        return new_state, output

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the carried state (``carry``) and the index of the next input element.
        if not state.resumed:
            state.carry, state.index = self._initial, 0
        source = state.input()
        try:
            for element in source:
                index = state.index
                state.index = index + 1
                try:
                    state.carry, output = self._step(state.carry, element, index)
                except Exception as error:
                    if self._on_error is None:
                        raise
                    self._on_error(error)  # the state stays as it was, as in TensorFlow
                    continue
                yield output
        finally:
            source.close()

    def _spec(self, probe: bool) -> ElementSpec:
        if not probe:
            return None
        element = sample_element(self._inputs[0], "scan")
        state, output = self._step(self._initial, element, 0)
        spec = structure_of(output)
        # TensorFlow traces scan_func with the initial state's spec; where the new state's shape
        # differs, it relaxes the differing dimensions (or the rank) to unknown and traces again,
        # so every output dimension that follows the state becomes unknown. numpy has no symbolic
        # shapes: a second step, from the new state on the same element, shows which output
        # dimensions follow the state (or its values), and those are relaxed the same way.
        try:
            _, again = self._step(state, element, 0)
        except Exception:  # noqa: BLE001 - a probe only: the pass itself reports the function's errors
            return spec
        again_spec = structure_of(again)
        return spec if nest.explain_mismatch(spec, again_spec) else common_spec([spec, again_spec])

    def _tolerant(self) -> Dataset | None:
        return copy.copy(self)

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()


# --- unique ------------------------------------------------------------------------------------

_UNIQUE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.object_))


def _check_unique_spec(spec: ElementSpec) -> None:
    leaves, _ = nest.flatten(spec)
    if len(leaves) != 1:
        raise InvalidArgumentError(
            f"Dataset.unique() only supports inputs with a single component. Got an element spec of "
            f"{len(leaves)} components: {spec!r}; apply unique() to one component, e.g. after map()."
        )
    if leaves[0].dtype not in _UNIQUE_DTYPES:
        raise TypeError(
            f"Dataset.unique() does not support type {dtype_name(leaves[0].dtype)} -- only int32, int64 and "
            f"string are supported. Got {leaves[0]!r}; cast with map() first."
        )


def _key(element: Nest) -> bytes | tuple[tuple[int, ...], tuple[object, ...] | bytes]:
    leaves, _ = nest.flatten(element)
    value = leaves[0]
    if isinstance(value, bytes):
        return value
    array = np.asarray(value)
    if array.dtype == np.object_:
        return (array.shape, tuple(array.reshape(-1).tolist()))
    return (array.shape, array.tobytes())


class UniqueDataset(Dataset):
    def __init__(self, input_dataset: Dataset) -> None:
        self._inputs = (input_dataset,)
        spec = input_dataset._spec(probe=False)
        if spec is not None:
            _check_unique_spec(spec)

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the keys of the elements given out so far (``seen``, a set shared with
        # the state and grown in place).
        if not state.resumed:
            state.seen = set()
        seen = state.seen
        checked = self._inputs[0]._spec(probe=False) is not None
        source = state.input()
        try:
            for element in source:
                if not checked:
                    _check_unique_spec(structure_of(element))
                    checked = True
                key = _key(element)
                if key not in seen:
                    seen.add(key)
                    yield element
        finally:
            source.close()

    def _cardinality(self) -> int:
        return UNKNOWN


# --- take_while --------------------------------------------------------------------------------


def _is_bool_scalar(value: object) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return True
    return getattr(value, "dtype", None) == np.bool_ and getattr(value, "ndim", None) == 0


class TakeWhileDataset(Dataset):
    _op = "take_while"

    def __init__(self, input_dataset: Dataset, predicate: Callable[..., Any]) -> None:
        if not callable(predicate):
            raise TypeError(f"Dataset.take_while() takes a callable predicate. Got predicate={predicate!r}.")
        self._inputs = (input_dataset,)
        self._predicate = predicate
        self._on_error: ErrorHandler | None = None

    def _keep(self, element: Nest, index: int) -> bool:
        try:
            keep = call_with_element(self._predicate, element)
        except Exception as error:
            self._note_failed_element(error, index)
            raise
        if not _is_bool_scalar(keep):
            raise ValueError(
                f"Invalid `predicate`. `predicate` must return a `tf.bool` scalar tensor but its return type is "
                f"{structure_of(normalize_output(keep))!r} (element {index}); return a comparison such as x < 5."
            )
        return bool(keep)

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the index of the next input element, and whether the predicate has
        # ended the pass (``done``: the input goes on, but this pass must not read it again).
        if not state.resumed:
            state.index, state.done = 0, False
        if state.done:
            return
        source = state.input()
        try:
            for element in source:
                index = state.index
                state.index = index + 1
                try:
                    keep = self._keep(element, index)
                except Exception as error:
                    if self._on_error is None:
                        raise
                    self._on_error(error)
                    continue
                if not keep:
                    state.done = True
                    state.drop("0")
                    return
                yield element
        finally:
            source.close()

    def _tolerant(self) -> Dataset | None:
        return copy.copy(self)

    def _cardinality(self) -> int:
        return UNKNOWN  # as in TensorFlow, even for an infinite input

    def _batch_size(self) -> int | None:
        return self._inputs[0]._batch_size()


# --- ignore_errors -----------------------------------------------------------------------------


class IgnoreErrorsDataset(Dataset):
    def __init__(self, input_dataset: Dataset, log_warning: bool) -> None:
        self._inputs = (input_dataset,)
        self._log = bool(log_warning)
        self._tolerant_input: Dataset | None = None  # made once, so that a cache() in it persists
        self._lock = threading.Lock()

    def _clone(self, inputs: tuple[Dataset, ...]) -> Dataset:
        clone = super()._clone(inputs)
        assert isinstance(clone, IgnoreErrorsDataset)
        clone._tolerant_input, clone._lock = None, threading.Lock()
        return clone

    def _report(self, error: BaseException) -> None:
        if self._log:
            logger.warning("Dataset.ignore_errors() dropped an element. Error raised with error message: %s", error)

    def _tolerant_pipeline(self) -> Dataset:
        """The copy of the input that drops failing elements (made once, so that a cache() in it persists)."""
        with self._lock:
            if self._tolerant_input is None:
                self._tolerant_input = tolerant(self._inputs[0], self._report)
            return self._tolerant_input

    def _restored_input(self, key: str, state: State) -> Dataset:
        return self._tolerant_pipeline()  # the only child: the pass over the tolerant copy

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the pass over the tolerant copy of the input (the child "0"), and
        # whether an error it could not skip ended the pass (``ended``).
        if not state.resumed:
            state.ended = False
        if state.ended:
            return
        source = state.open(self._tolerant_pipeline(), "0")
        try:
            while True:
                try:
                    element = next(source)
                except StopIteration:
                    return
                except Exception as error:
                    state.ended = True
                    state.drop("0")  # a pass that raised cannot go on, restored or not
                    self._report(error)
                    warnings.warn(
                        f"Dataset.ignore_errors() ended the pass early: {type(error).__name__}: {error}. The "
                        f"operation that raised it cannot go on after an error (only map, filter, scan, "
                        f"take_while and interleave/flat_map can skip a failing element).",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    return
                yield element
        finally:
            source.close()

    def _cardinality(self) -> int:
        return UNKNOWN  # as in TensorFlow, even when nothing fails

    def _batch_size(self) -> int | None:
        return self._inputs[0]._batch_size()


# --- whole-dataset helpers and td.data.experimental ------------------------------------------


def get_single_element(dataset: Dataset) -> Nest:
    """The only element of ``dataset``; InvalidArgumentError for none or more than one."""
    iterator = dataset._cursor()
    try:
        first = next(iterator, _NOTHING)
        if first is _NOTHING:
            raise InvalidArgumentError(
                "Dataset.get_single_element() needs a dataset of exactly one element, but the dataset was empty."
            )
        if next(iterator, _NOTHING) is not _NOTHING:
            raise InvalidArgumentError(
                "Dataset.get_single_element() needs a dataset of exactly one element, but the dataset had more "
                "than one element; use take(1) first, or reduce()."
            )
        return first
    finally:
        close_iterator(iterator)


def apply(dataset: Dataset, transformation_func: Callable[[Dataset], Any]) -> Dataset:
    """``transformation_func(dataset)``, checked to be a dataset."""
    if not callable(transformation_func):
        raise TypeError(
            f"Dataset.apply() takes a callable transformation_func. Got transformation_func={transformation_func!r}."
        )
    result = transformation_func(dataset)
    if not isinstance(result, Dataset):
        raise TypeError(
            f"Dataset.apply(): `transformation_func` must return a `td.data.Dataset` object. Got {type(result)}."
        )
    return result


Transformation = Callable[[Dataset], Dataset]


def experimental_scan(initial_state: Nest, scan_func: Callable[..., Any]) -> Transformation:
    """A transformation for ``Dataset.apply`` that runs ``dataset.scan(initial_state, scan_func)``.

    (``tf.data.experimental.scan``; the method ``Dataset.scan`` is the same.)
    """
    return lambda dataset: dataset.scan(initial_state, scan_func)


def experimental_unique() -> Transformation:
    """A transformation for ``Dataset.apply`` that runs ``dataset.unique()`` (``tf.data.experimental.unique``)."""
    return lambda dataset: dataset.unique()


def experimental_take_while(predicate: Callable[..., Any]) -> Transformation:
    """A transformation for ``Dataset.apply`` that runs ``dataset.take_while(predicate)``."""
    return lambda dataset: dataset.take_while(predicate)


def experimental_ignore_errors(log_warning: bool = False) -> Transformation:
    """A transformation for ``Dataset.apply`` that runs ``dataset.ignore_errors(log_warning)``.

    Example:
      >>> table = np.array([10, 20, 30])
      >>> ds = td.data.Dataset.from_tensor_slices([0, 7, 2]).map(lambda i: table[i])  # 7 raises IndexError
      >>> [int(v) for v in ds.apply(td.data.experimental.ignore_errors())]
      [10, 30]
    """
    return lambda dataset: dataset.ignore_errors(log_warning)


def experimental_get_single_element(dataset: object) -> Nest:
    """The only element of ``dataset`` (``tf.data.experimental.get_single_element``).

    Raises:
      TypeError: ``dataset`` is not a ``td.data.Dataset``.
      InvalidArgumentError: the dataset has no element, or more than one.
    """
    with worded_at("td.data.experimental.get_single_element()"):
        return get_single_element(_check_dataset(dataset, "dataset"))
