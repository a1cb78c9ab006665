"""``Strategy.run`` and friends on every strategy, as TensorFlow 2.21 behaves and documents them."""

from __future__ import annotations

import copy
import threading
import warnings

import numpy as np
import pytest

import towerdist as td
from towerdist._src import device as device_lib
from towerdist.testing.pytest_plugin import mirrored_strategy_for

from conftest import NUM_CPUS, cpus


def replica_id() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


# --- run ----------------------------------------------------------------------------------


def test_run_doc_example_same_input_gives_per_replica_results(any_strategy):
    """Reference D3: input * 2.0 with one shared constant input."""
    result = any_strategy.run(lambda x: x * 2.0, args=(td.constant(3.0),))
    parts = any_strategy.experimental_local_results(result)
    assert len(parts) == any_strategy.num_replicas_in_sync
    assert all(p == np.float32(6.0) and p.dtype == np.float32 for p in parts)
    if any_strategy.num_replicas_in_sync > 1:
        assert isinstance(result, td.distribute.PerReplica)
    else:
        assert not isinstance(result, td.distribute.DistributedValues)  # one replica never wraps


@pytest.mark.replicas(1, 2, 4)
def test_run_identical_python_ints_are_not_wrapped(mirrored_strategy):
    """Reference D4: every replica returns the same Python int, which stays unwrapped."""
    values = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: ctx.num_replicas_in_sync)
    assert mirrored_strategy.run(lambda x: x * 2, args=(values,)) == 2 * mirrored_strategy.num_replicas_in_sync


@pytest.mark.replicas(1, 2, 4)
def test_run_returns_the_replica_ids_as_a_per_replica(mirrored_strategy):
    ids = mirrored_strategy.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    parts = mirrored_strategy.experimental_local_results(ids)
    assert [int(p) for p in parts] == list(range(mirrored_strategy.num_replicas_in_sync))
    assert all(p.dtype == np.int32 for p in parts)


@pytest.mark.replicas(4)
def test_replica_id_is_hashable_and_indexes(mirrored_strategy):
    table = np.array([10.0, 20.0, 30.0, 40.0])
    picked = mirrored_strategy.run(lambda: table[td.distribute.get_replica_context().replica_id_in_sync_group])
    assert mirrored_strategy.experimental_local_results(picked) == (10.0, 20.0, 30.0, 40.0)

    def lookup() -> str:
        table = {td.distribute.get_replica_context().replica_id_in_sync_group: "found"}
        return table.get(replica_id(), "missing")  # the int32 id hashes like the Python int

    assert mirrored_strategy.run(lookup) == "found"


@pytest.mark.replicas(4)
def test_run_splits_per_replica_args_and_kwargs(mirrored_strategy):
    values = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)
    result = mirrored_strategy.run(lambda a, b=None: (a, b["k"]), args=(values,), kwargs={"b": {"k": values}})
    firsts, seconds = result
    assert mirrored_strategy.experimental_local_results(firsts) == (0, 1, 2, 3)
    assert mirrored_strategy.experimental_local_results(seconds) == (0, 1, 2, 3)


def test_run_accepts_a_list_of_args_and_run_options(mirrored_strategy):
    assert mirrored_strategy.run(lambda a, b: a + b, args=[1, 2], options=td.distribute.RunOptions()) == 3


@pytest.mark.parametrize("bad_args", [td.constant(3.0), 3, "ab", {"a": 1}])
def test_run_rejects_args_that_are_not_a_list_or_tuple(any_strategy, bad_args):
    with pytest.raises(ValueError, match="positional args must be a list or tuple"):
        any_strategy.run(lambda x: x, args=bad_args)
    assert any_strategy.run(lambda: 4) == 4


def test_run_rejects_kwargs_that_are_not_a_dict(mirrored_strategy):
    with pytest.raises(TypeError, match=r"Strategy.run\(\) takes kwargs as a dict"):
        mirrored_strategy.run(lambda **kw: kw, kwargs=[("a", 1)])


def test_run_rejects_a_per_replica_of_another_size(mirrored_strategy):
    four_replicas = mirrored_strategy_for(4)
    values = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)
    with pytest.raises(ValueError, match=r"Strategy.run\(\) got a PerReplica with 2 components at args\[0\]"):
        four_replicas.run(lambda x: x, args=(values,))
    assert four_replicas.run(lambda: 5) == 5


def test_experimental_run_v2_is_run(mirrored_strategy):
    with warnings.catch_warnings():  # the old name warns once per process (tested in test_legacy_names.py)
        warnings.simplefilter("ignore", DeprecationWarning)
        assert mirrored_strategy.experimental_run_v2(lambda x: x + 1, args=(1,)) == 2


def test_call_for_each_replica_is_run(mirrored_strategy):
    assert mirrored_strategy.extended.call_for_each_replica(lambda a: a + 1, args=(1,)) == 2


def test_one_device_run_is_inline_under_its_device(one_device_cpu):
    caller = threading.get_ident()
    seen = one_device_cpu.run(lambda: (threading.get_ident(), device_lib.current()))
    assert seen == (caller, device_lib.parse("/cpu:0"))


def test_one_device_run_results_accumulate_without_wrapping(one_device_cpu):
    total = 0
    for i in range(10):
        total += one_device_cpu.run(lambda x: x * 2, args=(i,))
    assert total == 90


def test_default_strategy_run_is_a_replica_context(default):
    seen = default.run(lambda: (td.distribute.in_cross_replica_context(), td.distribute.get_strategy()))
    assert seen == (False, default)


# --- values from functions and local results ----------------------------------------------


@pytest.mark.replicas(1, 2, 4)
def test_values_from_function_always_wraps_on_mirrored(mirrored_strategy):
    value = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: 1)
    assert isinstance(value, td.distribute.PerReplica)
    assert value.values == (1,) * mirrored_strategy.num_replicas_in_sync


@pytest.mark.parametrize("name", ["default", "one_device_cpu"])
def test_values_from_function_is_unwrapped_on_single_replica_strategies(request, name):
    strategy = request.getfixturevalue(name)
    seen = strategy.experimental_distribute_values_from_function(
        lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync)
    )
    assert seen == (0, 1)


def test_distribute_values_from_function_doc_example(mirrored_strategy):
    array_value = np.array([3.0, 2.0, 1.0])
    picked = mirrored_strategy.experimental_distribute_values_from_function(
        lambda ctx: array_value[ctx.replica_id_in_sync_group]
    )
    assert mirrored_strategy.experimental_local_results(picked) == (3.0, 2.0)
    counts = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: ctx.num_replicas_in_sync)
    assert mirrored_strategy.experimental_local_results(counts) == (2, 2)


@pytest.mark.replicas(4)
def test_values_from_function_runs_under_each_replica_device(mirrored_strategy):
    value = mirrored_strategy.experimental_distribute_values_from_function(lambda ctx: device_lib.current().name)
    assert mirrored_strategy.experimental_local_results(value) == mirrored_strategy.extended.worker_devices


def test_local_results_of_plain_values(any_strategy):
    assert any_strategy.experimental_local_results(5) == (5,)


# --- construction and properties ----------------------------------------------------------


def test_mirrored_devices_are_canonical_and_keep_their_order():
    strategy = td.distribute.MirroredStrategy(["CPU:1", "/cpu:0"])
    expected = ("/job:localhost/replica:0/task:0/device:CPU:1", "/job:localhost/replica:0/task:0/device:CPU:0")
    assert strategy.extended.worker_devices == expected
    assert strategy.extended.parameter_devices == expected
    assert strategy.num_replicas_in_sync == 2
    assert strategy.cluster_resolver is None


@pytest.mark.parametrize("devices", [None, []])
def test_mirrored_defaults_to_all_logical_cpus_without_gpus(devices):
    assert td.distribute.MirroredStrategy(devices).num_replicas_in_sync == NUM_CPUS


def test_mirrored_repr_names_its_devices(mirrored_strategy):
    assert repr(mirrored_strategy) == "MirroredStrategy(devices=('/cpu:0', '/cpu:1'))"


def test_one_device_properties(one_device_cpu):
    assert one_device_cpu.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert one_device_cpu.num_replicas_in_sync == 1


@pytest.mark.parametrize("prop", ["worker_devices", "parameter_devices"])
def test_default_strategy_has_no_devices(default, prop):
    with pytest.raises(RuntimeError, match=f"{prop}\\(\\) method unsupported by default"):
        getattr(default.extended, prop)


def test_mirrored_rejects_a_single_string():
    with pytest.raises(TypeError, match="MirroredStrategy takes a list of devices"):
        td.distribute.MirroredStrategy("CPU:0")


def test_mirrored_rejects_a_foreign_cross_device_ops():
    with pytest.raises(TypeError, match="cross_device_ops must be a td.distribute.CrossDeviceOps"):
        td.distribute.MirroredStrategy(cpus(2), cross_device_ops="nccl")


def test_one_device_rejects_an_unknown_device():
    with pytest.raises(ValueError, match=r"OneDeviceStrategy got device='CPU:99'"):
        td.distribute.OneDeviceStrategy("CPU:99")


def test_static_shapes_are_not_required(any_strategy):
    assert any_strategy.extended.experimental_require_static_shapes is False


def test_copy_raises_and_deepcopy_makes_an_equivalent_strategy(mirrored_strategy):
    with pytest.raises(RuntimeError, match="Must only deepcopy"):
        copy.copy(mirrored_strategy)
    clone = copy.deepcopy(mirrored_strategy)
    assert clone is not mirrored_strategy
    assert clone.extended.worker_devices == mirrored_strategy.extended.worker_devices
    assert clone.experimental_local_results(clone.run(replica_id)) == (0, 1)


def test_default_strategy_cannot_be_copied(default):
    with pytest.raises(RuntimeError, match="Should only create a single instance"):
        copy.deepcopy(default)
