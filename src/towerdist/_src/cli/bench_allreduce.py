"""``towerdist bench allreduce``: all-reduce time and bandwidth in nccl-tests' layout, against a floor.

For every size S (bytes per replica), the all-reduce is
``strategy.run(step, args=(values,))`` where ``step`` returns
``td.distribute.get_replica_context().all_reduce("sum", x)`` and ``values`` hands every
replica its own preallocated buffer. It is timed in rotation (``timing.py``) with a floor
measured in the same run on the same bytes:

* one process, CPUs: numpy, the sum of the N replicas' buffers on one thread
  (``out = b0 + b1``, then ``np.add(out, b, out=out)``);
* one process, ``--gpus``: the sum of N buffers already on the first GPU, on that GPU
  (with simulated GPUs this is numpy too: the simulation proves logic, not speed);
* under MPI: mpi4py's ``comm.Allreduce(MPI.IN_PLACE, buf)`` of S bytes of host memory on a
  duplicate of ``COMM_WORLD`` (what MPI alone costs; the buffer is summed in place call after
  call, so its values grow, which costs the same to add).

Columns, as nccl-tests defines them: ``size`` (bytes per replica), ``count`` (elements),
``type``, ``redop``, ``time`` (median µs per call), ``algbw = size / time`` and
``busbw = algbw * 2(n-1)/n`` in GB/s (1e9 B/s) with n the replicas in sync, ``correct``
(``ok``, or how many elements were wrong in the first and the last timed call, compared
exactly: the buffers hold small integers, whose sum is exact in any order), then the
floor's time and algbw, and ``ratio`` = time / floor time. Every rank agrees on the times
(the slowest rank's) and rank 0 prints.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any

import numpy as np

from towerdist._src.backend import cupy_backend
from towerdist._src.cli.bench_devices import BenchTarget, make_target
from towerdist._src.cli.command_error import CommandError
from towerdist._src.cli.progress import Progress
from towerdist._src.cli.sizes import format_size
from towerdist._src.cli.timing import Sampler, Summary
from towerdist._src.context import get_replica_context
from towerdist._src.type_aliases import HostArray, TensorLike
from towerdist._src.version import __version__

__all__ = ["DTYPES", "AllReduceCase", "bench_allreduce"]

DTYPES = ("float32", "float64", "int32", "int64")

_HEADER = (
    f"#{'':>40} {'all_reduce in strategy.run':-^35} {'floor':-^17}\n"
    f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'time':>9} {'algbw':>7} {'busbw':>7} {'correct':>8} "
    f"{'time':>9} {'algbw':>7} {'ratio':>9}\n"
    f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6} {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>8} "
    f"{'(us)':>9} {'(GB/s)':>7} {'(x floor)':>9}"
)


def _all_reduce_step(x: TensorLike) -> TensorLike:
    context = get_replica_context()
    if context is None:  # strategy.run always has a replica context; a clear message if not
        raise CommandError("bench allreduce: the step ran outside a replica context.")
    return context.all_reduce("sum", x)


def _to_host(value: TensorLike) -> HostArray:
    if cupy_backend.owns(value):
        return np.asarray(cupy_backend.xp.asnumpy(value))
    return np.asarray(value)


class AllReduceCase:
    """The buffers, the two variants and the correctness checks for one size."""

    def __init__(self, target: BenchTarget, nbytes: int, dtype: np.dtype[Any]) -> None:
        self.target = target
        count = nbytes // dtype.itemsize
        local = len(target.devices)
        first = target.rank * local

        def host_buffer(replica: int) -> np.ndarray:
            # Small integers: the sum over replicas is exact in any order of summation.
            return np.random.default_rng([nbytes, replica]).integers(-8, 8, count).astype(dtype)

        host = [host_buffer(first + i) for i in range(local)]
        self.want = host_buffer(0)
        for replica in range(1, target.num_replicas):
            self.want += host_buffer(replica)
        if target.on_gpus:
            self.buffers = [cupy_backend.asarray(h, device=d) for h, d in zip(host, target.devices)]
        else:
            self.buffers = host
        self.values = target.strategy.experimental_distribute_values_from_function(
            lambda ctx: self.buffers[ctx.replica_id_in_sync_group - first]
        )
        self.last: Any = None
        self.floor = self._make_floor(host)

    def all_reduce(self) -> None:
        """One timed call: the all-reduce inside ``strategy.run`` (finished on every GPU)."""
        self.last = self.target.strategy.run(_all_reduce_step, args=(self.values,))
        if self.target.on_gpus:
            cupy_backend.finish(self.target.devices)

    def wrong(self) -> int:
        """Elements of the last result that differ from the exact sum (every rank's, summed)."""
        results = self.target.strategy.experimental_local_results(self.last)
        wrong = sum(int(np.count_nonzero(_to_host(r) != self.want)) for r in results)
        if self.target.comm is not None:
            wrong = int(self.target.comm.allreduce(wrong))
        return wrong

    def _make_floor(self, host: list[np.ndarray]) -> Callable[[], object]:
        target = self.target
        if target.comm is not None:
            from mpi4py import MPI  # noqa: PLC0415  (only under an MPI launcher)

            raw = host[0].copy()
            for h in host[1:]:
                raw += h
            target.comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)
            if not np.array_equal(raw, self.want):
                raise CommandError("bench allreduce: mpi4py's own Allreduce gave a wrong sum; check the MPI install.")
            return lambda: target.comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)
        if target.on_gpus:
            gpu = target.devices[0]
            on_first = [cupy_backend.asarray(h, device=gpu) for h in host]

            def gpu_floor() -> object:
                total = cupy_backend.add_n(on_first)
                cupy_backend.synchronize(gpu)
                return total

            return gpu_floor

        def numpy_floor() -> object:
            if len(host) == 1:
                return host[0].copy()
            out = host[0] + host[1]
            for h in host[2:]:
                np.add(out, h, out=out)
            return out

        return numpy_floor


def _floor_description(target: BenchTarget) -> str:
    n = len(target.devices)
    if target.comm is not None:
        return f"mpi4py comm.Allreduce(MPI.IN_PLACE, buf) of host memory across {target.ranks} ranks"
    if target.on_gpus:
        simulated = " (simulated: numpy)" if target.simulated else ""
        return f"the sum of {n} buffers already on {target.devices[0].short_name}, on that GPU{simulated}"
    return f"numpy, the sum of the {n} buffers on one thread"


def _row(nbytes: int, dtype: np.dtype[Any], n: int, times: dict[str, Summary], wrong: int) -> tuple[str, float]:
    t, floor = times["all_reduce"].median, times["floor"].median
    algbw = nbytes / t / 1e9
    busbw = algbw * 2 * (n - 1) / n
    floor_algbw = nbytes / floor / 1e9
    correct = "ok" if wrong == 0 else str(wrong)
    row = (
        f" {nbytes:>11} {nbytes // dtype.itemsize:>12} {dtype.name:>8} {'sum':>6} {t * 1e6:>9.2f} {algbw:>7.3f} "
        f"{busbw:>7.3f} {correct:>8} {floor * 1e6:>9.2f} {floor_algbw:>7.3f} {t / floor:>9.2f}"
    )
    return row, busbw


def bench_allreduce(
    *,
    replicas: int | None,
    gpus: bool,
    sizes: list[int],
    dtype: str,
    repeats: int,
    sample_ms: float,
    progress: bool,
) -> None:
    """Prints the all-reduce table (rank 0 under MPI).

    Args:
      replicas: replicas (per rank under MPI); None for the default.
      gpus: run on GPUs (real or simulated).
      sizes: bytes per replica, each a whole number of ``dtype`` elements.
      dtype: one of ``DTYPES``.
      repeats: samples per variant and size (the median is shown).
      sample_ms: the least duration of one sample.
      progress: show progress on stderr.

    Raises:
      CommandError: the devices do not exist, or a result was wrong (after the table).
    """
    element = np.dtype(dtype)
    target = make_target(replicas, gpus)
    try:
        speaker = target.rank == 0
        ops = getattr(target.strategy.extended, "_cross_device_ops", None)
        show = Progress(len(sizes), "bench allreduce", progress and speaker)
        if speaker:
            across = "; across ranks: MPI" if target.comm is not None else ""
            show.write(
                f'# towerdist bench allreduce: get_replica_context().all_reduce("sum", x) inside strategy.run\n'
                f"# strategy: {target.description}; cross-device ops: {type(ops).__name__}{across}\n"
                f"# floor: {_floor_description(target)} (same bytes, same run)\n"
                f"# towerdist {__version__}, numpy {np.__version__}, Python "
                f"{platform.python_version()}; median of {repeats} samples in rotation, each >= {sample_ms:g} ms\n"
                f"# size = bytes per replica; algbw = size/time, busbw = algbw*2(n-1)/n with "
                f"n = {target.num_replicas} (GB/s); correct: wrong elements or ok\n#\n{_HEADER}"
            )
        sampler = Sampler(sample_ms, comm=target.comm)
        bad, busbws = [], []
        for nbytes in sizes:
            run = AllReduceCase(target, nbytes, element)
            run.all_reduce()
            wrong = run.wrong()
            times = sampler.rotation({"all_reduce": run.all_reduce, "floor": run.floor}, repeats)
            wrong += run.wrong()
            row, busbw = _row(nbytes, element, target.num_replicas, times, wrong)
            busbws.append(busbw)
            if wrong:
                bad.append(format_size(nbytes))
            if speaker:
                show.write(row)
            show.step(format_size(nbytes))
            del run
        show.close()
        if speaker:
            print(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f} GB/s")
            if bad:
                print(f"# Wrong results        : {len(bad)} of {len(sizes)} sizes ({', '.join(bad)})")
            else:
                print(f"# Wrong results        : none (all {len(sizes)} sizes OK)")
        if bad:
            raise CommandError(
                f"all_reduce gave wrong results at {', '.join(bad)} (the correct column says how many "
                f"elements were wrong)."
            )
    finally:
        target.close()
