"""``interleave`` and ``flat_map``: datasets made of the datasets a function returns per element.

The order is TensorFlow's cycle/block rule. ``cycle_length`` *slots* each hold one open input
dataset (made by ``map_func`` from one input element). The cycle visits the slots in turn;
at each visit the slot gives up to ``block_length`` elements, then the turn passes on.
With ``cycle_length=2, block_length=1`` and inputs a (3 elements), b (1), c (4), d (2) the
order is ``a0 b0 a1 a2 c0 c1 d0 c2 d1 c3``: b runs out at slot 1's second visit, which
passes the turn on; slot 1 opens c at its next visit, and slot 0 opens d after a ran out.

An input that runs out gives up the rest of its turn; its slot is refilled with the next
input only when the cycle comes back to that slot, and the new input then gives its block
in that same turn. ``flat_map`` is the case ``cycle_length=1, block_length=1``.

With ``num_parallel_calls`` the open inputs (and the next ``cycle_length`` ones) are
iterated on a thread pool, a block ahead of the consumer, which still takes elements in the
order above (``deterministic=False`` lets it take from whichever input is ready first).
Closing the iterator stops the pool before it returns.

An error raised by ``map_func`` or by an input comes out at the position where that input's
next element would have been, after every element produced before it.
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import numpy as np

from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.node import ErrorHandler, tolerant
from towerdist._src.data.spec import FirstElementCheck
from towerdist._src.data.structure import call_with_element, close_iterator, sample_element
from towerdist._src.data.workers import DaemonPool, wait_or_warn
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import unworded

__all__ = ["FlatMapDataset", "InterleaveDataset", "default_cycle_length"]

logger = logging.getLogger("towerdist")

_EXHAUSTED = object()
_STOP_SECONDS = 10.0  # how long closing waits for inputs running in user code


def default_cycle_length() -> int:
    """What ``cycle_length=None`` (or ``td.data.AUTOTUNE``) means: the schedulable CPU cores.

    TensorFlow uses the number of CPU cores the process may run on; so does towerdist
    (``os.sched_getaffinity`` where the platform has it, else ``os.cpu_count()``).
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def default_parallel_cycle_length(num_parallel_calls: int) -> int:
    """What ``cycle_length=None`` means with ``num_parallel_calls`` set (TensorFlow's rule).

    ``num_parallel_calls=k``: ``min(k, cores)``. ``td.data.AUTOTUNE``: ``ceil(cores / 3)``,
    so that each open input's thread and the two prefetching the next inputs' elements
    together roughly fill the cores.
    """
    cores = default_cycle_length()
    if num_parallel_calls == options_lib.AUTOTUNE:
        return -(-cores // 3)
    return max(1, min(num_parallel_calls, cores))


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise unworded(TypeError(f"takes an integer {name}. Got {name}={value!r}."))
    return int(value)


class InterleaveDataset(Dataset):
    """``interleave`` (and ``flat_map``, with one slot): see the module docstring."""

    _api = "interleave"  # the operation's name, in its messages and its threads' names

    def __init__(
        self,
        input_dataset: Dataset,
        map_func: Callable[..., Any],
        cycle_length: Any = None,
        block_length: Any = None,
        num_parallel_calls: Any = None,
        deterministic: bool | None = None,
    ) -> None:
        if not callable(map_func):
            raise unworded(TypeError(f"takes a callable map_func. Got map_func={map_func!r}."))
        self._inputs = (input_dataset,)
        self._fn = map_func
        if cycle_length is None or (
            not isinstance(cycle_length, bool)
            and isinstance(cycle_length, (int, np.integer))
            and cycle_length == options_lib.AUTOTUNE
        ):
            self._cycle = default_cycle_length()
            fixed_cycle = False
        else:
            self._cycle = _positive(cycle_length, "cycle_length")
            fixed_cycle = True
            if self._cycle <= 0:
                raise unworded(
                    InvalidArgumentError(
                        f"cycle_length must be greater than zero (or None / td.data.AUTOTUNE for the "
                        f"number of CPU cores). Got cycle_length={self._cycle}."
                    )
                )
        self._block = 1 if block_length is None else _positive(block_length, "block_length")
        if self._block <= 0:
            raise unworded(
                InvalidArgumentError(f"block_length must be greater than zero. Got block_length={self._block}.")
            )
        self._workers = 0
        if num_parallel_calls is not None:
            calls = _positive(num_parallel_calls, "num_parallel_calls")
            if not fixed_cycle:
                self._cycle = default_parallel_cycle_length(calls)
            if calls == options_lib.AUTOTUNE:
                self._workers = self._cycle
            elif calls <= 0:
                raise unworded(
                    InvalidArgumentError(
                        f"num_parallel_calls must be greater than zero or td.data.AUTOTUNE. "
                        f"Got num_parallel_calls={calls}."
                    )
                )
            elif calls > self._cycle:
                shown = f"{self._cycle}" if fixed_cycle else f"None, which resolves to {self._cycle} CPU cores here"
                raise InvalidArgumentError(
                    f"Dataset.{self._api}(): if `cycle_length` is set, `num_parallel_calls` must be either "
                    f"td.data.AUTOTUNE or a value less than or equal to `cycle_length`. Got "
                    f"num_parallel_calls={calls} and cycle_length={shown}; lower num_parallel_calls or pass "
                    f"td.data.AUTOTUNE."
                )
            else:
                self._workers = calls
        self._deterministic = deterministic is None or bool(deterministic)
        self._on_error: ErrorHandler | None = None  # set on the copies ignore_errors() makes
        self._reads_files_cache: bool | None = None

    # --- opening inputs --------------------------------------------------------------------

    def _open(self, element: Any, index: int) -> Dataset:
        """The dataset ``map_func`` makes of input element ``index``."""
        try:
            made = call_with_element(self._fn, element)
        except Exception as error:
            error.add_note(f"td.data.Dataset.{self._api}(): raised by map_func on element {index} of its input.")
            raise
        if not isinstance(made, Dataset):
            raise TypeError(
                f"Dataset.{self._api}(): the `map_func` argument must return a `Dataset` object. Got "
                f"{type(made)} for element {index} of the input; wrap arrays in td.data.Dataset.from_tensors() "
                f"or from_tensor_slices()."
            )
        if self._on_error is not None:
            made = tolerant(made, self._on_error)
        return made

    def _open_iterator(self, element: Any, index: int, check: FirstElementCheck) -> Iterator[Any]:
        """The elements of the dataset ``map_func`` makes of input element ``index``, its spec checked by ``check``."""
        made = self._open(element, index)
        spec = made._spec(probe=False)
        if spec is not None:
            check.spec(index, spec)
            return made._cursor()
        return _first_checked(made._cursor(), check, index)

    def _mismatch(self, a: int, spec_a: Any, b: int, spec_b: Any, where: str) -> str:
        return (
            f"Dataset.{self._api}(): map_func must return datasets of one structure and dtypes, but they differ "
            f"{where}: the dataset made of input element {a} has element_spec={spec_a!r}, the one made of element "
            f"{b} {spec_b!r}. Cast or restructure inside map_func."
        )

    def _dropped(self, error: BaseException) -> bool:
        """True if ``error`` is dropped (under ``ignore_errors``), False if it must propagate."""
        if self._on_error is None or not isinstance(error, Exception):
            return False
        self._on_error(error)
        return True

    # --- sequential ------------------------------------------------------------------------

    def _iterate(self, state: State) -> Iterator[Any]:
        if self._workers:
            return self._iterate_parallel()
        return self._iterate_sequential()

    def _iterate_sequential(self) -> Iterator[Any]:
        source = self._inputs[0]._cursor()
        slots: list[Iterator[Any] | None] = [None] * self._cycle
        check = FirstElementCheck(self._mismatch)
        try:
            index = 0  # the slot whose turn it is
            taken = 0  # elements the current slot gave in this turn
            opened = 0  # input elements opened so far
            input_done = False
            while not input_done or any(slot is not None for slot in slots):
                slot = slots[index]
                if slot is None:
                    if input_done:
                        index, taken = (index + 1) % self._cycle, 0
                        continue
                    try:
                        element = next(source)
                    except StopIteration:
                        input_done = True
                        continue
                    opened += 1
                    try:
                        slot = self._open_iterator(element, opened - 1, check)
                    except Exception as error:
                        if self._dropped(error):
                            continue  # the next input takes this turn
                        raise
                    slots[index] = slot
                try:
                    value = next(slot)
                except StopIteration:
                    value = _EXHAUSTED
                except Exception as error:
                    if not self._dropped(error):
                        raise
                    value = _EXHAUSTED  # the input cannot go on after an error
                if value is _EXHAUSTED:
                    close_iterator(slot)
                    slots[index] = None
                    index, taken = (index + 1) % self._cycle, 0
                    continue
                yield value
                taken += 1
                if taken == self._block:
                    index, taken = (index + 1) % self._cycle, 0
        finally:
            for slot in slots:
                close_iterator(slot)
            close_iterator(source)

    # --- parallel --------------------------------------------------------------------------

    def _iterate_parallel(self) -> Iterator[Any]:
        stop = threading.Event()
        pool = DaemonPool(self._workers, f"towerdist-{self._api}")
        source = self._inputs[0]._cursor()
        slots: list[_Slot | None] = [None] * self._cycle
        check = FirstElementCheck(self._mismatch)
        upcoming: collections.deque[_Slot] = collections.deque()  # opened ahead, in input order
        opened = 0
        input_done = False

        def top_up() -> None:
            nonlocal opened, input_done
            while not input_done and len(upcoming) < self._cycle:
                try:
                    element = next(source)
                except StopIteration:
                    input_done = True
                    return
                upcoming.append(_Slot(self, pool, stop, check, element, opened))
                opened += 1

        try:
            index, taken = 0, 0
            while True:
                top_up()
                if not upcoming and all(slot is None for slot in slots):
                    return
                slot = slots[index]
                if slot is None:
                    if not upcoming:
                        index, taken = (index + 1) % self._cycle, 0
                        continue
                    slot = slots[index] = upcoming.popleft()
                    top_up()
                if not self._deterministic and not slot.ready():
                    ready = _first_ready(slots, index)
                    if ready is None:
                        wait(
                            [s.future for s in slots if s is not None and s.future is not None],
                            return_when=FIRST_COMPLETED,
                        )
                        ready = _first_ready(slots, index)
                    if ready is not None and ready != index:
                        index, taken = ready, 0
                        slot = slots[index]
                        assert slot is not None
                value = slot.take()
                if value is _EXHAUSTED:
                    slots[index] = None
                    if not slot.open_failed:  # a dropped map_func error: the next input takes this turn
                        index, taken = (index + 1) % self._cycle, 0
                    continue
                yield value
                taken += 1
                if taken == self._block:
                    index, taken = (index + 1) % self._cycle, 0
        finally:
            stop.set()
            every = [slot for slot in slots if slot is not None] + list(upcoming)
            running = [slot.future for slot in every if slot.future is not None and not slot.future.cancel()]
            pool.shutdown()
            wait_or_warn(running, _STOP_SECONDS, f"Dataset.{self._api}() input(s)")  # a task stops after its element
            for slot in every:  # close the inputs no thread is running any more
                if slot.future is None or slot.future.done():
                    slot.close()
            close_iterator(source)

    # --- hooks -----------------------------------------------------------------------------

    def _spec(self, probe: bool) -> Any:
        if not probe:
            return None
        return self._open(sample_element(self._inputs[0], self._api), 0).element_spec

    def _tolerant(self) -> Dataset | None:
        return copy.copy(self)

    def _cardinality(self) -> int:
        return options_lib.UNKNOWN  # as in TensorFlow, even for an infinite input

    def _reads_files(self) -> bool:
        """True if ``map_func`` makes datasets that read files (FILE auto-sharding shards the input then)."""
        if self._reads_files_cache is None:
            source = self._inputs[0]._cursor()
            try:
                element = next(source, _EXHAUSTED)
            finally:
                close_iterator(source)
            if element is _EXHAUSTED:
                self._reads_files_cache = False
            else:
                made = self._open(element, 0)
                self._reads_files_cache = any(node._reads_files() for node in made._walk())
        return self._reads_files_cache


class FlatMapDataset(InterleaveDataset):
    """``flat_map``: an interleave of one input at a time."""

    _api = "flat_map"

    def __init__(self, input_dataset: Dataset, map_func: Callable[..., Any]) -> None:
        super().__init__(input_dataset, map_func, 1, 1)


class _Slot:
    """One input of a parallel interleave: its dataset is opened and iterated on the pool.

    At most one task of a slot runs at a time, so its generator is only ever touched by one
    thread; each task produces up to ``block_length`` elements, and the next task is started
    as soon as the consumer takes the previous one's elements (one block ahead).
    """

    def __init__(
        self,
        owner: InterleaveDataset,
        pool: DaemonPool,
        stop: threading.Event,
        check: FirstElementCheck,
        element: Any,
        index: int,
    ) -> None:
        self._owner = owner
        self._check = check
        self._pool = pool
        self._stop = stop
        self._iterator: Iterator[Any] | None = None
        self._buffer: collections.deque[Any] = collections.deque()
        self._ended = False
        self._error: BaseException | None = None
        self.open_failed = False
        self.future: Future[None] | None = pool.submit(self._open_and_fetch, element, index)

    def _open_and_fetch(self, element: Any, index: int) -> None:
        try:
            self._iterator = self._owner._open_iterator(element, index, self._check)
        except BaseException as error:
            self.open_failed = True
            self._fail(error)
            return
        self._fetch()

    def _fetch(self) -> None:
        iterator = self._iterator
        assert iterator is not None
        produced: list[Any] = []
        try:
            while len(produced) < self._owner._block and not self._stop.is_set():
                produced.append(next(iterator))
        except StopIteration:
            self._ended = True
        except BaseException as error:
            self._buffer.extend(produced)  # the elements before the error come first
            self._fail(error)
            return
        self._buffer.extend(produced)

    def _fail(self, error: BaseException) -> None:
        self._ended = True
        if not self._owner._dropped(error):
            self._error = error

    def ready(self) -> bool:
        return bool(self._buffer) or self.future is None or self.future.done()

    def take(self) -> Any:
        """The next element, ``_EXHAUSTED`` at the end; raises the input's error in its place."""
        if self.future is not None and (not self._buffer or self.future.done()):
            self.future.result()  # waits for the running task; it stores its outcome and never raises
            self.future = None
        if self._buffer:
            value = self._buffer.popleft()
            if not self._buffer and self.future is None and not self._ended:
                self.future = self._pool.submit(self._fetch)
            return value
        if self._error is not None:
            error, self._error = self._error, None
            error.add_note(f"Raised in a towerdist-{self._owner._api} worker thread.")
            raise error
        if not self._ended:  # an empty block: the stop flag was set, or nothing buffered yet
            self.future = self._pool.submit(self._fetch)
            return self.take()
        self.close()
        return _EXHAUSTED

    def close(self) -> None:
        close_iterator(self._iterator)
        self._iterator = None


def _first_checked(iterator: Iterator[Any], check: FirstElementCheck, key: int) -> Iterator[Any]:
    """``iterator``'s elements, the first checked by ``check`` (its spec is known only by running it)."""
    try:
        for first in iterator:
            check.first(key, first)
            yield first
            break
        yield from iterator
    finally:
        close_iterator(iterator)


def _first_ready(slots: list[_Slot | None], start: int) -> int | None:
    n = len(slots)
    for k in range(n):
        slot = slots[(start + k) % n]
        if slot is not None and slot.ready():
            return (start + k) % n
    return None
