"""What the checkpoint tests of ``td.data`` share: save an iterator after ``k`` elements, restore it, compare.

``save_after(make, k)`` runs a pass of ``make()`` for ``k`` elements, saves the iterator's
position (the bytes a ``td.train.Checkpoint`` stores) and runs the pass on to its end: the
continuation an uninterrupted run yields. ``restored_rest(make, saved)`` restores the
position into an iterator of a freshly built pipeline in this process and returns what it
yields; ``restored_rest_in_subprocess(source, saved)`` does the same in a new Python
process, where ``source`` is Python code defining ``make()`` (so seeds drawn for a process,
and everything else held in memory, are really gone). ``assert_same_elements`` compares two
streams by structure, dtype and value.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import towerdist as td
from towerdist._src import nest
from towerdist._src.data import state_codec

TEST_PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools", "test_programs")
SUBPROCESS_TIMEOUT = 120


class Saved(NamedTuple):
    head: list[Any]  # the elements before the save
    state: bytes  # the saved position
    rest: list[Any]  # what the saved iterator yields after the save (the uninterrupted continuation)


def take(iterator: Any, k: int) -> list[Any]:
    out = []
    for _ in range(k):
        try:
            out.append(next(iterator))
        except StopIteration:
            break
    return out


def save_after(make: Callable[[], td.data.Dataset], k: int) -> Saved:
    """Saves a pass of ``make()`` after ``k`` elements, then runs it to the end."""
    iterator = iter(make())
    head = take(iterator, k)
    state = iterator._checkpoint_state()
    rest = list(iterator)
    return Saved(head, state, rest)


def restored_rest(make: Callable[[], td.data.Dataset], state: bytes) -> list[Any]:
    """What an iterator of a new ``make()`` yields once restored at ``state``."""
    iterator = iter(make())
    iterator._checkpoint_restorer(state)()
    return list(iterator)


def restored_rest_in_subprocess(source: str, state: bytes, timeout: float = SUBPROCESS_TIMEOUT) -> list[Any]:
    """``restored_rest`` in a new Python process; ``source`` defines ``make()``."""
    with tempfile.TemporaryDirectory() as directory:
        state_path = os.path.join(directory, "state.bin")
        out_path = os.path.join(directory, "rest.bin")
        with open(state_path, "wb") as f:
            f.write(state)
        program = os.path.join(TEST_PROGRAMS, "iterator_restore_child.py")
        completed = subprocess.run(
            [sys.executable, program, state_path, out_path],
            input=source,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        assert completed.returncode == 0, f"the child failed:\n{completed.stdout}\n{completed.stderr}"
        with open(out_path, "rb") as f:
            rest: list[Any] = state_codec.decode(f.read())
        return rest


def assert_same_elements(expected: list[Any], actual: list[Any]) -> None:
    """Both streams hold the same elements, in order: same structure, dtypes and values."""
    assert len(actual) == len(expected), f"{len(actual)} elements where {len(expected)} were expected"
    for k, (want, got) in enumerate(zip(expected, actual)):
        want_leaves, want_tree = nest.flatten(want)
        got_leaves, got_tree = nest.flatten(got)
        assert got_tree == want_tree, f"element {k}: structure {got_tree} where {want_tree} was expected"
        for a, b in zip(want_leaves, got_leaves):
            if isinstance(a, td.data.Dataset):
                assert_same_elements(list(a), list(b))
                continue
            assert type(b) is type(a), f"element {k}: a {type(b).__name__} where a {type(a).__name__} was expected"
            if isinstance(a, (np.ndarray, np.generic)):
                assert b.dtype == a.dtype, f"element {k}: dtype {b.dtype} where {a.dtype} was expected"
            assert np.array_equal(np.asarray(a), np.asarray(b)), f"element {k}: {b!r} where {a!r} was expected"
