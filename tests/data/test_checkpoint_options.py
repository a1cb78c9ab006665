"""The options that steer saving an iterator: ``experimental_external_state_policy`` and
``experimental_symbolic_checkpoint``, as TensorFlow 2.16 applies them to a checkpoint.

TensorFlow (observed): with the policy unset a checkpoint applies FAIL, and a ``from_generator``
pipeline raises ``FailedPreconditionError`` ("PyFunc is stateful"); under WARN it logs that and
IGNORE does not, and then the generator still cannot be saved (``UnimplementedError``:
"GeneratorDataset does not support checkpointing"). Symbolic checkpointing refuses ``cache()``
("CacheDatasetV2 does not support symbolic checkpointing").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import towerdist as td

from iterator_checkpoint_helpers import assert_same_elements, restored_rest

D = td.data.Dataset
Policy = td.data.experimental.ExternalStatePolicy


def numbers() -> Iterator[np.int64]:
    yield from (np.int64(i) for i in range(6))


def _generated(policy: Policy | None) -> D:
    dataset = D.from_generator(numbers, output_signature=td.TensorSpec((), np.int64)).batch(4)
    options = td.data.Options()
    if policy is not None:  # None: left unset (setting None is a TypeError, as in TF)
        options.experimental_external_state_policy = policy
    return dataset.with_options(options)


def _values(elements: list[np.ndarray]) -> list[list[int]]:
    return [np.asarray(e).tolist() for e in elements]


# --- experimental_external_state_policy --------------------------------------------------------------


def test_the_policy_is_unset_by_default() -> None:
    assert td.data.Options().experimental_external_state_policy is None


@pytest.mark.parametrize(
    ("policy", "setting"),
    [(None, "unset, which means FAIL for a checkpoint"), (Policy.FAIL, "is FAIL")],
    ids=["unset", "fail"],
)
@pytest.mark.parametrize("steps", [0, 1, 2], ids=["before_the_first", "in_the_middle", "after_the_generator_ended"])
def test_fail_or_unset_refuses_a_generator_pipeline(policy: Policy | None, setting: str, steps: int) -> None:
    iterator = iter(_generated(policy))
    for _ in range(steps):
        next(iterator)
    with pytest.raises(
        td.errors.FailedPreconditionError, match="cannot save the iterator: its pipeline keeps state"
    ) as caught:
        iterator._checkpoint_state()
    assert "Dataset.from_generator(numbers): the generator's position" in str(caught.value)
    assert setting in str(caught.value)
    assert _values(list(iterator)) == [[0, 1, 2, 3], [4, 5]][steps:]  # the iterator goes on


@pytest.mark.parametrize("policy", [Policy.WARN, Policy.IGNORE])
def test_warn_or_ignore_cannot_save_a_generator_in_the_middle_of_its_pass(policy: Policy) -> None:
    iterator = iter(_generated(policy))
    next(iterator)
    with pytest.raises(td.errors.UnimplementedError, match="cannot be saved in the middle of a pass") as caught:
        iterator._checkpoint_state()
    assert "Dataset.from_generator(numbers): the generator's position" in str(caught.value)
    assert "GeneratorDataset does not support checkpointing" in str(caught.value)
    assert _values(list(iterator)) == [[4, 5]]  # the iterator goes on


@pytest.mark.parametrize("policy", [Policy.WARN, Policy.IGNORE])
def test_warn_or_ignore_save_a_generator_before_its_first_element(policy: Policy) -> None:
    iterator = iter(_generated(policy))
    state = iterator._checkpoint_state()
    assert _values(restored_rest(lambda: _generated(policy), state)) == [[0, 1, 2, 3], [4, 5]]
    assert _values(list(iterator)) == [[0, 1, 2, 3], [4, 5]]


@pytest.mark.parametrize("policy", [Policy.WARN, Policy.IGNORE])
def test_warn_or_ignore_save_a_generator_after_its_end(policy: Policy) -> None:
    iterator = iter(_generated(policy))
    next(iterator)
    next(iterator)  # the generator has ended; the batch above it is still open
    state = iterator._checkpoint_state()
    assert restored_rest(lambda: _generated(policy), state) == []


def test_warn_logs_the_state_it_does_not_save(caplog: pytest.LogCaptureFixture) -> None:
    iterator = iter(_generated(Policy.WARN))
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        iterator._checkpoint_state()
    messages = [record.getMessage() for record in caplog.records if record.name == "towerdist"]
    assert len(messages) == 1
    assert messages[0].startswith(
        "Saving the iterator's position without the state its pipeline keeps outside itself: "
        "Dataset.from_generator(numbers): the generator's position."
    )
    assert caplog.records[-1].levelno == logging.WARNING


def test_ignore_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    iterator = iter(_generated(Policy.IGNORE))
    with caplog.at_level(logging.DEBUG, logger="towerdist"):
        iterator._checkpoint_state()
    assert [r for r in caplog.records if r.name == "towerdist"] == []


def test_a_pipeline_without_external_state_saves_under_any_policy(caplog: pytest.LogCaptureFixture) -> None:
    make: Callable[[], D] = lambda: D.range(6).shuffle(3).batch(2)  # noqa: E731
    iterator = iter(make())
    next(iterator)
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        state = iterator._checkpoint_state()
    assert caplog.records == []
    assert_same_elements(list(iterator), restored_rest(make, state))


def test_the_policy_of_an_upstream_with_options_applies() -> None:
    options = td.data.Options()
    options.experimental_external_state_policy = Policy.IGNORE
    generated = D.from_generator(numbers, output_signature=td.TensorSpec((), np.int64)).with_options(options)
    iterator = iter(generated.batch(4))
    state = iterator._checkpoint_state()  # IGNORE: saved before the first element
    assert len(state) > 0


def test_a_generator_pass_that_ended_is_dropped_by_concatenate_and_saves_under_the_default() -> None:
    make = lambda: D.from_generator(numbers, output_signature=td.TensorSpec((), np.int64)).concatenate(D.range(3))  # noqa: E731
    iterator = iter(make())
    for _ in range(7):
        next(iterator)
    state = iterator._checkpoint_state()  # the generator's pass is over: no state outside the pipeline is open
    assert [int(v) for v in restored_rest(make, state)] == [1, 2]


# --- experimental_symbolic_checkpoint -------------------------------------------------------------


def _symbolic(dataset: D) -> D:
    options = td.data.Options()
    options.experimental_symbolic_checkpoint = True
    return dataset.with_options(options)


@pytest.mark.parametrize("filename", ["", "FILE"], ids=["memory", "file"])
def test_symbolic_checkpoint_refuses_cache(filename: str, tmp_path) -> None:
    path = str(tmp_path / "cache") if filename else ""
    iterator = iter(_symbolic(D.range(6).cache(path).batch(2)))
    next(iterator)
    with pytest.raises(
        td.errors.UnimplementedError,
        match="cannot save the iterator: CacheDataset does not support symbolic checkpointing",
    ):
        iterator._checkpoint_state()
    assert _values(list(iterator)) == [[2, 3], [4, 5]]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: _symbolic(D.range(20).shuffle(5, seed=2).batch(3)), id="shuffle_batch"),
        pytest.param(lambda: _symbolic(D.range(4).repeat(3).skip(1).take(9).enumerate()), id="repeat_skip_take"),
        pytest.param(lambda: _symbolic(D.range(3).cache().concatenate(D.range(5))), id="cache_pass_over"),
    ],
)
def test_symbolic_checkpoint_restores_the_same_continuation(make: Callable[[], D]) -> None:
    iterator = iter(make())
    for _ in range(4):
        next(iterator)
    state = iterator._checkpoint_state()
    assert_same_elements(list(iterator), restored_rest(make, state))


def test_symbolic_checkpoint_is_unset_by_default_and_cache_saves_then() -> None:
    assert td.data.Options().experimental_symbolic_checkpoint is None
    make = lambda: D.range(6).cache().batch(2)  # noqa: E731
    iterator = iter(make())
    next(iterator)
    assert _values(restored_rest(make, iterator._checkpoint_state())) == [[2, 3], [4, 5]]
