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

**Errors** (TensorFlow's rule; no element read before an error is lost). An error raised by the
input, by ``map_func`` or by an open input comes out at the position where the element it
stands for would have been, after every element produced before it, and the pass goes on
after it (see :mod:`~towerdist._src.data.continuing`): the open inputs give their remaining
elements and the input is read again (a towerdist input whose pass raised, such as a failing
``from_generator``, has ended). Without ``num_parallel_calls`` an error takes no turn: the
slot it happened in is served again (with the next input element, if the input raised or
``map_func`` did). With ``num_parallel_calls`` an error is one of its slot's elements, as in
TensorFlow's parallel interleave: it counts in the block, and the slot then counts as
exhausted (an error of the input or of ``map_func`` fills the slot of the input it stands for).

**Saving.** A pass's position is the cycle's (the slot whose turn it is, the elements it gave
in this turn, how many input elements were opened, whether the input ended), the input's
pass, and for each open input the input element it was made of and its own pass (the
state's child ``made<index>``). A restored pass calls ``map_func`` again on each saved
element and restores the dataset it makes at the saved position. A parallel pass also saves
the inputs opened ahead, and for each input the elements its thread buffered and its end or
error; the thread holds its input's lock while it makes one element and buffers it, and a
save takes every such lock (see ``workers.hold``) to copy the inputs between two elements.
An input whose ``map_func`` call is under way is saved as not opened yet: the restored pass
calls ``map_func`` on it again. ``cycle_length`` is the number of slots a saved position has,
so a position restores only into a pipeline of the same ``cycle_length``.
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import os
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import numpy as np

from towerdist._src.data import options as options_lib
from towerdist._src.data import workers
from towerdist._src.data.continuing import Raise, continuing
from towerdist._src.data.cursor import Cursor, Saved, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.node import ErrorHandler, tolerant
from towerdist._src.data.saved_errors import restore_error, save_error
from towerdist._src.data.spec import ElementSpec, FirstElementCheck
from towerdist._src.data.structure import call_with_element, close_iterator, sample_element
from towerdist._src.data.workers import DaemonPool, wait_or_warn
from towerdist._src.errors import DataLossError, InvalidArgumentError
from towerdist._src.failures import unworded
from towerdist._src.type_aliases import Nest

__all__ = ["FlatMapDataset", "InterleaveDataset", "default_cycle_length"]

logger = logging.getLogger("towerdist")

_EXHAUSTED = object()
_MADE = "made"  # the key of an open input's pass among a state's children: made<index of its input element>
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


def _positive(value: int, name: str) -> int:
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
        cycle_length: int | None = None,
        block_length: int | None = None,
        num_parallel_calls: int | None = None,
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
        self._cycle_given = fixed_cycle
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

    def _open(self, element: Nest, index: int) -> Dataset:
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

    def _open_checked(self, element: Nest, index: int, check: FirstElementCheck) -> tuple[Dataset, bool]:
        """The dataset made of input element ``index``, its static spec checked by ``check``; and whether
        its first element must be checked instead (its spec is known only by running it)."""
        made = self._open(element, index)
        spec = made._spec(probe=False)
        if spec is not None:
            check.spec(index, spec)
        return made, spec is None

    def _mismatch(self, a: int, spec_a: ElementSpec, b: int, spec_b: ElementSpec, where: str) -> str:
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

    # --- saving (see the module docstring) ---------------------------------------------------

    def _state_name(self) -> str:
        return "ParallelInterleaveDataset" if self._workers else type(self).__name__

    def _state_params(self) -> dict[str, Any]:
        return {"cycle_length": self._cycle}

    def _state_params_hint(self) -> str | None:
        if self._cycle_given:
            return None
        return (
            f"this interleave's cycle_length was not given, so it is the number of CPU cores this process may "
            f"run on ({self._cycle}), which differs between machines: pass cycle_length explicitly to restore "
            f"on a machine with another number of cores"
        )

    def _restored_input(self, key: str, state: State) -> Dataset:
        if not key.startswith(_MADE):
            return super()._restored_input(key, state)
        index = int(key[len(_MADE) :])
        records = [*state.slots, *getattr(state, "upcoming", ())]
        for record in records:
            if record is not None and record["index"] == index:
                return self._open(record["element"], index)
        raise DataLossError(
            f"The saved iterator state cannot be read: it holds the position of the dataset Dataset.{self._api}() made "
            f"of input element {index}, but none of its saved inputs is that element."
        )

    def _save_state(self, state: State) -> Saved:
        slots: list[_Slot | None] | None = getattr(state, "_slots", None)
        if slots is None:  # sequential, or a parallel pass not started: the attributes say it all
            return super()._save_state(state)
        upcoming: collections.deque[_Slot] = state._upcoming
        held: list[_Slot] = []
        try:
            for slot in [*(slot for slot in slots if slot is not None), *upcoming]:
                reader = f"the Dataset.{self._api}() thread reading the input made of element {slot.index}"
                workers.hold(slot.lock, reader)
                held.append(slot)
            state.slots = [None if slot is None else slot.record() for slot in slots]
            state.upcoming = [slot.record() for slot in upcoming]
            return super()._save_state(state)
        finally:
            for slot in held:
                slot.lock.release()

    # --- sequential ------------------------------------------------------------------------

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the slot whose turn it is (``turn``), the elements it gave in this turn
        # (``taken``), how many input elements were opened (``opened``), whether the input
        # ended (``input_done``), the input element and index of each slot's open input
        # (``slots``; each open input's pass is the child ``made<index>``), and for a parallel
        # pass the inputs opened ahead (``upcoming``) and each input's buffered elements.
        if not state.resumed:
            state.turn, state.taken, state.opened, state.input_done = 0, 0, 0, False
            state.slots = [None] * self._cycle
            if self._workers:
                state.upcoming = []
        if self._workers:
            return continuing(self._iterate_parallel(state), state)
        return continuing(self._iterate_sequential(state), state)

    def _iterate_sequential(self, state: State) -> Generator[Any, None, None]:
        check = FirstElementCheck(self._mismatch)
        slots: list[dict[str, Any] | None] = state.slots
        inputs: list[Iterator[Any] | None] = [
            None if record is None else self._resumed_input(state, record["index"], check)[1] for record in slots
        ]
        source = state.input()
        cycle, block = self._cycle, self._block
        try:
            index, taken = state.turn, state.taken
            while not state.input_done or any(slot is not None for slot in inputs):
                slot = inputs[index]
                if slot is None:
                    if state.input_done:
                        index, taken = (index + 1) % cycle, 0
                        continue
                    try:
                        element = next(source)
                    except StopIteration:
                        state.input_done = True
                        continue
                    except Exception as error:  # the slot stays empty: the input is read again at its turn
                        state.turn, state.taken = index, taken
                        yield Raise(error)
                        continue
                    opened = state.opened
                    state.opened = opened + 1
                    try:
                        made, check_first = self._open_checked(element, opened, check)
                    except Exception as error:
                        if not self._dropped(error):
                            state.turn, state.taken = index, taken
                            yield Raise(error)
                        continue  # the next input takes this turn
                    cursor = state.open(made, _MADE + str(opened))
                    slot = inputs[index] = _first_checked(cursor, check, opened) if check_first else iter(cursor)
                    slots[index] = {"element": element, "index": opened}
                try:
                    value = next(slot)
                except StopIteration:
                    value = _EXHAUSTED
                except Exception as error:
                    if not self._dropped(error):  # no turn taken: this input goes on at the next call
                        state.turn, state.taken = index, taken
                        yield Raise(error)
                        continue
                    value = _EXHAUSTED  # the input cannot go on after an error
                if value is _EXHAUSTED:
                    record = slots[index]
                    assert record is not None
                    close_iterator(slot)
                    state.drop(_MADE + str(record["index"]))
                    slots[index] = inputs[index] = None
                    index, taken = (index + 1) % cycle, 0
                    continue
                taken += 1
                if taken >= block:
                    index, taken = (index + 1) % cycle, 0
                state.turn, state.taken = index, taken
                yield value
        finally:
            for slot in inputs:
                close_iterator(slot)
            source.close()

    def _resumed_input(self, state: State, index: int, check: FirstElementCheck) -> tuple[Cursor, Iterator[Any]]:
        """The restored pass over the input made of element ``index`` (``_restored_input`` made it
        again), and its elements as ``check`` sees them."""
        key = _MADE + str(index)
        restored = state.child(key)
        if restored is None:  # a damaged position: a slot's record without its pass
            raise unworded(
                DataLossError(
                    f"cannot restore the iterator: the saved position of Dataset.{self._api}() has an open input "
                    f"(element {index} of its input) without its pass; the state is damaged."
                )
            )
        cursor = state.open(restored.node, key)
        spec = cursor.node._spec(probe=False)
        if spec is not None:
            check.spec(index, spec)
            return cursor, iter(cursor)
        return cursor, _first_checked(cursor, check, index)

    # --- parallel --------------------------------------------------------------------------

    def _iterate_parallel(self, state: State) -> Generator[Any, None, None]:
        stop = threading.Event()
        pool = DaemonPool(self._workers, _thread_name(self))
        check = FirstElementCheck(self._mismatch)
        make = functools.partial(_Slot, self, state, pool, stop, check)
        cycle, block = self._cycle, self._block
        slots: list[_Slot | None] = [None] * cycle
        upcoming: collections.deque[_Slot] = collections.deque()  # inputs opened ahead, in input order
        state._slots, state._upcoming = slots, upcoming
        source = state.input()
        try:
            for k, record in enumerate(state.slots):
                slots[k] = None if record is None else make(record)
            upcoming.extend(make(record) for record in state.upcoming)

            def top_up() -> None:
                while not state.input_done and len(upcoming) < cycle:
                    opened = state.opened
                    try:
                        element = next(source)
                    except StopIteration:
                        state.input_done = True
                        return
                    except Exception as error:  # stands in the cycle for the input element that failed
                        slot = make({"element": None, "index": opened, "ended": True})
                        slot.fail_with(error)
                    else:
                        slot = make({"element": element, "index": opened})
                    state.opened = opened + 1
                    upcoming.append(slot)

            index, taken = state.turn, state.taken
            while True:
                top_up()
                if not upcoming and all(slot is None for slot in slots):
                    return
                slot = slots[index]
                if slot is None:
                    if not upcoming:
                        index, taken = (index + 1) % cycle, 0
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
                try:
                    value = slot.take()
                except Exception as error:  # one of the slot's elements (TensorFlow's parallel rule)
                    value = Raise(error)
                if value is _EXHAUSTED:
                    slots[index] = None
                    if not slot.open_failed or slot.raised:  # a dropped map_func error: the next input takes this turn
                        index, taken = (index + 1) % cycle, 0
                    continue
                taken += 1
                if taken >= block:
                    index, taken = (index + 1) % cycle, 0
                state.turn, state.taken = index, taken
                yield value
        finally:
            stop.set()
            every = [slot for slot in slots if slot is not None] + list(upcoming)
            running = [slot.future for slot in every if slot.future is not None and not slot.future.cancel()]
            pool.shutdown()
            wait_or_warn(running, _STOP_SECONDS, f"Dataset.{self._api}() input(s)")  # a task stops after its element
            for slot in every:
                if slot.future is None or slot.future.done():
                    slot.close()
                else:  # a thread still runs it: it is left to that thread
                    state.release(slot.key)
            source.close()

    # --- hooks -----------------------------------------------------------------------------

    def _spec(self, probe: bool) -> ElementSpec:
        if not probe:
            return None
        return self._open(sample_element(self._inputs[0], self._api), 0).element_spec

    def _tolerant(self) -> Dataset | None:
        return copy.copy(self)

    def _cardinality(self) -> int:
        # TensorFlow's rule: the parallel interleave of an infinite input is infinite; the sequential
        # one (and flat_map) reports UNKNOWN even then, as its kernel defines no cardinality.
        if self._workers and self._inputs[0]._cardinality() == options_lib.INFINITE:
            return options_lib.INFINITE
        return options_lib.UNKNOWN

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

    def _state_params(self) -> dict[str, Any]:
        return {}  # always one input at a time


class _Slot:
    """One input of a parallel interleave: its dataset is opened and iterated on the pool.

    At most one task of a slot runs at a time, so its pass is only ever touched by one
    thread; each task produces up to ``block_length`` elements, and the next task is started
    as soon as the consumer takes the previous one's elements (one block ahead). The task
    holds ``lock`` while it makes one element and buffers it (and while it registers the
    input's pass as the child ``made<index>`` of the state); a save takes it to copy the
    slot (:meth:`record`).

    Made from a ``record``: ``{"element", "index"}`` for a new input, or a saved record,
    whose buffer, end and error are taken over and whose pass is the restored child.
    """

    def __init__(
        self,
        owner: InterleaveDataset,
        state: State,
        pool: DaemonPool,
        stop: threading.Event,
        check: FirstElementCheck,
        record: dict[str, Any],
    ) -> None:
        self._owner = owner
        self._state = state
        self._check = check
        self._pool = pool
        self._stop = stop
        self.element, self.index = record["element"], record["index"]
        self.key = _MADE + str(self.index)
        self.lock = threading.Lock()
        self._cursor: Cursor | None = None  # the pass over the dataset map_func made (a child of the state)
        self._iterator: Iterator[Any] | None = None  # the same, its first element checked where its spec was not known
        self.buffer: collections.deque[Any] = collections.deque(record.get("buffer", ()))
        self._ended = record.get("ended", False)
        error = record.get("error")
        self._error: BaseException | None = None if error is None else restore_error(error)
        self.open_failed = record.get("open_failed", False)
        self.raised = record.get("raised", False)  # its error came out (it then counts as exhausted)
        self.future: Future[None] | None = None
        if record.get("opened"):
            self._cursor, self._iterator = owner._resumed_input(state, self.index, check)
            if not self.buffer:
                self.future = pool.submit(self._fetch)
        elif not self._ended:
            self.future = pool.submit(self._open_and_fetch)

    def record(self) -> dict[str, Any]:
        """This input's position (call with ``lock`` held): what a restored slot is made from."""
        if self.open_failed and self._error is not None:  # map_func raised: a restored slot calls it again
            return {"element": self.element, "index": self.index}
        return {
            "element": self.element,
            "index": self.index,
            "buffer": list(self.buffer),
            "opened": self._cursor is not None,
            "ended": self._ended,
            "error": None if self._error is None else save_error(self._error),
            "open_failed": self.open_failed,
            "raised": self.raised,
        }

    def _open_and_fetch(self) -> None:
        try:  # map_func runs outside the lock: a save meanwhile saves this input as not opened yet
            made, check_first = self._owner._open_checked(self.element, self.index, self._check)
        except BaseException as error:
            with self.lock:
                self.open_failed = True
                self._fail(error)
            return
        with self.lock:
            if self._stop.is_set():
                return
            self._cursor = cursor = self._state.open(made, self.key)
            self._iterator = _first_checked(cursor, self._check, self.index) if check_first else iter(cursor)
        self._fetch()

    def _fetch(self) -> None:
        iterator, lock, buffer, stop = self._iterator, self.lock, self.buffer, self._stop
        assert iterator is not None
        for _ in range(self._owner._block):
            with lock:
                if stop.is_set():
                    return
                try:
                    value = next(iterator)
                except StopIteration:
                    self._end()
                    return
                except BaseException as error:
                    self._fail(error)
                    return
                buffer.append(value)

    def fail_with(self, error: BaseException) -> None:
        """Makes this (ended) slot raise ``error`` in place of its first element: an input read failed."""
        self._error = error
        self._read_failed = True

    def _fail(self, error: BaseException) -> None:
        """Ends the input after ``error`` (with ``lock`` held); the consumer raises it unless it is dropped."""
        self._end()
        if not self._owner._dropped(error):
            self._error = error

    def _end(self) -> None:
        """Ends the input's pass (with ``lock`` held): its position is not saved any more."""
        self._ended = True
        self.close()
        self._state.drop(self.key)
        self._cursor = None

    def ready(self) -> bool:
        return bool(self.buffer) or self.future is None or self.future.done()

    def take(self) -> Nest:
        """The next element, ``_EXHAUSTED`` at the end; raises the input's error in its place."""
        if self.future is not None and (not self.buffer or self.future.done()):
            self.future.result()  # waits for the running task; it stores its outcome and never raises
            self.future = None
        if self.buffer:
            value = self.buffer.popleft()
            if not self.buffer and self.future is None and not self._ended:
                self.future = self._pool.submit(self._fetch)
            return value
        if self._error is not None:
            error, self._error = self._error, None
            self.raised = True
            if not getattr(self, "_read_failed", False):  # (an input read fails in the consumer's thread)
                error.add_note(f"Raised in a {_thread_name(self._owner)} worker thread.")
            raise error
        if not self._ended:  # an empty block: the stop flag was set, or nothing buffered yet
            self.future = self._pool.submit(self._fetch)
            return self.take()
        return _EXHAUSTED

    def close(self) -> None:
        close_iterator(self._iterator)
        self._iterator = None
        if self._cursor is not None:
            self._cursor.close()


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


def _thread_name(owner: InterleaveDataset) -> str:
    return f"towerdist-{owner._api}"


def _first_ready(slots: list[_Slot | None], start: int) -> int | None:
    n = len(slots)
    for k in range(n):
        slot = slots[(start + k) % n]
        if slot is not None and slot.ready():
            return (start + k) % n
    return None
