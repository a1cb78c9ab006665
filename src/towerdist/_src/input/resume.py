"""Which saved position a worker's restored distributed iterator continues from, on the same or another world.

A distributed iterator is saved with every worker's position (its pipelines, the data it
read but did not use, the steps it used). Restored on ``W`` workers of ``R`` replicas:

* **The same number of workers**: worker ``w`` continues from worker ``w``'s position. Its
  steps are cut for the new number of replicas from the same data: a global batch is split
  ``W * R`` ways, rows are re-cut by the new sizes, whole elements regrouped ``R`` per step.
  Two cases cannot be re-cut exactly and raise: an element split over every replica of
  every worker that was saved part-way through (an input of unknown batch size read by
  every worker), and one pipeline per replica (``InputReplicationMode.PER_REPLICA``) when the
  number of replicas changes.
* **Another number of workers**: only an input that does not depend on the number of
  workers restores: one every worker runs whole (sharding by data, or no sharding, or a
  ``dataset_fn`` that does not shard by its input pipeline), where every saved worker stood
  at the same place in the same data (the same pipeline, seeds, steps used and data read
  ahead) — then every new worker continues from the chief's position. Inputs sharded by file or
  by ``shard(SHARD_HINT, ...)`` read another split on another number of workers, and
  positions that differ between workers (an unseeded shuffle draws a different order on
  each) name no one place to continue from: both raise.

Every refusal is a ``FailedPreconditionError`` naming the saved and the new counts, the
sharding, and what to do; nothing is restored then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import nest
from towerdist._src.data.structure import unstack_count
from towerdist._src.data.transforms import RowCutter
from towerdist._src.errors import DataLossError, FailedPreconditionError
from towerdist._src.failures import unworded

if TYPE_CHECKING:
    from towerdist._src.input.distributed_dataset import _DistributedInput

__all__ = ["choose_position", "recut", "same_data"]

_SHARDING_WORDS = {
    "data": "sharded by data (every worker runs the whole pipeline)",
    "own": "sharded by file or by shard(SHARD_HINT, ...) (every worker reads its own part)",
    "all": "not sharded (AutoShardPolicy.OFF: every worker reads everything)",
    "function": "made by distribute_datasets_from_function (a pipeline per worker)",
}


def choose_position(saved: list[dict[str, Any]], source: _DistributedInput) -> dict[str, Any]:
    """The saved position this worker's iterator over ``source`` continues from.

    Raises:
      FailedPreconditionError: the saved position cannot continue exactly on this world.
      DataLossError: the saved state is inconsistent.
    """
    if not saved:
        raise unworded(DataLossError("the saved distributed iterator holds no worker's position."))
    world = saved[0]["world"]
    saved_workers, saved_local = world["num_workers"], world["num_local"]
    if len(saved) != saved_workers:
        raise unworded(
            DataLossError(
                f"the saved distributed iterator holds {len(saved)} workers' positions, but was saved on "
                f"{saved_workers} workers."
            )
        )
    worker = source._worker
    workers, local = worker.num_workers, worker.num_local
    sharding = world["sharding"]
    counts = (
        f"it was saved on {_count(saved_workers, 'worker')} of {_count(saved_local, 'replica')} and is restored on "
        f"{_count(workers, 'worker')} of {_count(local, 'replica')}"
    )
    new_sharding = source._sharding()
    if new_sharding != sharding:
        raise unworded(
            FailedPreconditionError(
                f"cannot restore the distributed iterator: its input was {_SHARDING_WORDS[sharding]} when saved, "
                f"but is {_SHARDING_WORDS[new_sharding]} now. Restore it into the same kind of distributed input "
                f"with the same AutoShardPolicy."
            )
        )
    if workers == saved_workers:
        position = saved[worker.worker_index]
    elif sharding == "own":
        raise unworded(
            FailedPreconditionError(
                f"cannot restore the distributed iterator exactly: its input is {_SHARDING_WORDS[sharding]}. "
                f"{counts}, where the workers would read other parts of the data, so examples would be repeated or "
                f"skipped. Restore it on {_count(saved_workers, 'worker')}, or shard by data "
                f"(AutoShardPolicy.DATA) to be able to change the number of workers."
            )
        )
    else:
        different = [k for k in range(1, len(saved)) if not same_data(saved[0], saved[k])]
        if different:
            hint = (
                "its dataset_fn makes a different pipeline on each worker (e.g. it shards by "
                "input_context.input_pipeline_id)"
                if sharding == "function"
                else "the workers' pipelines do not produce the same data (e.g. an unseeded shuffle draws a different "
                "order on each worker: give shuffle a seed)"
            )
            raise unworded(
                FailedPreconditionError(
                    f"cannot restore the distributed iterator exactly: {counts}, and worker "
                    f"{different[0]}'s saved position differs from worker 0's: {hint}. There is no one position to "
                    f"continue every new worker from; restore it on {_count(saved_workers, 'worker')}."
                )
            )
        position = saved[0]
    kind = position["kind"]
    if kind == "split_all" and local != saved_local and any(start for _, start in position["leftover"]):
        raise unworded(
            FailedPreconditionError(
                f"cannot restore the distributed iterator exactly: {counts}, and it was saved part-way through a "
                f"batch split over every replica (its input's batch size is not known statically, so each batch is "
                f"split as a whole). Restore it on {_count(saved_local, 'replica')} per worker, or give the dataset "
                f"a known batch size (batch(..., drop_remainder=True))."
            )
        )
    if kind == "per_replica" and (local, workers) != (saved_local, saved_workers):
        raise unworded(
            FailedPreconditionError(
                f"cannot restore the distributed iterator exactly: {counts}, and its input has one pipeline per "
                f"replica (InputReplicationMode.PER_REPLICA), each made by dataset_fn for its replica: another "
                f"number of replicas makes other pipelines. Restore it on the same number of replicas."
            )
        )
    return position


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def recut(leftover: list[Any], size: int, saved_local: int, local: int) -> list[Any]:
    """Elements read ahead by a run of ``saved_local`` replicas, their rows cut again into elements of ``size``.

    A ``dataset_fn`` batches by the per-replica batch size, which changes with the number of
    replicas: the saved elements' rows are cut into batches of the new size (what the
    rebuilt pipeline yields), so that every step covers the same rows as before.

    Raises:
      FailedPreconditionError: the rows read ahead do not make whole batches of ``size``.
    """
    rows = sum(unstack_count(nest.flatten(element)[0], "restore") for element in leftover)
    if rows % size:
        raise unworded(
            FailedPreconditionError(
                f"cannot restore the distributed iterator exactly: it was saved on {_count(saved_local, 'replica')} "
                f"per worker with {rows} rows read ahead of the steps used, and is restored on {local}, whose "
                f"elements are batches of {size} rows: {rows} rows do not make whole batches of {size}. Restore it "
                f"on {_count(saved_local, 'replica')} per worker."
            )
        )
    return list(RowCutter([size]).pieces(iter(leftover)))


def same_data(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True if two workers saved the same place in the same data: the same pipelines and seeds, the same
    steps used, and the same data read but not used.

    Their pipelines' own positions are not compared: background threads (``prefetch``, a parallel
    ``map``) read ahead by as much as timing let them, so two workers at one place in one stream
    hold it in different ways.
    """
    if any(not _same(a.get(key), b.get(key)) for key in ("kind", "steps", "started", "ended", "leftover", "state")):
        return False
    pipelines_a, pipelines_b = a["pipelines"], b["pipelines"]
    return len(pipelines_a) == len(pipelines_b) and all(
        _same(p["pipeline"], q["pipeline"]) and _same(p["random"], q["random"])
        for p, q in zip(pipelines_a, pipelines_b, strict=True)
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.random.Generator) or isinstance(b, np.random.Generator):
        return (
            isinstance(a, np.random.Generator)
            and isinstance(b, np.random.Generator)
            and _same(a.bit_generator.state, b.bit_generator.state)
        )
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        return (
            isinstance(a, (np.ndarray, np.generic))
            and isinstance(b, (np.ndarray, np.generic))
            and a.dtype == b.dtype
            and np.shape(a) == np.shape(b)
            and bool(np.array_equal(a, b))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
