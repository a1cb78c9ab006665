"""``td.data.Iterator``: one pass over a dataset, shareable by several threads, and checkpointable."""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from towerdist._src import steps
from towerdist._src.data import options as options_lib
from towerdist._src.data import saved_errors, state_codec, workers
from towerdist._src.data.continuing import Continuing
from towerdist._src.data.cursor import (
    Cursor,
    Saved,
    check_pipeline,
    pipeline_signature,
    random_state,
    restore_random_state,
)
from towerdist._src.data.optional import Optional
from towerdist._src.data.spec import ElementSpec
from towerdist._src.errors import FailedPreconditionError, OutOfRangeError, UnimplementedError
from towerdist._src.failures import unworded
from towerdist._src.type_aliases import Nest

if TYPE_CHECKING:
    from towerdist._src.data.dataset import Dataset

__all__ = [
    "EXIT_LOCK_SECONDS",
    "UNSAVABLE_HINT",
    "ClosesAtExit",
    "DatasetIterator",
    "close_at_exit",
    "external_state_check",
    "register_state_converter",
    "symbolic_checkpoint_check",
]

logger = logging.getLogger("towerdist")

HELD_ELEMENTS = 4  # elements handed out for a step not begun yet that an iterator keeps (see steps)

# Saved states of other kinds of iterator a DatasetIterator restores from, by kind: each
# converter turns such a state into a DatasetIterator position for a dataset.
_converters: dict[str, Callable[[Saved, Dataset], Saved]] = {}


def register_state_converter(kind: str, converter: Callable[[Saved, Dataset], Saved]) -> None:
    """Lets ``DatasetIterator`` restore the saved states of ``kind`` (the input package registers the
    distributed iterator's: the default strategy's input is the dataset itself)."""
    _converters[kind] = converter


class DatasetIterator:
    """An iterator over one pass of a dataset (``iter(dataset)``).

    ``next()`` raises ``StopIteration`` at the end; ``get_next()`` raises
    ``td.errors.OutOfRangeError``; ``get_next_as_optional()`` returns an empty
    ``td.experimental.Optional``. ``close()`` stops background threads early (dropping the
    iterator does too).

    An exception raised in the pipeline (by a ``map`` function, a generator, ...) comes out
    of the call that would have returned that element, after every element the pipeline read
    before it (a short batch, a shuffle buffer). Operations that hold elements past the error
    (``interleave``'s open inputs, ``group_by_window``'s windows) go on after it, as in
    TensorFlow, so later calls give those elements; elsewhere the pass ends and later calls
    report the end of the data (``docs/input.md``, "When an input element fails").

    Like a ``tf.data`` iterator, one iterator may be shared by several threads: each
    element goes to exactly one of them. It can be saved in a ``td.train.Checkpoint``
    (``td.train.Checkpoint(iterator=iterator)``): restoring it, in this process or another
    one with the same pipeline, continues with exactly the elements it would have produced.
    """

    # Saving it needs no other worker (td.train.Checkpoint's Saveable protocol).
    _checkpoint_collective = False

    def __init__(self, dataset: Dataset) -> None:
        self._dataset = dataset
        self._cursor: Cursor | None = dataset._cursor(may_continue=True)
        self._failed = False  # the pipeline raised: the pass is over
        self._pending: list[Any] = []  # elements to yield before the cursor's (restored)
        self._held: list[Any] = []  # elements handed out since the last step began (see steps)
        self._held_at = -1
        self._dropped = 0  # held elements let go (more than HELD_ELEMENTS)
        self._error_after: BaseException | None = None  # raised after the pending elements (restored)
        # Serialises the steps of the pipeline's generators, which cannot run in two threads
        # at once. Re-entrant, so that pipeline code touching its own iterator fails with
        # Python's "generator already executing" instead of a deadlock.
        self._lock = threading.RLock()
        close_at_exit(self)

    @property
    def element_spec(self) -> ElementSpec:
        """The structure of ``td.TensorSpec`` of the elements this iterator yields."""
        return self._dataset.element_spec

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Nest:
        lock = self._lock
        lock.acquire()  # (measured: acquire/try/finally costs about half of a ``with`` block here)
        try:
            if self._pending:
                element = self._pending.pop(0)
            else:
                cursor = self._cursor
                if cursor is None:
                    error, self._error_after = self._error_after, None
                    if error is not None:  # restored: the error the saved pass raised after its pending elements
                        raise error
                    raise StopIteration
                try:
                    element = next(cursor)
                except StopIteration:
                    self._cursor = None
                    raise
                except BaseException:
                    # A pass whose last operation goes on after an error (see continuing) still has a
                    # position; any other pass is over.
                    self._failed = not isinstance(cursor._elements, Continuing)
                    raise
            if steps.tracking():
                self._hold(element)
            return element
        finally:
            lock.release()

    def _hold(self, element: Nest) -> None:
        """Keeps an element handed out until a step begins, for a preemption handler's save (see ``steps``).

        An element read while a step is under way (inside its function) is that step's: not kept.
        """
        count = steps.begun()
        if count != self._held_at or steps.running():
            self._held.clear()
            self._held_at, self._dropped = count, 0
            if steps.running():
                return
        self._held.append(element)
        if len(self._held) > HELD_ELEMENTS:
            self._held.pop(0)
            self._dropped += 1

    def get_next(self) -> Nest:
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
            cursor, self._cursor = self._cursor, None
            if cursor is not None:
                cursor.close()

    def _close_at_exit(self) -> None:
        # Bounded: a (daemon) thread may be inside next() for good at exit.
        if self._lock.acquire(timeout=EXIT_LOCK_SECONDS):
            try:
                self.close()
            finally:
                self._lock.release()

    def _restart(self) -> None:
        """Ends the pass now, as ``close``, and starts a new one from the first element."""
        with self._lock:
            self.close()
            self._cursor = self._dataset._cursor(may_continue=True)
            self._failed = False
            self._pending = []
            self._held = []
            self._error_after = None

    # --- checkpointing -----------------------------------------------------------------------

    def _position(self) -> Saved:
        """Where this pass stands: a tree for ``state_codec`` (taken between elements).

        Raises:
          FailedPreconditionError: the pipeline keeps state outside itself and the dataset's
            ``experimental_external_state_policy`` is FAIL (or unset).
          UnimplementedError: an operation cannot save its position now (a Python generator
            in the middle of its pass), or cannot be saved symbolically under
            ``experimental_symbolic_checkpoint``.
        """
        workers.hold(self._lock, "a next() of this iterator in another thread")  # bounded: never hangs
        try:
            cursor = self._cursor
            unused = self._held if steps.in_preemption_save() and steps.begun() == self._held_at else []
            if unused and self._dropped:
                logger.warning(
                    "Saving an iterator that handed out %d elements since the last step began; the %d oldest are "
                    "counted as used (it keeps the newest %d for a checkpoint).",
                    len(unused) + self._dropped,
                    self._dropped,
                    HELD_ELEMENTS,
                )
            rows, _ = self._dataset._batch_rows()
            position: Saved = {
                "pipeline": pipeline_signature(self._dataset),
                "random": random_state(self._dataset),
                "pending": [*unused, *self._pending],
                "rows": rows,
                "batch_size": self._dataset._batch_size(),
                "error": None if self._error_after is None else saved_errors.save_error(self._error_after),
            }
            if cursor is None or self._failed:
                return {**position, "ended": True}
            options = self._dataset.options()
            external_state_check(cursor, options)
            if options.experimental_symbolic_checkpoint:
                symbolic_checkpoint_check(cursor)
            return {**position, "ended": False, "cursor": cursor.save()}
        finally:
            self._lock.release()

    def _restorer(self, position: Saved) -> Callable[[], None]:
        """Checks ``position`` against this iterator's pipeline and builds the pass it describes.

        Nothing changes until the returned function is called, which makes the built pass
        this iterator's (closing the current one).

        Raises:
          PipelineMismatchError: the position is not one of this pipeline.
        """
        check_pipeline(self._dataset, position["pipeline"])
        saved_cursor = position.get("cursor")
        cursor = None if position.get("ended") else self._dataset._cursor(saved_cursor, may_continue=True)
        pending = list(position.get("pending", []))
        error = position.get("error")
        error_after = None if error is None else saved_errors.restore_error(error)

        def commit() -> None:
            restore_random_state(self._dataset, position["random"])
            with self._lock:
                old, self._cursor = self._cursor, cursor
                self._failed = False
                self._pending = pending
                self._held, self._held_at, self._dropped = [], -1, 0
                self._error_after = error_after
            if old is not None:
                old.close()

        return commit

    def _checkpoint_state(self) -> bytes:
        """This iterator's position as bytes, for ``td.train.Checkpoint``.

        Raises:
          TypeError: the position holds a value of a type that cannot be saved (named).
          FailedPreconditionError: see ``_position``.
        """
        position = self._position()
        try:
            return state_codec.encode({"kind": "dataset_iterator", "position": position})
        except TypeError as error:
            raise unworded(TypeError(f"cannot save the iterator's position: {error}. {UNSAVABLE_HINT}")) from None

    def _checkpoint_restorer(self, state: bytes) -> Callable[[], None]:
        """Prepares restoring the position ``state`` (from ``_checkpoint_state``); the result commits it.

        The state of a distributed iterator restores too, where its steps were whole elements
        of this one pipeline (the default strategy's input is the dataset itself).
        """
        tree = state_codec.decode(state)
        converter = _converters.get(str(tree.get("kind"))) if isinstance(tree, dict) else None
        if converter is not None:
            return self._restorer(converter(tree, self._dataset))
        if not isinstance(tree, dict) or tree.get("kind") != "dataset_iterator":
            kind = tree.get("kind") if isinstance(tree, dict) else None
            raise unworded(
                FailedPreconditionError(
                    f"cannot restore a td.data iterator from the saved state of a {kind or 'different object'}: "
                    f"restore each iterator from the key it was saved under."
                )
            )
        return self._restorer(tree["position"])


class ClosesAtExit(Protocol):
    """An iterator that :func:`close_at_exit` closes: a dataset's, or a distributed dataset's (``input/``)."""

    def _close_at_exit(self) -> None:
        """Closes the iterator's pipeline, waiting a bounded time for a ``next()`` in another thread."""


_open_iterators: weakref.WeakSet[ClosesAtExit] = weakref.WeakSet()
EXIT_LOCK_SECONDS = 1.0  # how long closing an iterator at exit waits for a next() in another thread


def close_at_exit(iterator: ClosesAtExit) -> None:
    """Closes ``iterator`` (its ``_close_at_exit()``) when the interpreter exits, if it is still alive then.

    A pipeline left open by a program that exits (a ``sys.exit(42)`` out of a preemption
    handler, say) would otherwise be finalized while the interpreter tears its modules down,
    and its generators' cleanup would fail noisily ("Exception ignored in: <generator ...>").
    """
    _open_iterators.add(iterator)


@atexit.register
def _close_open_iterators() -> None:
    workers.exiting.set()  # first: pipeline threads stop after their element, and closing waits little for them
    for iterator in list(_open_iterators):
        try:
            iterator._close_at_exit()
        except Exception:  # noqa: BLE001 - at exit, a pipeline that fails to close must not stop the others
            logger.debug("closing an input iterator at exit failed", exc_info=True)


UNSAVABLE_HINT = (
    "An iterator's position holds the elements its operations buffer (shuffle, prefetch, ...): numpy arrays, "
    "numbers, strings, and tuples, namedtuples and dicts of them"
)


def external_state_check(cursor: Cursor, options: options_lib.Options) -> None:
    """Applies ``options.experimental_external_state_policy`` to the nodes of ``cursor``'s tree whose
    state lives outside the pipeline, as TensorFlow applies it when a checkpoint saves an iterator:
    unset or FAIL raises, WARN logs a warning, IGNORE says nothing (and the save goes on: such a
    node then saves what it can, or raises ``UnimplementedError`` itself)."""
    found = sorted({reason for reason in _external_states(cursor)})
    if not found:
        return
    policy = options.experimental_external_state_policy
    described = "; ".join(found)
    if policy is None or policy == options_lib.ExternalStatePolicy.FAIL:
        setting = "FAIL" if policy is not None else "unset, which means FAIL for a checkpoint"
        raise unworded(
            FailedPreconditionError(
                f"cannot save the iterator: its pipeline keeps state outside itself ({described}), which a "
                f"checkpoint cannot hold (experimental_external_state_policy is {setting}). Build the input from "
                f"datasets that read the data themselves (from_tensor_slices, TextLineDataset, Dataset.load, ...), "
                f"or set the policy to WARN or IGNORE to save the position without that state."
            )
        )
    if policy == options_lib.ExternalStatePolicy.WARN:
        logger.warning(
            "Saving the iterator's position without the state its pipeline keeps outside itself: %s. "
            "(td.data.Options.experimental_external_state_policy=WARN; IGNORE saves without this warning.)",
            described,
        )


def symbolic_checkpoint_check(cursor: Cursor) -> None:
    """Raises ``UnimplementedError`` naming the first node of ``cursor``'s tree that TensorFlow cannot
    checkpoint symbolically (``Options.experimental_symbolic_checkpoint``)."""
    for node in _live_nodes(cursor):
        if not node._symbolic_checkpoint():
            raise unworded(
                UnimplementedError(
                    f"cannot save the iterator: {node._state_name()} does not support symbolic checkpointing "
                    f"(td.data.Options.experimental_symbolic_checkpoint=True), as in TensorFlow. Unset the option to "
                    f"save its position explicitly."
                )
            )


def _external_states(cursor: Cursor) -> list[str]:
    return [reason for node in _live_nodes(cursor) if (reason := node._external_state()) is not None]


def _live_nodes(cursor: Cursor) -> Iterator[Dataset]:
    """The nodes whose passes a save of ``cursor`` covers: the node of every pass in the tree, and every
    node under a pass that has not started (TensorFlow makes those iterators when their parent's is made;
    towerdist opens them at the parent's first element)."""
    stack = [cursor]
    while stack:
        current = stack.pop()
        if not current.state.resumed and not current.state.begun():
            yield from current.node._walk()
            continue
        yield current.node
        stack.extend(current.state.children())
