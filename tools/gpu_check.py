"""towerdist's GPU check: what only a real GPU can tell, in one short run (~8 minutes at most).

Run it on a machine with a GPU, from the root of a checkout (``tools/gpu_check.sh`` first
installs wheels carried in ``.whl/`` for machines without network)::

    bash tools/gpu_check.sh                    # real GPU; writes gpu_check_out/summary.txt
    bash tools/gpu_check.sh --simulate 2 --quick   # the same stages on 2 SIMULATED GPUs (CI)

Each stage runs in its own process with its own time limit, within a total budget
(``--budget``, default 420 s); a stage the budget cannot fit is skipped and says so. Every
stage prints ``RESULT [PASS|FAIL|INFO] <name>: <detail>`` lines, gathered in order into
``<out>/summary.txt`` (one log per stage next to it). The exit status is 1 if any line is
FAIL or a stage failed or timed out, else 0.

Stages (in order of value per second):

* ``versions``: Python, numpy, optree, towerdist, cupy, CUDA runtime and driver, the GPU,
  NCCL's versions and towerdist's NCCL verdict.
* ``primitives``: what the event design pays and saves: a device synchronisation, a
  kernel launch, a launch plus synchronisation, an event record plus stream wait.
* ``ratios``: what towerdist costs on one GPU against plain cupy, as ratios of times
  measured side by side: the digits SGD step in ``MirroredStrategy(["GPU:0"])`` over the same
  step in plain cupy (target <= 1.05x), a 4 KiB ``all_reduce`` inside ``strategy.run`` over a
  bare cupy sum (target <= 2x), an upload from pageable against pinned memory, and whether a
  distributed iterator uploads through pinned staging buffers (the steps are
  ``benchmarks/gpu_host_work.py``'s). On simulated GPUs: the host work per step (kernel
  launches, events, Python calls...) counted by the simulator instead of times.
* ``nccl``: towerdist's NCCL paths on one GPU: ``NcclAllReduce`` over a one-rank clique
  (dtypes, views, host synchronisations per all-reduce) and ``NcclWorkers`` with one worker
  (the unique id as cupy returns it, the in-place sum).
* ``host_syncs``: whether a digits training step makes the host wait for the GPU: half a
  second of GPU work is queued first, and a step that waits cannot return before it has run
  (on simulated GPUs: the simulator's count of every synchronisation,
  ``towerdist.testing.simulated_gpu_stats``); target at most 2 per GPU per step.
* ``steps``: one training step (MLP forward/backward + Adam) in plain cupy against the same
  step inside ``MirroredStrategy(["GPU:0"])``: digits-sized and large.
* ``digits``: the main job (``examples/train_digits.py``) on the GPU against the CPU run:
  test accuracy (>= 0.95 and within 0.02) and every variable and slot on its GPU.
* ``bench``: ``towerdist bench allreduce --gpus`` (algbw/busbw as nccl-tests) and ``bench run --gpus``.
* ``test_gpu``: ``tests/backend/test_gpu.py``, ``tests/input/test_pinned_staging.py`` and
  ``tests/backend/test_gpu_host_work.py`` on the GPU(s) (the last two partly on simulated GPUs only),
  and ``tests/backend/test_gpu_ordering.py`` (simulated GPUs only).

On simulated GPUs every stage runs on numpy: the figures say nothing about GPUs (the
summary is headed SIMULATED); the run checks that the stages and towerdist's GPU code
paths work end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]

# name -> (seconds it may take on a real GPU, seconds in --quick mode)
STAGES: dict[str, tuple[int, int]] = {
    "versions": (45, 30),
    "primitives": (45, 30),
    "ratios": (75, 45),
    "nccl": (60, 40),
    "host_syncs": (60, 40),
    "steps": (80, 40),
    "digits": (120, 60),
    "bench": (60, 40),
    "test_gpu": (170, 90),
}


# --- the parent: runs the stages within the budget ------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "gpu_check_out"), help="where summary.txt and the logs go")
    parser.add_argument("--budget", type=int, default=420, help="total seconds (default 420)")
    parser.add_argument("--quick", action="store_true", help="fewer steps and epochs (a dry run)")
    parser.add_argument("--simulate", type=int, default=0, metavar="N", help="run on N simulated GPUs")
    parser.add_argument("--only", default="", help="comma-separated stages to run (default: all)")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # internal: run one stage in this process
    args = parser.parse_args(argv)
    if args.stage:
        return run_stage(args.stage, args.quick)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    env.pop("TOWERDIST_SIMULATE_GPUS", None)
    if args.simulate:
        env["TOWERDIST_SIMULATE_GPUS"] = str(args.simulate)
    env["GPU_CHECK_QUICK"] = "1" if args.quick else "0"
    stub = _digits_stub(out)
    if stub:
        env["PYTHONPATH"] += os.pathsep + stub
    start = time.monotonic()
    summary = out / "summary.txt"
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)
        summary.write_text("\n".join(lines) + "\n")

    mode = f"SIMULATED ({args.simulate} simulated GPUs: numpy on the CPU, not GPU verification)" if args.simulate else "real GPU"
    say(f"# towerdist GPU check, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {mode}")
    say(f"# source digest {_source_digest()} (sha256 of src/**/*.py); git HEAD {_commit()} (stale on a copied tree)")
    failed = False
    chosen = [s for s in STAGES if not args.only or s in args.only.split(",")]
    for name in chosen:
        limit = STAGES[name][1 if args.quick else 0]
        left = args.budget - (time.monotonic() - start)
        if left < min(limit, 20):
            say(f"[SKIP] {name}: the budget is spent ({left:.0f} s left)")
            continue
        limit = int(min(limit, left))
        log = out / f"{name}.log"
        began = time.monotonic()
        try:
            with log.open("w") as file:
                done = subprocess.run(
                    [sys.executable, __file__, "--stage", name, *(["--quick"] if args.quick else [])],
                    cwd=ROOT, env=env, stdout=file, stderr=subprocess.STDOUT, timeout=limit,
                )  # fmt: skip
            status = "DONE" if done.returncode == 0 else f"FAIL (exit {done.returncode})"
        except subprocess.TimeoutExpired:
            status = f"TIMEOUT after {limit} s"
        took = time.monotonic() - began
        say(f"[{status.split()[0]}] {name} ({took:.0f} s){'' if status == 'DONE' else ': ' + status}")
        failed |= status != "DONE"
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("RESULT "):
                say("  " + line[len("RESULT ") :])
                failed |= line.startswith("RESULT [FAIL]")
    say(f"# {'FAILURES: see the lines above' if failed else 'no failure'}; {time.monotonic() - start:.0f} s of {args.budget} s; "
        f"logs in {out}")  # fmt: skip
    return 1 if failed else 0


_STUB = {
    "__init__.py": "",
    "datasets.py": """
\"\"\"Stand-in for sklearn.datasets.load_digits on machines without scikit-learn (towerdist's GPU check).\"\"\"
import os, types
import numpy as np

def load_digits():
    saved = np.load(os.environ["GPU_CHECK_DIGITS"])
    return types.SimpleNamespace(data=saved["data"].astype(np.float64), target=saved["target"].astype(np.int64))
""",
    "model_selection.py": """
\"\"\"Stand-in for the one split the main job makes: train_test_split(test_size=0.2, random_state=0, stratify=y).\"\"\"
import os
import numpy as np

def train_test_split(x, y, test_size=None, random_state=None, stratify=None):
    if test_size != 0.2 or random_state != 0 or len(x) != 1797 or stratify is None:
        raise NotImplementedError("the GPU check's stand-in holds the digits split of seed 0 only")
    saved = np.load(os.environ["GPU_CHECK_DIGITS"])
    train, test = saved["train"].astype(np.int64), saved["test"].astype(np.int64)
    return x[train], x[test], y[train], y[test]
""",
}


def _digits_stub(out: pathlib.Path) -> str | None:
    """Without scikit-learn, a stand-in serving the digits from ``.whl/digits_seed0.npz``; its directory."""
    import importlib.util

    saved = ROOT / ".whl" / "digits_seed0.npz"
    if importlib.util.find_spec("sklearn") is not None or not saved.exists():
        return None
    package = out / "stub" / "sklearn"
    package.mkdir(parents=True, exist_ok=True)
    for name, text in _STUB.items():
        (package / name).write_text(text)
    os.environ["GPU_CHECK_DIGITS"] = str(saved)
    return str(package.parent)


def _source_digest() -> str:
    """A digest of the towerdist sources being checked: names the code even where git's HEAD is stale."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((ROOT / "src").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


# --- the stages (each in its own process) -------------------------------------------------------


def result(ok: bool | None, name: str, detail: str) -> None:
    tag = "INFO" if ok is None else "PASS" if ok else "FAIL"
    print(f"RESULT [{tag}] {name}: {detail}", flush=True)


def quick() -> bool:
    return os.environ.get("GPU_CHECK_QUICK") == "1"


def simulated() -> bool:
    return bool(os.environ.get("TOWERDIST_SIMULATE_GPUS"))


def cupy_module() -> Any:
    """cupy itself, or on simulated GPUs the simulated module towerdist uses."""
    if simulated():
        from towerdist._src.backend import cupy_backend  # the simulated cupy is reached through towerdist

        return cupy_backend.xp
    import cupy

    return cupy


def median_us(fn: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1e6)
    return statistics.median(samples)


def stage_versions() -> None:
    import platform

    import numpy
    import optree

    import towerdist as td

    facts: dict[str, Any] = {"python": platform.python_version(), "numpy": numpy.__version__,
                             "optree": optree.__version__, "towerdist": td.__version__}  # fmt: skip
    cp = cupy_module()
    facts["cupy"] = cp.__version__
    facts["gpus"] = [d.name for d in td.config.list_physical_devices("GPU")]
    runtime = cp.cuda.runtime
    for key, call in (("cuda_runtime", "runtimeGetVersion"), ("cuda_driver", "driverGetVersion")):
        try:
            facts[key] = getattr(runtime, call)()
        except Exception as error:  # noqa: BLE001  (a fact to report, whatever it is)
            facts[key] = f"{type(error).__name__}: {error}"
    try:
        name = runtime.getDeviceProperties(0)["name"]
        facts["gpu0"] = name.decode() if isinstance(name, bytes) else name
    except Exception as error:  # noqa: BLE001
        facts["gpu0"] = f"{type(error).__name__}: {error}"
    from towerdist._src.backend import cupy_backend  # cupy.cuda.nccl (a submodule cupy loads on demand)

    nccl = cupy_backend.nccl()
    for key, call in (("nccl_runtime", "get_version"), ("nccl_build", "get_build_version")):
        try:
            facts[key] = getattr(nccl, call)()
        except Exception as error:  # noqa: BLE001
            facts[key] = f"{type(error).__name__}: {error}"
    info = subprocess.run([sys.executable, "-m", "towerdist", "info"], capture_output=True, text=True, timeout=60)
    print(info.stdout, info.stderr)
    chosen = re.search(r"cross-device ops[^\n]*", info.stdout)
    facts["towerdist_info"] = chosen.group(0) if chosen else f"exit {info.returncode}"
    result(bool(facts["gpus"]), "versions", json.dumps(facts))


def stage_primitives() -> None:
    cp = cupy_module()
    repeats = 50 if quick() else 2000
    device = cp.cuda.Device(0)
    with device:
        x = cp.zeros(1024, cp.float32)
        stream = cp.cuda.Stream(non_blocking=True)
        event = cp.cuda.Event(disable_timing=True)
        device.synchronize()

        def record_and_wait() -> None:
            event.record(cp.cuda.get_current_stream())
            stream.wait_event(event)

        def launch_and_sync() -> None:
            x.__iadd__(1.0)
            device.synchronize()

        costs = {
            "Device.synchronize() idle": median_us(device.synchronize, repeats),
            "small kernel launch": median_us(lambda: x.__iadd__(1.0), repeats),
            "small kernel + Device.synchronize()": median_us(launch_and_sync, repeats),
            "event record + stream wait": median_us(record_and_wait, repeats),
            "get_current_stream()": median_us(cp.cuda.get_current_stream, repeats),
        }
        device.synchronize()
    result(None, "primitives", "; ".join(f"{k} {v:.1f} us" for k, v in costs.items()) + f" (medians of {repeats})")


TARGET_DIGITS_RATIO = 1.05  # the digits step in MirroredStrategy(["GPU:0"]) / plain cupy
TARGET_ALL_REDUCE_RATIO = 2.0  # strategy.run(all_reduce 4 KiB) on one GPU / a bare cupy sum


def _gpu_host_work() -> Any:
    """``benchmarks/gpu_host_work.py``: the one-GPU steps both variants of the ``ratios`` stage run."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_host_work

    return gpu_host_work


def _ms_per_step(cp: Any, fn: Callable[[], Any], steps: int) -> float:
    """Milliseconds per call of ``fn`` on GPU 0, the GPU's work included (synchronised at both ends)."""
    device = cp.cuda.Device(0)
    for _ in range(3):
        fn()
    device.synchronize()
    began = time.perf_counter()
    for _ in range(steps):
        fn()
    device.synchronize()
    return (time.perf_counter() - began) / steps * 1e3


def _side_by_side(cp: Any, variants: dict[str, Callable[[], Any]], steps: int, rounds: int) -> dict[str, float]:
    """The median over ``rounds`` of each variant's ms per step, the variants alternating within each round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(_ms_per_step(cp, fn, steps))
    return {name: statistics.median(samples) for name, samples in times.items()}


def _upload_us(cp: Any, shape: tuple[int, ...], repeats: int) -> tuple[float, float, int]:
    """Microseconds to upload a float32 array of ``shape`` to GPU 0 from pageable and from pinned memory; its bytes."""
    import numpy as np

    host = np.random.default_rng(0).random(shape, dtype=np.float32)
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(host.nbytes), np.float32, host.size).reshape(shape)
    pinned[...] = host
    device = cp.cuda.Device(0)
    with device:
        stream = cp.cuda.Stream(non_blocking=True)
        target = cp.empty(shape, cp.float32)

        def pageable() -> None:
            cp.asarray(host)
            device.synchronize()

        def from_pinned() -> None:
            target.set(pinned, stream=stream)
            stream.synchronize()

        return median_us(pageable, repeats), median_us(from_pinned, repeats), int(host.nbytes)


def _staging_of(iterator: Any) -> list[Any]:
    """The pinned staging buffers a distributed iterator uploads through (its copier's, by GPU)."""
    staging = iterator._copier._staging  # internal: a check of the library's own upload path
    return [buffer for each in staging.values() for buffer in each._buffers]


def _iterate_on_gpu(td: Any, steps: int) -> Any:
    """A distributed iterator over digits-sized batches on GPU 0, after ``steps`` batches were taken."""
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.random((4096, 64), dtype=np.float32), rng.integers(0, 10, 4096)
    strategy = td.distribute.MirroredStrategy(["GPU:0"])
    dataset = td.data.Dataset.from_tensor_slices((x, y)).repeat().batch(256, drop_remainder=True)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for _ in range(steps):
        strategy.run(lambda a, b: a.sum() + b.sum(), args=next(iterator))
    return iterator


def stage_ratios() -> None:

    import towerdist as td

    cp = cupy_module()
    bench = _gpu_host_work()
    digits_step, plain_step, difference = bench.digits_steps(cp, td)
    reduce_step, sum_step = bench.all_reduce_steps(cp, td)
    if simulated():
        _simulated_ratios(bench, td, (digits_step, plain_step), (reduce_step, sum_step))
        return
    rounds = 3 if quick() else 5
    steps = 20 if quick() else 200
    digits = _side_by_side(cp, {"towerdist": digits_step, "plain": plain_step}, steps, rounds)
    ratio = digits["towerdist"] / digits["plain"]
    result(ratio <= TARGET_DIGITS_RATIO, "digits SGD step on one GPU, MirroredStrategy(['GPU:0']) / plain cupy",
           f"{ratio:.2f}x ({digits['towerdist']:.3f} ms vs {digits['plain']:.3f} ms per step, medians of {rounds} "
           f"rounds of {steps}; the models agree to {difference():.1e}); target <= {TARGET_DIGITS_RATIO}x")  # fmt: skip
    reduced = _side_by_side(cp, {"towerdist": reduce_step, "plain": sum_step}, steps * 5, rounds)
    ratio = reduced["towerdist"] / reduced["plain"]
    result(ratio <= TARGET_ALL_REDUCE_RATIO, "strategy.run(all_reduce 4 KiB) on one GPU / a bare cupy sum (x.sum())",
           f"{ratio:.2f}x ({reduced['towerdist'] * 1e3:.1f} us vs {reduced['plain'] * 1e3:.1f} us per step, medians "
           f"of {rounds} rounds of {steps * 5}); target <= {TARGET_ALL_REDUCE_RATIO}x")  # fmt: skip
    repeats = 20 if quick() else 200
    for shape in ((256, 64), (4096, 4096)):
        page_us, pin_us, nbytes = _upload_us(cp, shape, repeats)
        result(None, f"upload of {nbytes / 2**20:.2f} MiB to GPU 0",
               f"from pageable memory (cupy.asarray) {page_us:.1f} us; from pinned memory (set on a stream) "
               f"{pin_us:.1f} us; pageable / pinned {page_us / pin_us:.1f}x (medians of {repeats})")  # fmt: skip
    buffers = _staging_of(_iterate_on_gpu(td, 5))
    pinned_ok = bool(buffers) and all(isinstance(b.memory, cp.cuda.PinnedMemoryPointer) for b in buffers)
    result(pinned_ok, "a distributed iterator uploads to the GPU through pinned staging buffers",
           f"{len(buffers)} buffer(s) after 5 steps, all cupy.cuda.PinnedMemoryPointer: {pinned_ok}; whether "
           "next(iterator) waits for the GPU: see the host_syncs stage")  # fmt: skip


def _simulated_ratios(bench: Any, td: Any, digits: tuple[Any, Any], reduce: tuple[Any, Any]) -> None:
    """The ``ratios`` stage on simulated GPUs: the host's work per step, counted (times mean nothing here)."""
    from towerdist.testing import simulated_gpu_stats

    steps = 5 if quick() else 20
    work = bench.HostWork(True)
    try:
        counted = {name: (work.count(pair[0], steps), work.count(pair[1], steps)) for name, pair in
                   (("digits SGD step", digits), ("strategy.run(all_reduce 4 KiB)", reduce))}  # fmt: skip
    finally:
        work.python.uninstall()
    keys = ("kernel_launches", "event_records", "event_waits", "device_switches", "host_syncs", "python_calls")
    for name, (towerdist, plain) in counted.items():
        result(None, f"{name} on one SIMULATED GPU: host work per step, towerdist vs plain cupy (not GPU times)",
               "; ".join(f"{k} {towerdist[k]:.0f} vs {plain[k]:.0f}" for k in keys))  # fmt: skip
    simulated_gpu_stats(reset=True)
    iterator = _iterate_on_gpu(td, 5)
    uploads = simulated_gpu_stats()["host_work"]
    ok = bool(_staging_of(iterator)) and uploads["h2d_async"] > 0 and uploads["h2d"] == 0
    result(ok, "a distributed iterator uploads to the SIMULATED GPU through pinned staging buffers",
           f"{uploads['h2d_async']} asynchronous uploads from pinned memory, {uploads['h2d']} from pageable memory, "
           f"{uploads['pinned_allocs']} pinned allocations in 5 steps")  # fmt: skip


class HostWaits:
    """Whether a call makes the host wait for the GPU.

    On real GPUs: about half a second of work is queued on GPU 0 first; a call that
    synchronises (explicitly, or inside cupy: a blocking ``.get()``, a scalar read) cannot
    return before that work has run, one that only queues work returns at once. This sees
    every kind of synchronisation, where counting cupy's ``synchronize`` methods sees only the
    ones made through the objects one can wrap. On simulated GPUs work runs eagerly, so the
    simulator's own count is used (``towerdist.testing.simulated_gpu_stats``).
    """

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        if simulated():
            return
        with cp.cuda.Device(0):
            self._matrix = cp.ones((4096, 4096), cp.float32) / 4096
            product = self._matrix @ self._matrix  # compile and warm up
            cp.cuda.Device(0).synchronize()
            began = time.perf_counter()
            for _ in range(5):
                product = self._matrix @ self._matrix
            cp.cuda.Device(0).synchronize()
            each = (time.perf_counter() - began) / 5
        self.queued_ms = 500.0
        self._count = max(1, int(self.queued_ms / 1e3 / each))
        del product

    def _queue(self) -> None:
        with self.cp.cuda.Device(0):
            product = self._matrix
            for _ in range(self._count):
                product = product @ self._matrix  # a chain: each waits for the one before

    def measure(self, fn: Callable[[], Any]) -> tuple[float, Any, dict[int, int]]:
        """``fn()``'s host milliseconds with the GPU busy, its value, and (simulated GPUs) its synchronisations."""
        if simulated():
            from towerdist.testing import simulated_gpu_stats

            simulated_gpu_stats(reset=True)
            value = fn()
            counted = simulated_gpu_stats()["host_syncs"]
            return 0.0, value, {int(k): int(v) for k, v in counted.items() if v}
        self._queue()
        began = time.perf_counter()
        value = fn()
        took = (time.perf_counter() - began) * 1e3
        self.cp.cuda.Device(0).synchronize()
        return took, value, {}

    def verdict(self, took_ms: float) -> bool:
        return took_ms < 0.25 * self.queued_ms


def stage_nccl() -> None:
    import numpy as np

    from towerdist._src.backend import cupy_backend
    from towerdist._src.cross_device_ops.nccl_all_reduce import NcclAllReduce
    from towerdist._src.device import DeviceSpec
    from towerdist._src.multi_worker.nccl_workers import NcclWorkers

    cp = cupy_module()
    waits = HostWaits(cp)
    gpu0 = (DeviceSpec(device_type="GPU", device_index=0),)
    ops = NcclAllReduce()
    with cp.cuda.Device(0):
        base = cp.arange(12, dtype=cp.float32).reshape(3, 4)
        cases = {
            "float32": base,
            "float64 transposed view": base.astype(cp.float64).T,
            "complex64": (base + 1j * base).astype(cp.complex64),
            "int16 (no NCCL type)": base.astype(cp.int16),
        }
    for name, value in cases.items():
        ops._all_reduce_pack(gpu0, [value], 0)  # communicators made, kernels compiled
        took, _, waited = waits.measure(lambda value=value: ops._all_reduce_pack(gpu0, [value], 0))
        (summed,) = ops._all_reduce_pack(gpu0, [value], 0)
        with cp.cuda.Device(0):
            same = bool(np.array_equal(cp.asnumpy(summed), cp.asnumpy(value)))
        host = _host_wait_text(waits, took, waited)
        result(same and summed.device.id == 0 and _no_host_wait(waits, took, waited),
               f"NcclAllReduce one rank, {name}", f"sum correct {same}, on GPU {summed.device.id}; {host}")  # fmt: skip

    class Communicator:
        def agree(self, *args: Any) -> None:
            return None

        def mark_broken(self, reason: str) -> None:
            print("mark_broken:", reason)

    class OneWorker:
        rank, size = 0, 1
        communicator = Communicator()

        def broadcast_bytes(self, data: bytes, api: str) -> bytes:
            return data

    made = cupy_backend.nccl().get_unique_id()
    result(None, "nccl.get_unique_id()", f"{type(made).__name__} of {len(made)}")
    try:
        workers = NcclWorkers(OneWorker(), 0)  # type: ignore[arg-type]
    except Exception as error:  # noqa: BLE001  (reported)
        result(False, "NcclWorkers creates its communicator (N1)", f"{type(error).__name__}: {error}")
        return
    result(True, "NcclWorkers creates its communicator (N1)", "with the unique id as cupy returns it")
    with cp.cuda.Device(0):
        buffers = [cp.arange(1 << (10 if quick() else 20), dtype=cp.float32), (cp.arange(100) * (1 + 2j)).astype(cp.complex64)]
        expected = [cp.asnumpy(b) for b in buffers]
    took, _, waited = waits.measure(lambda: workers.sum(buffers, "gpu_check", 60.0, None))
    with cp.cuda.Device(0):
        same = all(np.array_equal(cp.asnumpy(b), e) for b, e in zip(buffers, expected))
    result(same and _no_host_wait(waits, took, waited), "NcclWorkers.sum, one worker",
           f"in-place sum correct {same}; {_host_wait_text(waits, took, waited)}")  # fmt: skip


def _no_host_wait(waits: HostWaits, took: float, waited: dict[int, int]) -> bool:
    return not waited if simulated() else waits.verdict(took)


def _host_wait_text(waits: HostWaits, took: float, waited: dict[int, int]) -> str:
    if simulated():
        return f"host syncs {waited or 'none'} (simulator's count)"
    return f"returned in {took:.1f} ms with {waits.queued_ms:.0f} ms of GPU work queued ahead (a host wait would take it all)"


def _train_digits() -> Any:
    """The main job's module (``examples/train_digits.py``)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import train_digits

    return train_digits


def stage_host_syncs() -> None:
    import numpy as np

    import towerdist as td

    waits = HostWaits(cupy_module())
    train_digits = _train_digits()
    gpus = td.config.list_logical_devices("GPU")
    strategy = td.distribute.MirroredStrategy([d.name for d in gpus])
    rng = np.random.default_rng(0)
    x = rng.random((4096, 64)).astype(np.float32)
    y = rng.integers(0, 10, 4096)
    batch = 512
    with strategy.scope():
        model = train_digits.MLP(seed=0)
        optimizer = td.optimizers.Adam(4e-3)
        loss_metric = td.metrics.Mean("loss")
        accuracy = td.metrics.SparseCategoricalAccuracy("accuracy")

    def train_step(xb: Any, yb: Any) -> Any:
        logits, inputs = model.forward(xb)
        losses, dlogits = train_digits.softmax_cross_entropy(logits, yb)
        loss = td.nn.compute_average_loss(losses, global_batch_size=batch)
        optimizer.apply_gradients(zip(model.gradients(inputs, dlogits / batch), model.parameters))
        loss_metric.update_state(losses)
        accuracy.update_state(yb, logits)
        return loss

    data = strategy.experimental_distribute_dataset(
        td.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
    )
    iterator = iter(data)
    for _ in range(3):
        strategy.run(train_step, args=next(iterator))
    steps = 3 if quick() else 10
    nexts, runs, counted = [], [], {}
    for _ in range(steps):
        took, batch_in, waited = waits.measure(lambda: next(iterator))
        nexts.append(took)
        took, _, also = waits.measure(lambda batch_in=batch_in: strategy.run(train_step, args=batch_in))
        runs.append(took)
        for gpu, n in [*waited.items(), *also.items()]:
            counted[gpu] = counted.get(gpu, 0) + n
    if simulated():
        per_step = {gpu: n / steps for gpu, n in sorted(counted.items())}
        result(max(per_step.values(), default=0) <= 2, f"host syncs per GPU per digits training step ({len(gpus)} GPU(s))",
               f"{per_step or 'none'} over {steps} steps (the simulator counts every synchronisation); target <= 2")  # fmt: skip
        return
    run_ms, next_ms = statistics.median(runs), statistics.median(nexts)
    result(waits.verdict(run_ms), f"host waits in a digits training step ({len(gpus)} GPU(s))",
           f"strategy.run returned in {run_ms:.1f} ms (median of {steps}) with {waits.queued_ms:.0f} ms of GPU work "
           f"queued ahead: it does not wait for the GPU; target <= 2 host syncs per step")  # fmt: skip
    result(None if waits.verdict(next_ms) else False, "host waits in the input pipeline (next(iterator))",
           f"{next_ms:.1f} ms (median) with the GPU busy"
           + ("" if waits.verdict(next_ms) else ": the input copies waited for the GPU"))  # fmt: skip


def stage_steps() -> None:
    import numpy as np

    import towerdist as td

    cp = cupy_module()
    device = cp.cuda.Device(0)
    train_digits = _train_digits()  # the main job's MLP and loss, for both variants

    class Held:
        """An array standing where the model expects a variable (``.value()``): the plain-cupy variant."""

        def __init__(self, array: Any) -> None:
            self.array = array

        def value(self) -> Any:
            return self.array

    def case(name: str, sizes: tuple[int, ...], batch: int, steps: int) -> None:
        with device:
            rng = np.random.default_rng(1)
            x = cp.asarray(rng.standard_normal((batch, sizes[0])).astype(np.float32))
            y = cp.asarray(rng.integers(0, sizes[-1], batch))
            reference = train_digits.MLP(sizes, seed=0)  # host variables: their initial values
            plain = train_digits.MLP.__new__(train_digits.MLP)
            plain.kernels = [Held(cp.asarray(v.numpy())) for v in reference.kernels]
            plain.biases = [Held(cp.asarray(v.numpy())) for v in reference.biases]
            slots = [(cp.zeros_like(p.value()), cp.zeros_like(p.value())) for p in plain.parameters]
        count = [0]

        def gradients(model: Any) -> list[Any]:
            logits, inputs = model.forward(x)
            _, dlogits = train_digits.softmax_cross_entropy(logits, y)
            return model.gradients(inputs, dlogits / batch)  # type: ignore[no-any-return]

        def plain_step() -> None:  # Adam's arithmetic on bare cupy arrays
            count[0] += 1
            one, b1, b2, eps = np.float32(1), np.float32(0.9), np.float32(0.999), np.float32(1e-7)
            alpha = np.float32(1e-3) * np.sqrt(one - b2 ** np.float32(count[0])) / (one - b1 ** np.float32(count[0]))
            with device:
                for i, (held, grad) in enumerate(zip(plain.parameters, gradients(plain))):
                    m, v = slots[i]
                    m = (grad - m) * (one - b1) + m
                    v = (grad * grad - v) * (one - b2) + v
                    held.array = held.array - m * alpha / (cp.sqrt(v) + eps)
                    slots[i] = (m, v)

        strategy = td.distribute.MirroredStrategy(["GPU:0"])
        with strategy.scope():
            model = train_digits.MLP(sizes, seed=0)
            optimizer = td.optimizers.Adam(1e-3)

        def mirrored_step() -> None:
            strategy.run(lambda: optimizer.apply_gradients(zip(gradients(model), model.parameters)))

        rounds: dict[str, list[float]] = {"plain": [], "mirrored": []}
        for _ in range(3):
            rounds["plain"].append(_ms_per_step(cp, plain_step, steps))
            rounds["mirrored"].append(_ms_per_step(cp, mirrored_step, steps))
        p, m = statistics.median(rounds["plain"]), statistics.median(rounds["mirrored"])
        result(None, f"step, {name}", f"plain cupy {p:.3f} ms; MirroredStrategy(['GPU:0']) {m:.3f} ms; "
               f"ratio {m / p:.2f}x (medians of 3 rounds of {steps} steps)")  # fmt: skip

    case("digits MLP 64-256-256-10, batch 512, Adam", (64, 256, 256, 10), 512, 10 if quick() else 200)
    if quick():
        case("MLP 256-512-512-256, batch 256, Adam (quick)", (256, 512, 512, 256), 256, 3)
    else:
        case("large MLP 1024-4096-4096-1024, batch 4096, Adam", (1024, 4096, 4096, 1024), 4096, 30)


def stage_digits() -> None:
    import tempfile


    epochs = 3 if quick() else 40
    least = 0.8 if quick() else 0.95
    train_digits = _train_digits()
    with tempfile.TemporaryDirectory() as directory:
        gpu = train_digits.train(epochs=epochs, checkpoint_dir=f"{directory}/gpu", progress=False, log=print)
        placed = []
        for variable in gpu["model"].parameters:
            placed.append([c.value().device.id for c in variable.values])
            for slot in gpu["optimizer"].get_slot_names():
                placed.append([c.value().device.id for c in gpu["optimizer"].get_slot(variable, slot).values])
        placement_ok = all(p == list(range(gpu["replicas"])) for p in placed)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        env.pop("TOWERDIST_SIMULATE_GPUS", None)
        cpu = subprocess.run(
            [sys.executable, str(ROOT / "examples/train_digits.py"), "--replicas", "1", "--epochs", str(epochs),
             "--no-progress", "--checkpoint-dir", f"{directory}/cpu"],
            env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    print(cpu.stdout[-2000:], cpu.stderr[-2000:])
    found = re.search(r"Test accuracy ([0-9.]+);", cpu.stdout)
    cpu_accuracy = float(found.group(1)) if found else float("nan")
    accuracy = gpu["test_accuracy"]
    ok = placement_ok and accuracy >= least and abs(accuracy - cpu_accuracy) <= 0.02
    result(ok, f"main job on {gpu['replicas']} GPU(s)",
           f"test accuracy {accuracy:.4f} vs CPU {cpu_accuracy:.4f} (need >= {least} and within 0.02); every "
           f"variable and slot on its GPU: {placement_ok}; {gpu['examples_per_second']:,.0f} examples/s")  # fmt: skip


def stage_bench() -> None:
    sizes = "4K,1M" if quick() else "4K,1M,16M,64M"
    runs = [
        ["allreduce", "--gpus", "--sizes", sizes, "--repeats", "3", "--sample-ms", "5" if quick() else "20", "--progress", "off"],
        ["run", "--gpus", "--repeats", "3", "--sample-ms", "5" if quick() else "20"],
    ]  # fmt: skip
    for args in runs:
        done = subprocess.run([sys.executable, "-m", "towerdist", "bench", *args], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        print(done.stdout, done.stderr)
        rows = [line for line in done.stdout.splitlines() if re.match(r"^\s+\d", line) or "strategy.run(" in line]
        result(done.returncode == 0, f"towerdist bench {args[0]}", " | ".join(" ".join(r.split()) for r in rows) or "no rows")


def stage_test_gpu() -> None:
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "tests/backend/test_gpu.py", "tests/backend/test_gpu_ordering.py",
            "tests/backend/test_gpu_host_work.py", "tests/input/test_pinned_staging.py"]
    if quick():
        args += ["-x"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(done.stdout[-20000:], done.stderr[-5000:])
    counts = re.findall(r"\d+ (?:passed|failed|skipped|errors?)", done.stdout)
    failures = [line for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    result(done.returncode == 0, "tests/backend/test_gpu.py, test_gpu_ordering.py, test_gpu_host_work.py and tests/input/test_pinned_staging.py", ", ".join(counts) + ("; " + "; ".join(failures[:10]) if failures else ""))


def run_stage(name: str, quick_mode: bool) -> int:
    if quick_mode:
        os.environ["GPU_CHECK_QUICK"] = "1"
    stage = globals().get(f"stage_{name}")
    if stage is None:
        print(f"unknown stage {name!r}; the stages are {', '.join(STAGES)}")
        return 2
    stage()
    return 0


if __name__ == "__main__":
    sys.exit(main())
