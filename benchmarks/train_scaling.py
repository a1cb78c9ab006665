"""Data-parallel training throughput: the digits MLP step on 1, 2 and 4 CPU replicas.

The step is ``examples/train_digits.py``'s: forward and hand-written backward pass of the
64-256-256-10 MLP, ``Adam.apply_gradients`` (merge_call, one packed all-reduce of the six
gradients, the update of every variable). Each replica gets ``--batch`` examples (weak
scaling: the global batch grows with the replicas), cut from the digits data once and
kept on the replicas, so the figure is the step alone. Variants, timed in rotation:

* ``numpy loop``        the same model and Adam update in one plain numpy process (no towerdist);
* ``numpy x2 threads``  two independent numpy loops on two threads, no communication at all:
                        the most 2 replicas could reach on this machine (the ceiling);
* ``towerdist N``       ``MirroredStrategy`` over N logical CPUs, N = 1, 2, 4;
* ``PyTorch DDP N``     (when torch is importable) the same model, batch and Adam in
                        ``DistributedDataParallel`` over gloo with N = 1, 2 processes.

BLAS is pinned to one thread (per replica, per process) so that N replicas use N cores.
The target (DESIGN.md section 11): 2 replicas on 2 cores >= 1.7x one replica.

Run:
    python benchmarks/train_scaling.py [--batch 64 256] [--repeats 7] [--seconds 0.4]
"""

from __future__ import annotations

import os

# Before numpy is imported: one BLAS thread, so replicas (threads) and processes are the parallelism.
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import towerdist as td  # noqa: E402

from _machine import machine_info  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import train_digits  # noqa: E402

REPLICAS = (1, 2, 4)


def blas_threads() -> str:
    """What the BLAS libraries report (threadpoolctl when installed), else the environment."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']} (threadpoolctl not installed)"
    pools = threadpool_info()
    return ", ".join(f"{p['internal_api']}: {p['num_threads']} thread(s)" for p in pools) or "no BLAS found"


def batches(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``n * size`` digits (repeated as needed), in a fixed shuffled order."""
    x, y, _, _ = train_digits.load_digits(0)
    order = np.random.default_rng(0).permutation(np.resize(np.arange(len(x)), n * size))
    return x[order], y[order]


# --- the plain numpy loop ---------------------------------------------------------------------


class NumpyAdam:
    """Adam on plain arrays with Keras's rule (the reference the towerdist step is compared with)."""

    def __init__(self, parameters: list[np.ndarray], learning_rate: float = 1e-3) -> None:
        self.parameters = parameters
        self.m = [np.zeros_like(p) for p in parameters]
        self.v = [np.zeros_like(p) for p in parameters]
        self.lr, self.t = np.float32(learning_rate), 0

    def apply(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        b1, b2, one = np.float32(0.9), np.float32(0.999), np.float32(1)
        alpha = self.lr * np.sqrt(one - b2 ** np.float32(self.t)) / (one - b1 ** np.float32(self.t))
        for k, g in enumerate(grads):
            self.m[k] = self.m[k] + (g - self.m[k]) * (one - b1)
            self.v[k] = self.v[k] + (g * g - self.v[k]) * (one - b2)
            self.parameters[k] = self.parameters[k] - self.m[k] * alpha / (np.sqrt(self.v[k]) + np.float32(1e-7))


def numpy_step_fn(batch: int) -> Callable[[], None]:
    model = train_digits.MLP(seed=0)
    params = [p.numpy().copy() for p in model.parameters]
    adam = NumpyAdam(params)
    x, y = batches(1, batch)

    def step() -> None:
        h, inputs = x, []
        for k in range(0, len(adam.parameters), 2):
            inputs.append(h)
            h = h @ adam.parameters[k] + adam.parameters[k + 1]
            if k + 2 < len(adam.parameters):
                h = h * (h > 0)
        _, dlogits = train_digits.softmax_cross_entropy(h, y)
        delta, grads = dlogits / batch, []
        for k in reversed(range(0, len(adam.parameters), 2)):
            grads[:0] = [inputs[k // 2].T @ delta, delta.sum(axis=0)]
            if k:
                delta = (delta @ adam.parameters[k].T) * (inputs[k // 2] > 0)
        adam.apply(grads)

    return step


def threaded_numpy_step_fn(threads: int, batch: int) -> Callable[[], None]:
    """``threads`` independent numpy loops, one step each per call, on persistent threads."""
    import queue
    import threading

    steps = [numpy_step_fn(batch) for _ in range(threads)]
    inboxes: list[queue.SimpleQueue[int]] = [queue.SimpleQueue() for _ in range(threads)]
    done: queue.SimpleQueue[int] = queue.SimpleQueue()

    def worker(k: int) -> None:
        while inboxes[k].get():
            steps[k]()
            done.put(k)

    for k in range(threads):
        threading.Thread(target=worker, args=(k,), daemon=True).start()

    def step() -> None:
        for inbox in inboxes:
            inbox.put(1)
        for _ in range(threads):
            done.get(timeout=60)

    return step


# --- towerdist --------------------------------------------------------------------------------


def towerdist_step_fn(replicas: int, batch: int) -> Callable[[], None]:
    strategy = td.distribute.MirroredStrategy([f"CPU:{i}" for i in range(replicas)])
    global_batch = replicas * batch
    x, y = batches(replicas, batch)
    features = strategy.experimental_distribute_values_from_function(
        lambda ctx: td.constant(x[ctx.replica_id_in_sync_group * batch:(ctx.replica_id_in_sync_group + 1) * batch]))
    labels = strategy.experimental_distribute_values_from_function(
        lambda ctx: td.constant(y[ctx.replica_id_in_sync_group * batch:(ctx.replica_id_in_sync_group + 1) * batch]))
    with strategy.scope():
        model = train_digits.MLP(seed=0)
        optimizer = td.optimizers.Adam(1e-3)

    def train_step(xb: Any, yb: Any) -> None:
        logits, inputs = model.forward(xb)
        _, dlogits = train_digits.softmax_cross_entropy(logits, yb)
        optimizer.apply_gradients(zip(model.gradients(inputs, dlogits / global_batch), model.parameters))

    def step() -> None:
        strategy.run(train_step, args=(features, labels))

    return step


# --- PyTorch DDP (optional) ------------------------------------------------------------------


def torch_ddp_rates(batch: int, processes: int, seconds: float, repeats: int) -> list[float] | None:
    """examples/s samples of DDP over gloo with ``processes`` ranks, or None without torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    import subprocess
    import tempfile

    script = Path(__file__).resolve().parent / "_torch_ddp_worker.py"
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "rates.txt"
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
                   "--master_port=29517", str(script), str(batch), str(seconds), str(repeats), str(out)]
        subprocess.run(command, check=True, timeout=600, capture_output=True)
        return [float(v) for v in out.read_text().split()]


# --- timing -----------------------------------------------------------------------------------


def calibrate(step: Callable[[], None], seconds: float) -> int:
    for _ in range(3):
        step()
    start = time.perf_counter()
    steps = 0
    while time.perf_counter() - start < seconds / 4:
        step()
        steps += 1
    return max(3, int(steps * 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256], help="examples per replica per step")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.4, help="length of one sample")
    args = parser.parse_args()

    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * max(REPLICAS))
    print(machine_info())
    print(f"BLAS threads pinned to 1 per replica: {blas_threads()}")
    print(f"medians of {args.repeats} samples of ~{args.seconds}s, variants in rotation; examples/s\n")

    for batch in args.batch:
        variants: dict[str, tuple[Callable[[], None], int]] = {
            "numpy loop": (numpy_step_fn(batch), 1),
            "numpy x2 threads": (threaded_numpy_step_fn(2, batch), 2),
        }
        for n in REPLICAS:
            variants[f"towerdist {n}"] = (towerdist_step_fn(n, batch), n)
        steps = {name: calibrate(step, args.seconds) for name, (step, _) in variants.items()}
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, (step, replicas) in variants.items():
                start = time.perf_counter()
                for _ in range(steps[name]):
                    step()
                rates[name].append(steps[name] * batch * replicas / (time.perf_counter() - start))
        for processes in (1, 2):
            ddp = torch_ddp_rates(batch, processes, args.seconds, args.repeats)
            if ddp is not None:
                rates[f"PyTorch DDP {processes}"] = ddp
        medians = {name: statistics.median(values) for name, values in rates.items()}
        one = medians["towerdist 1"]
        print(f"per-replica batch {batch}")
        print(f"  {'variant':<18}{'examples/s':>12}{'p10':>10}{'p90':>10}{'vs towerdist 1':>16}{'vs numpy':>10}")
        for name, values in rates.items():
            deciles = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
            print(f"  {name:<18}{medians[name]:>12,.0f}{deciles[0]:>10,.0f}{deciles[-1]:>10,.0f}"
                  f"{medians[name] / one:>15.2f}x{medians[name] / medians['numpy loop']:>9.2f}x")
        verdict = "meets" if medians["towerdist 2"] / one >= 1.7 else "misses"
        ceiling = medians["numpy x2 threads"] / medians["numpy loop"]
        print(f"  2 replicas / 1 replica = {medians['towerdist 2'] / one:.2f}x ({verdict} the 1.7x target); "
              f"this machine's ceiling (2 numpy threads / 1) = {ceiling:.2f}x")
        if "PyTorch DDP 1" not in rates:
            print("  PyTorch DDP: torch is not importable here; skipped")
        print()


if __name__ == "__main__":
    main()
