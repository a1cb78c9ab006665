"""``td.train`` checkpoints restored: round trips, another replica count, inside and outside ``scope()``, deferred slots.

Values are chosen so that every comparison can be exact (see ``checkpoint_helpers``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from checkpoint_helpers import (
    NET_TRAINABLE_KEYS,
    ON_READ,
    ROUND_TRIP_STRATEGIES,
    A,
    assert_restored,
    assert_same_values,
    copies,
    make_state,
    saved_counter,
    slot_keys,
    train,
    values,
    variables_of,
)
from conftest import mirrored_param

# --- 1. round trip ----------------------------------------------------------------------------


@pytest.mark.parametrize("strategy_name", ROUND_TRIP_STRATEGIES)
def test_round_trip_restores_model_adam_slots_iterations_and_metric_exactly(request, tmp_path, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    source = make_state(strategy, seed=0)
    train(source, steps=3)
    saved = values(variables_of(source))
    path = source.checkpoint().save(str(tmp_path / "ckpt"))
    assert path == str(tmp_path / "ckpt-1")

    fresh = make_state(strategy, seed=7, build=True)
    before = values(variables_of(fresh))
    assert all(not np.array_equal(before[name], saved[name]) for name in saved)  # the restore has work to do
    status = fresh.checkpoint().restore(path)

    assert isinstance(status, td.train.CheckpointLoadStatus)
    assert status.assert_consumed() is status
    status.assert_existing_objects_matched().assert_nontrivial_match().expect_partial()
    assert_restored(variables_of(fresh), saved)
    assert int(fresh.optimizer.iterations.numpy()) == 3
    np.testing.assert_array_equal(fresh.metric.result(), source.metric.result())


# --- 2. another replica count -------------------------------------------------------------------


def make_sync_on_read(strategy: Any) -> dict[str, Any]:
    """Sync-on-read variables of each aggregation a checkpoint can save (besides the metric's SUM)."""
    with strategy.scope():
        return {
            "mean": td.Variable(np.zeros(3, np.float32), synchronization=ON_READ, aggregation=A.MEAN),
            "first": td.Variable(np.zeros(3, np.float32), synchronization=ON_READ, aggregation=A.ONLY_FIRST_REPLICA),
            "int_sum": td.Variable(np.zeros(3, np.int64), synchronization=ON_READ, aggregation=A.SUM),
        }


SYNC_ON_READ_AGGREGATES = {
    "mean": np.array([0.75, -1.5, 4.0], np.float32),
    "first": np.array([1.0, 10.0, -0.25], np.float32),
    "int_sum": np.array([15, -15, 12], np.int64),  # odd sums: the split over 2 and 4 copies has a remainder
}


def set_per_replica(strategy: Any, variables: dict[str, Any]) -> None:
    """Gives each replica its own copy values whose aggregate is ``SYNC_ON_READ_AGGREGATES``."""
    n = strategy.num_replicas_in_sync

    def replica_fn() -> None:
        r = int(td.distribute.get_replica_context().replica_id_in_sync_group)
        offset = np.float32(0.5) * np.float32(r - (n - 1) / 2)  # sums to 0 over the replicas
        variables["mean"].assign(SYNC_ON_READ_AGGREGATES["mean"] + offset)
        first = SYNC_ON_READ_AGGREGATES["first"] + (0 if r == 0 else np.float32(100 + r))
        variables["first"].assign(first)
        others = sum(np.array([k, -2 * k, 3], np.int64) for k in range(1, n))
        mine = np.array([r, -2 * r, 3], np.int64) if r else SYNC_ON_READ_AGGREGATES["int_sum"] - others
        variables["int_sum"].assign(mine)

    strategy.run(replica_fn)


@pytest.mark.parametrize("replica_counts", [(4, 2, 1), (1, 4, 2), (2, 4)], ids=lambda c: "->".join(map(str, c)))
def test_restore_into_another_replica_count(tmp_path, replica_counts):
    first, *later = replica_counts
    strategy = mirrored_strategy_for(first)
    state = make_state(strategy)
    extras = make_sync_on_read(strategy)
    train(state, steps=2)
    set_per_replica(strategy, extras)
    assert_same_values(values(extras), SYNC_ON_READ_AGGREGATES)
    saved = {**values(variables_of(state)), **values(extras)}
    path = td.train.Checkpoint(model=state.net, optimizer=state.optimizer, metric=state.metric, extras=extras).save(
        str(tmp_path / "ckpt")
    )
    for hop, n in enumerate(later):
        strategy = mirrored_strategy_for(n)
        state = make_state(strategy, seed=hop + 10, build=True)
        extras = make_sync_on_read(strategy)
        ckpt = td.train.Checkpoint(model=state.net, optimizer=state.optimizer, metric=state.metric, extras=extras)
        ckpt.restore(path).assert_consumed()

        restored = {**variables_of(state), **extras}
        assert all(len(copies(v)) == n for v in restored.values())
        assert_restored(restored, saved)  # SUM copies hold aggregate/N; integers split with the remainder on copy 0
        assert saved_counter(ckpt) == hop + 1
        path = ckpt.save(str(tmp_path / "ckpt"))  # and on to the next replica count
        assert path == str(tmp_path / f"ckpt-{hop + 2}")


@pytest.mark.parametrize(
    "n, int_copies",
    [(1, [[15, -15, 12]]), (2, [[8, -7, 6], [7, -8, 6]]), (4, [[6, -3, 3], [3, -4, 3], [3, -4, 3], [3, -4, 3]])],
)
def test_integer_sum_sync_on_read_splits_exactly_with_the_remainder_on_copy_0(tmp_path, n, int_copies):
    source = make_sync_on_read(mirrored_strategy_for(2))
    set_per_replica(source["int_sum"].distribute_strategy, source)
    path = td.train.Checkpoint(extras=source).write(str(tmp_path / "ints"))

    target = make_sync_on_read(mirrored_strategy_for(n))
    td.train.Checkpoint(extras=target).read(path).assert_consumed()

    assert [c.tolist() for c in copies(target["int_sum"])] == int_copies
    np.testing.assert_array_equal(target["int_sum"].numpy(), SYNC_ON_READ_AGGREGATES["int_sum"])


# --- 3. scopes and strategies ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["in_scope", "no_scope"])
@pytest.mark.parametrize("target_name", ["default", "one_device_cpu", mirrored_param(2), "central_storage_2cpu"])
@pytest.mark.parametrize("source_name", ["default", pytest.param(4, id="mirrored_4cpu"), "central_storage_2cpu"])
def test_restore_into_another_strategy_inside_or_outside_its_scope(request, tmp_path, source_name, target_name, where):
    def scope(strategy: Any) -> Any:
        return strategy.scope() if where == "in_scope" else contextlib.nullcontext()

    # Both may be mirrored: the source over 4 replicas is the plugin's, by count.
    source_strategy = mirrored_strategy_for(source_name) if isinstance(source_name, int) else None
    source = make_state(source_strategy or request.getfixturevalue(source_name))
    train(source, steps=2)
    saved = values(variables_of(source))
    with scope(source.strategy):
        path = source.checkpoint().save(str(tmp_path / "ckpt"))

    target = make_state(request.getfixturevalue(target_name), seed=3, build=True)
    ckpt = target.checkpoint()
    with scope(target.strategy):
        status = ckpt.restore(path)
    status.assert_consumed()
    assert_restored(variables_of(target), saved)
    assert saved_counter(ckpt) == 1

    # The restored objects train on in their strategy: the step counter continues from the saved one.
    train(target, steps=1, first_step=2)
    assert int(target.optimizer.iterations.numpy()) == 3


# --- 4. deferred slots ------------------------------------------------------------------------


@pytest.mark.parametrize("trigger", ["build", "step"])
@pytest.mark.parametrize("strategy_name", ["default", mirrored_param(2), "central_storage_2cpu"])
def test_slots_restored_before_they_exist_are_applied_when_created(request, tmp_path, strategy_name, trigger):
    strategy = request.getfixturevalue(strategy_name)
    uninterrupted = make_state(strategy)
    train(uninterrupted, steps=3)
    path = uninterrupted.checkpoint().save(str(tmp_path / "ckpt"))
    saved = values(variables_of(uninterrupted))
    train(uninterrupted, steps=2, first_step=3)  # the run that never stopped

    resumed = make_state(strategy, seed=5)  # a fresh optimizer: no slots yet
    status = resumed.checkpoint().restore(path)
    with pytest.raises(AssertionError, match="not fully consumed: optimizer slot values waiting") as pending:
        status.assert_consumed()
    assert str(slot_keys(NET_TRAINABLE_KEYS)) in str(pending.value)
    status.assert_existing_objects_matched().assert_nontrivial_match()  # what exists now did match
    assert int(resumed.optimizer.iterations.numpy()) == 3
    with pytest.raises(KeyError):
        resumed.optimizer.get_slot(resumed.net.scale, "m")

    if trigger == "build":
        first_layer_w = resumed.net.layers[0].w
        resumed.optimizer.build([first_layer_w])
        with pytest.raises(AssertionError) as still_pending:
            status.assert_consumed()
        assert str(slot_keys([k for k in NET_TRAINABLE_KEYS if k != "model/layers/0/w"])) in str(still_pending.value)
        resumed.optimizer.build(resumed.net.trainable_variables)
        status.assert_consumed()
        assert_restored(variables_of(resumed), saved)  # the slots got the saved values when created
        train(resumed, steps=2, first_step=3)
    else:
        train(resumed, steps=1, first_step=3)
        status.assert_consumed()
        train(resumed, steps=1, first_step=4)

    assert_same_values(values(variables_of(resumed)), values(variables_of(uninterrupted)))
