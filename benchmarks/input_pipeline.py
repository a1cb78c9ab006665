"""Throughput of the input pipeline, distributed over replicas, against plain numpy.

The pipeline is ``from_tensor_slices((x, y)).shuffle(S).batch(B).prefetch(AUTOTUNE)`` over
an MNIST-sized array (60000 x 784 float32 and int64 labels), distributed over
``--replicas`` logical CPUs (default 4). One sample is one epoch; the figure is examples
per second. Variants, timed in rotation in one run:

* ``numpy, precomputed batches``  a Python loop over a list of ready batches (the floor: no work);
* ``numpy, shuffle+gather``       what the pipeline does, written by hand: a permutation, then
                                  ``x[idx]`` per batch and a split into replica pieces;
* ``td.data``                     the pipeline iterated directly (no strategy);
* ``td distributed``              the pipeline through ``experimental_distribute_dataset``;
* ``tf.data distributed``         (when TensorFlow is importable) the same pipeline in
                                  ``tf.data`` through ``tf.distribute.MirroredStrategy``.

Every variant's epoch is checked to contain every example exactly once (label sum).

Run:
    python benchmarks/input_pipeline.py [--replicas 4] [--batch 256] [--repeats 7] [--compare-tf]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import numpy as np

import towerdist as td

from _machine import machine_info

N, FEATURES = 60000, 784


def epoch_numpy_precomputed(batches: list[tuple[np.ndarray, np.ndarray]]) -> int:
    total = 0
    for _, y in batches:
        total += int(y.sum())
    return total


def epoch_numpy_gather(x: np.ndarray, y: np.ndarray, batch: int, replicas: int, rng: np.random.Generator) -> int:
    order = rng.permutation(len(x))
    total = 0
    for start in range(0, len(x), batch):
        idx = order[start:start + batch]
        xb, yb = x[idx], y[idx]
        size = -(-len(idx) // replicas)
        pieces = [(xb[i * size:(i + 1) * size], yb[i * size:(i + 1) * size]) for i in range(replicas)]
        total += sum(int(p[1].sum()) for p in pieces)
    return total


def make_td_dataset(x: np.ndarray, y: np.ndarray, batch: int, shuffle: int) -> td.data.Dataset:
    return td.data.Dataset.from_tensor_slices((x, y)).shuffle(shuffle, seed=0).batch(batch).prefetch(td.data.AUTOTUNE)


def epoch_td(dataset: td.data.Dataset) -> int:
    return sum(int(yb.sum()) for _, yb in dataset)


def epoch_distributed(strategy: td.distribute.Strategy, dist: td.distribute.DistributedDataset) -> int:
    total = 0
    for _, yb in dist:
        total += sum(int(piece.sum()) for piece in strategy.experimental_local_results(yb))
    return total


def tf_variant(x: np.ndarray, y: np.ndarray, batch: int, shuffle: int, replicas: int) -> Callable[[], int] | None:
    try:
        import tensorflow as tf
    except ImportError:
        return None
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    strategy = tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(replicas)])
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(shuffle, seed=0).batch(batch).prefetch(tf.data.AUTOTUNE)
    dist = strategy.experimental_distribute_dataset(dataset)

    def epoch() -> int:
        total = 0
        for _, yb in dist:
            total += sum(int(t.numpy().sum()) for t in strategy.experimental_local_results(yb))
        return total

    return epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--shuffle", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compare-tf", action="store_true", help="also time tf.data + tf.distribute")
    args = parser.parse_args()

    print(machine_info())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, FEATURES), dtype=np.float32)
    y = rng.integers(0, 10, N).astype(np.int64)
    expected = int(y.sum())

    td.config.set_logical_device_configuration(
        td.config.list_physical_devices("CPU")[0], [td.config.LogicalDeviceConfiguration()] * args.replicas
    )
    strategy = td.distribute.MirroredStrategy([f"CPU:{i}" for i in range(args.replicas)])
    dataset = make_td_dataset(x, y, args.batch, args.shuffle)
    dist = strategy.experimental_distribute_dataset(dataset)
    order = rng.permutation(N)
    precomputed = [(x[order[i:i + args.batch]], y[order[i:i + args.batch]]) for i in range(0, N, args.batch)]

    variants: dict[str, Callable[[], int]] = {
        "numpy, precomputed batches": lambda: epoch_numpy_precomputed(precomputed),
        "numpy, shuffle+gather": lambda: epoch_numpy_gather(x, y, args.batch, args.replicas, rng),
        "td.data": lambda: epoch_td(dataset),
        "td distributed": lambda: epoch_distributed(strategy, dist),
    }
    if args.compare_tf:
        tf_epoch = tf_variant(x, y, args.batch, args.shuffle, args.replicas)
        if tf_epoch is None:
            print("TensorFlow is not importable: skipping the tf.data variant")
        else:
            variants["tf.data distributed"] = tf_epoch

    for name, fn in variants.items():  # warm-up, and check that every epoch is complete
        if fn() != expected:
            raise SystemExit(f"{name}: an epoch did not see every example exactly once")
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)

    print(
        f"\n{N} examples of {FEATURES} float32, global batch {args.batch}, shuffle buffer {args.shuffle}, "
        f"{args.replicas} replicas; median of {args.repeats} epochs"
    )
    reference = statistics.median(samples["numpy, shuffle+gather"])
    print(f"{'variant':<28} {'epoch ms':>10} {'examples/s':>12} {'vs numpy shuffle+gather':>24}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<28} {median * 1e3:>10.1f} {N / median:>12,.0f} {reference / median:>23.2f}x")


if __name__ == "__main__":
    main()
