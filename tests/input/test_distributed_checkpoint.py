"""Saving and restoring distributed iterators: on every strategy, onto other numbers of replicas and workers.

A distributed iterator is saved after some steps (each used by a ``strategy.run``), and
restored into an iterator of the same dataset distributed by another strategy (same global
batch size). The check, the issue's: the concatenation of every replica's examples at each
later step equals what the uninterrupted iterator produces (``strategy.gather`` of a step).

Other numbers of *workers* are tested in one process with "virtual" workers: a distributed
dataset built for worker ``w`` of ``W`` (an ``InputWorker`` whose cross-worker agreement
is answered locally), each iterated as its process would, their positions combined into
the state every worker of a real job saves; under ``mpiexec`` the same happens across real
processes (``test_distributed_checkpoint_mpi.py`` and the preemption tests).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src import device as device_lib
from towerdist._src import steps
from towerdist._src.data import state_codec
from towerdist._src.input.distributed_dataset import DistributedDataset, DistributedDatasetsFromFunction, InputWorker
from towerdist._src.input.distributed_iterator import HELD_STEPS

from conftest import cpus, multi_worker

D = td.data.Dataset
Policy = td.data.experimental.AutoShardPolicy
GLOBAL_BATCH = 8


def mirrored(n: int) -> td.distribute.MirroredStrategy:
    return td.distribute.MirroredStrategy(cpus(n))


STRATEGIES: dict[str, Callable[[], td.distribute.Strategy]] = {
    "default": td.distribute.get_strategy,
    "one_device": lambda: td.distribute.OneDeviceStrategy("/cpu:0"),
    "central_storage": lambda: td.distribute.experimental.CentralStorageStrategy(cpus(2), parameter_device="CPU:0"),
    "mirrored_1": lambda: mirrored(1),
    "mirrored_2": lambda: mirrored(2),
    "mirrored_3": lambda: mirrored(3),
    "mirrored_4": lambda: mirrored(4),
    "multi_worker_1local": lambda: multi_worker(1),
    "multi_worker_2local": lambda: multi_worker(2),
}
_made: dict[str, td.distribute.Strategy] = {}


def strategy_named(name: str) -> td.distribute.Strategy:
    if name not in _made:
        _made[name] = STRATEGIES[name]()
    return _made[name]


def with_policy(dataset: td.data.Dataset, policy: Any) -> td.data.Dataset:
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


PIPELINES: dict[str, Callable[[], td.data.Dataset]] = {
    # 61 examples in batches of 8: a partial last batch (5 rows), trailing replicas get empty pieces
    "shuffle_batch": lambda: D.range(61).shuffle(16, seed=5).batch(GLOBAL_BATCH),
    "two_epochs": lambda: D.range(30).shuffle(30, seed=2).repeat(2).batch(GLOBAL_BATCH, drop_remainder=True),
    "tuples": lambda: D.zip((D.range(61), D.range(61).map(lambda x: x * 10))).shuffle(8, seed=1).batch(GLOBAL_BATCH),
    "cycling_off": lambda: with_policy(D.range(61).batch(GLOBAL_BATCH), Policy.OFF),
    "cycling_uneven_off": lambda: with_policy(D.range(50).batch(7).repeat(2), Policy.OFF),
}


def global_step(strategy: td.distribute.Strategy, value: Any) -> list[np.ndarray]:
    """Every replica's examples of a step, concatenated in replica order (one array per component)."""
    gathered = strategy.gather(value, axis=0)
    if isinstance(gathered, (tuple, list)):
        return [np.asarray(v) for v in gathered]
    return [np.asarray(gathered)]


def run_steps(strategy: td.distribute.Strategy, iterator: Any, k: int) -> None:
    """Hands out ``k`` steps, each used by a ``strategy.run``."""
    for _ in range(k):
        strategy.run(lambda x: x, args=(next(iterator),))


def rest_of(strategy: td.distribute.Strategy, iterator: Any) -> list[list[np.ndarray]]:
    return [global_step(strategy, value) for value in iterator]


def assert_same_steps(expected: list[list[np.ndarray]], actual: list[list[np.ndarray]]) -> None:
    assert len(actual) == len(expected), f"{len(actual)} steps where {len(expected)} were expected"
    for k, (want, got) in enumerate(zip(expected, actual)):
        assert [a.tolist() for a in got] == [a.tolist() for a in want], f"step {k}"


def saved_and_rest(
    name: str, make: Callable[[], td.data.Dataset], k: int, draws: int = 0, preemption: bool = False
) -> tuple[bytes, list[list[np.ndarray]]]:
    """The state of an iterator of ``make()`` on strategy ``name`` after ``k`` steps used and ``draws``
    more handed out (saved as a preemption handler saves, or as any other save), and the steps an
    uninterrupted iterator yields after those the save counts as used."""
    strategy = strategy_named(name)
    iterator = iter(strategy.experimental_distribute_dataset(make()))
    run_steps(strategy, iterator, k)
    for _ in range(draws):
        next(iterator)
    if preemption:
        with steps.preemption_save():
            state = iterator._checkpoint_state()
    else:
        state = iterator._checkpoint_state()
    reference = iter(strategy.experimental_distribute_dataset(make()))
    run_steps(strategy, reference, k if preemption else k + draws)
    return state, rest_of(strategy, reference)


def restored(name: str, make: Callable[[], td.data.Dataset], state: bytes) -> list[list[np.ndarray]]:
    strategy = strategy_named(name)
    iterator = iter(strategy.experimental_distribute_dataset(make()))
    iterator._checkpoint_restorer(state)()
    return rest_of(strategy, iterator)


# --- experimental_distribute_dataset: every strategy, onto 1, 2, 3, 4 replicas -----------------


@pytest.mark.parametrize("k", [0, 1, 3, 7])
@pytest.mark.parametrize("pipeline", ["shuffle_batch", "two_epochs", "tuples"])
@pytest.mark.parametrize("saved_on", list(STRATEGIES))
def test_a_restored_distributed_iterator_continues_every_step_exactly_on_1_to_4_replicas(
    saved_on: str, pipeline: str, k: int
) -> None:
    make = PIPELINES[pipeline]
    state, expected = saved_and_rest(saved_on, make, k)
    for restored_on in ("mirrored_1", "mirrored_2", "mirrored_3", "mirrored_4", saved_on):
        assert_same_steps(expected, restored(restored_on, make, state))


@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("pipeline", ["cycling_off", "cycling_uneven_off"])
@pytest.mark.parametrize("saved_on", ["mirrored_1", "mirrored_2", "mirrored_3", "mirrored_4"])
def test_the_cycling_rule_restores_onto_another_number_of_replicas_at_the_same_rows(
    saved_on: str, pipeline: str, k: int
) -> None:
    make = PIPELINES[pipeline]
    state, expected = saved_and_rest(saved_on, make, k)
    for restored_on in ("mirrored_1", "mirrored_2", "mirrored_3", "mirrored_4"):
        steps = restored(restored_on, make, state)
        if pipeline == "cycling_uneven_off" and (saved_on == "mirrored_1") != (restored_on == "mirrored_1"):
            # TF's cycling rule hands one replica the elements whole and re-cuts rows across them for
            # several: with a short batch before the end, the steps differ; the rows continue exactly.
            assert _rows(steps) == _rows(expected)
        else:
            assert_same_steps(expected, steps)


def _rows(steps: list[list[np.ndarray]]) -> list[int]:
    return [int(x) for step in steps for x in step[0]]


def test_get_next_as_optional_and_the_partial_last_step_restore_too() -> None:
    strategy = strategy_named("mirrored_3")
    make = PIPELINES["shuffle_batch"]  # 61 rows: the last global batch has 5 rows for 3 replicas
    iterator = iter(strategy.experimental_distribute_dataset(make()))
    for _ in range(6):
        optional = iterator.get_next_as_optional()
        strategy.run(lambda x: x, args=(optional.get_value(),))
    state = iterator._checkpoint_state()
    expected = []
    while (optional := iterator.get_next_as_optional()).has_value():
        expected.append(global_step(strategy, optional.get_value()))
    assert [len(step[0]) for step in expected] == [8, 5]
    for restored_on in ("mirrored_2", "mirrored_4"):
        assert_same_steps(expected, restored(restored_on, make, state))


# --- steps handed out but not used by a run ------------------------------------------------------


@pytest.mark.parametrize("draws", [1, 2])
def test_a_preemption_save_keeps_the_steps_handed_out_for_a_run_not_begun_and_restores_them_first(
    draws: int,
) -> None:
    make = PIPELINES["shuffle_batch"]
    strategy = strategy_named("mirrored_2")
    state, expected = saved_and_rest("mirrored_2", make, 2, draws=draws, preemption=True)
    assert_same_steps(expected, restored("mirrored_4", make, state))
    # ... and once a run began after they were handed out, they count as used
    iterator = iter(strategy.experimental_distribute_dataset(make()))
    run_steps(strategy, iterator, 2)
    drawn = [next(iterator) for _ in range(draws)]
    strategy.run(lambda *x: x, args=tuple(drawn))
    with steps.preemption_save():
        used_state = iterator._checkpoint_state()
    assert_same_steps(expected[draws:], restored("mirrored_2", make, used_state))


@pytest.mark.parametrize("draws", [1, 3])
def test_any_other_save_counts_the_steps_handed_out_as_used(draws: int) -> None:
    # an evaluation loop that never calls run: what it drew is used, as TensorFlow counts it
    make = PIPELINES["shuffle_batch"]
    state, expected = saved_and_rest("mirrored_2", make, 1, draws=draws)
    assert_same_steps(expected, restored("mirrored_3", make, state))


def test_an_iterator_keeps_at_most_held_steps_unused_steps_and_warns_when_it_lets_older_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    make = PIPELINES["shuffle_batch"]
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        state, expected = saved_and_rest("mirrored_2", make, 0, draws=HELD_STEPS + 2, preemption=True)
    assert "the 2 oldest are counted as used" in caplog.text
    assert_same_steps(expected[2:], restored("mirrored_2", make, state))


def test_the_default_strategys_iterator_keeps_the_element_drawn_for_a_preempted_step() -> None:
    make = PIPELINES["shuffle_batch"]
    strategy = strategy_named("default")
    was = steps.tracking()
    steps.track()  # what a PreemptionCheckpointHandler does when it is made
    try:
        iterator = iter(strategy.experimental_distribute_dataset(make()))
        run_steps(strategy, iterator, 2)
        drawn = next(iterator)
        with steps.preemption_save():
            state = iterator._checkpoint_state()
    finally:
        steps.track(was)
    rest = [drawn, *iterator]
    assert_same_steps([_leaves(x) for x in rest], restored("default", make, state))
    assert_same_steps([_leaves(x) for x in rest], restored("mirrored_2", make, state))


def _leaves(value: Any) -> list[np.ndarray]:
    return [np.asarray(v) for v in value] if isinstance(value, tuple) else [np.asarray(value)]


# --- before the first step, after the last -------------------------------------------------------


def test_an_unstarted_iterator_of_an_unseeded_shuffle_restores_to_the_same_order() -> None:
    made = D.range(40).shuffle(40).batch(GLOBAL_BATCH)  # a seed drawn for this process
    strategy = strategy_named("mirrored_2")
    iterator = iter(strategy.experimental_distribute_dataset(made))
    state = iterator._checkpoint_state()
    expected = rest_of(strategy, iterator)
    # a rebuilt pipeline draws another seed; the restored iterator's adopts the saved one
    assert_same_steps(expected, restored("mirrored_4", lambda: D.range(40).shuffle(40).batch(GLOBAL_BATCH), state))


def test_an_ended_iterator_restores_ended() -> None:
    make = PIPELINES["shuffle_batch"]
    strategy = strategy_named("mirrored_2")
    iterator = iter(strategy.experimental_distribute_dataset(make()))
    for value in iterator:
        strategy.run(lambda x: x, args=(value,))
    assert restored("mirrored_3", make, iterator._checkpoint_state()) == []


# --- distribute_datasets_from_function ----------------------------------------------------------


def per_replica_batches(context: td.distribute.InputContext) -> td.data.Dataset:
    return D.range(61).shuffle(16, seed=3).batch(context.get_per_replica_batch_size(GLOBAL_BATCH))


def from_function(name: str, per_replica: bool = False) -> Any:
    strategy = strategy_named(name)
    mode = td.distribute.InputReplicationMode.PER_REPLICA if per_replica else td.distribute.InputReplicationMode.PER_WORKER
    return strategy, strategy.distribute_datasets_from_function(
        per_replica_batches, td.distribute.InputOptions(experimental_replication_mode=mode)
    )


@pytest.mark.parametrize("k", [0, 1, 4])
@pytest.mark.parametrize("saved_on", ["mirrored_1", "mirrored_2", "mirrored_4"])
def test_a_dataset_fn_batching_per_replica_restores_onto_another_number_of_replicas(saved_on: str, k: int) -> None:
    strategy, dist = from_function(saved_on)
    iterator = iter(dist)
    run_steps(strategy, iterator, k)
    state = iterator._checkpoint_state()
    expected = rest_of(strategy, iterator)
    for restored_on in ("mirrored_1", "mirrored_2", "mirrored_4"):
        new_strategy, new_dist = from_function(restored_on)
        new_iterator = iter(new_dist)
        new_iterator._checkpoint_restorer(state)()
        assert_same_steps(expected, rest_of(new_strategy, new_iterator))


def test_one_pipeline_per_replica_restores_on_the_same_replicas_and_refuses_others() -> None:
    strategy, dist = from_function("mirrored_2", per_replica=True)
    iterator = iter(dist)
    run_steps(strategy, iterator, 2)
    state = iterator._checkpoint_state()
    expected = rest_of(strategy, iterator)
    same_strategy, same = from_function("mirrored_2", per_replica=True)
    same_iterator = iter(same)
    same_iterator._checkpoint_restorer(state)()
    assert_same_steps(expected, rest_of(same_strategy, same_iterator))
    _, other = from_function("mirrored_4", per_replica=True)
    with pytest.raises(td.errors.FailedPreconditionError, match="one pipeline per replica"):
        iter(other)._checkpoint_restorer(state)


# --- refusals --------------------------------------------------------------------------------------


def test_restoring_into_another_pipeline_raises_naming_the_operation_and_changes_nothing() -> None:
    strategy = strategy_named("mirrored_2")
    saved = iter(strategy.experimental_distribute_dataset(PIPELINES["shuffle_batch"]()))
    run_steps(strategy, saved, 2)
    state = saved._checkpoint_state()
    other = iter(strategy.experimental_distribute_dataset(D.range(61).map(lambda x: x + 1).batch(GLOBAL_BATCH)))
    run_steps(strategy, other, 1)
    with pytest.raises(td.errors.NotFoundError, match="MapDataset"):
        other._checkpoint_restorer(state)
    # nothing changed: the iterator goes on where it stood
    assert global_step(strategy, next(other))[0].tolist() == list(range(9, 17))


@pytest.mark.parametrize("restored_on", ["mirrored_1", "mirrored_3", "default"])
def test_the_default_strategys_iterator_and_a_distributed_one_restore_into_each_other(restored_on: str) -> None:
    make = PIPELINES["shuffle_batch"]
    # the default strategy's input is the dataset itself: its iterator is a td.data iterator
    state, expected = saved_and_rest("default", make, 3)
    assert_same_steps(expected, restored(restored_on, make, state))
    state, expected = saved_and_rest("mirrored_2", make, 3, draws=1, preemption=True)  # one read ahead, one held
    assert_same_steps(expected, restored(restored_on, make, state))


def test_one_pipeline_per_replica_does_not_restore_into_a_dataset_iterator() -> None:
    strategy, dist = from_function("mirrored_2", per_replica=True)
    iterator = iter(dist)
    run_steps(strategy, iterator, 1)
    with pytest.raises(td.errors.FailedPreconditionError, match="its steps were not whole elements of one pipeline"):
        iter(per_replica_batches(td.distribute.InputContext()))._checkpoint_restorer(iterator._checkpoint_state())


def test_a_distributed_iterator_saved_with_another_shard_policy_is_refused() -> None:
    strategy = strategy_named("mirrored_2")
    saved = iter(strategy.experimental_distribute_dataset(PIPELINES["cycling_off"]()))
    state = saved._checkpoint_state()
    data = iter(strategy.experimental_distribute_dataset(with_policy(D.range(61).batch(GLOBAL_BATCH), Policy.DATA)))
    with pytest.raises(td.errors.FailedPreconditionError, match="not sharded .* when saved, but is sharded by data"):
        data._checkpoint_restorer(state)


# --- other numbers of workers, with virtual workers -----------------------------------------------


class VirtualJob:
    """The distributed datasets of ``workers`` processes of ``local`` replicas each, run in this process.

    Every worker's "which workers have data" agreement answers from its own flag only, so the
    workers must run out of data at the same step (the pipelines here do).
    """

    def __init__(self, dataset_for: Callable[..., Any], workers: int, local: int, from_fn: bool = False) -> None:
        strategy = strategy_named("mirrored_4")
        devices = tuple(device_lib.parse(f"CPU:{i}") for i in range(local))
        self.iterators = []
        for w in range(workers):
            worker = InputWorker(devices, workers, w, lambda flag, n=workers: [flag] * n)
            if from_fn:
                dist: Any = DistributedDatasetsFromFunction(dataset_for, worker, strategy, None, per_replica=False)
            else:
                dist = DistributedDataset(dataset_for(), worker, strategy, None)
            self.iterators.append(iter(dist))

    def run(self, k: int) -> None:
        """``k`` steps on every worker, each used by a run."""
        for _ in range(k):
            for iterator in self.iterators:
                next(iterator)
            steps.begin()  # (a step every worker ran)

    def state(self) -> bytes:
        """What every worker of the job saves: all workers' positions."""
        mine = [state_codec.decode(it._checkpoint_state())["workers"][0] for it in self.iterators]
        return state_codec.encode({"kind": "distributed_iterator", "workers": mine})

    def restore(self, state: bytes) -> None:
        for iterator in self.iterators:
            iterator._checkpoint_restorer(state)()

    def rest(self) -> list[list[int]]:
        """The examples of every later step, all workers' replicas in order."""
        steps = []
        while True:
            values = [next(iterator, None) for iterator in self.iterators]
            if all(v is None for v in values):
                return steps
            steps.append([x for value in values for x in _examples(value)])

    def streams(self) -> list[list[int]]:
        """Each worker's examples of every later step, in order, one list per worker."""
        per_worker: list[list[int]] = [[] for _ in self.iterators]
        while True:
            values = [next(iterator, None) for iterator in self.iterators]
            if all(v is None for v in values):
                return per_worker
            for stream, value in zip(per_worker, values):
                stream.extend(_examples(value))


def _examples(value: Any) -> list[int]:
    pieces = value.values if hasattr(value, "values") else (value,)
    return [int(x) for piece in pieces for x in np.asarray(piece).reshape(-1)]


def data_sharded() -> td.data.Dataset:
    return with_policy(D.range(96).shuffle(32, seed=4).batch(GLOBAL_BATCH), Policy.DATA)


@pytest.mark.parametrize("k", [0, 3, 5])
@pytest.mark.parametrize(("saved", "restored_as"), [((2, 1), (1, 2)), ((2, 1), (1, 1)), ((2, 2), (1, 4)), ((1, 2), (2, 1)), ((2, 1), (4, 1)), ((2, 1), (3, 1))])
def test_sharding_by_data_restores_onto_another_number_of_workers(
    saved: tuple[int, int], restored_as: tuple[int, int], k: int
) -> None:
    job = VirtualJob(data_sharded, *saved)
    job.run(k)
    state = job.state()
    expected = job.rest()
    new_job = VirtualJob(data_sharded, *restored_as)
    new_job.restore(state)
    assert new_job.rest() == expected


def test_no_sharding_restores_onto_another_number_of_workers_each_continuing_the_stream() -> None:
    make = lambda: with_policy(D.range(96).batch(GLOBAL_BATCH), Policy.OFF)  # noqa: E731
    job = VirtualJob(make, 2, 1)
    job.run(3)
    state = job.state()
    stream = job.streams()[0]
    assert job.streams() == [[], []]
    new_job = VirtualJob(make, 1, 2)
    new_job.restore(state)
    assert new_job.streams() == [stream]


@pytest.mark.parametrize("policy", [Policy.HINT, Policy.FILE])
def test_a_worker_split_of_files_or_shards_refuses_another_number_of_workers(policy: Any, tmp_path: Any) -> None:
    paths = []
    for k in range(4):
        path = tmp_path / f"f{k}.txt"
        path.write_text("".join(f"{k}-{line}\n" for line in range(6)))
        paths.append(str(path))

    def make() -> td.data.Dataset:
        names = D.from_tensor_slices(paths)
        lines = td.data.TextLineDataset(names) if policy == Policy.FILE else D.range(48).shard(
            td.data.experimental.SHARD_HINT, td.data.experimental.SHARD_HINT
        )
        return with_policy(lines.batch(4), policy)

    job = VirtualJob(make, 2, 1)
    job.run(1)
    state = job.state()
    new_job = VirtualJob(make, 2, 1)
    new_job.restore(state)  # the same workers: fine
    with pytest.raises(td.errors.FailedPreconditionError, match="saved on 2 workers of 1 replica and is restored on 1 worker of 2 replicas"):
        VirtualJob(make, 1, 2).iterators[0]._checkpoint_restorer(state)


def test_workers_at_different_positions_refuse_another_number_of_workers() -> None:
    make = lambda: with_policy(D.range(96).shuffle(32).batch(GLOBAL_BATCH), Policy.DATA)  # noqa: E731  (unseeded)
    job = VirtualJob(make, 2, 1)
    job.run(2)
    state = job.state()
    with pytest.raises(td.errors.FailedPreconditionError, match="worker 1's saved position differs .* give shuffle a seed"):
        VirtualJob(make, 1, 1).iterators[0]._checkpoint_restorer(state)


def sharded_by_pipeline(context: td.distribute.InputContext) -> td.data.Dataset:
    shard = D.range(96).shard(context.num_input_pipelines, context.input_pipeline_id)
    return shard.batch(context.get_per_replica_batch_size(GLOBAL_BATCH))


def same_on_every_worker(context: td.distribute.InputContext) -> td.data.Dataset:
    return D.range(96).shuffle(16, seed=9).batch(context.get_per_replica_batch_size(GLOBAL_BATCH))


def test_a_dataset_fn_sharding_by_input_pipeline_refuses_another_number_of_workers() -> None:
    job = VirtualJob(sharded_by_pipeline, 2, 1, from_fn=True)
    job.run(2)
    state = job.state()
    with pytest.raises(td.errors.FailedPreconditionError, match="dataset_fn makes a different pipeline on each worker"):
        VirtualJob(sharded_by_pipeline, 1, 2, from_fn=True).iterators[0]._checkpoint_restorer(state)


def test_a_dataset_fn_independent_of_the_workers_restores_onto_another_number_of_workers() -> None:
    job = VirtualJob(same_on_every_worker, 2, 1, from_fn=True)
    job.run(2)
    state = job.state()
    streams = job.streams()
    assert streams[0] == streams[1]  # every worker reads the same data
    new_job = VirtualJob(same_on_every_worker, 1, 2, from_fn=True)
    new_job.restore(state)
    assert new_job.streams() == [streams[0]]


# --- at the end, after an error, and saves that fail on one worker --------------------------------


def test_a_step_drawn_before_the_end_is_kept_by_a_preemption_save_and_the_restored_iterator_ends_after_it() -> None:
    strategy = strategy_named("mirrored_2")
    make = lambda: D.range(24).batch(GLOBAL_BATCH)  # noqa: E731
    iterator = iter(strategy.experimental_distribute_dataset(make()))
    run_steps(strategy, iterator, 2)
    last = global_step(strategy, next(iterator))  # drawn, never run
    assert not iterator.get_next_as_optional().has_value()  # the end
    with steps.preemption_save():
        state = iterator._checkpoint_state()
    assert_same_steps([last], restored("mirrored_4", make, state))
    # any other save counts it as used: restored, the iterator is at its end
    assert restored("mirrored_2", make, iterator._checkpoint_state()) == []


def test_an_epoch_ending_in_a_dropped_partial_step_restores_ended() -> None:
    # 40 rows in batches of 4 for 3 replicas: the last step (one batch) cannot be padded and is dropped
    strategy = strategy_named("mirrored_3")
    dist = strategy.distribute_datasets_from_function(lambda ctx: D.range(40).batch(4, drop_remainder=True))
    iterator = iter(dist)
    for value in iterator:
        strategy.run(lambda x: x, args=(value,))
    restored_iterator = iter(strategy.distribute_datasets_from_function(lambda ctx: D.range(40).batch(4, drop_remainder=True)))
    restored_iterator._checkpoint_restorer(iterator._checkpoint_state())()
    assert rest_of(strategy, restored_iterator) == []


def test_an_error_read_ahead_comes_again_after_the_steps_read_before_it() -> None:
    def fails_on_the_fifth(batch: np.ndarray) -> np.ndarray:
        if batch[0] == 32:
            raise ValueError("a bad record")
        return batch

    make = lambda: D.range(48).batch(GLOBAL_BATCH).map(fails_on_the_fifth)  # noqa: E731
    options = td.distribute.InputOptions(experimental_per_replica_buffer_size=4)  # reads the error ahead
    strategy = strategy_named("mirrored_2")
    iterator = iter(strategy.experimental_distribute_dataset(make(), options))
    run_steps(strategy, iterator, 1)
    state = iterator._checkpoint_state()
    restored_iterator = iter(strategy_named("mirrored_4").experimental_distribute_dataset(make(), options))
    restored_iterator._checkpoint_restorer(state)()
    for first in (8, 16, 24):
        assert global_step(strategy_named("mirrored_4"), next(restored_iterator))[0][0] == first
    with pytest.raises(ValueError, match="a bad record"):
        next(restored_iterator)


def test_a_worker_that_fails_to_give_its_position_makes_every_worker_raise() -> None:
    strategy = strategy_named("mirrored_2")
    devices = tuple(device_lib.parse(f"CPU:{i}") for i in range(2))
    gathered: list[bytes] = []

    def other_worker_failed(mine: bytes) -> list[bytes]:
        gathered.append(mine)
        return [mine, b"towerdist: no position: DeadlineExceededError('stuck')"]

    worker = InputWorker(devices, 2, 0, lambda flag: [flag, flag], share_states=other_worker_failed)
    iterator = iter(DistributedDataset(D.range(32).batch(GLOBAL_BATCH), worker, strategy, None))
    next(iterator)
    with pytest.raises(td.errors.AbortedError, match=r"worker\(s\) 1 failed to give their position .*stuck"):
        iterator._checkpoint_state()
    assert len(gathered) == 1  # this worker joined the gather

    def this_worker_joins(mine: bytes) -> list[bytes]:
        gathered.append(mine)
        return [mine, mine]

    class Unsavable:
        pass

    worker = InputWorker(devices, 2, 0, lambda flag: [flag, flag], share_states=this_worker_joins)
    unsavable = D.range(8).map(lambda x: np.array([Unsavable()], dtype=object)).shuffle(4, seed=0).batch(2)
    iterator = iter(DistributedDataset(unsavable, worker, strategy, None))
    next(iterator)
    with pytest.raises(TypeError, match="cannot save the distributed iterator's position: a value of type"):
        iterator._checkpoint_state()
    assert gathered[-1].startswith(b"towerdist: no position: ")  # it told the others before raising


# --- distribute_datasets_from_function: what may follow batch() -----------------------------------


FUNCTIONS: dict[str, Callable[[td.distribute.InputContext], td.data.Dataset]] = {
    "batch_prefetch": lambda c: D.range(64).shuffle(16, seed=3).batch(c.get_per_replica_batch_size(GLOBAL_BATCH)).prefetch(3),
    "batch_map": lambda c: D.range(64).batch(c.get_per_replica_batch_size(GLOBAL_BATCH)).map(lambda b: b * 1),
    "batch_shuffle": lambda c: D.range(64).batch(c.get_per_replica_batch_size(GLOBAL_BATCH)).shuffle(4, seed=1),
    "batch_filter": lambda c: D.range(64).batch(c.get_per_replica_batch_size(GLOBAL_BATCH)).filter(lambda b: True),
}


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("saved_on", [1, 2, 4])
@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_a_dataset_fn_restores_onto_other_replicas_exactly_or_refuses(function: str, saved_on: int, k: int) -> None:
    fn = FUNCTIONS[function]
    strategy = strategy_named(f"mirrored_{saved_on}")
    iterator = iter(strategy.distribute_datasets_from_function(fn))
    run_steps(strategy, iterator, k)
    state = iterator._checkpoint_state()
    expected = rest_of(strategy, iterator)
    for restored_on in (1, 2, 4):
        other = strategy_named(f"mirrored_{restored_on}")
        restored_iterator = iter(other.distribute_datasets_from_function(fn))
        if function in ("batch_shuffle", "batch_filter") and restored_on != saved_on:
            # batches regrouped, reordered or dropped after batch(): their rows cannot be cut again exactly
            with pytest.raises(td.errors.FailedPreconditionError, match="cannot be cut again"):
                restored_iterator._checkpoint_restorer(state)
            continue
        restored_iterator._checkpoint_restorer(state)()
        assert_same_steps(expected, rest_of(other, restored_iterator))


def test_a_dataset_fn_on_every_worker_restores_onto_fewer_workers_with_the_global_batch_size() -> None:
    job = VirtualJob(same_on_every_worker, 2, 1, from_fn=True)
    job.run(2)
    state = job.state()
    stream = job.streams()[0]
    new_job = VirtualJob(same_on_every_worker, 1, 1, from_fn=True)
    new_job.restore(state)
    steps_of_one = []
    while (value := next(new_job.iterators[0], None)) is not None:
        steps_of_one.append(_examples(value))
    assert [len(step) for step in steps_of_one[:-1]] == [GLOBAL_BATCH] * (len(steps_of_one) - 1)
    assert [x for step in steps_of_one for x in step] == stream


# --- a batch split over every replica (an input of unknown batch size read by every worker) -------


def hinted_unknown_batch() -> td.data.Dataset:
    dataset = D.range(48).shard(td.data.experimental.SHARD_HINT, td.data.experimental.SHARD_HINT)
    return with_policy(dataset.batch(4).map(lambda b: b[: len(b)]), Policy.HINT)  # a batch size map hides


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_a_batch_split_over_every_replica_restores_on_the_same_workers_without_repeating_a_piece(k: int) -> None:
    job = VirtualJob(hinted_unknown_batch, 2, 1)
    job.run(k)
    state = job.state()
    expected = job.rest()
    new_job = VirtualJob(hinted_unknown_batch, 2, 1)
    new_job.restore(state)
    assert new_job.rest() == expected


# --- saved again before what a restore gave back was read -----------------------------------------


def test_a_restored_end_of_data_saved_again_before_it_is_read_restores_the_same() -> None:
    strategy = strategy_named("mirrored_2")
    make = lambda: D.range(24).batch(GLOBAL_BATCH)  # noqa: E731
    iterator = iter(strategy.experimental_distribute_dataset(make()))
    run_steps(strategy, iterator, 2)
    last = global_step(strategy, next(iterator))
    assert not iterator.get_next_as_optional().has_value()
    with steps.preemption_save():
        state = iterator._checkpoint_state()
    once = iter(strategy.experimental_distribute_dataset(make()))
    once._checkpoint_restorer(state)()
    again = once._checkpoint_state()  # before the step it gave back is read
    assert_same_steps([last], restored("mirrored_3", make, again))


def test_a_restored_error_saved_again_before_it_is_raised_comes_again() -> None:
    def fails_on_the_fifth(batch: np.ndarray) -> np.ndarray:
        if batch[0] == 32:
            raise ValueError("a bad record")
        return batch

    make = lambda: D.range(48).batch(GLOBAL_BATCH).map(fails_on_the_fifth)  # noqa: E731
    options = td.distribute.InputOptions(experimental_per_replica_buffer_size=4)
    strategy = strategy_named("mirrored_2")
    iterator = iter(strategy.experimental_distribute_dataset(make(), options))
    run_steps(strategy, iterator, 1)
    once = iter(strategy.experimental_distribute_dataset(make()))
    once._checkpoint_restorer(iterator._checkpoint_state())()
    strategy.run(lambda x: x, args=(next(once),))  # one of the three steps read before the error
    again = iter(strategy.experimental_distribute_dataset(make()))
    again._checkpoint_restorer(once._checkpoint_state())()
    assert [global_step(strategy, next(again))[0][0] for _ in range(2)] == [24 - 8, 24]
    with pytest.raises(ValueError, match="a bad record"):
        next(again)


def same_object_repeated() -> td.data.Dataset:
    # one cached element repeated: the pipeline yields one object again and again
    element = D.from_tensors(np.arange(8, dtype=np.int64)).map(lambda b: b[: len(b)]).cache()
    return with_policy(element.repeat(6).shard(td.data.experimental.SHARD_HINT, td.data.experimental.SHARD_HINT), Policy.HINT)


@pytest.mark.parametrize("draws", [0, 1])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_a_batch_split_over_every_replica_keeps_each_element_even_when_the_pipeline_repeats_one_object(
    k: int, draws: int
) -> None:
    job = VirtualJob(same_object_repeated, 2, 1)
    job.run(k)
    for iterator in job.iterators:
        for _ in range(draws):
            next(iterator)
    with steps.preemption_save():
        state = job.state()
    reference = VirtualJob(same_object_repeated, 2, 1)
    reference.run(k)
    new_job = VirtualJob(same_object_repeated, 2, 1)
    new_job.restore(state)
    assert new_job.rest() == reference.rest()


def test_a_dataset_fn_whose_last_batch_drops_the_remainder_of_a_finite_input_refuses_other_replicas() -> None:
    fn = lambda c: D.range(100).batch(c.get_per_replica_batch_size(12), drop_remainder=True).prefetch(2)  # noqa: E731
    four = strategy_named("mirrored_4")
    iterator = iter(four.distribute_datasets_from_function(fn))
    run_steps(four, iterator, 2)
    state = iterator._checkpoint_state()
    three = iter(strategy_named("mirrored_3").distribute_datasets_from_function(fn))
    with pytest.raises(td.errors.FailedPreconditionError, match="drops a remainder of a finite input"):
        three._checkpoint_restorer(state)


def test_a_dataset_fn_state_restores_into_the_default_strategy_only_at_its_batch_size() -> None:
    fn = lambda c: D.range(64).batch(c.get_per_replica_batch_size(GLOBAL_BATCH)).prefetch(3)  # noqa: E731
    two = strategy_named("mirrored_2")
    iterator = iter(two.distribute_datasets_from_function(fn))
    run_steps(two, iterator, 2)
    state = iterator._checkpoint_state()
    default = strategy_named("default")
    with pytest.raises(td.errors.FailedPreconditionError, match="a td.data iterator does not cut batches again"):
        iter(default.distribute_datasets_from_function(fn))._checkpoint_restorer(state)
    # the other way, the default strategy's batches of 8 are cut into two of 4
    default_iterator = iter(default.distribute_datasets_from_function(fn))
    run_steps(default, default_iterator, 2)
    expected = [x for value in default_iterator for x in np.asarray(value).tolist()]
    default_iterator = iter(default.distribute_datasets_from_function(fn))
    run_steps(default, default_iterator, 2)
    restored_iterator = iter(two.distribute_datasets_from_function(fn))
    restored_iterator._checkpoint_restorer(default_iterator._checkpoint_state())()
    got = rest_of(two, restored_iterator)
    assert [len(step[0]) for step in got] == [GLOBAL_BATCH] * len(got)
    assert [x for step in got for x in step[0].tolist()] == expected


def test_a_worker_out_of_data_first_under_shard_hints_gets_empty_pieces() -> None:
    def make() -> td.data.Dataset:
        dataset = D.range(5).shard(td.data.experimental.SHARD_HINT, td.data.experimental.SHARD_HINT)
        return with_policy(dataset.flat_map(lambda x: D.from_tensors(x).repeat(3)).batch(2), Policy.HINT)

    # worker 1 of 2 reads elements 1 and 3 (6 rows); worker 0, elsewhere, still has data after that
    worker = InputWorker((device_lib.parse("CPU:0"),), 2, 1, lambda flag: [True, flag])
    iterator = iter(DistributedDataset(make(), worker, strategy_named("mirrored_4"), None))
    pieces = [_examples(next(iterator)) for _ in range(8)]
    # one row per step (a global batch of 2 for 2 replicas); after its 6 rows, empty pieces made from
    # the spec of its own shard (the hint filled in)
    assert pieces == [[1], [1], [1], [3], [3], [3], [], []]


def test_workers_whose_threads_read_ahead_into_another_epoch_are_at_the_same_place() -> None:
    # A prefetch thread may have begun the next epoch's shuffle on one worker and not yet on the
    # other when they save: their epoch counters differ, their data does not.
    make = lambda: with_policy(D.range(32).shuffle(8, seed=2).repeat(3).batch(GLOBAL_BATCH), Policy.DATA)  # noqa: E731
    job = VirtualJob(make, 2, 1)
    job.run(3)
    tree = state_codec.decode(job.state())
    positions = [state_codec.decode(bytes(blob)) for blob in tree["workers"]]
    shuffled = next(k for k, state in enumerate(positions[1]["pipelines"][0]["random"]) if state is not None)
    positions[1]["pipelines"][0]["random"][shuffled]["next_epoch"] += 1
    state = state_codec.encode(
        {"kind": tree["kind"], "workers": [np.frombuffer(state_codec.encode(p), np.uint8) for p in positions]}
    )
    expected = job.rest()
    new_job = VirtualJob(make, 1, 2)
    new_job.restore(state)
    assert new_job.rest() == expected
