"""MultiWorkerMirroredStrategy: input across workers, test bodies written once for any number of workers.

Every test here is marked ``multi_worker``: it runs in the default suite (one worker, with one and
with two local replicas) and again under ``mpiexec -n 2 python -m pytest -m multi_worker`` (two
workers). The expected pieces are computed from the worker's rank, the replica counts and
TensorFlow's rules (``reference/mpi.md``, "What TF 2.21's MultiWorkerMirroredStrategy
does, observed with two workers"); TF's observed results are the case ``workers == 2,
local == 1`` and are checked literally there.

* Auto-sharding: AUTO (= DATA on non-file data: each global batch is split across every
  replica of every worker, worker 0 first), DATA, OFF (every worker iterates everything,
  re-cut by TF's ``batch_sizes_for_worker`` rotation), FILE (round-robin by file index, each
  worker's lines re-cut by its rotation as under OFF).
* End of data: an epoch ends on every worker at the same step; a worker that ran out
  meanwhile gets empty ``(0, ...)`` pieces.
* ``distribute_datasets_from_function``: the ``InputContext`` of each worker (or replica).

Every test makes the same collective calls on every rank: each distributed step agrees
across the workers whether any of them still has data, so every rank iterates to the end.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.values.per_replica_spec import PerReplicaSpec

pytestmark = pytest.mark.multi_worker

Policy = td.data.experimental.AutoShardPolicy

# The text files of the FILE tests: file k holds LINES[k] lines (uneven, so that workers run
# out of files at different steps).
LINES = (3, 4, 5, 6)


# --- helpers ---------------------------------------------------------------------------------


def _layout(strategy: td.distribute.MultiWorkerMirroredStrategy) -> tuple[int, int, int, int]:
    """``(rank, workers, local replicas, num_replicas_in_sync)``."""
    extended = strategy.extended
    local = len(extended.worker_devices)
    return extended._worker_index, extended._num_workers, local, strategy.num_replicas_in_sync


def _with_policy(dataset: td.data.Dataset, policy: Any) -> td.data.Dataset:
    """``dataset`` with ``auto_shard_policy`` set (None: leave the default, AUTO)."""
    if policy is None:
        return dataset
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def _local(strategy: td.distribute.Strategy, value: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in strategy.experimental_local_results(value)]


def _steps(strategy: td.distribute.Strategy, dist: Any) -> list[list[np.ndarray]]:
    """This worker's pieces of every step, one list of local pieces per step."""
    return [_local(strategy, step) for step in dist]


def _lists(steps: list[list[np.ndarray]]) -> list[list[list[Any]]]:
    return [[piece.tolist() for piece in step] for step in steps]


def _legacy_pieces(batch: np.ndarray, n: int) -> list[np.ndarray]:
    """TF's split of one global batch of ``b`` rows: ``n`` consecutive pieces of ``ceil(b / n)`` rows."""
    b = len(batch)
    size = -(-b // n)
    return [batch[min(i * size, b):min((i + 1) * size, b)] for i in range(n)]


def _rotated_sizes(batch: int, workers: int, local: int, worker: int) -> list[int]:
    """TF's ``batch_sizes_for_worker``: ``n`` sizes, the first ``batch % n`` one row more, rotated per worker."""
    n = workers * local
    floor, extra = divmod(batch, n)
    worker_0 = [floor + 1] * extra + [floor] * (n - extra)
    shift = worker * local
    return worker_0[shift:] + worker_0[:shift]


def _cut_cycling(rows: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """``rows`` cut into pieces of ``sizes[0], sizes[1], ...`` (cycled); the last piece may be short.

    As TF's rebatch, a size of 0 gives an empty piece, also after the last row, until the
    cycle comes to a size that needs rows.
    """
    pieces: list[np.ndarray] = []
    start, k = 0, 0
    while len(rows):
        size = sizes[k % len(sizes)]
        if start >= len(rows) and size > 0:
            break
        pieces.append(rows[start:start + size])
        start += size
        k += 1
    return pieces


def _in_steps(pieces: list[np.ndarray], local: int, empty: np.ndarray) -> list[list[np.ndarray]]:
    """Consecutive groups of ``local`` pieces; the last group is filled up with ``empty``."""
    steps = [pieces[i:i + local] for i in range(0, len(pieces), local)]
    if steps and len(steps[-1]) < local:
        steps[-1] = steps[-1] + [empty] * (local - len(steps[-1]))
    return steps


def _padded(steps: list[list[np.ndarray]], count: int, local: int, empty: np.ndarray) -> list[list[np.ndarray]]:
    """``steps`` followed by all-empty steps up to ``count`` steps (other workers still have data)."""
    return steps + [[empty] * local for _ in range(count - len(steps))]


def _write_atomically(path: str, text: str) -> None:
    """Every rank may write the same file: each writes a private copy and renames it into place."""
    private = f"{path}.{os.getpid()}.tmp"
    with open(private, "w") as f:
        f.write(text)
    os.replace(private, path)


def _file_lines(k: int) -> list[bytes]:
    return [f"file{k}-line{j}".encode() for j in range(LINES[k])]


@pytest.fixture(scope="module")
def text_files() -> list[str]:
    """``len(LINES)`` text files in a directory whose path is the same on every rank.

    pytest's temporary directories differ between the ranks of one mpiexec job, so the
    files go under a fixed name in the system's temporary directory; every rank writes
    the same bytes there.
    """
    directory = os.path.join(tempfile.gettempdir(), f"towerdist-mw-test-{os.getuid()}", "text-lines-v1")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for k in range(len(LINES)):
        path = os.path.join(directory, f"part-{k}.txt")
        _write_atomically(path, "".join(line.decode() + "\n" for line in _file_lines(k)))
        paths.append(path)
    return paths


def _text_dataset(paths: list[str], policy: Any, batch: int = 2) -> td.data.Dataset:
    pattern = os.path.join(os.path.dirname(paths[0]), "part-*.txt") if len(paths) > 1 else paths[0]
    files = td.data.Dataset.list_files(pattern, shuffle=False)  # the same order on every worker
    return _with_policy(td.data.TextLineDataset(files).batch(batch), policy)


# --- AUTO / DATA: each global batch split across every replica of every worker ------------------


# TF 2.21, two workers with one replica each (reference/mpi.md): worker 0 first.
TF_DATA_SPLIT = {
    (12, 3): ([[[0, 1]], [[3, 4]], [[6, 7]], [[9, 10]]], [[[2]], [[5]], [[8]], [[11]]]),
    (5, 6): ([[[0, 1, 2]]], [[[3, 4]]]),
    (1, 1): ([[[0]]], [[[]]]),
}


@pytest.mark.parametrize("policy", [None, Policy.AUTO, Policy.DATA], ids=["default", "AUTO", "DATA"])
@pytest.mark.parametrize(("size", "batch"), list(TF_DATA_SPLIT), ids=[f"range{s}-batch{b}" for s, b in TF_DATA_SPLIT])
def test_data_sharding_gives_each_worker_its_replicas_pieces_of_every_global_batch(
    multi_worker_strategy, policy, size, batch
):
    strategy = multi_worker_strategy
    rank, workers, local, n = _layout(strategy)
    dist = strategy.experimental_distribute_dataset(_with_policy(td.data.Dataset.range(size).batch(batch), policy))
    global_batches = [np.arange(size)[i:i + batch] for i in range(0, size, batch)]
    steps, gathered = [], []
    for step in dist:
        steps.append(_local(strategy, step))
        gathered.append(strategy.gather(step, axis=0))
    first = rank * local
    expected = [_legacy_pieces(b, n)[first:first + local] for b in global_batches]
    assert _lists(steps) == _lists(expected)
    assert all(piece.dtype == np.int64 and piece.ndim == 1 for step in steps for piece in step)
    # The pieces of every worker, in global replica order, are the global batch itself.
    assert [g.tolist() for g in gathered] == [b.tolist() for b in global_batches]
    if (workers, local) == (2, 1):
        assert _lists(steps) == TF_DATA_SPLIT[size, batch][rank]


# --- OFF: every worker iterates the whole dataset ------------------------------------------------


def _off_steps(size: int, batch: int, workers: int, local: int, worker: int) -> list[list[np.ndarray]]:
    """Worker ``worker``'s steps under OFF: every row, re-cut by its rotated sizes."""
    pieces = _cut_cycling(np.arange(size), _rotated_sizes(batch, workers, local, worker))
    return _in_steps(pieces, local, np.zeros(0, np.int64))


def test_off_policy_every_worker_iterates_everything_in_rotated_per_replica_batches(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, workers, local, n = _layout(strategy)
    size, batch = 12, n + 1  # n + 1 rows: every replica gets rows, the first one of them two
    dataset = _with_policy(td.data.Dataset.range(size).batch(batch), Policy.OFF)
    steps = _steps(strategy, strategy.experimental_distribute_dataset(dataset))
    every_worker = [_off_steps(size, batch, workers, local, w) for w in range(workers)]
    count = max(len(s) for s in every_worker)  # the epoch ends when every worker is out of rows
    assert _lists(steps) == _lists(_padded(every_worker[rank], count, local, np.zeros(0, np.int64)))
    assert np.concatenate([piece for step in steps for piece in step]).tolist() == list(range(size))
    if (workers, local) == (2, 1):  # TF 2.21 with batch 3: twice as many steps as global batches
        assert _lists(steps)[:4] == ([[[0, 1]], [[2]], [[3, 4]], [[5]]], [[[0]], [[1, 2]], [[3]], [[4, 5]]])[rank]
        assert len(steps) == 8


def _legacy_steps_of_every_batch(size: int, batch: int, n: int, local: int) -> list[list[np.ndarray]]:
    """TF's legacy rebatch without sharding: every global batch in ``n`` pieces, ``local`` per step."""
    return [
        pieces[start:start + local]
        for b in range(0, size, batch)
        for pieces in [_legacy_pieces(np.arange(size)[b:b + batch], n)]
        for start in range(0, n, local)
    ]


def test_off_policy_with_an_unknown_batch_size_still_feeds_every_worker_everything(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, workers, local, n = _layout(strategy)
    size, batch = 12, 3
    # map() hides the batch size (as in TF, compute_batch_size does not look through it), so TF
    # cuts every batch into n pieces by its legacy rule; OFF shards nothing: every worker
    # iterates every piece, `local` per step (workers times as many steps as global batches).
    dataset = _with_policy(td.data.Dataset.range(size).batch(batch).map(lambda x: x), Policy.OFF)
    steps = _steps(strategy, strategy.experimental_distribute_dataset(dataset))
    assert np.concatenate([piece for step in steps for piece in step]).tolist() == list(range(size))
    assert _lists(steps) == _lists(_legacy_steps_of_every_batch(size, batch, n, local))
    assert len(steps) == workers * -(-size // batch)


# --- FILE: round-robin by file index -------------------------------------------------------------


def _file_steps(workers: int, local: int, worker: int, batch: int) -> list[list[np.ndarray]]:
    """Worker ``worker``'s steps under FILE: its own files' lines, re-cut by its rotated sizes (as TF)."""
    lines = np.array([line for k in range(worker, len(LINES), workers) for line in _file_lines(k)], dtype=object)
    pieces = _cut_cycling(lines, _rotated_sizes(batch, workers, local, worker))
    return _in_steps(pieces, local, np.zeros(0, object))


@pytest.mark.parametrize("policy", [Policy.FILE, None], ids=["FILE", "AUTO-with-enough-files"])
def test_file_sharding_reads_files_round_robin_by_file_index(multi_worker_strategy, text_files, policy):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)
    steps = _steps(strategy, strategy.experimental_distribute_dataset(_text_dataset(text_files, policy)))
    every_worker = [_file_steps(workers, local, w, 2) for w in range(workers)]
    count = max(len(s) for s in every_worker)
    # Uneven files: a worker that read all its lines gets empty pieces until the others finish.
    assert _lists(steps) == _lists(_padded(every_worker[rank], count, local, np.zeros(0, object)))
    assert all(piece.dtype == object and piece.ndim == 1 for step in steps for piece in step)
    read = {line.split(b"-")[0].decode() for step in steps for piece in step for line in piece.tolist()}
    assert read == {f"file{k}" for k in range(rank, len(LINES), workers)}
    rows = sum(len(piece) for step in steps for piece in step)
    # Every line is read by exactly one worker (MEAN of a plain value averages over the workers).
    assert float(strategy.reduce("MEAN", np.float64(rows), axis=None)) * workers == sum(LINES)


# TF 2.21, 4 files of 3 lines, workers of one replica: each worker's piece sizes, step by step,
# by (workers, batch) (run with mpiexec -n 3 for the three-worker case).
TF_FILE_SIZES = {
    (2, 4): ([2, 2, 2], [2, 2, 2]),
    (2, 5): ([3, 2, 1], [2, 3, 1]),
    (2, 3): ([2, 1, 2, 1], [1, 2, 1, 2]),
    (3, 4): ([2, 1, 1, 2], [1, 1, 1, 0], [1, 2, 0, 0]),
}


@pytest.fixture(scope="module")
def even_text_files() -> str:
    """A glob of 4 files of 3 lines each, the same on every rank."""
    directory = os.path.join(tempfile.gettempdir(), f"towerdist-mw-test-{os.getuid()}", "even-lines-v1")
    os.makedirs(directory, exist_ok=True)
    for k in range(4):
        _write_atomically(os.path.join(directory, f"part-{k}.txt"), "".join(f"file{k}-line{j}\n" for j in range(3)))
    return os.path.join(directory, "part-*.txt")


@pytest.mark.parametrize("batch", [4, 5, 3])
def test_file_sharding_recuts_each_workers_lines_across_its_batches(multi_worker_strategy, even_text_files, batch):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)
    files = td.data.Dataset.list_files(even_text_files, shuffle=False)
    dataset = files.interleave(td.data.TextLineDataset, cycle_length=2).batch(batch)
    steps = _steps(strategy, strategy.experimental_distribute_dataset(dataset))
    sizes = [len(piece) for step in steps for piece in step]
    every = []
    for w in range(workers):
        own = sum((list(range(3)) for _ in range(w, 4, workers)), [])  # 3 lines per file of this worker
        every.append(_in_steps(_cut_cycling(np.array(own), _rotated_sizes(batch, workers, local, w)), local, np.zeros(0)))
    count = max(len(s) for s in every)
    assert sizes == [len(p) for step in _padded(every[rank], count, local, np.zeros(0)) for p in step]
    if local == 1 and (workers, batch) in TF_FILE_SIZES:
        assert sizes == TF_FILE_SIZES[workers, batch][rank]


def test_data_sharding_on_files_splits_the_lines_of_every_global_batch(multi_worker_strategy, text_files):
    strategy = multi_worker_strategy
    rank, _, local, n = _layout(strategy)
    steps = _steps(strategy, strategy.experimental_distribute_dataset(_text_dataset(text_files, Policy.DATA)))
    lines = np.array([line for k in range(len(LINES)) for line in _file_lines(k)], dtype=object)
    first = rank * local
    expected = [_legacy_pieces(lines[i:i + 2], n)[first:first + local] for i in range(0, len(lines), 2)]
    assert _lists(steps) == _lists(expected)


def test_auto_with_fewer_files_than_workers_shards_by_data(multi_worker_strategy, text_files):
    strategy = multi_worker_strategy
    rank, _, local, n = _layout(strategy)
    one_file = text_files[:1]
    steps = _steps(strategy, strategy.experimental_distribute_dataset(_text_dataset(one_file, Policy.AUTO)))
    lines = np.array(_file_lines(0), dtype=object)
    first = rank * local
    expected = [_legacy_pieces(lines[i:i + 2], n)[first:first + local] for i in range(0, len(lines), 2)]
    assert _lists(steps) == _lists(expected)


def test_file_policy_with_fewer_files_than_workers_raises_on_every_worker(multi_worker_strategy, text_files):
    strategy = multi_worker_strategy
    _, workers, _, n = _layout(strategy)
    if workers == 1:
        pytest.skip("one worker never has fewer files than workers")
    with pytest.raises(td.errors.InvalidArgumentError, match=f"1 files to shard over {workers} workers"):
        strategy.experimental_distribute_dataset(_text_dataset(text_files[:1], Policy.FILE))
    # The workers are still in step: the next collective works.
    assert float(strategy.reduce("SUM", strategy.run(lambda: np.float32(1.0)), axis=None)) == n


def test_file_policy_without_a_file_reader_raises_not_found_on_every_worker(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, workers, _, n = _layout(strategy)
    if workers == 1:
        pytest.skip("one worker does not shard")
    with pytest.raises(td.errors.NotFoundError, match="unshardable source"):
        strategy.experimental_distribute_dataset(_with_policy(td.data.Dataset.range(8).batch(2), Policy.FILE))
    assert float(strategy.reduce("SUM", strategy.run(lambda: np.float32(1.0)), axis=None)) == n


# --- end of data ---------------------------------------------------------------------------------


FEATURES = 3


def _rows(worker: int, count: int) -> np.ndarray:
    """``count`` rows of worker ``worker``'s data: distinct, exactly representable floats."""
    return (1000.0 * worker + np.arange(count * FEATURES, dtype=np.float64)).reshape(count, FEATURES)


def _uneven_fn(batches: Callable[[int], int]) -> Callable[[td.distribute.InputContext], td.data.Dataset]:
    """A dataset_fn giving worker ``w`` ``batches(w)`` batches of 2 rows."""

    def dataset_fn(ctx: td.distribute.InputContext) -> td.data.Dataset:
        w = ctx.input_pipeline_id
        return td.data.Dataset.from_tensor_slices(_rows(w, 2 * batches(w))).batch(2)

    return dataset_fn


def _uneven_steps(batches: Callable[[int], int], workers: int, local: int) -> list[list[list[np.ndarray]]]:
    """Every worker's expected pieces per step: its replicas take consecutive batches; empty once it is out."""
    empty = np.zeros((0, FEATURES))
    every_worker = []
    for w in range(workers):
        rows = _rows(w, 2 * batches(w))
        every_worker.append(_in_steps([rows[i:i + 2] for i in range(0, len(rows), 2)], local, empty))
    count = max(len(s) for s in every_worker)
    return [_padded(s, count, local, empty) for s in every_worker]


def _first_worker_shortest(local: int) -> Callable[[int], int]:
    return lambda w: w * local + 1  # worker w needs w + 1 steps; its last step has one batch


@pytest.mark.parametrize("method", ["next", "get_next", "get_next_as_optional"])
def test_uneven_data_ends_on_every_worker_at_the_same_step(multi_worker_strategy, method):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)
    batches = _first_worker_shortest(local)
    expected = _uneven_steps(batches, workers, local)[rank]
    assert len(expected) == workers  # the last worker's data lasts one step per worker
    iterator = iter(strategy.distribute_datasets_from_function(_uneven_fn(batches)))

    def call() -> Any:
        if method == "next":
            return next(iterator)
        if method == "get_next":
            return iterator.get_next()
        optional = iterator.get_next_as_optional()
        assert optional.has_value()
        return optional.get_value()

    steps = [_local(strategy, call()) for _ in expected]
    assert _lists(steps) == _lists(expected)
    assert all(piece.shape[1:] == (FEATURES,) and piece.dtype == np.float64 for step in steps for piece in step)
    for _ in range(2):  # the end, on every worker at the same step, and again on a second call
        if method == "next":
            with pytest.raises(StopIteration):
                next(iterator)
        elif method == "get_next":
            with pytest.raises(td.errors.OutOfRangeError):
                iterator.get_next()
        else:
            assert not iterator.get_next_as_optional().has_value()


def test_empty_pieces_of_a_worker_that_ran_out_work_in_run_and_reduce(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, workers, local, _ = _layout(strategy)
    batches = _first_worker_shortest(local)
    every_worker = _uneven_steps(batches, workers, local)

    def step_fn(x: np.ndarray) -> tuple[Any, Any]:
        ctx = td.distribute.get_replica_context()
        return ctx.all_reduce("sum", np.float64(len(x))), ctx.all_reduce("sum", x.sum(axis=0))

    count = 0
    for s, batch in enumerate(strategy.distribute_datasets_from_function(_uneven_fn(batches))):
        everything = np.concatenate([piece for worker in every_worker for piece in worker[s]])
        rows, sums = strategy.run(step_fn, args=(batch,))
        assert [float(r) for r in _local(strategy, rows)] == [len(everything)] * local
        for total in _local(strategy, sums):
            np.testing.assert_array_equal(total, everything.sum(axis=0))
        np.testing.assert_array_equal(strategy.reduce("SUM", batch, axis=0), everything.sum(axis=0))
        # MEAN divides by the rows of every replica of every worker, empty pieces counting none.
        np.testing.assert_allclose(strategy.reduce("MEAN", batch, axis=0), everything.mean(axis=0), rtol=1e-15)
        np.testing.assert_array_equal(strategy.gather(batch, axis=0), everything)
        count += 1
    assert count == workers


def test_a_worker_without_any_data_follows_the_others_with_empty_pieces(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)

    def batches(w: int) -> int:
        return w * local  # worker w: w steps; worker 0 has no data at all

    expected = _uneven_steps(batches, workers, local)[rank]
    assert len(expected) == workers - 1
    iterator = iter(strategy.distribute_datasets_from_function(_uneven_fn(batches)))
    steps = []
    while (optional := iterator.get_next_as_optional()).has_value():
        steps.append(_local(strategy, optional.get_value()))
    assert _lists(steps) == _lists(expected)
    assert all(piece.shape[1:] == (FEATURES,) for step in steps for piece in step)
    with pytest.raises(td.errors.OutOfRangeError):
        iterator.get_next()


# --- distribute_datasets_from_function -----------------------------------------------------------


def test_each_worker_builds_one_input_pipeline_with_its_input_context(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, workers, local, n = _layout(strategy)
    contexts: list[td.distribute.InputContext] = []

    def dataset_fn(ctx: td.distribute.InputContext) -> td.data.Dataset:
        contexts.append(ctx)
        per_replica = ctx.get_per_replica_batch_size(3 * n)
        start = 100 * ctx.input_pipeline_id
        return td.data.Dataset.range(start, start + 2 * local * per_replica).batch(per_replica)

    steps = _steps(strategy, strategy.distribute_datasets_from_function(dataset_fn))
    assert len(contexts) == 1  # once per worker
    (ctx,) = contexts
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (workers, rank, n)
    assert ctx.get_per_replica_batch_size(8 * n) == 8
    if n > 1:
        with pytest.raises(ValueError, match="divisible"):
            ctx.get_per_replica_batch_size(8 * n + 1)
    # No rebatching: each replica gets whole batches of its worker's pipeline (3 rows), in order.
    mine = np.arange(100 * rank, 100 * rank + 6 * local)
    assert _lists(steps) == [[mine[3 * (s * local + i):3 * (s * local + i) + 3].tolist() for i in range(local)]
                             for s in range(2)]


def test_per_replica_mode_gives_each_replica_its_own_pipeline(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, _, local, n = _layout(strategy)
    contexts: list[tuple[int, int, int]] = []

    def dataset_fn(ctx: td.distribute.InputContext) -> td.data.Dataset:
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        start = 10 * ctx.input_pipeline_id
        return td.data.Dataset.range(start, start + 4).batch(2)

    options = td.distribute.InputOptions(experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA)
    steps = _steps(strategy, strategy.distribute_datasets_from_function(dataset_fn, options))
    ids = [rank * local + i for i in range(local)]  # global replica ids
    assert contexts == [(n, replica, n) for replica in ids]
    assert _lists(steps) == [[[10 * r + 2 * s, 10 * r + 2 * s + 1] for r in ids] for s in range(2)]


# --- element_spec --------------------------------------------------------------------------------


def test_element_spec_has_one_spec_per_local_replica(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, workers, local, n = _layout(strategy)
    features = np.zeros((10, FEATURES), np.float32)
    labels = np.arange(10)
    dataset = td.data.Dataset.from_tensor_slices((features, labels)).batch(2 * n)
    dist = strategy.experimental_distribute_dataset(dataset)
    piece_specs = (td.TensorSpec((None, FEATURES), td.float32), td.TensorSpec((None,), td.int64))
    spec = dist.element_spec
    if n == 1:  # one replica: the plain specs
        assert spec == piece_specs
    else:  # TF: a PerReplicaSpec per component, one spec per local replica (also with one)
        assert spec == tuple(PerReplicaSpec(*[s] * local) for s in piece_specs)
    assert iter(dist).element_spec == spec
    # A pipeline per worker is not split: its replicas' specs are the dataset's own, except that
    # with several workers the batch dimension is dynamic (TF 2.21: batch(2, drop_remainder=True)
    # under a 2-worker MWMS gives PerReplicaSpec(TensorSpec((None, ...))): a worker that ran out
    # gets empty pieces).
    from_fn = strategy.distribute_datasets_from_function(
        lambda ctx: td.data.Dataset.from_tensor_slices(features).batch(2, drop_remainder=True)
    )
    fixed = td.TensorSpec((2 if workers == 1 else None, FEATURES), td.float32)
    assert from_fn.element_spec == (fixed if n == 1 else PerReplicaSpec(*[fixed] * local))
    assert iter(from_fn).element_spec == from_fn.element_spec
    scalars = strategy.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(4))
    scalar = td.TensorSpec((), td.int64)  # no batch dimension to make dynamic
    assert scalars.element_spec == (scalar if n == 1 else PerReplicaSpec(*[scalar] * local))


# --- one epoch -----------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_remainder", [False, True], ids=["keep-remainder", "drop-remainder"])
def test_a_shuffled_epoch_feeds_every_example_to_exactly_one_replica(multi_worker_strategy, drop_remainder):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    size, batch = 7 * n + 3, 2 * n + 1
    ids = np.arange(size)
    features = np.stack([ids * 1.0, ids * -2.0], axis=1)
    # The same seed on every worker: every worker shuffles into the same order, so the split
    # of each global batch is consistent and no example is fed twice.
    dataset = td.data.Dataset.from_tensor_slices((features, ids)).shuffle(size, seed=7)
    dist = strategy.experimental_distribute_dataset(dataset.batch(batch, drop_remainder=drop_remainder))
    seen_x, seen_ids, steps = [], [], 0
    for x, y in dist:
        seen_x.append(strategy.gather(x, axis=0))
        seen_ids.append(strategy.gather(y, axis=0))
        steps += 1
    got_ids, got_x = np.concatenate(seen_ids), np.concatenate(seen_x)
    assert len(set(got_ids.tolist())) == len(got_ids)  # nothing twice
    if drop_remainder:
        assert steps == size // batch and len(got_ids) == steps * batch
        assert set(got_ids.tolist()) <= set(ids.tolist())
    else:
        assert steps == -(-size // batch)
        assert sorted(got_ids.tolist()) == ids.tolist()
    np.testing.assert_array_equal(got_x, features[got_ids])  # features stay with their labels
    assert got_ids.tolist() != sorted(got_ids.tolist())  # shuffled


def test_an_epoch_of_per_worker_shards_feeds_every_example_once(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, workers, local, n = _layout(strategy)
    size = 5 * n + 2

    def dataset_fn(ctx: td.distribute.InputContext) -> td.data.Dataset:
        shard = td.data.Dataset.range(size).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return shard.batch(2)

    seen = [strategy.gather(step, axis=0) for step in strategy.distribute_datasets_from_function(dataset_fn)]
    assert sorted(np.concatenate(seen).tolist()) == list(range(size))
    batches = [-(-len(range(w, size, workers)) // 2) for w in range(workers)]  # each worker's batches of 2
    assert len(seen) == max(-(-b // local) for b in batches)  # its replicas take consecutive batches


# --- unbatched elements --------------------------------------------------------------------------


def test_unbatched_scalars_ask_for_batch(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, _, _, n = _layout(strategy)
    dataset = td.data.Dataset.range(4)
    if n == 1:  # one replica takes whole elements: nothing to split
        assert [int(x) for x in strategy.experimental_distribute_dataset(dataset)] == [0, 1, 2, 3]
        return
    with pytest.raises(ValueError, match=r"Call the `batch` method .* across {n} replicas".format(n=n)):
        strategy.experimental_distribute_dataset(dataset)


def test_a_worker_out_of_unbatched_elements_raises_on_every_worker(multi_worker_strategy):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)
    if workers == 1:
        pytest.skip("needs several workers: one worker's replicas drop a partial step of scalars")

    def dataset_fn(ctx: td.distribute.InputContext) -> td.data.Dataset:
        start = 100 * ctx.input_pipeline_id
        return td.data.Dataset.range(start, start + local * (ctx.input_pipeline_id + 1))  # unbatched scalars

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    assert [int(x) for x in _local(strategy, next(iterator))] == [100 * rank + i for i in range(local)]
    # Step 2: worker 0 is out of elements, worker 1 is not. A scalar has no empty form, so
    # every worker must raise (naming worker 0) rather than feed worker 0 made-up zeros.
    with pytest.raises(ValueError, match=r"(?s)worker 0.*batch\(\)"):
        next(iterator)
