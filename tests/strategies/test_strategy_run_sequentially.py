"""``td.config.run_replicas_sequentially``: replicas that take turns, as TensorFlow's eager replicas do.

Synchronisation between replicas uses events with timeouts (never sleeps): a replica that
waits for an event that never comes fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

import towerdist as td

from conftest import cpus

WAIT = 10.0  # seconds a replica waits for an event the test guarantees will come


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


@pytest.fixture
def sequential() -> Iterator[None]:
    """Replicas take turns during the test; the switch is put back afterwards."""
    before = td.config.replicas_run_sequentially()
    td.config.run_replicas_sequentially(True)
    try:
        yield
    finally:
        td.config.run_replicas_sequentially(before)


class Dense:
    """A Keras-style layer: the forward pass keeps its input and output on ``self`` for the backward pass."""

    def __init__(self) -> None:
        self.w, self.b = 5.0, 1.0

    def forward(self, x: float) -> float:
        self.last_input = x
        self.last_output = self.w * x + self.b
        return self.last_output

    def backward(self) -> float:
        return self.last_input * self.last_output  # d(0.5 * y**2)/dw


def inputs(strategy: td.distribute.Strategy) -> td.distribute.DistributedValues:
    return strategy.experimental_distribute_values_from_function(lambda ctx: float(ctx.replica_id_in_sync_group) + 1.0)


def test_the_switch_is_off_by_default():
    assert td.config.replicas_run_sequentially() is False


@pytest.mark.timeout(60)
def test_state_on_a_shared_object_gives_tensorflows_result_when_replicas_take_turns(mirrored_strategy, sequential):
    # TensorFlow 2.21 (eager MirroredStrategy, 2 logical CPUs) returns [6.0, 22.0] for this step.
    layer = Dense()
    events: list[tuple[str, int]] = []

    def step(x):
        events.append(("forward", rid()))
        layer.forward(x)
        events.append(("backward", rid()))
        return layer.backward()

    result = mirrored_strategy.experimental_local_results(mirrored_strategy.run(step, args=(inputs(mirrored_strategy),)))
    assert result == (6.0, 22.0)
    assert events == [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1)]


@pytest.mark.timeout(60)
def test_state_on_a_shared_object_is_wrong_when_replicas_run_at_once(mirrored_strategy):
    # The same step run concurrently, with the interleaving the issue saw forced by events:
    # replica 1's forward pass, then replica 0's, then both backward passes read replica 0's state.
    layer = Dense()
    forward_1_done, forward_0_done = threading.Event(), threading.Event()

    def step(x):
        if rid() == 0:
            assert forward_1_done.wait(WAIT)
            layer.forward(x)
            forward_0_done.set()
        else:
            layer.forward(x)
            forward_1_done.set()
            assert forward_0_done.wait(WAIT)
        return layer.backward()

    result = mirrored_strategy.experimental_local_results(mirrored_strategy.run(step, args=(inputs(mirrored_strategy),)))
    assert result == (6.0, 6.0)


@pytest.mark.timeout(60)
def test_replicas_run_at_once_without_the_switch(mirrored_strategy):
    both_running = threading.Barrier(2, timeout=WAIT)  # passes only if both replicas run at the same time
    assert mirrored_strategy.experimental_local_results(mirrored_strategy.run(both_running.wait)) in ((0, 1), (1, 0))


@pytest.mark.replicas(4)
@pytest.mark.timeout(60)
def test_each_replica_runs_to_its_return_before_the_next_starts(mirrored_strategy, sequential):
    events: list[tuple[str, int]] = []

    def step():
        events.append(("start", rid()))
        events.append(("end", rid()))
        return rid()

    assert mirrored_strategy.experimental_local_results(mirrored_strategy.run(step)) == (0, 1, 2, 3)
    assert events == [(kind, r) for r in range(4) for kind in ("start", "end")]


@pytest.mark.timeout(60)
def test_all_reduce_and_merge_call_work_and_replica_0_goes_first_after_each(mirrored_strategy, sequential):
    # The order TensorFlow 2.21 gives for all_reduce: [a0, a1, b0, b1].
    events: list[tuple[str, int]] = []

    def step(x):
        ctx = td.distribute.get_replica_context()
        events.append(("a", rid()))
        total = ctx.all_reduce("sum", x)
        events.append(("b", rid()))
        merged = ctx.merge_call(lambda strategy, value: strategy.reduce("sum", value, axis=None), args=(x,))
        events.append(("c", rid()))
        return total, merged

    result = mirrored_strategy.experimental_local_results(mirrored_strategy.run(step, args=(inputs(mirrored_strategy),)))
    assert [(float(t), float(m)) for t, m in result] == [(3.0, 3.0), (3.0, 3.0)]
    assert events == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]


@pytest.mark.timeout(60)
def test_an_optimizer_step_works_in_turns(mirrored_strategy, sequential):
    with mirrored_strategy.scope():
        w = td.Variable(1.0)
        opt = td.optimizers.SGD(0.5)
    mirrored_strategy.run(lambda: opt.apply_gradients([(float(rid() + 1), w)]))
    assert float(w.numpy()) == 1.0 - 0.5 * 3.0


@pytest.mark.timeout(60)
def test_a_failure_in_a_turn_stops_the_step_and_the_strategy_recovers(mirrored_strategy, sequential):
    with pytest.raises(ZeroDivisionError) as info:
        mirrored_strategy.run(lambda: 1 / rid())
    assert "Raised in replica 0" in "\n".join(info.value.__notes__)
    assert mirrored_strategy.experimental_local_results(mirrored_strategy.run(rid)) == (0, 1)


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the tower API's names (tested in tests/compat/test_compat_v1_deprecations.py)
def test_the_switch_applies_to_the_tf1_tower_api_unless_run_concurrently_is_given(sequential):
    tower = td.compat.v1.distribute.MirroredStrategy(cpus(2))
    both_running = threading.Barrier(2, timeout=WAIT)
    events: list[int] = []

    def tower_fn():
        context = td.compat.v1.get_tower_context()
        events.append(int(context.tower_id))
        context.merge_call(lambda strategy: None)
        events.append(int(context.tower_id))

    tower.call_for_each_tower(tower_fn)
    assert events == [0, 1, 0, 1]  # tower 0 goes first, before and after the merge_call
    results = tower.experimental_local_results(tower.call_for_each_tower(both_running.wait, run_concurrently=True))
    assert sorted(results) == [0, 1]


@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_value_that_is_not_a_bool_is_a_type_error(value):
    with pytest.raises(TypeError, match=r"^run_replicas_sequentially\(\) takes a bool .* Got run_sequentially="):
        td.config.run_replicas_sequentially(value)
    assert td.config.replicas_run_sequentially() is False


def run_fresh(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOWERDIST_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=60, env={**clean, **env},
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("on", True), ("0", False), ("", False)])
def test_the_environment_variable_sets_the_default(raw, expected):
    result = run_fresh(
        "import towerdist as td; print(td.config.replicas_run_sequentially())",
        TOWERDIST_RUN_REPLICAS_SEQUENTIALLY=raw,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected)


@pytest.mark.timeout(90)
def test_an_invalid_environment_variable_fails_the_import_naming_it():
    result = run_fresh("import towerdist", TOWERDIST_RUN_REPLICAS_SEQUENTIALLY="maybe")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(
        "ValueError: The environment variable TOWERDIST_RUN_REPLICAS_SEQUENTIALLY='maybe' is not a switch."
    )
