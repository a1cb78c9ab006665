"""The library type-checks under ``mypy --strict`` (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_mypy_strict_passes():
    pytest.importorskip("mypy", reason="mypy is part of the test extra: pip install -e '.[test]'")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stdout + done.stderr


USER_SNIPPET = """
import numpy as np
import towerdist as td

strategy = td.distribute.MirroredStrategy(["CPU:0"])


def step() -> None:
    ctx = td.distribute.get_replica_context()
    assert ctx is not None
    ctx.merge_call(lambda s: None)
    {mistake}


strategy.run(step)

with strategy.scope() as scoped:
    {scope_mistake}

tower = td.compat.v1.distribute.MirroredStrategy(["CPU:0"])
towers: int = tower.num_towers
tower.call_for_each_tower(step)
{tower_mistake}
"""


# name: (mistake, where it goes, the error mypy must report or None)
MISTAKES = {
    "correct": ("pass", "mistake", None),
    "merge_call_of_an_int": ("ctx.merge_call(1)", "mistake", 'Argument 1 to "merge_call" of "ReplicaContext" has incompatible type'),
    "unchecked_none": ("td.distribute.get_replica_context().all_reduce('sum', 1.0)", "mistake", 'Item "None" of "ReplicaContext | None"'),
    "run_of_an_int": ("td.distribute.get_strategy().run(3)", "mistake", 'Argument 1 to "run" of "Strategy" has incompatible type'),
    "scope_binds_the_strategy": ("scoped.run(3)", "scope_mistake", 'Argument 1 to "run" of "Strategy" has incompatible type'),
    "replica_strategy_is_a_strategy": ("ctx.strategy.runn(step)", "mistake", 'has no attribute "runn"'),
    # The TF 1.x tower API is written in the compat class body, so a checker sees it.
    "num_towers_is_a_property": ("tower.num_towers()", "tower_mistake", 'not callable'),
    "call_for_each_tower_of_an_int": ("tower.call_for_each_tower(1)", "tower_mistake", 'Argument 1 to "call_for_each_tower" of "MirroredStrategy" has incompatible type'),
    "tower_typo": ("tower.call_for_each_towr(step)", "tower_mistake", 'has no attribute "call_for_each_towr"'),
    # towerdist's module __getattr__ (advice for tf.matmul, tf.keras, ...) is hidden from checkers.
    "a_tensorflow_name_towerdist_lacks": ("td.matmul(1, 2)", "mistake", 'Module has no attribute "matmul"'),
    "a_tf_nn_name_towerdist_lacks": ("td.nn.relu(1.0)", "mistake", 'Module has no attribute "relu"'),
}


@pytest.mark.timeout(300)
def test_a_users_type_checker_catches_mistakes(tmp_path):
    pytest.importorskip("mypy", reason="mypy is part of the test extra: pip install -e '.[test]'")
    for name, (mistake, where, _) in MISTAKES.items():
        slots = {"mistake": "pass", "scope_mistake": "pass", "tower_mistake": "", where: mistake}
        (tmp_path / f"{name}.py").write_text(USER_SNIPPET.format(**slots))
    done = subprocess.run(  # one mypy run over every snippet (each is a module of its own)
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy"),
         *(f"{name}.py" for name in MISTAKES)],
        cwd=tmp_path, capture_output=True, text=True, timeout=280,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    for name, (_, _, message) in MISTAKES.items():
        mine = [line for line in errors if line.startswith(f"{name}.py:")]
        if message is None:
            assert mine == [], done.stdout
        else:
            assert len(mine) == 1 and message in mine[0], done.stdout
