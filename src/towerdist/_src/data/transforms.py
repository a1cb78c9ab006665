"""Transformations that batch, select, reorder or repeat elements without user code.

(``map`` and ``filter`` run user code and live in ``mapping``; ``prefetch`` runs a thread
and lives in ``prefetch``.)
"""

from __future__ import annotations

import itertools
import os
import pickle
import threading
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np

from towerdist._src import backend, nest
from towerdist._src.atomic_file import AtomicFile
from towerdist._src.data import options as options_lib
from towerdist._src.data.continuing import Raise, continuing
from towerdist._src.data.cursor import Saved, State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.node import GatherPlan
from towerdist._src.data.saved_errors import raise_saved_error, restore_error, save_error
from towerdist._src.data.seeds import Seeded
from towerdist._src.data.spec import ElementSpec, TensorSpec, spec_with_batch
from towerdist._src.data.structure import read_only_element, stack, unstack_count
from towerdist._src.errors import DataLossError, InvalidArgumentError, NotFoundError, PermissionDeniedError
from towerdist._src.failures import unworded
from towerdist._src.type_aliases import Nest

__all__ = [
    "batched_cardinality",
    "BatchDataset",
    "CacheDataset",
    "EnumerateDataset",
    "OptionsDataset",
    "RebatchDataset",
    "RepeatDataset",
    "ShardDataset",
    "ShuffleDataset",
    "SkipDataset",
    "TakeDataset",
    "UnbatchDataset",
    "RowCutter",
]

INFINITE, UNKNOWN = options_lib.INFINITE, options_lib.UNKNOWN


def read_chunk(source: Iterator[Any], size: int) -> tuple[list[Any], Exception | None]:
    """Up to ``size`` elements of ``source``, and the error that stopped it early (None if none).

    The elements read before an input error are returned with it, so that the batch they make
    is delivered before the error: an operation never loses an element it read.
    """
    chunk: list[Any] = []
    try:
        chunk.extend(itertools.islice(source, size))  # (list.extend keeps what it read before an error)
    except Exception as error:
        return chunk, error
    return chunk, None


def batched_cardinality(n: int, size: int, drop_remainder: bool) -> int:
    """How many batches of ``size`` a dataset of ``n`` elements gives (INFINITE/UNKNOWN stay)."""
    if n < 0:
        return n
    return n // size if drop_remainder else -(-n // size)


def _int_arg(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
            return int(value)
        raise unworded(TypeError(f"takes an integer {name}. Got {name}={value!r}."))
    return int(value)


class _Transparent(Dataset):
    """A node that only selects, reorders or repeats elements: it can run on indices."""

    def _batch_size(self) -> int | None:
        return self._inputs[0]._batch_size()

    def _gather_plan(self) -> GatherPlan | None:
        inner = self._inputs[0]._gather_plan()
        return None if inner is None else GatherPlan(self._clone((inner.indices,)), inner.gather)


# --- batching --------------------------------------------------------------------------------


def stack_elements(elements: Sequence[Nest], what: str = "batch") -> Nest:
    """Stacks elements of one structure component-wise."""
    first = elements[0]
    if not isinstance(first, (tuple, dict)):
        return stack(elements, 0, what)
    columns = None
    treespec = None
    for element in elements:
        leaves, spec = nest.flatten(element)
        if columns is None:
            columns, treespec = [[leaf] for leaf in leaves], spec
            continue
        if spec != treespec:
            raise InvalidArgumentError(f"Cannot {what} elements of different structures: {treespec} and {spec}.")
        for column, leaf in zip(columns, leaves, strict=True):
            column.append(leaf)
    assert columns is not None and treespec is not None
    return treespec.unflatten([stack(column, k, what) for k, column in enumerate(columns)])


class BatchDataset(Dataset):
    def __init__(self, input_dataset: Dataset, batch_size: int, drop_remainder: bool) -> None:
        self._inputs = (input_dataset,)
        self._size = _int_arg(batch_size, "batch_size")
        if self._size <= 0:
            raise InvalidArgumentError(f"Batch size must be greater than zero. Got batch_size={self._size}.")
        self._drop = bool(drop_remainder)

    def _plan(self, state: State) -> GatherPlan | None:
        """The input's gather plan, made once per pass (a restored pass makes it for its saved input)."""
        if not hasattr(state, "_plan"):
            state._plan = self._inputs[0]._gather_plan()
        plan: GatherPlan | None = state._plan
        return plan

    def _restored_input(self, key: str, state: State) -> Dataset:
        plan = self._plan(state)
        return plan.indices if plan is not None else self._inputs[0]

    def _iterate(self, state: State) -> Iterator[Any]:
        plan = self._plan(state)
        source = state.open(plan.indices if plan is not None else self._inputs[0], "0")
        size, drop = self._size, self._drop
        try:
            raise_saved_error(state)
            while True:
                chunk, failure = read_chunk(source, size)
                if failure is not None:
                    # The elements read before the error come first, as a short batch (TensorFlow
                    # drops them), unless drop_remainder asks for full batches only.
                    if chunk and not drop:
                        state.error = save_error(failure)
                        yield plan.gather(np.array(chunk, dtype=np.intp)) if plan is not None else stack_elements(chunk)
                    raise failure
                if not chunk or (drop and len(chunk) < size):
                    return
                if plan is not None:
                    yield plan.gather(np.array(chunk, dtype=np.intp))
                else:
                    yield stack_elements(chunk)
        finally:
            source.close()

    def _spec(self, probe: bool) -> ElementSpec:
        spec = self._inputs[0]._spec(probe)
        return None if spec is None else spec_with_batch(spec, self._size if self._drop else None)

    def _cardinality(self) -> int:
        return batched_cardinality(self._inputs[0]._cardinality(), self._size, self._drop)

    def _batch_size(self) -> int | None:
        return self._size

    def _batch_rows(self) -> tuple[int | None, str | None]:
        if self._drop and self._inputs[0]._cardinality() != INFINITE:
            # the rows it drops at the end depend on the batch size
            return None, "its last batch() drops a remainder of a finite input, which depends on the batch size"
        return self._size, None


class UnbatchDataset(Dataset):
    def __init__(self, input_dataset: Dataset) -> None:
        self._inputs = (input_dataset,)
        spec = input_dataset._spec(probe=False)
        if spec is not None:
            leaves, _ = nest.flatten(spec)
            if any(s.shape is not None and len(s.shape) == 0 for s in leaves):
                raise ValueError("Cannot unbatch an input with scalar components.")

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the input element being cut (``element``) and its next row (``row``).
        if not state.resumed:
            state.element, state.row = None, 0
        source = state.input()
        pull = iter(source)
        try:
            while True:
                if state.element is None:
                    try:
                        state.element = next(pull)
                    except StopIteration:
                        return
                    state.row = 0
                element = state.element
                if not isinstance(element, (tuple, dict)):
                    n = unstack_count([element], "unbatch")
                    while state.row < n:
                        state.row += 1
                        yield element[state.row - 1]
                else:
                    leaves, treespec = nest.flatten(element)
                    n = unstack_count(leaves, "unbatch")
                    while state.row < n:
                        i = state.row
                        state.row = i + 1
                        yield treespec.unflatten([leaf[i] for leaf in leaves])
                state.element = None
        finally:
            source.close()

    def _spec(self, probe: bool) -> ElementSpec:
        spec = self._inputs[0]._spec(probe)
        if spec is None:
            return None
        return nest.map_structure(lambda s: TensorSpec(None if s.shape is None else s.shape[1:], s.dtype), spec)

    def _cardinality(self) -> int:
        # TensorFlow's rule: n times the first static leading dimension among the components (in
        # flattening order); UNKNOWN where no component has one, or where it is 0. The spec is the
        # one known without running the pipeline (cardinality() never reads an element), so after
        # a map, whose shapes only a call of its function tells, this stays UNKNOWN.
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n
        spec = self._inputs[0]._spec(probe=False)
        for leaf in [] if spec is None else nest.flatten(spec)[0]:
            if leaf.shape is not None and len(leaf.shape) > 0 and leaf.shape[0] is not None:
                return n * int(leaf.shape[0]) if leaf.shape[0] > 0 else UNKNOWN
        return UNKNOWN


class RowCutter:
    """Re-cuts the rows of a stream of elements into pieces of ``sizes[0], sizes[1], ...`` (cycled).

    Pieces may span element boundaries (unbatch-then-batch semantics); a piece that fits
    in one element is a view of it. A size of 0 gives an empty piece that keeps the other
    dimensions. At the end, a short last piece is yielded unless ``drop_remainder``.

    Its position is plain data, saved with the cursor that owns it: ``pending``, the
    elements whose rows are not all cut yet (each with its first unread row), ``template``,
    an element of the stream (its structure, for empty pieces), ``turn``, the index of the
    next size, ``exhausted``, and ``error``: the input's error (see :mod:`saved_errors`), raised
    after the pieces of the rows read before it (at the end, as a short piece).
    """

    def __init__(self, sizes: Sequence[int], drop_remainder: bool = False) -> None:
        self.sizes = list(sizes)
        self.drop_remainder = drop_remainder
        self.pending: list[list[Any]] = []  # [element, first unread row]
        self.template: Any = None
        self.turn = 0
        self.exhausted = False
        self.error: dict[str, Any] | None = None

    def position(self) -> dict[str, Any]:
        return {
            "pending": [list(entry) for entry in self.pending],
            "template": self.template,
            "turn": self.turn,
            "exhausted": self.exhausted,
            "error": self.error,
        }

    def resume(self, position: dict[str, Any]) -> None:
        self.pending = [list(entry) for entry in position["pending"]]
        self.template = position["template"]
        self.turn = position["turn"]
        self.exhausted = position["exhausted"]
        self.error = position.get("error")

    def pieces(self, source: Iterator[Any]) -> Iterator[Any]:
        """The pieces of ``source``'s rows (after the rows already pending)."""
        sizes = self.sizes
        template_leaves, treespec = (None, None) if self.template is None else nest.flatten(self.template)
        pending = [(nest.flatten(element)[0], start, _rows_of(element)) for element, start in self.pending]
        available = sum(rows - start for _, start, rows in pending)
        failure: Exception | None = None  # the input's error, raised after the pieces of the rows before it
        while True:
            size = sizes[self.turn]
            # A positive size needs rows; a zero size only needs to know the structure, so that
            # the empty pieces of a cycle are produced even after the last row (no row is lost).
            while (available < size or self.template is None) and not self.exhausted:
                try:
                    element = next(source)
                except StopIteration:
                    self.exhausted = True
                    break
                except Exception as error:
                    self.exhausted, self.error, failure = True, save_error(error), error
                    break
                leaves, spec = nest.flatten(element)
                if treespec is None:
                    treespec = spec
                elif spec != treespec:
                    raise InvalidArgumentError(
                        f"Cannot rebatch elements of different structures: {treespec} and {spec}."
                    )
                rows = unstack_count(leaves, "rebatch")
                self.template, template_leaves = element, leaves
                if rows:
                    pending.append((leaves, 0, rows))
                    self.pending.append([element, 0])
                    available += rows
            if self.template is None or (size > 0 and available == 0) or (available < size and self.drop_remainder):
                if self.error is not None:
                    saved, self.error = self.error, None
                    raise failure if failure is not None else restore_error(saved)
                return
            assert treespec is not None and template_leaves is not None
            take = min(size, available)
            piece = treespec.unflatten(_take_rows(pending, take, template_leaves))
            available -= take
            del self.pending[: len(self.pending) - len(pending)]
            if pending:
                self.pending[0][1] = pending[0][1]
            self.turn = (self.turn + 1) % len(sizes)
            yield piece


def _rows_of(element: Nest) -> int:
    return unstack_count(nest.flatten(element)[0], "rebatch")


def _take_rows(pending: list[tuple[list[Any], int, int]], count: int, template: list[Any]) -> list[Any]:
    if count == 0:
        return [leaf[:0] for leaf in template]
    parts: list[list[Any]] = []
    while count:
        leaves, start, rows = pending[0]
        take = min(count, rows - start)
        parts.append([leaf[start : start + take] for leaf in leaves])
        count -= take
        if start + take == rows:
            pending.pop(0)
        else:
            pending[0] = (leaves, start + take, rows)
    if len(parts) == 1:
        return parts[0]
    return [backend.for_array(column[0]).concat(list(column), 0) for column in zip(*parts, strict=True)]


class RebatchDataset(Dataset):
    def __init__(self, input_dataset: Dataset, batch_size: int | Sequence[int], drop_remainder: bool) -> None:
        self._inputs = (input_dataset,)
        raw = list(batch_size) if isinstance(batch_size, (list, tuple, np.ndarray)) else [batch_size]
        self._sizes = [_int_arg(s, "batch_size") for s in raw]
        if not self._sizes or any(s < 0 for s in self._sizes) or not any(self._sizes):
            raise InvalidArgumentError(
                f"rebatch() needs non-negative batch sizes, at least one of them positive. Got {batch_size!r}."
            )
        self._drop = bool(drop_remainder)

    def _iterate(self, state: State) -> Iterator[Any]:
        state._cutter = cutter = RowCutter(self._sizes, self._drop)
        if state.resumed:
            cutter.resume(state.cutter)
        return self._pieces(state, cutter)

    def _pieces(self, state: State, cutter: RowCutter) -> Iterator[Any]:
        source = state.input()
        try:
            yield from cutter.pieces(iter(source))
        finally:
            source.close()

    def _save_state(self, state: State) -> Saved:
        state.cutter = state._cutter.position()
        return super()._save_state(state)

    def _spec(self, probe: bool) -> ElementSpec:
        spec = self._inputs[0]._spec(probe)
        if spec is None:
            return None
        static = self._static_batch(spec)
        return nest.map_structure(
            lambda s: TensorSpec(None if s.shape is None else (static, *s.shape[1:]), s.dtype), spec
        )

    def _static_batch(self, input_spec: ElementSpec) -> int | None:
        """The output's static batch size (TensorFlow's rule), or None where batches may differ.

        One size repeated, and no partial batch possible: with ``drop_remainder``, or where every
        input component's static batch size is a multiple of it
        (``batch(4, drop_remainder=True).rebatch([2, 2])`` has batches of 2).
        """
        if len(set(self._sizes)) != 1:
            return None
        size = self._sizes[0]
        if self._drop:
            return size
        leaves, _ = nest.flatten(input_spec)
        for leaf in leaves:
            if leaf.shape is None or not leaf.shape or leaf.shape[0] is None or leaf.shape[0] % size:
                return None
        return size

    def _cardinality(self) -> int:
        return UNKNOWN  # as in TensorFlow, even for an infinite or a finite input

    def _batch_size(self) -> int | None:
        return self._sizes[0] if len(set(self._sizes)) == 1 else None


# --- selecting and reordering ------------------------------------------------------------------


class ShuffleDataset(Seeded, _Transparent):
    def __init__(
        self, input_dataset: Dataset, buffer_size: int, seed: int | None, reshuffle_each_iteration: bool
    ) -> None:
        self._inputs = (input_dataset,)
        self._buffer_size = _int_arg(buffer_size, "buffer_size")
        # TensorFlow accepts UNKNOWN_CARDINALITY (-2) too: the buffer then holds every element.
        if self._buffer_size <= 0 and self._buffer_size != UNKNOWN:
            raise InvalidArgumentError(
                f"Dataset.shuffle() buffer_size must be greater than zero or td.data.UNKNOWN_CARDINALITY (-2, "
                f"a buffer of every element). Got buffer_size={self._buffer_size}; for a uniform shuffle of the "
                f"whole dataset pass buffer_size=dataset.cardinality()."
            )
        self._init_seed(None if seed is None else _int_arg(seed, "seed") & (2**64 - 1))
        self._reshuffle = bool(reshuffle_each_iteration)

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the random generator, the buffer, the unused uniforms drawn for picks,
        # and whether the input has ended (the buffer is draining). The epoch is drawn now, as
        # the pass is created (see cursor).
        if not state.resumed:
            state.epoch = self._seeds.next_epoch() if self._reshuffle else 0
            state.rng = np.random.default_rng([self._seed, state.epoch])
            state.buffer, state.uniforms, state.draining = [], [], False
        # Only a pass the iterator reads itself goes on after an error (and pays the wrapper's
        # check per element); read by another operation, the buffer drains before the error.
        return continuing(self._shuffled(state), state) if state._may_continue else self._shuffled(state)

    def _shuffled(self, state: State) -> Generator[Any, None, None]:
        # As TensorFlow: before each element the buffer is filled up to ``buffer_size`` (so the
        # input is read no further than TensorFlow reads it), then a random one is taken out. An
        # input error stops the filling: the error comes first, then the buffer drains, as in
        # TensorFlow, where the iterator reads this pass itself; read by another operation, the
        # buffer drains first (see continuing).
        rng, buffer, uniforms = state.rng, state.buffer, state.uniforms
        capacity = self._buffer_size if self._buffer_size > 0 else None
        failure: Exception | None = None
        source = state.input()
        try:
            if not state.draining:
                try:
                    # The elements that only fill the buffer are read in one call (an input error
                    # keeps those read before it, as the loop would).
                    if capacity is None:
                        buffer.extend(source)
                    elif len(buffer) + 1 < capacity:
                        buffer.extend(itertools.islice(source, capacity - 1 - len(buffer)))
                    for element in source:
                        # The buffer holds ``buffer_size - 1`` elements between two outputs: the
                        # element read makes it full, and one of the ``buffer_size`` is taken out.
                        n = len(buffer)
                        if capacity is None or n + 1 < capacity:
                            buffer.append(element)
                            continue
                        if not uniforms:
                            uniforms.extend(rng.random(1024).tolist())
                        j = int(uniforms.pop() * (n + 1))
                        if j == n:
                            yield element
                        else:
                            chosen, buffer[j] = buffer[j], element
                            yield chosen
                except Exception as error:  # (from the input: nothing else here raises one)
                    failure = error
                    if not state._may_continue:  # raised after the buffer (saved: a restored pass raises it too)
                        state.error = save_error(error)
                state.draining = True
                if failure is not None and state._may_continue:
                    yield Raise(failure)
            n = len(buffer)
            while n:
                if not uniforms:
                    uniforms.extend(rng.random(1024).tolist())
                j = int(uniforms.pop() * n)
                n -= 1
                buffer[j], buffer[n] = buffer[n], buffer[j]
                yield buffer.pop()
            saved = getattr(state, "error", None)
            if saved is not None:
                state.error = None
                raise failure if failure is not None else restore_error(saved)
        finally:
            source.close()


class RepeatDataset(_Transparent):
    def __init__(self, input_dataset: Dataset, count: int | None) -> None:
        self._inputs = (input_dataset,)
        self._count = -1 if count is None else _int_arg(count, "count")
        if self._count < -1:
            raise InvalidArgumentError(f"repeat() count must be >= 0, or -1/None for forever. Got count={count}.")

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the passes completed, whether the current one produced anything, and
        # the current pass over the input (the child).
        if not state.resumed:
            state.passes, state.produced = 0, False
        while self._count == -1 or state.passes < self._count:
            source = state.input()
            try:
                for element in source:
                    state.produced = True
                    yield element
            finally:
                source.close()
            if not state.produced:
                return  # repeating an empty dataset forever yields nothing, as in TensorFlow
            state.passes, state.produced = state.passes + 1, False

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if self._count == 0 or n == 0:
            return 0
        if self._count == -1:
            return INFINITE
        return n * self._count if n >= 0 else n


class TakeDataset(_Transparent):
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        self._inputs = (input_dataset,)
        self._count = _int_arg(count, "count")
        if self._count < -1:
            raise InvalidArgumentError(f"take() count must be >= 0, or -1 for all. Got count={count}.")

    def _iterate(self, state: State) -> Iterator[Any]:
        if not state.resumed:
            state.taken = 0
        source = state.input()
        try:
            if self._count == -1:
                yield from source
                return
            if state.taken >= self._count:
                return
            for element in source:
                state.taken += 1
                yield element
                if state.taken >= self._count:
                    return
        finally:
            source.close()

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if self._count == -1:
            return n
        if n == INFINITE:
            return self._count
        return min(n, self._count) if n >= 0 else n


class SkipDataset(_Transparent):
    def __init__(self, input_dataset: Dataset, count: int) -> None:
        self._inputs = (input_dataset,)
        self._count = _int_arg(count, "count")
        if self._count < -1:
            raise InvalidArgumentError(f"skip() count must be >= 0, or -1 for all. Got count={count}.")

    def _iterate(self, state: State) -> Iterator[Any]:
        if not state.resumed:
            state.skipped = False
        source = state.input()
        try:
            if self._count == -1:
                for _ in source:
                    pass
                return
            yield from itertools.islice(source, 0 if state.skipped else self._count, None)
        finally:
            source.close()

    def _save_state(self, state: State) -> Saved:
        state.skipped = True  # between elements, the skipping is done
        return super()._save_state(state)

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0:
            return n  # skipping from an infinite (or unknown) dataset leaves it so
        return 0 if self._count == -1 else max(n - self._count, 0)


class ShardDataset(_Transparent):
    def __init__(self, input_dataset: Dataset, num_shards: int, index: int) -> None:
        self._inputs = (input_dataset,)
        self._num_shards = _int_arg(num_shards, "num_shards")
        self._index = _int_arg(index, "index")
        self._is_hint = self._num_shards == options_lib.SHARD_HINT
        if self._is_hint:
            return
        if self._num_shards <= 0:
            raise InvalidArgumentError(
                f"Number of shards must be greater than zero (currently num_shards = {self._num_shards})."
            )
        if not 0 <= self._index < self._num_shards:
            raise InvalidArgumentError(
                f"Index must be between 0 and {self._num_shards - 1} (currently index = {self._index})."
            )

    def _iterate(self, state: State) -> Iterator[Any]:
        if self._is_hint:
            raise InvalidArgumentError(
                "shard(SHARD_HINT, SHARD_HINT) is a placeholder that AutoShardPolicy.HINT fills in when a "
                "multi-worker strategy distributes the dataset; iterate it through the strategy or give "
                "shard() real numbers."
            )
        if not state.resumed:
            state.started = False
        source = state.input()
        try:
            # Before the first element the shard skips ``index`` elements; after any other, the
            # ``num_shards - 1`` elements of the other shards.
            first = self._num_shards - 1 if state.started else self._index
            for element in itertools.islice(source, first, None, self._num_shards):
                state.started = True
                yield element
        finally:
            source.close()

    def _state_params(self) -> dict[str, Any]:
        return {"num_shards": self._num_shards, "index": self._index}

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        if n < 0 or self._is_hint:
            return n
        return n // self._num_shards + (1 if self._index < n % self._num_shards else 0)


class OptionsDataset(_Transparent):
    def __init__(self, input_dataset: Dataset, options: options_lib.Options) -> None:
        if not isinstance(options, options_lib.Options):
            raise TypeError(f"with_options() takes a td.data.Options. Got options={options!r}.")
        self._inputs = (input_dataset,)
        self._own_options = options._copy()  # later changes to ``options`` do not reach the dataset, as in TF

    def _iterate(self, state: State) -> Iterator[Any]:
        return iter(state.input())

    def _batch_rows(self) -> tuple[int | None, str | None]:
        return self._inputs[0]._batch_rows()


_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


class EnumerateDataset(Dataset):
    def __init__(self, input_dataset: Dataset, start: int) -> None:
        self._inputs = (input_dataset,)
        self._start = _int_arg(start, "start")
        if not _INT64_MIN <= self._start <= _INT64_MAX:
            raise InvalidArgumentError(
                f"Dataset.enumerate() counts in int64, so start must lie in [-2**63, 2**63 - 1]. "
                f"Got start={self._start}."
            )

    def _iterate(self, state: State) -> Iterator[Any]:
        if not state.resumed:
            state.count = self._start
        source = state.input()
        try:
            # TensorFlow zips the input with range(start, int64 max): the count is pulled first,
            # and the dataset ends where the count would leave int64.
            for i, element in zip(range(state.count, _INT64_MAX), source):
                state.count = i + 1
                yield np.int64(i), element
        finally:
            source.close()

    def _cardinality(self) -> int:
        n = self._inputs[0]._cardinality()
        return min(n, _INT64_MAX - self._start) if n >= 0 else n

    def _spec(self, probe: bool) -> ElementSpec:
        spec = self._inputs[0]._spec(probe)
        return None if spec is None else (TensorSpec((), np.int64), spec)


# --- caching -----------------------------------------------------------------------------------


class CacheDataset(Dataset):
    def __init__(self, input_dataset: Dataset, filename: str) -> None:
        self._inputs = (input_dataset,)
        self._filename = os.fspath(filename)
        self._memory: list[Any] | None = None
        self._lock = threading.Lock()

    def _clone(self, inputs: tuple[Dataset, ...]) -> Dataset:
        clone = super()._clone(inputs)
        assert isinstance(clone, CacheDataset)
        clone._memory, clone._lock = None, threading.Lock()
        return clone

    def _load(self) -> list[Any] | None:
        with self._lock:
            if self._memory is not None or not self._filename:
                return self._memory
            if os.path.exists(self._filename):
                self._memory = [read_only_element(element) for element in _read_cache_file(self._filename)]
            return self._memory

    def _reserve(self) -> AtomicFile[bytes]:
        """A temporary file beside the cache file, made when a pass starts (TensorFlow makes its lockfile then).

        A directory that is missing or not writable thus fails at the first element, not after
        a whole pass.
        """
        directory = os.path.dirname(os.path.abspath(self._filename))
        try:
            # Not ".tmp-": a checkpoint saved in this directory sweeps those once an hour old, and
            # this file is written only when the pass ends (an epoch may take longer).
            return AtomicFile(self._filename, prefix=".td-cache-")
        except FileNotFoundError:
            raise NotFoundError(
                f"Dataset.cache() cannot write its file {self._filename!r}: the directory {directory!r} does not "
                f"exist. Create it first, or pass another filename ('' caches in memory).",
                path=self._filename,
            ) from None
        except PermissionError as error:
            raise PermissionDeniedError(
                f"Dataset.cache() cannot write its file {self._filename!r} in {directory!r}: {error.strerror}.",
                path=self._filename,
            ) from None
        except OSError as error:  # e.g. a path component that is a file
            raise NotFoundError(
                f"Dataset.cache() cannot write its file {self._filename!r}: {error.strerror} ({directory!r}).",
                path=self._filename,
            ) from None

    def _store(self, elements: list[Any], reserved: AtomicFile[bytes] | None) -> None:
        """Keeps the elements of a complete pass and writes them to the file (taking over ``reserved``)."""
        with self._lock:
            first = self._memory is None
            if first:
                self._memory = elements
            if reserved is None:
                return
            if not first:  # another pass completed first and wrote the file
                reserved.discard()
                return
            with reserved as f:
                pickle.dump(elements, f, protocol=pickle.HIGHEST_PROTOCOL)

    def _iterate(self, state: State) -> Iterator[Any]:
        # A restored reading pass finds its cache now, as it is restored: a cache file that is
        # gone fails the restore (leaving the iterator as it was), not a later element.
        if state.resumed and not state.filling:
            cached = self._load()
            return self._pass(state, self._adopt(state.elements) if cached is None else cached)
        return self._pass(state, None)

    def _pass(self, state: State, cached: list[Any] | None) -> Iterator[Any]:
        # The position: whether this pass fills the cache (then ``collected``, the elements
        # read so far, and the input's pass) or reads a complete one (then ``position``).
        if not state.resumed:
            cached = self._load()
            state.filling, state.position = cached is None, 0
            state.collected = [] if cached is None else None
        if not state.filling:
            assert cached is not None
            while state.position < len(cached):
                state.position += 1
                yield cached[state.position - 1]
            return
        reserved = self._reserve() if self._filename else None
        collected = state.collected
        source = state.input()
        try:
            for element in source:
                # Every pass, this first one included, hands out the cached arrays themselves:
                # read-only, so that a step writing into them cannot change later epochs.
                element = read_only_element(element)
                collected.append(element)
                yield element
            source.close()
            handed, reserved = reserved, None
            self._store(list(collected), handed)  # reached only after a complete pass
        finally:
            source.close()
            if reserved is not None:  # an abandoned or failed pass
                reserved.discard()

    def _save_state(self, state: State) -> Saved:
        # A pass reading an in-memory cache saves the cache too: restored in another process,
        # it is not in memory there. (A file cache is read from its file again.)
        state.elements = None if state.filling or self._filename else self._memory
        return super()._save_state(state)

    def _symbolic_checkpoint(self) -> bool:
        return False  # TensorFlow: "CacheDatasetV2 does not support symbolic checkpointing."

    def _adopt(self, elements: list[Any] | None) -> list[Any]:
        """The cache a restored reading pass reads: this process's, else the saved elements (kept as the cache)."""
        if self._filename:
            raise unworded(
                NotFoundError(
                    f"cannot restore the iterator: it was reading the cache file {self._filename!r} of "
                    f"Dataset.cache(), which no longer exists. Restore it where that file is.",
                    path=self._filename,
                )
            )
        assert elements is not None
        with self._lock:
            if self._memory is None:
                self._memory = elements
            return self._memory

    def _batch_size(self) -> int | None:
        return self._inputs[0]._batch_size()


def _read_cache_file(filename: str) -> list[Any]:
    """The elements a complete pass of ``cache(filename)`` wrote; ``DataLossError`` if the file is not one."""
    with open(filename, "rb") as f:
        try:
            elements = pickle.load(f)
        except Exception as error:  # unpickling a damaged file raises almost anything
            raise DataLossError(
                f"Dataset.cache() cannot read its file {filename!r}: it is truncated or corrupt ({type(error).__name__}: "
                f"{error}). Delete it to cache the dataset again.",
                path=filename,
            ) from None
    if not isinstance(elements, list):
        raise DataLossError(
            f"Dataset.cache() cannot read its file {filename!r}: it holds a {type(elements).__name__}, not the "
            f"elements of a cached pass. Delete it to cache the dataset again.",
            path=filename,
        )
    return elements
