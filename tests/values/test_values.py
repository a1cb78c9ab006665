"""``PerReplica`` and ``Mirrored``, and the examples of TensorFlow's ``DistributedValues`` docs.

* str/repr: ``"%s:{\\n%s\\n}" % (cls, ",\\n".join("  %d: %s" % (i, v)))`` (repr with ``%r``).
* PerReplica: ``.values``, no operators, converts to an array only inside a replica context
  of a strategy (TF's ``_per_replica_to_tensor``), else ValueError.
* Mirrored: attribute access, indexing and operators act on the local component (the
  replica's inside ``run``; in cross-replica context the one on the current device, else
  the first); ``==`` and ``hash`` stay by identity.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest

import towerdist as td
from towerdist._src import device as device_lib

PerReplica = td.distribute.PerReplica
Mirrored = td.distribute.Mirrored

A0 = np.array([1.0, 2.0, 4.0])
A1 = np.array([8.0, 16.0, 32.0])
I0 = np.array([0b1100, 0b1010], dtype=np.int32)
I1 = np.array([0b0011, 0b0101], dtype=np.int32)
NOT_IN_REPLICA = "It looks like you are using a PerReplica object while not inside a replica context"


def on_cpus(values, *devices):
    """A Mirrored whose components are recorded on the given devices, as a strategy makes them."""
    return Mirrored(values, [device_lib.parse(d) for d in devices])


def replica_id():
    return td.distribute.get_replica_context().replica_id_in_sync_group


def expected_layout(cls_name, components, formatter):
    """TF's ``DistributedValues.__str__``/``__repr__`` formula."""
    body = ",\n".join("  %d: %s" % (i, formatter(v)) for i, v in enumerate(components))
    return "%s:{\n%s\n}" % (cls_name, body)


# --- the examples of TensorFlow's DistributedValues docs -------------------------------------


@pytest.fixture
def distributed_values(mirrored_strategy):
    """The docs' first global batch of ``from_tensor_slices([5., 6., 7., 8.]).batch(2)`` on two
    replicas: replica 0 holds [5.], replica 1 holds [6.]."""
    batch = np.array([5.0, 6.0], dtype=np.float32)
    return mirrored_strategy.experimental_distribute_values_from_function(
        lambda ctx: batch[ctx.replica_id_in_sync_group : ctx.replica_id_in_sync_group + 1]
    )


def test_distributed_values_doc_example_repr(distributed_values):
    assert repr(distributed_values) == (
        "PerReplica:{\n  0: array([5.], dtype=float32),\n  1: array([6.], dtype=float32)\n}"
    )


def test_distributed_values_doc_example_returned_by_run(mirrored_strategy):
    @td.function
    def run():
        return td.distribute.get_replica_context().replica_id_in_sync_group

    values = mirrored_strategy.run(run)
    assert isinstance(values, td.distribute.PerReplica)
    assert [(int(v), v.dtype) for v in values.values] == [(0, np.int32), (1, np.int32)]


def test_distributed_values_doc_example_as_input_into_run(mirrored_strategy, distributed_values):
    updated = mirrored_strategy.run(lambda value: value + 1.0, args=(distributed_values,))
    assert isinstance(updated, td.distribute.PerReplica)
    np.testing.assert_array_equal(updated.values[0], np.array([6.0], np.float32))
    np.testing.assert_array_equal(updated.values[1], np.array([7.0], np.float32))


def test_distributed_values_doc_example_as_input_into_reduce(mirrored_strategy, distributed_values):
    reduced = mirrored_strategy.reduce(td.distribute.ReduceOp.SUM, distributed_values, axis=0)
    assert reduced.shape == () and reduced.dtype == np.float32 and reduced == 11.0


def test_distributed_values_doc_example_local_results(mirrored_strategy, distributed_values):
    parts = mirrored_strategy.experimental_local_results(distributed_values)
    assert isinstance(parts, tuple) and len(parts) == 2
    np.testing.assert_array_equal(parts[0], [5.0])
    np.testing.assert_array_equal(parts[1], [6.0])


# --- str / repr -----------------------------------------------------------------------------


def test_per_replica_of_python_ints_prints_like_tf():
    assert str(PerReplica([3, 4])) == "PerReplica:{\n  0: 3,\n  1: 4\n}"
    assert repr(PerReplica([3, 4])) == "PerReplica:{\n  0: 3,\n  1: 4\n}"


@pytest.mark.parametrize(
    "components",
    [
        [np.float32(0.0), np.float32(1.0)],
        [np.array([5.0], np.float32), np.array([6.0], np.float32)],
        [np.zeros((2, 2)), np.ones((2, 2))],
        [np.int32(7)],
        [1, 2, 3, 4],
    ],
    ids=["f32-scalars", "docs-example-batches", "matrices", "one-component", "four-ints"],
)
@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_str_layout(cls, components):
    assert str(cls(components)) == expected_layout(cls.__name__, components, str)


@pytest.mark.parametrize(
    "components",
    [
        [np.float32(0.0), np.float32(1.0)],
        [np.array([5.0], np.float32), np.array([6.0], np.float32)],
        [np.zeros((2, 2)), np.ones((2, 2))],
    ],
    ids=["f32-scalars", "docs-example-batches", "matrices"],
)
@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_repr_layout(cls, components):
    assert repr(cls(components)) == expected_layout(cls.__name__, components, repr)


def test_repr_of_a_run_result_has_one_line_per_replica(mirrored_strategy):
    result = mirrored_strategy.run(replica_id)
    assert repr(result) == "PerReplica:{\n  0: %r,\n  1: %r\n}" % (np.int32(0), np.int32(1))


# --- PerReplica -----------------------------------------------------------------------------


def test_per_replica_values_are_a_tuple_in_replica_order():
    assert isinstance(PerReplica([A0, A1]).values, tuple)
    assert PerReplica([A0, A1]).values[0] is A0
    assert PerReplica([A0, A1]).values[1] is A1


@pytest.mark.replicas(2, 4)
def test_run_result_values_are_the_replica_results(mirrored_strategy):
    result = mirrored_strategy.run(replica_id)
    assert [int(v) for v in result.values] == list(range(mirrored_strategy.num_replicas_in_sync))
    assert all(v.dtype == np.int32 for v in result.values)


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (lambda pr: pr + 1, r"unsupported operand type\(s\) for \+: 'PerReplica' and 'int'"),
        (lambda pr: 1 + pr, r"unsupported operand type\(s\) for \+: 'int' and 'PerReplica'"),
        (lambda pr: pr * 2.0, r"unsupported operand type\(s\) for \*: 'PerReplica' and 'float'"),
        (lambda pr: pr - pr, r"unsupported operand type\(s\) for -: 'PerReplica' and 'PerReplica'"),
        (lambda pr: pr < 1, r"'<' not supported between instances of 'PerReplica' and 'int'"),
        (lambda pr: -pr, r"bad operand type for unary -: 'PerReplica'"),
        (lambda pr: pr[0], r"'PerReplica' object is not subscriptable"),
    ],
    ids=["add", "radd", "mul", "sub", "lt", "neg", "getitem"],
)
def test_per_replica_has_no_operators(op, message):
    with pytest.raises(TypeError, match=message):
        op(PerReplica([1, 2]))


def test_per_replica_to_array_outside_any_strategy_raises():
    with pytest.raises(ValueError, match=NOT_IN_REPLICA):
        np.asarray(PerReplica([A0, A1]))


def test_per_replica_to_array_in_cross_replica_context_raises(mirrored_strategy):
    with mirrored_strategy.scope():
        with pytest.raises(ValueError, match=NOT_IN_REPLICA):
            np.asarray(PerReplica([A0, A1]))
    assert int(mirrored_strategy.reduce("SUM", mirrored_strategy.run(replica_id), axis=None)) == 1


def test_per_replica_to_array_in_merge_fn_raises(mirrored_strategy):
    pr = PerReplica([A0, A1])

    def merge_fn(strategy):
        np.asarray(pr)

    with pytest.raises(ValueError, match=NOT_IN_REPLICA):
        mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(merge_fn))
    assert int(mirrored_strategy.reduce("SUM", mirrored_strategy.run(replica_id), axis=None)) == 1


def test_per_replica_to_array_in_default_strategy_run_raises(default):
    # TF raises when no strategy is current (``not has_strategy()``), even in the default
    # replica context.
    with pytest.raises(ValueError, match=NOT_IN_REPLICA):
        default.run(lambda: np.asarray(PerReplica([A0])))
    assert default.run(lambda: 3) == 3


def test_per_replica_converts_to_the_local_component_inside_run(mirrored_strategy):
    pr = PerReplica([A0, A1])
    result = mirrored_strategy.run(lambda: np.asarray(pr) * 1)
    np.testing.assert_array_equal(result.values[0], A0)
    np.testing.assert_array_equal(result.values[1], A1)


def test_per_replica_converts_with_a_dtype_inside_run(mirrored_strategy):
    pr = PerReplica([A0, A1])
    result = mirrored_strategy.run(lambda: np.asarray(pr, dtype=np.float32))
    assert [v.dtype for v in result.values] == [np.float32, np.float32]
    np.testing.assert_array_equal(result.values[1], A1.astype(np.float32))


def test_per_replica_converts_inside_one_device_run(one_device_cpu):
    np.testing.assert_array_equal(one_device_cpu.run(lambda: np.asarray(PerReplica([A1])) + 0), A1)


# --- Mirrored: delegation -------------------------------------------------------------------

BINARY_OPS = [
    ("add", lambda x: x + 2.0),
    ("radd", lambda x: 2.0 + x),
    ("sub", lambda x: x - 1.0),
    ("rsub", lambda x: 100.0 - x),
    ("mul", lambda x: x * 3.0),
    ("rmul", lambda x: 3.0 * x),
    ("truediv", lambda x: x / 4.0),
    ("rtruediv", lambda x: 64.0 / x),
    ("floordiv", lambda x: x // 3.0),
    ("rfloordiv", lambda x: 100.0 // x),
    ("mod", lambda x: x % 3.0),
    ("rmod", lambda x: 100.0 % x),
    ("pow", lambda x: x**2),
    ("rpow", lambda x: 2.0**x),
    ("matmul", lambda x: x @ np.arange(3.0)),
    ("rmatmul", lambda x: np.arange(3.0) @ x),
    ("array-left", lambda x: np.array([1.0, 1.0, 1.0]) + x),
    ("neg", lambda x: -x),
    ("pos", lambda x: +x),
    ("abs", lambda x: abs(x)),
    ("lt", lambda x: x < 4.0),
    ("le", lambda x: x <= 4.0),
    ("gt", lambda x: x > 4.0),
    ("ge", lambda x: x >= 4.0),
    ("reflected-gt", lambda x: 4.0 > x),
    ("getitem", lambda x: x[1]),
    ("slice", lambda x: x[::-1]),
    ("mask", lambda x: x[np.array([True, False, True])]),
    ("attribute", lambda x: x.shape),
    ("method", lambda x: x.sum()),
    ("method-args", lambda x: x.reshape(3, 1)),
    ("asarray", lambda x: np.asarray(x)),
    ("ufunc", lambda x: np.sqrt(x)),
]

INT_OPS = [
    ("and", lambda x: x & 0b0110),
    ("rand", lambda x: 0b0110 & x),
    ("or", lambda x: x | 0b0001),
    ("ror", lambda x: 0b0001 | x),
    ("xor", lambda x: x ^ 0b1111),
    ("rxor", lambda x: 0b1111 ^ x),
    ("invert", lambda x: ~x),
    ("dtype", lambda x: x.dtype),
]


def ids(ops):
    return [name for name, _ in ops]


@pytest.mark.parametrize("op", [fn for _, fn in BINARY_OPS], ids=ids(BINARY_OPS))
def test_mirrored_delegates_to_the_first_component_in_cross_replica_context(op):
    np.testing.assert_array_equal(op(Mirrored([A0, A1])), op(A0))


@pytest.mark.parametrize("op", [fn for _, fn in INT_OPS], ids=ids(INT_OPS))
def test_mirrored_delegates_bitwise_ops(op):
    np.testing.assert_array_equal(op(Mirrored([I0, I1])), op(I0))


@pytest.mark.parametrize("op", [fn for _, fn in BINARY_OPS], ids=ids(BINARY_OPS))
def test_mirrored_delegates_to_the_component_on_the_current_device(op):
    m = on_cpus([A0, A1], "CPU:0", "CPU:1")
    with td.device("/cpu:1"):
        np.testing.assert_array_equal(op(m), op(A1))


def test_mirrored_on_a_device_it_does_not_live_on_uses_the_first_component():
    m = on_cpus([A0, A1], "CPU:0", "CPU:1")
    with td.device("CPU:5"):
        np.testing.assert_array_equal(m + 0, A0)


def test_mirrored_without_recorded_devices_uses_the_first_component_on_any_device():
    with td.device("CPU:1"):
        np.testing.assert_array_equal(Mirrored([A0, A1]) + 0, A0)


def test_mirrored_in_strategy_scope_uses_the_component_on_the_current_device(mirrored_strategy):
    m = on_cpus([A0, A1], "CPU:0", "CPU:1")
    with mirrored_strategy.scope():
        np.testing.assert_array_equal(m * 1, A0)
        with td.device("CPU:1"):
            np.testing.assert_array_equal(m * 1, A1)


@pytest.mark.parametrize("op", [fn for _, fn in BINARY_OPS], ids=ids(BINARY_OPS))
def test_mirrored_delegates_to_the_replica_component_inside_run(mirrored_strategy, op):
    m = on_cpus([A0, A1], "CPU:0", "CPU:1")
    result = mirrored_strategy.run(lambda: op(m))
    for got, component in zip(mirrored_strategy.experimental_local_results(result), (A0, A1)):
        np.testing.assert_array_equal(got, op(component))


@pytest.mark.replicas(4)
def test_mirrored_of_equal_values_reads_the_same_in_every_replica(mirrored_strategy):
    m = mirrored_strategy.extended.broadcast_to(np.array([1.0, 2.0]), destinations=mirrored_strategy.run(replica_id))
    assert isinstance(m, Mirrored)
    for got in mirrored_strategy.experimental_local_results(mirrored_strategy.run(lambda: m * 2.0)):
        np.testing.assert_array_equal(got, [2.0, 4.0])


def test_mirrored_missing_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_attribute"):
        Mirrored([A0, A1]).no_such_attribute  # noqa: B018


# --- Mirrored: identity semantics -----------------------------------------------------------


def test_mirrored_equality_is_identity():
    m = Mirrored([A0, A1])
    twin = Mirrored([A0, A1])
    assert (m == m) is True
    assert (m == twin) is False
    assert (m != twin) is True


def test_mirrored_hash_is_identity_based():
    m = Mirrored([A0, A1])
    assert hash(m) == object.__hash__(m)
    assert {m: "x"}[m] == "x"
    assert Mirrored([A0, A1]) not in {m}


def test_mirrored_comparisons_other_than_equality_are_elementwise():
    result = operator.lt(Mirrored([A0, A1]), 3.0)
    np.testing.assert_array_equal(result, A0 < 3.0)


# --- class relationships and exports --------------------------------------------------------


@pytest.mark.parametrize("name", ["DistributedValues", "PerReplica", "Mirrored"])
def test_value_types_are_exported_under_types_experimental(name):
    assert getattr(td.types.experimental, name) is getattr(td.distribute, name)


@pytest.mark.parametrize("cls", [PerReplica, Mirrored])
def test_per_replica_and_mirrored_are_distributed_values(cls):
    assert isinstance(cls([1, 2]), td.distribute.DistributedValues)
    assert isinstance(cls([1, 2]), td.types.experimental.DistributedValues)


def test_per_replica_is_not_mirrored():
    assert not isinstance(PerReplica([1, 2]), Mirrored)
    assert not isinstance(Mirrored([1, 2]), PerReplica)


def test_run_result_is_a_types_experimental_per_replica(mirrored_strategy):
    assert isinstance(mirrored_strategy.run(replica_id), td.types.experimental.PerReplica)


# --- numpy 2's copy argument ----------------------------------------------------------------


def test_np_array_of_a_mirrored_value_is_a_writable_copy(mirrored_strategy):
    source = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: np.ones(3))
    mirrored = mirrored_strategy.extended.reduce_to("sum", source, source)
    copied = np.array(mirrored)
    assert copied is not mirrored.values[0] and not np.shares_memory(copied, mirrored.values[0])
    copied += 1  # a copy is writable even though the shared result is read-only
    np.testing.assert_array_equal(mirrored.values[0], [2.0, 2.0, 2.0])
    assert np.shares_memory(np.asarray(mirrored), mirrored.values[0])  # asarray does not copy


def test_np_array_of_a_per_replica_inside_run_does_not_alias_the_input(mirrored_strategy):
    inputs = [np.zeros(2), np.zeros(2)]
    values = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: inputs[ctx.replica_id_in_sync_group])

    def fn():
        copied = np.array(values)  # captured, not an argument: PerReplica.__array__ runs here
        copied += 5
        return copied

    mirrored_strategy.run(fn)
    np.testing.assert_array_equal(inputs[0], [0.0, 0.0])
    np.testing.assert_array_equal(inputs[1], [0.0, 0.0])


def test_copy_false_refuses_a_conversion_that_needs_a_copy(mirrored_strategy):
    source = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: np.ones(3))
    mirrored = mirrored_strategy.extended.reduce_to("sum", source, source)
    with pytest.raises(ValueError):
        np.asarray(mirrored, dtype=np.float32, copy=False)
