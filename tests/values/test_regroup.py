"""How ``run`` hands values to replicas and merges their results (as observed in TensorFlow 2.21).

Inputs: every PerReplica/Mirrored leaf is replaced by component ``i`` for replica ``i``.
Outputs: regrouped **by identity** -- the same object from every replica is that object,
anything else becomes a PerReplica; lists/tuples/namedtuples/dicts are regrouped
element-wise; one replica never wraps.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import towerdist as td
from towerdist._src.values import regroup as regroup_lib

PerReplica = td.distribute.PerReplica
Mirrored = td.distribute.Mirrored
ValidationError = td.errors.ValidationError

NT = collections.namedtuple("NT", ["a", "b"])
SHARED = np.array(7.0, dtype=np.float32)  # ``shared = tf.constant(7.)`` created outside run


def rid() -> int:
    """The replica id as a Python int (``rid`` below)."""
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def assert_strategy_works(strategy):
    result = strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    expected = list(range(strategy.num_replicas_in_sync))
    assert [int(v) for v in strategy.experimental_local_results(result)] == expected


# --- what TensorFlow 2.21 returns on 2 replicas ----------------------------------------


def test_diff_tensors_give_per_replica(mirrored_strategy):
    result = mirrored_strategy.run(lambda: td.constant(float(rid())))
    assert isinstance(result, PerReplica)
    assert [v.item() for v in result.values] == [0.0, 1.0]
    assert [v.dtype for v in result.values] == [np.float32, np.float32]


def test_list_with_shared_int_and_replica_id(mirrored_strategy):
    result = mirrored_strategy.run(lambda: [1, rid()])
    assert type(result) is list
    assert result[0] == 1 and type(result[0]) is int
    assert isinstance(result[1], PerReplica)
    assert result[1].values == (0, 1)


def test_none_gives_none(mirrored_strategy):
    assert mirrored_strategy.run(lambda: None) is None


def test_namedtuple_of_shared_array_and_replica_id(mirrored_strategy):
    result = mirrored_strategy.run(lambda: NT(SHARED, rid()))
    assert type(result) is NT
    assert result.a is SHARED
    assert isinstance(result.b, PerReplica)
    assert result.b.values == (0, 1)


def test_different_python_ints_give_per_replica(mirrored_strategy):
    result = mirrored_strategy.run(rid)
    assert isinstance(result, PerReplica)
    assert result.values == (0, 1)


def test_same_python_int_is_returned_unwrapped(mirrored_strategy):
    assert mirrored_strategy.run(lambda: 5) == 5
    assert type(mirrored_strategy.run(lambda: 5)) is int


def test_replica_id_gives_per_replica_of_int32(mirrored_strategy):
    result = mirrored_strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    assert isinstance(result, PerReplica)
    assert [v.dtype for v in result.values] == [np.int32, np.int32]
    assert [int(v) for v in result.values] == [0, 1]


def test_same_shared_array_is_returned_as_the_same_object(mirrored_strategy):
    assert mirrored_strategy.run(lambda: SHARED) is SHARED


def test_comparison_results_regroup_per_replica_though_numpy_interns_them(mirrored_strategy):
    with mirrored_strategy.scope():
        v = td.Variable(15.0)
    result = mirrored_strategy.run(lambda: v > 12.0)  # numpy gives every replica its np.True_ singleton
    assert isinstance(result, PerReplica)
    assert [bool(r) for r in result.values] == [True, True]
    assert all(type(r) is np.bool_ for r in result.values)


@pytest.mark.replicas(4)
@pytest.mark.parametrize("value", [np.True_, np.False_])
def test_numpy_booleans_from_every_replica_give_a_per_replica(mirrored_strategy, value):
    result = mirrored_strategy.run(lambda: value)
    assert isinstance(result, PerReplica) and list(result.values) == [value] * 4


def test_python_booleans_keep_the_identity_rule(mirrored_strategy):
    assert mirrored_strategy.run(lambda: True) is True  # Python objects: TensorFlow's rule


@pytest.mark.replicas(1)
def test_one_replica_numpy_boolean_is_not_wrapped(mirrored_strategy):
    assert mirrored_strategy.run(lambda: np.float32(3.0) > 1.0) is np.True_


def test_equal_but_distinct_arrays_are_wrapped(mirrored_strategy):
    # Identity, not equality: equal values from different objects still give a PerReplica.
    result = mirrored_strategy.run(lambda: np.array(7.0))
    assert isinstance(result, PerReplica)
    assert result.values[0] is not result.values[1]


# --- containers -------------------------------------------------------------------------


def test_dict_result_keeps_key_order(mirrored_strategy):
    result = mirrored_strategy.run(lambda: {"b": rid(), "a": 1, "c": SHARED})
    assert type(result) is dict
    assert list(result) == ["b", "a", "c"]
    assert result["b"].values == (0, 1)
    assert result["a"] == 1
    assert result["c"] is SHARED


def test_dicts_with_the_same_keys_in_another_order_regroup_by_key(mirrored_strategy):
    result = mirrored_strategy.run(lambda: {"b": rid(), "a": 1} if rid() == 0 else {"a": 1, "b": rid()})
    assert list(result) == ["b", "a"]
    assert result["b"].values == (0, 1)
    assert result["a"] == 1


@pytest.mark.parametrize("mapping", [collections.OrderedDict, lambda items: collections.defaultdict(int, items)])
def test_dict_subclasses_keep_their_type(mirrored_strategy, mapping):
    result = mirrored_strategy.run(lambda: mapping([("z", rid()), ("y", 2)]))
    assert type(result) is type(mapping([]))
    assert list(result) == ["z", "y"]
    assert result["z"].values == (0, 1)


def test_tuple_result_stays_a_tuple(mirrored_strategy):
    result = mirrored_strategy.run(lambda: (SHARED, rid()))
    assert type(result) is tuple
    assert result[0] is SHARED
    assert result[1].values == (0, 1)


def test_nested_containers_regroup_leaf_by_leaf(mirrored_strategy):
    result = mirrored_strategy.run(lambda: {"x": [SHARED, (rid(), None)], "y": NT(3, rid() * 10)})
    assert result["x"][0] is SHARED
    assert result["x"][1][0].values == (0, 1)
    assert result["x"][1][1] is None
    assert result["y"].a == 3
    assert result["y"].b.values == (0, 10)


@pytest.mark.replicas(4)
def test_results_are_in_replica_order_on_four_replicas(mirrored_strategy):
    result = mirrored_strategy.run(lambda: rid() * 10)
    assert result.values == (0, 10, 20, 30)


# --- one replica ------------------------------------------------------------------------


@pytest.mark.replicas(1)
@pytest.mark.parametrize(
    "fn",
    [lambda: td.constant(3.0), rid, lambda: td.distribute.get_replica_context().replica_id_in_sync_group],
    ids=["array", "python-int", "replica-id"],
)
def test_one_replica_never_wraps(mirrored_strategy, fn):
    result = mirrored_strategy.run(fn)
    assert not isinstance(result, td.distribute.DistributedValues)


@pytest.mark.replicas(1)
def test_one_replica_returns_the_object_itself(mirrored_strategy):
    value = np.array([1.0, 2.0])
    assert mirrored_strategy.run(lambda: value) is value


@pytest.mark.replicas(1)
def test_one_replica_nested_result_is_plain(mirrored_strategy):
    result = mirrored_strategy.run(lambda: {"a": [td.constant(1.0), rid()]})
    assert result["a"][1] == 0
    assert not isinstance(result["a"][0], td.distribute.DistributedValues)


# --- distributed arguments returned unchanged ----------------------------------------------


def test_per_replica_argument_returned_unchanged_gives_a_new_per_replica(mirrored_strategy):
    arg = PerReplica([np.array(1.0), np.array(2.0)])
    result = mirrored_strategy.run(lambda x: x, args=(arg,))
    assert isinstance(result, PerReplica)
    assert result is not arg
    assert result.values[0] is arg.values[0]
    assert result.values[1] is arg.values[1]


def test_mirrored_argument_returned_unchanged_gives_a_per_replica(mirrored_strategy):
    arg = Mirrored([np.array(1.0), np.array(1.0)])
    result = mirrored_strategy.run(lambda x: x, args=(arg,))
    assert type(result) is PerReplica
    assert result.values[0] is arg.values[0]
    assert result.values[1] is arg.values[1]


def test_replicas_receive_their_component_of_args_and_kwargs(mirrored_strategy):
    pr = PerReplica(["a0", "a1"])
    mirrored = Mirrored(["m0", "m1"])
    result = mirrored_strategy.run(lambda x, y=None: (x, y), args=([pr, 5],), kwargs={"y": {"k": mirrored}})
    assert result[0][0].values == ("a0", "a1")
    assert result[0][1] == 5
    assert result[1]["k"].values == ("m0", "m1")


# --- mismatched structures --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "where"),
    [
        (lambda: [1] * (rid() + 1), "at the top level: a list of length 1 vs a list of length 2"),
        (lambda: [1] if rid() == 0 else (1,), "at the top level: a list of length 1 vs a tuple of length 1"),
        (lambda: {"a": 1} if rid() == 0 else {"b": 1}, "at the top level: a dict with keys"),
        (lambda: {"a": 1, "b": 2} if rid() == 0 else {"a": 1}, "at the top level: a dict with keys"),
        (lambda: [0, {"logits": [1] * (rid() + 1)}], "at [1]['logits']: a list of length 1 vs a list of length 2"),
        (lambda: [1, [2]] if rid() == 0 else [1, 2], "at [1]: a list of length 1 vs a leaf"),
        (lambda: None if rid() == 0 else [None], "at the top level"),
    ],
    ids=["list-lengths", "list-vs-tuple", "dict-keys", "dict-key-count", "nested-path", "list-vs-leaf", "none-vs-list"],
)
def test_mismatched_result_structures_raise_validation_error(mirrored_strategy, fn, where):
    with pytest.raises(ValidationError, match="The results of the replicas must have the same structure") as info:
        mirrored_strategy.run(fn)
    assert "replica 0 and replica 1 differ" in str(info.value)
    assert where in str(info.value)
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(4)
@pytest.mark.parametrize("odd_one", [1, 2, 3])
def test_mismatch_names_the_first_replica_that_differs(mirrored_strategy, odd_one):
    with pytest.raises(ValidationError, match="The results of the replicas must have the same structure") as info:
        mirrored_strategy.run(lambda: [1, 2] if rid() == odd_one else [1])
    assert f"replica 0 and replica {odd_one} differ" in str(info.value)
    assert_strategy_works(mirrored_strategy)


def test_validation_error_is_both_value_error_and_assertion_error():
    assert issubclass(ValidationError, ValueError)
    assert issubclass(ValidationError, AssertionError)


def test_mismatch_can_be_caught_as_assertion_error_like_tf(mirrored_strategy):
    with pytest.raises(AssertionError, match="The results of the replicas must have the same structure"):
        mirrored_strategy.run(lambda: [1] * (rid() + 1))
    assert_strategy_works(mirrored_strategy)


# --- select_replica / split_for_replicas ------------------------------------------------


def test_select_replica_replaces_distributed_leaves():
    structure = [PerReplica(["a", "b"]), 3, {"k": Mirrored(["c", "d"])}]
    assert regroup_lib.select_replica(1, structure) == ["b", 3, {"k": "d"}]
    assert regroup_lib.select_replica(0, structure) == ["a", 3, {"k": "c"}]


def test_select_replica_of_a_distributed_value_is_its_component():
    assert regroup_lib.select_replica(1, PerReplica(["a", "b"])) == "b"


def test_select_replica_without_distributed_leaves_returns_the_structure_itself():
    structure = [1, {"k": np.zeros(2)}]
    assert regroup_lib.select_replica(1, structure) is structure


def test_split_for_replicas_without_distributed_leaves_shares_the_structure():
    structure = ([1, 2], {"k": 3})
    parts = regroup_lib.split_for_replicas(structure, 3, "args")
    assert len(parts) == 3
    assert all(part is structure for part in parts)


def test_split_for_replicas_gives_each_replica_its_components():
    parts = regroup_lib.split_for_replicas((PerReplica([0, 1, 2]), "x"), 3, "args")
    assert parts == [(0, "x"), (1, "x"), (2, "x")]


@pytest.mark.parametrize(
    ("args", "kwargs", "where", "count"),
    [
        ((PerReplica([1, 2, 3]),), None, "args[0]", 3),
        (([0, {"k": PerReplica([1, 2, 3])}],), None, "args[0][1]['k']", 3),
        ((), {"k": PerReplica([1])}, "kwargs['k']", 1),
        ((Mirrored([1, 2, 3, 4]),), None, "args[0]", 4),
    ],
    ids=["args", "nested-args", "kwargs", "mirrored"],
)
def test_run_with_wrong_component_count_raises_value_error(mirrored_strategy, args, kwargs, where, count):
    with pytest.raises(ValueError, match="Strategy.run\\(\\) got a") as info:
        mirrored_strategy.run(lambda *a, **k: None, args=args, kwargs=kwargs)
    message = str(info.value)
    assert f"with {count} components at {where}" in message
    assert "the strategy has 2 replicas" in message
    assert_strategy_works(mirrored_strategy)


# --- local results ----------------------------------------------------------------------


def test_local_results_of_a_distributed_value_are_its_components():
    pr = PerReplica(["a", "b"])
    assert regroup_lib.local_results(pr, 2) == ("a", "b")


def test_local_results_of_a_nested_value_are_per_replica_copies():
    nested = [PerReplica(["a", "b"]), 5, {"k": Mirrored(["c", "d"])}]
    assert regroup_lib.local_results(nested, 2) == (["a", 5, {"k": "c"}], ["b", 5, {"k": "d"}])


@pytest.mark.parametrize("value", [7, np.array([1.0]), "text", None])
def test_local_results_of_a_plain_value_is_a_one_tuple(value):
    result = regroup_lib.local_results(value, 2)
    assert len(result) == 1 and result[0] is value


def test_experimental_local_results_of_a_dict_result_is_a_tuple_of_dicts(mirrored_strategy):
    result = mirrored_strategy.run(lambda: {"id": rid(), "same": 1})
    assert mirrored_strategy.experimental_local_results(result) == ({"id": 0, "same": 1}, {"id": 1, "same": 1})


@pytest.mark.replicas(4)
def test_experimental_local_results_of_run_result_are_in_replica_order(mirrored_strategy):
    assert mirrored_strategy.experimental_local_results(mirrored_strategy.run(rid)) == (0, 1, 2, 3)


# --- merge_call arguments ---------------------------------------------------------------


def merge_call(merge_fn, args=(), kwargs=None):
    return td.distribute.get_replica_context().merge_call(merge_fn, args=args, kwargs=kwargs)


def test_merge_call_shared_int_kwarg_arrives_as_int(mirrored_strategy):
    seen = []
    mirrored_strategy.run(lambda: merge_call(lambda strategy, y: seen.append(y), kwargs={"y": 3}))
    assert seen == [3]
    assert type(seen[0]) is int


def test_merge_call_equal_list_args_arrive_as_a_list(mirrored_strategy):
    seen = []
    mirrored_strategy.run(lambda: merge_call(lambda strategy, x: seen.append(x), args=([1, 2],)))
    assert seen == [[1, 2]]
    assert type(seen[0]) is list


def test_merge_call_different_args_arrive_as_per_replica(mirrored_strategy):
    seen = []
    mirrored_strategy.run(lambda: merge_call(lambda strategy, x: seen.append(x), args=(rid(),)))
    assert len(seen) == 1
    assert isinstance(seen[0], PerReplica)
    assert seen[0].values == (0, 1)


def test_merge_call_returning_the_per_replica_gives_each_replica_its_component(mirrored_strategy):
    result = mirrored_strategy.run(lambda: merge_call(lambda strategy, x: x, args=(rid() * 10,)))
    assert result.values == (0, 10)


def test_merge_call_returning_a_plain_list_gives_every_replica_that_list(mirrored_strategy):
    answer = [10, 20]
    got_it = mirrored_strategy.run(lambda: merge_call(lambda strategy: answer) is answer)
    assert got_it is True


# --- the regroup function itself --------------------------------------------------------


def test_regroup_of_the_same_object_is_that_object():
    value = object()
    assert regroup_lib.regroup([value, value, value]) is value


def test_regroup_of_distinct_objects_is_a_per_replica():
    a, b = object(), object()
    result = regroup_lib.regroup([a, b])
    assert type(result) is PerReplica
    assert result.values == (a, b)


def test_regroup_with_always_wrap_wraps_the_same_object():
    value = object()
    result = regroup_lib.regroup([value, value], always_wrap=True)
    assert isinstance(result, PerReplica)
    assert result.values == (value, value)


def test_regroup_with_wrap_class_mirrored():
    result = regroup_lib.regroup([np.array(1.0), np.array(1.0)], wrap_class=Mirrored)
    assert type(result) is Mirrored
