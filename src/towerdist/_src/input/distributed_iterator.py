"""``DistributedIterator``: the steps of a distributed dataset, handed out one per ``next()``, and checkpointable.

A step is one piece per local replica (see :mod:`~towerdist._src.input.feeds`). The iterator
prepares steps ahead (``InputOptions.experimental_per_replica_buffer_size``), placing them
on their devices, and agrees with the other workers, step by step, whether any still has
data.

**Saving** (``td.train.Checkpoint(iterator=iterator)``). The position of a worker is its
pipelines' positions, its feed's leftovers, and the raw form of every step it read but did
not hand out: restored, the iterator makes those steps again first. A save made by a
``PreemptionCheckpointHandler`` keeps, as not used, the steps handed out since the last step
began (:mod:`~towerdist._src.steps`: TensorFlow's loop draws the batch of the step at which
the handler saves before the handler decides not to train it); the iterator keeps at most
:data:`HELD_STEPS` such steps. Other saves count every step handed out as used. Under
``MultiWorkerMirroredStrategy`` saving is collective: every worker's position is gathered
into the saved state (a worker that fails to give its position makes every worker raise).
A pipeline that had ended (or failed) when it was saved is saved as exhausted: a restored
iterator yields the steps read before the end, then ends (or raises the saved error).

**Restoring onto another number of replicas or workers** (:mod:`~towerdist._src.input.resume`
holds the rules): with the same workers, each restores its own position, and steps are cut
for the new number of replicas from the same data. With another number of workers, the
input must not depend on it: sharding by data (or no sharding), every worker at the same
place in the same data; then every worker restores the chief's position. Otherwise
restoring raises ``FailedPreconditionError`` naming the saved and the new counts.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src import context, nest, steps
from towerdist._src import profiler as _profiler
from towerdist._src.data import saved_errors, state_codec, workers
from towerdist._src.data.cursor import Cursor, check_pipeline, pipeline_signature, random_state, restore_random_state
from towerdist._src.data.iterator import (
    EXIT_LOCK_SECONDS,
    UNSAVABLE_HINT,
    close_at_exit,
    external_state_check,
    symbolic_checkpoint_check,
)
from towerdist._src.data.optional import Optional
from towerdist._src.data.spec import structure_of
from towerdist._src.data.structure import to_element
from towerdist._src.errors import AbortedError, OutOfRangeError
from towerdist._src.failures import unworded
from towerdist._src.input import resume
from towerdist._src.input.device_copies import DeviceCopier, Placed, place_on_device
from towerdist._src.input.feeds import MISSING, Feed, Step
from towerdist._src.input.resume import choose_position
from towerdist._src.input.split import dummy_like
from towerdist._src.type_aliases import Nest
from towerdist._src.values.per_replica_spec import PerReplicaSpec
from towerdist._src.values.regroup import regroup

if TYPE_CHECKING:
    from towerdist._src.input.distributed_dataset import InputWorker, _DistributedInput

__all__ = ["HELD_STEPS", "DistributedIterator"]

logger = logging.getLogger("towerdist")

HELD_STEPS = 4  # unused steps an iterator keeps for a checkpoint (see the module docstring)
_KIND = resume.KIND


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

    It can be saved in a ``td.train.Checkpoint`` (unlike TensorFlow's), and restored into an
    iterator of the same dataset distributed over the same or another number of replicas
    or workers; see the module docstring for what restores where.
    """

    def __init__(self, source: _DistributedInput) -> None:
        self._source = source
        self._feed: Feed | None = None  # made by the first step (or a restore)
        self._steps: Iterator[Step] | None = None
        self._ahead: collections.deque[tuple[Placed, Any]] = collections.deque()  # (placed step, raw form)
        self._held: collections.deque[Any] = collections.deque()  # raw forms of handed-out steps no run used
        self._held_at = -1  # steps.begun() when the held steps were handed out
        self._dropped = 0  # held steps let go (more than HELD_STEPS drawn without a run)
        self._handed = 0  # steps handed out, in all (with those the saved run handed out, once restored)
        self._ended = False
        self._copier = DeviceCopier()
        options = source._options
        self._to_gpus = (options.experimental_fetch_to_device or options.experimental_place_dataset_on_device) and any(
            d.device_type == "GPU" for d in source._worker.devices
        )
        self._error: Exception | None = None  # raised by the pipeline while reading ahead
        self._lock = threading.Lock()
        self._template: list[Any] | None = None
        close_at_exit(self)

    @property
    def element_spec(self) -> Nest:
        """The element spec of the distributed dataset this iterator iterates."""
        return self._source.element_spec

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Nest:
        try:
            return self.get_next()
        except OutOfRangeError:
            raise StopIteration from None

    def get_next(self) -> Nest:
        """The next per-replica element.

        Raises:
          OutOfRangeError: the data has ended.
          ValueError: called inside a replica function.
        """
        context.require_outside_replica_fn(self._source._strategy, "DistributedIterator.get_next()")
        with self._lock:
            step, raw = self._step()
            if step is None:
                raise OutOfRangeError("End of sequence")
            if _has_missing(step) and not self._source._partial_enabled():
                self._finish()  # TensorFlow ends iteration rather than pad a statically shaped step
                raise OutOfRangeError("End of sequence")
            value = self._wrap(self._fill(step))
            self._hold(raw)
            return value

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
            step, raw = self._step()
            if step is None:
                return Optional._deferred_empty(self._spec_when_empty)
            pieces = self._fill(step)
            self._hold(raw)
            one_replica = self._source._worker.num_replicas_in_sync == 1
            return Optional._deferred(self._wrap(pieces), lambda: _spec_of_pieces(pieces, one_replica))

    # --- internals -------------------------------------------------------------------------

    def _close_at_exit(self) -> None:
        """Ends the iteration, stopping its read-ahead and the pipelines' background threads (at exit)."""
        if self._lock.acquire(timeout=EXIT_LOCK_SECONDS):  # a thread may be inside next() for good at exit
            try:
                self._finish()
            finally:
                self._lock.release()

    def _restart(self) -> None:
        """Ends the current pass (stopping its read-ahead); the next call starts a new one."""
        with self._lock:
            self._finish()
            self._feed, self._steps = None, None
            self._error = None
            self._template = None
            self._held.clear()
            self._handed, self._dropped, self._ended = 0, 0, False

    def _step(self) -> tuple[list[Any] | None, Any]:
        if _profiler.active:
            with _profiler.Span("input: next step"):
                return self._next_step()
        return self._next_step()

    def _start(self) -> None:
        if self._steps is None:
            cursors = [dataset._cursor() for dataset in self._source._pipelines()]
            self._feed = self._source._feed(cursors, [], None)
            self._steps = self._feed.steps()

    def _next_step(self) -> tuple[list[Any] | None, Any]:
        """The next step's pieces (None at the end) and its raw form (None where this worker has no data)."""
        self._start()
        assert self._steps is not None
        # The step returned now plus ``experimental_per_replica_buffer_size`` steps ahead.
        ahead = self._source._options.experimental_per_replica_buffer_size + 1
        while len(self._ahead) < ahead and self._error is None and not self._ended:
            try:
                made = next(self._steps, None)
                if made is None:
                    break
                self._ahead.append((self._place(made.pieces), made.raw))
            except Exception as error:
                # Read ahead, the error belongs after the steps already read: it is raised
                # once they are delivered, where the dataset's own iterator raises it.
                self._error = error
        if not self._ahead and self._error is not None:
            pending, self._error = self._error, None
            self._finish()  # the pipeline's generators ended with the error, as a plain pass does
            raise pending
        raw = None
        if self._ahead:
            placed, raw = self._ahead.popleft()
            step: list[Any] | None = placed.hand_out()
        else:
            step = None
        worker = self._source._worker
        has_data = step is not None
        if worker.workers_with_data is not None:
            flags = worker.workers_with_data(has_data)
            has_data = any(flags)
            if has_data and not all(flags):
                self._check_batched([w for w, flag in enumerate(flags) if not flag])
        if not has_data:
            self._finish()
            return None, None
        if step is None:
            step = [MISSING] * worker.num_local  # other workers still have data
        return step, raw

    def _hold(self, raw: Nest) -> None:
        """Counts a step handed out, and keeps its raw form until a step begins (see the module docstring)."""
        self._handed += 1
        count = steps.begun()
        if count != self._held_at:
            self._held.clear()
            self._held_at, self._dropped = count, 0
        if raw is None:  # a step of empty pieces (other workers had data): nothing to give back
            return
        self._held.append(raw)
        if len(self._held) > HELD_STEPS:
            self._held.popleft()
            self._dropped += 1

    def _unused(self) -> list[Any]:
        """The raw forms of the handed-out steps a save keeps as not used (see the module docstring)."""
        if not steps.in_preemption_save() or steps.begun() != self._held_at:
            return []
        return list(self._held)

    def _check_batched(self, out_of_data: list[int]) -> None:
        """Raises (on every worker alike) if workers out of data would be fed made-up scalars."""
        spec = self._source._replica_spec(probe=True)
        if spec is None or not all(leaf.shape == () for leaf in nest.flatten(spec)[0]):
            return  # batched: the workers out of data get empty (0, ...) pieces
        self._finish()
        raise ValueError(
            f"The input of {'worker' if len(out_of_data) == 1 else 'workers'} {', '.join(map(str, out_of_data))} "
            f"ran out of elements while other workers still have some, and the elements are unbatched scalars: "
            f"there is no empty piece to give the replicas of a worker without data (a zero would look like real "
            f"data). Call batch() on the dataset so that a worker out of data gets empty (0, ...) batches, or give "
            f"every worker the same number of elements."
        )

    def _finish(self) -> None:
        feed, steps = self._feed, self._steps
        self._steps = iter(())
        self._ended = True
        self._ahead.clear()
        if steps is not None and hasattr(steps, "close"):
            steps.close()
        if feed is not None:
            feed.close()

    def _place(self, step: list[Any]) -> Placed:
        if not self._to_gpus:
            return Placed(step, None)  # host memory serves every CPU replica
        return self._copier.place(step, self._source._worker.devices, MISSING)

    def _spec_when_empty(self) -> Nest:
        try:
            return self.element_spec
        except ValueError:
            return None  # a one-shot input, already used up, cannot be asked for its structure

    def _fill(self, step: list[Any]) -> list[Any]:
        """The step's pieces, with empty ones for the replicas without data."""
        present = next((piece for piece in step if piece is not MISSING), None)
        if present is not None:
            self._template = step
        if _has_missing(step):
            example = present
            if example is None and self._template is not None:
                example = next((p for p in self._template if p is not MISSING), None)
            # A worker with no data yet has no piece to copy shapes from: ask the spec.
            spec = self._source._replica_spec(probe=example is None)
            if spec is None and example is None:
                raise ValueError(
                    "This worker has no data for a step that other workers have data for, and the input's "
                    "element structure is unknown, so no empty pieces can be made. Use a td.data.Dataset (or a "
                    "tf.data.Dataset) so that its element_spec is known."
                )
            step = [
                place_on_device(dummy_like(spec, example), device) if piece is MISSING else piece
                for piece, device in zip(step, self._source._worker.devices, strict=True)
            ]
        return step

    def _wrap(self, pieces: list[Nest]) -> Nest:
        """The per-replica value of a step's pieces (with one replica, the piece itself)."""
        worker = self._source._worker
        if worker.num_replicas_in_sync == 1:
            return pieces[0]
        return regroup(pieces, worker.devices, always_wrap=True, what="pieces")

    # --- checkpointing -----------------------------------------------------------------------

    @property
    def _checkpoint_collective(self) -> bool:
        """Saving needs every worker (each gives its position)."""
        return self._source._worker.num_workers > 1

    def _position(self) -> dict[str, Any]:
        """This worker's position (see the module docstring), taken between steps."""
        source = self._source
        worker = source._worker
        workers.hold(self._lock, "a next() of this iterator in another thread")  # bounded: never hangs
        try:
            return self._position_held(source, worker)
        finally:
            self._lock.release()

    def _position_held(self, source: _DistributedInput, worker: InputWorker) -> dict[str, Any]:
        """This worker's position, with the iterator's lock held."""
        held = self._unused()
        if self._dropped and held:
            logger.warning(
                "Saving a distributed iterator that handed out %d steps since the last step began; the %d oldest "
                "are counted as used (it keeps the newest %d for a checkpoint).",
                len(held) + self._dropped,
                self._dropped,
                HELD_STEPS,
            )
        feed = self._feed
        # The pipelines had ended or failed (exhausted), here or in the run this one was restored
        # from: only what was read before counts, then the end or the error not raised yet.
        exhausted = self._ended or self._error is not None or (feed is not None and feed.exhausted)
        error: BaseException | None = self._error
        if error is None and feed is not None and feed.exhausted and not self._ended:
            error = feed.error
        datasets = source._pipelines()
        pipelines = []
        for k, dataset in enumerate(datasets):
            cursor = None if feed is None or exhausted else feed.cursors[k]
            if cursor is not None:
                options = dataset.options()
                external_state_check(cursor, options)
                if options.experimental_symbolic_checkpoint:
                    symbolic_checkpoint_check(cursor)
            pipelines.append(
                {
                    "pipeline": pipeline_signature(dataset),
                    "random": random_state(dataset),
                    "cursor": None if cursor is None else cursor.save(),
                }
            )
        units: list[Any] = []
        if feed is not None:
            for raw in [*held, *(raw for _, raw in self._ahead)]:
                units.extend(feed.units_of(raw))
            if not self._ended:
                units.extend(feed.leftover())
            units = feed.merged(units)
        return {
            "kind": None if feed is None else feed.kind,
            "world": {
                "num_workers": worker.num_workers,
                "num_local": worker.num_local,
                "worker_index": worker.worker_index,
                "sharding": source._sharding(),
            },
            "pipelines": pipelines,
            "leftover": units,
            "state": {} if feed is None else feed.state(),
            "steps": self._handed - len(held),
            "started": feed is not None,
            "exhausted": exhausted,
            "ended": self._ended and not units,
            "error": None if error is None else saved_errors.save_error(error),
        }

    def _checkpoint_state(self) -> bytes:
        """Every worker's position as bytes, for ``td.train.Checkpoint`` (collective with several workers).

        Raises:
          TypeError: an operation holds a value no position can hold.
          AbortedError: another worker failed to give its position (it raises its own error).
        """
        failure: Exception | None = None
        try:
            mine = state_codec.encode(self._position())
        except TypeError as error:
            failure = unworded(TypeError(f"cannot save the distributed iterator's position: {error}. {UNSAVABLE_HINT}"))
        except Exception as error:  # given to the other workers, then re-raised here
            failure = error
        share = self._source._worker.share_states
        if share is None:
            if failure is not None:
                raise failure
            return state_codec.encode({"kind": _KIND, "workers": [np.frombuffer(mine, np.uint8)]})
        # Every worker joins the gather, also one that failed, so that none waits for it in vain.
        positions = share(_FAILED + repr(failure).encode() if failure is not None else mine)
        if failure is not None:
            raise failure
        failed = [k for k, position in enumerate(positions) if position.startswith(_FAILED)]
        if failed:
            raise unworded(
                AbortedError(
                    f"cannot save the distributed iterator: worker(s) {', '.join(map(str, failed))} failed to give "
                    f"their position (see their error: {positions[failed[0]][len(_FAILED):].decode(errors='replace')})."
                )
            )
        return state_codec.encode({"kind": _KIND, "workers": [np.frombuffer(p, np.uint8) for p in positions]})

    def _checkpoint_restorer(self, state: bytes) -> Callable[[], None]:
        """Prepares restoring ``state`` (from ``_checkpoint_state``, maybe on another world); the result commits it.

        Raises:
          FailedPreconditionError: the saved position cannot continue exactly here (see ``resume``).
          NotFoundError: the pipeline differs from the saved one.
        """
        position = choose_position(resume.saved_positions(state_codec.decode(state), self._source), self._source)
        datasets = self._source._pipelines()
        exhausted = bool(position.get("exhausted"))
        cursors: list[Cursor] = []
        try:
            for dataset, pipeline in zip(datasets, position["pipelines"], strict=True):
                check_pipeline(dataset, pipeline["pipeline"])
                cursors.append(dataset._cursor(None if exhausted else pipeline["cursor"]))
            error = position.get("error")
            resumed = {
                "kind": position["kind"],
                "state": position["state"],
                "steps": position["steps"],
                "world": position["world"],
                "exhausted": exhausted,
                "error": None if error is None else saved_errors.restore_error(error),
            }
            feed = self._source._feed(cursors, list(position["leftover"]), resumed)
        except BaseException:
            for cursor in cursors:
                cursor.close()
            raise

        def commit() -> None:
            for dataset, pipeline in zip(datasets, position["pipelines"], strict=True):
                restore_random_state(dataset, pipeline["random"])
            with self._lock:
                self._finish()
                self._ended = False
                self._feed = feed if position["started"] else None
                self._steps = feed.steps() if position["started"] else None
                if not position["started"]:
                    feed.close()
                self._error = None
                self._template = None
                self._held.clear()
                self._held_at, self._dropped = -1, 0
                self._handed = position["steps"]
                if position["ended"]:
                    self._finish()

        return commit


_FAILED = b"towerdist: no position: "  # what a worker that failed to give its position gives the others


def _spec_of_pieces(pieces: list[Nest], one_replica: bool) -> Nest:
    """The element's structure with a ``PerReplicaSpec`` of the pieces' exact specs per array (None if not arrays)."""
    try:
        specs = [structure_of(to_element(piece)) for piece in pieces]
    except (TypeError, ValueError):
        return None
    if one_replica:
        return specs[0]
    return nest.map_structure(lambda *replicas: PerReplicaSpec(*replicas), *specs)


def _has_missing(step: list[Any]) -> bool:
    return any(piece is MISSING for piece in step)
