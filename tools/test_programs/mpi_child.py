"""Scenarios run under ``mpiexec -n 2`` by ``test_multi_worker_processes.py``.

``python tools/test_programs/mpi_child.py <scenario> [directory]``: each rank appends what it observed,
one JSON object per line, to ``$MPI_CHILD_RESULTS/rank-<rank>.jsonl`` (the ranks' stdout
lines interleave); the test reads every rank's file (it never trusts mpiexec's exit status
alone). A scenario that makes a rank stall does so on purpose: the
point is what the *other* ranks do.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import towerdist as td
from towerdist._src.checkpoint import saving


def report(**fields: object) -> None:
    path = os.path.join(os.environ["MPI_CHILD_RESULTS"], f"rank-{fields['rank']}.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(fields) + "\n")


def all_reduce(strategy: td.distribute.Strategy) -> object:
    return strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", np.ones(4, np.float32)))


def stuck_rank(strategy: td.distribute.Strategy, rank: int) -> None:
    """Rank 1 never reaches the collective (it is busy for far longer than the timeout)."""
    if rank == 1:
        time.sleep(60)
        report(rank=rank, outcome="woke up")  # only if the job was not torn down
        return
    start = time.monotonic()
    try:
        all_reduce(strategy)
    except td.errors.DeadlineExceededError as error:
        report(rank=rank, outcome="DeadlineExceededError", seconds=time.monotonic() - start,
               missing=error.missing, message=str(error))
    try:
        all_reduce(strategy)
    except td.errors.UnavailableError as error:
        report(rank=rank, outcome="then UnavailableError", message=str(error))


def slow_rank(strategy: td.distribute.Strategy, rank: int) -> None:
    """No timeout; rank 1 is 1.2 s late: rank 0 warns about it (every 0.5 s), then both finish."""
    import warnings

    td.config.set_replica_timeouts(warning_seconds=0.5, timeout_seconds=None)
    if rank == 1:
        time.sleep(1.2)  # the scenario: a late rank (not synchronisation)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = all_reduce(strategy)
    messages = [str(w.message) for w in caught if issubclass(w.category, td.errors.ReplicaStallWarning)]
    report(rank=rank, outcome="done", result=np.asarray(result).tolist(), warnings=messages)


def uncaught_exception(strategy: td.distribute.Strategy, rank: int) -> None:
    """Rank 1 raises and does not catch; rank 0 waits in a collective with no timeout."""
    if rank == 1:
        report(rank=rank, outcome="raising")
        raise RuntimeError("rank 1 failed on purpose")
    report(rank=rank, outcome="entering all_reduce")
    all_reduce(strategy)
    report(rank=rank, outcome="all_reduce returned")


def early_exit(strategy: td.distribute.Strategy, rank: int) -> None:
    """Rank 1 calls sys.exit(3) (no exception hook runs); rank 0 waits in a collective with no timeout."""
    if rank == 1:
        sys.exit(3)
    start = time.monotonic()
    try:
        all_reduce(strategy)
    except td.errors.AbortedError as error:
        report(rank=rank, outcome="AbortedError", seconds=time.monotonic() - start, ranks=error.ranks,
               message=str(error))


def interrupted_wait(strategy: td.distribute.Strategy, rank: int) -> None:
    """Rank 0's wait is interrupted (a stall warning turned into an error): its next collective refuses."""
    import warnings

    td.config.set_replica_timeouts(warning_seconds=0.5, timeout_seconds=None)
    if rank == 1:
        time.sleep(1.2)  # the scenario: a late rank, past rank 0's 0.5 s warning
        report(rank=rank, outcome="late rank done")
        return
    warnings.simplefilter("error", td.errors.ReplicaStallWarning)
    try:
        all_reduce(strategy)
    except td.errors.ReplicaStallWarning:
        pass  # the interruption itself, expected
    try:
        all_reduce(strategy)
        outcome = "second collective ran"
    except td.errors.UnavailableError as error:
        outcome = "UnavailableError: " + str(error)
    report(rank=rank, outcome=outcome)


def unbounded(strategy: td.distribute.Strategy, rank: int) -> None:
    """timeout_seconds <= 0 means no bound (TensorFlow's meaning): rank 1 is 1.5 s late twice, rank 0 waits.

    The strategy was made with ``timeout_seconds=-1`` and the replica timeout is 0.5 s: the
    first collective outlasts it. The second passes ``timeout_seconds=0`` per call over a
    strategy whose own options say 0.5 s.
    """
    td.config.set_replica_timeouts(warning_seconds=None, timeout_seconds=0.5)
    bounded = td.distribute.MultiWorkerMirroredStrategy(
        communication_options=td.distribute.experimental.CommunicationOptions(timeout_seconds=0.5)
    )
    unbounded_call = td.distribute.experimental.CommunicationOptions(timeout_seconds=0)
    results = []
    for reduce in (
        lambda: all_reduce(strategy),
        lambda: bounded.run(lambda: td.distribute.get_replica_context().all_reduce(
            "sum", np.ones(4, np.float32), options=unbounded_call)),
    ):
        if rank == 1:
            time.sleep(1.5)
        start = time.monotonic()
        try:
            results.append([np.asarray(reduce()).tolist(), time.monotonic() - start])
        except Exception as error:  # noqa: BLE001  (reported, and the test fails on it)
            results.append([f"{type(error).__name__}: {error}", time.monotonic() - start])
    report(rank=rank, outcome="done", results=results)


def killed_rank(strategy: td.distribute.Strategy, rank: int) -> None:
    """Rank 1 is killed with SIGKILL; rank 0 waits in a collective with no timeout."""
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    report(rank=rank, outcome="entering all_reduce")
    all_reduce(strategy)
    report(rank=rank, outcome="all_reduce returned")


def failed_save(strategy: td.distribute.Strategy, rank: int, directory: str) -> None:
    """A first checkpoint saves; in the second save rank 1 fails before the chief writes."""
    with strategy.scope():
        w = td.Variable(np.full(3, 1.0, np.float32))
    checkpoint = td.train.Checkpoint(w=w)
    manager = td.train.CheckpointManager(checkpoint, directory, max_to_keep=5)
    first = manager.save()
    with strategy.scope():
        w.assign(np.full(3, 2.0, np.float32))
    if rank == 1:
        def broken(found: object, prefix: str) -> object:
            raise OSError("rank 1's disk is full (on purpose)")

        saving.values_to_save = broken  # type: ignore[assignment]
    try:
        manager.save()
        outcome = "saved"
    except Exception as error:  # the test checks which error each rank raised
        outcome = type(error).__name__
    latest = td.train.latest_checkpoint(directory)
    with strategy.scope():
        w.assign(np.zeros(3, np.float32))
    checkpoint.restore(latest)
    report(rank=rank, outcome=outcome, first=first, latest=latest, restored=w.values[0].numpy().tolist())


def save_for_other_topologies(strategy: td.distribute.Strategy, rank: int, directory: str) -> None:
    """Saves a model and an optimizer's slots under two workers, for a restore elsewhere."""
    with strategy.scope():
        w = td.Variable(np.arange(4, dtype=np.float32), name="w")
        optimizer = td.optimizers.SGD(0.5, momentum=0.9)
    strategy.run(lambda: optimizer.apply_gradients([(np.full(4, 1.0 + rank, np.float32), w)]))
    path = td.train.Checkpoint(w=w, optimizer=optimizer).save(os.path.join(directory, "ckpt"))
    report(rank=rank, outcome="saved", path=path, w=w.values[0].numpy().tolist(),
           momentum=optimizer.get_slot(w, "momentum").values[0].numpy().tolist())


def late_start(rank: int) -> None:
    """Rank 1 creates its strategy 30 s late; rank 0's creation is bounded by its timeout (2 s).

    Both ranks start MPI first: ``MPI_Init`` itself waits for every rank (MPI's own start-up).
    """
    from mpi4py import MPI

    assert MPI.COMM_WORLD.Get_size() == 2
    if rank == 1:
        time.sleep(30)
    options = td.distribute.experimental.CommunicationOptions(timeout_seconds=2.0)
    start = time.monotonic()
    try:
        td.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except td.errors.DeadlineExceededError as error:
        report(rank=rank, outcome="DeadlineExceededError", seconds=time.monotonic() - start, message=str(error))


def device_names(cpus: int) -> None:
    """What each worker calls its devices, with ``cpus`` logical CPUs configured before the strategy."""
    if cpus > 1:
        cpu = td.config.list_physical_devices("CPU")[0]
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * cpus)
    strategy = td.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        v = td.Variable(1.0)
    report(
        rank=strategy.cluster_resolver.task_id,
        logical=[d.name for d in td.config.list_logical_devices("CPU")],
        device=v.device,
        components=[c.device for c in strategy.experimental_local_results(v)],
        non_slot=list(strategy.extended.non_slot_devices([v])),
        worker_devices=list(strategy.extended.worker_devices),
        constant_on_own_name=float(_constant_on(v.device)),
    )


def _constant_on(name: str) -> object:
    with td.device(name):  # this worker's own device name is a local device
        return td.constant(2.0)


def main() -> None:
    scenario = sys.argv[1]
    if scenario == "late_start":
        late_start(int(os.environ["PMI_RANK"]))
        return
    if scenario == "device_names":
        device_names(int(sys.argv[2]))
        return
    timeout = {"stuck": 2.0, "unbounded": -1}.get(scenario)
    options = td.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    strategy = td.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    rank = strategy.cluster_resolver.task_id
    if scenario == "stuck":
        stuck_rank(strategy, rank)
    elif scenario == "slow":
        slow_rank(strategy, rank)
    elif scenario == "uncaught":
        uncaught_exception(strategy, rank)
    elif scenario == "exit":
        early_exit(strategy, rank)
    elif scenario == "interrupted":
        interrupted_wait(strategy, rank)
    elif scenario == "unbounded":
        unbounded(strategy, rank)
    elif scenario == "killed":
        killed_rank(strategy, rank)
    elif scenario == "failed_save":
        failed_save(strategy, rank, sys.argv[2])
    elif scenario == "save":
        save_for_other_topologies(strategy, rank, sys.argv[2])
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
