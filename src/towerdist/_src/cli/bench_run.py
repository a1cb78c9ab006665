"""``towerdist bench run``: the overhead of one ``strategy.run`` step, in microseconds.

Two steps, timed in rotation (``timing.py``) on the same strategy as ``bench allreduce``:

* ``strategy.run(no-op)``: ``strategy.run(fn)`` where ``fn`` returns None: the cost of
  waking every replica thread and waiting for all of them;
* ``strategy.run(all_reduce 4 KiB)``: a step whose function returns
  ``get_replica_context().all_reduce("sum", x)`` of its own 4 KiB float32 buffer (checked
  once against the exact sum): one barrier across the replicas plus the arithmetic.

Medians, 10th and 90th percentiles of per-step times; under MPI every sample is the slowest
rank's and rank 0 prints.
"""

from __future__ import annotations

import platform
from typing import Any

import numpy as np

from towerdist._src.backend import cupy_backend
from towerdist._src.cli.bench_allreduce import AllReduceCase
from towerdist._src.cli.bench_devices import make_target
from towerdist._src.cli.command_error import CommandError
from towerdist._src.cli.timing import Sampler
from towerdist._src.version import __version__

__all__ = ["bench_run"]

_ALL_REDUCE_BYTES = 4096


def _no_op() -> None:
    return None


def bench_run(*, replicas: int | None, gpus: bool, repeats: int, sample_ms: float) -> None:
    """Prints the step-overhead table (rank 0 under MPI).

    Args:
      replicas: replicas (per rank under MPI); None for the default.
      gpus: run on GPUs (real or simulated).
      repeats: samples per step (the median is shown).
      sample_ms: the least duration of one sample.

    Raises:
      CommandError: the devices do not exist, or the all-reduce's result was wrong.
    """
    target = make_target(replicas, gpus)
    try:
        strategy = target.strategy
        reduce = AllReduceCase(target, _ALL_REDUCE_BYTES, np.dtype(np.float32))

        def no_op() -> None:
            strategy.run(_no_op)
            if target.on_gpus:
                cupy_backend.finish(target.devices)

        reduce.all_reduce()
        if reduce.wrong():
            raise CommandError("bench run: the 4 KiB all_reduce gave a wrong sum.")
        steps: dict[str, Any] = {
            "strategy.run(no-op)": no_op,
            "strategy.run(all_reduce 4 KiB)": reduce.all_reduce,
        }
        times = Sampler(sample_ms, comm=target.comm).rotation(steps, repeats)
        if target.rank != 0:
            return
        print(
            f"# towerdist bench run: the time of one strategy.run step, us (median, p10, p90 of {repeats} samples "
            f"in rotation, each >= {sample_ms:g} ms)"
        )
        print(f"# strategy: {target.description}")
        print(f"# towerdist {__version__}, numpy {np.__version__}, Python {platform.python_version()}")
        print(f"# {'step':<32} {'median':>9} {'p10':>9} {'p90':>9} {'calls':>7}")
        for name, summary in times.items():
            print(
                f"  {name:<32} {summary.median * 1e6:>9.1f} {summary.p10 * 1e6:>9.1f} {summary.p90 * 1e6:>9.1f} "
                f"{summary.calls:>7}"
            )
        added = times["strategy.run(all_reduce 4 KiB)"].median - times["strategy.run(no-op)"].median
        print(f"# the 4 KiB all_reduce adds {added * 1e6:.1f} us to a step (difference of the medians)")
    finally:
        target.close()
