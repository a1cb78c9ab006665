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
from towerdist._src.data.cursor import State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.node import ErrorHandler
from towerdist._src.data.spec import EmptyDatasetError, relax_batch, structure_of
from towerdist._src.data.structure import call_with_element, close_iterator, normalize_output, placeholder_element
from towerdist._src.data.workers import DaemonPool, wait_or_warn

__all__ = ["FilterDataset", "MapDataset"]

_STOP_SECONDS = 10.0  # how long closing waits for map_func calls running in user code


def _workers(num_parallel_calls: Any) -> int:
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
        self, input_dataset: Dataset, map_func: Callable[..., Any], num_parallel_calls: Any, synchronous: Any = None
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

    def _apply(self, element: Any, index: int) -> Any:
        try:
            return normalize_output(call_with_element(self._fn, element))
        except Exception as error:
            self._note_failed_element(error, index)
            raise

    def _tolerant(self) -> Dataset | None:
        clone = copy.copy(self)
        clone.__class__ = _TolerantMap
        return clone

    def _iterate(self, state: State) -> Iterator[Any]:
        source = self._inputs[0]._cursor()
        try:
            if self._workers <= 1:
                for index, element in enumerate(source):
                    yield self._apply(element, index)
            else:
                yield from self._iterate_parallel(source)
        finally:
            close_iterator(source)

    def _iterate_parallel(self, source: Iterator[Any]) -> Iterator[Any]:
        # Up to 2 * workers calls in flight; results come out in input order.
        window: collections.deque[Future[Any]] = collections.deque()
        pool = DaemonPool(self._workers, "towerdist-map")
        try:
            index = 0
            exhausted = False
            while True:
                while not exhausted and len(window) < 2 * self._workers:
                    try:
                        element = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    window.append(pool.submit(self._apply, element, index))
                    index += 1
                if not window:
                    return
                yield window.popleft().result()
        finally:
            running = [future for future in window if not future.cancel()]
            pool.shutdown()
            wait_or_warn(running, _STOP_SECONDS, "Dataset.map() call(s)")

    def _spec(self, probe: bool) -> Any:
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

    def _apply(self, element: Any, index: int) -> Any:
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


class FilterDataset(Dataset):
    _op = "filter"

    def __init__(self, input_dataset: Dataset, predicate: Callable[..., Any]) -> None:
        if not callable(predicate):
            raise TypeError(f"filter() takes a callable predicate. Got predicate={predicate!r}.")
        self._inputs = (input_dataset,)
        self._predicate = predicate
        self._on_error: ErrorHandler | None = None  # set on the copies ignore_errors() makes

    def _iterate(self, state: State) -> Iterator[Any]:
        source = self._inputs[0]._cursor()
        try:
            for index, element in enumerate(source):
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
                    yield element
        finally:
            close_iterator(source)

    def _tolerant(self) -> Dataset | None:
        return copy.copy(self)

    def _cardinality(self) -> int:
        return options_lib.UNKNOWN

    def _batch_size(self) -> int | None:
        return self._inputs[0]._batch_size()


def _is_bool_scalar(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return True
    return getattr(value, "dtype", None) == np.bool_ and getattr(value, "ndim", None) == 0
