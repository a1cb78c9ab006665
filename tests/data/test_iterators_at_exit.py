"""A program that exits with input pipelines still open exits promptly and quietly.

A preempted worker leaves with ``sys.exit(42)`` while its input pipelines are open, their
``prefetch`` threads perhaps blocked in user code (a read that never returns). The process
must leave within a scheduler's grace period (30 s by default in Slurm and Kubernetes), with
its status, and without "Exception ignored in: <generator ...>" noise from pipelines torn down
during interpreter shutdown.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import sys, threading
import numpy as np
import towerdist as td

blocked = threading.Event()

def reads_forever():
    yield np.int64(1)
    blocked.wait()  # a read that never returns
    yield np.int64(2)

iterators = []
for k in range(6):
    dataset = td.data.Dataset.from_generator(reads_forever, output_signature=td.TensorSpec((), td.int64))
    iterator = iter(dataset.map(lambda x: x + 1).prefetch(1))
    next(iterator)
    iterators.append(iterator)
plain = iter(td.data.Dataset.range(100).shuffle(10).map(lambda x: x * 2, num_parallel_calls=2).prefetch(2))
next(plain)
sys.exit(42)
"""


@pytest.mark.timeout(60)
def test_a_program_leaving_with_blocked_pipelines_exits_with_its_status_within_a_grace_period() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=30)
    assert done.returncode == 42, done.stderr
    assert "Exception ignored" not in done.stderr
    assert "Traceback" not in done.stderr
