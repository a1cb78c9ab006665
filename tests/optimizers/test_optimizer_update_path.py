"""The optimizer's update path: shared buffer groups, reused buffers, the host step counter.

``apply_gradients`` runs the update rule once per group of components that share a host
buffer, writes new values into buffers reused from step to step when no snapshot looks at
them, and counts steps on the host. These tests pin that none of this can be observed
except as speed: snapshots never change, replica-local writes are respected, the step
counter follows writes made by others, and splitting the work over parked replica threads
gives the same values.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import towerdist as td
from towerdist._src.optimizers import optimizer as optimizer_lib

from numpy_reference import NumpyReference


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def model(strategy, shapes=((4, 3), (3,)), name="m"):
    with strategy.scope():
        variables = [td.Variable(np.full(shape, 1.0, np.float32), name=f"{name}{k}") for k, shape in enumerate(shapes)]
        return variables


def replica_grads(variables, step: int, replica: int):
    return [np.full(v.shape, 0.25 * (step + 1) + replica, np.float32) for v in variables]


def step_all(strategy, opt, variables, step: int) -> None:
    strategy.run(lambda: opt.apply_gradients(zip(replica_grads(variables, step, rid()), variables)))


# --- snapshots are never changed by the optimizer --------------------------------------------


@pytest.mark.parametrize("make_optimizer", [lambda: td.optimizers.SGD(0.1), lambda: td.optimizers.Adam(0.1),
                                            lambda: td.optimizers.SGD(0.1, momentum=0.9)],
                         ids=["sgd", "adam", "momentum"])
def test_a_snapshot_taken_between_steps_never_changes(mirrored_strategy, make_optimizer):
    variables = model(mirrored_strategy)
    with mirrored_strategy.scope():
        opt = make_optimizer()
    snapshots = []
    for step in range(6):
        step_all(mirrored_strategy, opt, variables, step)
        value = variables[0].value()
        snapshots.append((value, value.copy()))
    for value, expected in snapshots:
        np.testing.assert_array_equal(value, expected)
    assert len({float(v[0, 0]) for v, _ in snapshots}) == 6  # the variable did change every step


def test_a_snapshot_of_a_slot_never_changes(mirrored_strategy):
    variables = model(mirrored_strategy)
    with mirrored_strategy.scope():
        opt = td.optimizers.Adam(0.1)
    step_all(mirrored_strategy, opt, variables, 0)
    slot = opt.get_slot(variables[0], "m")
    held = np.asarray(slot)
    copy = held.copy()
    for step in range(1, 5):
        step_all(mirrored_strategy, opt, variables, step)
    np.testing.assert_array_equal(held, copy)
    assert not np.array_equal(np.asarray(slot), copy)


def test_buffers_are_reused_when_no_snapshot_looks_at_them(mirrored_strategy):
    variables = model(mirrored_strategy, shapes=((64, 64),))
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(0.1)
    step_all(mirrored_strategy, opt, variables, 0)
    step_all(mirrored_strategy, opt, variables, 1)
    published = weakref.ref(variables[0].values[0]._array)  # a weak reference holds no snapshot
    step_all(mirrored_strategy, opt, variables, 2)
    step_all(mirrored_strategy, opt, variables, 3)
    assert variables[0].values[0]._array is published()  # two steps later the same buffer is back


def test_a_held_snapshot_keeps_its_buffer_out_of_reuse(mirrored_strategy):
    variables = model(mirrored_strategy, shapes=((64, 64),))
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(0.1)
    step_all(mirrored_strategy, opt, variables, 0)
    step_all(mirrored_strategy, opt, variables, 1)
    held = variables[0].value()  # a snapshot of the current buffer
    expected = held.copy()
    for step in range(2, 6):
        step_all(mirrored_strategy, opt, variables, step)
        assert not np.shares_memory(variables[0].values[0]._array, held)
    np.testing.assert_array_equal(held, expected)


# --- components that share a buffer, and those that do not -----------------------------------


@pytest.mark.replicas(4)
def test_copies_of_a_variable_on_logical_cpus_hold_one_buffer_after_a_step(mirrored_strategy):
    variables = model(mirrored_strategy)
    with mirrored_strategy.scope():
        opt = td.optimizers.Adam(0.1)
    step_all(mirrored_strategy, opt, variables, 0)
    for var in [*variables, opt.get_slot(variables[0], "m"), opt.get_slot(variables[0], "v")]:
        arrays = [c._array for c in var.values]
        assert all(a is arrays[0] for a in arrays)


def test_a_replica_local_write_is_updated_on_its_own(mirrored_strategy):
    (w,) = model(mirrored_strategy, shapes=((3,),))  # aggregation NONE: a replica may write its own copy
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(0.5)
    mirrored_strategy.run(lambda: w.assign(np.full(3, 10.0, np.float32)) if rid() == 1 else None)
    mirrored_strategy.run(lambda: opt.apply_gradients([(np.full(3, rid() + 1.0, np.float32), w)]))
    # The summed gradient (1 + 2 = 3) is applied to each copy's own value.
    np.testing.assert_allclose(w.values[0].numpy(), np.full(3, 1.0 - 0.5 * 3))
    np.testing.assert_allclose(w.values[1].numpy(), np.full(3, 10.0 - 0.5 * 3))


def test_gradients_passed_already_summed_update_each_copy_with_its_own(mirrored_strategy):
    (w,) = model(mirrored_strategy, shapes=((2,),))
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(1.0)
    mirrored_strategy.run(
        lambda: opt.apply_gradients([(np.full(2, rid() + 1.0, np.float32), w)], experimental_aggregate_gradients=False)
    )
    assert [c.numpy().tolist() for c in w.values] == [[0.0, 0.0], [-1.0, -1.0]]


# --- the step counter -----------------------------------------------------------------------


def test_the_step_counter_follows_an_assign_made_by_someone_else(mirrored_strategy):
    variables = model(mirrored_strategy)
    with mirrored_strategy.scope():
        opt = td.optimizers.Adam(0.1)
        twin = td.optimizers.Adam(0.1)
        twin_variables = model(mirrored_strategy, name="twin")
    for step in range(3):
        step_all(mirrored_strategy, opt, variables, step)
    opt.iterations.assign(40)
    twin.build(twin_variables)
    for var, twin_var in zip(variables, twin_variables):
        twin_var.assign(var.values[0].numpy())
        for name in ("m", "v"):
            twin.get_slot(twin_var, name).assign(opt.get_slot(var, name).values[0].numpy())
    twin.iterations.assign(40)
    step_all(mirrored_strategy, opt, variables, 3)
    step_all(mirrored_strategy, twin, twin_variables, 3)
    assert int(opt.iterations.numpy()) == 41
    for var, twin_var in zip(variables, twin_variables):
        np.testing.assert_array_equal(var.values[0].numpy(), twin_var.values[0].numpy())


def test_the_step_counter_of_a_restored_checkpoint_is_used(tmp_path):
    w = td.Variable(np.zeros(2, np.float32))
    opt = td.optimizers.Adam(0.1)
    checkpoint = td.train.Checkpoint(w=w, opt=opt)
    for _ in range(5):
        opt.apply_gradients([(np.ones(2, np.float32), w)])
    path = checkpoint.write(str(tmp_path / "ckpt"))
    before = w.numpy()
    opt.apply_gradients([(np.ones(2, np.float32), w)])
    checkpoint.read(path)
    assert int(opt.iterations.numpy()) == 5
    np.testing.assert_array_equal(w.numpy(), before)
    opt.apply_gradients([(np.ones(2, np.float32), w)])
    assert int(opt.iterations.numpy()) == 6
    reference = NumpyReference("Adam", learning_rate=0.1)
    params = [np.zeros(2, np.float32)]
    for _ in range(6):
        params = reference.apply(params, [np.ones(2, np.float32)])
    np.testing.assert_allclose(w.numpy(), params[0], rtol=1e-6)


def test_a_learning_rate_schedule_sees_every_step(mirrored_strategy):
    (w,) = model(mirrored_strategy, shapes=((1,),))
    seen: list[int] = []
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(lambda step: seen.append(int(step)) or 0.1)
    for step in range(4):
        step_all(mirrored_strategy, opt, [w], step)
    assert seen == [0, 1, 2, 3]


# --- shares over the parked replica threads ---------------------------------------------------


@pytest.mark.replicas(4)
@pytest.mark.parametrize("make_optimizer", [lambda: td.optimizers.SGD(0.05, momentum=0.5), lambda: td.optimizers.Adam(0.05)],
                         ids=["momentum", "adam"])
def test_splitting_the_update_over_parked_replicas_gives_the_same_values(
    mirrored_strategy, monkeypatch, make_optimizer
):
    shapes = ((8, 8), (8,), (8, 4), (4,), (16, 2))
    serial_vars, split_vars = model(mirrored_strategy, shapes, "serial"), model(mirrored_strategy, shapes, "split")
    with mirrored_strategy.scope():
        serial_opt, split_opt = make_optimizer(), make_optimizer()
    for step in range(4):
        step_all(mirrored_strategy, serial_opt, serial_vars, step)
    shares_used: list[int] = []
    real_shares = optimizer_lib.Optimizer._shares

    def recording_shares(self, plans):
        shares = real_shares(self, plans)
        shares_used.append(len(shares))
        return shares

    monkeypatch.setattr(optimizer_lib, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(optimizer_lib.Optimizer, "_shares", recording_shares)
    for step in range(4):
        step_all(mirrored_strategy, split_opt, split_vars, step)
    assert shares_used and min(shares_used) > 1  # the work really was split
    for a, b in zip(serial_vars, split_vars):
        for ca, cb in zip(a.values, b.values):
            np.testing.assert_array_equal(ca.numpy(), cb.numpy())


# --- the sum of host gradients, added on the merging thread ---------------------------------


def count_all_reduces(monkeypatch, extended_class) -> list[int]:
    """Counts the calls of ``extended_class._all_reduce`` in ``calls[0]`` (the list returned)."""
    real_all_reduce = extended_class._all_reduce
    calls = [0]

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return real_all_reduce(self, *args, **kwargs)

    monkeypatch.setattr(extended_class, "_all_reduce", counting)
    return calls


@pytest.mark.replicas(4)
@pytest.mark.parametrize("make_optimizer", [lambda: td.optimizers.SGD(0.1), lambda: td.optimizers.Adam(0.1)],
                         ids=["sgd", "adam"])
def test_sums_added_on_the_merging_thread_equal_the_all_reduce(mirrored_strategy, monkeypatch, make_optimizer):
    shapes = ((8, 8), (8,), (16, 2))
    rng = np.random.default_rng(7)
    grads = [[[(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3, size=shape)).astype(np.float32)
               for shape in shapes] for _ in range(4)] for _ in range(5)]  # sums that depend on their order

    extended = type(mirrored_strategy.extended)
    calls = count_all_reduces(monkeypatch, extended)

    def train(name: str):
        variables = model(mirrored_strategy, shapes, name)
        with mirrored_strategy.scope():
            opt = make_optimizer()
        per_step = []
        for step in range(5):
            before = calls[0]
            mirrored_strategy.run(lambda g=grads[step]: opt.apply_gradients(zip(g[rid()], variables)))
            per_step.append(calls[0] - before)
        return [v.values[0].numpy() for v in variables], per_step

    assert mirrored_strategy.extended._sums_host_arrays_in_order()
    added, per_step = train("added")
    assert per_step == [0] * 5  # the merging thread added the gradients itself
    monkeypatch.setattr(extended, "_sums_host_arrays_in_order", lambda self: False)
    reduced, per_step = train("reduced")
    assert per_step == [1] * 5
    for a, b in zip(added, reduced):
        np.testing.assert_array_equal(a, b)


def _train_three_replicas(strategy, shapes, dtype, make_optimizer, grads, cross_replica, name):
    with strategy.scope():
        variables = [td.Variable(np.full(shape, 1.0, dtype), name=f"{name}{k}") for k, shape in enumerate(shapes)]
        opt = make_optimizer()
    for step in grads:
        if cross_replica:
            per_replica = [td.distribute.PerReplica([replica[k] for replica in step]) for k in range(len(shapes))]
            opt.apply_gradients(zip(per_replica, variables))
        else:
            strategy.run(lambda g=step: opt.apply_gradients(zip(g[rid()], variables)))
    return [v.values[0].numpy() for v in variables]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shapes", [((),), ((), (3,)), ((5, 7), ())], ids=["scalar", "scalar+vector", "matrix+scalar"])
@pytest.mark.parametrize("cross_replica", [False, True], ids=["in_run", "cross_replica"])
@pytest.mark.parametrize("chunked", [False, True], ids=["default_ops", "chunked_packed_ops"])
@pytest.mark.parametrize("make_optimizer", [lambda: td.optimizers.SGD(0.1), lambda: td.optimizers.Adam(0.1),
                                            lambda: td.optimizers.RMSprop(0.1, momentum=0.5, centered=True)],
                         ids=["sgd", "adam", "rmsprop"])
def test_sums_added_here_equal_the_all_reduce_in_every_form(monkeypatch, dtype, shapes, cross_replica, chunked,
                                                            make_optimizer):
    # The collective's chunked, parallel and packed reductions add in replica order too.
    ops = td.distribute.SharedMemoryAllReduce(chunk_bytes=8, parallel_threshold_bytes=16, pack_bytes=1 << 20)
    strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"], cross_device_ops=ops if chunked else None)
    rng = np.random.default_rng(3)
    grads = [[[np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 1, size=shape), dtype) for shape in shapes]
              for _ in range(3)] for _ in range(4)]  # (np.asarray: a 0-d gradient is an array, as a replica's would be)
    extended = type(strategy.extended)
    calls = count_all_reduces(monkeypatch, extended)
    assert strategy.extended._sums_host_arrays_in_order()
    added = _train_three_replicas(strategy, shapes, dtype, make_optimizer, grads, cross_replica, "added")
    added_calls = calls[0]
    monkeypatch.setattr(extended, "_sums_host_arrays_in_order", lambda self: False)
    reduced = _train_three_replicas(strategy, shapes, dtype, make_optimizer, grads, cross_replica, "reduced")
    assert added_calls < calls[0] - added_calls  # the first training added (some of) its sums itself
    for a, b in zip(added, reduced):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


def test_a_users_cross_device_ops_does_every_steps_sum(monkeypatch):
    class Summing(td.distribute.CrossDeviceOps):
        calls = 0

        def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
            Summing.calls += 1
            total = np.sum([np.asarray(c) for c in per_replica_value.values], axis=0)
            return td.distribute.Mirrored([total.copy() for _ in destinations], destinations)

    strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"], cross_device_ops=Summing())
    assert not strategy.extended._sums_host_arrays_in_order()
    variables = model(strategy)
    with strategy.scope():
        opt = td.optimizers.SGD(0.1)
    for step in range(4):
        before = Summing.calls
        step_all(strategy, opt, variables, step)
        assert Summing.calls > before  # the steady steps too
    expected = 1.0 - 0.1 * sum(2 * 0.25 * (step + 1) + 1 for step in range(4))
    np.testing.assert_allclose(variables[0].values[1].numpy(), np.full((4, 3), expected, np.float32), rtol=1e-6)


# --- one replica runs on the caller's thread -------------------------------------------------


@pytest.mark.replicas(1)
def test_a_one_replica_step_runs_on_the_callers_thread(mirrored_strategy):
    import threading

    assert mirrored_strategy.run(threading.get_ident) == threading.get_ident()
    merged = mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: "merged"))
    assert merged == "merged"
    with pytest.raises(ZeroDivisionError) as info:
        mirrored_strategy.run(lambda: 1 / 0)
    assert "Raised in replica 0 (on /cpu:0)" in "\n".join(info.value.__notes__)
    assert not td.distribute.has_strategy()
