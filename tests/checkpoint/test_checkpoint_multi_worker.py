"""Checkpoints under ``MultiWorkerMirroredStrategy``: who asks, who reads, who writes. Test bodies for any number of workers.

Every test here is marked ``multi_worker``: it runs in the default suite (one worker, with one
and two local replicas) and again under ``mpiexec -n 2 python -m pytest -m multi_worker``
(two workers), where what each rank expects is computed from its rank.

* Saving asks every worker for every saveable's state, in key order (collective saveables
  need it); each distinct path is written once, by the first worker that names it.
* A restore of objects without distributed variables or collective saveables is local: each
  worker reads the files itself, and one worker alone may restore (the chief's evaluation
  restore no longer makes the next collective of the others mismatch). Otherwise the chief
  reads and sends, and a failure on one worker fails all of them, changing nothing.
* TensorFlow's tutorial pattern: a non-chief worker saves into ``workertemp_<id>`` and removes
  it with ``td.io.gfile.rmtree``; the chief's checkpoint restores on every worker.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import towerdist as td

from checkpoint_helpers import Stub, index_file, read_index

pytestmark = pytest.mark.multi_worker


def layout(strategy: Any) -> tuple[int, int]:
    """``(rank, workers)``."""
    return strategy.extended._worker_index, strategy.extended._num_workers


def count_replicas(strategy: Any) -> float:
    """A collective every worker must take part in: the number of replicas, all-reduced."""
    total = strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", 1.0))
    return float(strategy.experimental_local_results(total)[0])


def test_saving_asks_every_worker_for_each_state_in_key_order_and_the_chief_writes_a_shared_path(
    multi_worker_strategy, shared_tmp_path
):
    strategy = multi_worker_strategy
    rank, _ = layout(strategy)
    log: list[Any] = []
    with strategy.scope():
        w = td.Variable(np.arange(3, dtype=np.float32))
    b = Stub("b", f"b of rank {rank}".encode(), collective=True, log=log)
    a = Stub("a", f"a of rank {rank}".encode(), log=log)
    path = td.train.Checkpoint(w=w, b=b, a=a).write(str(shared_tmp_path / "ckpt"))

    assert log == [("state", "a"), ("state", "b")]
    assert sorted(os.listdir(shared_tmp_path)) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    entries = read_index(path)["entries"]
    assert entries["a"]["kind"] == entries["b"]["kind"] == "object"
    restored_a, restored_b = Stub("a2"), Stub("b2", collective=True)
    with strategy.scope():
        target = td.Variable(np.zeros(3, np.float32))
    td.train.Checkpoint(w=target, b=restored_b, a=restored_a).read(path).assert_consumed()
    assert (restored_a.state, restored_b.state) == (b"a of rank 0", b"b of rank 0")  # the chief's, everywhere
    assert [c.numpy().tolist() for c in target.values] == [[0.0, 1.0, 2.0]] * len(target.values)


def test_a_restore_of_plain_variables_is_local_so_the_chief_may_restore_alone(multi_worker_strategy, shared_tmp_path):
    strategy = multi_worker_strategy
    rank, _ = layout(strategy)
    step = td.Variable(np.int64(41))  # created outside the scope: a plain variable of this process
    path = td.train.Checkpoint(step=step).write(str(shared_tmp_path / "eval"))
    target = td.Variable(np.int64(0))
    if rank == 0:  # an evaluation restore on the chief only
        td.train.Checkpoint(step=target).read(path).assert_consumed()
    assert count_replicas(strategy) == strategy.num_replicas_in_sync  # the next collective is every worker's
    assert int(target.numpy()) == (41 if rank == 0 else 0)


def test_each_worker_reads_its_own_files_unless_distributed_variables_need_the_chiefs(
    multi_worker_strategy, shared_tmp_path
):
    strategy = multi_worker_strategy
    rank, _ = layout(strategy)
    own = str(shared_tmp_path / f"worker{rank}" / "ckpt")  # a path of each worker's own: each writes it
    step = td.Variable(np.int64(10 + rank))
    with strategy.scope():
        w = td.Variable(np.full(2, 20.0 + rank, np.float32))  # assigned apart on purpose: the copies differ
    td.train.Checkpoint(step=step, w=w).write(own)
    assert index_file(own).is_file()

    plain = td.Variable(np.int64(0))
    td.train.Checkpoint(step=plain).read(own).expect_partial()
    assert int(plain.numpy()) == 10 + rank  # local: this worker's own file

    with strategy.scope():
        mirrored = td.Variable(np.zeros(2, np.float32))
    plain_too = td.Variable(np.int64(0))
    td.train.Checkpoint(step=plain_too, w=mirrored).read(own).assert_consumed()
    assert int(plain_too.numpy()) == 10  # collective: the chief's file, sent to every worker
    assert [c.numpy().tolist() for c in mirrored.values] == [[20.0, 20.0]] * len(mirrored.values)


def test_a_restore_that_fails_on_one_worker_fails_on_all_changes_nothing_and_the_strategy_goes_on(
    multi_worker_strategy, shared_tmp_path
):
    strategy = multi_worker_strategy
    rank, workers = layout(strategy)
    with strategy.scope():
        w = td.Variable(np.arange(3, dtype=np.float32))
    path = td.train.Checkpoint(w=w, it=Stub("it", b"S", collective=True)).write(str(shared_tmp_path / "ckpt"))
    with strategy.scope():
        target = td.Variable(np.zeros(3, np.float32))
    refuses = rank == workers - 1
    stub = Stub("it2", collective=True, refuse=refuses)
    expected = td.errors.FailedPreconditionError if refuses else td.errors.AbortedError
    with pytest.raises(expected):
        td.train.Checkpoint(w=target, it=stub).read(path)
    assert [c.numpy().tolist() for c in target.values] == [[0.0] * 3] * len(target.values)
    assert stub.state == b"" and [entry[0] for entry in stub.log] == ["prepare"]
    assert count_replicas(strategy) == strategy.num_replicas_in_sync

    stub.refuse = False
    td.train.Checkpoint(w=target, it=stub).read(path).assert_consumed()
    assert stub.state == b"S" and target.values[0].numpy().tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("saver", ["manager", "checkpoint_save"])
def test_a_path_only_a_non_chief_names_is_written_by_it_with_the_state_file(
    multi_worker_strategy, shared_tmp_path, saver
):
    strategy = multi_worker_strategy
    rank, _ = layout(strategy)
    with strategy.scope():
        w = td.Variable(np.arange(2, dtype=np.float32))
    directory = shared_tmp_path / ("chief" if rank == 0 else f"workertemp_{rank}")
    checkpoint = td.train.Checkpoint(w=w)
    manager = td.train.CheckpointManager(checkpoint, str(directory), max_to_keep=1)
    for _ in range(2):
        path = manager.save() if saver == "manager" else checkpoint.save(str(directory / "ckpt"))
    kept = ["ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    if saver == "checkpoint_save":  # Checkpoint.save() deletes nothing
        kept = ["ckpt-1.data-00000-of-00001", "ckpt-1.index", *kept]
    assert sorted(os.listdir(directory)) == ["checkpoint", *kept]
    assert td.train.latest_checkpoint(str(directory)) == path == str(directory / "ckpt-2")


def test_restore_or_initialize_of_plain_variables_is_local(multi_worker_strategy, shared_tmp_path):
    strategy = multi_worker_strategy
    rank, _ = layout(strategy)
    directory = str(shared_tmp_path / f"worker{rank}")
    step = td.Variable(np.int64(3 + rank))
    td.train.CheckpointManager(td.train.Checkpoint(step=step), directory, max_to_keep=1).save()
    if rank == 0:  # the chief alone: no collective
        restored = td.Variable(np.int64(0))
        manager = td.train.CheckpointManager(td.train.Checkpoint(step=restored), directory, max_to_keep=1)
        assert manager.restore_or_initialize() == os.path.join(directory, "ckpt-1")
        assert int(restored.numpy()) == 3
    assert count_replicas(strategy) == strategy.num_replicas_in_sync


# --- TensorFlow's tutorial pattern (multi_worker_with_ctl) -----------------------------------------


def _is_chief(task_type: str | None, task_id: int, cluster_spec: Any) -> bool:
    return (task_type is None or task_type == "chief"
            or (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath: str, task_id: int) -> str:
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    td.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath: str, task_type: str | None, task_id: int, cluster_spec: Any) -> str:
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


class Linear(td.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = td.Variable(np.zeros(4, np.float32), name="w")


def test_tensorflows_tutorial_pattern_runs_unchanged(multi_worker_strategy, shared_tmp_path):
    strategy = multi_worker_strategy
    checkpoint_dir = os.path.join(str(shared_tmp_path), "ckpt")
    with strategy.scope():
        multi_worker_model = Linear()
        optimizer = td.optimizers.SGD(0.1)
    epoch = td.Variable(initial_value=td.constant(0, dtype=td.int64), name="epoch")
    step_in_epoch = td.Variable(initial_value=td.constant(0, dtype=td.int64), name="step_in_epoch")
    task_type, task_id, cluster_spec = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id,
                                        strategy.cluster_resolver.cluster_spec())
    checkpoint = td.train.Checkpoint(model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)
    write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
    checkpoint_manager = td.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)
    latest_checkpoint = td.train.latest_checkpoint(checkpoint_dir)
    if latest_checkpoint:
        checkpoint.restore(latest_checkpoint)
    assert latest_checkpoint is None

    num_epochs, num_steps_per_epoch = 3, 2
    while epoch.numpy() < num_epochs:
        while step_in_epoch.numpy() < num_steps_per_epoch:
            strategy.run(lambda: optimizer.apply_gradients([(np.ones(4, np.float32), multi_worker_model.w)]))
            step_in_epoch.assign_add(1)
        checkpoint_manager.save()
        if not _is_chief(task_type, task_id, cluster_spec):
            written = sorted(os.listdir(write_checkpoint_dir))  # what TensorFlow writes there
            assert written == ["checkpoint", f"ckpt-{int(epoch.numpy()) + 1}.data-00000-of-00001",
                               f"ckpt-{int(epoch.numpy()) + 1}.index"]
            td.io.gfile.rmtree(write_checkpoint_dir)
        epoch.assign_add(1)
        step_in_epoch.assign(0)

    trained = multi_worker_model.w.values[0].numpy().tolist()
    latest = td.train.latest_checkpoint(checkpoint_dir)
    assert latest == os.path.join(checkpoint_dir, "ckpt-3")
    with strategy.scope():
        restored_model = Linear()
    restored_epoch = td.Variable(np.int64(0))
    restored = td.train.Checkpoint(model=restored_model, epoch=restored_epoch, step_in_epoch=td.Variable(np.int64(5)))
    restored.restore(latest).assert_consumed()
    assert [c.numpy().tolist() for c in restored_model.w.values] == [trained] * len(restored_model.w.values)
    assert int(restored_epoch.numpy()) == 2  # saved before the epoch counter moves on, as in the tutorial
    if not _is_chief(task_type, task_id, cluster_spec):
        assert os.listdir(os.path.dirname(write_checkpoint_dir)) == []  # workertemp_<id> stays, empty
