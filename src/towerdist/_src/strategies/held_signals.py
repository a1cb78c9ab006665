"""Signal handlers held back while the caller (the main thread) is parked as replica 0.

The caller of ``strategy.run`` runs replica 0 and, at a barrier, parks in its mailbox. Python
runs a signal's handler between any two bytecodes, so an exception it raises
(``KeyboardInterrupt``, a test runner's timeout) could land just after a message was taken
out of the mailbox and lose it. While parked, the handlers only record the signal and post
``INTERRUPTED``; the park loop runs them between two messages (``strategies/replica_step.py``).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C functions (no enum wrapping: see _HELD_SIGNALS)
import contextlib
import queue
import signal
import types
from collections.abc import Iterator
from typing import Any

from towerdist._src.mailbox import INTERRUPTED

__all__ = ["interrupts_held", "run_held_handler"]

# The signals whose Python handlers are held while the caller is parked (those a program or
# a test runner commonly handles: Ctrl-C, a scheduler's stop, pytest-timeout's alarm, ...).
# Plain numbers: the park runs every step, so it calls ``_signal`` directly (measured on a 2-core
# AMD EPYC VM: ~24 us per step through ``signal``'s enum conversions, a few us without them).
_HELD_SIGNALS = tuple(
    int(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGALRM", "SIGHUP", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)


@contextlib.contextmanager
def interrupts_held(mailbox: queue.SimpleQueue[Any]) -> Iterator[list[Any]]:
    """Holds signal handlers back while the caller (the main thread) is parked as replica 0.

    Python raises an exception from a signal handler (``KeyboardInterrupt``, ...) between any
    two bytecodes, so one landing just after a message was taken out of the mailbox would
    lose it (a ``RESUME``: the caller would wait forever; a ``TASK``: the replica settling
    the round would). While parked, each Python-level handler of ``_HELD_SIGNALS`` only
    records its signal and posts ``INTERRUPTED``; the park loop runs the original handler
    when it reads that message, between two messages. ``SIG_DFL``/``SIG_IGN`` are left alone.
    """
    held: list[Any] = []
    replaced: list[tuple[int, Any]] = []
    for signum in _HELD_SIGNALS:
        previous = _signal.getsignal(signum)
        if callable(previous):
            replaced.append((signum, previous))
    if not replaced:
        yield held
        return

    def hold(signum: int, frame: types.FrameType | None) -> None:
        held.append((dict(replaced)[signum], signum, frame))
        mailbox.put((INTERRUPTED,))

    for signum, _ in replaced:
        _signal.signal(signum, hold)
    try:
        yield held
    finally:
        for signum, previous in replaced:
            _signal.signal(signum, previous)
        if held:  # still pending (the park ended first): the handlers run now, outside the wait
            run_held_handler(held)


def run_held_handler(held: list[Any]) -> None:
    """Runs the handlers of the signals held so far, oldest first."""
    while held:
        handler, signum, frame = held.pop(0)
        handler(signum, frame)
