"""A pool of daemon threads for the transformations that run user code in parallel.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits. A
thread of a parallel ``map`` or ``interleave`` runs user code (a generator waiting on a
queue, a socket read), and one blocked there for good would keep the process alive forever
after the main thread returned. :class:`DaemonPool` runs its tasks on daemon threads, as
``prefetch`` runs its producer: the interpreter exits without waiting for them. Closing a
pipeline cancels its queued tasks and waits a bounded time for the running ones
(:func:`wait_or_warn`); a task still blocked then is left to finish on its own.

**Exiting.** A daemon thread that is still running Python when the interpreter finalizes is
ended where it next takes the GIL, by a forced stack unwind; when that stack holds C++ frames
(optree's, which call back into Python) the C++ runtime aborts the process ("terminate called
without an active exception", observed with a parallel ``map`` still working at exit). So at
exit (:func:`_drain_at_exit`, an ``atexit`` hook) the pools stop taking tasks and exit waits
for the threads still running pipeline code (:class:`Busy`) to finish their element. A thread
whose CPU clock stands still for :data:`_EXIT_STALL_SECONDS` is blocked (in user code: a
wait, a read) and is not waited for: blocked there, with only Python's C frames under it, it
never takes the GIL again and the process exits cleanly.

**Saving.** A thread that iterates an input (a ``prefetch`` producer, a parallel
``interleave`` worker) holds a lock of its own while it makes one element and buffers it;
saving the iterator's position takes that lock (:func:`hold`), so that the input's position
and the buffer are copied between two elements. A save thus waits for at most the element
under way, and a bounded time: :data:`SAVE_SECONDS`, then it fails naming the thread.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from towerdist._src.errors import DeadlineExceededError, InternalError
from towerdist._src.failures import unworded

__all__ = ["SAVE_SECONDS", "Busy", "DaemonPool", "hold", "wait_or_warn"]

logger = logging.getLogger("towerdist")

T = TypeVar("T")

_EXIT_STALL_SECONDS = 0.2  # at exit, a busy thread whose CPU clock stood still this long is blocked, not working
_EXIT_SECONDS = 10.0  # the longest exit waits for busy threads to finish their element
_EXIT_CLOSE_SECONDS = 0.2  # at exit, how long closing one pipeline waits for its threads (then _drain_at_exit)
_POLL_SECONDS = 0.01
SAVE_SECONDS = 60.0  # the longest a save waits for a thread to finish the element it is making
_SAVE_WARNING_SECONDS = 5.0  # ... and when it says so in the log

_busy_threads: set[threading.Thread] = set()  # threads inside pipeline code now (set ops are atomic under the GIL)
exiting = threading.Event()  # set at interpreter exit: background producers stop before their next element
_pools: weakref.WeakSet[DaemonPool] = weakref.WeakSet()

_Task = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]]


class DaemonPool:
    """Runs submitted calls on up to ``max_workers`` daemon threads named ``f"{name}_{k}"``.

    The submit/shutdown half of ``ThreadPoolExecutor``'s interface, so that the callers read
    the same; ``shutdown`` never waits.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by a thread each time it finishes a task
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False
        _pools.add(self)

    def submit(self, fn: Callable[..., T], /, *args: object) -> Future[T]:
        """Runs ``fn(*args)`` on a pool thread; its outcome lands in the returned future."""
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise InternalError(
                    f"The {self._name} pool took a task after it was shut down (by closing its iterator, or at "
                    f"interpreter exit)."
                )
            self._tasks.put((future, fn, args))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            future, fn, args = task
            del task
            if future.set_running_or_notify_cancel():
                try:
                    with Busy():
                        result = fn(*args)
                except BaseException as error:  # kept in the future for the consumer, never lost
                    future.set_exception(error)
                else:
                    future.set_result(result)
            del future, fn, args  # a finished task's objects must not live on with an idle thread
            self._idle.release()

    def shutdown(self) -> None:
        """Cancels the queued calls; each thread ends after the call it runs now. Does not wait."""
        with self._lock:
            self._shut = True
            while True:
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    task[0].cancel()
            for _ in self._threads:
                self._tasks.put(None)


def stop_seconds(seconds: float) -> float:
    """How long closing a pipeline waits for a thread to finish its element: ``seconds``, but at
    interpreter exit only :data:`_EXIT_CLOSE_SECONDS` (the exit hook then waits for the threads
    still working, and not for those blocked in user code: see the module docstring)."""
    return min(seconds, _EXIT_CLOSE_SECONDS) if exiting.is_set() else seconds


def wait_or_warn(futures: Iterable[Future[Any]], seconds: float, what: str) -> None:
    """Waits up to ``seconds`` for ``futures``; warns (``ResourceWarning``) about those still running.

    ``what`` names the tasks in the warning, e.g. ``"Dataset.map() call(s)"``. At exit the wait
    is short and nothing is warned about (see :func:`stop_seconds`).
    """
    seconds = stop_seconds(seconds)
    _, stuck = wait(list(futures), timeout=seconds)
    if stuck and not exiting.is_set():
        warnings.warn(
            f"{len(stuck)} {what} did not stop within {seconds:g} s of the iterator being closed: user code is "
            f"blocked. The daemon thread running it stops when that call returns, and does not keep the process "
            f"from exiting.",
            ResourceWarning,
            stacklevel=3,
        )


def hold(lock: threading.Lock | threading.RLock, what: str) -> None:
    """Takes ``lock``, which ``what`` (a thread, e.g. ``"the Dataset.prefetch() thread"``) holds
    while it makes one element, for a save of the iterator's position.

    Logs a warning after :data:`_SAVE_WARNING_SECONDS` and fails after :data:`SAVE_SECONDS`
    (both read when called).

    Raises:
      DeadlineExceededError: ``what`` did not finish its element within :data:`SAVE_SECONDS`.
    """
    if lock.acquire(timeout=min(_SAVE_WARNING_SECONDS, SAVE_SECONDS)):
        return
    if SAVE_SECONDS > _SAVE_WARNING_SECONDS:
        logger.warning(
            "Saving the iterator has waited %g s for %s to finish the element it is making (its input runs user "
            "code: a map function, a generator, a file read). The save fails after %g s.",
            _SAVE_WARNING_SECONDS,
            what,
            SAVE_SECONDS,
        )
        if lock.acquire(timeout=SAVE_SECONDS - _SAVE_WARNING_SECONDS):
            return
    raise unworded(
        DeadlineExceededError(
            f"cannot save the iterator: it waited {SAVE_SECONDS:g} s for {what} to finish the element it is making, "
            f"and a position is taken between two elements. The input is blocked in user code (a map function, a "
            f"generator, a file read): save again once that call returns."
        )
    )


class Busy:
    """``with Busy():`` marks the calling (daemon) thread as running pipeline code, which exit waits for.

    Made once per thread and entered per element: entering costs two set operations.
    """

    __slots__ = ("_thread",)

    def __init__(self) -> None:
        self._thread = threading.current_thread()

    def __enter__(self) -> None:
        _busy_threads.add(self._thread)

    def __exit__(self, *exc_info: object) -> None:
        _busy_threads.discard(self._thread)


def _cpu_clock(thread: threading.Thread) -> float | None:
    """The CPU time ``thread`` has used, or None where it cannot be read (ended, or no such clock here)."""
    if thread.ident is None or not hasattr(time, "pthread_getcpuclockid"):  # not on Windows
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, ValueError):  # the thread ended meanwhile
        return None


@atexit.register
def _drain_at_exit() -> None:
    """Stops the pools and waits for the busy threads (see the module docstring), at most :data:`_EXIT_SECONDS`."""
    exiting.set()
    for pool in list(_pools):
        pool.shutdown()
    deadline = time.monotonic() + _EXIT_SECONDS
    progress: dict[threading.Thread, tuple[float | None, float]] = {}  # CPU clock, when it last moved
    while time.monotonic() < deadline:
        now = time.monotonic()
        waiting = False
        for thread in list(_busy_threads):
            clock = _cpu_clock(thread)
            last_clock, moved = progress.get(thread, (None, now))
            if clock is not None and clock != last_clock:
                moved = now  # (a clock that cannot be read counts as standing still from the first look)
            progress[thread] = (clock, moved)
            if now - moved < _EXIT_STALL_SECONDS:
                waiting = True
        if not waiting:
            return
        time.sleep(_POLL_SECONDS)
