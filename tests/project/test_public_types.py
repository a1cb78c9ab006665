"""The public signatures are precise: a user's ``mypy --strict`` flags misuse of reduce ops,
axes, destinations and devices, and sees the component type of ``PerReplica[T]``/``Mirrored[T]``.

Each snippet is a module of its own; one mypy run checks them all (as ``test_typing.py`` does).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SNIPPET = """
import numpy as np
import towerdist as td
from towerdist.distribute import Mirrored, PerReplica

strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
per_replica: PerReplica[np.ndarray] = strategy.run(lambda: np.ones(2))
mirrored: Mirrored[float] = Mirrored([1.0, 1.0])
floats: PerReplica[float] = PerReplica([1.0, 2.0])

{line}
"""

# name: (the user's line, the error mypy must report, or None when it must pass)
CASES = {
    "reduce_with_an_enum": ("strategy.reduce(td.distribute.ReduceOp.SUM, per_replica, axis=None)", None),
    "reduce_with_a_string": ("strategy.reduce('mean', per_replica, axis=0)", None),
    "reduce_with_upper_case": ("strategy.reduce('SUM', per_replica, axis=(0,))", None),
    "reduce_with_an_aggregation": ("strategy.reduce(td.VariableAggregation.MEAN, per_replica, axis=None)", None),
    "reduce_op_typo": (
        "strategy.reduce('SUMM', per_replica, axis=None)",
        'Argument 1 to "reduce" of "Strategy" has incompatible type',
    ),
    "reduce_op_max": (
        "strategy.reduce('max', per_replica, axis=None)",
        'Argument 1 to "reduce" of "Strategy" has incompatible type',
    ),
    "axis_as_a_string": (
        "strategy.reduce('sum', per_replica, axis='0')",
        'Argument "axis" to "reduce" of "Strategy" has incompatible type',
    ),
    "reduce_to_a_device": ("strategy.extended.reduce_to('sum', per_replica, 'CPU:0')", None),
    "reduce_to_the_value": ("strategy.extended.reduce_to('sum', per_replica, per_replica)", None),
    "reduce_to_an_array": ("strategy.extended.reduce_to('sum', per_replica, np.zeros(1))", None),
    "reduce_to_a_list_of_devices": (
        "strategy.extended.reduce_to('sum', per_replica, ['CPU:0', 'CPU:1'])",
        'Argument 3 to "reduce_to" of "StrategyExtended" has incompatible type',
    ),
    "reduce_to_an_op_typo": (
        "strategy.extended.reduce_to('avg', per_replica, 'CPU:0')",
        'Argument 1 to "reduce_to" of "StrategyExtended" has incompatible type',
    ),
    "broadcast_to_an_int": (
        "strategy.extended.broadcast_to(np.ones(1), 0)",
        'Argument 2 to "broadcast_to" of "StrategyExtended" has incompatible type',
    ),
    "one_device_of_a_name": ("td.distribute.OneDeviceStrategy('CPU:0')", None),
    "one_device_of_a_logical_device": ("td.distribute.OneDeviceStrategy(td.config.list_logical_devices()[0])", None),
    "one_device_of_an_int": (
        "td.distribute.OneDeviceStrategy(0)",
        'Argument 1 to "OneDeviceStrategy" has incompatible type',
    ),
    "device_scope_of_an_int": ("td.device(0)", 'Argument 1 to "device" has incompatible type'),
    "local_results_keep_the_component_type": (
        "parts: tuple[np.ndarray, ...] = strategy.experimental_local_results(per_replica)",
        None,
    ),
    "local_results_are_floats": (
        "strategy.experimental_local_results(floats)[0].upper()",
        '"float" has no attribute "upper"',
    ),
    # A bare np.ndarray holds Any (its shape and dtype), so only an exact component type such
    # as float is checked through the overloads; np.ndarray components type-check as arrays.
    "values_of_a_per_replica": ("first: np.ndarray = per_replica.values[0]", None),
    "values_of_a_mirrored": ("text: str = mirrored.values[0]", "Incompatible types in assignment"),
    "a_bare_per_replica_is_per_replica_of_any": ("bare: PerReplica = per_replica", None),
}


@pytest.mark.timeout(300)
def test_a_users_type_checker_sees_precise_public_types(tmp_path):
    pytest.importorskip("mypy", reason="mypy is part of the test extra: pip install -e '.[test]'")
    for name, (line, _) in CASES.items():
        (tmp_path / f"{name}.py").write_text(SNIPPET.format(line=line))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy"),
         *(f"{name}.py" for name in CASES)],
        cwd=tmp_path, capture_output=True, text=True, timeout=280,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    for name, (_, message) in CASES.items():
        mine = [line for line in errors if line.startswith(f"{name}.py:")]
        if message is None:
            assert mine == [], done.stdout
        else:
            assert len(mine) == 1 and message in mine[0], (name, done.stdout)
