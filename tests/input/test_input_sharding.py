"""How distributed datasets split, shard and feed their input.

* Splitting a global batch across the replicas of one worker: the default (legacy) rule
  and the cycling rule of ``AutoShardPolicy.OFF`` never lose, duplicate or reorder rows.
* ``batch_sizes_for_worker``: TensorFlow's per-worker size lists.
* Multi-worker sharding (FILE / DATA / AUTO / HINT), simulated by building one
  ``DistributedDataset`` per worker with an explicit ``InputWorker``.
* Foreign inputs (lists, generators, tf.data, DataLoader), ``InputOptions`` and the
  background threads of ``prefetch``.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td
from towerdist._src.device import parse
from towerdist._src.input.auto_shard import ShardMode, auto_shard
from towerdist._src.input.distributed_dataset import DistributedDataset, InputWorker
from towerdist._src.input.split import batch_sizes_for_worker
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from iterator_calls import END, next_by

Policy = td.data.experimental.AutoShardPolicy
SHARD_HINT = td.data.experimental.SHARD_HINT

PROPERTY_SETTINGS = settings(max_examples=40, deadline=None)


# --- helpers ---------------------------------------------------------------------------------


def with_policy(dataset: td.data.Dataset, policy: Policy | None) -> td.data.Dataset:
    """``dataset`` with ``auto_shard_policy`` set (None: leave the default)."""
    if policy is None:
        return dataset
    options = td.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)


def pieces(strategy: td.distribute.Strategy, value: Any) -> list[np.ndarray]:
    """The replicas' pieces of one array-valued step, in replica order."""
    return [np.asarray(p) for p in strategy.experimental_local_results(value)]


def concat(arrays: list[np.ndarray], like: np.ndarray) -> np.ndarray:
    """``np.concatenate`` that also accepts an empty list (giving 0 rows shaped like ``like``)."""
    if not arrays:
        return like[:0]
    return np.concatenate(arrays)


def float_rows(n: int) -> np.ndarray:
    """``n`` rows of 2 floats, exactly representable so that sums and means are exact."""
    return np.arange(2 * n, dtype=np.float64).reshape(n, 2) * 0.5 + 0.25


def worker_dataset(
    dataset: Any, num_workers: int, worker_index: int, num_local: int, hook: Any = None
) -> DistributedDataset:
    """Worker ``worker_index``'s distributed dataset in a simulated ``num_workers``-worker job."""
    first = worker_index * num_local
    devices = tuple(parse(f"CPU:{first + i}") for i in range(num_local))
    worker = InputWorker(
        devices=devices, num_workers=num_workers, worker_index=worker_index, workers_with_data=hook
    )
    return DistributedDataset(dataset, worker, mirrored_strategy_for(num_local), None)


def worker_steps(dataset: Any, num_workers: int, num_local: int) -> list[list[list[np.ndarray]]]:
    """For each worker, its steps; each step the list of its local replicas' pieces."""
    strategy = mirrored_strategy_for(num_local)
    out = []
    for w in range(num_workers):
        dist = worker_dataset(dataset, num_workers, w, num_local)
        out.append([pieces(strategy, x) for x in dist])
    return out


def write_text_files(directory: Path, num_files: int, lines_per_file: int) -> list[bytes]:
    """Writes ``f{i}.txt`` files; returns all their lines in file order."""
    lines = []
    for f in range(num_files):
        body = [f"f{f}-line{i}" for i in range(lines_per_file)]
        (directory / f"f{f}.txt").write_text("".join(line + "\n" for line in body))
        lines.extend(line.encode() for line in body)
    return lines


def text_dataset(directory: Path, batch: int = 4) -> td.data.Dataset:
    files = td.data.Dataset.list_files(str(directory / "*.txt"), shuffle=False)
    return td.data.TextLineDataset(files).batch(batch)


def file_of(line: bytes) -> int:
    return int(line.split(b"-")[0][1:])


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "towerdist-prefetch"]


def assert_prefetch_threads_end() -> None:
    for thread in prefetch_threads():
        thread.join(timeout=20)
    assert [t for t in prefetch_threads() if t.is_alive()] == []


# --- 1. splitting on one worker: properties ----------------------------------------------------


@PROPERTY_SETTINGS
@given(
    size=st.integers(0, 60),
    global_batch=st.integers(1, 13),
    num_replicas=st.sampled_from([1, 2, 3, 4]),
    drop_remainder=st.booleans(),
)
def test_default_policy_each_step_is_one_global_batch(size, global_batch, num_replicas, drop_remainder):
    strategy = mirrored_strategy_for(num_replicas)
    data = float_rows(size)
    dataset = td.data.Dataset.from_tensor_slices(data).batch(global_batch, drop_remainder=drop_remainder)
    batches = list(dataset.as_numpy_iterator())

    steps = list(strategy.experimental_distribute_dataset(dataset))

    assert len(steps) == len(batches)
    everything = []
    for step, batch in zip(steps, batches, strict=True):
        parts = pieces(strategy, step)
        assert len(parts) == num_replicas
        # legacy rule: pieces of ceil(b / N) rows, the trailing ones short or empty, other dims kept
        ceil = -(-len(batch) // num_replicas)
        assert [len(p) for p in parts] == [max(0, min(ceil, len(batch) - i * ceil)) for i in range(num_replicas)]
        assert all(p.shape[1:] == (2,) for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts), batch)
        np.testing.assert_allclose(strategy.reduce("SUM", step, axis=0), batch.sum(axis=0))
        np.testing.assert_allclose(strategy.reduce("MEAN", step, axis=0), batch.mean(axis=0))
        everything.extend(parts)
    expected = data[: len(batches) * global_batch] if drop_remainder else data
    np.testing.assert_array_equal(concat(everything, data), expected)


def _check_cycling_split(size, global_batch, num_replicas, drop_remainder):
    strategy = mirrored_strategy_for(num_replicas)
    data = float_rows(size)
    dataset = td.data.Dataset.from_tensor_slices(data).batch(global_batch, drop_remainder=drop_remainder)
    expected = concat(list(dataset.as_numpy_iterator()), data)
    sizes = batch_sizes_for_worker(global_batch, 1, num_replicas, 0)

    steps = list(strategy.experimental_distribute_dataset(with_policy(dataset, Policy.OFF)))

    everything = []
    for i, step in enumerate(steps):
        parts = pieces(strategy, step)
        assert len(parts) == num_replicas
        if i < len(steps) - 1:
            assert [len(p) for p in parts] == sizes  # every full step cycles through the size list
        rows = np.concatenate(parts)
        if len(rows):
            np.testing.assert_allclose(strategy.reduce("SUM", step, axis=0), rows.sum(axis=0))
            np.testing.assert_allclose(strategy.reduce("MEAN", step, axis=0), rows.mean(axis=0))
        everything.extend(parts)
    np.testing.assert_array_equal(concat(everything, data), expected)


@PROPERTY_SETTINGS
@given(
    size=st.integers(0, 60),
    global_batch=st.integers(1, 13),
    num_replicas=st.sampled_from([1, 2, 3, 4]),
    drop_remainder=st.booleans(),
)
def test_off_policy_keeps_every_row_once_in_order(size, global_batch, num_replicas, drop_remainder):
    _check_cycling_split(size, global_batch, num_replicas, drop_remainder)


@pytest.mark.parametrize(
    ("size", "global_batch", "num_replicas"), [(4, 2, 4), (2, 2, 4), (3, 1, 2), (6, 2, 3)]
)
def test_off_policy_drop_remainder_small_batch_keeps_rows(size, global_batch, num_replicas):
    _check_cycling_split(size, global_batch, num_replicas, drop_remainder=True)


@PROPERTY_SETTINGS
@given(
    size=st.integers(0, 60),
    global_batch=st.integers(1, 13),
    num_replicas=st.sampled_from([1, 2, 3, 4]),
    drop_remainder=st.booleans(),
    policy=st.sampled_from([None, Policy.OFF]),
    kind=st.sampled_from(["tuple", "dict"]),
)
def test_structured_elements_stay_aligned(size, global_batch, num_replicas, drop_remainder, policy, kind):
    if policy == Policy.OFF and drop_remainder and global_batch < num_replicas:
        drop_remainder = False  # the known OFF corner, tested above
    strategy = mirrored_strategy_for(num_replicas)
    features = np.arange(size, dtype=np.float64) + 0.5
    labels = np.arange(size, dtype=np.int64) * 10
    source = (features, labels) if kind == "tuple" else {"f": features, "l": labels}
    dataset = td.data.Dataset.from_tensor_slices(source).batch(global_batch, drop_remainder=drop_remainder)
    kept = len(list(dataset.as_numpy_iterator())) * global_batch if drop_remainder else size

    all_f, all_l = [], []
    for step in strategy.experimental_distribute_dataset(with_policy(dataset, policy)):
        f, labels_step = (step[0], step[1]) if kind == "tuple" else (step["f"], step["l"])
        f_parts, l_parts = pieces(strategy, f), pieces(strategy, labels_step)
        assert len(f_parts) == len(l_parts) == num_replicas
        for fp, lp in zip(f_parts, l_parts, strict=True):
            np.testing.assert_array_equal(lp, ((fp - 0.5) * 10).astype(np.int64))  # row by row
        if policy is None:
            np.testing.assert_allclose(strategy.reduce("SUM", f, axis=0), np.concatenate(f_parts).sum())
            np.testing.assert_allclose(strategy.reduce("MEAN", f, axis=0), np.concatenate(f_parts).mean())
        all_f.extend(f_parts)
        all_l.extend(l_parts)
    np.testing.assert_array_equal(concat(all_f, features), features[:kept])
    np.testing.assert_array_equal(concat(all_l, labels), labels[:kept])


# --- 2. batch_sizes_for_worker -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((6, 1, 4, 0), [2, 2, 1, 1]),
        ((7, 2, 2, 1), [2, 1, 2, 2]),
        ((7, 2, 2, 0), [2, 2, 2, 1]),
        ((8, 1, 4, 0), [2, 2, 2, 2]),
        ((2, 1, 4, 0), [1, 1, 0, 0]),
        ((5, 3, 1, 2), [1, 2, 2]),
    ],
)
def test_batch_sizes_for_worker_examples(args, expected):
    assert batch_sizes_for_worker(*args) == expected


@PROPERTY_SETTINGS
@given(
    global_batch=st.integers(0, 100),
    num_workers=st.integers(1, 5),
    per_worker=st.integers(1, 5),
)
def test_batch_sizes_for_worker_properties(global_batch, num_workers, per_worker):
    lists = [batch_sizes_for_worker(global_batch, num_workers, per_worker, w) for w in range(num_workers)]
    worker_0 = lists[0]
    n = num_workers * per_worker
    assert len(worker_0) == n
    assert sum(worker_0) == global_batch
    assert max(worker_0) - min(worker_0) <= 1
    assert worker_0 == sorted(worker_0, reverse=True)
    for w, sizes in enumerate(lists):
        shift = w * per_worker
        assert sizes == worker_0[shift:] + worker_0[:shift]
        assert sum(sizes) == global_batch
    # the workers' first R entries, worker after worker, are worker 0's whole list: each global
    # batch is cut exactly once across all replicas of all workers
    assert [size for sizes in lists for size in sizes[:per_worker]] == worker_0


# --- 3. simulated multi-worker ------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("num_local", [1, 2])
@pytest.mark.parametrize("policy", [Policy.DATA, Policy.AUTO])
@pytest.mark.parametrize(("size", "global_batch"), [(14, 6), (7, 4), (12, 12), (0, 3)])
def test_data_sharding_union_is_the_data(num_workers, num_local, policy, size, global_batch):
    data = float_rows(size)
    dataset = with_policy(td.data.Dataset.from_tensor_slices(data).batch(global_batch), policy)

    per_worker = worker_steps(dataset, num_workers, num_local)

    num_steps = {len(steps) for steps in per_worker}
    assert num_steps == {-(-size // global_batch)}  # every worker: one step per global batch
    (count,) = num_steps
    ordered = [
        piece
        for step in range(count)
        for w in range(num_workers)
        for piece in per_worker[w][step]
    ]
    assert all(len(per_worker[w][s]) == num_local for w in range(num_workers) for s in range(count))
    np.testing.assert_array_equal(concat(ordered, data), data)
    # each step, all replicas of all workers together hold exactly that global batch
    for step in range(count):
        rows = np.concatenate([p for w in range(num_workers) for p in per_worker[w][step]])
        np.testing.assert_array_equal(rows, data[step * global_batch:(step + 1) * global_batch])


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("num_local", [1, 2])
@pytest.mark.parametrize("policy", [Policy.FILE, Policy.AUTO])
def test_file_sharding_gives_each_worker_its_own_files(tmp_path, num_workers, num_local, policy):
    lines = write_text_files(tmp_path, num_files=4, lines_per_file=5)
    dataset = with_policy(text_dataset(tmp_path), policy)

    per_worker = worker_steps(dataset, num_workers, num_local)

    worker_lines = [
        [line for step in steps for piece in step for line in piece.tolist()] for steps in per_worker
    ]
    files = [{file_of(line) for line in got} for got in worker_lines]
    for w in range(num_workers):
        assert files[w] == {f for f in range(4) if f % num_workers == w}  # files w, w + W, ...
        # a worker reads its files in order
        assert worker_lines[w] == [line for line in lines if file_of(line) % num_workers == w]
    for a in range(num_workers):
        for b in range(a + 1, num_workers):
            assert files[a].isdisjoint(files[b])
    assert sorted(line for got in worker_lines for line in got) == sorted(lines)


def test_file_policy_without_files_is_not_found():
    dataset = with_policy(td.data.Dataset.range(8).batch(4), Policy.FILE)
    with pytest.raises(td.errors.NotFoundError):
        worker_dataset(dataset, 2, 0, 1)


def test_file_policy_with_fewer_files_than_workers_is_invalid(tmp_path):
    write_text_files(tmp_path, num_files=2, lines_per_file=5)
    dataset = with_policy(text_dataset(tmp_path), Policy.FILE)
    with pytest.raises(td.errors.InvalidArgumentError, match="2 files"):
        worker_dataset(dataset, 3, 0, 1)


@pytest.mark.parametrize("num_local", [1, 2])
def test_auto_with_fewer_files_than_workers_shards_by_data(tmp_path, num_local):
    lines = write_text_files(tmp_path, num_files=2, lines_per_file=5)
    dataset = with_policy(text_dataset(tmp_path), Policy.AUTO)

    per_worker = worker_steps(dataset, 3, num_local)

    assert {len(steps) for steps in per_worker} == {3}  # ceil(10 / 4) global batches, same on every worker
    ordered = [
        line
        for step in range(3)
        for w in range(3)
        for piece in per_worker[w][step]
        for line in piece.tolist()
    ]
    assert ordered == lines


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("num_local", [1, 2])
def test_hint_policy_shards_disjoint_and_complete(num_workers, num_local):
    dataset = td.data.Dataset.range(20).shard(SHARD_HINT, SHARD_HINT).batch(3)
    per_worker = worker_steps(with_policy(dataset, Policy.HINT), num_workers, num_local)
    rows = [row for steps in per_worker for step in steps for piece in step for row in piece.tolist()]
    assert sorted(rows) == list(range(20))


def test_hint_policy_on_one_worker_gives_everything():
    strategy = mirrored_strategy_for(2)
    dataset = with_policy(td.data.Dataset.range(10).shard(SHARD_HINT, SHARD_HINT).batch(4), Policy.HINT)
    got = [p for x in strategy.experimental_distribute_dataset(dataset) for p in pieces(strategy, x)]
    np.testing.assert_array_equal(np.concatenate(got), np.arange(10))


def test_iterating_an_unfilled_shard_hint_is_invalid():
    dataset = td.data.Dataset.range(10).shard(SHARD_HINT, SHARD_HINT)
    with pytest.raises(td.errors.InvalidArgumentError, match="SHARD_HINT"):
        list(dataset.as_numpy_iterator())


# TensorFlow's re-batch under FILE (and HINT) sharding: each worker cycles through its rotated
# list of per-replica sizes across its own batches; only DATA sharding splits batch by batch.


class FixedCounts:
    """The workers' agreement on who still has data, for workers whose step counts are known."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.step = 0

    def __call__(self, has_data: bool) -> list[bool]:
        flags = [self.step < count for count in self.counts]
        self.step += 1
        return flags


def lockstep_sizes(dataset: Any, num_workers: int, num_local: int) -> list[list[list[int]]]:
    """Each worker's piece sizes per step, the workers kept in step (out of data: empty pieces)."""
    counts = [len(steps) for steps in worker_steps(dataset, num_workers, num_local)]
    strategy = mirrored_strategy_for(num_local)
    return [
        [[len(p) for p in pieces(strategy, x)] for x in worker_dataset(dataset, num_workers, w, num_local, FixedCounts(counts))]
        for w in range(num_workers)
    ]


def file_readers(directory: Path, kind: str, batch: int) -> td.data.Dataset:
    files = td.data.Dataset.list_files(str(directory / "*.txt"), shuffle=False)
    if kind == "TextLineDataset":
        return td.data.TextLineDataset(files).batch(batch)
    return files.interleave(td.data.TextLineDataset, cycle_length=2).batch(batch)


# TF 2.21, 4 files of 3 lines, one replica per worker: each worker's piece sizes, step by step.
TF_FILE_SHARDED_SIZES = {
    (4, 2): [[[2], [2], [2]], [[2], [2], [2]]],
    (5, 2): [[[3], [2], [1]], [[2], [3], [1]]],
    (3, 2): [[[2], [1], [2], [1]], [[1], [2], [1], [2]]],
    (4, 3): [[[2], [1], [1], [2]], [[1], [1], [1], [0]], [[1], [2], [0], [0]]],
}


@pytest.mark.parametrize("kind", ["TextLineDataset", "interleave"])
@pytest.mark.parametrize("policy", [None, Policy.AUTO, Policy.FILE], ids=["default", "AUTO", "FILE"])
@pytest.mark.parametrize(
    ("batch", "num_workers"), list(TF_FILE_SHARDED_SIZES), ids=[f"batch{b}-{w}workers" for b, w in TF_FILE_SHARDED_SIZES]
)
def test_file_sharding_recuts_each_workers_stream_by_its_rotated_sizes(tmp_path, kind, policy, batch, num_workers):
    lines = write_text_files(tmp_path, num_files=4, lines_per_file=3)
    dataset = with_policy(file_readers(tmp_path, kind, batch), policy)

    sizes = lockstep_sizes(dataset, num_workers, 1)

    assert sizes == TF_FILE_SHARDED_SIZES[batch, num_workers]
    got = [line for steps in worker_steps(dataset, num_workers, 1) for step in steps for p in step for line in p.tolist()]
    assert sorted(got) == sorted(lines)  # every line once


def test_file_sharding_with_two_local_replicas_cycles_over_all_replicas(tmp_path):
    # TF 2.21's worker pipelines (rebatch, then auto-shard by file), batch 5 over 2 workers of
    # 2 replicas: worker 0's pieces are 2, 1, 1, 1, 1 and worker 1's 1, 1, 2, 1, 1.
    write_text_files(tmp_path, num_files=4, lines_per_file=3)
    dataset = file_readers(tmp_path, "interleave", 5)
    assert lockstep_sizes(dataset, 2, 2) == [[[2, 1], [1, 1], [1, 0]], [[1, 1], [2, 1], [1, 0]]]


def test_file_sharding_with_an_unknown_batch_size_splits_each_own_batch(tmp_path):
    # map() hides the batch size: TF splits each of the worker's batches over every replica.
    write_text_files(tmp_path, num_files=4, lines_per_file=3)
    dataset = file_readers(tmp_path, "interleave", 4).map(lambda x: x)
    assert lockstep_sizes(dataset, 2, 1) == [[[2], [2], [1], [1]], [[2], [2], [1], [1]]]


def test_data_sharding_of_files_still_splits_every_global_batch(tmp_path):
    write_text_files(tmp_path, num_files=4, lines_per_file=3)
    dataset = with_policy(file_readers(tmp_path, "interleave", 5), Policy.DATA)
    assert lockstep_sizes(dataset, 2, 1) == [[[3], [3], [1]], [[2], [2], [1]]]


# TF 2.21, hint sharding: batch 5 over range(15).shard(SHARD_HINT, SHARD_HINT), two workers.
TF_HINT_SIZES = {1: [[[3], [2], [3]], [[2], [3], [2]]], 2: [[[2, 1], [1, 1], [2, 1]], [[1, 1], [2, 1], [1, 1]]]}


@pytest.mark.parametrize("num_local", [1, 2])
def test_hint_sharding_recuts_each_workers_shard_by_its_rotated_sizes(num_local):
    dataset = with_policy(td.data.Dataset.range(15).shard(SHARD_HINT, SHARD_HINT).batch(5), Policy.HINT)
    assert lockstep_sizes(dataset, 2, num_local) == TF_HINT_SIZES[num_local]


def test_file_policy_with_a_source_that_reads_no_files_is_not_found(tmp_path):
    # TF: zipping the lines with a range leaves a source that cannot be sharded by file.
    write_text_files(tmp_path, num_files=4, lines_per_file=3)
    lines = td.data.TextLineDataset(td.data.Dataset.list_files(str(tmp_path / "*.txt"), shuffle=False))
    zipped = td.data.Dataset.zip((lines, td.data.Dataset.range(12))).batch(5)
    with pytest.raises(td.errors.NotFoundError, match="unshardable source"):
        worker_dataset(with_policy(zipped, Policy.FILE), 2, 0, 1)
    # AUTO shards it by data: the lines stay paired with their numbers.
    per_worker = worker_steps(zipped, 2, 1)
    assert [[len(p[0]) for p in step] for step in per_worker[0]] == [[3], [3], [1]]
    pairs = sorted(
        (line, int(number))
        for steps in per_worker
        for step in steps
        for piece in step
        for line, number in zip(piece[0].tolist(), piece[1].tolist(), strict=True)
    )
    assert [number for _, number in pairs] == list(range(12))


# TF 2.21, one worker (MirroredStrategy on logical CPUs), 5 files of 2 lines, batch 4: sizes per step.
TF_ONE_WORKER_SIZES = [
    ("interleave", None, 2, [[2, 2], [2, 2], [2, 0]]),
    ("interleave", Policy.DATA, 2, [[2, 2], [2, 2], [1, 1]]),
    ("interleave", Policy.OFF, 2, [[2, 2], [2, 2], [2, 0]]),
    ("TextLineDataset", None, 2, [[2, 2], [2, 2], [2, 0]]),
    ("interleave", None, 3, [[2, 1, 1], [2, 1, 1], [2, 0, 0]]),
    ("flat_map", None, 3, [[2, 1, 1], [2, 1, 1], [2, 0, 0]]),
    ("interleave-map", None, 3, [[2, 1, 1], [2, 1, 1], [2, 0, 0]]),
    ("interleave-batch-map", None, 3, [[2, 2, 0], [2, 2, 0], [1, 1, 0]]),
    ("interleave-drop", None, 3, [[2, 1, 1], [2, 1, 1]]),
    ("one-file", None, 3, [[2, 0, 0]]),
    ("zip-range", None, 3, [[2, 2, 0], [2, 2, 0], [1, 1, 0]]),
    ("range", None, 3, [[2, 2, 0], [2, 2, 0], [1, 1, 0]]),
    ("range", Policy.FILE, 3, [[2, 1, 1], [2, 1, 1], [2, 0, 0]]),
    ("range", Policy.HINT, 3, [[2, 1, 1], [2, 1, 1], [2, 0, 0]]),
]


def _one_worker_dataset(kind: str, directory: Path) -> td.data.Dataset:
    names = sorted(str(p) for p in directory.glob("*.txt"))
    files = td.data.Dataset.list_files(names, shuffle=False)
    if kind == "interleave":
        return files.interleave(td.data.TextLineDataset, cycle_length=2).batch(4)
    if kind == "TextLineDataset":
        return td.data.TextLineDataset(files).batch(4)
    if kind == "flat_map":
        return files.flat_map(td.data.TextLineDataset).batch(4)
    if kind == "interleave-map":  # the reader inside map_func's dataset
        return files.interleave(lambda name: td.data.TextLineDataset(name).map(lambda line: line), cycle_length=2).batch(4)
    if kind == "interleave-batch-map":  # map() hides the batch size
        return files.interleave(td.data.TextLineDataset, cycle_length=2).batch(4).map(lambda line: line)
    if kind == "interleave-drop":
        return files.interleave(td.data.TextLineDataset, cycle_length=2).batch(4, drop_remainder=True)
    if kind == "one-file":
        return td.data.TextLineDataset(names[0]).batch(4)
    if kind == "zip-range":  # a source that reads no files: sharded by data
        return td.data.Dataset.zip((td.data.TextLineDataset(files), td.data.Dataset.range(10))).batch(4)
    return td.data.Dataset.range(10).batch(4)


@pytest.mark.parametrize(
    ("kind", "policy", "num_replicas", "expected"),
    TF_ONE_WORKER_SIZES,
    ids=[f"{k}-{p.name if p is not None else 'default'}-{n}" for k, p, n, _ in TF_ONE_WORKER_SIZES],
)
def test_one_worker_reading_files_recuts_by_the_cycling_rule(tmp_path, kind, policy, num_replicas, expected):
    for k in range(5):
        (tmp_path / f"g{k}.txt").write_text(f"g{k}-a\ng{k}-b\n")
    strategy = mirrored_strategy_for(num_replicas)
    dataset = with_policy(_one_worker_dataset(kind, tmp_path), policy)

    steps = list(strategy.experimental_distribute_dataset(dataset))

    first = [x[0] if isinstance(x, tuple) else x for x in steps]
    assert [[len(p) for p in pieces(strategy, x)] for x in first] == expected


# auto_shard itself


@pytest.mark.parametrize(
    ("num_workers", "policy", "mode"),
    [
        # One worker reading files: FILE and AUTO resolve to FILE sharding (nothing to shard),
        # which keeps TensorFlow's cycling re-batch of the worker's own stream.
        (1, Policy.AUTO, ShardMode.OWN),
        (1, Policy.FILE, ShardMode.OWN),
        (1, Policy.OFF, ShardMode.OWN),
        (2, Policy.OFF, ShardMode.OWN),
        (1, Policy.DATA, ShardMode.DATA),
        (2, Policy.DATA, ShardMode.DATA),
    ],
)
def test_auto_shard_keeps_the_whole_pipeline_for_one_worker_or_off_or_data(tmp_path, num_workers, policy, mode):
    write_text_files(tmp_path, num_files=4, lines_per_file=2)
    dataset = text_dataset(tmp_path)
    sharded, got = auto_shard(dataset, num_workers, num_workers - 1, policy)
    assert sharded is dataset
    assert got is mode


@pytest.mark.parametrize("policy", [Policy.FILE, Policy.AUTO])
@pytest.mark.parametrize("worker_index", [0, 1])
def test_auto_shard_by_file_rewrites_the_reader(tmp_path, policy, worker_index):
    lines = write_text_files(tmp_path, num_files=4, lines_per_file=3)
    dataset = text_dataset(tmp_path, batch=2)
    sharded, mode = auto_shard(dataset, 2, worker_index, policy)
    assert mode is ShardMode.OWN
    got = [line for batch in sharded.as_numpy_iterator() for line in batch.tolist()]
    assert got == [line for line in lines if file_of(line) % 2 == worker_index]
    # the original pipeline is untouched
    assert [line for batch in dataset.as_numpy_iterator() for line in batch.tolist()] == lines


@pytest.mark.parametrize("policy", [Policy.FILE, Policy.AUTO])
@pytest.mark.parametrize("reader", ["TextLineDataset", "interleave"])
def test_file_sharding_of_shuffled_file_names_gives_disjoint_files_covering_all(tmp_path, policy, reader):
    # list_files shuffles by default, with a seed of its own in every process: the shard goes
    # below the shuffle, so the workers' files are disjoint and cover every file (as in TensorFlow).
    lines = write_text_files(tmp_path, num_files=8, lines_per_file=2)
    workers = 3
    seen: list[set[int]] = []
    for worker_index in range(workers):
        names = td.data.Dataset.list_files(str(tmp_path / "*.txt"))  # shuffled, unseeded
        if reader == "TextLineDataset":
            dataset = td.data.TextLineDataset(names)
        else:
            dataset = names.interleave(td.data.TextLineDataset, cycle_length=2)
        sharded, mode = auto_shard(dataset.batch(2), workers, worker_index, policy)
        assert mode is ShardMode.OWN
        got = [line for batch in sharded.as_numpy_iterator() for line in batch.tolist()]
        files = {file_of(line) for line in got}
        assert files == {f for f in range(8) if f % workers == worker_index}
        assert sorted(got) == sorted(line for line in lines if file_of(line) in files)
        seen.append(files)
    assert set().union(*seen) == set(range(8))


@pytest.mark.parametrize("num_workers", [1, 2])
def test_auto_shard_auto_without_files_keeps_the_data(num_workers):
    dataset = td.data.Dataset.range(8).batch(4)
    sharded, mode = auto_shard(dataset, num_workers, num_workers - 1, Policy.AUTO)
    assert mode is ShardMode.DATA
    assert [b.tolist() for b in sharded.as_numpy_iterator()] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("worker_index", [0, 1, 2])
def test_auto_shard_fills_shard_hints(worker_index):
    dataset = td.data.Dataset.range(10).shard(SHARD_HINT, SHARD_HINT).map(lambda x: x * 2)
    sharded, mode = auto_shard(dataset, 3, worker_index, Policy.HINT)
    assert mode is ShardMode.OWN
    assert [int(v) for v in sharded.as_numpy_iterator()] == [2 * v for v in range(worker_index, 10, 3)]


def test_auto_shard_file_errors(tmp_path):
    with pytest.raises(td.errors.NotFoundError):
        auto_shard(td.data.Dataset.range(4), 2, 0, Policy.FILE)
    write_text_files(tmp_path, num_files=1, lines_per_file=2)
    with pytest.raises(td.errors.InvalidArgumentError):
        auto_shard(text_dataset(tmp_path), 2, 0, Policy.FILE)


# the workers_with_data hook


class AgreeingWorkers:
    """A stand-in for the all-reduce: another worker still has data for ``extra`` more calls."""

    def __init__(self, extra: int) -> None:
        self.extra = extra
        self.calls: list[bool] = []

    def __call__(self, has_data: bool) -> list[bool]:
        self.calls.append(has_data)
        if has_data:
            return [True, True]
        self.extra -= 1
        return [False, self.extra >= 0]


@pytest.mark.parametrize("num_local", [1, 2])
def test_worker_without_data_gets_empty_pieces_while_others_have_data(num_local):
    hook = AgreeingWorkers(extra=2)
    strategy = mirrored_strategy_for(num_local)
    dist = worker_dataset(td.data.Dataset.range(8).batch(4), 2, 0, num_local, hook)
    iterator = iter(dist)

    steps = [pieces(strategy, x) for x in iterator]

    n = 2 * num_local
    own = [[b[i * (4 // n):(i + 1) * (4 // n)] for i in range(num_local)] for b in (np.arange(4), np.arange(4, 8))]
    assert len(steps) == 4
    for step, expected in zip(steps[:2], own, strict=True):
        assert [p.tolist() for p in step] == [e.tolist() for e in expected]
    for step in steps[2:]:
        assert [p.shape for p in step] == [(0,)] * num_local
        assert all(p.dtype == np.int64 for p in step)
    assert hook.calls == [True, True, False, False, False]
    with pytest.raises(StopIteration):
        next(iterator)


def test_hook_is_consulted_and_ends_iteration_when_no_worker_has_data():
    hook = AgreeingWorkers(extra=0)
    steps = list(worker_dataset(td.data.Dataset.range(8).batch(4), 2, 1, 1, hook))
    assert [np.asarray(s.values[0]).tolist() for s in steps] == [[2, 3], [6, 7]]
    assert hook.calls == [True, True, False]


def test_worker_with_no_data_at_all_still_follows_the_others():
    hook = AgreeingWorkers(extra=2)
    iterator = iter(worker_dataset(td.data.Dataset.range(0).batch(4), 2, 0, 1, hook))
    shapes = [np.asarray(x.values[0]).shape for x in iterator]
    assert shapes == [(0,), (0,)]
    assert hook.calls == [False, False, False]


# --- 4. foreign inputs -----------------------------------------------------------------------


def test_list_of_global_batches_is_split_like_a_dataset():
    strategy = mirrored_strategy_for(2)
    batches = [np.arange(5.0), np.arange(5.0, 8.0)]
    steps = list(strategy.experimental_distribute_dataset(batches))
    assert [[p.tolist() for p in pieces(strategy, x)] for x in steps] == [
        [[0.0, 1.0, 2.0], [3.0, 4.0]],
        [[5.0, 6.0], [7.0]],
    ]
    assert [float(strategy.reduce("MEAN", x, axis=0)) for x in steps] == [2.0, 6.0]


def test_list_of_tuples_keeps_components_aligned():
    strategy = mirrored_strategy_for(3)
    batches = [(np.arange(i, i + 4, dtype=np.float64), np.arange(i, i + 4) * 10) for i in (0, 4, 8)]
    xs, ys = [], []
    for x, y in strategy.experimental_distribute_dataset(batches):
        xs.extend(pieces(strategy, x))
        ys.extend(pieces(strategy, y))
    assert [len(p) for p in xs] == [2, 2, 0] * 3
    np.testing.assert_array_equal(np.concatenate(xs), np.arange(12.0))
    np.testing.assert_array_equal(np.concatenate(ys), np.arange(12) * 10)


def test_one_shot_generator_works_once():
    strategy = mirrored_strategy_for(2)
    dist = strategy.experimental_distribute_dataset(np.arange(i, i + 3) for i in (0, 3))
    first = [[p.tolist() for p in pieces(strategy, x)] for x in dist]
    assert first == [[[0, 1], [2]], [[3, 4], [5]]]
    with pytest.raises(ValueError, match="one-shot"):
        list(dist)


def test_element_spec_of_a_generator_does_not_use_it_up():
    strategy = mirrored_strategy_for(2)
    dist = strategy.experimental_distribute_dataset(np.arange(i, i + 3) for i in (0, 3))
    assert dist.element_spec is not None
    got = [p for x in dist for p in pieces(strategy, x)]
    np.testing.assert_array_equal(np.concatenate(got), np.arange(6))


def test_array_input_is_rejected_with_a_hint():
    with pytest.raises(TypeError, match="from_tensor_slices"):
        mirrored_strategy_for(2).experimental_distribute_dataset(np.arange(8))


@pytest.mark.parametrize("bad", ["abc", b"abc", 3, 2.5, {"a": np.arange(3)}, None])
def test_non_iterable_or_string_input_is_a_type_error(bad):
    with pytest.raises(TypeError):
        mirrored_strategy_for(2).experimental_distribute_dataset(bad)


def test_tf_data_dataset_input():
    tf = pytest.importorskip("tensorflow")
    strategy = mirrored_strategy_for(2)
    steps = list(strategy.experimental_distribute_dataset(tf.data.Dataset.range(14).batch(8)))
    assert [[p.tolist() for p in pieces(strategy, x)] for x in steps] == [
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [[8, 9, 10], [11, 12, 13]],
    ]


def test_torch_dataloader_input():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    strategy = mirrored_strategy_for(2)
    features = torch.arange(22, dtype=torch.float32).reshape(11, 2)
    labels = torch.arange(11) * 10
    loader = DataLoader(TensorDataset(features, labels), batch_size=4, shuffle=False)
    xs, ys = [], []
    for x, y in strategy.experimental_distribute_dataset(loader):
        x_parts, y_parts = pieces(strategy, x), pieces(strategy, y)
        assert [len(p) for p in x_parts] == [len(p) for p in y_parts]
        xs.extend(x_parts)
        ys.extend(y_parts)
    np.testing.assert_array_equal(np.concatenate(xs), features.numpy())
    np.testing.assert_array_equal(np.concatenate(ys), labels.numpy())


def test_towerdist_does_not_import_tensorflow_or_torch():
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import towerdist as td
        cpu = td.config.list_physical_devices("CPU")[0]
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * 2)
        strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        steps = list(strategy.experimental_distribute_dataset([np.arange(4), np.arange(4, 6)]))
        print(len(steps), "tensorflow" in sys.modules, "torch" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "False", "False"]


# --- 5. InputOptions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        td.distribute.InputOptions(experimental_fetch_to_device=False),
        td.distribute.InputOptions(experimental_per_replica_buffer_size=0),
        td.distribute.InputOptions(experimental_per_replica_buffer_size=3),
    ],
    ids=["no-fetch", "buffer-0", "buffer-3"],
)
@pytest.mark.parametrize("policy", [None, Policy.OFF])
def test_input_options_do_not_change_values(options, policy):
    strategy = mirrored_strategy_for(4)
    dataset = with_policy(td.data.Dataset.from_tensor_slices(float_rows(23)).batch(6), policy)
    default = [pieces(strategy, x) for x in strategy.experimental_distribute_dataset(dataset)]
    got = [pieces(strategy, x) for x in strategy.experimental_distribute_dataset(dataset, options)]
    assert len(got) == len(default) == 4
    for a, b in zip(got, default, strict=True):
        assert len(a) == len(b) == 4
        for pa, pb in zip(a, b, strict=True):
            np.testing.assert_array_equal(pa, pb)


@pytest.mark.parametrize("buffer_size", [0, 1, 3])
def test_per_replica_buffer_reads_exactly_that_many_steps_ahead(buffer_size):
    produced: list[int] = []

    def generate():
        for i in range(20):
            produced.append(i)
            yield np.arange(2 * i, 2 * i + 2)

    strategy = mirrored_strategy_for(2)
    dataset = td.data.Dataset.from_generator(generate, output_signature=td.TensorSpec((None,), np.int64))
    options = td.distribute.InputOptions(experimental_per_replica_buffer_size=buffer_size)
    iterator = iter(strategy.experimental_distribute_dataset(dataset, options))

    first = next(iterator)

    assert [p.tolist() for p in pieces(strategy, first)] == [[0], [1]]
    assert len(produced) == 1 + buffer_size  # the step returned, and buffer_size steps prepared
    rest = [p for x in iterator for p in pieces(strategy, x)]
    np.testing.assert_array_equal(np.concatenate(rest), np.arange(2, 40))


# --- 6. threads, errors and read-only input -----------------------------------------------------


@pytest.mark.timeout(60)
def test_prefetch_thread_ends_when_iterator_is_dropped():
    strategy = mirrored_strategy_for(2)
    dataset = td.data.Dataset.range(1000).batch(4).repeat().prefetch(2)  # endless: only closing stops it
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    assert [p.tolist() for p in pieces(strategy, next(iterator))] == [[0, 1], [2, 3]]
    assert any(t.is_alive() for t in prefetch_threads())  # the pipeline really runs a thread

    del iterator
    gc.collect()

    assert_prefetch_threads_end()


@pytest.mark.timeout(60)
def test_prefetch_thread_ends_after_a_full_pass_and_a_break():
    strategy = mirrored_strategy_for(2)
    dist = strategy.experimental_distribute_dataset(td.data.Dataset.range(10).batch(4).prefetch(2))
    assert sum(int(strategy.reduce("SUM", x, axis=0)) for x in dist) == 45
    for x in dist:
        assert pieces(strategy, x)[0].tolist() == [0, 1]
        break
    gc.collect()
    assert_prefetch_threads_end()


class PipelineError(Exception):
    pass


def _failing_on_batch(index: int):
    """A map function over ``range(12).batch(2)`` that raises on batch ``index``."""

    def fn(batch):
        if int(batch[0]) == 2 * index:
            raise PipelineError("bad batch")
        return batch

    return fn


def _outcomes(iterator: Any, method: str, calls: int, strategy: Any = None) -> list:
    """What ``calls`` calls of ``method`` give: each element as a list, "error" or "end".

    With a ``strategy``, a step is given as its replicas' pieces joined in replica order.
    """
    out: list = []
    for _ in range(calls):
        try:
            value = next_by(iterator, method)
        except PipelineError as error:
            out.append(("error", [note for note in error.__notes__ if "element" in note]))
        else:
            if value is END:
                out.append("end")
                continue
            parts = pieces(strategy, value) if strategy is not None else [np.asarray(value)]
            out.append(np.concatenate(parts).tolist())
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["next", "get_next", "get_next_as_optional"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["no-prefetch", "prefetch"])
@pytest.mark.parametrize("buffer_size", [0, 1, 3], ids=lambda n: f"buffer-{n}")
@pytest.mark.parametrize("failing", [0, 3], ids=["first-step-fails", "fourth-step-fails"])
def test_pipeline_error_surfaces_in_order_as_with_the_datasets_own_iterator(method, prefetch, buffer_size, failing):
    strategy = mirrored_strategy_for(2)
    dataset = td.data.Dataset.range(12).batch(2).map(_failing_on_batch(failing))
    if prefetch:
        dataset = dataset.prefetch(2)
    options = td.distribute.InputOptions(experimental_per_replica_buffer_size=buffer_size)
    iterator = iter(strategy.experimental_distribute_dataset(dataset, options))

    got = _outcomes(iterator, method, 6, strategy)

    # The steps read ahead before the failing one are delivered first, then the error (with
    # its note naming the element), then the end of the data: what the dataset's own iterator gives.
    error = ("error", [f"td.data.Dataset.map(): raised by the user function on element {failing} of its input."])
    assert got == [[0, 1], [2, 3], [4, 5]][:failing] + [error] + ["end"] * (5 - failing)
    assert got == _outcomes(iter(dataset), method, 6)
    del iterator
    gc.collect()
    assert_prefetch_threads_end()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["next", "get_next", "get_next_as_optional"])
def test_threads_sharing_one_distributed_iterator_get_every_step_once(method):
    strategy = mirrored_strategy_for(2)
    dataset = td.data.Dataset.range(4000).batch(4).prefetch(2)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    received: list[list[int]] = [[] for _ in range(6)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(received))

    def drain(out: list[int]) -> None:
        try:
            start.wait(timeout=30)
            while True:
                step = _outcomes(iterator, method, 1, strategy)[0]
                if step == "end":
                    return
                out.extend(step)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=drain, args=(out,), name=f"drain-{i}") for i, out in enumerate(received)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert [t.name for t in threads if t.is_alive()] == []
    assert errors == []
    assert sorted(v for out in received for v in out) == list(range(4000))


def _halve_in_place(x):
    x /= 2
    return x


@pytest.mark.parametrize(
    "distribute",
    [
        lambda s: s.experimental_distribute_dataset(td.data.Dataset.from_tensor_slices(float_rows(8)).batch(4).cache()),
        lambda s: s.experimental_distribute_dataset(
            td.data.Dataset.from_tensor_slices(float_rows(8)).batch(4).cache(), td.distribute.InputOptions(
                experimental_fetch_to_device=False)),
        lambda s: s.experimental_distribute_dataset(td.data.Dataset.from_tensors(float_rows(4)).repeat(2)),
        lambda s: s.experimental_distribute_dataset([float_rows(4), float_rows(4) + 10.0]),
        lambda s: s.distribute_datasets_from_function(
            lambda ctx: td.data.Dataset.from_tensor_slices(float_rows(8)).batch(2).cache()),
    ],
    ids=["cache", "cache-no-fetch", "from_tensors", "list-of-batches", "from-function-cache"],
)
def test_a_step_writing_into_its_input_cannot_change_a_later_epoch(distribute):
    strategy = mirrored_strategy_for(2)
    dist = distribute(strategy)
    expected = [[p.tolist() for p in pieces(strategy, x)] for x in dist]
    for x in dist:
        with pytest.raises(ValueError, match="read-only"):
            strategy.run(_halve_in_place, args=(x,))
    assert [[p.tolist() for p in pieces(strategy, x)] for x in dist] == expected
    halved = strategy.run(lambda x: x / 2, args=(next(iter(dist)),))  # a new array: what a step should compute
    assert [p.tolist() for p in pieces(strategy, halved)] == [(np.asarray(p) / 2).tolist() for p in expected[0]]
