"""The cost of saving an input iterator in a checkpoint: save and restore times and file sizes.

A model of the digits MLP's size scaled to MNIST (784 -> 256 -> 10, float32, Adam's two slots per
variable) is saved with ``td.train.Checkpoint`` without the iterator and with it, for three
input pipelines over 60,000 examples of 784 float32 features:

* ``shuffle(10_000).batch(256)``: the shuffle runs on indices (the batch gathers rows), so its
  buffer holds 10,000 indices;
* ``map(scale).shuffle(10_000).batch(256)``: the map makes new elements, so the buffer holds
  10,000 examples (31 MB of features);
* the same with ``.prefetch(2)``: the save also pauses the prefetch thread and copies its buffer.

Each checkpoint is taken after 7 steps, in a fresh directory; *save* is ``Checkpoint.write``,
*restore* is ``Checkpoint.read`` into a freshly built model and pipeline (the time a restarted
job waits), and *first step* is the first ``next()`` after the restore. Medians (p10-p90) of
``--repeats`` runs, measured in rotation. Target (DESIGN §11): restoring the
``shuffle(10_000)`` pipeline with its iterator under 1 s.

Run:
    python benchmarks/iterator_checkpoint.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

import towerdist as td

from _machine import machine_info

EXAMPLES, FEATURES, CLASSES, HIDDEN, BATCH, STEPS = 60_000, 784, 10, 256, 256, 7
rng = np.random.default_rng(0)
X = rng.random((EXAMPLES, FEATURES), dtype=np.float32)
Y = rng.integers(0, CLASSES, EXAMPLES)


def pipelines() -> dict[str, Callable[[], td.data.Dataset]]:
    source = lambda: td.data.Dataset.from_tensor_slices((X, Y))  # noqa: E731
    return {
        "shuffle(10000).batch(256)": lambda: source().shuffle(10_000, seed=1).batch(BATCH),
        "map.shuffle(10000).batch(256)": lambda: source().map(lambda x, y: (x * 2.0, y)).shuffle(10_000, seed=1).batch(BATCH),
        "map.shuffle(10000).batch(256).prefetch(2)": lambda: source()
        .map(lambda x, y: (x * 2.0, y))
        .shuffle(10_000, seed=1)
        .batch(BATCH)
        .prefetch(2),
    }


def model() -> tuple[list[td.Variable], td.optimizers.Adam]:
    variables = [
        td.Variable(rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32) * 0.05, name="w1"),
        td.Variable(np.zeros(HIDDEN, np.float32), name="b1"),
        td.Variable(rng.normal(size=(HIDDEN, CLASSES)).astype(np.float32) * 0.05, name="w2"),
        td.Variable(np.zeros(CLASSES, np.float32), name="b2"),
    ]
    optimizer = td.optimizers.Adam(1e-3)
    optimizer.apply_gradients([(np.zeros_like(v.numpy()), v) for v in variables])  # makes the slots
    return variables, optimizer


def size_of(prefix: str) -> int:
    directory, base = os.path.split(prefix)
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory) if n.startswith(base))


def one_run(name: str, make: Callable[[], td.data.Dataset], with_iterator: bool) -> tuple[float, float, float, int]:
    variables, optimizer = model()
    iterator = iter(make())
    for _ in range(STEPS):
        next(iterator)
    objects = {"model": variables, "optimizer": optimizer}
    if with_iterator:
        objects["iterator"] = iterator
    with tempfile.TemporaryDirectory() as directory:
        prefix = os.path.join(directory, "ckpt")
        start = time.perf_counter()
        td.train.Checkpoint(**objects).write(prefix)
        save = time.perf_counter() - start
        size = size_of(prefix)
        variables2, optimizer2 = model()
        restored = {"model": variables2, "optimizer": optimizer2}
        iterator2 = iter(make())
        if with_iterator:
            restored["iterator"] = iterator2
        start = time.perf_counter()
        td.train.Checkpoint(**restored).read(prefix).assert_consumed()
        restore = time.perf_counter() - start
        start = time.perf_counter()
        first = next(iterator2)
        first_step = time.perf_counter() - start
    if with_iterator:
        assert np.array_equal(first[1], next(iterator)[1]), "the restored iterator does not continue where it stood"
    iterator.close()
    iterator2.close()
    return save, restore, first_step, size


def describe(values: list[float]) -> str:
    values = sorted(values)
    p10 = values[int(0.1 * (len(values) - 1))]
    p90 = values[int(0.9 * (len(values) - 1) + 0.5)]
    return f"{statistics.median(values) * 1e3:8.1f} ms ({p10 * 1e3:.1f}-{p90 * 1e3:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(machine_info())
    cases = [(name, make, with_iterator) for name, make in pipelines().items() for with_iterator in (False, True)]
    results: dict[tuple[str, bool], list[tuple[float, float, float, int]]] = {(n, w): [] for n, _, w in cases}
    for _ in range(args.repeats):
        for name, make, with_iterator in cases:  # in rotation: a slow spell hits every case alike
            results[(name, with_iterator)].append(one_run(name, make, with_iterator))
    print(f"{'pipeline':44} {'iterator':9} {'save':>26} {'restore':>26} {'first step':>26} {'file':>10}")
    for name, _, with_iterator in cases:
        runs = results[(name, with_iterator)]
        saves, restores, firsts, sizes = zip(*runs)
        print(
            f"{name:44} {'with' if with_iterator else 'without':9} {describe(list(saves)):>26} "
            f"{describe(list(restores)):>26} {describe(list(firsts)):>26} {sizes[0] / 1e6:8.2f} MB"
        )


if __name__ == "__main__":
    main()
