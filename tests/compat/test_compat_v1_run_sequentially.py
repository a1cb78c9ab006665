"""The TF 1.x tower dialect: ``call_for_each_tower(..., run_concurrently=False)``."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

import towerdist as td
import towerdist.compat.v1 as tf

import compat_v1_helpers
from compat_v1_helpers import assert_usable, tower
from conftest import cpus

# The helpers' fixtures, by name (an import would read as unused)
fresh_warnings = compat_v1_helpers.fresh_warnings
strategy = compat_v1_helpers.strategy

# The tower-era names warn on purpose; the tests of the warnings record them explicitly.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# --- 3. run_concurrently=False -------------------------------------------------------------


def test_run_concurrently_false_runs_towers_one_at_a_time_in_tower_order():
    strategy = tower(4)
    events: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def record(*event: Any) -> None:
        with lock:
            events.append(event)

    def merge_fn(dist, value, round_number):
        record("merge", round_number)
        return sum(dist.unwrap(value))

    def fn(x):
        ctx = tf.get_tower_context()
        t = ctx.tower_id
        record(t, "start")
        record(t, "before merge 1")
        a = ctx.merge_call(merge_fn, x + t, round_number=1)
        record(t, "after merge 1")
        record(t, "before merge 2")
        b = ctx.merge_call(merge_fn, a * (t + 1), round_number=2)
        record(t, "after merge 2")
        record(t, "end")
        return b + t

    sequential = strategy.unwrap(strategy.call_for_each_tower(fn, 1, run_concurrently=False))
    towers = range(4)
    expected_events = (
        [e for t in towers for e in ((t, "start"), (t, "before merge 1"))]
        + [("merge", 1)]
        + [e for t in towers for e in ((t, "after merge 1"), (t, "before merge 2"))]
        + [("merge", 2)]
        + [e for t in towers for e in ((t, "after merge 2"), (t, "end"))]
    )
    assert events == expected_events

    a = sum(1 + t for t in towers)
    b = sum(a * (t + 1) for t in towers)
    assert sequential == [b + t for t in towers]
    concurrent = strategy.unwrap(strategy.call_for_each_tower(fn, 1))
    assert concurrent == sequential


def test_run_concurrently_false_exception_propagates_and_strategy_recovers():
    strategy = tower(4)
    started = []
    lock = threading.Lock()

    def fn():
        ctx = tf.get_tower_context()
        with lock:
            started.append(ctx.tower_id)
        if ctx.tower_id == 2:
            raise KeyError("tower two failed")
        ctx.merge_call(lambda dist: None)
        return ctx.tower_id

    with pytest.raises(KeyError, match="tower two failed") as info:
        strategy.call_for_each_tower(fn, run_concurrently=False)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert re.search(r"\b(replica|tower) 2\b", notes), notes
    # Towers ran in order, and tower 3 never started once tower 2 had failed.
    assert started == [0, 1, 2]

    assert strategy.unwrap(
        strategy.call_for_each_tower(lambda: tf.get_tower_context().tower_id, run_concurrently=False)
    ) == [0, 1, 2, 3]
    assert_usable(strategy)


@pytest.mark.parametrize("value", [0, 1, "False", None])
def test_run_concurrently_must_be_a_bool(value):
    strategy = tower(2)
    with pytest.raises(TypeError, match="run_concurrently"):
        strategy.call_for_each_tower(lambda: 1, run_concurrently=value)
    assert_usable(strategy)


def test_a_sequential_tower_waiting_for_a_later_tower_times_out_instead_of_hanging(replica_timeouts):
    # Tower 0 waits for tower 1, which only runs after tower 0's turn: a deadlock that the
    # watch must turn into DeadlineExceededError naming tower 0 (no barrier is ever reached).
    strategy = tf.distribute.MirroredStrategy(cpus(2))
    released = threading.Event()

    def fn():
        if tf.get_tower_context().tower_id == 0:
            released.wait(30.0)
        else:
            released.set()

    replica_timeouts(warning_seconds=None, timeout_seconds=1.0)
    try:
        with pytest.raises(td.errors.DeadlineExceededError, match="Replica 0 .*sequential step") as caught:
            strategy.call_for_each_tower(fn, run_concurrently=False)
    finally:
        released.set()  # let the abandoned thread finish
    assert caught.value.missing == [0]
    assert strategy.unwrap(strategy.call_for_each_tower(lambda: tf.get_tower_context().tower_id)) == [0, 1]
    # Concurrently the same function completes.
    released.clear()
    strategy.call_for_each_tower(fn)
    assert released.is_set()


def test_a_slow_sequential_step_is_timed_per_turn_not_per_round(replica_timeouts):
    # Each tower's turn stays under the timeout while the whole round exceeds it.
    # 6 turns of 0.3 s: the round lasts 1.5 s after the first arrival, each turn 0.3 s.
    strategy = tf.distribute.MirroredStrategy(cpus(6))
    per_turn_s = 0.3

    def fn():
        deadline = time.monotonic() + per_turn_s
        while time.monotonic() < deadline:  # work, not synchronisation
            pass
        ctx = tf.get_tower_context()
        return ctx.merge_call(lambda s, x: sum(s.unwrap(x)), ctx.tower_id) + ctx.tower_id

    replica_timeouts(warning_seconds=None, timeout_seconds=1.2)
    result = strategy.call_for_each_tower(fn, run_concurrently=False)
    assert strategy.unwrap(result) == [15 + i for i in range(6)]
