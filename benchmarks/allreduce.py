"""CPU all-reduce time and bandwidth against a plain numpy reduction (DESIGN.md section 11).

For each replica count n (``--replicas``, default 2,4) and float32 size S per replica
(``--sizes``, default 1 KiB .. 64 MiB in powers of 4), on a ``td.distribute.MirroredStrategy``
over n logical CPUs, with the same n preallocated buffers in every variant:

* ``all_reduce in run``  ``strategy.run(step, args=(values,))`` where ``step`` returns
  ``get_replica_context().all_reduce("sum", x)`` and ``values`` hands replica i buffer i
  (made once by ``experimental_distribute_values_from_function``; nothing is allocated
  per call but the result);
* ``strategy.reduce``     ``strategy.reduce("sum", values, axis=None)`` in cross-replica context;
* ``numpy``               the reference: ``out = bufs[0] + bufs[1]``, then
  ``np.add(out, b, out=out)`` for the other buffers, on one thread;
* ``numpy-par``           the same split into one contiguous slice per core, each slice
  summed on its own thread (a rough memory-bandwidth bound; not the target's reference).

Variants are timed in rotation (sample k of every variant before sample k+1 of any) after
a warm-up, with an untimed ``gc.collect()`` before each sample so that no variant pays for
collecting another's garbage. A sample makes at least ``--min-calls`` calls (default 32) and
lasts at least ``--sample-ms``: long enough to span a period of Python's cyclic collector
(every ~20-30 ``run`` calls), so that results kept alive by reference cycles until it runs
cost what they cost in a training loop. The median of ``--repeats`` samples is reported.
Once per size, every result is checked to equal the numpy reduction exactly (the sums are
taken in the same order).

Reported, as nccl-tests defines them: algbw = S / t and busbw = algbw * 2(n-1)/n, with S the
bytes per replica (no busbw for n = 1), and each variant's time over the numpy time.
DESIGN 11's target: all-reduce in ``run`` at 64 MiB over 4 replicas takes at most 1/0.9 = 1.11x
the numpy time (at least 90% of its bandwidth).

**--mpi** (``MultiWorkerMirroredStrategy`` across processes): re-launches this script as
``mpiexec -n 2 python benchmarks/allreduce.py --mpi-worker ...`` (the ``mpiexec`` next to this
Python, else on ``PATH``; ``--ranks``, ``--timeout``) and prints rank 0's table. Every rank has
one CPU replica and the same float32 size S per size, and times in rotation:

* ``MWMS``  ``strategy.run(step, args=(x,))`` where ``step`` returns
  ``get_replica_context().all_reduce("sum", x)`` and ``x`` is a preallocated buffer (up to
  64 KiB ``x`` travels in the message that carries the collective's header, one message each
  way; above it, once the headers matched, each of 2 ranks sums one half of ``x`` and sends
  it to the other, straight into the result);
* ``raw``   ``comm.Allreduce(MPI.IN_PLACE, buf)`` of the same bytes on a ``COMM_WORLD.Dup()``
  (the floor: what MPI alone costs). ``buf`` is summed in place call after call, so its
  values double each call (and end at +-inf, which costs the same to add as any normal
  float; no NaN arises because every rank holds the same values after the first call).

Each sample starts with a barrier on the raw communicator, so every rank times the same
calls, and its time is the largest over the ranks (an all-reduce MAX of the elapsed time);
warm-up, calibration, ``gc.collect()`` and the median of ``--repeats`` are as above. Once
per size both results are checked to equal the sum of every rank's buffer exactly (the
buffers hold small integers, so the sum is exact in any order). busbw = algbw * 2(n-1)/n
with n ranks. Target: MWMS <= 1.1x raw from 1 MiB up, <= 2x raw + 20 us below 1 MiB.

Run:
    python benchmarks/allreduce.py [--sizes 1K,64K,4M,64M] [--replicas 2,4] [--repeats 11] [--quick]
    python benchmarks/allreduce.py --mpi [--ranks 2] [--sizes ...] [--repeats 11] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import towerdist as td
from _mpi_launch import mpi_command, run_mpi

from _machine import machine_info

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
QUICK_SIZES = "4K,1M,16M"
TARGET_RATIO = 1 / 0.9  # all-reduce in run / numpy, at 64 MiB and 4 replicas
TARGET_SIZE, TARGET_REPLICAS = 64 << 20, 4
VARIANTS = ("numpy", "all_reduce in run", "strategy.reduce", "numpy-par")
PAR_THREADS = os.cpu_count() or 1  # numpy-par: one thread per core
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MPI_VARIANTS = ("MWMS", "raw")
MPI_LARGE = 1 << 20  # from here up the target is a ratio; below it, a ratio plus a constant
MPI_TARGET_LARGE = 1.1  # MWMS / raw, from 1 MiB up
MPI_TARGET_SMALL = (2.0, 20e-6)  # MWMS <= 2 x raw + 20 us, below 1 MiB


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text[-1] in UNITS else ""
    size = int(float(text[: len(text) - len(unit)]) * UNITS[unit])
    if size < 4 or size % 4:
        raise ValueError(f"sizes must be whole float32 buffers (a multiple of 4 bytes). Got {text!r}.")
    return size


def size_label(nbytes: int) -> str:
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


def check_equal(what: str, got: object, want: np.ndarray) -> None:
    # An explicit raise rather than `assert`, which `python -O` would skip.
    if not np.array_equal(np.asarray(got), want):
        raise AssertionError(f"{what} differs from the numpy reduction of the same buffers.")


def calibrate(fn: Callable[[], object], sample_ms: float, min_calls: int) -> int:
    """How many calls of ``fn`` make one sample of about ``sample_ms`` (at least ``min_calls``)."""
    iters = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        elapsed = time.perf_counter_ns() - t0
        if elapsed >= sample_ms * 1e6 / 4 or iters >= 1 << 16:
            return max(min_calls, round(iters * sample_ms * 1e6 / max(elapsed, 1)))
        iters *= 2


def time_rotation(
    variants: dict[str, Callable[[], object]], repeats: int, sample_ms: float, min_calls: int
) -> dict[str, list[float]]:
    """Per-call seconds of every variant, ``repeats`` samples each, taken in rotation."""
    iters = {}
    for name, fn in variants.items():
        fn()  # warm-up
        iters[name] = calibrate(fn, sample_ms, min_calls)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            # Untimed: no variant pays for collecting another's garbage (towerdist's results
            # can sit in reference cycles until the cyclic collector runs).
            gc.collect()
            t0 = time.perf_counter_ns()
            for _ in range(iters[name]):
                fn()
            samples[name].append((time.perf_counter_ns() - t0) / iters[name] / 1e9)
    return samples


def bench_size(
    strategy: td.distribute.MirroredStrategy, n: int, nbytes: int, pool: ThreadPoolExecutor, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Checks every variant once against numpy, then times them all (seconds per call)."""
    rng = np.random.default_rng(nbytes + n)
    bufs = [rng.standard_normal(nbytes // 4, dtype=np.float32) for _ in range(n)]
    values = strategy.experimental_distribute_values_from_function(lambda ctx: bufs[ctx.replica_id_in_sync_group])
    if any(a is not b for a, b in zip(strategy.experimental_local_results(values), bufs)):
        raise AssertionError("experimental_distribute_values_from_function copied the buffers.")

    def step(x):  # type: ignore[no-untyped-def]
        return td.distribute.get_replica_context().all_reduce("sum", x)

    def numpy_sum() -> np.ndarray:
        if n == 1:
            return bufs[0].copy()
        out = bufs[0] + bufs[1]
        for b in bufs[2:]:
            np.add(out, b, out=out)
        return out

    parts = PAR_THREADS  # one contiguous slice per pool thread
    edges = np.linspace(0, bufs[0].size, parts + 1).astype(int)

    def numpy_par() -> np.ndarray:
        out = np.empty_like(bufs[0])

        def part(k: int) -> None:
            piece = slice(edges[k], edges[k + 1])
            if n == 1:
                np.copyto(out[piece], bufs[0][piece])
                return
            np.add(bufs[0][piece], bufs[1][piece], out=out[piece])
            for b in bufs[2:]:
                np.add(out[piece], b[piece], out=out[piece])

        list(pool.map(part, range(parts)))
        return out

    variants: dict[str, Callable[[], object]] = {
        "numpy": numpy_sum,
        "all_reduce in run": lambda: strategy.run(step, args=(values,)),
        "strategy.reduce": lambda: strategy.reduce("sum", values, axis=None),
        "numpy-par": numpy_par,
    }
    want = numpy_sum()
    for r, got in enumerate(strategy.experimental_local_results(variants["all_reduce in run"]())):
        check_equal(f"all_reduce in run (replica {r}, {size_label(nbytes)}, n={n})", got, want)
    check_equal(f"strategy.reduce ({size_label(nbytes)}, n={n})", variants["strategy.reduce"](), want)
    check_equal(f"numpy-par ({size_label(nbytes)}, n={n})", numpy_par(), want)
    return time_rotation(variants, args.repeats, args.sample_ms, args.min_calls)


def bandwidths(nbytes: int, n: int, seconds: float) -> tuple[float, float | None]:
    """(algbw, busbw) in GB/s; busbw is None for one replica (its factor is 0)."""
    algbw = nbytes / seconds / 1e9
    return algbw, (algbw * 2 * (n - 1) / n if n > 1 else None)


def table_header() -> str:
    names = f"{'':>8}" + "".join(f" | {name:^29}" for name in VARIANTS)
    return names + f"\n{'size':>8}" + f" | {'us':>9} {'algbw':>6} {'busbw':>6} {'x np':>5}" * len(VARIANTS)


def table_row(nbytes: int, n: int, median_s: dict[str, float]) -> str:
    cells = []
    for name in VARIANTS:
        algbw, busbw = bandwidths(nbytes, n, median_s[name])
        busbw_text = "-" if busbw is None else f"{busbw:.2f}"
        ratio = median_s[name] / median_s["numpy"]
        cells.append(f" | {median_s[name] * 1e6:9.1f} {algbw:6.2f} {busbw_text:>6} {ratio:5.1f}")
    return f"{size_label(nbytes):>8}" + "".join(cells)


# --- --mpi: MultiWorkerMirroredStrategy across processes ------------------------------------------


def mpi_sample(fn: Callable[[], object], iters: int, comm: Any, mpi: Any) -> float:
    """Seconds per call of ``fn`` over ``iters`` calls, started together, the slowest rank's."""
    gc.collect()  # untimed, as in time_rotation
    comm.Barrier()  # every rank starts the sample together, so all time the same calls
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    elapsed = time.perf_counter_ns() - t0
    return float(comm.allreduce(elapsed, op=mpi.MAX)) / iters / 1e9


def mpi_time_rotation(
    variants: dict[str, Callable[[], object]], comm: Any, mpi: Any, args: argparse.Namespace
) -> dict[str, list[float]]:
    """``time_rotation`` across ranks: every decision is taken on times every rank agrees on."""
    iters = {}
    for name, fn in variants.items():
        fn()  # warm-up
        calls = 1
        while True:
            total = mpi_sample(fn, calls, comm, mpi) * calls
            if total >= args.sample_ms * 1e-3 / 4 or calls >= 1 << 16:
                iters[name] = max(args.min_calls, round(calls * args.sample_ms * 1e-3 / max(total, 1e-9)))
                break
            calls *= 2
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            samples[name].append(mpi_sample(fn, iters[name], comm, mpi))
    return samples


def mpi_limit(nbytes: int, raw_s: float) -> float:
    """The most seconds MWMS may take for ``nbytes`` when raw MPI takes ``raw_s`` (the target)."""
    if nbytes >= MPI_LARGE:
        return MPI_TARGET_LARGE * raw_s
    factor, constant = MPI_TARGET_SMALL
    return factor * raw_s + constant


def mpi_bench_size(strategy: Any, comm: Any, mpi: Any, nbytes: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """Checks MWMS and raw MPI once against the exact sum, then times both (seconds per call)."""
    rank, n = comm.Get_rank(), comm.Get_size()

    def rank_buffer(r: int) -> np.ndarray:
        # Small integers: the sum over ranks is exact in any order of summation.
        return np.random.default_rng([nbytes, r]).integers(-1000, 1000, nbytes // 4).astype(np.float32)

    x = rank_buffer(rank)
    want = rank_buffer(0)
    for r in range(1, n):
        want += rank_buffer(r)
    raw = x.copy()

    def step(v):  # type: ignore[no-untyped-def]
        return td.distribute.get_replica_context().all_reduce("sum", v)

    variants: dict[str, Callable[[], object]] = {
        "MWMS": lambda: strategy.run(step, args=(x,)),
        "raw": lambda: comm.Allreduce(mpi.IN_PLACE, raw, op=mpi.SUM),
    }
    for r, got in enumerate(strategy.experimental_local_results(variants["MWMS"]())):
        check_equal(f"MWMS all_reduce in run (rank {rank}, local replica {r}, {size_label(nbytes)})", got, want)
    variants["raw"]()
    check_equal(f"raw Allreduce (rank {rank}, {size_label(nbytes)})", raw, want)
    return mpi_time_rotation(variants, comm, mpi, args)


def mpi_table_header() -> str:
    names = f"{'':>8}" + "".join(f" | {name:^23}" for name in MPI_VARIANTS)
    return (names + f" | {'MWMS/raw':>8} | {'target':>9}\n{'size':>8}" + f" | {'us':>9} {'algbw':>6} {'busbw':>6}" * 2
            + f" | {'x raw':>8} | {'<= us':>9}")


def mpi_table_row(nbytes: int, n: int, median_s: dict[str, float]) -> tuple[str, bool]:
    cells = []
    for name in MPI_VARIANTS:
        algbw, busbw = bandwidths(nbytes, n, median_s[name])
        busbw_text = "-" if busbw is None else f"{busbw:.2f}"
        cells.append(f" | {median_s[name] * 1e6:9.1f} {algbw:6.2f} {busbw_text:>6}")
    limit = mpi_limit(nbytes, median_s["raw"])
    ok = median_s["MWMS"] <= limit
    ratio = median_s["MWMS"] / median_s["raw"]
    row = f"{size_label(nbytes):>8}" + "".join(cells) + f" | {ratio:8.2f} | {limit * 1e6:9.1f} {'ok' if ok else 'MISS'}"
    return row, ok


def mpi_worker(args: argparse.Namespace, sizes: list[int]) -> None:
    """One rank of ``--mpi`` (started by mpiexec); rank 0 prints."""
    from mpi4py import MPI

    strategy = td.distribute.MultiWorkerMirroredStrategy()
    comm = MPI.COMM_WORLD.Dup()
    rank, n = comm.Get_rank(), comm.Get_size()
    if strategy.num_replicas_in_sync != n:
        raise RuntimeError(f"--mpi expects one replica per rank; got num_replicas_in_sync="
                           f"{strategy.num_replicas_in_sync} over {n} ranks.")
    if rank == 0:
        import mpi4py

        print(machine_info())
        print(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}; mpi4py {mpi4py.__version__}; "
              f"{n} ranks x 1 CPU replica ({strategy.extended.worker_devices[0]} on rank 0)")
        print(f"towerdist {getattr(td, '__version__', '?')}; float32; median of {args.repeats} samples (each >= "
              f"{args.sample_ms:g} ms and >= {args.min_calls} calls, started by a barrier, the slowest rank's time),")
        print("in microseconds per call; S = bytes per rank; algbw = S/t, busbw = algbw*2(n-1)/n in GB/s; "
              "MWMS = all_reduce in strategy.run; raw = comm.Allreduce(IN_PLACE) on a COMM_WORLD.Dup()")
        print(f"target: MWMS <= {MPI_TARGET_LARGE}x raw from 1 MiB up, <= {MPI_TARGET_SMALL[0]:g}x raw + "
              f"{MPI_TARGET_SMALL[1] * 1e6:g} us below\n")
        print(mpi_table_header(), flush=True)
    verdicts: dict[bool, list[bool]] = {True: [], False: []}  # large? -> met per size
    for nbytes in sizes:
        samples = mpi_bench_size(strategy, comm, MPI, nbytes, args)
        if rank == 0:
            row, ok = mpi_table_row(nbytes, n, {name: statistics.median(s) for name, s in samples.items()})
            verdicts[nbytes >= MPI_LARGE].append(ok)
            print(row, flush=True)
    if rank == 0:
        print()
        for large, label in ((True, f"from 1 MiB up (<= {MPI_TARGET_LARGE}x raw)"),
                             (False, f"below 1 MiB (<= {MPI_TARGET_SMALL[0]:g}x raw + "
                                     f"{MPI_TARGET_SMALL[1] * 1e6:g} us)")):
            met = verdicts[large]
            if met:
                print(f"target {label}: met at {sum(met)} of {len(met)} sizes: {'met' if all(met) else 'MISSED'}")
    comm.Free()


def launch_mpi(args: argparse.Namespace) -> None:
    """``--mpi``: runs this script's ``--mpi-worker`` mode under mpiexec and waits for it."""
    forwarded = ["--mpi-worker" if a == "--mpi" else a for a in sys.argv[1:]]
    run_mpi(mpi_command(args.ranks, Path(__file__).resolve(), forwarded), args.timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=None, help=f"bytes per replica, e.g. 1K,64M (default {DEFAULT_SIZES})")
    parser.add_argument("--replicas", default="2,4", help="comma-separated replica counts")
    parser.add_argument("--repeats", type=int, default=None, help="samples per variant (default 15; 5 with --quick)")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="minimum duration of one sample")
    parser.add_argument("--min-calls", type=int, default=None, help="least calls per sample (default 32; 4 with --quick)")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: sizes {QUICK_SIZES}, 5 repeats")
    parser.add_argument("--mpi", action="store_true", help="MultiWorkerMirroredStrategy against raw MPI, under mpiexec")
    parser.add_argument("--ranks", type=int, default=2, help="--mpi: processes (one CPU replica each)")
    parser.add_argument("--timeout", type=float, default=600.0, help="--mpi: seconds before the MPI job is killed")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)  # one rank of --mpi
    args = parser.parse_args()
    if args.mpi:
        if args.ranks < 2:
            parser.error(f"--mpi needs --ranks >= 2. Got --ranks={args.ranks}.")
        launch_mpi(args)
        return
    sizes = [parse_size(s) for s in (args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)).split(",")]
    replicas = sorted({int(r) for r in args.replicas.split(",")})
    args.repeats = repeats = args.repeats or (5 if args.quick else 11)
    args.min_calls = args.min_calls or (4 if args.quick else 32)
    if repeats < 3 or min(replicas) < 1 or args.min_calls < 1:
        parser.error(f"need --repeats >= 3, --min-calls >= 1 and replica counts >= 1. Got --repeats={repeats}, "
                     f"--min-calls={args.min_calls}, --replicas={args.replicas!r}.")
    if args.mpi_worker:
        mpi_worker(args, sizes)
        return

    print(machine_info())
    print(f"towerdist {getattr(td, '__version__', '?')}; float32; median of {repeats} samples (each >= "
          f"{args.sample_ms:g} ms and >= {args.min_calls} calls), in microseconds per call; S = bytes per replica;")
    print("algbw = S/t and busbw = algbw*2(n-1)/n in GB/s (1e9 B/s); x np = time / numpy time (lower is better);")
    print("numpy = the reference (one thread); numpy-par = one slice per core on a thread pool")

    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * max(replicas))
    target = None
    with ThreadPoolExecutor(max_workers=PAR_THREADS) as pool:
        for n in replicas:
            strategy = td.distribute.MirroredStrategy([f"CPU:{i}" for i in range(n)])
            print(f"\n{n} replica(s)\n{table_header()}")
            for nbytes in sizes:
                samples = bench_size(strategy, n, nbytes, pool, args)
                print(table_row(nbytes, n, {name: statistics.median(s) for name, s in samples.items()}))
                if (nbytes, n) == (TARGET_SIZE, TARGET_REPLICAS):
                    target = samples
            del strategy

    print()
    if target is None:
        print(f"DESIGN 11 target (all-reduce in run <= {TARGET_RATIO:.2f}x numpy at 64 MiB, 4 replicas): not measured "
              f"in this run (needs --sizes with 64M and --replicas with 4).")
        return
    for name in VARIANTS:
        deciles = statistics.quantiles(target[name], n=10, method="inclusive")
        print(f"64 MiB, 4 replicas, {name:<18} median {statistics.median(target[name]) * 1e3:8.2f} ms "
              f"(p10 {deciles[0] * 1e3:.2f}, p90 {deciles[-1] * 1e3:.2f})")
    ratio = statistics.median(target["all_reduce in run"]) / statistics.median(target["numpy"])
    verdict = "ok" if ratio <= TARGET_RATIO else "MISS"
    print(f"DESIGN 11 target: all-reduce in run / numpy = {ratio:.3f} (target <= {TARGET_RATIO:.2f}): {verdict}")


if __name__ == "__main__":
    main()
