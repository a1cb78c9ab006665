"""Splitting a dataset between workers by file or by data (``AutoShardPolicy``).

With ``W`` workers, worker ``w``:

* **FILE**: reads files ``w, w + W, ...`` of every file reader: a ``TextLineDataset``, or
  an ``interleave``/``flat_map`` whose ``map_func`` makes datasets that read files (such as
  ``list_files(...).interleave(TextLineDataset)``), whose input of file names is sharded, as
  TensorFlow does. The names are sharded at their source, below any ``shuffle``
  (``list_files`` shuffles by default), so the workers' files are disjoint and cover every
  file. With one worker there is nothing to shard.
* **DATA**: runs the whole pipeline and keeps its replicas' pieces of every global batch.
* **AUTO**: FILE when every source of the pipeline is read through a file reader, with at
  least ``W`` files; otherwise DATA.
* **HINT**: ``shard(SHARD_HINT, SHARD_HINT)`` becomes ``shard(W, w)``; nothing else changes.
* **OFF**: every worker reads everything.

What the policy resolves to also decides how a worker's stream is cut into its replicas'
pieces (``ShardMode``). TensorFlow re-batches every worker's stream by its rotation of the
per-replica sizes, and its auto-shard rewrite swaps that for the per-batch split only when
it shards by data; so FILE (also with one worker, and also when AUTO finds files), HINT and
OFF keep the cycling rule, and DATA (explicit, or AUTO without enough files) splits each
global batch.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from towerdist._src.data.dataset import Dataset
from towerdist._src.data.options import AutoShardPolicy
from towerdist._src.data.transforms import ShardDataset
from towerdist._src.errors import InvalidArgumentError, NotFoundError

__all__ = ["ShardMode", "auto_shard", "read_from_files"]


class ShardMode(enum.Enum):
    """What a worker's dataset holds after auto-sharding, and so how it is cut into pieces."""

    # The whole pipeline, sharded by data: every global batch is split across all replicas
    # of all workers, and this worker keeps its replicas' pieces.
    DATA = "data"
    # This worker's own stream (its files, its hinted shard, or everything under OFF): re-cut
    # by the worker's rotation of the per-replica sizes, across batch boundaries.
    OWN = "own"


def _rewrite(node: Dataset, change: Callable[[Dataset, tuple[Dataset, ...]], Dataset | None]) -> Dataset:
    inputs = tuple(_rewrite(i, change) for i in node._inputs)
    replaced = change(node, inputs)
    if replaced is not None:
        return replaced
    if all(a is b for a, b in zip(inputs, node._inputs, strict=True)):
        return node
    return node._clone(inputs)


def _readers(dataset: Dataset) -> list[Dataset]:
    """The file readers of the pipeline (``Dataset._reads_files``), the first found on each path from the output."""
    if dataset._reads_files():
        return [dataset]
    return [reader for node in dataset._inputs for reader in _readers(node)]


def read_from_files(dataset: Dataset) -> bool:
    """True if every source of the pipeline is under a file reader (what FILE sharding needs).

    TensorFlow finds a source that reads no files (a ``range`` zipped with the lines, say)
    unshardable by file: AUTO then shards by data, and FILE raises.
    """
    if dataset._reads_files():
        return True
    return bool(dataset._inputs) and all(read_from_files(node) for node in dataset._inputs)


def _shard_at_sources(names: Dataset, num_workers: int, worker_index: int) -> Dataset:
    """``names`` with every source under it sharded: each worker keeps its own file names.

    The shard goes below any ``shuffle`` of the names (``list_files`` shuffles by default,
    with a different seed in every process), so the workers' shares are disjoint and cover
    every file whatever the order above them.
    """
    if not names._inputs:
        return names.shard(num_workers, worker_index)
    return names._clone(tuple(_shard_at_sources(node, num_workers, worker_index) for node in names._inputs))


def _shard_files(dataset: Dataset, num_workers: int, worker_index: int) -> Dataset:
    if dataset._reads_files():
        names = _shard_at_sources(dataset._inputs[0], num_workers, worker_index)
        return dataset._clone((names, *dataset._inputs[1:]))
    inputs = tuple(_shard_files(node, num_workers, worker_index) for node in dataset._inputs)
    if all(a is b for a, b in zip(inputs, dataset._inputs, strict=True)):
        return dataset
    return dataset._clone(inputs)


def _fill_hints(dataset: Dataset, num_workers: int, worker_index: int) -> Dataset:
    def change(node: Dataset, inputs: tuple[Dataset, ...]) -> Dataset | None:
        if isinstance(node, ShardDataset) and node._is_hint:
            return ShardDataset(inputs[0], num_workers, worker_index)
        return None

    return _rewrite(dataset, change)


def auto_shard(
    dataset: Dataset, num_workers: int, worker_index: int, policy: AutoShardPolicy
) -> tuple[Dataset, ShardMode]:
    """Worker ``worker_index``'s version of ``dataset`` and what it holds.

    Raises:
      NotFoundError: FILE policy on several workers, but some source of the pipeline is not read
        through a file reader.
      InvalidArgumentError: FILE policy with fewer files than workers.
    """
    if policy == AutoShardPolicy.HINT:
        return _fill_hints(dataset, num_workers, worker_index), ShardMode.OWN
    if policy == AutoShardPolicy.OFF:
        return dataset, ShardMode.OWN  # every worker's own stream is all of it
    if policy == AutoShardPolicy.DATA:
        return dataset, ShardMode.DATA
    if num_workers == 1:
        # Nothing to shard, but TensorFlow still resolves the policy: FILE keeps the cycling
        # rule even without a file reader, AUTO does when the pipeline reads files.
        if policy == AutoShardPolicy.FILE or read_from_files(dataset):
            return dataset, ShardMode.OWN
        return dataset, ShardMode.DATA
    by_file = read_from_files(dataset)
    file_counts = [reader._inputs[0]._cardinality() for reader in _readers(dataset)] if by_file else []
    if policy == AutoShardPolicy.FILE:
        if not by_file:
            raise NotFoundError(
                "Found an unshardable source dataset: AutoShardPolicy.FILE needs every source of the pipeline to be "
                "read through a file reader such as td.data.TextLineDataset (directly, or made by the map_func of "
                "interleave or flat_map). Use AutoShardPolicy.DATA (or AUTO) for other sources."
            )
        for count in file_counts:
            if 0 <= count < num_workers:
                raise InvalidArgumentError(
                    f"There are {count} files to shard over {num_workers} workers, so some workers would get no "
                    f"files. Use AutoShardPolicy.DATA, or provide at least one file per worker."
                )
        return _shard_files(dataset, num_workers, worker_index), ShardMode.OWN
    if by_file and all(c >= num_workers for c in file_counts):  # AUTO with enough files
        return _shard_files(dataset, num_workers, worker_index), ShardMode.OWN
    return dataset, ShardMode.DATA  # AUTO without (enough) files
