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

Run:
    python benchmarks/allreduce.py [--sizes 1K,64K,4M,64M] [--replicas 2,4] [--repeats 11] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import towerdist as td

from _machine import machine_info

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
QUICK_SIZES = "4K,1M,16M"
TARGET_RATIO = 1 / 0.9  # all-reduce in run / numpy, at 64 MiB and 4 replicas
TARGET_SIZE, TARGET_REPLICAS = 64 << 20, 4
VARIANTS = ("numpy", "all_reduce in run", "strategy.reduce", "numpy-par")
PAR_THREADS = os.cpu_count() or 1  # numpy-par: one thread per core
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=None, help=f"bytes per replica, e.g. 1K,64M (default {DEFAULT_SIZES})")
    parser.add_argument("--replicas", default="2,4", help="comma-separated replica counts")
    parser.add_argument("--repeats", type=int, default=None, help="samples per variant (default 15; 5 with --quick)")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="minimum duration of one sample")
    parser.add_argument("--min-calls", type=int, default=None, help="least calls per sample (default 32; 4 with --quick)")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: sizes {QUICK_SIZES}, 5 repeats")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in (args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)).split(",")]
    replicas = sorted({int(r) for r in args.replicas.split(",")})
    args.repeats = repeats = args.repeats or (5 if args.quick else 11)
    args.min_calls = args.min_calls or (4 if args.quick else 32)
    if repeats < 3 or min(replicas) < 1 or args.min_calls < 1:
        parser.error(f"need --repeats >= 3, --min-calls >= 1 and replica counts >= 1. Got --repeats={repeats}, "
                     f"--min-calls={args.min_calls}, --replicas={args.replicas!r}.")

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
