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

from towerdist._src.data import state_codec
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.iterator import register_state_converter
from towerdist._src.data.transforms import RowCutter
from towerdist._src.errors import DataLossError, FailedPreconditionError
from towerdist._src.failures import unworded
from towerdist._src.input.split import compute_batch_size
from towerdist._src.type_aliases import Nest

if TYPE_CHECKING:
    from towerdist._src.input.distributed_dataset import _DistributedInput

KIND = "distributed_iterator"  # what a distributed iterator's saved state says it is

__all__ = ["KIND", "choose_position", "count", "recut_problem", "same_data", "saved_positions", "to_dataset_iterator"]

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
        f"it was saved on {count(saved_workers, 'worker')} of {count(saved_local, 'replica')} and is restored on "
        f"{count(workers, 'worker')} of {count(local, 'replica')}"
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
                f"skipped. Restore it on {count(saved_workers, 'worker')}, or shard by data "
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
                    f"continue every new worker from; restore it on {count(saved_workers, 'worker')}."
                )
            )
        position = saved[0]
    kind = position["kind"]
    if kind == "split_all" and local != saved_local and any(start for _, start in position["leftover"]):
        raise unworded(
            FailedPreconditionError(
                f"cannot restore the distributed iterator exactly: {counts}, and it was saved part-way through a "
                f"batch split over every replica (its input's batch size is not known statically, so each batch is "
                f"split as a whole). Restore it on {count(saved_local, 'replica')} per worker, or give the dataset "
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


def saved_positions(tree: Nest, source: _DistributedInput) -> list[dict[str, Any]]:
    """Every saved worker's position in a saved iterator state (a distributed iterator's, or a
    ``DatasetIterator``'s: the default strategy's input, one stream of global batches).

    Raises:
      FailedPreconditionError: the state is another object's.
    """
    kind = tree.get("kind") if isinstance(tree, dict) else None
    if kind == "dataset_iterator":
        return [_from_dataset_iterator(tree["position"], source._sharding())]
    if kind != KIND:
        raise unworded(
            FailedPreconditionError(
                f"cannot restore a distributed iterator from the saved state of a {kind or 'different object'}: "
                f"restore each iterator from the key it was saved under."
            )
        )
    return [state_codec.decode(bytes(blob)) for blob in tree["workers"]]


def _from_dataset_iterator(position: dict[str, Any], sharding: str) -> dict[str, Any]:
    """A ``DatasetIterator``'s position as one worker's distributed position: a stream of elements (global
    batches, or a dataset_fn's per-replica batches, whose size it says)."""
    ended = bool(position.get("ended"))
    pending = list(position.get("pending", []))
    return {
        "kind": "batches",
        "world": {"num_workers": 1, "num_local": 1, "worker_index": 0, "sharding": sharding},
        "pipelines": [
            {"pipeline": position["pipeline"], "random": position["random"], "cursor": position.get("cursor")}
        ],
        "leftover": pending,
        "state": {"rows": position.get("rows"), "batch_size": position.get("batch_size"), "recut": None},
        "steps": 0,
        "started": True,
        "exhausted": ended,
        "ended": ended and not pending and position.get("error") is None,
        "error": position.get("error"),
    }


def to_dataset_iterator(tree: dict[str, Any], dataset: Dataset) -> dict[str, Any]:
    """A distributed iterator's saved state as a ``DatasetIterator`` position of ``dataset``, where its
    steps were whole elements of that one pipeline.

    Raises:
      FailedPreconditionError: the steps were not (one pipeline per replica, or an element split
        part-way, or workers at different places in their data).
    """
    saved = [state_codec.decode(bytes(blob)) for blob in tree["workers"]]
    first = saved[0]
    problem = None
    if first["world"]["sharding"] == "own" and len(saved) > 1:
        problem = "its input was split between the workers by file or shard"
    elif any(not same_data(first, other) for other in saved[1:]):
        problem = "its workers were at different places in their data"
    elif first["kind"] not in (None, "batches", "elements", "rows") or len(first["pipelines"]) != 1:
        problem = "its steps were not whole elements of one pipeline"
    if problem is not None:
        raise unworded(
            FailedPreconditionError(
                f"cannot restore a td.data iterator from the saved state of a distributed iterator: {problem}. "
                f"Restore it into an iterator of the same distributed dataset."
            )
        )
    state = first["state"]
    rows, _ = dataset._batch_rows()
    if first["kind"] == "elements" and (
        state.get("rows") != rows or state.get("batch_size") != dataset._batch_size() or state.get("recut")
    ):
        raise unworded(
            FailedPreconditionError(
                f"cannot restore a td.data iterator from the saved state of a distributed iterator: the saved "
                f"dataset_fn's batches have {state.get('rows') or state.get('batch_size') or 'an unknown number of'} "
                f"rows, this dataset's {rows or dataset._batch_size() or 'an unknown number'}, and a td.data iterator "
                f"does not cut batches again. Restore it into an iterator of the same distributed dataset, or build "
                f"this dataset with the saved per-replica batch size."
            )
        )
    leftover = list(first["leftover"])
    size = compute_batch_size(dataset)
    if first["kind"] == "rows" and size is not None:  # rows cut for several replicas: whole global batches again
        leftover = list(RowCutter([size]).pieces(iter(leftover)))
    pipeline = first["pipelines"][0]
    exhausted = bool(first.get("exhausted"))
    return {
        "pipeline": pipeline["pipeline"],
        "random": pipeline["random"],
        "pending": leftover,
        "ended": exhausted or bool(first["ended"]),
        "cursor": pipeline["cursor"],
        "error": first.get("error") if exhausted else None,
    }


register_state_converter(KIND, to_dataset_iterator)


def recut_problem(dataset: Dataset) -> tuple[int | None, str | None]:
    """The number of rows of ``dataset``'s elements, and what keeps its rows from being cut again exactly.

    A pipeline whose elements are batches of a per-replica size can continue on another
    per-replica size by cutting the rows of the rest of its pass again (what
    ``distribute_datasets_from_function`` does restored onto another number of replicas),
    if nothing after its last ``batch`` regroups, reorders, drops or counts the batches
    (``map``, ``prefetch`` and ``with_options`` may follow it; the ``map`` must act row by row)
    and the batch does not drop a remainder of a finite input. Returns ``(rows, None)`` when
    that holds, else ``(None, why)`` (see ``Node._batch_rows``).
    """
    return dataset._batch_rows()


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural where it needs to be."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def same_data(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True if two workers saved the same place in the same data: the same pipelines and seeds, the same
    steps used, and the same data read but not used.

    Their pipelines' own positions are not compared (nor the epoch numbers their random operations
    drew): background threads (``prefetch``, a parallel ``map``) read ahead by as much as timing let
    them, so two workers at one place in one stream hold it in different ways.
    """
    keys = ("kind", "steps", "started", "exhausted", "ended", "leftover", "state")
    if any(not _same(a.get(key), b.get(key)) for key in keys):
        return False
    pipelines_a, pipelines_b = a["pipelines"], b["pipelines"]
    return len(pipelines_a) == len(pipelines_b) and all(
        _same(p["pipeline"], q["pipeline"]) and _same(_seeds(p["random"]), _seeds(q["random"]))
        for p, q in zip(pipelines_a, pipelines_b, strict=True)
    )


def _seeds(random_states: list[Any]) -> list[Any]:
    """The seeds of a pipeline's random operations (their next epoch numbers, like the pipeline's position,
    depend on how far a background thread read ahead)."""
    return [None if state is None else state.get("seed") for state in random_states]


def _same(a: Nest, b: Nest) -> bool:
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
