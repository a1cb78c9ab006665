"""Reducing sparse gradients (``td.IndexedSlices``) against a dense all-reduce of the same gradient.

The gradient of a 100,000 x 64 float32 embedding table (``--rows``, ``--width``) from a batch
that touches a fraction of its rows (``--densities``, default 0.1 %, 1 %, 10 %) with repeated
rows: every replica draws ``density * rows`` row numbers at random (with replacement), then
repeats a fifth of them, so each replica's slices hold duplicates and the replicas overlap
partly. For each replica count (``--replicas``, default 2,4), on a ``MirroredStrategy`` over
logical CPUs, timed in rotation (sample k of every variant before sample k+1 of any):

* ``sparse``         ``strategy.run(step, args=(slices,))`` where ``step`` returns
  ``get_replica_context().all_reduce("sum", g)`` of the replica's ``IndexedSlices``
  (each replica sums its repeated rows, then only the distinct rows are merged);
* ``dense``          the same ``all_reduce`` of the gradient already densified (a
  ``rows x width`` array per replica, made before timing: the all-reduce alone);
* ``densify+dense``  ``all_reduce(td.convert_to_tensor(g))``: what a user does without
  sparse support (TF's and Horovod's ``sparse_as_dense``): densify, then all-reduce.

The same three are also timed as ``strategy.extended.reduce_to("sum", v, v)`` in
cross-replica context (an all-reduce: the result on every replica's device), which is the
reduction alone; inside ``run`` every variant also pays the replicas' thread hand-offs (an
``empty run`` of the same replicas is timed beside: about 0.25 ms on a 2-core AMD EPYC VM).
The target is read on ``reduce_to``.

Bytes: what each variant's reduction reads from the replicas, ``sum over replicas of
distinct rows x (row + 8-byte index)`` for ``sparse`` and ``replicas x rows x row`` for
``dense``. Every result is checked once per case: the densified ``sparse`` result equals
the ``dense`` one exactly (the rows are summed in replica order on both paths).

Ratios are ``dense / sparse`` (how many times faster the sparse reduction is) and
``densify+dense / sparse``. DESIGN 11's target (read on ``reduce_to``): >= 10x at 1 %
density, and the sparse reduction never slower than the dense one at any density measured.

**--tf-python PATH**: also times TensorFlow's ``MirroredStrategy`` (``tf.distribute``
over the same number of logical CPUs, eager ``strategy.run`` of ``all_reduce`` of
``tf.IndexedSlices`` and of the dense gradient) by running this script's ``--tf-worker``
mode under that Python (one where ``import tensorflow`` works), in its own process.

**--mpi**: re-launches this script under ``mpiexec -n 2`` (``--ranks``): a
``MultiWorkerMirroredStrategy`` with one CPU replica per rank; ``sparse`` and ``dense``
as above across the processes (the distinct rows travel in one ``Allgatherv``; the dense
gradient in one ``Allreduce``); each sample's time is the slowest rank's.

Run:
    python benchmarks/sparse.py [--replicas 2,4] [--densities 0.001,0.01,0.1] [--repeats 9]
    python benchmarks/sparse.py --mpi
    python benchmarks/sparse.py --tf-python /path/to/venv-with-tensorflow/bin/python
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from _machine import machine_info

TARGET_DENSITY, TARGET_RATIO = 0.01, 10.0
VARIANTS = ("sparse", "dense", "densify+dense")


def batch_rows(rng: np.random.Generator, rows: int, density: float) -> np.ndarray:
    """Row numbers of one replica's batch: ``density * rows`` draws, a fifth of them repeated."""
    drawn = rng.integers(0, rows, size=max(1, int(round(density * rows))))
    repeats = rng.choice(drawn, size=max(1, drawn.shape[0] // 5))
    return np.concatenate([drawn, repeats])


def gradients(replicas: int, rows: int, width: int, density: float, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each replica's ``(indices, values)``: small integers, so every sum is exact in any order."""
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(replicas):
        indices = batch_rows(rng, rows, density)
        values = rng.integers(-8, 8, size=(indices.shape[0], width)).astype(np.float32)
        result.append((indices, values))
    return result


def timed(fn: Callable[[], object], calls: int) -> float:
    gc.collect()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def calibrate(fn: Callable[[], object], sample_ms: float) -> int:
    calls = 1
    while True:
        if timed(fn, calls) * calls * 1e3 >= sample_ms or calls >= 1 << 12:
            return calls
        calls *= 2


def rotation(variants: dict[str, Callable[[], object]], repeats: int, sample_ms: float) -> dict[str, list[float]]:
    for fn in variants.values():
        fn()  # warm-up
    calls = {name: calibrate(fn, sample_ms) for name, fn in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            samples[name].append(timed(fn, calls[name]))
    return samples


def distinct_rows(parts: list[tuple[np.ndarray, np.ndarray]]) -> int:
    return sum(int(np.unique(indices).shape[0]) for indices, _ in parts)


def spread(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{(high - low) / statistics.median(values) * 100:.0f}%"


# --- towerdist, one process ------------------------------------------------------------------


def bench_replicas(td: Any, replicas: int, density: float, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    strategy = td.distribute.MirroredStrategy([f"CPU:{i}" for i in range(replicas)])
    parts = gradients(replicas, args.rows, args.width, density)
    shape = [args.rows, args.width]
    slices = strategy.experimental_distribute_values_from_function(
        lambda ctx: td.IndexedSlices(parts[ctx.replica_id_in_sync_group][1], parts[ctx.replica_id_in_sync_group][0], shape)
    )
    # (copied: a zero-filled array's untouched pages all map to the kernel's one zero page, which
    # reads faster than memory; a gradient computed densely is written everywhere)
    dense = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.array(
            td.convert_to_tensor(
                td.IndexedSlices(parts[ctx.replica_id_in_sync_group][1], parts[ctx.replica_id_in_sync_group][0], shape)
            ),
            copy=True,
        )
    )

    def all_reduce(g: Any) -> Any:
        return td.distribute.get_replica_context().all_reduce("sum", g)

    def densify_then_reduce(g: Any) -> Any:
        return td.distribute.get_replica_context().all_reduce("sum", td.convert_to_tensor(g))

    sparse_result = strategy.experimental_local_results(strategy.run(all_reduce, args=(slices,)))[0]
    dense_result = strategy.experimental_local_results(strategy.run(all_reduce, args=(dense,)))[0]
    if not np.array_equal(td.convert_to_tensor(sparse_result), dense_result):
        raise SystemExit(f"sparse and dense all-reduce differ ({replicas} replicas, density {density})")
    extended = strategy.extended
    sparse_result = extended.reduce_to("sum", slices, slices)
    dense_result = extended.reduce_to("sum", dense, dense)
    if not np.array_equal(td.convert_to_tensor(strategy.experimental_local_results(sparse_result)[0]),
                          strategy.experimental_local_results(dense_result)[0]):  # fmt: skip
        raise SystemExit(f"sparse and dense reduce_to differ ({replicas} replicas, density {density})")
    in_run = rotation(
        {
            "sparse": lambda: strategy.run(all_reduce, args=(slices,)),
            "dense": lambda: strategy.run(all_reduce, args=(dense,)),
            "densify+dense": lambda: strategy.run(densify_then_reduce, args=(slices,)),
            "empty run": lambda: strategy.run(lambda g: g, args=(slices,)),
        },
        args.repeats,
        args.sample_ms,
    )
    cross_replica = rotation(
        {
            "sparse": lambda: extended.reduce_to("sum", slices, slices),
            "dense": lambda: extended.reduce_to("sum", dense, dense),
            "densify+dense": lambda: extended.reduce_to(
                "sum", strategy.experimental_distribute_values_from_function(
                    lambda ctx: td.convert_to_tensor(strategy.experimental_local_results(slices)[ctx.replica_id_in_sync_group])
                ), dense),
        },
        args.repeats,
        args.sample_ms,
    )  # fmt: skip
    return {"in run": in_run, "reduce_to": cross_replica}


def report(label: str, density: float, parts_rows: int, replicas: int, args: argparse.Namespace, samples: dict[str, list[float]], tf: dict[str, float] | None) -> bool:
    median = {name: statistics.median(values) for name, values in samples.items()}
    row_bytes = args.width * 4
    sparse_bytes = parts_rows * (row_bytes + 8)
    dense_bytes = replicas * args.rows * row_bytes
    faster = median["dense"] / median["sparse"]
    line = (
        f"{label:<14} {density * 100:>6.1f}% {median['sparse'] * 1e3:>9.3f} ({spread(samples['sparse']):>4}) "
        f"{median['dense'] * 1e3:>9.3f} ({spread(samples['dense']):>4}) "
        f"{median.get('densify+dense', float('nan')) * 1e3:>9.3f} "
        f"{sparse_bytes / 2**20:>8.2f} {dense_bytes / 2**20:>8.1f} {faster:>7.1f}x"
    )
    if "densify+dense" in median:
        line += f" {median['densify+dense'] / median['sparse']:>7.1f}x"
    if "empty run" in median:
        line += f"  empty run {median['empty run'] * 1e3:.3f}"
    if tf is not None:
        line += f"   TF sparse {tf['sparse'] * 1e3:.2f} ms ({tf['sparse'] / median['sparse']:.0f}x ours), dense {tf['dense'] * 1e3:.2f} ms"
    print(line, flush=True)
    ok = faster >= 1.0 and (density != TARGET_DENSITY or faster >= TARGET_RATIO)
    return ok


def header() -> None:
    print(
        f"{'case':<14} {'density':>7} {'sparse ms':>9} {'':6} {'dense ms':>9} {'':6} {'dens+dn ms':>9} "
        f"{'sparse MB':>8} {'dense MB':>8} {'dense/sp':>8} {'d+d/sp':>7}"
    )


def in_process(args: argparse.Namespace, tf_python: str | None) -> bool:
    import towerdist as td

    most = max(args.replicas)
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * most)
    ok = True
    results = []
    for replicas in args.replicas:
        for density in args.densities:
            parts = gradients(replicas, args.rows, args.width, density)
            tf = tf_times(tf_python, replicas, density, args) if tf_python else None
            results.append((replicas, density, distinct_rows(parts), bench_replicas(td, replicas, density, args), tf))
    print("\nextended.reduce_to(SUM, v, v) in cross-replica context: the reduction itself (the target's measure)")
    header()
    for replicas, density, rows, samples, _ in results:
        ok &= report(f"{replicas} replicas", density, rows, replicas, args, samples["reduce_to"], None)
    print("\nReplicaContext.all_reduce inside strategy.run (what a training step pays; 'empty run' is a run of")
    print("the same replicas that reduces nothing)")
    header()
    for replicas, density, rows, samples, tf in results:
        report(f"{replicas} replicas", density, rows, replicas, args, samples["in run"], tf)
    return ok


# --- TensorFlow (its own process) -------------------------------------------------------------


def tf_times(python: str, replicas: int, density: float, args: argparse.Namespace) -> dict[str, float]:
    command = [python, str(Path(__file__).resolve()), "--tf-worker", "--replicas", str(replicas),
               "--densities", str(density), "--rows", str(args.rows), "--width", str(args.width),
               "--repeats", str(args.repeats), "--sample-ms", str(args.sample_ms)]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the TensorFlow worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def tf_worker(args: argparse.Namespace) -> None:
    import tensorflow as tf

    replicas, density = args.replicas[0], args.densities[0]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    strategy = tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(replicas)])
    parts = gradients(replicas, args.rows, args.width, density)
    shape = tf.constant([args.rows, args.width], tf.int64)

    def sparse_value(ctx: Any) -> Any:
        indices, values = parts[ctx.replica_id_in_sync_group]
        return tf.IndexedSlices(tf.constant(values), tf.constant(indices), shape)

    def dense_value(ctx: Any) -> Any:
        return tf.convert_to_tensor(sparse_value(ctx))

    slices = strategy.experimental_distribute_values_from_function(sparse_value)
    dense = strategy.experimental_distribute_values_from_function(dense_value)

    def all_reduce(g: Any) -> Any:
        return tf.distribute.get_replica_context().all_reduce("sum", g)

    samples = rotation(
        {"sparse": lambda: strategy.run(all_reduce, args=(slices,)), "dense": lambda: strategy.run(all_reduce, args=(dense,))},
        args.repeats,
        args.sample_ms,
    )
    print(json.dumps({name: statistics.median(values) for name, values in samples.items()}))


# --- across processes (MPI) --------------------------------------------------------------------


def mpi_worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import towerdist as td

    strategy = td.distribute.MultiWorkerMirroredStrategy()
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    shape = [args.rows, args.width]
    if rank == 0:
        print(f"{size} MPI ranks, one CPU replica each (MultiWorkerMirroredStrategy); times are the slowest rank's")
        header()
    ok = True
    for density in args.densities:
        parts = gradients(size, args.rows, args.width, density)
        indices, values = parts[rank]
        slices = td.IndexedSlices(values, indices, shape)
        dense = np.array(td.convert_to_tensor(slices), copy=True)  # written memory (see bench_replicas)

        def all_reduce(g: Any) -> Any:
            return td.distribute.get_replica_context().all_reduce("sum", g)

        got = strategy.run(all_reduce, args=(slices,))
        want = strategy.run(all_reduce, args=(dense,))
        if not np.array_equal(td.convert_to_tensor(got), want):
            raise SystemExit(f"rank {rank}: sparse and dense all-reduce differ (density {density})")
        variants = {
            "sparse": lambda s=slices: strategy.run(all_reduce, args=(s,)),
            "dense": lambda d=dense: strategy.run(all_reduce, args=(d,)),
        }
        for fn in variants.values():
            fn()
        calls = {name: max(comm.allreduce(calibrate(fn, args.sample_ms), op=MPI.MAX), 1) for name, fn in variants.items()}
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                comm.Barrier()
                samples[name].append(comm.allreduce(timed(fn, calls[name]), op=MPI.MAX))
        if rank == 0:
            ok &= report(f"{size} ranks", density, distinct_rows(parts), size, args, samples, None)
    if rank == 0:
        print("targets met" if ok else "TARGET MISSED", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="2,4")
    parser.add_argument("--densities", default="0.001,0.01,0.1")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--sample-ms", type=float, default=200.0)
    parser.add_argument("--tf-python", default=None, help="a Python that imports tensorflow (timed beside)")
    parser.add_argument("--mpi", action="store_true", help="time across 2 MPI processes instead")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--tf-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.replicas = [int(x) for x in str(args.replicas).split(",")]
    args.densities = [float(x) for x in str(args.densities).split(",")]
    if args.tf_worker:
        tf_worker(args)
        return
    if args.mpi_worker:
        mpi_worker(args)
        return
    print(machine_info())
    print(f"table {args.rows} x {args.width} float32 ({args.rows * args.width * 4 / 2**20:.1f} MiB); median of "
          f"{args.repeats} samples (spread = (max - min) / median)")  # fmt: skip
    if args.mpi:
        from _mpi_launch import mpi_command, run_mpi

        forwarded = ["--mpi-worker" if a == "--mpi" else a for a in sys.argv[1:]]
        run_mpi(mpi_command(args.ranks, Path(__file__).resolve(), forwarded), args.timeout)
        return
    ok = in_process(args, args.tf_python)
    print("targets met" if ok else "TARGET MISSED")


if __name__ == "__main__":
    main()
