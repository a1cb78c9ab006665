"""The cost of a non-chief worker's own checkpoint copy: a CheckpointManager save of the digits model, 2 ranks.

TensorFlow's multi-worker tutorial has every non-chief worker save into a ``workertemp_<id>``
directory of its own (and delete it). towerdist then writes the non-chief's copy too; when
every worker passes the same path only the chief writes. This times
``CheckpointManager.save()`` of the digits MLP (64-256-256-10, with Adam's slots: ~1.1 MB of
float32) under ``MultiWorkerMirroredStrategy`` on 2 ranks, in rotation:

* ``shared``: every rank saves into the same directory (only the chief writes);
* ``own``: rank 0 into ``ckpt``, rank 1 into ``workertemp_1/ckpt`` (both write);
* ``own+rmtree``: as ``own``, and rank 1 then removes its directory (the tutorial's loop).

Each sample is one save; its time is the slowest rank's (the save ends with an agreement, so
every rank leaves it together). Prints medians and p10/p90, on rank 0.

Usage::

    python benchmarks/checkpoint_save.py [--repeats 41] [--ranks 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

from _mpi_launch import mpi_command, run_mpi  # noqa: E402

from _machine import machine_info  # noqa: E402


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import towerdist as td

    from train_digits import MLP

    comm = MPI.COMM_WORLD
    rank = comm.rank
    strategy = td.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = MLP()
        optimizer = td.optimizers.Adam(0.001)
    optimizer.build(model.trainable_variables)
    checkpoint = td.train.Checkpoint(model=model, optimizer=optimizer)
    base = comm.bcast(tempfile.mkdtemp(prefix="td-ckpt-bench-") if rank == 0 else None, root=0)
    chief_dir = os.path.join(base, "ckpt")
    own_dir = chief_dir if rank == 0 else os.path.join(base, f"workertemp_{rank}", "ckpt")
    managers = {
        "shared": td.train.CheckpointManager(checkpoint, os.path.join(base, "shared"), max_to_keep=1),
        "own": td.train.CheckpointManager(checkpoint, own_dir, max_to_keep=1),
    }
    variants = {"shared": ("shared", False), "own": ("own", False), "own+rmtree": ("own", True)}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.repeats + 3):  # 3 warm-up rounds
        for name, (manager, remove) in variants.items():
            comm.Barrier()
            start = time.perf_counter()
            managers[manager].save()
            if remove and rank != 0:
                td.io.gfile.rmtree(own_dir)
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if round_ >= 3:
                samples[name].append(elapsed)
    nbytes = os.path.getsize(managers["shared"].latest_checkpoint + ".data-00000-of-00001")
    if rank == 0:
        print(machine_info())
        print(f"{comm.size} ranks; digits MLP + Adam slots: {nbytes / 1e6:.2f} MB data file; {args.repeats} saves each")
        print(f"{'variant':<12} {'median ms':>10} {'p10':>8} {'p90':>8}  ratio to shared")
        shared = statistics.median(samples["shared"])
        for name, values in samples.items():
            values.sort()
            median = statistics.median(values)
            p10, p90 = values[len(values) // 10], values[(len(values) * 9) // 10]
            print(f"{name:<12} {median * 1e3:>10.2f} {p10 * 1e3:>8.2f} {p90 * 1e3:>8.2f}  {median / shared:.2f}x")
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mpi_worker:
        worker(args)
        return
    forwarded = ["--mpi-worker", *sys.argv[1:]]
    run_mpi(mpi_command(args.ranks, Path(__file__).resolve(), forwarded), args.timeout)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
