"""``ReplicaContext``: merge_call, all_reduce, all_gather, as TensorFlow 2.21 behaves and documents them."""

from __future__ import annotations

import re
import traceback

import numpy as np
import optree
import pytest

import towerdist as td
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from conftest import mirrored_param


def ctx() -> td.distribute.ReplicaContext:
    return td.distribute.get_replica_context()


def rid() -> int:
    return int(ctx().replica_id_in_sync_group)


def local(strategy, value):
    return strategy.experimental_local_results(value)


# --- all_reduce ---------------------------------------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_all_reduce_doc_example_of_a_scalar(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    result = local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce(td.distribute.ReduceOp.SUM, td.identity(1.0))))
    assert result == (float(n),) * n


def test_all_reduce_doc_example_of_a_list(mirrored_strategy):
    result = local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce("sum", [1.0, 2.0])))
    assert [[float(x) for x in part] for part in result] == [[2.0, 4.0], [2.0, 4.0]]


@pytest.mark.replicas(4)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_all_reduce_keeps_nested_structure(mirrored_strategy, op):
    def fn():
        x = np.float32(rid() + 1)
        return ctx().all_reduce(op, [x, {"k": 10 * x}])

    total = sum(range(1, 5)) / (4 if op == "mean" else 1)
    for part in local(mirrored_strategy, mirrored_strategy.run(fn)):
        assert part[0] == total and part[1]["k"] == 10 * total
        assert list(part[1]) == ["k"]


@pytest.mark.replicas(4)
def test_all_reduce_of_integers(mirrored_strategy):
    def fn():
        value = np.array([rid(), 2 * rid()], dtype=np.int32)
        return ctx().all_reduce("sum", value), ctx().all_reduce("mean", value)

    sums, means = mirrored_strategy.run(fn)
    for s, m in zip(local(mirrored_strategy, sums), local(mirrored_strategy, means)):
        np.testing.assert_array_equal(s, [6, 12])
        assert s.dtype == np.int32
        np.testing.assert_array_equal(m, [1.5, 3.0])
        assert m.dtype == np.float64


def test_all_reduce_of_int32_replica_ids_from_a_values_function(mirrored_strategy):
    values = mirrored_strategy.experimental_distribute_values_from_function(
        lambda ctx: td.constant(ctx.replica_id_in_sync_group)
    )
    result = mirrored_strategy.run(lambda x: td.distribute.get_replica_context().all_reduce("sum", x), args=(values,))
    assert isinstance(result, td.distribute.PerReplica)
    assert [(int(v), v.dtype) for v in result.values] == [(1, np.int32), (1, np.int32)]


def test_all_reduce_counts_every_replica_even_for_one_shared_array(mirrored_strategy):
    """Deliberate difference from TF 2.21, which returns the value itself (4.0) here."""
    shared = td.constant(4.0)
    assert local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce("sum", shared))) == (8.0, 8.0)
    assert local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce("mean", shared))) == (4.0, 4.0)


@pytest.mark.replicas(4)
def test_all_reduce_results_are_shared_read_only_buffers(mirrored_strategy):
    result = local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce("sum", np.ones(8, np.float32))))
    assert len({id(r) for r in result}) == 4
    assert all(np.shares_memory(result[0], r) for r in result[1:])
    with pytest.raises(ValueError, match="read-only"):
        result[1][0] = 5.0
    np.testing.assert_array_equal(result[0], np.full(8, 4.0))


def test_all_reduce_shape_mismatch_names_the_replicas(mirrored_strategy):
    with pytest.raises(td.errors.InvalidArgumentError, match=r"replica 0 has shape \(1,\), replica 1 has \(2,\)"):
        mirrored_strategy.run(lambda: ctx().all_reduce("sum", np.ones(rid() + 1)))
    assert local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce("sum", 1.0))) == (2.0, 2.0)


# Values the replicas pass to one collective must agree in structure, shapes and dtypes; the
# error names the API the user called, the key path and the replicas (never an internal call).

STRUCTURE_MISMATCHES = {
    "list lengths": (lambda r: [1.0] * (r + 1), r"differ at the top level: a list of length 1 vs a list of length 2"),
    "dict vs tuple": (lambda r: {"a": 1.0} if r else (1.0,), r"differ at the top level: a tuple of length 1 vs a dict"),
    "dict keys": (lambda r: {"a": 1.0, ("b" if r else "c"): 2.0}, r"differ at the top level: a dict with keys 'a', 'c'"),
    "nested": (lambda r: {"x": [1.0, [2.0] * (r + 1)]}, r"differ at \['x'\]\[1\]: a list of length 1 vs a list of length 2"),
}


@pytest.mark.parametrize("api", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("case", STRUCTURE_MISMATCHES)
def test_collective_structure_mismatch_names_the_api_and_path(mirrored_strategy, api, case):
    make, where = STRUCTURE_MISMATCHES[case]

    def fn():
        value = make(rid())
        if api == "all_gather":
            value = optree.tree_map(lambda x: np.full(1, x), value, none_is_leaf=True)
            return ctx().all_gather(value, axis=0)
        return ctx().all_reduce("sum", value)

    with pytest.raises(td.errors.InvalidArgumentError) as info:
        mirrored_strategy.run(fn)
    message = str(info.value)
    assert message.startswith(f"ReplicaContext.{api}() needs the same nested structure from every replica")
    assert re.search(where, message), message
    assert "batch_reduce" not in message and "merge_call" not in message
    assert "replica 0 and replica 1" in message
    assert local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce("sum", 1.0))) == (2.0, 2.0)


@pytest.mark.replicas(4)
def test_all_reduce_shape_mismatch_names_the_key_path(mirrored_strategy):
    def fn():
        return ctx().all_reduce("sum", {"loss": np.ones(()), "logits": np.ones(3 + (rid() == 2))})

    with pytest.raises(td.errors.InvalidArgumentError) as info:
        mirrored_strategy.run(fn)
    message = str(info.value)
    assert message.startswith(
        "ReplicaContext.all_reduce() needs every replica's value to have the same shape and dtype, but at "
        "['logits'] replica 0 has shape (3,), replica 2 has (4,)."
    )
    assert info.value.path == ("logits",) and info.value.replicas == (0, 2)
    assert "batch_reduce" not in message and "merge_call" not in message
    assert "Raised in ReplicaContext.all_reduce() of MirroredStrategy" in "\n".join(info.value.__notes__)


def _printed(error: BaseException) -> str:
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


def test_a_failed_all_reduce_shows_the_users_line_in_the_traceback(mirrored_strategy):
    # The check fails on the thread of the replica that arrives last; the printed traceback
    # must still lead to the line in the replica function that called all_reduce.
    def replica_fn():
        return ctx().all_reduce("sum", np.ones(2 + rid()))

    with pytest.raises(td.errors.InvalidArgumentError) as info:
        mirrored_strategy.run(replica_fn)
    text = _printed(info.value)
    assert f"line {replica_fn.__code__.co_firstlineno + 1}, in replica_fn" in text
    assert 'return ctx().all_reduce("sum", np.ones(2 + rid()))' in text
    # ... above towerdist's check, which stays visible below it.
    assert text.index("in replica_fn") < text.index("in check_reduce_leaves")
    assert local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_reduce("sum", 1.0))) == (2.0, 2.0)


def test_a_failed_merge_fn_shows_the_merge_call_line_in_the_traceback(mirrored_strategy):
    def merge_fn(strategy):
        return {}["missing"]

    def replica_fn():
        return ctx().merge_call(merge_fn)

    with pytest.raises(KeyError) as info:
        mirrored_strategy.run(replica_fn)
    text = _printed(info.value)
    assert f"line {replica_fn.__code__.co_firstlineno + 1}, in replica_fn" in text
    assert text.index("in replica_fn") < text.index("in merge_fn")


def test_all_reduce_dtype_mismatch_names_the_key_path(mirrored_strategy):
    def fn():
        return ctx().all_reduce("sum", [np.ones(2, np.float32), np.ones(2, np.float32 if rid() == 0 else np.float64)])

    with pytest.raises(td.errors.InvalidArgumentError, match=r"at \[1\] replica 0 has dtype float32, replica 1 has float64"):
        mirrored_strategy.run(fn)


def test_all_gather_inner_dimension_mismatch_names_the_key_path(mirrored_strategy):
    with pytest.raises(
        td.errors.InvalidArgumentError,
        match=r"all_gather\(\) along axis 0 .* at \['x'\] replica 0 has shape \(1, 1\), replica 1 has \(1, 2\)",
    ):
        mirrored_strategy.run(lambda: ctx().all_gather({"x": np.ones((1, rid() + 1))}, axis=0))


def test_all_reduce_rejects_a_bad_op(mirrored_strategy):
    with pytest.raises(ValueError, match="'MAX' is not a valid ReduceOp"):
        mirrored_strategy.run(lambda: ctx().all_reduce("max", 1.0))


def test_all_reduce_in_the_default_context_returns_the_value():
    value = td.constant([1.0, 2.0])
    np.testing.assert_array_equal(td.distribute.get_replica_context().all_reduce("sum", value), value)


@pytest.mark.replicas(4)
def test_all_reduce_with_packing_options(mirrored_strategy):
    options = td.distribute.experimental.CommunicationOptions(bytes_per_pack=64)

    def fn():
        values = [np.full(k + 1, rid() + k, dtype=np.float64) for k in range(10)]
        return ctx().all_reduce("sum", values, options=options)

    for part in local(mirrored_strategy, mirrored_strategy.run(fn)):
        for k, array in enumerate(part):
            np.testing.assert_array_equal(array, np.full(k + 1, sum(r + k for r in range(4)), dtype=np.float64))


# --- all_gather ---------------------------------------------------------------------------


def test_all_gather_doc_example(mirrored_strategy):
    result = local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_gather(td.constant([1, 2, 3]), axis=0)))
    for part in result:
        np.testing.assert_array_equal(part, [1, 2, 3, 1, 2, 3])
        assert part.dtype == np.int32


def test_all_gather_doc_example_of_a_nested_structure(mirrored_strategy):
    def fn():
        return ctx().all_gather([td.constant([1, 2, 3]), td.constant([[1, 2], [3, 4]])], axis=0)

    for first, second in local(mirrored_strategy, mirrored_strategy.run(fn)):
        np.testing.assert_array_equal(first, [1, 2, 3, 1, 2, 3])
        np.testing.assert_array_equal(second, [[1, 2], [3, 4], [1, 2], [3, 4]])


def test_all_gather_uneven_sizes_in_replica_order(mirrored_strategy):
    result = local(mirrored_strategy, mirrored_strategy.run(lambda: ctx().all_gather(np.full([rid() + 1, 2], rid()), axis=0)))
    for part in result:
        np.testing.assert_array_equal(part, [[0, 0], [1, 1], [1, 1]])


def test_all_gather_doc_prose_example(mirrored_strategy):
    """The all_gather docs' nested example: {'a': [0], 'b': [[0,1]]} and {'a': [1], 'b': [[2,3],[4,5]]}."""

    def fn():
        if rid() == 0:
            value = {"a": np.array([0]), "b": np.array([[0, 1]])}
        else:
            value = {"a": np.array([1]), "b": np.array([[2, 3], [4, 5]])}
        return ctx().all_gather(value, axis=0)

    for part in local(mirrored_strategy, mirrored_strategy.run(fn)):
        np.testing.assert_array_equal(part["a"], [0, 1])
        np.testing.assert_array_equal(part["b"], [[0, 1], [2, 3], [4, 5]])


def test_all_gather_of_scalars_raises(mirrored_strategy):
    with pytest.raises(td.errors.InvalidArgumentError, match="cannot concatenate scalars"):
        mirrored_strategy.run(lambda: ctx().all_gather(td.constant(1.0), axis=0))
    assert mirrored_strategy.run(lambda: 1) == 1


def test_all_gather_mismatched_inner_dims_raise(mirrored_strategy):
    with pytest.raises(td.errors.InvalidArgumentError, match="same size in every other dimension"):
        mirrored_strategy.run(lambda: ctx().all_gather(np.ones((1, rid() + 1)), axis=0))


# --- merge_call and properties ------------------------------------------------------------


@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4, 8])
def test_merge_call_example_of_the_tf1_docs_in_run_form(num_replicas):
    """Replica i returns s + 3 + i with s = sum over replicas of (3 + i)."""
    strategy = mirrored_strategy_for(num_replicas)

    def merge_fn(distribution, three_plus_replica_id):
        return sum(distribution.experimental_local_results(three_plus_replica_id))

    def fn(three):
        replica_ctx = td.distribute.get_replica_context()
        v = three + replica_ctx.replica_id_in_sync_group
        s = replica_ctx.merge_call(merge_fn, args=(v,))
        return s + v

    with strategy.scope():
        merged = strategy.run(fn, args=[3])
    s = 3 * num_replicas + num_replicas * (num_replicas - 1) // 2
    assert [int(x) for x in strategy.experimental_local_results(merged)] == [s + 3 + i for i in range(num_replicas)]


def test_merge_call_requires_args_as_a_sequence(mirrored_strategy):
    with pytest.raises(ValueError, match=r"merge_call\(\) takes args as a list or tuple"):
        mirrored_strategy.run(lambda: ctx().merge_call(lambda s, x: x, args=5))


@pytest.mark.replicas(4)
def test_replica_context_properties(mirrored_strategy):
    seen = mirrored_strategy.run(lambda: (ctx().num_replicas_in_sync, ctx().strategy, ctx().devices))
    counts, strategies, devices = seen
    assert counts == 4 and strategies is mirrored_strategy
    assert [d[0] for d in local(mirrored_strategy, devices)] == list(mirrored_strategy.extended.worker_devices)


@pytest.mark.parametrize("name", ["default", "one_device_cpu", mirrored_param(1)])
def test_single_replica_all_reduce_never_returns_the_input_object(request, name):
    """As from a multi-replica all-reduce, the result is a new array: mutating it leaves x alone."""
    strategy = request.getfixturevalue(name)
    x = np.array([1.0, 2.0])

    def fn():
        reduced = ctx().all_reduce("sum", x)
        gathered = ctx().all_gather(x, axis=0)
        return reduced is x, gathered is x, np.array_equal(reduced, x), np.array_equal(gathered, x)

    assert strategy.run(fn) == (False, False, True, True)
