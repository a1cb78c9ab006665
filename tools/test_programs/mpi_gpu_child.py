"""MultiWorkerMirroredStrategy on SIMULATED GPUs, run under ``mpiexec -n 2`` by ``test_multi_worker_gpus.py``.

``TOWERDIST_SIMULATE_GPUS=2 python tools/test_programs/mpi_gpu_child.py <scenario>``: every process
simulates the same 2-GPU host; the simulator's NCCL connects the ranks of the two
processes through files (``towerdist.testing``). Each rank appends what it observed, one
JSON object per line, to ``$MPI_CHILD_RESULTS/rank-<rank>.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import towerdist as td


def report(**fields: object) -> None:
    path = os.path.join(os.environ["MPI_CHILD_RESULTS"], f"rank-{fields['rank']}.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(fields) + "\n")


def host(array: object) -> list:
    from towerdist._src.backend import cupy_backend

    return np.asarray(cupy_backend.xp.asnumpy(array)).tolist()


def train(rank: int) -> None:
    """Each worker on a GPU of its own; gradients summed across the workers with NCCL."""
    from towerdist.testing import simulated_gpu_stats

    strategy = td.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = td.Variable(np.zeros(4, np.float32))
        optimizer = td.optimizers.SGD(0.1)

    def step() -> None:
        context = td.distribute.get_replica_context()
        grad = td.ones([4]) * td.cast(context.replica_id_in_sync_group + 1, td.float32)  # 1 on worker 0, 2 on 1
        optimizer.apply_gradients([(grad, w)])

    strategy.run(step)
    simulated_gpu_stats(reset=True)
    for _ in range(2):
        strategy.run(step)
    syncs = simulated_gpu_stats()["host_syncs"]
    report(
        rank=rank,
        outcome="trained",
        devices=list(strategy.extended.worker_devices),
        gpu=int(w.values[0].value().device.id) if isinstance(w, td.distribute.DistributedValues) else
        int(w.value().device.id),
        w=host(w.value()),
        nccl=strategy.extended._nccl is not None,
        host_syncs=syncs,
    )  # fmt: skip


def two_local_gpus(rank: int) -> None:
    """4 GPUs on the host, 2 workers: 2 GPUs each; a MEAN all-reduce and a training step across all 4 replicas.

    The round's function runs on the thread of the last local replica to arrive, whichever
    GPU that thread has current: the MEAN's division and the copies to the other local GPU
    name their device.
    """
    strategy = td.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = td.Variable(np.zeros(2, np.float32))
        optimizer = td.optimizers.SGD(1.0)

    def step() -> object:
        context = td.distribute.get_replica_context()
        value = td.ones([2]) * td.cast(context.replica_id_in_sync_group, td.float32)  # 0, 1, 2, 3
        optimizer.apply_gradients([(value, w)])
        return context.all_reduce("mean", value)

    means = strategy.experimental_local_results(strategy.run(step))
    report(
        rank=rank,
        outcome="done",
        devices=list(strategy.extended.worker_devices),
        means=[host(m) for m in means],
        gpus=[int(m.device.id) for m in means],
        w=[host(c.value()) for c in w.values],
    )


def same_gpu(rank: int) -> None:
    """Both workers told to use GPU 0: NCCL refuses two ranks on one GPU, on both workers, clearly."""
    strategy = td.distribute.MultiWorkerMirroredStrategy._from_local_devices(["GPU:0"])
    try:
        strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", td.ones([2])))
    except td.errors.UnavailableError as error:
        report(rank=rank, outcome="UnavailableError", message=str(error))


def cupy_13(rank: int) -> None:
    """cupy before 14 returns and takes the unique id as a tuple of ints: it works as well."""
    from towerdist._src.backend import cupy_backend

    cupy_backend.nccl()._simulation.unique_id_format = "tuple"
    strategy = td.distribute.MultiWorkerMirroredStrategy()
    result = strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", td.ones([2]) * (rank + 1)))
    report(rank=rank, outcome="summed", result=host(result))


def mismatched_ops(rank: int) -> None:
    """Rank 0 asks for a MEAN, rank 1 for a SUM: both raise before NCCL runs; the next collective works."""
    strategy = td.distribute.MultiWorkerMirroredStrategy()
    op = ("mean", "sum")[rank]
    try:
        strategy.run(lambda: td.distribute.get_replica_context().all_reduce(op, td.ones([2])))
        report(rank=rank, outcome="no error", nccl=strategy.extended._nccl is not None)
    except td.errors.InvalidArgumentError as error:
        report(rank=rank, outcome="InvalidArgumentError", message=str(error))
    result = strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", td.ones([2])))
    report(rank=rank, outcome="summed", result=host(result), nccl=strategy.extended._nccl is not None)


def fails_before_first_nccl(rank: int) -> None:
    """Rank 1's copy onto its GPU fails while packing the first NCCL sum (after the NCCL set-up)."""
    from towerdist._src import backend

    strategy = td.distribute.MultiWorkerMirroredStrategy()
    impl = backend.for_device(strategy.extended._devices[0])
    if rank == 1:
        original = impl.to_device

        def out_of_memory(*args: object, **kwargs: object) -> object:
            impl.to_device = original  # once
            raise RuntimeError("simulated cudaErrorMemoryAllocation: out of memory")

        impl.to_device = out_of_memory
    value = strategy.run(lambda: td.ones([4]))
    try:
        result = strategy.reduce("sum", value, axis=None)
        report(rank=rank, outcome="reduced", result=host(result))
    except Exception as error:
        report(rank=rank, outcome=type(error).__name__, message=str(error))
    result = strategy.reduce("sum", value, axis=None)
    report(rank=rank, outcome="next reduced", result=host(result))


def stalled_nccl(rank: int) -> None:
    """Rank 1 skips its NCCL call after the MPI agreement: rank 0's watch aborts it past the timeout."""
    from towerdist._src.multi_worker import nccl_workers

    options = td.distribute.experimental.CommunicationOptions(timeout_seconds=1.0)
    strategy = td.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    step = lambda: td.distribute.get_replica_context().all_reduce("sum", td.ones([2]))  # noqa: E731
    strategy.run(step)  # the communicator exists on both
    workers = strategy.extended._nccl
    if rank == 1:
        workers._clique.comms[0] = _Forgetful(workers._clique.comms[0])
    strategy.run(step)  # rank 1 never launches its half: rank 0's collective stalls
    if rank == 0:
        thread = workers._watch._thread
        if thread is not None:
            thread.join(timeout=30)  # the watch ends once it has aborted the stalled collective
        report(rank=rank, outcome="watched", broken=workers._clique.broken)
        try:
            strategy.run(step)
        except (td.errors.DeadlineExceededError, td.errors.UnavailableError) as error:
            report(rank=rank, outcome=type(error).__name__, message=str(error))
    del nccl_workers


class _Forgetful:
    """A communicator whose all-reduce is never launched (a rank that stalls on the GPU)."""

    def __init__(self, comm: object) -> None:
        self._comm = comm

    def allReduce(self, *args: object) -> None:  # noqa: N802  (cupy's name)
        return None

    def __getattr__(self, name: str) -> object:
        return getattr(self._comm, name)


if __name__ == "__main__":
    scenario = sys.argv[1]
    rank = td.distribute.MultiWorkerMirroredStrategy  # the MPI job starts with the first strategy
    from mpi4py import MPI

    globals()[scenario](MPI.COMM_WORLD.Get_rank())
