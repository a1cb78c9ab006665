"""``map`` and ``filter``: transformations that run user functions, optionally on a thread pool."""

from __future__ import annotations

import collections
import copy
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np

from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import Saved, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.node import ErrorHandler
from towerdist._src.data.saved_errors import raise_saved_error, restore_error, save_error
from towerdist._src.data.spec import ElementSpec, EmptyDatasetError, relax_batch, structure_of
from towerdist._src.data.structure import call_with_element, close_iterator, normalize_output, placeholder_element
from towerdist._src.data.workers import DaemonPool, wait_or_warn
from towerdist._src.type_aliases import Nest

__all__ = ["FilterDataset", "MapDataset"]

_STOP_SECONDS = 10.0  # how long closing waits for map_func calls running in user code


def _workers(num_parallel_calls: int | None) -> int:
    if num_parallel_calls is None:
        return 0
    if isinstance(num_parallel_calls, bool) or not isinstance(num_parallel_calls, (int, np.integer)):
        raise TypeError(f"map() takes an integer num_parallel_calls or td.data.AUTOTUNE. Got {num_parallel_calls!r}.")
    if num_parallel_calls == options_lib.AUTOTUNE:
        return os.cpu_count() or 1
    if num_parallel_calls < 1:
        raise ValueError(
            f"map() num_parallel_calls must be positive or td.data.AUTOTUNE. Got num_parallel_calls={num_parallel_calls}."
        )
    return int(num_parallel_calls)


class MapDataset(Dataset):
    _op = "map"

    def __init__(
        self,
        input_dataset: Dataset,
        map_func: Callable[..., Any],
        num_parallel_calls: int | None,
        synchronous: bool | None = None,
    ) -> None:
        if synchronous and num_parallel_calls is not None:
            raise ValueError(
                f"Dataset.map(): `synchronous` is not supported with `num_parallel_calls`, but `num_parallel_calls` "
                f"was set to {num_parallel_calls!r}. Drop one of them."
            )
        if not callable(map_func):
            raise TypeError(f"map() takes a callable map_func. Got map_func={map_func!r}.")
        self._inputs = (input_dataset,)
        self._fn = map_func
        self._workers = _workers(num_parallel_calls)

    def _apply(self, element: Nest, index: int) -> Nest:
        try:
            return normalize_output(call_with_element(self._fn, element))
        except Exception as error:
            self._note_failed_element(error, index)
            raise

    def _tolerant(self) -> Dataset | None:
        clone = copy.copy(self)
        clone.__class__ = _TolerantMap
        return clone

    def _batch_rows(self) -> tuple[int | None, str | None]:
        return self._inputs[0]._batch_rows()  # (a map keeps its elements' rows, as a row-wise function does)

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the index of the next input element (``index``, for the notes on a failing
        # call's error), the input's pass, and, between a parallel pass's consumer and its input,
        # the calls under way (``pending``: see _iterate_parallel); ``exhausted``: the input ended,
        # ``error`` (if set): with the error that :mod:`saved_errors` saved, raised after ``pending``.
        if not state.resumed:
            state.index, state.pending, state.exhausted = 0, [], False
        if self._workers > 1:
            return self._iterate_parallel(state)
        return self._iterate_sequential(state)

    def _iterate_sequential(self, state: State) -> Iterator[Any]:
        pending = state.pending  # (saved by a parallel pass: a map of one thread restored from one of several)
        while pending:
            kind, value, index = pending.pop(0)
            yield value if kind == _RESULT else self._apply(value, index)
        source = state.input()
        try:
            if state.exhausted:
                raise_saved_error(state)  # (a parallel pass's input failed after the calls pending)
                return
            for index, element in enumerate(source, state.index):
                state.index = index + 1
                yield self._apply(element, index)
        finally:
            source.close()

    def _iterate_parallel(self, state: State) -> Iterator[Any]:
        # Up to 2 * workers calls in flight; results come out in input order. ``window`` holds
        # each call's future with its input element and index; a save turns it into
        # ``pending``: the results of the calls that completed, and the input element of every
        # other call (running, queued or failed), which a restored pass maps again. So a save
        # never waits for user code, and no element is lost or made twice.
        window: collections.deque[tuple[Future[Any], Any, int]] = collections.deque()
        state._window = window
        pool = DaemonPool(self._workers, "towerdist-map")
        source = state.input()
        try:
            for kind, value, index in state.pending:
                call = _done(value) if kind == _RESULT else pool.submit(self._apply, value, index)
                window.append((call, value, index))
            state.pending = []
            failure: BaseException | None = None  # the input's error, raised after the calls it followed
            while True:
                while not state.exhausted and len(window) < 2 * self._workers:
                    try:
                        element = next(source)
                    except StopIteration:
                        state.exhausted = True
                        break
                    except Exception as error:
                        # Every element read before the error is mapped and delivered first
                        # (saved as ``error``, so that a pass restored meanwhile raises it too).
                        state.exhausted, state.error, failure = True, save_error(error), error
                        break
                    index = state.index
                    state.index = index + 1
                    window.append((pool.submit(self._apply, element, index), element, index))
                if not window:
                    saved = getattr(state, "error", None)
                    if saved is not None:
                        state.error = None
                        raise failure if failure is not None else restore_error(saved)
                    return
                yield window.popleft()[0].result()
        finally:
            running = [future for future, _, _ in window if not future.cancel()]
            pool.shutdown()
            wait_or_warn(running, _STOP_SECONDS, "Dataset.map() call(s)")
            source.close()

    def _save_state(self, state: State) -> Saved:
        window: collections.deque[tuple[Future[Any], Any, int]] | None = getattr(state, "_window", None)
        if window is not None:  # a parallel pass under way (its consumer waits between two elements)
            calls = (_pending(future, element, index) for future, element, index in list(window))
            state.pending = [call for call in calls if call is not None]
        return super()._save_state(state)

    def _spec(self, probe: bool) -> ElementSpec:
        if not probe:
            return None
        input_spec = self._inputs[0]._spec(probe)
        try:
            exact = self._probe_spec()
        except EmptyDatasetError:
            # No element to learn from: call map_func on zeros of the input's spec, as
            # TensorFlow traces it symbolically.
            exact = structure_of(self._apply(placeholder_element(input_spec, "map"), 0))
        return relax_batch(exact, input_spec)


class _TolerantMap(MapDataset):
    """``map`` that drops an element whose function raised (inside ``ignore_errors``)."""

    _on_error: ErrorHandler

    def _batch_rows(self) -> tuple[int | None, str | None]:
        return None, "an ignore_errors() map may drop a batch"

    def _apply(self, element: Nest, index: int) -> Nest:
        try:
            return super()._apply(element, index)
        except Exception as error:
            self._on_error(error)
            return _DROPPED

    def _iterate(self, state: State) -> Iterator[Any]:
        source = super()._iterate(state)
        try:
            for value in source:
                if value is not _DROPPED:
                    yield value
        finally:
            close_iterator(source)

    def _tolerant(self) -> Dataset | None:
        return None  # already tolerant: ignore_errors only rewires its inputs


_DROPPED = object()  # what a tolerant map yields for an element it dropped
_RESULT, _INPUT = "result", "input"  # the kinds of a parallel map's pending calls in a saved position


def _pending(future: Future[Any], element: Nest, index: int) -> list[Any] | None:
    """A parallel map's call as saved: its result if it completed, else its input (mapped again
    when restored); None for an element a tolerant map dropped."""
    if future.done() and not future.cancelled() and future.exception() is None:
        result = future.result()
        return None if result is _DROPPED else [_RESULT, result, index]
    return [_INPUT, element, index]


def _done(result: Nest) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(result)
    return future


class FilterDataset(Dataset):
    _op = "filter"

    def __init__(self, input_dataset: Dataset, predicate: Callable[..., Any]) -> None:
        if not callable(predicate):
            raise TypeError(f"filter() takes a callable predicate. Got predicate={predicate!r}.")
        self._inputs = (input_dataset,)
        self._predicate = predicate
        self._on_error: ErrorHandler | None = None  # set on the copies ignore_errors() makes

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the index of the next input element (for the notes on errors) and the input's pass.
        if not state.resumed:
            state.index = 0
        source = state.input()
        try:
            for index, element in enumerate(source, state.index):
                try:
                    keep = call_with_element(self._predicate, element)
                except Exception as error:
                    self._note_failed_element(error, index)
                    if self._on_error is None:
                        raise
                    self._on_error(error)  # inside ignore_errors(): the element is dropped
                    continue
                if not _is_bool_scalar(keep):
                    raise ValueError(
                        f"Invalid `predicate`. `predicate` must return a `tf.bool` scalar tensor, but its return "
                        f"type is {structure_of(normalize_output(keep))!r} (element {index})."
                    )
                if keep:
                    state.index = index + 1
                    yield element
        finally:
            source.close()

    def _tolerant(self) -> Dataset | None:
        return copy.copy(self)

    def _cardinality(self) -> int:
        return options_lib.UNKNOWN

    def _batch_size(self) -> int | None:
        return self._inputs[0]._batch_size()


def _is_bool_scalar(value: object) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return True
    return getattr(value, "dtype", None) == np.bool_ and getattr(value, "ndim", None) == 0
