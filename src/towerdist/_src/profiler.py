"""The timeline: a Chrome trace-event recorder for ``strategy.run`` steps.

``start(logdir)`` turns recording on, ``stop()`` writes what was recorded to
``<logdir>/<host>_<pid>[.rank<r>].trace.json`` (the Chrome trace-event format, which
Perfetto and ``chrome://tracing`` open) and turns it off. In between, the instrumented
places of towerdist (``replica_step.py``, ``replica_threads.py``, ``communicator.py``,
``distributed_dataset.py``) add *complete* events (phase ``"X"``, ``ts``/``dur`` in µs)
on the track (``tid``) of the thread they happen on; ``stop`` adds the metadata events
(phase ``"M"``) naming the process and each track.

**Cost when off.** Every instrumented place first reads the module global :data:`active`
(one attribute load and a branch), and does nothing else when it is false.

**Recording.** Events are appended to a plain list (``list.append`` is atomic under the
GIL) as tuples; they are turned into JSON objects only when the trace is written.

**The file is strict JSON.** ``chrome://tracing`` and Perfetto reject Python's bare ``NaN``
and ``Infinity``, so a non-finite number in a ``Trace`` argument is written as the string
``"NaN"``, ``"Infinity"`` or ``"-Infinity"``; numpy scalars become plain numbers, and any
other object its ``str()``.

**Tracks** are numbered and sorted as a reader expects: the thread that called ``start``
first, then the replicas by replica id (whichever thread happened to record first), then
any other thread in order of appearance.

**A trace that cannot be written is not lost.** When ``stop`` cannot write the file (the
logdir is a file, a directory cannot be made, the disk is full), it raises and the
profiler keeps running with everything recorded so far; fix the logdir and call ``stop``
again, or ``stop(save=False)`` to discard the recording.
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeAlias

from towerdist._src import mpi_runtime
from towerdist._src.atomic_file import AtomicFile
from towerdist._src.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    OpError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnknownError,
)

__all__ = ["Span", "Trace", "active", "name_replica_thread", "now", "start", "stop", "trace_path"]

# What an event's arguments become in the trace file (strict JSON).
JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"

active: bool = False
"""Whether a profiler is running (read by every instrumented place before doing anything)."""

# (name, thread ident, start ns, end ns, args or None), in the order they ended.
_events: list[tuple[str, int, int, int, dict[str, Any] | None]] = []
_thread_names: dict[int, str] = {}  # thread ident -> track name
_thread_replicas: dict[int, int] = {}  # thread ident -> the replica it ran (sorts the tracks)
_starter = 0  # the ident of the thread that called start(): its track comes first
_lock = threading.Lock()  # start/stop
_logdir: str | None = None
_origin_ns = 0  # perf_counter_ns() at start: ts 0
_origin_wall_us = 0.0  # the wall clock at start, for lining up the files of several ranks

now: Callable[[], int] = time.perf_counter_ns


def start(logdir: str | os.PathLike[str], options: object = None) -> None:
    """Starts recording a timeline to be written under ``logdir`` by :func:`stop`.

    Args:
      logdir: the directory the trace file is written to (created if missing).
      options: accepted for TensorFlow's signature (``ProfilerOptions``); not used.

    Raises:
      AlreadyExistsError: a profiler is already running (as TensorFlow raises).
      FailedPreconditionError: ``logdir``, or a folder above it, is a file, so no trace could
        be written there. TensorFlow starts anyway and fails in ``stop()``, losing the
        recording; towerdist says so before recording anything.
    """
    global active, _logdir, _origin_ns, _origin_wall_us, _starter
    del options
    path = os.fspath(logdir)
    blocking = _file_in_the_way(path)
    if blocking is not None:
        raise FailedPreconditionError(
            f"profiler.experimental.start() needs a directory for logdir, but {blocking!r} is a file. "
            f"Got logdir={path!r}; pass a directory (it is created if missing), or move the file away.",
            logdir=path,
            path=blocking,
        )
    with _lock:
        if active:
            raise AlreadyExistsError("Another profiler is running.")
        _events.clear()
        _thread_names.clear()
        _thread_replicas.clear()
        _starter = threading.get_ident()
        _thread_names[_starter] = "main"
        _logdir = path
        _origin_wall_us = time.time() * 1e6
        _origin_ns = time.perf_counter_ns()
        active = True


def stop(save: bool = True) -> str | None:
    """Stops recording and writes the trace file; returns its path (None with ``save=False``).

    When the file cannot be written, nothing is lost: the error is raised and the profiler
    keeps running with everything recorded so far, so that ``stop()`` can be called again
    once the logdir is fixed (or ``stop(save=False)`` discards the recording).

    Args:
      save: write the trace file (False discards the recording).

    Raises:
      UnavailableError: no profiler is running (as TensorFlow's ``stop`` raises).
      FailedPreconditionError: the logdir, or a folder above it, is a file (TensorFlow's type
        for this case); the profiler keeps running.
      PermissionDeniedError: the logdir cannot be written to; the profiler keeps running.
      ResourceExhaustedError: the disk is full; the profiler keeps running.
      UnknownError: any other failure to write the file; the profiler keeps running.
    """
    global active, _logdir
    with _lock:
        if not active or _logdir is None:
            raise UnavailableError("Cannot export profiling results. No profiler is running.")
        logdir = _logdir
        path = None
        if save:
            active = False  # nothing new is recorded while the file is written
            try:
                path = _write(logdir, list(_events), dict(_thread_names), dict(_thread_replicas))
            except OpError:
                active = True  # keep every event: a later stop() writes them all
                raise
        active = False
        _logdir = None
        _events.clear()
        _thread_names.clear()
        _thread_replicas.clear()
    return path


def _file_in_the_way(logdir: str) -> str | None:
    """The file at ``logdir`` or at the nearest existing folder above it, if there is one."""
    here = os.path.abspath(logdir)
    while not os.path.exists(here):
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return None if os.path.isdir(here) else here


_WRITE_ERRORS: tuple[tuple[type[OSError], type[OpError]], ...] = (
    (NotADirectoryError, FailedPreconditionError),
    (FileExistsError, FailedPreconditionError),
    (IsADirectoryError, FailedPreconditionError),
    (PermissionError, PermissionDeniedError),
)


def _write(
    logdir: str,
    events: list[tuple[str, int, int, int, dict[str, Any] | None]],
    names: dict[int, str],
    replicas: dict[int, int],
) -> str:
    """Writes the trace file in ``logdir`` (whole or not at all) and returns its path.

    Raises:
      OpError: the file could not be written; the subclass says why (see :func:`stop`).
    """
    rank = _rank()
    path = trace_path(logdir, rank)
    try:
        os.makedirs(logdir, exist_ok=True)
        # A reader never sees half a trace; not durable: a trace is not worth an fsync's wait.
        with AtomicFile(path, text=True, durable=False) as file:
            json.dump(_document(events, names, replicas, rank), file, allow_nan=False)
    except OSError as error:
        kind: type[OpError] = UnknownError
        if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            kind = ResourceExhaustedError
        for os_kind, op_kind in _WRITE_ERRORS:
            if isinstance(error, os_kind):
                kind = op_kind
                break
        blocking = _file_in_the_way(logdir)
        reason = f"{blocking!r} is a file" if blocking is not None else f"{type(error).__name__}: {error}"
        raise kind(
            f"profiler.experimental.stop() cannot write the trace to {path!r}: {reason}. The profiler is still "
            f"running with everything recorded so far: make logdir={logdir!r} a directory you can write to and "
            f"call stop() again, or call stop(save=False) to discard the recording.",
            logdir=logdir,
            path=path,
        ) from error
    return path


def trace_path(logdir: str | os.PathLike[str], rank: int | None = None) -> str:
    """The file :func:`stop` writes in ``logdir``: ``<host>_<pid>[.rank<r>].trace.json``."""
    suffix = "" if rank is None else f".rank{rank}"
    return os.path.join(os.fspath(logdir), f"{socket.gethostname()}_{os.getpid()}{suffix}.trace.json")


def name_replica_thread(replica: int, device: object) -> None:
    """Names the current thread's track ``replica i (device)``.

    The caller of ``strategy.run`` runs replica 0 itself: its track keeps its name and adds
    the replica, e.g. ``main (replica 0, /cpu:0)``.
    """
    ident = threading.get_ident()
    _thread_replicas.setdefault(ident, replica)
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
      name: the event's name (anything else than a ``str`` is written as its ``str()``).
      **kwargs: shown as the event's arguments; a non-finite number is written as the string
        ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, so that the file stays strict JSON.
    """

    def __init__(self, name: str, **kwargs: object) -> None:
        super().__init__(name, dict(kwargs) if kwargs else None)

    def set_metadata(self, **kwargs: object) -> None:
        """Adds arguments to the event (before it ends)."""
        self.args = {**(self.args or {}), **kwargs}


def _rank() -> int | None:
    """This process's MPI rank when it runs in an MPI job of several processes."""
    try:
        world = mpi_runtime.world()
    except Exception:  # a broken launcher setup must not lose the trace
        return None
    return None if world is None or world.size == 1 else world.rank


def _document(
    events: list[tuple[str, int, int, int, dict[str, Any] | None]],
    names: dict[int, str],
    replicas: dict[int, int],
    rank: int | None,
) -> dict[str, Any]:
    pid = os.getpid()
    seen: dict[int, None] = dict.fromkeys(names)  # thread idents in order of first appearance
    for _, ident, *_rest in events:
        seen.setdefault(ident)

    def order(ident: int) -> tuple[int, int]:
        if ident in replicas:
            return (1, replicas[ident])
        return (0, 0) if ident == _starter else (2, 0)

    # The track ids are the reading order: start()'s thread, the replicas by id, the rest.
    tids = {ident: tid for tid, ident in enumerate(sorted(seen, key=order))}  # sorted() is stable
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
            "name": name if isinstance(name, str) else _text(name),
            "cat": "towerdist",
            "ph": "X",
            "pid": pid,
            "tid": tids[ident],
            "ts": (begin - origin) / 1000,
            "dur": (end - begin) / 1000,
        }
        if args:
            event["args"] = {_text(k): _jsonable(v) for k, v in args.items()}
        trace.append(event)
    return {
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "otherData": {"origin_unix_us": _origin_wall_us, "rank": rank, "host": socket.gethostname()},
    }


def _jsonable(value: object) -> JsonValue:
    """``value`` as strict JSON: non-finite floats as ``"NaN"``/``"Infinity"``/``"-Infinity"``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):  # int and numpy's integers
        return int(value)
    if isinstance(value, numbers.Real):  # float and numpy's floats
        number = float(value)
        if math.isfinite(number):
            return number
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {_text(k): _jsonable(v) for k, v in value.items()}
    return _text(value)


def _text(value: object) -> str:
    """``str(value)``, or a placeholder when that fails (a bad ``__str__`` must not lose the trace)."""
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} object>"
