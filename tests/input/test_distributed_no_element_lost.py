"""The distributed iterator never loses a step's elements read before an input error.

Every element the pipeline gave before its error reaches a replica, in the step read before the
error (replicas without data get empty batches, as at the end of the data); then the error is
raised and the pass ends. The goldens were observed with TensorFlow 2.21 (CPU, eager, two logical
CPUs) on the same pipelines; where they differ, it is because TensorFlow's ``batch`` drops the
elements of a short batch read before the error (``tests/data/test_no_element_lost.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import towerdist as td

ERR, END = "ERR", "END"


class Broken(ValueError):
    """The input's error."""


# A generator's ValueError surfaces as TensorFlow's InvalidArgumentError, the original as its cause.
INPUT_ERRORS = (Broken, td.errors.InvalidArgumentError)


def is_input_error(error: BaseException) -> bool:
    return isinstance(error, Broken) or isinstance(error.__cause__, Broken)


def failing(k: int, n: int = 12) -> td.data.Dataset:
    """``from_generator`` over ``0, 1, ..., n - 1``, raising ``Broken`` at element ``k``."""

    def gen():
        for i in range(n):
            if i == k:
                raise Broken(f"record {i} is corrupt")
            yield i

    return td.data.Dataset.from_generator(gen, output_signature=td.TensorSpec((), td.int64))


def outcome(strategy: td.distribute.Strategy, dist: Any, limit: int = 10) -> list[Any]:
    """Each step as a list of per-replica lists, ``ERR`` for the input's error, ``END``."""
    out: list[Any] = []
    iterator = iter(dist)
    for _ in range(limit):
        try:
            step = next(iterator)
        except StopIteration:
            out.append(END)
            break
        except INPUT_ERRORS as error:
            assert is_input_error(error), error
            out.append(ERR)
            continue
        out.append([np.asarray(v).tolist() for v in strategy.experimental_local_results(step)])
    return out


@pytest.mark.replicas(2)
@pytest.mark.parametrize("buffer_size", [0, 1, 3])
def test_distributed_dataset_delivers_the_short_step_read_before_an_input_error(mirrored_strategy, buffer_size):
    # TF 2.21: [[[0, 1], [2, 3]], ERR, END] (its batch(4) drops the [4] read before the error).
    options = td.distribute.InputOptions(experimental_per_replica_buffer_size=buffer_size)
    dist = mirrored_strategy.experimental_distribute_dataset(failing(5).batch(4), options)
    assert outcome(mirrored_strategy, dist) == [[[0, 1], [2, 3]], [[4], []], ERR, END]


@pytest.mark.replicas(2)
def test_distributed_prefetched_dataset_delivers_every_step_before_an_input_error(mirrored_strategy):
    # TF 2.21: [[[0, 1], [2, 3]], ERR, END] (as above).
    dist = mirrored_strategy.experimental_distribute_dataset(failing(5).batch(4).prefetch(2))
    assert outcome(mirrored_strategy, dist) == [[[0, 1], [2, 3]], [[4], []], ERR, END]


@pytest.mark.replicas(2)
def test_datasets_from_function_deliver_the_elements_of_a_step_cut_short_by_an_input_error(mirrored_strategy):
    # TF 2.21: [[[0, 1], [2, 3]], ERR, END] (its batch(2) drops the [4] read before the error).
    dist = mirrored_strategy.distribute_datasets_from_function(lambda context: failing(5).batch(2))
    assert outcome(mirrored_strategy, dist) == [[[0, 1], [2, 3]], [[4], []], ERR, END]


@pytest.mark.replicas(2)
def test_per_replica_datasets_deliver_the_other_replicas_elements_of_a_failing_step(mirrored_strategy):
    # One pipeline per replica (InputReplicationMode.PER_REPLICA): replica 1's fails at its third
    # batch; replica 0's batch of that step is delivered before the error (replica 1 gets an empty
    # batch, as when its pipeline ends first). No TensorFlow golden: this case is towerdist's rule.
    def dataset_fn(context):
        base = context.input_pipeline_id * 10
        if context.input_pipeline_id == 1:
            return failing(2).map(lambda x: x + base).batch(1)
        return td.data.Dataset.range(5).map(lambda x: x + base).batch(1)

    options = td.distribute.InputOptions(
        experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=False,
        experimental_fetch_to_device=True,
    )
    dist = mirrored_strategy.distribute_datasets_from_function(dataset_fn, options)
    out = outcome(mirrored_strategy, dist)
    assert out == [[[0], [10]], [[1], [11]], [[2], []], ERR, END]
