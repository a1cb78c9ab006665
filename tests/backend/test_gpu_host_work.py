"""What the host does in a one-GPU training step, against the same step in plain cupy.

On a GPU a small step is bound by the host: every kernel launch, copy, event and device
switch is a call into CUDA. These tests count them on simulated GPUs (the simulator's
``host_work``) for the steps ``benchmarks/gpu_host_work.py`` reports, and pin that towerdist
adds no CUDA call to a one-GPU step but the optimizer's step counter (one kernel). They
run on simulated GPUs only (``TOWERDIST_SIMULATE_GPUS=2``); the step counter tests run on
any GPU.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

import towerdist as td
from towerdist.testing import simulated_gpus_enabled

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

simulated_only = pytest.mark.skipif(
    not simulated_gpus_enabled(),
    reason="reads the simulated GPUs' counters: run with TOWERDIST_SIMULATE_GPUS=2",
)


def host_work_per_step(step, steps: int = 4) -> dict[str, float]:
    from towerdist.testing import simulated_gpu_stats

    for _ in range(2):
        step()
    simulated_gpu_stats(reset=True)
    for _ in range(steps):
        step()
    snapshot = simulated_gpu_stats(reset=True)
    counts = {kind: n / steps for kind, n in snapshot["host_work"].items()}
    counts["host_syncs"] = sum(snapshot["host_syncs"].values()) / steps
    return counts


@simulated_only
@pytest.mark.gpus(1)
def test_a_one_gpu_digits_step_adds_one_kernel_and_no_other_cuda_call_to_plain_cupys():
    import gpu_host_work
    from towerdist._src.backend import cupy_backend

    towerdist_step, plain_step, difference = gpu_host_work.digits_steps(cupy_backend.xp, td)
    towerdist = host_work_per_step(towerdist_step)
    plain = host_work_per_step(plain_step)
    assert towerdist["kernel_launches"] == plain["kernel_launches"] + 1  # the step counter's increment
    others = {k: v for k, v in towerdist.items() if k != "kernel_launches" and v}
    assert others == {}, others  # no upload, event, device switch or host synchronisation
    assert difference() == 0.0  # and the two train alike


@simulated_only
@pytest.mark.gpus(1)
def test_a_4_kib_all_reduce_inside_run_on_one_gpu_launches_one_kernel_like_a_bare_sum():
    import gpu_host_work
    from towerdist._src.backend import cupy_backend

    reduce_step, sum_step = gpu_host_work.all_reduce_steps(cupy_backend.xp, td)
    assert host_work_per_step(reduce_step) == host_work_per_step(sum_step)


@pytest.mark.parametrize("replicas", [pytest.param(1, marks=pytest.mark.gpus(1)), pytest.param(2, marks=pytest.mark.gpus(2))])
def test_the_step_counter_on_gpus_counts_every_step_and_follows_an_assignment(replicas):
    strategy = td.distribute.MirroredStrategy([d.name for d in td.config.list_logical_devices("GPU")[:replicas]])
    with strategy.scope():
        w = td.Variable(np.ones(3, np.float32))
        optimizer = td.optimizers.SGD(0.1)

    def step():
        optimizer.apply_gradients([(td.ones([3]), w)])

    for _ in range(3):
        strategy.run(step)
    assert int(optimizer.iterations.numpy()) == 3
    optimizer.iterations.assign(10)
    strategy.run(step)
    strategy.run(step)
    assert int(optimizer.iterations.numpy()) == 12
    counts = [int(np.asarray(c.value().get())) for c in optimizer.iterations.values]
    assert counts == [12] * replicas
    assert [c.value().device.id for c in optimizer.iterations.values] == list(range(replicas))
