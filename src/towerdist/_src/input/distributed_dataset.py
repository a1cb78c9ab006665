"""``DistributedDataset``: datasets whose elements are per-replica values.

A distributed dataset turns its input into *steps*: one piece per local replica, each
placed on its replica's device. ``experimental_distribute_dataset`` makes the pieces by
splitting each global batch (see ``split``); ``distribute_datasets_from_function`` gives
each replica whole elements of the dataset(s) the user's function built. When the data
ends in the middle of a step, the replicas without data get empty *dummy* pieces (the
partial-batch handling of TensorFlow); a step where no replica has data ends iteration.
How a worker's steps are made is its *feed* (``feeds``); the iterator is ``distributed_iterator``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from towerdist._src import nest
from towerdist._src.data import options as options_lib
from towerdist._src.data.cursor import Cursor
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.options import AutoShardPolicy
from towerdist._src.data.spec import is_fully_defined
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import FailedPreconditionError
from towerdist._src.failures import unworded, worded_at
from towerdist._src.input.auto_shard import ShardMode, auto_shard, read_from_files
from towerdist._src.input.distributed_iterator import DistributedIterator
from towerdist._src.input.feeds import BatchFeed, ElementFeed, Feed, PerReplicaFeed, RowFeed, SplitAllFeed
from towerdist._src.input.foreign import IterableDataset, as_dataset
from towerdist._src.input.input_context import InputContext, InputOptions
from towerdist._src.input.resume import count, recut_problem
from towerdist._src.input.split import _needs_batch, batch_sizes_for_worker, compute_batch_size, replica_spec
from towerdist._src.type_aliases import Nest
from towerdist._src.values.per_replica_spec import PerReplicaSpec

if TYPE_CHECKING:  # named in annotations only
    from towerdist._src.strategies.strategy import Strategy

__all__ = ["DistributedDataset", "DistributedDatasetsFromFunction", "InputWorker"]


@dataclass(frozen=True)
class InputWorker:
    """What a strategy tells its distributed datasets about this process.

    Attributes:
      devices: this worker's replica devices, in local replica order.
      num_workers: how many workers (processes) feed replicas.
      worker_index: this worker's index in ``[0, num_workers)``.
      workers_with_data: with several workers, agrees across them which have data for a
        step: this worker's flag in, every worker's flag out (supplied by the multi-worker
        strategy).
      share_states: with several workers, gathers every worker's saved iterator position:
        this worker's bytes in, every worker's out, in worker order (collective).
    """

    devices: tuple[DeviceSpec, ...]
    num_workers: int = 1
    worker_index: int = 0
    workers_with_data: Callable[[bool], list[bool]] | None = None
    share_states: Callable[[bytes], list[bytes]] | None = None

    @property
    def num_local(self) -> int:
        return len(self.devices)

    @property
    def num_replicas_in_sync(self) -> int:
        return self.num_workers * len(self.devices)


class _DistributedInput:
    """What both kinds of distributed dataset share: iteration, specs, partial steps."""

    def __init__(self, worker: InputWorker, strategy: Strategy, options: InputOptions | None) -> None:
        self._worker = worker
        self._strategy = strategy
        self._options = options or InputOptions()

    # --- the hooks of the two kinds --------------------------------------------------------

    def _pipelines(self) -> list[Dataset]:
        """This worker's input pipeline(s), each iterated in one pass of the distributed dataset."""
        raise NotImplementedError

    def _feed(self, cursors: list[Cursor], leftover: list[Any], resumed: dict[str, Any] | None) -> Feed:
        """The feed that makes this worker's steps from passes ``cursors`` over ``_pipelines()``.

        ``leftover`` (raw units, see ``feeds``) is used first; ``resumed`` is the saved feed's
        ``kind``, ``state``, ``world``, the number of steps the saved run used, and whether the
        pipelines were ``exhausted`` (with the ``error`` they raised, if any); None for a new pass.
        """
        raise NotImplementedError

    def _sharding(self) -> str:
        """How the workers' inputs relate: "data" (each runs the whole pipeline), "own" (each its own
        files or shard), "all" (each reads everything), "function" (each its dataset_fn's)."""
        raise NotImplementedError

    def _replica_spec(self, probe: bool) -> Nest:
        """The spec of one replica's piece, or None when unknown."""
        raise NotImplementedError

    def _source_fully_defined(self) -> bool:
        raise NotImplementedError

    @property
    def cardinality(self) -> int:
        """The number of elements of the input (global batches), or ``INFINITE``/``UNKNOWN``."""
        raise NotImplementedError

    # --- shared ----------------------------------------------------------------------------

    def _partial_enabled(self) -> bool:
        """Whether a step some replicas lack data for is padded (else iteration ends), as TF decides."""
        if self._worker.num_replicas_in_sync == 1 or self.cardinality == options_lib.INFINITE:
            return False
        return self._worker.num_workers > 1 or not self._source_fully_defined()

    @property
    def element_spec(self) -> Nest:
        """The structure of the elements with ``PerReplicaSpec`` (one spec per replica) as leaves.

        With one replica, the plain specs.
        """
        spec = self._replica_spec(probe=True)
        if self._worker.num_replicas_in_sync == 1:
            return spec
        copies = self._worker.num_local
        return nest.map_structure(lambda s: PerReplicaSpec(*([s] * copies)), spec)

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self)

    def reduce(self, initial_state: Nest, reduce_fn: Callable[[Nest, Nest], Nest]) -> Nest:
        """Folds the steps: ``state = reduce_fn(state, per_replica_element)`` from ``initial_state``.

        Example:
          >>> dist = strategy.experimental_distribute_dataset(td.data.Dataset.range(6).batch(2))
          >>> dist.reduce(0, lambda state, x: state + strategy.reduce("SUM", x, axis=0))
          np.int64(15)
        """
        iterator = DistributedIterator(self)
        state = initial_state
        while True:
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                return state
            state = reduce_fn(state, optional.get_value())


class DistributedDataset(_DistributedInput):
    """A dataset whose global batches are split across the replicas (``tf.distribute.DistributedDataset``).

    Made by ``strategy.experimental_distribute_dataset``. Iterate it (each ``iter`` is a new
    epoch) to get per-replica values to pass to ``strategy.run``::

        for batch in strategy.experimental_distribute_dataset(dataset):
            strategy.run(step_fn, args=(batch,))
    """

    def __init__(self, dataset: object, worker: InputWorker, strategy: Strategy, options: InputOptions | None) -> None:
        super().__init__(worker, strategy, options)
        self._source = as_dataset(dataset)  # its errors are worded by experimental_distribute_dataset()
        n = worker.num_replicas_in_sync
        self._sizes: list[int] | None = None
        self._mode = ShardMode.DATA
        self._sharded = self._source
        self._global_batch = compute_batch_size(self._source)
        if n == 1:
            return
        spec = self._source._spec(probe=False)
        if spec is not None and any(s.shape == () for s in nest.flatten(spec)[0]):
            raise _needs_batch(n)
        policy = self._source.options().experimental_distribute.auto_shard_policy
        self._sharded, self._mode = auto_shard(self._source, worker.num_workers, worker.worker_index, policy)
        if self._mode is ShardMode.OWN:
            # TensorFlow re-batches the worker's own stream by its rotation of the sizes when
            # it can see the batch size; otherwise each batch is split over every replica and
            # the worker feeds all the pieces, its replicas in turn.
            batch = self._global_batch
            if batch is not None and batch > 0:
                self._sizes = batch_sizes_for_worker(batch, worker.num_workers, worker.num_local, worker.worker_index)

    @property
    def cardinality(self) -> int:
        """The number of global batches of the input, or ``INFINITE``/``UNKNOWN``."""
        return self._source._cardinality()

    def _source_fully_defined(self) -> bool:
        if isinstance(self._source, IterableDataset):
            return False  # its batch dimension is never known in advance
        spec = self._sharded._spec(probe=True)
        return spec is not None and is_fully_defined(spec)

    def _replica_spec(self, probe: bool) -> Nest:
        spec = self._sharded._spec(probe)  # (the shards this worker reads: a SHARD_HINT is filled in)
        if spec is None or self._worker.num_replicas_in_sync == 1:
            return spec
        return replica_spec(spec, self._worker.num_replicas_in_sync, self._worker.num_workers > 1)

    def _pipelines(self) -> list[Dataset]:
        return [self._sharded]

    def _sharding(self) -> str:
        policy = self._source.options().experimental_distribute.auto_shard_policy
        if policy == AutoShardPolicy.OFF:
            return "all"
        if policy in (AutoShardPolicy.FILE, AutoShardPolicy.HINT):
            return "own"
        if policy == AutoShardPolicy.AUTO and (self._mode is ShardMode.OWN or read_from_files(self._source)):
            return "own"  # each worker reads its own files (with one worker: it would, with several)
        return "data"

    def _feed(self, cursors: list[Cursor], leftover: list[Any], resumed: dict[str, Any] | None) -> Feed:
        worker = self._worker
        n, local = worker.num_replicas_in_sync, worker.num_local
        pipelines = self._pipelines()
        ended = _ended(resumed)
        saved_kind = None if resumed is None else resumed["kind"]
        if self._sizes is not None or (n == 1 and saved_kind == RowFeed.kind and self._global_batch is not None):
            # The cycling rule; also on one replica when the saved run cut rows (the same rows, cut by the
            # global batch size, continue where it stood).
            sizes = self._sizes if self._sizes is not None else [self._global_batch or 0]
            state = resumed["state"] if resumed is not None and saved_kind == RowFeed.kind else {}
            steps = 0 if resumed is None else resumed["steps"]
            return RowFeed(
                pipelines,
                cursors,
                leftover,
                sizes,
                local,
                turn=local * (steps % worker.num_workers),
                template=state.get("template"),
                cut_all=state.get("cut_all", False),
                **ended,
            )
        if n == 1:
            return BatchFeed(pipelines, cursors, leftover, 1, 0, 1, **ended)
        if self._mode is ShardMode.OWN:
            return SplitAllFeed(pipelines, cursors, leftover, n, local, **ended)
        return BatchFeed(pipelines, cursors, leftover, n, worker.worker_index * local, local, **ended)


class DistributedDatasetsFromFunction(_DistributedInput):
    """The datasets a user function built, one per worker or per replica, fed to the replicas whole."""

    def __init__(
        self,
        dataset_fn: Callable[[InputContext], Any],
        worker: InputWorker,
        strategy: Strategy,
        options: InputOptions | None,
        per_replica: bool,
    ) -> None:
        super().__init__(worker, strategy, options)
        if not callable(dataset_fn):  # worded by distribute_datasets_from_function()
            raise unworded(TypeError(f"takes a function of an InputContext. Got dataset_fn={dataset_fn!r}."))
        n = worker.num_replicas_in_sync
        if per_replica:
            first = worker.worker_index * worker.num_local
            contexts = [InputContext(n, first + i, n) for i in range(worker.num_local)]
        else:
            contexts = [InputContext(worker.num_workers, worker.worker_index, n)]
        self._per_replica = per_replica
        with worded_at("the dataset_fn given to distribute_datasets_from_function()"):  # only it makes these
            self._datasets = [as_dataset(dataset_fn(ctx)) for ctx in contexts]

    @property
    def cardinality(self) -> int:
        """The number of elements of (the first) dataset built by the function."""
        return self._datasets[0]._cardinality()

    def _source_fully_defined(self) -> bool:
        if isinstance(self._datasets[0], IterableDataset):
            return False
        spec = self._datasets[0]._spec(probe=True)
        return spec is not None and is_fully_defined(spec)

    def _replica_spec(self, probe: bool) -> Nest:
        spec = self._datasets[0]._spec(probe)
        if spec is None or self._worker.num_workers == 1:
            return spec
        # TF's rule with several workers: a worker may run out first and get empty pieces
        # (partial steps), so the batch dimension is dynamic even after batch(drop_remainder=True).
        return replica_spec(spec, 1, multi_worker=True)

    def _pipelines(self) -> list[Dataset]:
        return list(self._datasets)

    def _sharding(self) -> str:
        return "function"

    def _feed(self, cursors: list[Cursor], leftover: list[Any], resumed: dict[str, Any] | None) -> Feed:
        ended = _ended(resumed)
        if self._per_replica:
            return PerReplicaFeed(self._datasets, cursors, leftover, **ended)
        rows, problem = recut_problem(self._datasets[0])
        hint = self._datasets[0]._batch_size()  # the size of the last batch(), also when rows cannot be cut again
        recut = None
        state = {} if resumed is None else resumed["state"]
        if "rows" in state and (
            state["rows"] != rows or state.get("batch_size") != hint or state.get("recut") is not None
        ):
            # The per-replica batch size changed with the number of replicas (or a restored pass was
            # cut again already): the rows of the rest of the pass are cut into the new size.
            if rows is None or state["rows"] is None:
                assert resumed is not None  # (state came from it)
                world = resumed["world"]
                saved = world["num_workers"] * world["num_local"]
                saved_size = state["rows"] or state.get("batch_size")
                raise unworded(
                    FailedPreconditionError(
                        f"cannot restore the distributed iterator exactly: it was saved on {count(saved, 'replica')}, "
                        f"whose dataset_fn made batches of {saved_size or 'an unknown number of'} rows, and is "
                        f"restored on {count(self._worker.num_replicas_in_sync, 'replica')}, whose dataset_fn makes "
                        f"batches of {rows or hint or 'an unknown number of'} rows: the rows read cannot be cut again "
                        f"into the new batches exactly: {problem or 'the size of the saved batches is unknown'}. "
                        f"Restore it on {count(saved, 'replica')}, or end the dataset_fn's pipeline with batch(), "
                        f"followed by map() or prefetch() only."
                    )
                )
            recut = rows
        return ElementFeed(
            self._datasets, cursors, leftover, self._worker.num_local, rows=rows, batch_size=hint, recut=recut, **ended
        )


def _ended(resumed: dict[str, Any] | None) -> dict[str, Any]:
    """The feed arguments saying whether the saved pipelines had ended (and with which error)."""
    if resumed is None:
        return {}
    return {"exhausted": resumed["exhausted"], "error": resumed["error"]}
