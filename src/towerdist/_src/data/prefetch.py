"""``prefetch``: a background thread that produces elements ahead of the consumer.

**Saving.** A prefetching pass's position is its input's position and the elements the
thread made that the consumer has not taken yet (``buffer``), followed by the end of the
input (``ended``) or the error it raised (``error``, see :mod:`saved_errors`). The thread
holds a lock (``_Producer.pull``) while it pulls one element and queues it, and nowhere
else; a save takes that lock (a bounded wait: :func:`workers.hold`) to copy the queue and
save the input, so the two always agree. A restored pass yields the saved buffer first,
then its thread goes on from the input's saved position.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from towerdist._src import waiting
from towerdist._src.data import options as options_lib
from towerdist._src.data import workers
from towerdist._src.data.cursor import Cursor, Saved, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.saved_errors import restore_error, save_error
from towerdist._src.data.transforms import _int_arg, _Transparent
from towerdist._src.errors import InternalError, InvalidArgumentError

__all__ = ["PrefetchDataset"]

_AUTOTUNE_BUFFER = 2
_POLL_SECONDS = 1.0  # how often a waiting consumer checks that the producer is alive
_STOP_SECONDS = 10.0  # how long closing waits for a producer stuck in user code
_NAME = "towerdist-prefetch"

_ITEM, _END, _ERROR = 0, 1, 2
_DONE = object()


class PrefetchDataset(_Transparent):
    def __init__(self, input_dataset: Dataset, buffer_size: int) -> None:
        self._inputs = (input_dataset,)
        size = _int_arg(buffer_size, "buffer_size")
        if size < 0 and size != options_lib.AUTOTUNE:
            raise InvalidArgumentError(
                f"buffer_size must be >= 0 or set buffer_size to be -1 for auto-tuning. Got buffer_size={size}."
            )
        self._buffer_size = _AUTOTUNE_BUFFER if size == options_lib.AUTOTUNE else size

    def _iterate(self, state: State) -> Iterator[Any]:
        if not state.resumed:
            state.buffer, state.ended, state.error = [], False, None
        elif self._buffer_size == 0 and (state.buffer or state.ended or state.error):
            return _drained(state)  # saved from a prefetching pass: its buffer first
        if self._buffer_size == 0:
            return iter(state.input())
        return _prefetched(state, self._buffer_size)

    def _save_state(self, state: State) -> Saved:
        producer: _Producer | None = getattr(state, "_producer", None)
        if producer is None:  # not started (or not prefetching): the attributes say it all
            return super()._save_state(state)
        workers.hold(producer.pull, "the Dataset.prefetch() thread")
        try:
            entries = producer.queued()
            state.buffer = [payload for kind, payload in entries if kind == _ITEM]
            state.ended = any(kind == _END for kind, _ in entries)
            state.error = next((save_error(payload) for kind, payload in entries if kind == _ERROR), None)
            return super()._save_state(state)
        finally:
            producer.pull.release()

    def _batch_rows(self) -> tuple[int | None, str | None]:
        return self._inputs[0]._batch_rows()

    def _gather_plan(self) -> None:
        return None  # the thread must run on the real elements


class _Producer:
    """The thread of one prefetching pass: iterates ``source`` into ``items``, ``capacity`` elements ahead.

    ``items`` is unbounded: the producer waits for room *before* it pulls, outside ``pull``,
    so that a save never waits for a full buffer; a restored buffer may exceed ``capacity``.
    """

    def __init__(self, source: Cursor, capacity: int) -> None:
        self.items: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.pull = threading.Lock()  # held while one element is pulled and queued (see the module docstring)
        self.stop = threading.Event()
        self._source = source
        self._capacity = capacity
        self.thread = threading.Thread(target=self._produce, name=_NAME, daemon=True)

    def queued(self) -> list[tuple[int, Any]]:
        """What is queued for the consumer (call with ``pull`` held, between two of its elements)."""
        with self.items.mutex:
            return list(self.items.queue)

    def _produce(self) -> None:
        source, items, pull, stop, capacity = self._source, self.items, self.pull, self.stop, self._capacity
        room, queued = items.not_full, items.queue  # (an unbounded Queue's not_full is notified by every get)
        busy = workers.Busy()  # exit waits for an element being made (see workers), not for a full buffer
        try:
            while not workers.exiting.is_set():  # at exit: the element being made, not a full buffer
                if len(queued) >= capacity:  # (read without the lock: only this thread makes it grow)
                    with room:
                        while len(queued) >= capacity and not stop.is_set():
                            room.wait()
                if stop.is_set():
                    return
                with pull:
                    try:
                        with busy:
                            element = next(source, _DONE)
                    except BaseException as error:  # handed to the consumer, never lost
                        items.put((_ERROR, error))
                        return
                    if element is _DONE:
                        items.put((_END, None))
                        return
                    items.put((_ITEM, element))
        finally:
            if not workers.exiting.is_set():
                with pull, busy:  # (not while a save copies the input's position)
                    source.close()


def _prefetched(state: State, capacity: int) -> Iterator[Any]:
    """The elements of ``state``'s input, made ``capacity`` ahead by a :class:`_Producer` thread.

    The thread starts on the first ``next()``, after the restored buffer is queued. It ends
    when the input ends or raises (the exception comes out of ``next()`` here), and when
    the consumer closes or drops this generator: then the buffer is drained so that a
    blocked producer wakes up, sees the stop flag and closes its input.
    """
    source = state.input()
    producer = _Producer(source, capacity)
    items = producer.items
    for element in state.buffer:
        items.put((_ITEM, element))
    if state.error is not None:
        items.put((_ERROR, restore_error(state.error)))
    elif state.ended:
        items.put((_END, None))
    state._producer = producer  # what a save copies from now on
    if state.error is None and not state.ended:
        producer.thread.start()
    thread = producer.thread
    site = waiting.Site("the next input element")  # the consumer spins briefly when elements come quickly
    try:
        while True:
            try:
                kind, payload = waiting.get(items, site.budget(2), _POLL_SECONDS, site)
            except queue.Empty:
                if not thread.is_alive() and items.empty():
                    raise InternalError(
                        f"The {_NAME} thread ended without a result; this is a towerdist bug."
                    ) from None
                continue
            if kind == _ITEM:
                yield payload
            elif kind == _END:
                return
            else:
                payload.add_note(f"Raised in the {_NAME} background thread.")
                raise payload
    finally:
        _stop(producer, state)


def _stop(producer: _Producer, state: State) -> None:
    """Stops ``producer``'s thread: wakes it if it waits for room, and waits a bounded time for it."""
    producer.stop.set()
    thread, items = producer.thread, producer.items
    if thread.ident is None:  # never started
        return
    deadline = time.monotonic() + workers.stop_seconds(_STOP_SECONDS)
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            while True:
                items.get_nowait()  # wake a producer waiting for room
        except queue.Empty:
            pass
        thread.join(timeout=0.05)
    if thread.is_alive():
        state.release("0")  # the thread still runs the input: it closes it when it gets back
        if workers.exiting.is_set():
            return  # at exit: a thread blocked in user code does not keep the process (see workers)
        warnings.warn(
            f"The {_NAME} thread did not stop within {_STOP_SECONDS:.0f} s of its iterator being closed: the "
            f"dataset's source is blocked in user code. It will stop when that call returns.",
            ResourceWarning,
            stacklevel=3,
        )


def _drained(state: State) -> Iterator[Any]:
    """A pass without a thread restored from a prefetching one: the saved buffer, then the input."""
    buffer = state.buffer
    while buffer:
        yield buffer.pop(0)
    if state.error is not None:
        error, state.error = restore_error(state.error), None
        state.ended = True
        raise error
    if state.ended:
        return
    source = state.input()
    try:
        yield from source
    finally:
        source.close()
