"""``DistributedDataset`` and ``DistributedIterator``: datasets whose elements are per-replica values.

A distributed dataset turns its input into *steps*: one piece per local replica, each
placed on its replica's device. ``experimental_distribute_dataset`` makes the pieces by
splitting each global batch (see ``split``); ``distribute_datasets_from_function`` gives
each replica whole elements of the dataset(s) the user's function built. When the data
ends in the middle of a step, the replicas without data get empty *dummy* pieces (the
partial-batch handling of TensorFlow); a step where no replica has data ends iteration.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from towerdist._src import backend, context, nest
from towerdist._src import profiler as _profiler
from towerdist._src.data import options as options_lib
from towerdist._src.data.optional import Optional
from towerdist._src.data.spec import is_fully_defined, structure_of
from towerdist._src.data.structure import close_iterator, to_element
from towerdist._src.data.transforms import RowCutter
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import OutOfRangeError
from towerdist._src.failures import unworded, worded_at
from towerdist._src.input.auto_shard import ShardMode, auto_shard
from towerdist._src.input.device_copies import DeviceCopier, Placed
from towerdist._src.input.foreign import IterableDataset, as_dataset
from towerdist._src.input.input_context import InputContext, InputOptions
from towerdist._src.input.split import (
    _needs_batch,
    batch_sizes_for_worker,
    compute_batch_size,
    dummy_like,
    legacy_split,
    replica_spec,
)
from towerdist._src.values.per_replica_spec import PerReplicaSpec
from towerdist._src.values.regroup import regroup

__all__ = [
    "DistributedDataset",
    "DistributedDatasetsFromFunction",
    "DistributedIterator",
    "InputWorker",
    "place_on_device",
]

_MISSING: Any = object()  # a replica without data in this step


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
    """

    devices: tuple[DeviceSpec, ...]
    num_workers: int = 1
    worker_index: int = 0
    workers_with_data: Callable[[bool], list[bool]] | None = None

    @property
    def num_local(self) -> int:
        return len(self.devices)

    @property
    def num_replicas_in_sync(self) -> int:
        return self.num_workers * len(self.devices)


class _DistributedInput:
    """What both kinds of distributed dataset share: iteration, specs, partial steps."""

    def __init__(self, worker: InputWorker, strategy: Any, options: InputOptions | None) -> None:
        self._worker = worker
        self._strategy = strategy
        self._options = options or InputOptions()

    # --- the hooks of the two kinds --------------------------------------------------------

    def _steps(self) -> Iterator[list[Any]]:
        """One list of ``num_local`` pieces (or ``_MISSING``) per step, for one pass."""
        raise NotImplementedError

    def _replica_spec(self, probe: bool) -> Any:
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
    def element_spec(self) -> Any:
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

    def reduce(self, initial_state: Any, reduce_fn: Callable[[Any, Any], Any]) -> Any:
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

    def __init__(self, dataset: Any, worker: InputWorker, strategy: Any, options: InputOptions | None) -> None:
        super().__init__(worker, strategy, options)
        self._source = as_dataset(dataset)  # its errors are worded by experimental_distribute_dataset()
        n = worker.num_replicas_in_sync
        self._sizes: list[int] | None = None
        self._mode = ShardMode.DATA
        self._sharded = self._source
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
            batch = compute_batch_size(self._source)
            if batch is not None and batch > 0:
                self._sizes = batch_sizes_for_worker(batch, worker.num_workers, worker.num_local, worker.worker_index)

    @property
    def cardinality(self) -> int:
        """The number of global batches of the input, or ``INFINITE``/``UNKNOWN``."""
        return self._source._cardinality()

    def _source_fully_defined(self) -> bool:
        if isinstance(self._source, IterableDataset):
            return False  # its batch dimension is never known in advance
        spec = self._source._spec(probe=True)
        return spec is not None and is_fully_defined(spec)

    def _replica_spec(self, probe: bool) -> Any:
        spec = self._source._spec(probe)
        if spec is None or self._worker.num_replicas_in_sync == 1:
            return spec
        return replica_spec(spec, self._worker.num_replicas_in_sync, self._worker.num_workers > 1)

    def _steps(self) -> Iterator[list[Any]]:
        worker = self._worker
        n, local = worker.num_replicas_in_sync, worker.num_local
        source = self._sharded._cursor()
        try:
            if n == 1:
                for element in source:
                    yield [element]
            elif self._sizes is not None:
                yield from _group(RowCutter(self._sizes).pieces(iter(source)), local)
            elif self._mode is ShardMode.OWN:
                for element in source:
                    pieces = legacy_split(element, n)
                    for start in range(0, n, local):
                        yield pieces[start : start + local]
            else:
                first = worker.worker_index * local
                for element in source:
                    yield legacy_split(element, n)[first : first + local]
        finally:
            close_iterator(source)


class DistributedDatasetsFromFunction(_DistributedInput):
    """The datasets a user function built, one per worker or per replica, fed to the replicas whole."""

    def __init__(
        self,
        dataset_fn: Callable[[InputContext], Any],
        worker: InputWorker,
        strategy: Any,
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

    def _replica_spec(self, probe: bool) -> Any:
        return self._datasets[0]._spec(probe)

    def _steps(self) -> Iterator[list[Any]]:
        sources = [dataset._cursor() for dataset in self._datasets]
        try:
            if not self._per_replica:
                yield from _group(sources[0], self._worker.num_local)
                return
            while True:
                step = [next(source, _MISSING) for source in sources]
                if all(piece is _MISSING for piece in step):
                    return
                yield step
        finally:
            for source in sources:
                close_iterator(source)


def _group(pieces: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive groups of ``size``; the last is padded with ``_MISSING``."""
    step: list[Any] = []
    for piece in pieces:
        step.append(piece)
        if len(step) == size:
            yield step
            step = []
    if step:
        yield step + [_MISSING] * (size - len(step))


class DistributedIterator:
    """An iterator over a distributed dataset (``tf.distribute.DistributedIterator``).

    ``next()`` returns a per-replica value (a ``PerReplica`` per array, in the element's
    structure; with one replica, the plain element) and raises ``StopIteration`` at the
    end; ``get_next()`` raises ``td.errors.OutOfRangeError`` instead;
    ``get_next_as_optional()`` returns an empty ``Optional``. Call them outside
    ``strategy.run`` and pass the value in: ``strategy.run(fn, args=(next(iterator),))``.

    The iterator prepares steps ahead (``InputOptions.experimental_per_replica_buffer_size``),
    but an exception raised by the input pipeline comes out in order: every step before
    it is delivered first, then the exception, then the end of the data, as with the
    dataset's own iterator. Threads may share one iterator; each step goes to one of them.
    """

    def __init__(self, source: _DistributedInput) -> None:
        self._source = source
        self._steps: Iterator[list[Any]] | None = None
        self._ahead: collections.deque[Placed] = collections.deque()
        self._copier = DeviceCopier()
        options = source._options
        self._to_gpus = (options.experimental_fetch_to_device or options.experimental_place_dataset_on_device) and any(
            d.device_type == "GPU" for d in source._worker.devices
        )
        self._error: Exception | None = None  # raised by the pipeline while reading ahead
        self._lock = threading.Lock()
        self._template: list[Any] | None = None

    @property
    def element_spec(self) -> Any:
        """The element spec of the distributed dataset this iterator iterates."""
        return self._source.element_spec

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        try:
            return self.get_next()
        except OutOfRangeError:
            raise StopIteration from None

    def get_next(self) -> Any:
        """The next per-replica element.

        Raises:
          OutOfRangeError: the data has ended.
          ValueError: called inside a replica function.
        """
        context.require_outside_replica_fn(self._source._strategy, "DistributedIterator.get_next()")
        with self._lock:
            step = self._step()
            if step is None:
                raise OutOfRangeError("End of sequence")
            if _has_missing(step) and not self._source._partial_enabled():
                self._finish()  # TensorFlow ends iteration rather than pad a statically shaped step
                raise OutOfRangeError("End of sequence")
            return self._wrap(self._fill(step))

    def get_next_as_optional(self) -> Optional:
        """The next per-replica element as an ``Optional``, empty at the end.

        Replicas without data in the last step get empty pieces. As in TensorFlow, the
        Optional's ``element_spec`` describes the pieces it holds (a ``PerReplicaSpec`` per
        array, with each piece's exact shape; with one replica, plain specs), and an empty
        one's is the iterator's ``element_spec``.
        """
        context.require_outside_replica_fn(self._source._strategy, "DistributedIterator.get_next_as_optional()")
        with self._lock:
            if self._source.cardinality == 0 and self._source._worker.num_workers == 1:
                return Optional._deferred_empty(self._spec_when_empty)
            step = self._step()
            if step is None:
                return Optional._deferred_empty(self._spec_when_empty)
            pieces = self._fill(step)
            one_replica = self._source._worker.num_replicas_in_sync == 1
            return Optional._deferred(self._wrap(pieces), lambda: _spec_of_pieces(pieces, one_replica))

    # --- internals -------------------------------------------------------------------------

    def _restart(self) -> None:
        """Ends the current pass (stopping its read-ahead); the next call starts a new one."""
        with self._lock:
            self._finish()
            self._steps = None
            self._error = None
            self._template = None

    def _step(self) -> list[Any] | None:
        if _profiler.active:
            with _profiler.Span("input: next step"):
                return self._next_step()
        return self._next_step()

    def _next_step(self) -> list[Any] | None:
        if self._steps is None:
            self._steps = self._source._steps()
        # The step returned now plus ``experimental_per_replica_buffer_size`` steps ahead.
        ahead = self._source._options.experimental_per_replica_buffer_size + 1
        while len(self._ahead) < ahead and self._error is None:
            try:
                raw = next(self._steps, None)
                if raw is None:
                    break
                self._ahead.append(self._place(raw))
            except Exception as error:
                # Read ahead, the error belongs after the steps already read: it is raised
                # once they are delivered, where the dataset's own iterator raises it.
                self._error = error
        if not self._ahead and self._error is not None:
            pending, self._error = self._error, None
            self._finish()  # the pipeline's generators ended with the error, as a plain pass does
            raise pending
        step = self._ahead.popleft().hand_out() if self._ahead else None
        worker = self._source._worker
        has_data = step is not None
        if worker.workers_with_data is not None:
            flags = worker.workers_with_data(has_data)
            has_data = any(flags)
            if has_data and not all(flags):
                self._check_batched([w for w, flag in enumerate(flags) if not flag])
        if not has_data:
            self._finish()
            return None
        if step is None:
            step = [_MISSING] * worker.num_local  # other workers still have data
        return step

    def _check_batched(self, out_of_data: list[int]) -> None:
        """Raises (on every worker alike) if workers out of data would be fed made-up scalars."""
        spec = self._source._replica_spec(probe=True)
        if spec is None or not all(leaf.shape == () for leaf in nest.flatten(spec)[0]):
            return  # batched: the workers out of data get empty (0, ...) pieces
        self._finish()
        raise ValueError(
            f"The input of {'worker' if len(out_of_data) == 1 else 'workers'} {', '.join(map(str, out_of_data))} "
            f"ran out of elements while other workers still have some, and the elements are unbatched scalars: there is no empty piece to give the replicas of "
            f"a worker without data (a zero would look like real data). Call batch() on the dataset so that a "
            f"worker out of data gets empty (0, ...) batches, or give every worker the same number of elements."
        )

    def _finish(self) -> None:
        steps, self._steps = self._steps, iter(())
        self._ahead.clear()
        close_iterator(steps)

    def _place(self, step: list[Any]) -> Placed:
        if not self._to_gpus:
            return Placed(step, None)  # host memory serves every CPU replica
        return self._copier.place(step, self._source._worker.devices, place_on_device, _MISSING)

    def _spec_when_empty(self) -> Any:
        try:
            return self.element_spec
        except ValueError:
            return None  # a one-shot input, already used up, cannot be asked for its structure

    def _fill(self, step: list[Any]) -> list[Any]:
        """The step's pieces, with empty ones for the replicas without data."""
        present = next((piece for piece in step if piece is not _MISSING), None)
        if present is not None:
            self._template = step
        if _has_missing(step):
            example = present
            if example is None and self._template is not None:
                example = next((p for p in self._template if p is not _MISSING), None)
            # A worker with no data yet has no piece to copy shapes from: ask the spec.
            spec = self._source._replica_spec(probe=example is None)
            if spec is None and example is None:
                raise ValueError(
                    "This worker has no data for a step that other workers have data for, and the input's "
                    "element structure is unknown, so no empty pieces can be made. Use a td.data.Dataset (or a "
                    "tf.data.Dataset) so that its element_spec is known."
                )
            step = [
                place_on_device(dummy_like(spec, example), device) if piece is _MISSING else piece
                for piece, device in zip(step, self._source._worker.devices, strict=True)
            ]
        return step

    def _wrap(self, pieces: list[Any]) -> Any:
        """The per-replica value of a step's pieces (with one replica, the piece itself)."""
        worker = self._source._worker
        if worker.num_replicas_in_sync == 1:
            return pieces[0]
        return regroup(pieces, worker.devices, always_wrap=True, what="pieces")


def _spec_of_pieces(pieces: list[Any], one_replica: bool) -> Any:
    """The element's structure with a ``PerReplicaSpec`` of the pieces' exact specs per array (None if not arrays)."""
    try:
        specs = [structure_of(to_element(piece)) for piece in pieces]
    except (TypeError, ValueError):
        return None
    if one_replica:
        return specs[0]
    return nest.map_structure(lambda *replicas: PerReplicaSpec(*replicas), *specs)


def _has_missing(step: list[Any]) -> bool:
    return any(piece is _MISSING for piece in step)


def place_on_device(piece: Any, device: DeviceSpec) -> Any:
    """``piece`` (a nest of arrays) with its numeric arrays on ``device``; host memory serves every CPU."""
    if device.device_type != "GPU":
        return piece  # host memory serves every CPU device
    impl = backend.for_device(device)
    return nest.map_structure(lambda leaf: leaf if _stays_on_host(leaf) else impl.to_device(leaf, device), piece)


def _stays_on_host(leaf: Any) -> bool:
    """Strings, bytes, objects and datetimes stay in host memory (cupy holds numbers only), as in TensorFlow."""
    if isinstance(leaf, (bytes, str)):
        return True
    kind = getattr(getattr(leaf, "dtype", None), "kind", "f")
    return kind in "OSUVMm"
