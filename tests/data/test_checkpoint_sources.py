"""Saving and restoring ``td.data`` iterators over sources, transformations without threads, files and loads.

Each pipeline is saved after ``k`` elements and restored into an iterator of a freshly built
identical pipeline (and, for a few, in a new Python process, where seeds drawn for the
process and in-memory caches are gone); the restored iterator must yield exactly what the
saved one yielded after the save (structure, dtypes, values). The positions cover the
start, the first element, the middle, the boundaries of batches and epochs, and the end.

A pipeline is Python source (``make()`` returns the dataset), so that the same definition
runs here and in the child process.
"""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import towerdist as td

from iterator_checkpoint_helpers import (
    assert_same_elements,
    restored_rest,
    restored_rest_in_subprocess,
    save_after,
)

D = td.data.Dataset
TESTS_DATA = os.path.dirname(os.path.abspath(__file__))
LINES = [3, 0, 5]  # the lines of the three text files


class Case(NamedTuple):
    source: str  # the expression make() returns
    length: int  # the elements of a whole pass
    boundaries: tuple[int, ...] = ()  # positions worth a save beside 0, 1, the middle and the end


def positions(case: Case) -> list[int]:
    n = case.length
    return sorted({p for p in (0, 1, n // 2, n - 1, n, *case.boundaries) if 0 <= p <= n})


CASES: dict[str, Case] = {
    # --- sources
    "from_tensor_slices": Case("D.from_tensor_slices(np.arange(12).reshape(6, 2))", 6),
    "from_tensor_slices_tuple": Case("D.from_tensor_slices((np.arange(5), np.arange(5.0) * 2))", 5),
    "from_tensor_slices_dict": Case(
        "D.from_tensor_slices({'a': np.arange(5), 'b': np.arange(10, dtype=np.float32).reshape(5, 2)})", 5
    ),
    "from_tensor_slices_namedtuple": Case("D.from_tensor_slices(Point(np.arange(4), np.arange(4) * 3))", 4),
    "from_tensor_slices_strings": Case("D.from_tensor_slices([b'a', b'bb', b'ccc', b'dddd', b'e'])", 5),
    "from_tensors": Case("D.from_tensors((np.arange(3), np.array(b'x', dtype=object)))", 1),
    "range": Case("D.range(7)", 7),
    "range_step": Case("D.range(2, 20, 3)", 6),
    "range_negative_step": Case("D.range(10, 0, -2)", 5),
    "range_int32": Case("D.range(-3, 3, output_type=np.int32)", 6),
    "counter": Case("D.counter(start=3, step=-2).take(7)", 7),
    "counter_float": Case("D.counter(0.5, 0.25, dtype=np.float32).take(5)", 5),
    "random_seeded": Case("D.random(seed=7).take(10)", 10),
    "random_unseeded": Case("D.random().take(10)", 10),
    "random_rerandomized_epochs": Case(
        "D.random(seed=7, rerandomize_each_iteration=True).take(3).repeat(3)", 9, (3, 6)
    ),
    "zip": Case("D.zip(D.range(5), D.from_tensor_slices(np.arange(10.0)))", 5),
    "zip_dict": Case("D.zip(datasets={'a': D.range(4), 'b': D.range(10, 16).batch(2)})", 3),
    # --- batching
    "batch": Case("D.range(10).batch(3)", 4, (3,)),
    "batch_drop_remainder": Case("D.range(10).batch(3, drop_remainder=True)", 3),
    "batch_of_tuples": Case("D.zip(D.range(7), D.from_tensor_slices(np.arange(14.0).reshape(7, 2))).batch(2)", 4),
    "batch_of_shuffled": Case("D.range(20).shuffle(8, seed=1).batch(3)", 7),  # batch runs a gather plan
    "unbatch": Case("D.range(12).batch(5).unbatch()", 12, (5, 10)),
    "unbatch_dict": Case("D.from_tensor_slices({'a': np.arange(12).reshape(4, 3)}).unbatch()", 12, (3, 6)),
    "rebatch": Case("D.range(10).batch(4).rebatch(3)", 4, (2,)),
    "rebatch_sizes": Case("D.range(12).batch(5).rebatch([2, 0, 3])", 8, (3, 4)),
    "rebatch_drop_remainder": Case("D.range(10).batch(4).rebatch(3, drop_remainder=True)", 3),
    # --- selecting and reordering
    "shuffle_seeded": Case("D.range(10).shuffle(4, seed=5)", 10, (6,)),
    "shuffle_unseeded": Case("D.range(10).shuffle(4)", 10, (6,)),
    "shuffle_whole": Case("D.range(9).shuffle(td.data.UNKNOWN_CARDINALITY, seed=3)", 9),
    "shuffle_strings": Case(
        "D.from_tensor_slices(np.array([b'a', b'b', b'c', b'd', b'e', b'f'], dtype=object)).shuffle(3, seed=1)", 6
    ),
    "shuffle_reshuffled_epochs": Case("D.range(6).shuffle(6, seed=2).repeat(3)", 18, (5, 6, 7, 12)),
    "shuffle_unseeded_epochs": Case("D.range(6).shuffle(6).repeat(3)", 18, (6, 12)),
    "shuffle_same_each_epoch": Case(
        "D.range(6).shuffle(6, seed=2, reshuffle_each_iteration=False).repeat(2)", 12, (6,)
    ),
    "repeat": Case("D.range(3).repeat(3)", 9, (3, 6)),
    "repeat_forever": Case("D.range(3).repeat().take(10)", 10, (3, 6, 9)),
    "repeat_empty_forever": Case("D.range(0).repeat()", 0),
    "take": Case("D.range(10).take(4)", 4),
    "take_all": Case("D.range(5).take(-1)", 5),
    # a pass that ended inside one that goes on (the last batch) still saves where its inputs stand
    "ended_passes_in_a_batch": Case("D.range(5).take(-1).take(-1).batch(2)", 3),
    "ended_passes_in_a_shuffle": Case("D.range(5).take(-1).take(-1).batch(2).shuffle(2, seed=0)", 3),
    "skip": Case("D.range(10).skip(3)", 7),
    "skip_all": Case("D.range(10).skip(-1)", 0),
    "shard": Case("D.range(11).shard(3, 1)", 4),
    "enumerate": Case("D.from_tensor_slices(np.arange(5.0)).enumerate(start=10)", 5),
    "cache_first_pass": Case("D.range(5).cache()", 5),
    "cache_later_pass": Case("D.range(5).cache().repeat(3)", 15, (5, 7, 10)),
    "with_options": Case("D.range(6).with_options(OPTIONS).batch(2)", 3),
    # --- combinators
    "concatenate": Case("D.range(3).concatenate(D.range(10, 14))", 7, (3, 4)),
    "concatenate_empty_first": Case("D.range(0).concatenate(D.range(4))", 4),
    "concatenate_unknown_specs": Case("SCANNED.concatenate(SCANNED)", 8, (4, 5)),
    "scan": Case("D.range(8).scan(np.int64(0), lambda s, x: (s + x, s))", 8),
    "scan_tuple_state": Case(
        "D.range(6).scan((np.int64(0), np.float32(1)), lambda s, x: ((s[0] + x, s[1] * 2), s))", 6
    ),
    "scan_dropping_failures": Case("D.range(8).scan(np.int64(0), failing_sum).ignore_errors()", 7, (3, 4)),
    "unique": Case("D.from_tensor_slices(np.array([3, 1, 3, 2, 1, 4, 2, 5])).unique()", 5),
    "unique_strings": Case("D.from_tensor_slices(np.array([b'x', b'y', b'x', b'z'], dtype=object)).unique()", 3),
    "take_while": Case("D.range(10).take_while(lambda x: x < 6)", 6),
    # the predicate ends the pass, then holds again: a restored batch must not read on
    "take_while_ended_in_batch": Case("D.range(10).take_while(lambda x: x % 5 != 4).batch(3)", 2),
    "ignore_errors": Case("D.range(8).ignore_errors()", 8),
    "ignore_errors_in_repeat": Case("D.range(4).take_while(failing_predicate).ignore_errors().repeat(2)", 6, (3,)),
    # --- files and loads
    "text_lines": Case("td.data.TextLineDataset(PLAIN)", 8, (3,)),
    "text_lines_gzip": Case("td.data.TextLineDataset(GZIPPED, compression_type='GZIP')", 8, (3,)),
    "text_lines_zlib": Case("td.data.TextLineDataset(ZLIBBED, compression_type='ZLIB')", 8, (3,)),
    "text_lines_of_listed_files": Case(
        "td.data.TextLineDataset(td.data.Dataset.list_files(DIR + '/*.txt', seed=4))", 8, (3,)
    ),
    "list_files_unseeded": Case("D.list_files(DIR + '/*.txt')", 3),
    "load_concatenated_shards": Case("D.load(DIR + '/saved', reader_func=concatenated)", 20, (7, 14)),
    "load_gzip_concatenated_shards": Case(
        "D.load(DIR + '/saved_gzip', compression='GZIP', reader_func=concatenated)", 20, (7,)
    ),
}

SUBPROCESS_CASES = [
    "from_tensor_slices_namedtuple",
    "random_unseeded",
    "shuffle_unseeded_epochs",
    "shuffle_strings",
    "cache_later_pass",
    "scan",
    "unique",
    "text_lines_gzip",
    "load_concatenated_shards",
]


# --- the pipelines' world: text files, a saved dataset --------------------------------------------


def _prelude(directory: str) -> str:
    """The code before ``make()``: imports, and the names the pipelines use."""
    return f"""
import functools, sys
import numpy as np
import towerdist as td
sys.path.insert(0, {TESTS_DATA!r})
from dataset_helpers import Point
D = td.data.Dataset
DIR = {directory!r}
PLAIN = [DIR + f'/plain{{i}}.txt' for i in range(3)]
GZIPPED = [DIR + f'/gzip{{i}}.gz' for i in range(3)]
ZLIBBED = [DIR + f'/zlib{{i}}.z' for i in range(3)]
OPTIONS = td.data.Options()
OPTIONS.experimental_distribute.auto_shard_policy = td.data.experimental.AutoShardPolicy.OFF
SCANNED = D.range(4).scan(np.int64(0), lambda s, x: (s + x, x * 10))

def concatenated(shards):
    return functools.reduce(D.concatenate, list(shards))

def failing_sum(s, x):
    if x == 3:
        raise ValueError("three")
    return s + x, s + x

def failing_predicate(x):
    if x == 1:
        raise ValueError("one")
    return x < 10
"""


def _make_world(directory: str) -> None:
    for i, n in enumerate(LINES):
        text = b"".join(b"file%d line %d\n" % (i, j) for j in range(n))
        with open(os.path.join(directory, f"plain{i}.txt"), "wb") as f:
            f.write(text.replace(b"line 1\n", b"line 1\r\n"))  # a Windows line ending too
        with gzip.open(os.path.join(directory, f"gzip{i}.gz"), "wb") as f:
            f.write(text)
        with open(os.path.join(directory, f"zlib{i}.z"), "wb") as f:
            f.write(zlib.compress(text))
    saved = os.path.join(directory, "saved")
    D.range(20).map(lambda x: (x, x * 2)).save(saved, shard_func=lambda x, _: x % 3)
    D.range(20).map(lambda x: (x, x * 2)).save(saved + "_gzip", compression="GZIP", shard_func=lambda x, _: x % 2)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = str(tmp_path_factory.mktemp("checkpoint_sources"))
    _make_world(directory)
    return directory


def _source(name: str, directory: str) -> str:
    return _prelude(directory) + f"\ndef make():\n    return {CASES[name].source}\n"


def _maker(name: str, directory: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(_source(name, directory), namespace)  # noqa: S102  (the test's own pipeline code)
    return namespace["make"]


def _params(names: list[str]) -> list[Any]:
    return [pytest.param(name, k, id=f"{name}-{k}") for name in names for k in positions(CASES[name])]


# --- every pipeline, at every position -----------------------------------------------------------


@pytest.mark.parametrize(("name", "k"), _params(list(CASES)))
def test_restored_iterator_yields_the_rest(world: str, name: str, k: int) -> None:
    make = _maker(name, world)
    saved = save_after(make, k)
    assert len(saved.head) == k
    assert len(saved.head) + len(saved.rest) == CASES[name].length
    assert_same_elements(saved.rest, restored_rest(make, saved.state))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("name", "k"), [pytest.param(n, CASES[n].length // 2 + 1, id=n) for n in SUBPROCESS_CASES])
def test_restored_in_a_new_process_yields_the_rest(world: str, name: str, k: int) -> None:
    saved = save_after(_maker(name, world), k)
    assert_same_elements(saved.rest, restored_rest_in_subprocess(_source(name, world), saved.state))


@pytest.mark.parametrize("name", ["shuffle_seeded", "shuffle_reshuffled_epochs", "text_lines_gzip", "scan"])
def test_a_position_restores_any_number_of_times(world: str, name: str) -> None:
    make = _maker(name, world)
    saved = save_after(make, 4)
    assert_same_elements(saved.rest, restored_rest(make, saved.state))
    assert_same_elements(saved.rest, restored_rest(make, saved.state))


@pytest.mark.parametrize("name", ["shuffle_seeded", "concatenate", "text_lines", "unique"])
def test_an_iterator_restored_into_itself_yields_the_rest(world: str, name: str) -> None:
    iterator = iter(_maker(name, world)())
    head = [next(iterator) for _ in range(3)]
    state = iterator._checkpoint_state()
    rest = list(iterator)
    iterator._checkpoint_restorer(state)()
    assert_same_elements(rest, list(iterator))
    assert len(head) == 3


def test_a_restored_iterator_saves_again(world: str) -> None:
    make = _maker("shuffle_reshuffled_epochs", world)
    saved = save_after(make, 4)
    iterator = iter(make())
    iterator._checkpoint_restorer(saved.state)()
    again = [next(iterator) for _ in range(5)]
    state = iterator._checkpoint_state()
    assert_same_elements(saved.rest[:5], again)
    assert_same_elements(saved.rest[5:], restored_rest(make, state))


def test_later_passes_of_a_restored_dataset_draw_as_the_saved_one_would(world: str) -> None:
    # An unseeded reshuffling shuffle: the restored dataset adopts the seed and the epoch count.
    make_saved = _maker("shuffle_unseeded", world)
    saved_dataset = make_saved()
    iterator = iter(saved_dataset)
    next(iterator)
    state = iterator._checkpoint_state()
    list(iterator)
    restored_dataset = make_saved()
    restored = iter(restored_dataset)
    restored._checkpoint_restorer(state)()
    list(restored)
    assert_same_elements(list(saved_dataset), list(restored_dataset))


# --- cache -------------------------------------------------------------------------------------


def _cached(path: str) -> D:
    return D.range(0, 15, 3).cache(path).repeat(2)


@pytest.mark.parametrize("k", [0, 2, 5, 7, 10])
def test_file_cache_restores(tmp_path: Any, k: int) -> None:
    path = str(tmp_path / "cache")
    saved = save_after(lambda: _cached(path), k)
    assert os.path.exists(path)
    assert_same_elements(saved.rest, restored_rest(lambda: _cached(path), saved.state))


def test_file_cache_read_while_saved_fails_to_restore_once_the_file_is_gone(tmp_path: Any) -> None:
    path = str(tmp_path / "cache")
    saved = save_after(lambda: _cached(path), 7)  # reading the file, in the second epoch
    os.unlink(path)
    iterator = iter(_cached(path))
    first = next(iterator)
    with pytest.raises(td.errors.NotFoundError, match="cannot restore the iterator: it was reading the cache file"):
        iterator._checkpoint_restorer(saved.state)()
    # the iterator is left as it was
    assert [int(first), *(int(v) for v in iterator)] == [0, 3, 6, 9, 12] * 2


def test_file_cache_filled_while_saved_restores_without_the_file(tmp_path: Any) -> None:
    path = str(tmp_path / "cache")
    make = lambda: D.range(5).cache(path)  # noqa: E731
    iterator = iter(make())
    next(iterator)
    state = iterator._checkpoint_state()
    iterator.close()  # an abandoned first pass writes no file
    assert not os.path.exists(path)
    assert [int(v) for v in restored_rest(make, state)] == [1, 2, 3, 4]
    assert os.path.exists(path)  # the restored pass completed the cache


def test_memory_cache_later_pass_restores_the_saved_elements_in_a_fresh_pipeline(world: str) -> None:
    # Restored where the cache is empty (a new pipeline), the reading pass reads the saved elements.
    make = _maker("cache_later_pass", world)
    saved = save_after(make, 7)
    dataset = make()
    iterator = iter(dataset)
    iterator._checkpoint_restorer(saved.state)()
    assert_same_elements(saved.rest, list(iterator))


# --- text files --------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["", "GZIP", "ZLIB"])
def test_text_lines_resume_in_the_middle_of_a_file(world: str, compression: str) -> None:
    files = {"": "PLAIN", "GZIP": "GZIPPED", "ZLIB": "ZLIBBED"}[compression]
    names = _maker("text_lines", world).__globals__[files]
    make = lambda: td.data.TextLineDataset(names, compression_type=compression)  # noqa: E731
    saved = save_after(make, 5)  # the third file's second line
    assert saved.head[-1] == b"file2 line 1"
    assert restored_rest(make, saved.state) == [b"file2 line 2", b"file2 line 3", b"file2 line 4"]


def test_text_lines_position_is_the_file_and_the_offset(world: str) -> None:
    names = _maker("text_lines", world).__globals__["PLAIN"]
    iterator = iter(td.data.TextLineDataset(names))
    for _ in range(2):
        next(iterator)
    fields = iterator._position()["cursor"]["fields"]
    assert fields == {"file": names[0], "offset": len(b"file0 line 0\nfile0 line 1\r\n")}


# --- load --------------------------------------------------------------------------------------


def test_load_with_the_default_reader_restores(world: str) -> None:
    make = lambda: D.load(os.path.join(world, "saved"))  # noqa: E731
    saved = save_after(make, 7)
    assert_same_elements(saved.rest, restored_rest(make, saved.state))


def test_load_restore_into_a_dataset_saved_again_names_the_shard_file(world: str, tmp_path: Any) -> None:
    path = str(tmp_path / "saved")
    D.range(6).save(path)
    make = lambda: D.load(path, reader_func=lambda shards: functools.reduce(D.concatenate, list(shards)))  # noqa: E731
    saved = save_after(make, 2)
    D.range(6).save(path)  # new shard files replace the old ones
    with pytest.raises(td.errors.NotFoundError, match="ShardFileDataset"):
        restored_rest(make, saved.state)


# --- a property over random pipelines ------------------------------------------------------------


def _total(value: Any) -> int:
    """The sum of every number in an element (what take_while's predicate in the property decides by)."""
    if isinstance(value, tuple):
        return sum(_total(v) for v in value)
    return int(np.sum(value))


def _apply(dataset: D, op: tuple[Any, ...]) -> D:
    name, *args = op
    if name == "batch":
        return dataset.batch(args[0], drop_remainder=args[1])
    if name == "unbatch":
        return dataset.unbatch()
    if name == "shuffle":
        return dataset.shuffle(args[0], seed=args[1], reshuffle_each_iteration=args[2])
    if name == "repeat":
        return dataset.repeat(args[0])
    if name == "take":
        return dataset.take(args[0])
    if name == "skip":
        return dataset.skip(args[0])
    if name == "shard":
        return dataset.shard(args[0], args[1] % args[0])
    if name == "enumerate":
        return dataset.enumerate(args[0])
    if name == "concatenate":
        return dataset.concatenate(dataset)
    if name == "zip":
        return D.zip(dataset, dataset)
    if name == "cache":
        return dataset.cache()
    if name == "rebatch":
        return dataset.rebatch(args[0])
    if name == "scan":
        return dataset.scan(np.int64(args[0]), lambda count, x: (count + 1, x))
    if name == "unique":
        return dataset.unique()
    if name == "take_while":
        limit = args[0]
        return dataset.take_while(lambda *x: np.bool_(_total(x) % 11 != limit))
    if name == "map":
        return dataset.map(_same, num_parallel_calls=args[0])
    if name == "filter":
        return dataset.filter(lambda *x: np.bool_(_total(x) % 3 != args[0]))
    if name == "prefetch":
        return dataset.prefetch(args[0])
    if name == "interleave":
        cycle, block, calls = args
        return dataset.interleave(
            lambda *x: D.from_tensors(_same(*x)).repeat(2), cycle_length=cycle, block_length=block, num_parallel_calls=calls
        )
    raise AssertionError(name)


def _same(*x: Any) -> Any:
    """An element as it came (a tuple element arrives as separate arguments)."""
    return x if len(x) > 1 else x[0]


@st.composite
def pipelines(draw: st.DrawFn) -> tuple[int, list[tuple[Any, ...]]]:
    """A range's size and a chain of operations on it that never batches elements of unequal shapes."""
    size = draw(st.integers(0, 12))
    ops: list[tuple[Any, ...]] = []
    levels: list[bool] = []  # per batch dimension of the elements: whether it is the same in every element
    unbatchable = 0  # the batch dimensions unbatch and rebatch can cut (none of a tuple made by enumerate)
    single = True  # the elements have one component (what unique() takes)
    for _ in range(draw(st.integers(1, 5))):
        choices = ["shuffle", "repeat", "take", "skip", "shard", "enumerate", "concatenate", "zip", "cache"]
        choices += ["scan", "take_while", "map", "filter", "prefetch"]
        if all(levels):
            choices += ["batch", "interleave"]
        if unbatchable:
            choices += ["unbatch", "rebatch"]
        if single:
            choices.append("unique")
        name = draw(st.sampled_from(choices))
        if name == "batch":
            ops.append((name, draw(st.integers(1, 4)), draw(st.booleans())))
            levels.append(ops[-1][2])  # a batch without drop_remainder may end short
            unbatchable += 1
        elif name == "unbatch":
            ops.append((name,))
            levels.pop()
            unbatchable -= 1
        elif name == "rebatch":
            ops.append((name, draw(st.integers(1, 3))))
            levels[-1] = False
        elif name == "shuffle":
            ops.append((name, draw(st.integers(1, 6)), draw(st.integers(0, 3)), draw(st.booleans())))
        elif name == "repeat":
            ops.append((name, draw(st.integers(0, 3))))
        elif name in ("take", "skip"):
            ops.append((name, draw(st.integers(-1, 8))))
        elif name == "shard":
            ops.append((name, draw(st.integers(1, 3)), draw(st.integers(0, 2))))
        elif name == "enumerate":
            ops.append((name, draw(st.integers(-3, 3))))
            unbatchable, single = 0, False
        elif name == "zip":
            ops.append((name,))
            single = False
        elif name == "scan":
            ops.append((name, draw(st.integers(0, 5))))
        elif name == "take_while":
            ops.append((name, draw(st.integers(0, 10))))
        elif name == "map":
            ops.append((name, draw(st.sampled_from([None, 2]))))
        elif name == "filter":
            ops.append((name, draw(st.integers(0, 2))))
        elif name == "prefetch":
            ops.append((name, draw(st.integers(0, 3))))
        elif name == "interleave":
            cycle = draw(st.integers(1, 3))
            ops.append((name, cycle, draw(st.integers(1, 2)), draw(st.sampled_from([None, *range(1, cycle + 1)]))))
        else:
            ops.append((name,))
    return size, ops


@settings(max_examples=300, deadline=None)
@given(pipelines(), st.floats(0, 1))
def test_random_pipelines_restore_exactly(pipeline: tuple[int, list[tuple[Any, ...]]], where: float) -> None:
    size, ops = pipeline

    def make() -> D:
        return functools.reduce(_apply, ops, D.range(size))

    whole = list(make())
    k = int(where * len(whole))
    saved = save_after(make, k)
    assert_same_elements(whole[:k], saved.head)
    assert_same_elements(whole[k:], saved.rest)
    assert_same_elements(saved.rest, restored_rest(make, saved.state))
