"""The timeline: a Chrome trace-event recorder for ``strategy.run`` steps.

``start(logdir)`` turns recording on, ``stop()`` writes what was recorded to
``<logdir>/<host>_<pid>[.rank<r>].trace.json`` (the Chrome trace-event format, which
Perfetto and ``chrome://tracing`` open) and turns it off. In between, the instrumented
places of towerdist (``barrier.py``, ``replica_threads.py``, ``communicator.py``,
``distributed_dataset.py``) add *complete* events (phase ``"X"``, ``ts``/``dur`` in µs)
on the track (``tid``) of the thread they happen on; ``stop`` adds the metadata events
(phase ``"M"``) naming the process and each track.

**Cost when off.** Every instrumented place first reads the module global :data:`active`
(one attribute load and a branch), and does nothing else when it is false.

**Recording.** Events are appended to a plain list (``list.append`` is atomic under the
GIL) as tuples; they are turned into JSON objects only when the trace is written.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from towerdist._src.errors import AlreadyExistsError, UnavailableError

__all__ = ["Span", "Trace", "active", "name_replica_thread", "now", "start", "stop", "trace_path"]

active: bool = False
"""Whether a profiler is running (read by every instrumented place before doing anything)."""

# (name, thread ident, start ns, end ns, args or None), in the order they ended.
_events: list[tuple[str, int, int, int, dict[str, Any] | None]] = []
_thread_names: dict[int, str] = {}  # thread ident -> track name
_lock = threading.Lock()  # start/stop
_logdir: str | None = None
_origin_ns = 0  # perf_counter_ns() at start: ts 0
_origin_wall_us = 0.0  # the wall clock at start, for lining up the files of several ranks

now: Callable[[], int] = time.perf_counter_ns


def start(logdir: str | os.PathLike[str], options: Any = None) -> None:
    """Starts recording a timeline to be written under ``logdir`` by :func:`stop`.

    Args:
      logdir: the directory the trace file is written to (created if missing).
      options: accepted for TensorFlow's signature (``ProfilerOptions``); not used.

    Raises:
      AlreadyExistsError: a profiler is already running (as TensorFlow raises).
    """
    global active, _logdir, _origin_ns, _origin_wall_us
    del options
    with _lock:
        if active:
            raise AlreadyExistsError("Another profiler is running.")
        _events.clear()
        _thread_names.clear()
        _thread_names[threading.get_ident()] = "main"
        _logdir = os.fspath(logdir)
        _origin_wall_us = time.time() * 1e6
        _origin_ns = time.perf_counter_ns()
        active = True


def stop(save: bool = True) -> str | None:
    """Stops recording and writes the trace file; returns its path (None with ``save=False``).

    Raises:
      UnavailableError: no profiler is running (as TensorFlow's ``stop`` raises).
    """
    global active, _logdir
    with _lock:
        if not active or _logdir is None:
            raise UnavailableError("Cannot export profiling results. No profiler is running.")
        active = False
        logdir, _logdir = _logdir, None
        events, names = list(_events), dict(_thread_names)
        _events.clear()
        _thread_names.clear()
    if not save:
        return None
    rank = _rank()
    path = trace_path(logdir, rank)
    os.makedirs(logdir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(_document(events, names, rank), file)
    return path


def trace_path(logdir: str | os.PathLike[str], rank: int | None = None) -> str:
    """The file :func:`stop` writes in ``logdir``: ``<host>_<pid>[.rank<r>].trace.json``."""
    suffix = "" if rank is None else f".rank{rank}"
    return os.path.join(os.fspath(logdir), f"{socket.gethostname()}_{os.getpid()}{suffix}.trace.json")


def name_replica_thread(replica: int, device: Any) -> None:
    """Names the current thread's track ``replica i (device)``.

    The caller of ``strategy.run`` runs replica 0 itself: its track keeps its name and adds
    the replica, e.g. ``main (replica 0, /cpu:0)``.
    """
    ident = threading.get_ident()
    where = getattr(device, "short_name", device)
    name = _thread_names.get(ident)
    if name is None:
        _thread_names[ident] = f"replica {replica} ({where})"
    elif not name.startswith("replica ") and "(replica " not in name:
        _thread_names[ident] = f"{name} (replica {replica}, {where})"


def record(name: str, begin_ns: int, args: dict[str, Any] | None = None) -> None:
    """Adds a complete event that began at ``begin_ns`` (a :func:`now`) and ends now."""
    end = time.perf_counter_ns()
    ident = threading.get_ident()
    if ident not in _thread_names:
        _thread_names[ident] = threading.current_thread().name
    _events.append((name, ident, begin_ns, end, args))


class Span:
    """A complete event from ``__enter__`` to ``__exit__`` (recorded only if a profiler runs then)."""

    __slots__ = ("_begin", "args", "name")

    def __init__(self, name: str, args: dict[str, Any] | None = None) -> None:
        self.name = name
        self.args = args
        self._begin = 0

    def __enter__(self) -> Span:
        self._begin = time.perf_counter_ns()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if active:
            if kind is not None:
                self.args = {**(self.args or {}), "error": kind.__name__}
            record(self.name, self._begin, self.args)


class Trace(Span):
    """A user span on the timeline (``tf.profiler.experimental.Trace``).

    ``with Trace("train", step_num=step): ...`` records a complete event named ``name`` on the
    calling thread's track, with the keyword arguments as its ``args``. Costs next to
    nothing while no profiler runs.

    Args:
      name: the event's name.
      **kwargs: shown as the event's arguments.
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, dict(kwargs) if kwargs else None)

    def set_metadata(self, **kwargs: Any) -> None:
        """Adds arguments to the event (before it ends)."""
        self.args = {**(self.args or {}), **kwargs}


def _rank() -> int | None:
    """This process's MPI rank when it runs in an MPI job of several processes."""
    from towerdist._src.multi_worker import mpi_runtime

    try:
        world = mpi_runtime.world()
    except Exception:  # a broken launcher setup must not lose the trace
        return None
    return None if world is None or world.size == 1 else world.rank


def _document(
    events: list[tuple[str, int, int, int, dict[str, Any] | None]], names: dict[int, str], rank: int | None
) -> dict[str, Any]:
    pid = os.getpid()
    tids: dict[int, int] = {}  # thread ident -> small track id, in order of first appearance
    for ident in names:
        tids.setdefault(ident, len(tids))
    for _, ident, *_rest in events:
        tids.setdefault(ident, len(tids))
    process = "towerdist" if rank is None else f"towerdist rank {rank}"
    trace: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
    ]
    if rank is not None:
        trace.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": rank}})
    for ident, tid in tids.items():
        name = names.get(ident, f"thread {ident}")
        trace.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        trace.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    origin = _origin_ns
    for name, ident, begin, end, args in events:
        event: dict[str, Any] = {
            "name": name,
            "cat": "towerdist",
            "ph": "X",
            "pid": pid,
            "tid": tids[ident],
            "ts": (begin - origin) / 1000,
            "dur": (end - begin) / 1000,
        }
        if args:
            event["args"] = {k: _jsonable(v) for k, v in args.items()}
        trace.append(event)
    return {
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "otherData": {"origin_unix_us": _origin_wall_us, "rank": rank, "host": socket.gethostname()},
    }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)
