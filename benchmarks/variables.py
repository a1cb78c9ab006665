"""What a variable update costs compared with the all-reduce it contains.

A replica-context ``v.assign_add(x)`` on a ``MirroredVariable`` with SUM aggregation is one
``merge_call``: an all-reduce of the replicas' values, then the update of every component.
This script times, side by side in one run, on n logical CPUs (``--replicas``, default 2,4)
and float32 sizes S per replica (``--sizes``):

* ``all_reduce in run``     ``run`` of ``get_replica_context().all_reduce("sum", x)`` (the floor);
* ``assign_add in run``     ``run`` of ``v.assign_add(x)`` (aggregated write, SUM);
* ``sync-on-read local``    ``run`` of ``s.assign_add(x)`` on a SUM sync-on-read variable
                            (replica-local: no communication);
* ``cross-replica assign``  ``v.assign(array)`` outside ``run`` (every component).

Variants are timed in rotation (sample k of each before sample k+1 of any) after a warm-up;
each sample makes ``--calls`` calls; the median over ``--repeats`` samples is reported with
its ratio to ``all_reduce in run``. On logical CPUs the mirrored components share one
buffer, so the update after the all-reduce is computed once, not n times.

Run:
    python benchmarks/variables.py [--sizes 4K,1M,16M] [--replicas 2,4] [--repeats 9]
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

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    unit = text[-1] if text[-1] in UNITS else ""
    return int(text[: len(text) - len(unit)] or 1) * UNITS[unit]


def time_variants(variants: dict[str, Callable[[], object]], calls: int, repeats: int) -> dict[str, float]:
    for fn in variants.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            gc.collect()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4K,1M,16M")
    parser.add_argument("--replicas", default="2,4")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",")]
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * max(counts))
    print(machine_info())
    header = f"{'replicas':>8} {'size':>6} {'variant':<22} {'median':>11} {'vs all_reduce':>14}"
    print(header)
    print("-" * len(header))
    for n in counts:
        strategy = td.distribute.MirroredStrategy([f"CPU:{i}" for i in range(n)])
        for size_text in args.sizes.split(","):
            medians = measure(strategy, parse_size(size_text) // 4, args.calls, args.repeats)
            floor = medians["all_reduce in run"]
            for name, median in medians.items():
                print(f"{n:>8} {size_text:>6} {name:<22} {median * 1e6:>9.1f}us {median / floor:>13.2f}x")


def measure(strategy: td.distribute.Strategy, count: int, calls: int, repeats: int) -> dict[str, float]:
    """Median seconds per call of every variant for ``count`` float32 values per replica."""
    n = strategy.num_replicas_in_sync
    buffers = [np.full(count, i + 1, np.float32) for i in range(n)]
    values = strategy.experimental_distribute_values_from_function(lambda ctx: buffers[ctx.replica_id_in_sync_group])
    with strategy.scope():
        mirrored = td.Variable(np.zeros(count, np.float32), aggregation=td.VariableAggregation.SUM)
        local = td.Variable(
            np.zeros(count, np.float32),
            synchronization=td.VariableSynchronization.ON_READ,
            aggregation=td.VariableAggregation.SUM,
        )
    host = np.ones(count, np.float32)

    def all_reduce(x: object) -> object:
        return td.distribute.get_replica_context().all_reduce("sum", x)

    def aggregated_write(x: object) -> object:
        return mirrored.assign_add(x, read_value=False)

    def local_write(x: object) -> object:
        return local.assign_add(x, read_value=False)

    strategy.run(aggregated_write, args=(values,))
    expected = n * (n + 1) / 2
    assert all(np.all(c.numpy() == expected) for c in mirrored.values), "assign_add gave a wrong sum"
    return time_variants(
        {
            "all_reduce in run": lambda: strategy.run(all_reduce, args=(values,)),
            "assign_add in run": lambda: strategy.run(aggregated_write, args=(values,)),
            "sync-on-read local": lambda: strategy.run(local_write, args=(values,)),
            "cross-replica assign": lambda: mirrored.assign(host, read_value=False),
        },
        calls,
        repeats,
    )

if __name__ == "__main__":
    main()
