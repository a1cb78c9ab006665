"""The README's main job, ``examples/quickstart.py``, runs and prints the documented results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_quickstart_prints_the_documented_results():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "PerReplica:{\n  0: array([5.], dtype=float32),\n  1: array([6.], dtype=float32)\n}" in out
    assert "PerReplica:{\n  0: array([6.], dtype=float32),\n  1: array([7.], dtype=float32)\n}" in out
    assert "array(11., dtype=float32)" in out
    assert "(np.int32(10), np.int32(11))" in out  # the TF 1.x merge_call example: 2 replicas -> [10, 11]
    assert "(array([3., 6.], dtype=float32), array([3., 6.], dtype=float32))" in out
