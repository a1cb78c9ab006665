"""The training steps this process has begun, as its input iterators see them.

A ``PreemptionCheckpointHandler`` saves *before* the step it is given: in TensorFlow's loop
``handler.run(train_step, next(iterator))`` the batch of that step was drawn, and will never
be trained, when the handler saves and exits. So that the restarted job trains it, input
iterators keep what they handed out since the last step began (``strategy.run``), and a save
made by the handler (:func:`preemption_save`) saves it as not yet used. Every other save
counts what was handed out as used, as TensorFlow does.

Strategies count the steps they begin with :func:`begin` and :func:`end` (``Strategy.run``,
``call_for_each_replica``, ``call_for_each_tower``); what an iterator hands out while a step
is under way (a ``td.data`` iterator read inside the step function) is that step's. Distributed iterators always keep their
handed-out steps (one reference per step, few); a ``td.data`` iterator keeps its elements
only once a handler exists in the process (:func:`track`), so that plain iteration pays
nothing for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["begin", "begun", "end", "in_preemption_save", "preemption_save", "running", "track", "tracking"]

_count = 0  # steps begun (+= from several threads may lose a count: only inequality is ever compared)
_running = 0  # steps under way (what a td.data iterator read inside a step hands to that step)
_tracking = False
_saving = threading.local()


def begin() -> None:
    """A strategy begins a step (runs a function on its replicas); :func:`end` when it returns."""
    global _count, _running
    _count += 1
    _running += 1


def end() -> None:
    """The step :func:`begin` began has returned (or raised)."""
    global _running
    _running -= 1


def running() -> bool:
    """True while a step is under way (an element read now is that step's)."""
    return _running > 0


def begun() -> int:
    """How many steps the strategies of this process have begun."""
    return _count


def track(on: bool = True) -> None:
    """Makes ``td.data`` iterators keep the elements they hand out for a step not begun yet (a handler exists)."""
    global _tracking
    _tracking = on


def tracking() -> bool:
    return _tracking


@contextlib.contextmanager
def preemption_save() -> Iterator[None]:
    """The saves made in this block (by the preemption handler, in this thread) keep the handed-out
    batches of the step not begun yet as unused."""
    previous = getattr(_saving, "active", False)
    _saving.active = True
    try:
        yield
    finally:
        _saving.active = previous


def in_preemption_save() -> bool:
    return bool(getattr(_saving, "active", False))
