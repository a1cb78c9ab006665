"""What a user's own script pays for BLAS threads: CPU replicas with and without towerdist's limit.

A user-style training script (the digits MLP with Adam, its step in ``strategy.run`` over
logical CPUs, written inline: the example and ``train_scaling.py`` pin BLAS when imported)
that does *not* touch the BLAS threads runs in fresh processes, in alternation:

* ``default``      towerdist as installed: when more CPU replicas run at once than the BLAS
                   threads leave cores for, it limits the BLAS threads per replica
                   (``td.config.threading``);
* ``unlimited``    the BLAS library's own default kept (``OPENBLAS_NUM_THREADS`` and friends
                   set to the core count, which towerdist takes as the user's choice);
* ``pinned``       one BLAS thread (``OMP_NUM_THREADS=1`` and friends), as the benchmarks and
                   the example pin it;

each on 1 and 2 replicas (``--replicas``). The figure is examples/s over ``--seconds`` after a
warm-up, the median of ``--repeats`` processes; the BLAS threads each process ended with are
printed (threadpoolctl).

Run:
    python benchmarks/blas_threads.py [--repeats 5] [--batch 256] [--replicas 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _machine import machine_info

_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS")

# The user's script: the digits MLP trained with Adam in strategy.run, written the way a user
# would, with nothing about threads in it (the example and train_scaling.py pin BLAS
# themselves when imported, so neither is imported here).
_SCRIPT = r"""
import json, time
import numpy as np
import towerdist as td
from sklearn.datasets import load_digits

replicas, batch, seconds = {replicas}, {batch}, {seconds}
if replicas > 1:
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * replicas)
strategy = td.distribute.MirroredStrategy([f"CPU:{{i}}" for i in range(replicas)])
digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target
order = np.random.default_rng(0).permutation(np.resize(np.arange(len(x)), replicas * batch))
features = strategy.experimental_distribute_values_from_function(
    lambda ctx: x[order[ctx.replica_id_in_sync_group * batch:(ctx.replica_id_in_sync_group + 1) * batch]])
labels = strategy.experimental_distribute_values_from_function(
    lambda ctx: y[order[ctx.replica_id_in_sync_group * batch:(ctx.replica_id_in_sync_group + 1) * batch]])
rng = np.random.default_rng(0)
with strategy.scope():
    sizes = (64, 256, 256, 10)
    weights = [td.Variable((rng.standard_normal((a, b)) * np.sqrt(2 / a)).astype(np.float32))
               for a, b in zip(sizes[:-1], sizes[1:])]
    biases = [td.Variable(np.zeros(b, np.float32)) for b in sizes[1:]]
    optimizer = td.optimizers.Adam(1e-3)
parameters = [v for pair in zip(weights, biases) for v in pair]

def train_step(xb, yb):
    h, inputs = xb, []
    for k, (w, b) in enumerate(zip(weights, biases)):
        inputs.append(h)
        h = h @ w.value() + b.value()
        if k < 2:
            h = h * (h > 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    delta = e / e.sum(axis=1, keepdims=True)
    delta[np.arange(len(yb)), yb] -= 1.0
    delta /= replicas * batch
    grads = []
    for k in reversed(range(3)):
        grads[:0] = [inputs[k].T @ delta, delta.sum(axis=0)]
        if k:
            delta = (delta @ weights[k].value().T) * (inputs[k] > 0)
    optimizer.apply_gradients(zip(grads, parameters))

def step():
    strategy.run(train_step, args=(features, labels))

for _ in range(10):
    step()
start, steps = time.perf_counter(), 0
while time.perf_counter() - start < seconds:
    step()
    steps += 1
rate = steps * replicas * batch / (time.perf_counter() - start)
try:
    from threadpoolctl import threadpool_info
    blas = ", ".join(f"{{p['internal_api']}} {{p['num_threads']}}" for p in threadpool_info() if p["user_api"] == "blas")
except ImportError:
    blas = "unknown (no threadpoolctl)"
print(json.dumps({{"rate": rate, "blas": blas}}))
"""


def run(replicas: int, batch: int, seconds: float, variant: str) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k not in _VARIABLES}
    if variant == "unlimited":
        env.update({name: str(os.cpu_count() or 1) for name in _VARIABLES})
    elif variant == "pinned":
        env.update({name: "1" for name in _VARIABLES})
    script = _SCRIPT.format(replicas=replicas, batch=batch, seconds=seconds)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {variant} run on {replicas} replica(s) failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["rate"]), str(result["blas"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256, help="examples per replica per step")
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per process")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(machine_info())
    print(f"Adam on the digits MLP, {args.batch} examples per replica per step; medians of {args.repeats} fresh "
          f"processes per variant, in alternation; examples/s\n")
    variants = [(n, v) for n in args.replicas for v in ("default", "unlimited", "pinned")]
    rates: dict[tuple[int, str], list[float]] = {key: [] for key in variants}
    blas: dict[tuple[int, str], str] = {}
    for _ in range(args.repeats):
        for replicas, variant in variants:
            rate, threads = run(replicas, args.batch, args.seconds, variant)
            rates[(replicas, variant)].append(rate)
            blas[(replicas, variant)] = threads
    medians = {key: statistics.median(values) for key, values in rates.items()}
    print(f"  {'replicas':>8}  {'variant':<10}{'examples/s':>12}{'min':>10}{'max':>10}   BLAS threads at the end")
    for key in variants:
        values = rates[key]
        print(f"  {key[0]:>8}  {key[1]:<10}{medians[key]:>12,.0f}{min(values):>10,.0f}{max(values):>10,.0f}   {blas[key]}")
    for replicas in args.replicas:
        if replicas > 1:
            default, unlimited = medians[(replicas, "default")], medians[(replicas, "unlimited")]
            pinned = medians[(replicas, "pinned")]
            print(f"  {replicas} replicas: default / unlimited = {default / unlimited:.2f}x; default / pinned = "
                  f"{default / pinned:.2f}x")


if __name__ == "__main__":
    main()
