"""Failures raised deep without the public API's name, worded by the public method (failures.py)."""

from __future__ import annotations

import pytest

import towerdist as td
from towerdist._src.failures import API, name_api, unworded, worded_at


def test_an_unworded_builtin_error_gets_the_api_in_front_and_keeps_its_class() -> None:
    with pytest.raises(TypeError, match=r"^Dataset\.batch\(\) takes an integer batch_size\.$"):
        with worded_at("Dataset.batch()"):
            raise unworded(TypeError("takes an integer batch_size."))


def test_an_op_error_keeps_its_code_and_details_and_its_message_attribute_is_worded() -> None:
    with pytest.raises(td.errors.InvalidArgumentError) as caught:
        with worded_at("Strategy.reduce()"):
            raise unworded(td.errors.InvalidArgumentError("got shapes (2,) and (3,).", replica=1))
    assert caught.value.message == "Strategy.reduce() got shapes (2,) and (3,)."
    assert str(caught.value) == caught.value.message
    assert caught.value.error_code == td.errors.INVALID_ARGUMENT
    assert caught.value.replica == 1


def test_a_context_error_records_the_api() -> None:
    with pytest.raises(td.errors.ContextError) as caught:
        with worded_at("ReplicaContext.merge_call()"):
            raise unworded(td.errors.ContextError("must be called in a replica context."))
    assert caught.value.api == "ReplicaContext.merge_call()"


def test_the_innermost_public_method_names_itself_once() -> None:
    with pytest.raises(ValueError, match=r"^Dataset\.padded_batch\(\) needs padded_shapes\.$"):
        with worded_at("Dataset.padded_batch_to_bucket()"):
            with worded_at("Dataset.padded_batch()"):
                raise unworded(ValueError("needs padded_shapes."))


def test_a_worded_or_unmarked_error_passes_through_untouched() -> None:
    error = ValueError("Strategy.run() takes a callable.")
    name_api(error, "Dataset.map()")
    assert error.args == ("Strategy.run() takes a callable.",)
    with pytest.raises(KeyError) as caught:
        with worded_at("Dataset.map()"):
            raise KeyError("x")
    assert caught.value.args == ("x",)


def test_a_failure_may_ask_for_a_colon_after_the_api() -> None:
    with pytest.raises(ValueError, match=r"^SGD\.apply_gradients\(\): the gradient of v has shape \(2,\)\.$"):
        with worded_at("SGD.apply_gradients()"):
            raise unworded(ValueError("the gradient of v has shape (2,)."), separator=": ")


def test_a_failure_may_name_the_api_in_the_middle_of_its_message() -> None:
    with pytest.raises(ValueError, match=r"^Reducing needs numbers \(Strategy\.reduce\(\)\)\. Got dtype <U1\.$"):
        with worded_at("Strategy.reduce()"):
            raise unworded(ValueError(f"Reducing needs numbers ({API}). Got dtype <U1."))
