"""Datasets of datasets: ``window``, ``group_by_window`` and ``bucket_by_sequence_length``.

``window`` cuts the input into windows, each a small dataset of consecutive elements
(a tuple or dict of datasets, one per component, for structured elements), the way
TensorFlow's ``window`` does; ``flat_map(lambda w: w.batch(size))`` turns them back into
arrays. ``group_by_window`` sorts elements into groups by an int64 key and hands each group's
window, once full, to a function that returns a dataset; groups still open at the end are
handed over in ascending key order. ``bucket_by_sequence_length`` is ``group_by_window`` with
the bucket of an element's length as the key and a padded batch as the function.

A window holds its elements in memory; it is a finite dataset of known cardinality, and a
value a saved iterator position can hold. A ``group_by_window`` pass saved in the middle
of a reduction calls ``reduce_func`` again on the saved key and window when it is restored,
and continues that dataset from its saved position.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np

from towerdist._src import nest
from towerdist._src.data import options as options_lib
from towerdist._src.data import state_codec
from towerdist._src.data.continuing import Raise, continuing
from towerdist._src.data.cursor import Cursor, Saved, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.padding import int_argument, pad_batch, padded_spec, plan_padding, up_to
from towerdist._src.data.saved_errors import restore_error, save_error
from towerdist._src.data.spec import DatasetSpec, ElementSpec, TensorSpec, dtype_name, structure_of, unknown_sizes
from towerdist._src.data.structure import call_with_element
from towerdist._src.data.transforms import stack_elements
from towerdist._src.errors import InternalError, InvalidArgumentError
from towerdist._src.failures import name_api, unworded, worded_at
from towerdist._src.type_aliases import Nest

__all__ = [
    "BucketBySequenceLengthDataset",
    "ElementsDataset",
    "GroupByWindowDataset",
    "WindowDataset",
]

INFINITE, UNKNOWN = options_lib.INFINITE, options_lib.UNKNOWN


class ElementsDataset(Dataset):
    """A finite dataset over elements held in memory (a window, a group, a list of datasets).

    A pass's position is the index of its next element. An ``ElementsDataset`` is itself a
    value a saved position can hold (registered with ``state_codec``): a window buffered by
    another operation (a ``flat_map`` input, a shuffle buffer of windows) is saved with its
    elements and spec.
    """

    def __init__(self, elements: Sequence[Nest], spec: ElementSpec) -> None:
        self._elements = list(elements)
        self._element_spec = spec

    def _iterate(self, state: State) -> Iterator[Any]:
        # The elements come from a C list iterator (no Python step per element); _save_state
        # reads how far it got.
        start = state.position if state.resumed else 0
        state.position = start
        state._rest = rest = iter(self._elements[start:] if start else self._elements)
        return rest

    def _save_state(self, state: State) -> Saved:
        state.position = len(self._elements) - operator.length_hint(state._rest)
        return super()._save_state(state)

    def _spec(self, probe: bool) -> ElementSpec:
        return self._element_spec

    def _cardinality(self) -> int:
        return len(self._elements)


state_codec.register(
    "elements_dataset",
    ElementsDataset,
    lambda dataset: [dataset._elements, dataset._element_spec],
    lambda tree: ElementsDataset(tree[0], tree[1]),
)


# --- window ----------------------------------------------------------------------------------


class WindowDataset(Dataset):
    def __init__(self, input_dataset: Dataset, size: int, shift: int | None, stride: int, drop_remainder: bool) -> None:
        self._inputs = (input_dataset,)
        self._size = int_argument(size, "size")
        self._shift = self._size if shift is None else int_argument(shift, "shift")
        self._stride = int_argument(stride, "stride")
        for name, value in (("size", self._size), ("shift", self._shift), ("stride", self._stride)):
            if value <= 0:
                raise unworded(InvalidArgumentError(f"window {name} must be greater than zero. Got {name}={value}."))
        self._drop = bool(drop_remainder)

    @property
    def _span(self) -> int:
        """How many input elements a full window covers, from its first to its last."""
        return (self._size - 1) * self._stride + 1

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: ``buffer``, the elements read from the start of the next window on;
        # ``skip``, how many input elements to pass over before the next window starts (when
        # ``shift`` is larger than a window's span); ``ended``, whether the input has ended
        # (then the last, partial windows are being handed out); ``error``, the input's error,
        # saved, when it ended the input (it comes out after those windows).
        #
        # An input error ends the input: the partial windows of the elements read before it
        # come first (unless ``drop_remainder``), then the error, and the pass ends. TensorFlow
        # drops the window being filled (DESIGN §10.23: towerdist loses no element read).
        if not state.resumed:
            state.buffer, state.skip, state.ended, state.error = [], 0, False, None
        return self._windows(state)

    def _windows(self, state: State) -> Iterator[Any]:
        static = self._inputs[0]._spec(probe=False)
        span, shift, stride = self._span, self._shift, self._stride
        buffer = state.buffer
        failed: BaseException | None = None  # the input's error (state.error is its saved form)
        if not state.ended:
            source = state.input()
            skip = state.skip
            try:
                for element in source:
                    if skip:
                        skip -= 1
                        continue
                    buffer.append(element)
                    if len(buffer) == span:  # the window is complete
                        window = self._window(buffer[::stride], static)
                        del buffer[:shift]
                        skip = state.skip = max(shift - span, 0)
                        yield window
            except Exception as error:
                if not buffer or self._drop:
                    raise
                failed, state.error = error, save_error(error)  # after the partial windows
            finally:
                source.close()
            state.ended = True
            state.drop("0")
        if not self._drop:
            while buffer:
                window = self._window(buffer[0:span:stride], static)
                del buffer[:shift]
                yield window
        if state.error is not None:
            raised = failed if failed is not None else restore_error(state.error)
            state.error = None
            raise raised

    def _state_params(self) -> dict[str, Any]:
        return {"size": self._size, "shift": self._shift, "stride": self._stride}

    def _window(self, elements: list[Nest], static: ElementSpec) -> Nest:
        spec = static if static is not None else unknown_sizes(structure_of(elements[0]))
        first = elements[0]
        if not nest.is_nested(first):
            return ElementsDataset(elements, spec)
        columns = list(zip(*(nest.flatten(e)[0] for e in elements), strict=True))
        specs, treespec = nest.flatten(spec)
        return treespec.unflatten([ElementsDataset(list(column), s) for column, s in zip(columns, specs, strict=True)])

    def _spec(self, probe: bool) -> ElementSpec:
        spec = self._inputs[0]._spec(probe)
        if spec is None:
            return None
        if self._inputs[0]._spec(probe=False) is None:
            spec = unknown_sizes(spec)
        return nest.map_structure(DatasetSpec, spec)

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        if not self._drop:
            return -(-n // self._shift)
        return 0 if n < self._span else (n - self._span) // self._shift + 1


# --- group_by_window -------------------------------------------------------------------------


def _int64_scalar(value: object, what: str) -> int:
    """An int64 scalar result of a user function (a Python int converts, as in TensorFlow)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic)) else None
    if array is None or array.ndim != 0 or array.dtype != np.int64:
        got = f"a {type(value).__name__}" if array is None else f"{dtype_name(array.dtype)} of shape {array.shape}"
        raise unworded(
            ValueError(
                f"{what} must return a single int64 scalar, but it returned {got} ({value!r}). Cast it with "
                f"np.int64(...)."
            )
        )
    return int(array)


class _Grouping(Dataset):
    """Sorts elements into windows by key; a full window, and at the end every open one, is reduced.

    Subclasses say how an element's key is found, how large a key's window is, and what a
    window becomes.
    """

    _api: str

    def _key(self, element: Nest) -> int:
        raise NotImplementedError

    def _size_for(self, key: int) -> int:
        raise NotImplementedError

    def _reduce(self, state: State, key: int, elements: list[Nest], spec: ElementSpec) -> Iterator[Any]:
        """What the window ``elements`` of ``key`` becomes (a reduction that outlives one element
        keeps its position in ``state``, as any pass does)."""
        raise NotImplementedError

    def _rest_of_reduction(self, state: State) -> Iterator[Any]:
        """The rest of the reduction a restored pass was saved in (``state.reducing`` is set)."""
        raise NotImplementedError

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: ``windows`` and ``sizes``, each open window and its size by key;
        # ``ended``, whether the input has ended (then the open windows are reduced, in
        # ascending key order); ``reducing``, the key and window whose reduction is being
        # iterated, if it yields more than one element (group_by_window's dataset).
        #
        # An error of the input or of the key (the element it stands for is lost) comes out
        # where it happened and the pass goes on, as in TensorFlow: the windows open then are
        # kept, and reduced when they fill up or when the input ends.
        if not state.resumed:
            state.windows, state.sizes, state.ended, state.reducing = {}, {}, False, None
        return continuing(self._grouped(state), state)

    def _grouped(self, state: State) -> Generator[Any, None, None]:
        static = self._inputs[0]._spec(probe=False)
        windows: dict[int, list[Any]] = state.windows
        sizes: dict[int, int] = state.sizes
        try:
            if state.reducing is not None:
                yield from self._rest_of_reduction(state)
            if not state.ended:
                source = state.input()
                try:
                    while True:
                        try:
                            element = next(source)
                            key = self._key(element)
                            if key not in windows:
                                size = self._size_for(key)
                                if size <= 0:
                                    raise unworded(
                                        InvalidArgumentError(
                                            f"window size must be greater than zero, but got {size} for key {key}."
                                        )
                                    )
                                sizes[key], windows[key] = size, []
                        except StopIteration:
                            break
                        except Exception as error:  # the open windows are kept: the pass goes on after it
                            name_api(error, self._api)
                            yield Raise(error)
                            continue
                        window = windows[key]
                        window.append(element)
                        if len(window) == sizes[key]:
                            del windows[key], sizes[key]
                            yield from self._reduce(state, key, window, _window_spec(static, window))
                finally:
                    source.close()
                state.ended = True
                state.drop("0")
            while windows:  # windows still open at the end, in ascending key order
                key = min(windows)
                window = windows.pop(key)
                del sizes[key]
                yield from self._reduce(state, key, window, _window_spec(static, window))
        except BaseException as error:
            name_api(error, self._api)
            raise

    def _cardinality(self) -> int:
        return INFINITE if self._inputs[0]._cardinality() == INFINITE else UNKNOWN


def _window_spec(static: ElementSpec, window: list[Nest]) -> ElementSpec:
    """The element spec of a window: the input's, or (unknown statically) the ranks and dtypes of its elements."""
    return static if static is not None else unknown_sizes(structure_of(window[0]))


class GroupByWindowDataset(_Grouping):
    def __init__(
        self,
        input_dataset: Dataset,
        key_func: Callable[..., Any],
        reduce_func: Callable[[Any, Dataset], Any],
        window_size: int | None,
        window_size_func: Callable[[Any], Any] | None,
    ) -> None:
        self._api = "Dataset.group_by_window()"
        if (window_size is None) == (window_size_func is None):
            raise unworded(
                ValueError(
                    f"takes exactly one of window_size and window_size_func. Got window_size={window_size!r}, "
                    f"window_size_func={window_size_func!r}."
                )
            )
        for name, fn in (("key_func", key_func), ("reduce_func", reduce_func), ("window_size_func", window_size_func)):
            if fn is not None and not callable(fn):
                raise unworded(TypeError(f"takes a callable {name}. Got {name}={fn!r}."))
        self._inputs = (input_dataset,)
        self._key_func = key_func
        self._reduce_func = reduce_func
        self._window_size = None if window_size is None else int_argument(window_size, "window_size")
        self._window_size_func = window_size_func

    def _key(self, element: Nest) -> int:
        return _int64_scalar(call_with_element(self._key_func, element), "key_func")

    def _size_for(self, key: int) -> int:
        if self._window_size_func is None:
            return self._window_size  # type: ignore[return-value]  # set when the function is not (__init__)
        return _int64_scalar(self._window_size_func(np.int64(key)), "window_size_func")

    def _reduce(self, state: State, key: int, elements: list[Nest], spec: ElementSpec) -> Iterator[Any]:
        state.reducing = (key, elements)
        return self._drain(state, state.open(self._reduction(key, elements, spec), "reduce"))

    def _rest_of_reduction(self, state: State) -> Iterator[Any]:
        restored = state.child("reduce")
        if restored is None:
            raise InternalError(f"{self._api}: a restored pass lacks the reduce_func dataset it was saved in.")
        return self._drain(state, state.open(restored.node, "reduce"))

    def _restored_input(self, key: str, state: State) -> Dataset:
        if key != "reduce":
            return super()._restored_input(key, state)
        # reduce_func makes the dataset again, from the saved key and window; the dataset's
        # saved position is then restored into it.
        group, elements = state.reducing
        with worded_at(self._api):
            return self._reduction(group, elements, _window_spec(self._inputs[0]._spec(probe=False), elements))

    def _drain(self, state: State, source: Cursor) -> Iterator[Any]:
        try:
            yield from source
        finally:
            source.close()
        state.reducing = None
        state.drop("reduce")

    def _reduction(self, key: int, elements: list[Nest], spec: ElementSpec) -> Dataset:
        """The dataset ``reduce_func`` makes of the window ``elements`` of ``key``."""
        result = self._reduce_func(np.int64(key), ElementsDataset(elements, spec))
        if not isinstance(result, Dataset):
            raise unworded(
                TypeError(
                    f"reduce_func must return a single td.data.Dataset, but it returned a "
                    f"{type(result).__name__} for key {key}."
                )
            )
        return result

    def _state_params(self) -> dict[str, Any]:
        return {} if self._window_size is None else {"window_size": self._window_size}

    def _spec(self, probe: bool) -> ElementSpec:
        spec = self._inputs[0]._spec(probe=False)
        if spec is not None:
            # TensorFlow learns the result spec by tracing reduce_func on a symbolic window;
            # here reduce_func builds its pipeline over an empty window of the input's spec.
            try:
                result = self._reduce_func(np.int64(0), ElementsDataset([], spec))
            except Exception:  # noqa: BLE001 - user code; iterating reports its errors with context
                result = None
            if isinstance(result, Dataset):
                known = result._spec(probe=False)
                if known is not None:
                    return known
        if not probe:
            return None
        return unknown_sizes(self._probe_spec())


# --- bucket_by_sequence_length ---------------------------------------------------------------


def _length_of(value: object) -> int:
    """The int32 length an element_length_func returned (a Python int converts to int32)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(2**31) <= value < 2**31:
            raise unworded(TypeError(f"element_length_func returned {value}, which does not fit in int32."))
        return value
    array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic)) else None
    if array is None or array.dtype != np.int32:
        got = f"a {type(value).__name__}" if array is None else dtype_name(array.dtype)
        raise unworded(
            TypeError(
                f"element_length_func must return an int32 length (as TensorFlow requires), but it returned "
                f"{got}: {value!r}. Cast it with np.int32(...)."
            )
        )
    if array.size != 1 or array.ndim > 1:
        raise unworded(
            ValueError(f"element_length_func must return a scalar length, but it returned shape {array.shape}.")
        )
    return int(array.reshape(-1)[0])


class BucketBySequenceLengthDataset(_Grouping):
    def __init__(
        self,
        input_dataset: Dataset,
        element_length_func: Callable[..., Any],
        bucket_boundaries: Sequence[Any],
        bucket_batch_sizes: Sequence[Any],
        padded_shapes: Nest,
        padding_values: Nest,
        pad_to_bucket_boundary: bool,
        no_padding: bool,
        drop_remainder: bool,
    ) -> None:
        self._api = "Dataset.bucket_by_sequence_length()"
        if not callable(element_length_func):
            raise unworded(TypeError(f"takes a callable element_length_func. Got {element_length_func!r}."))
        self._boundaries = [int_argument(b, "bucket_boundaries") for b in bucket_boundaries]
        self._batch_sizes = [int_argument(b, "bucket_batch_sizes") for b in bucket_batch_sizes]
        if len(self._batch_sizes) != len(self._boundaries) + 1:
            raise unworded(
                ValueError(
                    f"needs one more batch size than boundaries (len(bucket_batch_sizes) == "
                    f"len(bucket_boundaries) + 1), but len(bucket_batch_sizes)={len(self._batch_sizes)} and "
                    f"len(bucket_boundaries)={len(self._boundaries)}."
                )
            )
        self._inputs = (input_dataset,)
        self._length_func = element_length_func
        self._padded_shapes = padded_shapes
        self._padding_values = padding_values
        self._pad_to_boundary = bool(pad_to_bucket_boundary)
        self._no_padding = bool(no_padding)
        self._drop = bool(drop_remainder)
        spec = input_dataset._spec(probe=False)
        if spec is not None and not self._no_padding:
            plan_padding(spec, padded_shapes, padding_values)  # bad arguments fail now, as in TensorFlow

    def _key(self, element: Nest) -> int:
        length = _length_of(call_with_element(self._length_func, element))
        # TensorFlow's rule: the first bucket i with lower[i] <= length < upper[i], the lower
        # bounds being (-inf, *boundaries) and the upper ones (*boundaries, +inf). For sorted
        # boundaries that is a bisection; unsorted ones are searched in order.
        boundaries = self._boundaries
        if boundaries == sorted(boundaries):
            return bisect.bisect_right(boundaries, length)
        lows: list[int | None] = [None, *boundaries]
        highs: list[int | None] = [*boundaries, None]
        for bucket, (low, high) in enumerate(zip(lows, highs, strict=True)):
            if (low is None or low <= length) and (high is None or length < high):
                return bucket
        return len(boundaries)  # not reached: the bucket after the largest boundary holds every larger length

    def _size_for(self, key: int) -> int:
        return self._batch_sizes[key]

    def _state_params(self) -> dict[str, Any]:
        return {"bucket_boundaries": self._boundaries, "bucket_batch_sizes": self._batch_sizes}

    def _reduce(self, state: State, key: int, elements: list[Nest], spec: ElementSpec) -> Iterator[Any]:
        filler = None
        if self._pad_to_boundary and not self._no_padding:
            if key >= len(self._boundaries):
                if not self._boundaries:
                    raise unworded(
                        InternalError(
                            f"with pad_to_bucket_boundary=True needs bucket boundaries to pad to, but "
                            f"bucket_boundaries is empty, so the {len(elements)} element(s) of its only bucket have no "
                            f"boundary. Add a boundary above the longest length, or set pad_to_bucket_boundary=False."
                        )
                    )
                raise unworded(
                    InternalError(
                        f"with pad_to_bucket_boundary=True needs every element length < "
                        f"max(bucket_boundaries) (boundaries {self._boundaries}), but {len(elements)} element(s) had a "
                        f"length >= {max(self._boundaries)}. Add a boundary above the longest length."
                    )
                )
            filler = self._boundaries[key] - 1
        if self._drop and len(elements) < self._batch_sizes[key]:
            return
        if self._no_padding:
            yield stack_elements(elements)
            return
        plans, treespec = plan_padding(spec, self._shapes_for(spec, filler), self._padding_values)
        yield pad_batch(elements, plans, treespec)

    def _shapes_for(self, spec: ElementSpec, filler: int | None) -> Nest:
        """The padded shapes of one bucket: with pad_to_bucket_boundary, unknown sizes become ``filler``."""
        if filler is None:
            return self._padded_shapes
        specs, treespec = nest.flatten(spec)
        if self._padded_shapes is None:
            entries: list[Any] = [None if s.shape is None else list(s.shape) for s in specs]
        else:
            entries = up_to(treespec, self._padded_shapes, "padded_shapes")
        filled: list[Any] = []
        for entry in entries:
            if entry is None:
                filled.append(None)  # an unknown rank: plan_padding says so
                continue
            if isinstance(entry, (int, np.integer)):
                entry = [entry]
            if hasattr(entry, "as_list"):
                entry = entry.as_list()
            filled.append([filler if d is None or d == -1 else d for d in entry])
        return treespec.unflatten(filled)

    def _spec(self, probe: bool) -> ElementSpec:
        static = self._inputs[0]._spec(probe=False)
        spec = static if static is not None else self._inputs[0]._spec(probe)
        if spec is None:
            return None
        if static is None:
            spec = unknown_sizes(spec)
        specs, treespec = nest.flatten(spec)
        if self._no_padding:
            return treespec.unflatten([TensorSpec((None, *(s.shape or ())), s.dtype) for s in specs])
        with worded_at(self._api):
            plans, _ = plan_padding(spec, self._padded_shapes, self._padding_values)
        return treespec.unflatten(padded_spec(plans, specs, None))


def experimental_group_by_window(
    key_func: Callable[..., Any],
    reduce_func: Callable[[Any, Dataset], Dataset],
    window_size: int | None = None,
    window_size_func: Callable[[Any], Any] | None = None,
) -> Callable[[Dataset], Dataset]:
    """``tf.data.experimental.group_by_window``: a transformation for ``Dataset.apply``.

    ``dataset.apply(group_by_window(...))`` is ``dataset.group_by_window(...)``.
    """
    with worded_at("Dataset.group_by_window()"):
        GroupByWindowDataset(_ArgumentCheck(), key_func, reduce_func, window_size, window_size_func)  # fail now
    return lambda dataset: dataset.group_by_window(key_func, reduce_func, window_size, window_size_func)


def experimental_bucket_by_sequence_length(
    element_length_func: Callable[..., Any],
    bucket_boundaries: Sequence[Any],
    bucket_batch_sizes: Sequence[Any],
    padded_shapes: Nest = None,
    padding_values: Nest = None,
    pad_to_bucket_boundary: bool = False,
    no_padding: bool = False,
    drop_remainder: bool = False,
) -> Callable[[Dataset], Dataset]:
    """``tf.data.experimental.bucket_by_sequence_length``: a transformation for ``Dataset.apply``.

    ``dataset.apply(bucket_by_sequence_length(...))`` is ``dataset.bucket_by_sequence_length(...)``.
    """
    arguments = (
        element_length_func,
        list(bucket_boundaries),
        list(bucket_batch_sizes),
        padded_shapes,
        padding_values,
        pad_to_bucket_boundary,
        no_padding,
        drop_remainder,
    )
    with worded_at("Dataset.bucket_by_sequence_length()"):
        BucketBySequenceLengthDataset(_ArgumentCheck(), *arguments)  # fail now on bad arguments
    return lambda dataset: dataset.bucket_by_sequence_length(*arguments)


class _ArgumentCheck(Dataset):
    """A stand-in input of unknown spec, to check a transformation's arguments before it is applied."""

    def _spec(self, probe: bool) -> ElementSpec:
        return None
