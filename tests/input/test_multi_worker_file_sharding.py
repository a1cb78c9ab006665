"""FILE auto-sharding of files read through ``interleave``/``flat_map`` under MultiWorkerMirroredStrategy.

``list_files(pattern, shuffle=False).interleave(td.data.TextLineDataset, ...)`` is sharded as
TensorFlow shards it: by the file-name dataset under the interleave, so worker ``w`` of ``W``
reads files ``w, w + W, ...`` and interleaves only those. Every test is marked ``multi_worker``:
it runs in the default suite (one worker, one and two local replicas) and again under
``mpiexec -n 2 python -m pytest -m multi_worker`` (two workers). The expected pieces are
computed from the rank, the replica counts, TensorFlow's cycle/block rule and TensorFlow's
re-batch of a worker's own lines by its rotated sizes (as in test_multi_worker_input.py).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest

import towerdist as td

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(120)]

Policy = td.data.experimental.AutoShardPolicy

LINES = (3, 1, 4, 2, 5)  # file k holds LINES[k] lines (uneven: workers run out at different steps)
CYCLE = 2
BATCH = 2


# --- helpers ---------------------------------------------------------------------------------


def _layout(strategy: td.distribute.MultiWorkerMirroredStrategy) -> tuple[int, int, int, int]:
    """``(rank, workers, local replicas, num_replicas_in_sync)``."""
    extended = strategy.extended
    return extended._worker_index, extended._num_workers, len(extended.worker_devices), strategy.num_replicas_in_sync


def _with_policy(dataset: td.data.Dataset, policy: Any) -> td.data.Dataset:
    if policy is None:
        return dataset
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def _steps(strategy: td.distribute.Strategy, dist: Any) -> list[list[list[Any]]]:
    return [[np.asarray(p).tolist() for p in strategy.experimental_local_results(step)] for step in dist]


def _line(k: int, j: int) -> bytes:
    return f"file{k}-line{j}".encode()


def _interleaved(files: list[int], cycle: int) -> list[bytes]:
    """The lines of ``files`` in TensorFlow's cycle order (block 1): a slot refills when the cycle returns."""
    slots: list[list[int] | None] = [None] * cycle
    out, pending, index = [], list(files), 0
    while pending or any(s is not None for s in slots):
        slot = slots[index]
        if slot is None:
            if not pending:
                index = (index + 1) % cycle
                continue
            slot = slots[index] = [pending.pop(0), 0]
        if slot[1] == LINES[slot[0]]:
            slots[index] = None
            index = (index + 1) % cycle
            continue
        out.append(_line(slot[0], slot[1]))
        slot[1] += 1
        index = (index + 1) % cycle
    return out


def _legacy_pieces(batch: list[bytes], n: int) -> list[list[bytes]]:
    """TF's split of one global batch of ``b`` rows: ``n`` consecutive pieces of ``ceil(b / n)`` rows."""
    size = -(-len(batch) // n)
    return [batch[min(i * size, len(batch)) : min((i + 1) * size, len(batch))] for i in range(n)]


def _rotated_sizes(workers: int, local: int, worker: int) -> list[int]:
    """TF's ``batch_sizes_for_worker(BATCH, workers, local, worker)``."""
    n = workers * local
    floor, extra = divmod(BATCH, n)
    worker_0 = [floor + 1] * extra + [floor] * (n - extra)
    return worker_0[worker * local :] + worker_0[: worker * local]


def _own_steps(lines: list[bytes], workers: int, local: int, worker: int) -> list[list[list[bytes]]]:
    """A worker's steps: its lines re-cut by its rotated sizes across batches (TF's rebatch), ``local`` per step.

    A size of 0 gives an empty piece, also after the last line, until the cycle comes to a
    size that needs lines.
    """
    sizes = _rotated_sizes(workers, local, worker)
    pieces: list[list[bytes]] = []
    start, k = 0, 0
    while lines and (start < len(lines) or sizes[k % len(sizes)] == 0):
        size = sizes[k % len(sizes)]
        pieces.append(lines[start : start + size])
        start, k = start + size, k + 1
    steps = [pieces[i : i + local] for i in range(0, len(pieces), local)]
    if steps and len(steps[-1]) < local:
        steps[-1] += [[]] * (local - len(steps[-1]))
    return steps


def _expected(rank: int, workers: int, local: int, lines_of: Any) -> list[list[list[bytes]]]:
    every = [_own_steps(lines_of(w), workers, local, w) for w in range(workers)]
    count = max(len(s) for s in every)  # a worker out of lines gets empty pieces until the others finish
    return every[rank] + [[[]] * local for _ in range(count - len(every[rank]))]


def _write_atomically(path: str, text: str) -> None:
    private = f"{path}.{os.getpid()}.tmp"
    with open(private, "w") as f:
        f.write(text)
    os.replace(private, path)


@pytest.fixture(scope="module")
def pattern() -> str:
    """A glob of ``len(LINES)`` text files, under a path that is the same on every rank."""
    directory = os.path.join(tempfile.gettempdir(), f"towerdist-mw-test-{os.getuid()}", "interleave-lines-v1")
    os.makedirs(directory, exist_ok=True)
    for k, n in enumerate(LINES):
        _write_atomically(
            os.path.join(directory, f"part-{k}.txt"), "".join(_line(k, j).decode() + "\n" for j in range(n))
        )
    return os.path.join(directory, "part-*.txt")


def _interleave_pipeline(pattern: str, policy: Any, kind: str) -> td.data.Dataset:
    files = td.data.Dataset.list_files(pattern, shuffle=False)  # the same order on every worker
    if kind == "interleave":
        lines = files.interleave(td.data.TextLineDataset, cycle_length=CYCLE)
    elif kind == "interleave-parallel":
        lines = files.interleave(td.data.TextLineDataset, cycle_length=CYCLE, num_parallel_calls=td.data.AUTOTUNE)
    else:  # flat_map over a reader with a map: the reader is found inside map_func's dataset
        lines = files.flat_map(lambda name: td.data.TextLineDataset(name).map(lambda line: line))
    return _with_policy(lines.batch(BATCH), policy)


# --- FILE sharding through interleave / flat_map -------------------------------------------------


@pytest.mark.parametrize("policy", [Policy.FILE, None, Policy.AUTO], ids=["FILE", "default", "AUTO"])
@pytest.mark.parametrize("kind", ["interleave", "interleave-parallel", "flat_map"])
def test_files_reached_through_interleave_are_sharded_by_file(multi_worker_strategy, pattern, policy, kind):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)
    cycle = 1 if kind == "flat_map" else CYCLE
    steps = _steps(strategy, strategy.experimental_distribute_dataset(_interleave_pipeline(pattern, policy, kind)))
    own_files = lambda w: list(range(w, len(LINES), workers))  # noqa: E731
    assert steps == _expected(rank, workers, local, lambda w: _interleaved(own_files(w), cycle))
    read = {line.split(b"-")[0].decode() for step in steps for piece in step for line in piece}
    assert read == {f"file{k}" for k in own_files(rank)}
    rows = sum(len(piece) for step in steps for piece in step)
    # Every line is read by exactly one worker (MEAN of a plain value averages over the workers).
    assert float(strategy.reduce("MEAN", np.float64(rows), axis=None)) * workers == sum(LINES)


def test_data_policy_interleaves_every_file_and_splits_every_global_batch(multi_worker_strategy, pattern):
    strategy = multi_worker_strategy
    rank, _, local, n = _layout(strategy)
    steps = _steps(
        strategy, strategy.experimental_distribute_dataset(_interleave_pipeline(pattern, Policy.DATA, "interleave"))
    )
    lines = _interleaved(list(range(len(LINES))), CYCLE)
    first = rank * local
    assert steps == [
        _legacy_pieces(lines[i : i + BATCH], n)[first : first + local] for i in range(0, len(lines), BATCH)
    ]


def test_auto_with_fewer_files_than_workers_shards_by_data(multi_worker_strategy, pattern):
    strategy = multi_worker_strategy
    rank, _, local, n = _layout(strategy)
    one_file = pattern.replace("part-*", "part-4")
    dataset = td.data.Dataset.list_files(one_file, shuffle=False).interleave(td.data.TextLineDataset, cycle_length=2)
    steps = _steps(strategy, strategy.experimental_distribute_dataset(dataset.batch(BATCH)))
    lines = [_line(4, j) for j in range(LINES[4])]
    first = rank * local
    assert steps == [
        _legacy_pieces(lines[i : i + BATCH], n)[first : first + local] for i in range(0, len(lines), BATCH)
    ]


def test_file_policy_with_fewer_files_than_workers_raises_on_every_worker(multi_worker_strategy, pattern):
    strategy = multi_worker_strategy
    _, workers, _, n = _layout(strategy)
    if workers == 1:
        pytest.skip("one worker never has fewer files than workers")
    one_file = pattern.replace("part-*", "part-0")
    dataset = td.data.Dataset.list_files(one_file, shuffle=False).interleave(td.data.TextLineDataset)
    with pytest.raises(td.errors.InvalidArgumentError, match=f"1 files to shard over {workers} workers"):
        strategy.experimental_distribute_dataset(_with_policy(dataset.batch(BATCH), Policy.FILE))
    assert float(strategy.reduce("SUM", strategy.run(lambda: np.float32(1.0)), axis=None)) == n


def test_file_policy_on_an_interleave_without_files_raises_not_found_on_every_worker(multi_worker_strategy):
    strategy = multi_worker_strategy
    _, workers, _, n = _layout(strategy)
    if workers == 1:
        pytest.skip("one worker does not shard")
    dataset = td.data.Dataset.range(4).interleave(lambda x: td.data.Dataset.range(x), cycle_length=2).batch(2)
    with pytest.raises(td.errors.NotFoundError, match="unshardable source"):
        strategy.experimental_distribute_dataset(_with_policy(dataset, Policy.FILE))
    assert float(strategy.reduce("SUM", strategy.run(lambda: np.float32(1.0)), axis=None)) == n


def test_datasets_from_function_shards_files_with_the_input_context(multi_worker_strategy, pattern):
    strategy = multi_worker_strategy
    rank, workers, local, _ = _layout(strategy)

    def dataset_fn(ctx: td.distribute.InputContext) -> td.data.Dataset:
        files = td.data.Dataset.list_files(pattern, shuffle=False).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        return files.interleave(td.data.TextLineDataset, cycle_length=CYCLE, num_parallel_calls=CYCLE).batch(BATCH)

    steps = _steps(strategy, strategy.distribute_datasets_from_function(dataset_fn))
    # No rebatching: replica i of a step takes the worker's next whole batch, empty once it is out.
    every = []
    for w in range(workers):
        lines = _interleaved(list(range(w, len(LINES), workers)), CYCLE)
        batches = [lines[i : i + BATCH] for i in range(0, len(lines), BATCH)]
        own = [batches[i : i + local] for i in range(0, len(batches), local)]
        if own and len(own[-1]) < local:
            own[-1] += [[]] * (local - len(own[-1]))
        every.append(own)
    count = max(len(s) for s in every)
    assert steps == every[rank] + [[[]] * local for _ in range(count - len(every[rank]))]
