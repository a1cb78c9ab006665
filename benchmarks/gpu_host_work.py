"""The host's work per step on one GPU: towerdist against the same step in plain cupy.

On a GPU a small step is bound by what the host does, not by the device: every kernel
launch, copy, event record or wait and device switch is a call into CUDA costing the host
microseconds, and every Python call on the step's path costs more. This benchmark runs two
steps on one GPU replica and counts, per step, what the host does for each:

* **digits step**: the main job's MLP (``examples/train_digits.py``: 64-256-256-10, ReLU,
  softmax cross-entropy, hand-written backward pass), a batch of 256, SGD (learning rate
  0.1) through ``optimizer.apply_gradients`` inside ``MirroredStrategy(["GPU:0"]).run``,
  against the same arithmetic in plain cupy (the update written as ``p -= rate * g``);
* **4 KiB all_reduce**: ``strategy.run`` of a function returning
  ``get_replica_context().all_reduce("sum", x)`` of a 4 KiB float32 buffer, against a bare
  cupy sum of the buffer (``x.sum()``, one kernel).

Counted per step: kernel launches, host<->device copies, copies between devices, CUDA events
made, recorded and waited for, device switches (``with cupy.cuda.Device(i)``), pinned host
allocations, NCCL calls, host-blocking synchronisations, and Python function calls on the
step's path (``sys.setprofile`` in every thread; the simulator's and numpy's own frames are
not counted, so the figure is what towerdist and the step's code run in Python).

On **simulated GPUs** (``--simulate N`` or ``TOWERDIST_SIMULATE_GPUS=N``; the default without
cupy) the CUDA calls are counted by the simulator (``towerdist.testing.simulated_gpu_stats``):
this is host work only, not GPU verification. With real cupy only the Python calls and the
wall time are reported; ``tools/gpu_check.py`` measures the on-GPU ratios (its ``steps``
stage). Run::

    python benchmarks/gpu_host_work.py [--simulate 1] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import machine_info  # noqa: E402

BATCH = 256
SGD_RATE = 0.1
REDUCE_BYTES = 4096

Step = Callable[[], Any]


class PythonCalls:
    """Counts Python function calls, in every thread, while ``counting`` (``sys.setprofile``).

    Frames of the simulated GPUs, cupy and numpy, and of the standard library called from
    them, are left out: they stand for CUDA and for cupy's own work, the same in both variants.
    """

    def __init__(self, skip: tuple[str, ...]) -> None:
        self.counting = False
        self.calls = 0
        self._skip = skip
        self._stdlib = (os.path.dirname(os.__file__), "<frozen ", "<string>")  # "<string>": namedtuple's methods
        self._lock = threading.Lock()

    def install(self) -> None:
        """Profiles this thread and every thread started from now on (replica threads included)."""
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)

    def uninstall(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not self.counting:
            return
        while frame is not None and frame.f_code.co_filename.startswith(self._stdlib):
            frame = frame.f_back  # the standard library counts where towerdist or the step called it
        if frame is None or not frame.f_code.co_filename.startswith(self._skip):
            with self._lock:
                self.calls += 1


class HostWork:
    """The host work of ``steps`` calls of a step: the simulator's counts, Python calls, wall time."""

    def __init__(self, simulated: bool) -> None:
        self.simulated = simulated
        skip = [os.path.dirname(np.__file__)]
        if simulated:
            from towerdist._src.backend import simulated as simulated_package

            skip.append(os.path.dirname(simulated_package.__file__))
        else:
            import cupy

            skip.append(os.path.dirname(cupy.__file__))
        self.python = PythonCalls(tuple(skip))
        self._sites: dict[str, int] = {}
        self.python.install()

    def count(self, step: Step, steps: int) -> dict[str, float]:
        """Per-step counts of ``step`` over ``steps`` calls (after 3 calls of warm-up)."""
        for _ in range(3):
            step()
        self._stats(reset=True)  # the counts start here
        self.python.calls = 0
        self.python.counting = True
        began = time.perf_counter()
        for _ in range(steps):
            step()
        took = time.perf_counter() - began
        self.python.counting = False
        counts = {kind: n / steps for kind, n in self._stats(reset=True).items() if kind != "sites"}
        for site, n in sorted(self._sites.items(), key=lambda item: -item[1]):
            print(f"    {n / steps:5.1f} {site}")
        counts["python_calls"] = self.python.calls / steps
        counts["wall_us"] = took / steps * 1e6
        return counts

    def _stats(self, reset: bool) -> dict[str, int]:
        if not self.simulated:
            return {}
        from towerdist.testing import simulated_gpu_stats

        snapshot = simulated_gpu_stats(reset=reset)
        self._sites = snapshot["host_work_sites"]
        counts: dict[str, int] = dict(snapshot["host_work"])
        counts["host_syncs"] = sum(snapshot["host_syncs"].values())
        return counts


# --- the steps ------------------------------------------------------------------------------------


def digits_steps(cp: Any, td: Any) -> tuple[Step, Step, Callable[[], float]]:
    """The digits SGD step in ``MirroredStrategy(["GPU:0"])`` and in plain cupy; a check of their agreement."""
    import train_digits

    rng = np.random.default_rng(0)
    x_host = rng.random((BATCH, 64), dtype=np.float32)
    y_host = rng.integers(0, 10, BATCH)
    rate = np.float32(SGD_RATE)
    with cp.cuda.Device(0):
        x, y = cp.asarray(x_host), cp.asarray(y_host)

    class Held:
        """An array standing where the model expects a variable (``.value()``): the plain-cupy model."""

        def __init__(self, array: Any) -> None:
            self.array = array

        def value(self) -> Any:
            return self.array

    reference = train_digits.MLP(seed=0)
    plain = train_digits.MLP.__new__(train_digits.MLP)
    with cp.cuda.Device(0):
        plain.kernels = [Held(cp.asarray(v.numpy())) for v in reference.kernels]
        plain.biases = [Held(cp.asarray(v.numpy())) for v in reference.biases]

    def plain_step() -> None:
        logits, inputs = plain.forward(x)
        _, dlogits = train_digits.softmax_cross_entropy(logits, y)
        for held, grad in zip(plain.parameters, plain.gradients(inputs, dlogits / BATCH)):
            held.array -= rate * grad

    strategy = td.distribute.MirroredStrategy(["GPU:0"])
    with strategy.scope():
        model = train_digits.MLP(seed=0)
        optimizer = td.optimizers.SGD(SGD_RATE)

    def train_step(xb: Any, yb: Any) -> None:
        logits, inputs = model.forward(xb)
        _, dlogits = train_digits.softmax_cross_entropy(logits, yb)
        optimizer.apply_gradients(zip(model.gradients(inputs, dlogits / BATCH), model.parameters))

    def towerdist_step() -> None:
        strategy.run(train_step, args=(x, y))

    def difference() -> float:
        return max(
            float(np.abs(v.numpy() - cp.asnumpy(h.array)).max()) for v, h in zip(model.parameters, plain.parameters)
        )

    return towerdist_step, plain_step, difference


def all_reduce_steps(cp: Any, td: Any) -> tuple[Step, Step]:
    """``strategy.run`` of a 4 KiB all_reduce on one GPU replica, and a bare cupy sum of the buffer."""
    with cp.cuda.Device(0):
        x = cp.arange(REDUCE_BYTES // 4, dtype=cp.float32)
    strategy = td.distribute.MirroredStrategy(["GPU:0"])

    def reduce(value: Any) -> Any:
        return td.distribute.get_replica_context().all_reduce("sum", value)

    def towerdist_step() -> None:
        strategy.run(reduce, args=(x,))

    def plain_step() -> None:
        x.sum()

    return towerdist_step, plain_step


# --- the report -----------------------------------------------------------------------------------

ROWS = (
    ("kernel_launches", "kernel launches"),
    ("h2d", "host->device copies (pageable)"),
    ("h2d_async", "host->device copies (pinned, async)"),
    ("d2h", "device->host copies"),
    ("d2d", "copies between devices"),
    ("events_created", "CUDA events made"),
    ("event_records", "event records"),
    ("event_waits", "stream waits for an event"),
    ("device_switches", "device switches (with Device(i))"),
    ("pinned_allocs", "pinned host allocations"),
    ("nccl_calls", "NCCL calls"),
    ("host_syncs", "host-blocking synchronisations"),
    ("python_calls", "Python calls on the step's path"),
    ("wall_us", "wall time, us (host only: says nothing of a GPU)"),
)


def table(title: str, towerdist: dict[str, float], plain: dict[str, float], plain_name: str) -> None:
    """Prints the per-step counts side by side, with towerdist / plain where plain is not zero."""
    print(f"\n{title}")
    print(f"  {'per step':<50} {'towerdist':>10} {plain_name:>10} {'ratio':>7}")
    for key, label in ROWS:
        if key not in towerdist:
            continue
        t, p = towerdist[key], plain[key]
        ratio = f"{t / p:.2f}x" if p else ("-" if not t else "inf")
        print(f"  {label:<50} {t:>10.1f} {p:>10.1f} {ratio:>7}")


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", type=int, default=None, metavar="N",
                        help="count on N simulated GPUs (default: real cupy if a GPU is visible, else 1)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=20, help="steps counted per variant (default 20)")
    parser.add_argument(
        "--sites", action="store_true", help="on simulated GPUs, also list where towerdist's host work is"
    )
    args = parser.parse_args(argv)
    simulate = args.simulate
    if simulate is None and not os.environ.get("TOWERDIST_SIMULATE_GPUS"):
        simulate = 0 if _real_gpu() else 1
    if simulate:
        os.environ["TOWERDIST_SIMULATE_GPUS"] = str(simulate)
    import towerdist as td
    import towerdist.testing
    from towerdist._src.backend import cupy_backend

    simulated = towerdist.testing.simulated_gpus_enabled()
    cp = cupy_backend.xp if simulated else cupy_backend.cupy_module()
    print(machine_info())
    if simulated:
        print(f"SIMULATED GPUs ({cp.machine.num_gpus}, numpy on the CPU): host work only, not GPU verification")
    else:
        print(f"real GPU: {cp.cuda.runtime.getDeviceProperties(0)['name']!r}, cupy {cp.__version__}; only Python calls "
              "and host wall time are counted here (tools/gpu_check.py measures the on-GPU ratios)")  # fmt: skip
    work = HostWork(simulated)
    if simulated and args.sites:
        cp.machine.stats.work_sites = True
    try:
        towerdist_step, plain_step, difference = digits_steps(cp, td)
        results = {"digits towerdist": work.count(towerdist_step, args.steps),
                   "digits plain": work.count(plain_step, args.steps)}  # fmt: skip
        reduce_step, sum_step = all_reduce_steps(cp, td)
        results["all_reduce towerdist"] = work.count(reduce_step, args.steps)
        results["all_reduce plain"] = work.count(sum_step, args.steps)
    finally:
        work.python.uninstall()
    table(f"digits SGD step, batch {BATCH}, one GPU replica: MirroredStrategy(['GPU:0']) vs plain cupy",
          results["digits towerdist"], results["digits plain"], "cupy")  # fmt: skip
    print(f"  (the two models agree to {difference():.1e} after the same number of steps)")
    table("strategy.run(all_reduce 4 KiB) on one GPU replica vs a bare cupy sum (x.sum())",
          results["all_reduce towerdist"], results["all_reduce plain"], "x.sum()")  # fmt: skip
    return results


def _real_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, or cupy without a GPU or driver: simulate
        return False


if __name__ == "__main__":
    main()
