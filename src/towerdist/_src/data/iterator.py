"""``td.data.Iterator``: one pass over a dataset, shareable by several threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from towerdist._src.data.optional import Optional
from towerdist._src.errors import OutOfRangeError

if TYPE_CHECKING:
    from towerdist._src.data.dataset import Dataset

__all__ = ["DatasetIterator"]


class DatasetIterator:
    """An iterator over one pass of a dataset (``iter(dataset)``).

    ``next()`` raises ``StopIteration`` at the end; ``get_next()`` raises
    ``td.errors.OutOfRangeError``; ``get_next_as_optional()`` returns an empty
    ``td.experimental.Optional``. ``close()`` stops background threads early (dropping the
    iterator does too).

    An exception raised in the pipeline (by a ``map`` function, a generator, ...) comes out
    of the call that would have returned that element; the pass then ends, and later calls
    report the end of the data.

    Like a ``tf.data`` iterator, one iterator may be shared by several threads: each
    element goes to exactly one of them.
    """

    def __init__(self, dataset: Dataset) -> None:
        self._dataset = dataset
        self._iterator: Iterator[Any] | None = dataset._iterate()
        # Serialises the steps of the pipeline's generators, which cannot run in two threads
        # at once. Re-entrant, so that pipeline code touching its own iterator fails with
        # Python's "generator already executing" instead of a deadlock.
        self._lock = threading.RLock()

    @property
    def element_spec(self) -> Any:
        """The structure of ``td.TensorSpec`` of the elements this iterator yields."""
        return self._dataset.element_spec

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        lock = self._lock
        lock.acquire()  # (measured: acquire/try/finally costs about half of a ``with`` block here)
        try:
            iterator = self._iterator
            if iterator is None:
                raise StopIteration
            try:
                return next(iterator)
            except StopIteration:
                self._iterator = None
                raise
        finally:
            lock.release()

    def get_next(self) -> Any:
        """The next element; raises ``td.errors.OutOfRangeError`` at the end."""
        try:
            return next(self)
        except StopIteration:
            raise OutOfRangeError("End of sequence") from None

    def get_next_as_optional(self) -> Optional:
        """The next element as an ``Optional`` that is empty at the end.

        Example:
          >>> iterator = iter(td.data.Dataset.range(3))
          >>> optional = iterator.get_next_as_optional()
          >>> while optional.has_value():
          ...     element = optional.get_value()
          ...     optional = iterator.get_next_as_optional()
        """
        spec = self._dataset._spec(probe=False)
        try:
            return Optional(next(self), spec)
        except StopIteration:
            return Optional.empty(spec)

    def close(self) -> None:
        """Ends the pass now and stops any background threads it started.

        A ``next()`` running in another thread finishes first.
        """
        with self._lock:
            iterator, self._iterator = self._iterator, None
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def _restart(self) -> None:
        """Ends the pass now, as ``close``, and starts a new one from the first element."""
        with self._lock:
            self.close()
            self._iterator = self._dataset._iterate()
