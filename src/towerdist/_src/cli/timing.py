"""Timing variants side by side: calibrated samples, taken in rotation, summarised by medians.

A sample times ``iters`` back-to-back calls of one variant with ``time.perf_counter_ns`` and
divides. ``iters`` is calibrated once per variant so that a sample lasts at least
``sample_ms`` (so timer resolution and one-off hiccups do not dominate short calls). The
variants are sampled in rotation (sample k of every variant before sample k+1 of any), so a
slow spell of the machine hits all of them alike, and an untimed ``gc.collect()`` precedes
every sample, so no variant pays for collecting another's garbage.

Across MPI ranks (``comm`` given), each sample starts with a barrier, so every rank times the
same calls, and its time is the slowest rank's; every decision (the calibration) is taken on
times all ranks agree on, so the ranks never fall out of step.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # mpi4py is optional: imported only under an MPI launcher
    from mpi4py.MPI import Comm

__all__ = ["Sampler", "Summary", "summarize"]

_MAX_CALLS = 1 << 16
_WARM_UP_CALLS = 3


class Summary(NamedTuple):
    """Median, 10th and 90th percentile of per-call seconds, and the calls per sample."""

    median: float
    p10: float
    p90: float
    calls: int


def summarize(samples: list[float], calls: int) -> Summary:
    """The ``Summary`` of per-call ``samples`` (seconds) taken with ``calls`` calls each."""
    if len(samples) >= 2:
        deciles = statistics.quantiles(samples, n=10, method="inclusive")
        low, high = deciles[0], deciles[-1]
    else:
        low = high = samples[0]
    return Summary(statistics.median(samples), low, high, calls)


class Sampler:
    """Takes timed samples of callables, on one process or across the ranks of ``comm``.

    Args:
      sample_ms: the least duration of one sample, in milliseconds.
      min_calls: the least calls per sample (a calibration thrown off by one slow call still
        gives samples of several calls).
      comm: an mpi4py communicator to synchronise every sample across (None: this process).
    """

    def __init__(self, sample_ms: float, min_calls: int = 4, comm: Comm | None = None) -> None:
        self._sample_s = sample_ms * 1e-3
        self._min_calls = min_calls
        self._comm = comm

    def sample(self, fn: Callable[[], object], calls: int) -> float:
        """Seconds per call of ``fn`` over ``calls`` calls (the slowest rank's, across ``comm``)."""
        gc.collect()  # untimed
        if self._comm is not None:
            self._comm.Barrier()
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        elapsed = (time.perf_counter_ns() - start) / 1e9
        if self._comm is not None:
            from mpi4py import MPI  # noqa: PLC0415  (only under an MPI launcher)

            elapsed = float(self._comm.allreduce(elapsed, op=MPI.MAX))
        return elapsed / calls

    def calibrate(self, fn: Callable[[], object]) -> int:
        """How many calls of ``fn`` make one sample of at least ``sample_ms``."""
        calls = 1
        while True:
            total = self.sample(fn, calls) * calls
            if total >= self._sample_s / 4 or calls >= _MAX_CALLS:
                wanted = round(calls * self._sample_s / max(total, 1e-9))
                return max(self._min_calls, min(wanted, _MAX_CALLS))
            calls *= 2

    def rotation(self, variants: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, Summary]:
        """Warms up and calibrates every variant, then takes ``repeats`` samples of each in rotation."""
        calls = {}
        for name, fn in variants.items():
            for _ in range(_WARM_UP_CALLS):  # first calls start threads and set up communicators
                fn()
            calls[name] = self.calibrate(fn)
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name, fn in variants.items():
                samples[name].append(self.sample(fn, calls[name]))
        return {name: summarize(samples[name], calls[name]) for name in variants}
