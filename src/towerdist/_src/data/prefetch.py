"""``prefetch``: a background thread that produces elements ahead of the consumer."""

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
from towerdist._src.data.cursor import State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.structure import close_iterator
from towerdist._src.data.transforms import _int_arg, _Transparent
from towerdist._src.errors import InternalError, InvalidArgumentError

__all__ = ["PrefetchDataset", "background"]

_AUTOTUNE_BUFFER = 2
_POLL_SECONDS = 1.0  # how often a waiting consumer checks that the producer is alive
_STOP_SECONDS = 10.0  # how long closing waits for a producer stuck in user code

_ITEM, _END, _ERROR = 0, 1, 2
_DONE = object()


class PrefetchDataset(_Transparent):
    def __init__(self, input_dataset: Dataset, buffer_size: Any) -> None:
        self._inputs = (input_dataset,)
        size = _int_arg(buffer_size, "buffer_size")
        if size < 0 and size != options_lib.AUTOTUNE:
            raise InvalidArgumentError(
                f"buffer_size must be >= 0 or set buffer_size to be -1 for auto-tuning. Got buffer_size={size}."
            )
        self._buffer_size = _AUTOTUNE_BUFFER if size == options_lib.AUTOTUNE else size

    def _iterate(self, state: State) -> Iterator[Any]:
        if self._buffer_size == 0:
            return self._inputs[0]._cursor()
        return background(self._inputs[0]._cursor, self._buffer_size)

    def _gather_plan(self) -> None:
        return None  # the thread must run on the real elements


def background(make_source: Any, buffer_size: int, name: str = "towerdist-prefetch") -> Iterator[Any]:
    """Iterates ``make_source()`` on a thread, ``buffer_size`` elements ahead.

    The thread starts on the first ``next()``. It ends when the source ends or raises (the
    exception comes out of ``next()`` here), and when the consumer closes or drops this
    generator: then the buffer is drained so that a blocked producer wakes up, sees the stop
    flag and closes its source.
    """
    items: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=buffer_size)
    stop = threading.Event()

    def produce() -> None:
        source = None
        busy = workers.Busy()  # exit waits for an element being made (see workers), not for a full buffer
        try:
            with busy:
                source = make_source()
            while not workers.exiting.is_set():  # at exit: the element being made, not a full buffer
                with busy:
                    element = next(source, _DONE)
                if element is _DONE:
                    break
                items.put((_ITEM, element))
                if stop.is_set():
                    return
            items.put((_END, None))
        except BaseException as error:  # handed to the consumer, never lost
            items.put((_ERROR, error))
        finally:
            if not workers.exiting.is_set():
                with busy:
                    close_iterator(source)

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    site = waiting.Site("the next input element")  # the consumer spins briefly when elements come quickly
    try:
        while True:
            try:
                kind, payload = waiting.get(items, site.budget(2), _POLL_SECONDS, site)
            except queue.Empty:
                if not thread.is_alive() and items.empty():
                    raise InternalError(f"The {name} thread ended without a result; this is a towerdist bug.") from None
                continue
            if kind == _ITEM:
                yield payload
            elif kind == _END:
                return
            else:
                payload.add_note(f"Raised in the {name} background thread.")
                raise payload
    finally:
        stop.set()
        deadline = time.monotonic() + _STOP_SECONDS
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                while True:
                    items.get_nowait()  # wake a producer blocked on a full buffer
            except queue.Empty:
                pass
            thread.join(timeout=0.05)
        if thread.is_alive():
            warnings.warn(
                f"The {name} thread did not stop within {_STOP_SECONDS:.0f} s of its iterator being closed: the "
                f"dataset's source is blocked in user code. It will stop when that call returns.",
                ResourceWarning,
                stacklevel=2,
            )
