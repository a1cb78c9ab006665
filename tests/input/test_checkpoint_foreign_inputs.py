"""Foreign inputs (an iterable of global batches) keep their position in Python: saving an iterator over one
follows the external-state policy as a ``from_generator`` source does (see tests/data/test_checkpoint_options.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.input.foreign import as_dataset

Policy = td.data.experimental.ExternalStatePolicy
BATCHES = [np.arange(4) + 4 * k for k in range(3)]


def _dataset(policy: Policy | None, source: Any = None) -> td.data.Dataset:
    options = td.data.Options()
    if policy is not None:  # None: left unset (setting None is a TypeError, as in TF)
        options.experimental_external_state_policy = policy
    return as_dataset(list(BATCHES) if source is None else source).with_options(options)


def _values(iterator: Any) -> list[list[int]]:
    return [np.asarray(batch).tolist() for batch in iterator]


def test_unset_policy_refuses_an_iterable() -> None:
    iterator = iter(_dataset(None))
    next(iterator)
    with pytest.raises(td.errors.FailedPreconditionError, match=r"its pipeline keeps state outside itself \(a list"):
        iterator._checkpoint_state()
    assert _values(iterator) == [[4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("policy", [Policy.WARN, Policy.IGNORE])
def test_an_iterable_cannot_be_saved_in_the_middle_of_its_pass(policy: Policy) -> None:
    iterator = iter(_dataset(policy))
    next(iterator)
    with pytest.raises(
        td.errors.UnimplementedError, match="a list iterated as a dataset: its position cannot be saved"
    ):
        iterator._checkpoint_state()
    assert _values(iterator) == [[4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("policy", [Policy.WARN, Policy.IGNORE])
def test_an_iterable_saved_before_its_first_batch_restores_from_its_start(policy: Policy) -> None:
    state = iter(_dataset(policy))._checkpoint_state()
    restored = iter(_dataset(policy))
    restored._checkpoint_restorer(state)()
    assert _values(restored) == [batch.tolist() for batch in BATCHES]


def test_a_one_shot_iterable_saved_before_its_first_batch_restores_in_a_fresh_pipeline() -> None:
    state = iter(_dataset(Policy.IGNORE, iter(BATCHES)))._checkpoint_state()
    restored = iter(_dataset(Policy.IGNORE, iter(BATCHES)))
    restored._checkpoint_restorer(state)()
    assert _values(restored) == [batch.tolist() for batch in BATCHES]
