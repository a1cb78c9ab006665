"""Deferred restoration: saved values that wait for their object, and receive it when it is attached.

As in TensorFlow, ``Checkpoint.restore()`` assigns the values of the objects that exist;
a value whose object does not exist yet waits, and the object takes it when it is
attached: assigned to the checkpoint (``ckpt.v = td.Variable(...)``) or created in a
tracked ``td.Module`` (``self.w = td.Variable(...)`` in a lazily built layer, a
sub-module, a list or dict assigned to an attribute). The same holds for an input
iterator attached after the restore, and for ``save_counter``, which ``restore()``
creates after reading (so that it takes the saved count).

Each ``restore()`` makes a :class:`Restore`: the values it read and which of them went
to an object. While it has waiting values it stays registered here, for as long as its
checkpoint or one of the checkpoint's objects lives (TensorFlow keeps waiting values
with the objects, so ``td.train.Checkpoint(model=model).restore(path)`` works even
though the checkpoint object is dropped at once). An attribute assignment in a module or
checkpoint (:func:`attached`) that one of them reaches makes it walk its objects again
and hand each waiting value whose object now exists to it, checked first and all or
nothing, as a restore does (a value that does not fit raises from the assignment, which
is undone). When several restores wait with a value for the same object, the most recent
one wins. A value goes to one object once: an object that replaces one that already
received its value does not receive it again.

A list or dict mutated in place (``layers.append(layer)``) assigns no attribute: what it
gained receives its value at the next attribute assignment in the checkpoint's objects
(a plain Python list cannot announce its changes without becoming a subclass, which
``optree``, and so ``td.nest``, would no longer treat as a list).

When a restore with values that never found their object is deleted (its checkpoint,
its objects and its status gone) without ``status.expect_partial()``, the ``towerdist``
logger warns, listing them, as TensorFlow does.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src.checkpoint import graph, restoring, saving
from towerdist._src.checkpoint.saveable import is_saveable
from towerdist._src.variables.variable import Variable

if TYPE_CHECKING:  # checkpoint.py imports this module
    from towerdist._src.checkpoint.checkpoint import Checkpoint

__all__ = ["Restore", "attached", "waiting"]

logger = logging.getLogger("towerdist")
_uids = itertools.count(1)
_waiting: set[Restore] = set()  # restores with values waiting for their objects
# One catch-up at a time: modules may be built on several replica threads at once (variables
# created inside strategy.run), each assigning the same shared variable to its attribute.
_lock = threading.RLock()


class _Unused:
    """What the warning on deletion needs (shared with the finalizer, which must not hold the Restore)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.keys: set[str] = set()  # saved values that went to no object (yet)
        self.expect_partial = False


class Restore:
    """One ``restore()``/``read()``: the values it read and which went to an object.

    Args:
      checkpoint: the restoring checkpoint (held weakly); its ``_checkpoint_dependencies()``
        are the objects walked.
      prefix: the checkpoint's path prefix.
      entries: every saved entry, by key.
      arrays: every saved array, by key.
      consumed: the keys whose values went to an object (or to an optimizer for a slot).
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        prefix: str,
        entries: dict[str, Any],
        arrays: dict[str, np.ndarray],
        consumed: set[str],
    ) -> None:
        self.uid = next(_uids)
        self.prefix = prefix
        self.entries = entries
        self.consumed = set(consumed)
        self.waiting = {key: arrays[key] for key in entries if key not in consumed}
        self.slots: dict[str, tuple[Any, Any]] = {}  # slot values handed to their optimizers: (optimizer, slot)
        self.visited: set[int] = set()  # id() of what the last walk reached: attachments there matter
        self._unused = _Unused(prefix)
        self._unused.keys.update(self.waiting)
        weakref.finalize(self, _warn_unused, self._unused).atexit = False
        self._checkpoint = weakref.ref(checkpoint)
        self._roots: list[tuple[str, Any]] = []  # the checkpoint's objects, for when it is gone

    def expect_partial(self) -> None:
        """Silences the warning on deletion about values that found no object."""
        self._unused.expect_partial = True

    def consume(self, keys: set[str]) -> None:
        """Records that the values of ``keys`` went to their objects (no longer waiting)."""
        self.consumed |= keys
        for key in keys:
            self.waiting.pop(key, None)
            self._unused.keys.discard(key)
        if not self.waiting:
            _waiting.discard(self)

    def wait(self, found: graph.Graph) -> None:
        """Registers the waiting values (if any), kept while the checkpoint or one of its objects lives.

        ``found`` is the walk of the checkpoint's objects the restore matched against.
        """
        if not self.waiting:
            return
        me = weakref.ref(self)

        def gone(_: object) -> None:
            restore = me()
            if restore is not None and restore.objects() is None:
                _waiting.discard(restore)

        checkpoint = self._checkpoint()
        if checkpoint is None:
            return
        self._checkpoint = weakref.ref(checkpoint, gone)
        for name, value in checkpoint._checkpoint_dependencies():
            try:
                self._roots.append((name, weakref.ref(value, gone)))
            except TypeError:  # a list, tuple or dict: held while the restore waits
                self._roots.append((name, value))
        self.visited = found.visited | {id(checkpoint)}
        with _lock:
            _waiting.add(self)

    def objects(self) -> list[tuple[str, Any]] | None:
        """The objects to walk now: the checkpoint's, or once it is gone, those of its objects that live (None: none)."""
        checkpoint = self._checkpoint()
        if checkpoint is not None:
            return list(checkpoint._checkpoint_dependencies())
        if not any(isinstance(ref, weakref.ref) and ref() is not None for _, ref in self._roots):
            return None
        alive = [(name, ref() if isinstance(ref, weakref.ref) else ref) for name, ref in self._roots]
        return [(name, value) for name, value in alive if value is not None]

    def walk(self) -> graph.Graph | None:
        """The walk of :meth:`objects` (None once they are all gone); remembers what it reached."""
        objects = self.objects()
        if objects is None:
            return None
        found = graph.walk(objects)
        self.visited = found.visited | {id(self._checkpoint())}
        return found


def waiting() -> int:
    """How many restores have values waiting for their objects (for tests and diagnostics)."""
    return len(_waiting)


def attached(owner: object, value: object) -> None:
    """Hands waiting values to the objects that setting an attribute of ``owner`` to ``value`` made reachable.

    Costs a set lookup when no restore waits, or when ``value`` holds nothing a checkpoint
    saves; otherwise only restores that reach ``owner`` walk their objects again.

    Raises:
      ValueError: a waiting value does not fit its object (shape, dtype); nothing changed.
      Exception: what a saveable's restorer raised; nothing changed.
    """
    if not _waiting or not _holds_savable(value):
        return
    with _lock:
        # (a copy: a weakref callback may drop a restore meanwhile; set.copy() runs no Python code)
        concerned = [restore for restore in _waiting.copy() if id(owner) in restore.visited]
        if concerned:
            catch_up(concerned)


def catch_up(restores: list[Restore]) -> None:
    """Hands the waiting values of ``restores`` to the objects that now exist: newest restore first, all or nothing."""
    claimed: set[int] = set()  # id() of the objects a newer restore gives a value to
    prepared: list[tuple[Restore, restoring.Plan]] = []
    skipped: list[tuple[Restore, set[str]]] = []
    for restore in sorted(restores, key=lambda r: r.uid, reverse=True):
        found = restore.walk()
        if found is None:
            _waiting.discard(restore)
            continue
        live: dict[str, Any] = {**saving.saved_variables(found, strict=False), **found.saveables}
        taken_elsewhere = {key for key in restore.waiting if key in live and id(live[key]) in claimed}
        keys = set(restore.waiting) - taken_elsewhere
        entries = {key: restore.entries[key] for key in keys}
        arrays = {key: restore.waiting[key] for key in keys}
        plan = restoring.prepare(found, entries, arrays, restore.prefix, collective=False)
        prepared.append((restore, plan))
        skipped.append((restore, taken_elsewhere))
        claimed |= {id(live[key]) for key in plan.matched if key in live}
    for restore, plan in prepared:
        restoring.apply(plan)
        restore.slots.update(plan.deferred_keys)
        restore.consume(plan.matched | set(plan.deferred_keys))
    for restore, keys in skipped:  # a newer restore gave these objects their values
        restore.consume(keys)


def _holds_savable(value: object) -> bool:
    """Whether ``value`` is, or contains, something a checkpoint saves or walks into."""
    if isinstance(value, Variable) or hasattr(value, "_checkpoint_dependencies") or is_saveable(value):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_savable(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_savable(item) for item in value.values())
    return False


def _warn_unused(unused: _Unused) -> None:
    """TensorFlow's warnings when a restore is deleted with values that found no object."""
    if unused.expect_partial or not unused.keys:
        return
    logger.warning(
        "Detecting that an object or model or td.train.Checkpoint is being deleted with unrestored values. See "
        "the following logs for the specific values in question. To silence these warnings, use "
        "`status.expect_partial()`, the status being what Checkpoint.restore() returned."
    )
    for key in sorted(unused.keys):
        logger.warning("Value in checkpoint %s could not be found in the restored object: %s", unused.prefix, key)
