"""What the ``test_dataset_*.py`` files of ``td.data``'s core share: small datasets, failing generators, thread checks.

Together, those files test the following.

Tests of ``td.data``: sources, transformations, cardinality, element specs, options and iterators.

Expected values follow TensorFlow's ``tf.data`` (checked against TensorFlow where the
behaviour is observable).
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np

import towerdist as td

D = td.data.Dataset
INF = td.data.INFINITE_CARDINALITY
UNK = td.data.UNKNOWN_CARDINALITY

Point = collections.namedtuple("Point", ["x", "y"])


# --- helpers ---------------------------------------------------------------------------------


def ints(dataset: D) -> list[int]:
    """The elements of a dataset of scalars, as Python ints."""
    return [int(v) for v in dataset]


def rows(dataset: D) -> list[list[int]]:
    """The elements of a dataset of vectors, as lists of Python ints."""
    return [np.asarray(v).tolist() for v in dataset]


def named_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def assert_threads_gone(prefix: str, before: set[threading.Thread], timeout: float = 15.0) -> None:
    """Every thread named ``prefix*`` started after ``before`` was taken has ended (bounded joins)."""
    deadline = time.monotonic() + timeout
    for thread in named_threads(prefix):
        if thread not in before:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in named_threads(prefix) if t not in before and t.is_alive()]
    assert alive == [], f"threads still alive: {alive}"


def new_threads(prefix: str, before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in named_threads(prefix) if t not in before and t.is_alive()]


def failing_at(index: int, error: BaseException):
    """A map function that returns its argument, except at ``index`` where it raises ``error``."""

    def fn(x):
        if int(x) == index:
            raise error
        return x

    return fn


def generator_failing_after(count: int):
    def gen():
        yield from range(count)
        raise KeyError("generator broke")

    return gen
