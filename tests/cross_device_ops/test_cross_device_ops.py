"""Cross-device ops: reduce, batch_reduce and broadcast between logical CPU devices.

Every ``CrossDeviceOps`` class is tested twice: directly (``ops.reduce(op, PerReplica,
destinations)``) and through a ``MirroredStrategy`` built with it (``strategy.reduce``,
``extended.reduce_to/batch_reduce_to/broadcast_to`` and ``ReplicaContext.all_reduce``).
Expected values are computed with numpy from the inputs, or taken from the reference
document (``shared/reference/tf_distribute_behaviour.md``, cited as "reference x.y").
Where towerdist deliberately differs from TensorFlow the test cites DESIGN section 10.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re

import numpy as np
import pytest

import towerdist as td
from towerdist._src.backend.cupy_backend import nccl_unavailable_reason
from towerdist._src.cross_device_ops import select
from towerdist._src.device import parse
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from conftest import cpus
from numpy_reference import numpy_reduce

D = td.distribute
SUM, MEAN = D.ReduceOp.SUM, D.ReduceOp.MEAN
CommunicationOptions = D.experimental.CommunicationOptions
CommunicationImplementation = D.experimental.CommunicationImplementation

DTYPES = [np.float32, np.float64, np.int32, np.int64]
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}

# The classes that can all-reduce between CPU devices; NcclAllReduce (GPU only) has its own tests.
CPU_OPS = {
    "shared_memory": D.SharedMemoryAllReduce,
    "reduction_to_one_device": D.ReductionToOneDevice,
    "hierarchical_copy": D.HierarchicalCopyAllReduce,
}
ALL_OPS = {**CPU_OPS, "nccl": D.NcclAllReduce}

NCCL_USABLE = nccl_unavailable_reason() is None


# --- helpers --------------------------------------------------------------------------------


def devices(n: int) -> tuple:
    """The DeviceSpecs of the first ``n`` logical CPUs."""
    return tuple(parse(name) for name in cpus(n))


def per_replica(arrays) -> D.PerReplica:
    """A PerReplica with component ``i`` on logical CPU ``i``."""
    return D.PerReplica(list(arrays), devices(len(arrays)))


def random_values(n: int, shape=(2, 3), dtype=np.float64, seed: int = 0) -> list[np.ndarray]:
    """``n`` different arrays (integers in [-1000, 1000) for integer dtypes)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return [rng.integers(-1000, 1000, size=shape).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


def assert_reduced(actual, expected) -> None:
    """``actual`` equals ``expected`` in dtype and shape; exactly for integers."""
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if expected.dtype.kind in "iu":
        np.testing.assert_array_equal(actual, expected)
    else:
        tol = TOLERANCE.get(expected.dtype, 1e-5)
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


def assert_mirrored(result, expected, n: int) -> None:
    """``result`` is a Mirrored of ``n`` components, each equal to ``expected``."""
    assert isinstance(result, D.Mirrored)
    assert len(result.values) == n
    for component in result.values:
        assert_reduced(component, expected)


def assert_zero_copy(result) -> None:
    """The components are distinct read-only objects looking at one buffer (DESIGN 5)."""
    components = result.values
    assert len({id(c) for c in components}) == len(components)
    assert not any(c.flags.writeable for c in components)
    assert all(np.shares_memory(components[0], c) for c in components[1:])


def assert_isolated(result) -> None:
    """No writable component shares memory with another: a write cannot reach another replica.

    Weaker than :func:`assert_zero_copy`; holds for algorithms that give each device a copy.
    """
    components = result.values
    for i, component in enumerate(components):
        for other in components[i + 1 :]:
            shared = np.shares_memory(component, other)
            assert not (shared and (component.flags.writeable or other.flags.writeable))


def distribute(strategy, arrays):
    """A PerReplica of ``strategy`` whose replica ``i`` holds ``arrays[i]``."""
    return strategy.experimental_distribute_values_from_function(lambda ctx: arrays[ctx.replica_id_in_sync_group])


def all_reduce_own(reduce_op, arrays):
    """In a replica: all-reduce this replica's entry of ``arrays``."""
    ctx = D.get_replica_context()
    return ctx.all_reduce(reduce_op, arrays[ctx.replica_id_in_sync_group])


def assert_strategy_works(strategy) -> None:
    """A successful all-reduce in ``run`` and a ``strategy.reduce`` after an error."""
    n = strategy.num_replicas_in_sync
    expected = np.array([n * (n + 1) / 2])

    def step():
        ctx = D.get_replica_context()
        return ctx.all_reduce(SUM, np.array([float(ctx.replica_id_in_sync_group) + 1.0]))

    for local in strategy.experimental_local_results(strategy.run(step)):
        assert_reduced(local, expected)
    values = distribute(strategy, [np.array([i + 1.0]) for i in range(n)])
    assert_reduced(strategy.reduce(SUM, values, axis=None), expected)


@functools.lru_cache(maxsize=None)
def strategy_with(kind: str, n: int = 4, num_packs: int = 1) -> D.MirroredStrategy:
    """A cached MirroredStrategy over ``n`` CPUs using the cross-device ops ``kind``."""
    if kind == "default":
        return mirrored_strategy_for(n)
    if kind == "hierarchical_copy":
        ops = D.HierarchicalCopyAllReduce(num_packs=num_packs)
    else:
        ops = CPU_OPS[kind]()
    return D.MirroredStrategy(cpus(n), cross_device_ops=ops)


def recording(cls, **kwargs):
    """An instance of a subclass of ``cls`` that records every call of its data-moving hooks."""

    class Recording(cls):
        def reduce_implementation(self, *args):
            self.calls.append("reduce_implementation")
            return super().reduce_implementation(*args)

        def batch_reduce_implementation(self, *args):
            self.calls.append("batch_reduce_implementation")
            return super().batch_reduce_implementation(*args)

    ops = Recording(**kwargs)
    ops.calls = []
    return ops


@functools.lru_cache(maxsize=None)
def recording_strategy() -> D.MirroredStrategy:
    """A 4-CPU strategy whose (shared-memory) cross-device ops records the data it moves."""
    return D.MirroredStrategy(cpus(4), cross_device_ops=recording(D.SharedMemoryAllReduce))


@pytest.fixture(params=list(CPU_OPS))
def ops(request):
    """A fresh instance of each CPU-capable CrossDeviceOps class."""
    return CPU_OPS[request.param]()


@pytest.fixture(params=list(ALL_OPS))
def any_ops(request):
    """A fresh instance of every CrossDeviceOps class, NcclAllReduce included."""
    return ALL_OPS[request.param]()


@pytest.fixture(params=["default", *CPU_OPS])
def ops_strategy(request):
    """MirroredStrategy over 4 CPUs: the default ops (chosen for CPUs) and each explicit one."""
    return strategy_with(request.param)


# --- CrossDeviceOps used directly -----------------------------------------------------------


@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_onto_the_value_devices_gives_mirrored_result(ops, reduce_op, dtype):
    arrays = random_values(4, dtype=dtype)
    value = per_replica(arrays)
    result = ops.reduce(reduce_op, value, value)
    assert_mirrored(result, numpy_reduce(reduce_op, arrays), 4)


@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_reduce_onto_one_device_gives_a_bare_array(any_ops, reduce_op):
    # NcclAllReduce falls back to ReductionToOneDevice here, as in TensorFlow (reference 4.2).
    arrays = random_values(4)
    result = any_ops.reduce(reduce_op, per_replica(arrays), "CPU:1")
    assert isinstance(result, np.ndarray)
    assert_reduced(result, numpy_reduce(reduce_op, arrays))


@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_batch_reduce_gives_one_result_per_pair(ops, reduce_op):
    a = random_values(4, shape=(3,), seed=1)
    b = random_values(4, shape=(2, 2), seed=2)
    value_a, value_b = per_replica(a), per_replica(b)
    result_a, result_b = ops.batch_reduce(reduce_op, [(value_a, value_a), (value_b, "CPU:2")])
    assert_mirrored(result_a, numpy_reduce(reduce_op, a), 4)
    assert isinstance(result_b, np.ndarray)
    assert_reduced(result_b, numpy_reduce(reduce_op, b))


def test_batch_reduce_of_no_pairs_is_empty(ops):
    assert ops.batch_reduce(SUM, []) == []


def test_ints_are_reduced_exactly(ops):
    # 2**53 + 1 is not a float64: any float round-trip would lose the trailing 1s.
    big = 2**53 + 1
    arrays = [np.array([big, -big, 1], dtype=np.int64), np.array([1, 0, big], dtype=np.int64)]
    value = per_replica(arrays)
    expected = np.array([big + 1, -big, big + 1], dtype=np.int64)
    assert_mirrored(ops.reduce(SUM, value, value), expected, 2)


@pytest.mark.parametrize("shape", [(), (3,), (2, 0)], ids=str)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_mean_is_float64_with_the_shape_kept(ops, shape, dtype):
    arrays = [np.full(shape, v, dtype=dtype) for v in (0, 1, 2, 3)]
    value = per_replica(arrays)
    expected = np.full(shape, 1.5, dtype=np.float64)  # reference 3.9: MEAN of int32 [0,1,2,3] -> 1.5
    assert_mirrored(ops.reduce(MEAN, value, value), expected, 4)
    assert_reduced(ops.reduce(MEAN, value, "CPU:0"), expected)


@pytest.mark.parametrize("name", ["shared_memory", "reduction_to_one_device"])
def test_multi_destination_components_share_one_read_only_buffer(name):
    value = per_replica(random_values(4))
    assert_zero_copy(CPU_OPS[name]().reduce(SUM, value, value))


def test_hierarchical_copy_with_one_pack_is_zero_copy():
    value = per_replica(random_values(4))
    assert_zero_copy(D.HierarchicalCopyAllReduce(num_packs=1).reduce(SUM, value, value))


@pytest.mark.parametrize("num_packs", [0, 1, 2, 3])
@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_hierarchical_copy_components_never_alias_writably(num_packs, reduce_op):
    value = per_replica(random_values(4, shape=(5,)))
    assert_isolated(D.HierarchicalCopyAllReduce(num_packs=num_packs).reduce(reduce_op, value, value))


def test_mutating_a_component_in_place_raises_and_changes_nothing(ops):
    arrays = random_values(4)
    value = per_replica(arrays)
    result = ops.reduce(SUM, value, value)
    with pytest.raises(ValueError, match="read-only"):
        result.values[1][...] = 0.0
    for component in result.values:
        assert_reduced(component, numpy_reduce(SUM, arrays))


@pytest.mark.parametrize(
    "accumulation_fn",
    [None, lambda xs: functools.reduce(np.maximum, xs), max],
    ids=["default-add_n", "np.maximum", "builtin-max"],
)
def test_reduction_to_one_device_leaves_its_inputs_alone(accumulation_fn):
    """The inputs stay writable and unchanged, and the result never aliases them.

    ``max`` returns one of its inputs; the result must still be a new buffer, otherwise a
    later write to the input would change every "read-only" component of the result.
    """
    arrays = [np.array([float(i)]) for i in (1, 2, 3, 4)]
    value = per_replica(arrays)
    result = D.ReductionToOneDevice(accumulation_fn=accumulation_fn).reduce(SUM, value, value)
    assert all(a.flags.writeable for a in arrays)
    assert [a.tolist() for a in arrays] == [[1.0], [2.0], [3.0], [4.0]]
    assert not any(np.shares_memory(c, a) for c in result.values for a in arrays)


def test_reduction_to_one_device_custom_device_and_accumulation():
    # Reference 4.1: reduce_to_device="/cpu:3", accumulation_fn=max over [1],[2],[3],[4]
    # with SUM -> Mirrored of [4.] on all 4 devices (accumulation_fn replaces the addition).
    ops = D.ReductionToOneDevice(reduce_to_device="/cpu:3", accumulation_fn=lambda xs: functools.reduce(np.maximum, xs))
    value = per_replica([np.array([float(i)]) for i in (1, 2, 3, 4)])
    assert_mirrored(ops.reduce(SUM, value, value), np.array([4.0]), 4)


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("num_packs", [0, 1, 2, 3])
def test_hierarchical_copy_is_correct_for_every_device_count(n, num_packs):
    # Reference 4.4 inputs (10**i on device i); TensorFlow drops the last device for odd n,
    # towerdist does not (DESIGN 10.3), so the sum is 11...1 with n ones.
    value = per_replica([np.array([10.0**i, 1.0]) for i in range(n)])
    result = D.HierarchicalCopyAllReduce(num_packs=num_packs).reduce(SUM, value, value)
    assert_mirrored(result, np.array([float("1" * n), float(n)]), n)


def test_hierarchical_copy_mean_over_three_devices_counts_every_device():
    # Reference 4.4 example ([1,1],[10,1],[100,1]); TensorFlow gives [11/3, 2/3], the correct
    # mean (DESIGN 10.3) is [111/3, 3/3].
    value = per_replica([np.array([1.0, 1.0]), np.array([10.0, 1.0]), np.array([100.0, 1.0])])
    result = D.HierarchicalCopyAllReduce().reduce(MEAN, value, value)
    assert_mirrored(result, np.array([37.0, 1.0]), 3)


@pytest.mark.parametrize("n", [3, 5, 8])
@pytest.mark.parametrize("num_packs", [0, 1, 2, 3])
@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_hierarchical_copy_batch_reduce_with_packs(n, num_packs, reduce_op):
    """Packs cut across values of mixed sizes and dtypes; every value comes back intact."""
    shapes_and_dtypes = [((3,), np.float64), ((2, 2), np.int32), ((), np.float64), ((5,), np.float32), ((0,), np.int64)]
    inputs = [random_values(n, shape, dtype, seed=k) for k, (shape, dtype) in enumerate(shapes_and_dtypes)]
    values = [per_replica(arrays) for arrays in inputs]
    results = D.HierarchicalCopyAllReduce(num_packs=num_packs).batch_reduce(reduce_op, [(v, v) for v in values])
    assert len(results) == len(inputs)
    for result, arrays in zip(results, inputs):
        assert_mirrored(result, numpy_reduce(reduce_op, arrays), n)


@pytest.mark.parametrize("destinations", ["CPU:2", "/cpu:2"])
def test_broadcast_to_one_device_gives_a_bare_array(any_ops, destinations):
    source = np.arange(6.0).reshape(2, 3)
    result = any_ops.broadcast(source, destinations)
    assert isinstance(result, np.ndarray)
    np.testing.assert_array_equal(result, source)


def test_broadcast_to_several_devices_gives_zero_copy_mirrored(any_ops):
    source = np.arange(6.0).reshape(2, 3)
    destinations = per_replica(random_values(4))
    result = any_ops.broadcast(source, destinations)
    assert_mirrored(result, source, 4)
    assert_zero_copy(result)


# --- argument validation (direct) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (D.HierarchicalCopyAllReduce, "HierarchicalCopy requires num_packs >= 0, but -1 is specified"),
        (D.NcclAllReduce, "NCCL all-reduce requires num_packs >= 0, but -1 is specified"),
    ],
)
def test_negative_num_packs_is_rejected(cls, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(num_packs=-1)


@pytest.mark.parametrize("method", ["reduce", "batch_reduce"])
@pytest.mark.parametrize("reduce_op", ["SUM", "sum", "MEAN"])
def test_cross_device_ops_reject_string_reduce_ops(any_ops, method, reduce_op):
    # Reference 2.7: unlike the strategy APIs, CrossDeviceOps.reduce takes only a ReduceOp.
    value = per_replica(random_values(2))
    call = {
        "reduce": lambda: any_ops.reduce(reduce_op, value, value),
        "batch_reduce": lambda: any_ops.batch_reduce(reduce_op, [(value, value)]),
    }[method]
    with pytest.raises(ValueError, match=re.escape("`reduce_op` must be Reduce.SUM or Reduce.MEAN")):
        call()


MALFORMED_PAIRS = [
    pytest.param(lambda v: [v], "should be a tuple", id="not-a-tuple"),
    pytest.param(lambda v: [[v, v]], "should be a tuple", id="list-pair"),
    pytest.param(lambda v: [(v,)], "should be a tuple of size 2", id="one-element"),
    pytest.param(lambda v: [(v, v), (v, v, v)], "should be a tuple of size 2", id="three-elements"),
]


@pytest.mark.parametrize(("make_pairs", "message"), MALFORMED_PAIRS)
def test_batch_reduce_rejects_malformed_pairs(ops, make_pairs, message):
    value = per_replica(random_values(2))
    with pytest.raises(ValueError, match=re.escape(f"Each element of `value_destination_pairs` {message}")):
        ops.batch_reduce(SUM, make_pairs(value))


@pytest.mark.parametrize(
    ("destinations", "message"),
    [
        pytest.param("", "destinations can not be empty", id="empty-string"),
        pytest.param(D.PerReplica([np.zeros(2), np.zeros(2)]), "destinations can not be empty", id="no-devices"),
        pytest.param(42, "destinations must be one of", id="int"),
        pytest.param(object(), "destinations must be one of", id="object"),
    ],
)
def test_destinations_are_validated(any_ops, destinations, message):
    value = per_replica(random_values(2))
    with pytest.raises(ValueError, match=message):
        any_ops.reduce(SUM, value, destinations)
    with pytest.raises(ValueError, match=message):
        any_ops.broadcast(np.zeros(2), destinations)


MISMATCH_MESSAGE = "needs every replica's value to have the same shape and dtype"
MISMATCHES = [
    pytest.param(np.zeros(4, np.float64), ("(3,)", "(4,)"), id="shape"),
    pytest.param(np.zeros(3, np.float32), ("float64", "float32"), id="dtype"),
]


@pytest.mark.parametrize("cls", list(CPU_OPS.values()), ids=list(CPU_OPS))
@pytest.mark.parametrize(("odd_one", "mentions"), MISMATCHES)
def test_mismatched_components_are_rejected_before_any_data_moves(cls, odd_one, mentions):
    ops = recording(cls)
    good = per_replica([np.zeros(3) for _ in range(4)])
    bad = per_replica([np.zeros(3), np.zeros(3), odd_one, np.zeros(3)])
    with pytest.raises(td.errors.InvalidArgumentError, match=MISMATCH_MESSAGE) as info:
        ops.batch_reduce(SUM, [(good, good), (bad, bad)])
    message = str(info.value)
    for text in ("replica 0", "replica 2", *mentions):
        assert text in message
    assert ops.calls == []  # not even the valid first pair was reduced
    with pytest.raises(td.errors.InvalidArgumentError, match="needs every replica's value"):
        ops.reduce(SUM, bad, bad)
    assert ops.calls == []


@pytest.mark.parametrize(
    "component",
    [np.array(["a", "b"]), np.array([True, False]), np.array([None, 1], dtype=object)],
    ids=["str", "bool", "object"],
)
def test_non_numeric_values_are_rejected(ops, component):
    value = per_replica([component, component.copy()])
    with pytest.raises(ValueError, match="Reducing across replicas needs numeric values"):
        ops.reduce(SUM, value, value)


# --- NcclAllReduce on CPU devices -----------------------------------------------------------


def test_nccl_all_reduce_on_cpus_fails_at_strategy_construction():
    with pytest.raises(ValueError, match="NcclAllReduce needs every device to be a GPU") as info:
        D.MirroredStrategy(cpus(2), cross_device_ops=D.NcclAllReduce())
    assert "/cpu:0" in str(info.value) and "/cpu:1" in str(info.value)
    assert_strategy_works(mirrored_strategy_for(2))


@pytest.mark.skipif(NCCL_USABLE, reason="NCCL is usable here, so nothing is missing")
def test_nccl_construction_error_says_what_is_missing():
    with pytest.raises(ValueError, match="NcclAllReduce needs every device to be a GPU") as info:
        D.MirroredStrategy(cpus(2), cross_device_ops=D.NcclAllReduce())
    assert nccl_unavailable_reason() in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed")
def test_nccl_unavailable_reason_names_cupy_and_the_extra():
    reason = nccl_unavailable_reason()
    assert "cupy" in reason
    assert "towerdist[cuda12]" in reason


def test_nccl_reduce_between_cpus_falls_back_to_one_device():
    # Reference 4.2: a destination containing "cpu" makes NcclAllReduce.reduce use
    # ReductionToOneDevice ("NcclAllReduce().reduce on CPUs -> 10.0 via fallback").
    arrays = [np.array([float(i)]) for i in range(1, 5)]
    value = per_replica(arrays)
    assert_mirrored(D.NcclAllReduce().reduce(SUM, value, value), np.array([10.0]), 4)


def test_nccl_batch_reduce_between_cpus_raises_naming_the_devices():
    # Reference 4.2: TensorFlow fails here too (no NCCL kernel for CPU); towerdist says why.
    value = per_replica(random_values(2))
    with pytest.raises(ValueError, match="NcclAllReduce needs every device to be a GPU, but got /cpu:0, /cpu:1"):
        D.NcclAllReduce().batch_reduce(SUM, [(value, value)])


# --- choosing the cross-device ops ----------------------------------------------------------


def test_select_cross_device_ops_picks_shared_memory_for_cpus():
    assert isinstance(select.select_cross_device_ops(devices(4)), D.SharedMemoryAllReduce)


@pytest.mark.parametrize("names", [["CPU:0"], ["CPU:0", "CPU:1"], ["CPU:0", "GPU:0"]], ids=str)
def test_choose_cross_device_ops_gives_shared_memory_and_a_reason_with_any_cpu(names):
    ops, reason = select.choose_cross_device_ops([parse(name) for name in names])
    assert isinstance(ops, D.SharedMemoryAllReduce)
    assert "CPU" in reason


@pytest.mark.skipif(NCCL_USABLE, reason="NCCL is usable here")
def test_choose_cross_device_ops_for_gpus_without_nccl_is_hierarchical_copy():
    # DESIGN 5: GPUs without NCCL -> HierarchicalCopyAllReduce; the reason says why.
    ops, reason = select.choose_cross_device_ops([parse("GPU:0"), parse("GPU:1")])
    assert isinstance(ops, D.HierarchicalCopyAllReduce)
    assert nccl_unavailable_reason() in reason


def test_mirrored_strategy_logs_its_choice_with_a_reason(caplog):
    with caplog.at_level(logging.INFO, logger="towerdist"):
        strategy = D.MirroredStrategy(cpus(2))
    records = [r for r in caplog.records if r.name == "towerdist" and "SharedMemoryAllReduce" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert "CPU" in records[0].getMessage()
    assert isinstance(strategy.extended._cross_device_ops, D.SharedMemoryAllReduce)


@pytest.mark.replicas(1, 2, 4)
def test_default_cross_device_ops_is_visible(mirrored_strategy):
    assert isinstance(mirrored_strategy.extended._cross_device_ops, D.SharedMemoryAllReduce)


@pytest.mark.parametrize("name", list(CPU_OPS))
def test_explicit_cross_device_ops_is_the_one_used(name):
    ops = CPU_OPS[name]()
    strategy = D.MirroredStrategy(cpus(2), cross_device_ops=ops)
    assert strategy.extended._cross_device_ops is ops


def test_cross_device_ops_must_be_a_cross_device_ops():
    with pytest.raises(TypeError, match="cross_device_ops must be a td.distribute.CrossDeviceOps"):
        D.MirroredStrategy(cpus(2), cross_device_ops="nccl")


# --- through a MirroredStrategy -------------------------------------------------------------


@pytest.mark.parametrize("reduce_op", [SUM, MEAN, "sum", "Mean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_strategy_reduce_matches_numpy(ops_strategy, reduce_op, dtype):
    arrays = random_values(4, dtype=dtype)
    result = ops_strategy.reduce(reduce_op, distribute(ops_strategy, arrays), axis=None)
    assert isinstance(result, np.ndarray)
    op = D.ReduceOp(reduce_op.upper()) if isinstance(reduce_op, str) else reduce_op
    assert_reduced(result, numpy_reduce(op, arrays))


@pytest.mark.parametrize("shape", [(), (3,), (2, 0)], ids=str)
def test_strategy_int_mean_is_float64_with_the_shape_kept(ops_strategy, shape):
    arrays = [np.full(shape, v, dtype=np.int32) for v in (0, 1, 2, 3)]
    result = ops_strategy.reduce(MEAN, distribute(ops_strategy, arrays), axis=None)
    assert_reduced(result, np.full(shape, 1.5))


@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_reduce_to_the_value_gives_mirrored(ops_strategy, reduce_op):
    arrays = random_values(4)
    value = distribute(ops_strategy, arrays)
    result = ops_strategy.extended.reduce_to(reduce_op, value, value)
    assert_mirrored(result, numpy_reduce(reduce_op, arrays), 4)
    assert_isolated(result)


@pytest.mark.parametrize("kind", ["default", "reduction_to_one_device"])
@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_reduce_to_the_value_is_zero_copy(kind, reduce_op):
    strategy = strategy_with(kind)
    value = distribute(strategy, random_values(4))
    assert_zero_copy(strategy.extended.reduce_to(reduce_op, value, value))


def test_reduce_to_one_device_gives_a_bare_array(ops_strategy):
    arrays = random_values(4)
    result = ops_strategy.extended.reduce_to(SUM, distribute(ops_strategy, arrays), "CPU:3")
    assert isinstance(result, np.ndarray)
    assert_reduced(result, numpy_reduce(SUM, arrays))


@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_batch_reduce_to_with_mixed_int_and_float_values(ops_strategy, reduce_op):
    # DESIGN 10.4: mixed int/float batch_reduce_to works (TensorFlow raises).
    dtypes = [np.int32, np.float32, np.int64, np.float64]
    inputs = [random_values(4, (3,), dtype, seed=k) for k, dtype in enumerate(dtypes)]
    values = [distribute(ops_strategy, arrays) for arrays in inputs]
    results = ops_strategy.extended.batch_reduce_to(reduce_op, [(v, v) for v in values])
    for result, arrays in zip(results, inputs):
        assert_mirrored(result, numpy_reduce(reduce_op, arrays), 4)


def test_batch_reduce_to_with_different_destinations(ops_strategy):
    a, b = random_values(4, seed=1), random_values(4, (5,), np.int32, seed=2)
    value_a, value_b = distribute(ops_strategy, a), distribute(ops_strategy, b)
    result_a, result_b = ops_strategy.extended.batch_reduce_to("sum", [(value_a, "CPU:1"), (value_b, value_b)])
    assert isinstance(result_a, np.ndarray)
    assert_reduced(result_a, numpy_reduce(SUM, a))
    assert_mirrored(result_b, numpy_reduce(SUM, b), 4)


def test_broadcast_to(ops_strategy):
    source = np.arange(6, dtype=np.int64).reshape(3, 2)
    everywhere = ops_strategy.extended.broadcast_to(source, distribute(ops_strategy, random_values(4)))
    assert_mirrored(everywhere, source, 4)
    assert_zero_copy(everywhere)
    one = ops_strategy.extended.broadcast_to(source, "CPU:2")
    assert isinstance(one, np.ndarray)
    assert_reduced(one, source)


@pytest.mark.parametrize("number", [2.0, 3])
def test_broadcast_to_returns_python_numbers_unchanged(ops_strategy, number):
    # Reference 3.11: broadcast_to(2.0, v) -> 2.0 (fast path for int/float).
    destinations = distribute(ops_strategy, random_values(4))
    assert ops_strategy.extended.broadcast_to(number, destinations) is number


@pytest.mark.parametrize(
    "value, words",
    [
        (None, r"Attempt to convert a value \(None\) with an unsupported type"),
        ({"a": 1}, r"Attempt to convert a value \(\{'a': 1\}\) with an unsupported type"),
        (print, r"Attempt to convert a value \(<built-in function print>\) with an unsupported type"),
        ([[1.0], [1.0, 2.0]], r"Can't convert non-rectangular Python sequence"),
    ],
    ids=["None", "dict", "function", "ragged"],
)
def test_broadcast_to_refuses_what_is_not_an_array(ops_strategy, value, words):
    destinations = distribute(ops_strategy, random_values(4))
    with pytest.raises(ValueError, match=words) as info:
        ops_strategy.extended.broadcast_to(value, destinations)
    assert "StrategyExtended.broadcast_to()" in str(info.value)
    assert_mirrored(ops_strategy.extended.broadcast_to(np.ones(2), destinations), np.ones(2), 4)


@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_in_run_keeps_the_structure(ops_strategy, reduce_op, dtype):
    # Reference 3.11: a nested [x, {"k": y}] comes back with the same structure.
    xs = random_values(4, (3,), dtype, seed=1)
    ys = random_values(4, (), dtype, seed=2)

    def step():
        ctx = D.get_replica_context()
        r = ctx.replica_id_in_sync_group
        return ctx.all_reduce(reduce_op, [xs[r], {"k": ys[r]}])

    for local in ops_strategy.experimental_local_results(ops_strategy.run(step)):
        x, mapping = local
        assert list(mapping) == ["k"]
        assert_reduced(x, numpy_reduce(reduce_op, xs))
        assert_reduced(mapping["k"], numpy_reduce(reduce_op, ys))


def test_all_reduce_result_is_read_only_in_every_replica(ops_strategy):
    """A replica that mutates its all-reduced value in place gets ValueError, not corruption."""

    def step():
        reduced = D.get_replica_context().all_reduce(SUM, np.ones(3))
        reduced += 1.0
        return reduced

    with pytest.raises(ValueError, match="read-only"):
        ops_strategy.run(step)
    assert_strategy_works(ops_strategy)


@pytest.mark.parametrize("n", range(2, 9))
def test_hierarchical_copy_strategy_is_correct_for_every_device_count(n):
    # Reference 4.4: through MirroredStrategy TensorFlow's all_reduce gives 11 for n=3;
    # towerdist counts every replica (DESIGN 10.3).
    strategy = strategy_with("hierarchical_copy", n)
    expected = np.float64("1" * n)

    def step():
        ctx = D.get_replica_context()
        return ctx.all_reduce(SUM, np.float64(10.0**ctx.replica_id_in_sync_group))

    for local in strategy.experimental_local_results(strategy.run(step)):
        assert_reduced(local, np.asarray(expected))
    values = distribute(strategy, [np.float64(10.0**i) for i in range(n)])
    assert_reduced(strategy.reduce(SUM, values, axis=None), np.asarray(expected))


@pytest.mark.parametrize("num_packs", [0, 2, 3])
def test_hierarchical_copy_strategy_with_packs(num_packs):
    strategy = strategy_with("hierarchical_copy", 5, num_packs)
    specs = [((3,), np.float64), ((2, 2), np.int32), ((7,), np.float64)]
    inputs = [random_values(5, shape, dtype, seed=k) for k, (shape, dtype) in enumerate(specs)]
    values = [distribute(strategy, arrays) for arrays in inputs]
    for result, arrays in zip(strategy.extended.batch_reduce_to(SUM, [(v, v) for v in values]), inputs):
        assert_mirrored(result, numpy_reduce(SUM, arrays), 5)


def test_reduction_to_one_device_strategy_with_custom_accumulation():
    # Reference 4.1, through a strategy: reduce_to(SUM) of [1],[2],[3],[4] with a max -> [4.] everywhere.
    ops = D.ReductionToOneDevice(reduce_to_device="/cpu:3", accumulation_fn=lambda xs: functools.reduce(np.maximum, xs))
    strategy = D.MirroredStrategy(cpus(4), cross_device_ops=ops)
    value = distribute(strategy, [np.array([float(i)]) for i in (1, 2, 3, 4)])
    assert_mirrored(strategy.extended.reduce_to("SUM", value, value), np.array([4.0]), 4)


@pytest.mark.parametrize("api", ["reduce_to", "batch_reduce_to", "all_reduce"])
def test_one_replica_int_mean_has_one_dtype_in_every_api(api):
    """The same one-replica MEAN must not give int32 through one API and float64 through another.

    ``strategy.reduce`` keeps int32, following TensorFlow's single-value shortcut in
    ``CrossDeviceOps.reduce`` *and* ``batch_reduce`` (reference 2.8); every API must agree.
    """
    strategy = mirrored_strategy_for(1)
    arrays = [np.array([3, 4], dtype=np.int32)]
    value = distribute(strategy, arrays)
    reference = np.asarray(strategy.reduce(MEAN, value, axis=None))
    result = {
        "reduce_to": lambda: strategy.extended.reduce_to(MEAN, value, value),
        "batch_reduce_to": lambda: strategy.extended.batch_reduce_to(MEAN, [(value, value)])[0],
        "all_reduce": lambda: strategy.run(lambda: all_reduce_own(MEAN, arrays)),
    }[api]()
    assert np.asarray(result).dtype == reference.dtype
    np.testing.assert_array_equal(result, reference)


# --- CommunicationOptions(bytes_per_pack) does not change results ---------------------------

BYTES_PER_PACK = [1, 16, 100, 4096, 1 << 20]


@pytest.mark.parametrize("bytes_per_pack", BYTES_PER_PACK)
@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_batch_reduce_to_with_bytes_per_pack_equals_unpacked(ops_strategy, bytes_per_pack, reduce_op):
    specs = [((3,), np.float32), ((10,), np.float32), ((), np.int32), ((4, 4), np.float64), ((0,), np.float32)]
    inputs = [random_values(4, shape, dtype, seed=k) for k, (shape, dtype) in enumerate(specs)]
    values = [distribute(ops_strategy, arrays) for arrays in inputs]
    pairs = [(v, v) for v in values]
    options = CommunicationOptions(bytes_per_pack=bytes_per_pack)
    packed = ops_strategy.extended.batch_reduce_to(reduce_op, pairs, options)
    # Each value alone in its own batch: the same algorithm, with nothing to pack it with.
    # (reduce_to is not a valid baseline: all-reduce ops fall back to one-device summation
    # for it on CPUs, as in TensorFlow, which rounds floats in a different order.)
    unpacked = [ops_strategy.extended.batch_reduce_to(reduce_op, [(v, v)])[0] for v in values]
    for with_packs, alone, arrays in zip(packed, unpacked, inputs):
        assert_mirrored(with_packs, numpy_reduce(reduce_op, arrays), 4)
        # Packing only changes how values travel, never the element-wise sums.
        np.testing.assert_array_equal(np.asarray(with_packs.values[0]), np.asarray(alone.values[0]))


@pytest.mark.parametrize("bytes_per_pack", BYTES_PER_PACK)
def test_all_reduce_with_bytes_per_pack_equals_numpy(ops_strategy, bytes_per_pack):
    specs = [((3,), np.float32), ((8,), np.float32), ((2,), np.int64)]
    inputs = [random_values(4, shape, dtype, seed=k) for k, (shape, dtype) in enumerate(specs)]
    options = CommunicationOptions(bytes_per_pack=bytes_per_pack)

    def step():
        ctx = D.get_replica_context()
        return ctx.all_reduce(SUM, [arrays[ctx.replica_id_in_sync_group] for arrays in inputs], options=options)

    for local in ops_strategy.experimental_local_results(ops_strategy.run(step)):
        for reduced, arrays in zip(local, inputs):
            assert_reduced(reduced, numpy_reduce(SUM, arrays))


# --- errors through a strategy leave it usable ----------------------------------------------


def _mismatched(kind: str) -> list[np.ndarray]:
    odd = np.zeros(4) if kind == "shape" else np.zeros(3, np.float32)
    return [np.zeros(3), np.zeros(3), odd, np.zeros(3)]


def _reduce_with(strategy, api: str, arrays):
    """Reduces ``arrays`` (replica i holds arrays[i]) through the strategy API ``api``."""
    if api == "all_reduce":
        return strategy.run(lambda: all_reduce_own(SUM, arrays))
    value = distribute(strategy, arrays)
    good = distribute(strategy, [np.zeros(3)] * 4)
    return {
        "reduce": lambda: strategy.reduce(SUM, value, axis=None),
        "reduce_to": lambda: strategy.extended.reduce_to(SUM, value, value),
        "batch_reduce_to": lambda: strategy.extended.batch_reduce_to(SUM, [(good, good), (value, value)]),
    }[api]()


@pytest.mark.parametrize("api", ["reduce", "reduce_to", "batch_reduce_to", "all_reduce"])
@pytest.mark.parametrize(("kind", "mentions"), [("shape", ("(3,)", "(4,)")), ("dtype", ("float64", "float32"))])
def test_mismatch_through_strategy_raises_before_data_moves(api, kind, mentions):
    strategy = recording_strategy()
    ops = strategy.extended._cross_device_ops
    ops.calls.clear()
    with pytest.raises(td.errors.InvalidArgumentError, match=MISMATCH_MESSAGE) as info:
        _reduce_with(strategy, api, _mismatched(kind))
    message = str(info.value)
    for text in ("replica 0", "replica 2", *mentions):
        assert text in message
    assert ops.calls == []
    assert_strategy_works(strategy)


@pytest.mark.replicas(4)
def test_non_numeric_value_through_strategy_raises(mirrored_strategy):
    value = distribute(mirrored_strategy, [np.array(["x"])] * 4)
    with pytest.raises(ValueError, match="Reducing across replicas needs numeric values"):
        mirrored_strategy.reduce(SUM, value, axis=None)
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(4)
def test_per_replica_with_the_wrong_number_of_components_raises(mirrored_strategy):
    value = D.PerReplica([np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match="got a PerReplica with 2 components"):
        mirrored_strategy.reduce(SUM, value, axis=None)
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(2, 4)
@pytest.mark.parametrize(("make_pairs", "message"), MALFORMED_PAIRS)
def test_batch_reduce_to_rejects_malformed_pairs(mirrored_strategy, make_pairs, message):
    value = distribute(mirrored_strategy, random_values(mirrored_strategy.num_replicas_in_sync))
    with pytest.raises(ValueError, match=re.escape(f"Each element of `value_destination_pairs` {message}")):
        mirrored_strategy.extended.batch_reduce_to(SUM, make_pairs(value))
    assert_strategy_works(mirrored_strategy)


@pytest.mark.replicas(2, 4)
@pytest.mark.parametrize(
    ("destinations", "message"),
    [
        ("", "destinations can not be empty"),
        (42, "destinations must be one of"),
        (object(), "destinations must be one of"),
    ],
    ids=["empty", "int", "object"],
)
def test_strategy_destinations_are_validated(mirrored_strategy, destinations, message):
    value = distribute(mirrored_strategy, random_values(mirrored_strategy.num_replicas_in_sync))
    with pytest.raises(ValueError, match=message):
        mirrored_strategy.extended.reduce_to(SUM, value, destinations)
    with pytest.raises(ValueError, match=message):
        mirrored_strategy.extended.broadcast_to(np.zeros(2), destinations)
    assert_strategy_works(mirrored_strategy)


# --- large buffers (chunked, parallel reduction) --------------------------------------------

LARGE = (1 << 20,)  # 4 MiB of float32 per replica


def _large_values(dtype=np.float32) -> list[np.ndarray]:
    """Integer-valued data: every sum is exact in float32, so results compare exactly."""
    rng = np.random.default_rng(7)
    return [rng.integers(-1000, 1000, size=LARGE).astype(dtype) for _ in range(4)]


@pytest.mark.parametrize("reduce_op", [SUM, MEAN])
def test_large_all_reduce_in_run_is_exact(ops_strategy, reduce_op):
    arrays = _large_values()
    expected = np.add(np.add(np.add(arrays[0], arrays[1]), arrays[2]), arrays[3])
    if reduce_op is MEAN:
        expected = expected / np.float32(4)  # a power of two: exact

    result = ops_strategy.run(lambda: all_reduce_own(reduce_op, arrays))
    for local in ops_strategy.experimental_local_results(result):
        assert local.dtype == np.float32
        np.testing.assert_array_equal(local, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_large_reduce_in_cross_replica_context_is_exact(ops_strategy, dtype):
    arrays = _large_values(dtype)
    expected = np.add(np.add(np.add(arrays[0], arrays[1]), arrays[2]), arrays[3])
    with ops_strategy.scope():
        result = ops_strategy.reduce(SUM, distribute(ops_strategy, arrays), axis=None)
    assert result.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(result, expected)


# --- CommunicationOptions -------------------------------------------------------------------


def test_communication_options_defaults():
    options = CommunicationOptions()
    assert options.bytes_per_pack == 0
    assert options.timeout_seconds is None
    assert options.implementation is CommunicationImplementation.AUTO


def test_communication_options_str_is_tensorflows():
    # Reference 2.8, including the missing space after the first comma.
    options = CommunicationOptions(
        bytes_per_pack=1024, timeout_seconds=5, implementation=CommunicationImplementation.RING
    )
    expected = "Options(bytes_per_pack=1024,timeout_seconds=5, implementation=CommunicationImplementation.RING)"
    assert str(options) == expected


def test_negative_bytes_per_pack_is_rejected():
    with pytest.raises(ValueError, match=re.escape("Argument `bytes_per_pack` must be >=0, Received -1.")):
        CommunicationOptions(bytes_per_pack=-1)


@pytest.mark.parametrize("seconds", [-1, 0, 0.0, -0.5])
def test_a_timeout_of_zero_or_less_is_accepted_and_means_no_bound(seconds):
    # TensorFlow 2.21 accepts them and keeps the value ("Zero disables timeout"; its collective
    # ops schedule a timeout only when it is positive: a 2-worker all_reduce waits for a late peer).
    options = CommunicationOptions(timeout_seconds=seconds)
    assert options.timeout_seconds == seconds
    assert str(options) == f"Options(bytes_per_pack=0,timeout_seconds={seconds}, implementation=CommunicationImplementation.AUTO)"
    # per call, it overrides the strategy's bound, as any timeout that is not None does in TF
    assert CommunicationOptions(timeout_seconds=5).merge(options).timeout_seconds == seconds
    workers = D.MultiWorkerMirroredStrategy(communication_options=CommunicationOptions(timeout_seconds=5)).extended._workers
    assert workers.bounds(options)[0] is None
    assert workers.bounds(None)[0] == 5.0


@pytest.mark.parametrize("seconds", ["10", [1], True])
def test_a_timeout_that_is_not_a_number_is_a_type_error(seconds):
    with pytest.raises(TypeError, match=r"Argument `timeout_seconds` must be a number of seconds or None\. Received timeout_seconds="):
        CommunicationOptions(timeout_seconds=seconds)


def test_a_nan_timeout_is_a_value_error():
    with pytest.raises(ValueError, match="0 or less: no bound"):
        CommunicationOptions(timeout_seconds=float("nan"))


@pytest.mark.parametrize("implementation", [3, object(), None])
def test_implementation_of_another_type_is_rejected(implementation):
    with pytest.raises(ValueError, match=re.escape("Argument `implementation` must be instance of")):
        CommunicationOptions(implementation=implementation)


def test_unknown_implementation_name_is_rejected():
    with pytest.raises(ValueError, match=re.escape("Argument `implementation`")):
        CommunicationOptions(implementation="fastest")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ring", CommunicationImplementation.RING),
        ("Ring", CommunicationImplementation.RING),
        ("RING", CommunicationImplementation.RING),
        ("nccl", CommunicationImplementation.NCCL),
        ("auto", CommunicationImplementation.AUTO),
    ],
)
def test_implementation_name_is_case_insensitive(name, expected):
    assert CommunicationOptions(implementation=name).implementation is expected


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # an old name, used on purpose
def test_collective_communication_is_an_alias():
    # Reference 2.7: CommunicationImplementation (alias CollectiveCommunication).
    assert D.experimental.CollectiveCommunication is CommunicationImplementation


@pytest.mark.parametrize(
    ("base", "other", "expected"),
    [
        pytest.param((1024, 5, "RING"), (0, None, "AUTO"), (1024, 5, "RING"), id="defaults-do-not-override"),
        pytest.param((0, None, "AUTO"), (2048, None, "AUTO"), (2048, None, "AUTO"), id="bytes_per_pack"),
        pytest.param((0, None, "AUTO"), (0, 7, "AUTO"), (0, 7, "AUTO"), id="timeout"),
        pytest.param((1024, 5, "RING"), (0, 10, "NCCL"), (1024, 10, "NCCL"), id="mixed"),
        pytest.param((1024, 5, "RING"), (4096, 1, "AUTO"), (4096, 1, "RING"), id="all-but-implementation"),
    ],
)
def test_merge_overrides_with_the_non_default_fields(base, other, expected):
    # Reference 2.8: each non-default field of `other` overrides.
    base_options = CommunicationOptions(*base)
    merged = base_options.merge(CommunicationOptions(*other))
    assert (merged.bytes_per_pack, merged.timeout_seconds, merged.implementation.name) == expected
    assert merged is not base_options
    assert (base_options.bytes_per_pack, base_options.timeout_seconds, base_options.implementation.name) == base


def test_merge_with_none_is_an_equal_copy():
    options = CommunicationOptions(bytes_per_pack=64, timeout_seconds=2, implementation="nccl")
    merged = options.merge(None)
    assert merged == options
    assert merged is not options


# --- a user's CrossDeviceOps serves every reduction, the collective path included -------------


class _SummingOps(D.CrossDeviceOps):
    """A minimal user subclass: only TensorFlow's ``reduce_implementation`` hook."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        self.calls += 1
        total = np.sum([np.asarray(c) for c in per_replica_value.values], axis=0)
        if reduce_op is MEAN:
            total = total / len(per_replica_value.values)
        return D.Mirrored([total.copy() for _ in destinations], destinations)


def _rid() -> int:
    return int(D.get_replica_context().replica_id_in_sync_group)


def test_a_user_cross_device_ops_serves_all_reduce_batch_reduce_and_optimizers():
    ops = _SummingOps()
    strategy = D.MirroredStrategy(cpus(2), cross_device_ops=ops)
    reduced = strategy.run(lambda: D.get_replica_context().all_reduce(SUM, np.full(3, _rid() + 1.0)))
    assert [r.tolist() for r in strategy.experimental_local_results(reduced)] == [[3.0] * 3] * 2
    value = distribute(strategy, [np.ones(2), np.full(2, 2.0)])
    (batch,) = strategy.extended.batch_reduce_to(SUM, [(value, value)])
    assert [c.tolist() for c in batch.values] == [[3.0, 3.0]] * 2
    with strategy.scope():
        w = td.Variable(np.zeros(2, np.float32))
        opt = td.optimizers.SGD(1.0)
    strategy.run(lambda: opt.apply_gradients([(np.full(2, _rid() + 1.0, np.float32), w)]))
    assert [c.numpy().tolist() for c in w.values] == [[-3.0, -3.0]] * 2
    assert ops.calls >= 3  # every one went through the user's hook
