"""The main job as a user runs it: ``examples/train_digits.py`` on its default replicas and on one.

Each run is a fresh process (``python examples/train_digits.py --no-progress``), exactly the
README's command; the two variants alternate, ``--repeats`` times each, so that a slow spell
of the machine hits both alike. The figure is the example's own "training examples/s"
(time inside the training loop: input pipeline, ``strategy.run`` of the step, metrics), and
the test accuracy it reaches. Targets: the default run is faster than ``--replicas 1`` and
reaches the same accuracy (issue 14); it is at least 1.3x ``--replicas 1`` (issue 35).

Run:
    python benchmarks/main_job.py [--repeats 5] [-- extra arguments for the example]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _machine import machine_info

TARGET_DEFAULT_OVER_ONE = 1.3  # issue 35: the default run / --replicas 1

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"
LAST_LINE = re.compile(r"Test accuracy ([0-9.]+); ([0-9,]+) training examples/s on (\d+) replica\(s\)\.")


def run_example(extra: list[str]) -> tuple[float, float, int]:
    """One run of the example in a fresh process: (examples/s, test accuracy, replicas)."""
    with tempfile.TemporaryDirectory() as checkpoints:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--no-progress", "--checkpoint-dir", checkpoints, *extra],
            capture_output=True, text=True, timeout=600, check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"train_digits.py {' '.join(extra)} failed:\n{done.stderr}")
    match = LAST_LINE.search(done.stdout.strip().splitlines()[-1])
    if match is None:
        raise SystemExit(f"unexpected last line from train_digits.py:\n{done.stdout}")
    return float(match[2].replace(",", "")), float(match[1]), int(match[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="passed to train_digits.py (after --)")
    args = parser.parse_args()
    print(machine_info())
    variants = {"default": list(args.extra), "--replicas 1": ["--replicas", "1", *args.extra]}
    speeds: dict[str, list[float]] = {name: [] for name in variants}
    accuracies: dict[str, set[float]] = {name: set() for name in variants}
    replicas: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, extra in variants.items():
            speed, accuracy, count = run_example(extra)
            speeds[name].append(speed)
            accuracies[name].add(accuracy)
            replicas[name] = count
    print(f"{'variant':<14} {'replicas':>8} {'median ex/s':>12} {'min':>9} {'max':>9}  test accuracy")
    for name in variants:
        values = speeds[name]
        print(f"{name:<14} {replicas[name]:>8} {statistics.median(values):>12,.0f} {min(values):>9,.0f} "
              f"{max(values):>9,.0f}  {', '.join(f'{a:.4f}' for a in sorted(accuracies[name]))}")
    ratio = statistics.median(speeds["default"]) / statistics.median(speeds["--replicas 1"])
    same = accuracies["default"] == accuracies["--replicas 1"]
    print(f"default ({replicas['default']} replicas) / --replicas 1: {ratio:.2f}x (medians of {args.repeats}; "
          f"target >= {TARGET_DEFAULT_OVER_ONE}x: {'met' if ratio >= TARGET_DEFAULT_OVER_ONE else 'MISSED'}); "
          f"the same test accuracy: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
