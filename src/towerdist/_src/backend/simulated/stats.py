"""Counts of host-blocking synchronisations on simulated GPUs, by device, by call and by call site.

A synchronisation blocks the calling CPU thread until a GPU has finished queued work: on
real GPUs each one stalls the host and drains the device's pipeline, which is what
towerdist's GPU path avoids by ordering work with events. The simulation runs kernels
eagerly, so such a wait costs nothing here; :class:`SyncStats` counts them instead, so a
test can pin how many a step takes and a developer can see which line took them
(``towerdist.testing.simulated_gpu_stats``).

Counted (``count_sync``): ``Device.synchronize()``, ``cupy.cuda.runtime.deviceSynchronize()``,
``Stream.synchronize()``, ``Event.synchronize()``, and blocking copies to the host
(``ndarray.get()``, ``cupy.asnumpy``, ``item``, ``tolist``, ``bool``/``int``/``float``/``complex``,
``repr``/``str``/``format`` of an array), each once, on the device it waits for. Queries that
do not block (``Stream.done``, ``Event.done``) are counted apart (``count_query``). Uploads
are not counted: ``cudaMemcpyAsync`` from pageable host memory returns once the data is
staged, without waiting for the device.

Beside the waits, :meth:`SyncStats.count_work` counts the host's *other* calls into CUDA, each
of which costs the host a few microseconds on a real GPU however little the device does:
kernel launches, host-to-device and device-to-host copies (``h2d``, ``h2d_async`` from pinned
memory, ``d2h``), copies between devices (``d2d``), events made, recorded and waited for,
device switches (``cudaSetDevice``: entering or leaving ``with Device(i)`` for another device), pinned host allocations, and NCCL calls. A benchmark
compares these per step with a plain cupy program (``benchmarks/gpu_host_work.py``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from typing import Any

__all__ = ["WORK_KINDS", "SyncStats", "call_site"]

WORK_KINDS = (
    "kernel_launches", "h2d", "h2d_async", "d2h", "d2d", "events_created", "event_records", "event_waits",
    "device_switches", "pinned_allocs", "nccl_calls",
)  # fmt: skip
"""The kinds of host work ``count_work`` counts, in the order a snapshot lists them."""

_TESTING_DIR = os.path.dirname(os.path.abspath(__file__))  # the simulator: never reported as a call site
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_TESTING_DIR)))  # the folder holding towerdist/


class SyncStats:
    """Thread-safe counters of one simulated machine's host synchronisations.

    Args:
      num_gpus: the number of simulated GPUs (each is listed, with 0 if it never synchronised).
    """

    def __init__(self, num_gpus: int) -> None:
        self._num_gpus = num_gpus
        self._lock = threading.Lock()
        self._syncs: Counter[int] = Counter()
        self._by_call: Counter[str] = Counter()
        self._sites: Counter[str] = Counter()
        self._queries: Counter[int] = Counter()
        self._work: Counter[str] = Counter()
        self._work_sites: Counter[str] = Counter()
        self.work_sites = False  # also count host work by call site (costs a stack walk per call)

    def count_sync(self, device_id: int, call: str) -> None:
        """Counts one host-blocking synchronisation of ``device_id`` by ``call`` (e.g. ``"Stream.synchronize"``)."""
        site = call_site()
        with self._lock:
            self._syncs[device_id] += 1
            self._by_call[call] += 1
            self._sites[site] += 1

    def count_query(self, device_id: int) -> None:
        """Counts one non-blocking completion query (``Stream.done``, ``Event.done``) of ``device_id``."""
        with self._lock:
            self._queries[device_id] += 1

    def count_work(self, kind: str, n: int = 1) -> None:
        """Counts ``n`` host calls into CUDA of one ``kind`` (see :data:`WORK_KINDS`)."""
        site = f"{kind} at {call_site()}" if self.work_sites else ""
        with self._lock:
            self._work[kind] += n
            if site:
                self._work_sites[site] += n

    def snapshot(self, reset: bool = False) -> dict[str, Any]:
        """The counts so far (see ``towerdist.testing.simulated_gpu_stats``); ``reset`` zeroes them after."""
        with self._lock:
            devices = range(self._num_gpus)
            result: dict[str, Any] = {
                "host_syncs": {d: self._syncs[d] for d in devices},
                "host_syncs_by_call": dict(self._by_call),
                "host_sync_sites": dict(self._sites),
                "queries": {d: self._queries[d] for d in devices},
                "host_work": {kind: self._work[kind] for kind in WORK_KINDS},
                "host_work_sites": dict(self._work_sites),
            }
            if reset:
                for counter in (self._syncs, self._by_call, self._sites, self._queries, self._work, self._work_sites):
                    counter.clear()
        return result


def call_site() -> str:
    """The innermost caller outside the simulator, as ``path/file.py:LINE (function)``.

    Paths inside towerdist are given from the package (``towerdist/_src/...``), other paths
    relative to the working directory when they are under it.
    """
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_TESTING_DIR + os.sep):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>"
    return f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})"


def _short_path(filename: str) -> str:
    path = os.path.abspath(filename)
    if path.startswith(os.path.join(_PACKAGE_ROOT, "towerdist") + os.sep):
        return os.path.relpath(path, _PACKAGE_ROOT)
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith(os.pardir) else relative
