"""Running the parts of one job on several threads (used for large CPU reductions).

A reduction of big host buffers is memory-bandwidth bound, and one numpy call uses one
core. When the calling thread has *helpers* — replica threads that are idle or parked at
the barrier while this thread runs a ``merge_fn`` — :func:`run_parts` hands them parts of
the job and does one part itself. Without helpers every part runs on the calling thread.

Helpers are threads with a mailbox (a ``queue.SimpleQueue``) that understand
``(TASK, job, part)`` messages. A caller passes them explicitly (``helpers=``: the
mailboxes, or a callable that lends them on first use, as the strategies' collectives do);
without it, :func:`run_parts` uses this thread's, which the barrier sets for a ``merge_fn``
and :func:`helpers_installed` for a block.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

from towerdist._src import thread_state
from towerdist._src.mailbox import TASK

__all__ = ["TASK", "THIS_THREAD", "Helpers", "Job", "helpers_installed", "max_parts", "no_helpers", "run_parts"]

_CPU_COUNT = os.cpu_count() or 1

Helpers: TypeAlias = Sequence[Any] | Callable[[], Sequence[Any]] | None
"""Threads to lend parts to: their mailboxes, a callable returning them (asked on first use), or None."""


class _ThisThread:
    def __repr__(self) -> str:
        return "THIS_THREAD"


THIS_THREAD: Any = _ThisThread()
"""``helpers=`` default: this thread's helpers (``thread_state``), e.g. those of a ``merge_fn``."""


class Job:
    """One parallel job: ``fn(part)`` for every part; collects completion and errors."""

    __slots__ = ("_done", "_errors", "_lock", "_remaining", "fn")

    def __init__(self, fn: Callable[[int], None], helper_parts: int) -> None:
        self.fn = fn
        self._lock = threading.Lock()
        self._remaining = helper_parts
        self._errors: list[BaseException] = []
        self._done: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def run_part(self, part: int) -> None:
        """Runs one part on the calling (helper) thread and reports its completion."""
        try:
            self.fn(part)
        except BaseException as error:  # reported to the thread that owns the job
            with self._lock:
                self._errors.append(error)
        finally:
            with self._lock:
                self._remaining -= 1
                last = self._remaining == 0
            if last:
                self._done.put(True)

    def wait(self, raise_errors: bool = True) -> None:
        """Waits for the helpers' parts; re-raises the first error one of them hit."""
        if self._remaining:
            self._done.get()
        if self._errors and raise_errors:
            raise self._errors[0]


def max_parts(helpers: Helpers = THIS_THREAD) -> int:
    """How many parts :func:`run_parts` can run at once with ``helpers`` (by default this thread's)."""
    helpers = _helpers(helpers)
    return min(len(helpers) + 1, _CPU_COUNT) if helpers else 1


def run_parts(fn: Callable[[int], None], num_parts: int, helpers: Helpers = THIS_THREAD) -> None:
    """Runs ``fn(part)`` for ``part in range(num_parts)``, in parallel where ``helpers`` allow.

    ``helpers``: by default this thread's. Returns when every part is done. An exception in
    any part is re-raised here.
    """
    helpers = _helpers(helpers) if num_parts > 1 else ()  # (asked only for a job in parts)
    if not helpers:
        for part in range(num_parts):
            fn(part)
        return
    usable = helpers[: num_parts - 1]
    job = Job(fn, helper_parts=len(usable))
    for part, mailbox in enumerate(usable, start=1):
        mailbox.put((TASK, job, part))
    try:
        fn(0)
        for part in range(len(usable) + 1, num_parts):
            fn(part)
    except BaseException:
        job.wait(raise_errors=False)  # this thread's own error wins
        raise
    job.wait()


def _helpers(provider: Helpers) -> Sequence[Any]:
    if provider is THIS_THREAD:
        provider = thread_state.state.helpers
    if provider is None:
        return ()
    helpers: Sequence[Any] = provider() if callable(provider) else provider
    return helpers


@contextmanager
def helpers_installed(helpers: Helpers) -> Iterator[None]:
    """Lets this thread use ``helpers`` (mailboxes, or a callable returning them) in the block.

    Helpers already installed on this thread take precedence: a ``merge_fn`` that calls
    ``strategy.reduce`` keeps using the parked replica threads it was given.
    """
    state = thread_state.state
    if state.helpers is not None or helpers is None:
        yield
        return
    state.helpers = helpers
    try:
        yield
    finally:
        state.helpers = None


@contextmanager
def no_helpers() -> Iterator[None]:
    """Runs the block on this thread alone: parallel jobs in it run their parts serially.

    For a part of a parallel job, which must not borrow threads of its own.
    """
    state = thread_state.state
    saved = state.helpers
    state.helpers = ()
    try:
        yield
    finally:
        state.helpers = saved
