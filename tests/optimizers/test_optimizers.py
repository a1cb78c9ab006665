"""The training kit (DESIGN 7): ``td.optimizers``, ``td.nn`` loss scaling and ``td.Module``.

Optimizers are checked against a plain single-device numpy implementation of Keras's update
rules (``NumpyReference`` below: SGD, momentum, Nesterov, Adam, AMSGrad), fed the gradient of
the whole global batch. The distributed runs split that batch between replicas, so each
replica passes its own partial gradient and ``apply_gradients`` must sum them (one
``batch_reduce_to(SUM)``) before updating every component of every variable and slot.

The loss-scaling expectations were checked against TensorFlow 2.21
(``tf.nn.compute_average_loss`` / ``scale_regularization_loss``); the expected numbers here
are recomputed with numpy from TensorFlow's rules (weighted losses in float32, cast back
to the input dtype, summed, divided by the global batch size).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

import towerdist as td

from conftest import cpus, mirrored_param
from numpy_reference import NumpyReference

PerReplica = td.distribute.PerReplica
ReduceOp = td.distribute.ReduceOp
ContextError = td.errors.ContextError
InvalidArgumentError = td.errors.InvalidArgumentError

# --- shared data: several variables of different shapes and dtypes ------------------------

SPECS = [((3, 2), np.float32), ((4,), np.float32), ((), np.float32), ((2, 2), np.float64)]
GLOBAL_BATCH = 8  # divisible by 1, 2 and 4 replicas
N_STEPS = 4

_rng = np.random.default_rng(20240611)
INITIAL = [np.asarray(_rng.normal(size=shape), dtype=dtype) for shape, dtype in SPECS]
# Per-example gradients of every step. They shrink 4x per step, so that Adam's second moment
# decreases with beta_2=0.5 (the AMSGrad configuration then differs from plain Adam).
PER_EXAMPLE = [
    [np.asarray(_rng.normal(size=(GLOBAL_BATCH, *shape)) * 4.0**-step, dtype=dtype) for shape, dtype in SPECS]
    for step in range(N_STEPS)
]

CONFIGS = [
    pytest.param("SGD", {"learning_rate": 0.1}, id="sgd"),
    pytest.param("SGD", {"learning_rate": 0.1, "momentum": 0.9}, id="sgd_momentum"),
    pytest.param("SGD", {"learning_rate": 0.1, "momentum": 0.8, "nesterov": True}, id="sgd_nesterov"),
    pytest.param("Adam", {"learning_rate": 0.05}, id="adam"),
    pytest.param("Adam", {"learning_rate": 0.05, "beta_1": 0.8, "beta_2": 0.5, "amsgrad": True}, id="amsgrad"),
]
SOME_CONFIGS = [CONFIGS[1], CONFIGS[4]]

CANONICAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"


def replica_gradients(step: int, replica: int, num_replicas: int) -> list[np.ndarray]:
    """The gradient of replica ``replica``'s slice of the global batch (scaled by the global batch)."""
    size = GLOBAL_BATCH // num_replicas
    return [
        np.asarray(g[replica * size:(replica + 1) * size].sum(axis=0) / GLOBAL_BATCH, dtype=g.dtype)
        for g in PER_EXAMPLE[step]
    ]


def full_gradients(step: int) -> list[np.ndarray]:
    """The gradient of the whole global batch: what the replicas' gradients sum to."""
    return [np.asarray(g.astype(np.float64).sum(axis=0) / GLOBAL_BATCH, dtype=g.dtype) for g in PER_EXAMPLE[step]]


def reference_run(kind: str, hparams: dict, n_steps: int = N_STEPS) -> tuple[list[np.ndarray], NumpyReference]:
    ref = NumpyReference(kind, **hparams)
    weights = [w.copy() for w in INITIAL]
    for step in range(n_steps):
        weights = ref.apply(weights, full_gradients(step))
    return weights, ref


# --- helpers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def css_remote() -> td.distribute.experimental.CentralStorageStrategy:
    """CentralStorage computing on CPU:0 and CPU:1 with its parameters on CPU:2 (a device of its own)."""
    return td.distribute.experimental.CentralStorageStrategy(compute_devices=cpus(2), parameter_device="CPU:2")



EVERY_STRATEGY = [
    "default", "one_device_cpu", mirrored_param(1), mirrored_param(2), mirrored_param(4), "central_storage_2cpu",
    "css_remote",
]
CROSS_REPLICA_STRATEGIES = [mirrored_param(1), mirrored_param(2), mirrored_param(4), "central_storage_2cpu"]


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def maybe_scope(strategy):
    """The strategy's scope; none for the default strategy (used without any scope)."""
    return contextlib.nullcontext() if strategy is td.distribute.get_strategy() else strategy.scope()


def make_optimizer(kind: str, hparams: dict) -> td.optimizers.Optimizer:
    return getattr(td.optimizers, kind)(**hparams)


def make_variables(strategy, prefix: str = "w") -> list[td.Variable]:
    with maybe_scope(strategy):
        return [td.Variable(w.copy(), name=f"{prefix}{k}") for k, w in enumerate(INITIAL)]


def components(strategy, var) -> tuple:
    return tuple(strategy.experimental_local_results(var))


def device_names(strategy, var) -> tuple[str, ...]:
    return tuple(c.device for c in components(strategy, var))


def host_values(strategy, var) -> list[np.ndarray]:
    return [np.asarray(c.numpy()) for c in components(strategy, var)]


def assert_all_components_close(strategy, var, expected) -> None:
    values = host_values(strategy, var)
    assert values, "no components"
    for value in values:
        assert value.dtype == var.dtype
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)


def iteration_counts(strategy, opt) -> list[int]:
    return [int(v) for v in host_values(strategy, opt.iterations)]


def run_replica_steps(strategy, opt, variables, n_steps: int = N_STEPS, **apply_kwargs) -> None:
    """``n_steps`` training steps in replica context, each replica passing its own gradient."""
    n = strategy.num_replicas_in_sync

    def step_fn(step):
        return opt.apply_gradients(zip(replica_gradients(step, rid(), n), variables), **apply_kwargs)

    for step in range(n_steps):
        strategy.run(step_fn, args=(step,))


def simple_setup(strategy, lr: float = 0.5, name: str = "e"):
    """A float32 vector variable, a scalar one and a plain SGD optimizer, all in ``strategy``'s scope."""
    with maybe_scope(strategy):
        w = td.Variable(np.arange(3, dtype=np.float32), name=f"{name}_w")
        b = td.Variable(np.float32(1.0), name=f"{name}_b")
        opt = td.optimizers.SGD(lr)
    return w, b, opt


def assert_good_step(strategy, opt, var) -> None:
    """One correct replica-context step of plain SGD: replica r passes (r + 1) * ones; they are summed."""
    n = strategy.num_replicas_in_sync
    before = host_values(strategy, var)[0]
    steps_before = iteration_counts(strategy, opt)
    strategy.run(lambda: opt.apply_gradients([(np.full(var.shape, rid() + 1, var.dtype), var)]))
    expected = before - np.float32(opt.learning_rate) * np.float32(n * (n + 1) / 2)
    assert_all_components_close(strategy, var, expected)
    assert iteration_counts(strategy, opt) == [c + 1 for c in steps_before]


# --- 1. equivalence with the numpy reference ----------------------------------------------------


@pytest.mark.parametrize("kind, hparams", CONFIGS)
@pytest.mark.parametrize("strategy_name", EVERY_STRATEGY)
def test_replica_steps_match_the_numpy_reference(request, strategy_name, kind, hparams):
    strategy = request.getfixturevalue(strategy_name)
    variables = make_variables(strategy)
    with maybe_scope(strategy):
        opt = make_optimizer(kind, hparams)
    run_replica_steps(strategy, opt, variables)
    expected, ref = reference_run(kind, hparams)
    for var, want in zip(variables, expected):
        assert_all_components_close(strategy, var, want)
    for k, var in enumerate(variables):
        for name in opt.get_slot_names():
            assert_all_components_close(strategy, opt.get_slot(var, name), ref.slots[k][name])


@pytest.mark.parametrize("kind, hparams", CONFIGS)
def test_default_strategy_direct_calls_match_the_numpy_reference(kind, hparams):
    variables = make_variables(td.distribute.get_strategy(), prefix="direct")
    opt = make_optimizer(kind, hparams)
    for step in range(N_STEPS):
        result = opt.apply_gradients(zip(full_gradients(step), variables))
        assert result is opt.iterations
    expected, _ = reference_run(kind, hparams)
    for var, want in zip(variables, expected):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-5, atol=1e-6)
    assert int(opt.iterations.numpy()) == N_STEPS


def test_amsgrad_changes_the_result_on_this_data():
    """Guards the data: with shrinking gradients AMSGrad keeps a larger v than Adam."""
    hparams = {"learning_rate": 0.05, "beta_1": 0.8, "beta_2": 0.5}
    plain = make_variables(td.distribute.get_strategy(), prefix="plain")
    ams = make_variables(td.distribute.get_strategy(), prefix="ams")
    opt_plain, opt_ams = td.optimizers.Adam(**hparams), td.optimizers.Adam(amsgrad=True, **hparams)
    for step in range(N_STEPS):
        opt_plain.apply_gradients(zip(full_gradients(step), plain))
        opt_ams.apply_gradients(zip(full_gradients(step), ams))
    assert not np.allclose(plain[0].numpy(), ams[0].numpy(), rtol=1e-4, atol=0)
    vhat, v = opt_ams.get_slot(ams[0], "vhat").numpy(), opt_ams.get_slot(ams[0], "v").numpy()
    assert np.all(vhat >= v) and np.any(vhat > v)


@pytest.mark.parametrize("kind, hparams", CONFIGS)
@pytest.mark.parametrize("strategy_name", CROSS_REPLICA_STRATEGIES)
def test_cross_replica_per_replica_gradients_are_summed(request, strategy_name, kind, hparams):
    strategy = request.getfixturevalue(strategy_name)
    n = strategy.num_replicas_in_sync
    variables = make_variables(strategy, prefix="xpr")
    with maybe_scope(strategy):
        opt = make_optimizer(kind, hparams)
    for step in range(N_STEPS):
        per_replica = [replica_gradients(step, r, n) for r in range(n)]
        grads = [PerReplica(list(parts)) for parts in zip(*per_replica)]
        opt.apply_gradients(zip(grads, variables))
    expected, _ = reference_run(kind, hparams)
    for var, want in zip(variables, expected):
        assert_all_components_close(strategy, var, want)
    assert iteration_counts(strategy, opt) == [N_STEPS] * len(components(strategy, opt.iterations))


@pytest.mark.parametrize("in_scope", [True, False], ids=["in_scope", "outside_scope"])
@pytest.mark.parametrize("kind, hparams", SOME_CONFIGS)
@pytest.mark.parametrize("strategy_name", [mirrored_param(2), mirrored_param(4), "css_remote"])
def test_cross_replica_plain_gradients_are_applied_as_given(request, strategy_name, kind, hparams, in_scope):
    strategy = request.getfixturevalue(strategy_name)
    variables = make_variables(strategy, prefix="xplain")
    with strategy.scope():
        opt = make_optimizer(kind, hparams)
    for step in range(N_STEPS):
        with strategy.scope() if in_scope else contextlib.nullcontext():
            opt.apply_gradients(zip(full_gradients(step), variables))
    expected, _ = reference_run(kind, hparams)
    for var, want in zip(variables, expected):
        assert_all_components_close(strategy, var, want)


@pytest.mark.replicas(4)
def test_cross_replica_mixes_summed_and_given_gradients(mirrored_strategy):
    """One call: the first gradient is a PerReplica (summed), the others plain (applied once)."""
    strategy = mirrored_strategy
    variables = make_variables(strategy, prefix="mixed")
    with strategy.scope():
        opt = td.optimizers.SGD(0.1, momentum=0.9)
    for step in range(N_STEPS):
        grads = full_gradients(step)
        grads[0] = PerReplica([replica_gradients(step, r, 4)[0] for r in range(4)])
        opt.apply_gradients(zip(grads, variables))
    expected, _ = reference_run("SGD", {"learning_rate": 0.1, "momentum": 0.9})
    for var, want in zip(variables, expected):
        assert_all_components_close(strategy, var, want)


@pytest.mark.parametrize("kind, hparams", SOME_CONFIGS)
@pytest.mark.parametrize("strategy_name", [mirrored_param(1), mirrored_param(2), mirrored_param(4), "central_storage_2cpu"])
def test_without_aggregation_the_replicas_pass_the_summed_gradient(request, strategy_name, kind, hparams):
    """experimental_aggregate_gradients=False: each replica all-reduces itself; nothing is summed again."""
    strategy = request.getfixturevalue(strategy_name)
    n = strategy.num_replicas_in_sync
    variables = make_variables(strategy, prefix="noagg")
    with strategy.scope():
        opt = make_optimizer(kind, hparams)

    def step_fn(step):
        summed = td.distribute.get_replica_context().all_reduce(ReduceOp.SUM, replica_gradients(step, rid(), n))
        return opt.apply_gradients(zip(summed, variables), experimental_aggregate_gradients=False)

    for step in range(N_STEPS):
        strategy.run(step_fn, args=(step,))
    expected, _ = reference_run(kind, hparams)
    for var, want in zip(variables, expected):
        assert_all_components_close(strategy, var, want)


@pytest.mark.replicas(2, 4)
def test_without_aggregation_one_shared_gradient_is_applied_once(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, lr=0.5, name="shared")
    grad = np.array([1.0, 2.0, 4.0], np.float32)
    mirrored_strategy.run(lambda: opt.apply_gradients([(grad, w)], experimental_aggregate_gradients=False))
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32) - 0.5 * grad)


@pytest.mark.parametrize("kind, hparams", SOME_CONFIGS)
@pytest.mark.parametrize("strategy_name", ["default", mirrored_param(1), mirrored_param(2), mirrored_param(4)])
def test_learning_rate_schedule_gets_the_step(request, strategy_name, kind, hparams):
    strategy = request.getfixturevalue(strategy_name)
    seen: list[int] = []

    def schedule(step):
        seen.append(step)
        return 0.2 / (1.0 + step)

    hparams = {**hparams, "learning_rate": schedule}
    variables = make_variables(strategy, prefix="sched")
    with maybe_scope(strategy):
        opt = make_optimizer(kind, hparams)
    run_replica_steps(strategy, opt, variables)
    assert seen == list(range(N_STEPS))
    assert all(type(step) is int for step in seen)
    expected, _ = reference_run(kind, {**hparams, "learning_rate": lambda step: 0.2 / (1.0 + step)})
    for var, want in zip(variables, expected):
        assert_all_components_close(strategy, var, want)


def test_learning_rate_property_evaluates_the_schedule_at_iterations(mirrored_strategy):
    w, _, _ = simple_setup(mirrored_strategy, name="lrprop")
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(lambda step: 1.0 / (step + 2))
    assert opt.learning_rate == pytest.approx(0.5)
    mirrored_strategy.run(lambda: opt.apply_gradients([(np.ones(3, np.float32), w)]))
    assert opt.learning_rate == pytest.approx(1.0 / 3)
    opt.learning_rate = 0.25
    assert opt.learning_rate == 0.25
    assert opt.get_config()["learning_rate"] == 0.25


def test_float64_variable_gets_float32_gradients_cast(mirrored_strategy):
    with mirrored_strategy.scope():
        w = td.Variable(np.array([1.0, 2.0]), name="f64")
        opt = td.optimizers.Adam(0.1)
    mirrored_strategy.run(lambda: opt.apply_gradients([(np.full(2, rid() + 1.0, np.float32), w)]))
    want = NumpyReference("Adam", learning_rate=0.1).apply([np.array([1.0, 2.0])], [np.full(2, 3.0)])[0]
    for value in host_values(mirrored_strategy, w):
        assert value.dtype == np.float64
        np.testing.assert_allclose(value, want, rtol=1e-12)


# --- 2. slots, iterations and the optimizer's variables --------------------------------------


@pytest.mark.parametrize("strategy_name", EVERY_STRATEGY)
def test_slots_live_on_their_variables_devices(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    variables = make_variables(strategy, prefix="slotdev")
    with maybe_scope(strategy):
        opt = td.optimizers.Adam(amsgrad=True)
    run_replica_steps(strategy, opt, variables, n_steps=1)
    for var in variables:
        for name in ("m", "v", "vhat"):
            slot = opt.get_slot(var, name)
            assert type(slot) is type(var)
            assert device_names(strategy, slot) == device_names(strategy, var)
            assert slot.trainable is False
            assert slot.shape == var.shape and slot.dtype == var.dtype


@pytest.mark.parametrize("strategy_name", ["central_storage_2cpu", "css_remote"])
def test_central_storage_slots_and_iterations_live_on_the_parameter_device(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    parameter_device = CANONICAL_CPU.format(2 if strategy_name == "css_remote" else 0)
    variables = make_variables(strategy, prefix="cs_slot")
    with strategy.scope():
        opt = td.optimizers.SGD(0.1, momentum=0.5)
    run_replica_steps(strategy, opt, variables, n_steps=2)
    for var in variables:
        assert opt.get_slot(var, "momentum").device == parameter_device
    assert opt.iterations.device == parameter_device
    assert int(opt.iterations.numpy()) == 2


def non_slot_device_names(strategy, var_list) -> tuple[str, ...]:
    where = strategy.extended.non_slot_devices(var_list)
    if isinstance(where, td.Variable):  # the default and CentralStorage strategies name a variable
        return device_names(strategy, where)
    return tuple(where)


@pytest.mark.parametrize("strategy_name", EVERY_STRATEGY)
def test_iterations_live_on_the_non_slot_devices_and_count_steps(request, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    variables = make_variables(strategy, prefix="iters")
    with maybe_scope(strategy):
        opt = td.optimizers.SGD(0.1, momentum=0.9)
    run_replica_steps(strategy, opt, variables, n_steps=3)
    iterations = opt.iterations
    assert device_names(strategy, iterations) == non_slot_device_names(strategy, variables)
    assert iterations.dtype == np.int64
    assert iterations.trainable is False
    assert iteration_counts(strategy, opt) == [3] * len(components(strategy, iterations))


def test_iterations_created_before_any_variable_follow_the_creation_scope(mirrored_strategy):
    w, _, _ = simple_setup(mirrored_strategy, name="early")
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(0.5)
    iterations = opt.iterations
    assert iteration_counts(mirrored_strategy, opt) == [0, 0]
    assert device_names(mirrored_strategy, iterations) == tuple(mirrored_strategy.extended.worker_devices)
    assert_good_step(mirrored_strategy, opt, w)
    assert opt.iterations is iterations


@pytest.mark.parametrize(
    "optimizer, names",
    [
        pytest.param(lambda: td.optimizers.SGD(), [], id="sgd"),
        pytest.param(lambda: td.optimizers.SGD(momentum=0.9), ["momentum"], id="sgd_momentum"),
        pytest.param(lambda: td.optimizers.SGD(momentum=0.9, nesterov=True), ["momentum"], id="sgd_nesterov"),
        pytest.param(lambda: td.optimizers.Adam(), ["m", "v"], id="adam"),
        pytest.param(lambda: td.optimizers.Adam(amsgrad=True), ["m", "v", "vhat"], id="amsgrad"),
    ],
)
def test_get_slot_names(optimizer, names):
    assert optimizer().get_slot_names() == names


def test_variables_are_iterations_then_slots_in_creation_order(mirrored_strategy):
    with mirrored_strategy.scope():
        a = td.Variable(np.zeros(2, np.float32), name="order_a")
        b = td.Variable(np.zeros(3, np.float32), name="order_b")
        opt = td.optimizers.Adam()
    assert opt.variables == []
    opt.build([b, a])
    expected = [opt.iterations] + [opt.get_slot(v, n) for v in (b, a) for n in ("m", "v")]
    assert len(opt.variables) == 5
    assert all(x is y for x, y in zip(opt.variables, expected))


@pytest.mark.parametrize("kind, hparams", SOME_CONFIGS)
@pytest.mark.parametrize("strategy_name", ["default", mirrored_param(2), "central_storage_2cpu"])
def test_build_creates_zero_slots_before_any_step(request, strategy_name, kind, hparams):
    strategy = request.getfixturevalue(strategy_name)
    variables = make_variables(strategy, prefix="build")
    with maybe_scope(strategy):
        opt = make_optimizer(kind, hparams)
    opt.build(variables)
    assert iteration_counts(strategy, opt) == [0] * len(components(strategy, opt.iterations))
    for var in variables:
        for name in opt.get_slot_names():
            slot = opt.get_slot(var, name)
            assert slot.trainable is False
            for value in host_values(strategy, slot):
                np.testing.assert_array_equal(value, np.zeros(var.shape, var.dtype))
    slots_before = list(opt.variables)
    run_replica_steps(strategy, opt, variables)
    assert all(x is y for x, y in zip(opt.variables, slots_before)) and len(opt.variables) == len(slots_before)
    expected, _ = reference_run(kind, hparams)
    for var, want in zip(variables, expected):
        assert_all_components_close(strategy, var, want)


def test_build_in_replica_context_raises(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="build_rc")
    with pytest.raises(ContextError, match=r"SGD\.build\(\) must be called in cross-replica context"):
        mirrored_strategy.run(lambda: opt.build([w]))
    assert_good_step(mirrored_strategy, opt, w)


# --- 3. errors, and the strategy stays usable afterwards ----------------------------------------


@pytest.mark.replicas(2, 4)
def test_no_gradients_raises(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="nograd")
    with pytest.raises(ValueError, match="No gradients provided for any variable: nograd_w:0"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(None, w)]))
    with pytest.raises(ValueError, match="No gradients provided for any variable"):
        opt.apply_gradients([])
    assert_good_step(mirrored_strategy, opt, w)


@pytest.mark.replicas(2, 4)
def test_none_gradient_warns_and_leaves_its_variable_unchanged(mirrored_strategy):
    w, b, opt = simple_setup(mirrored_strategy, name="nonegrad")
    with pytest.warns(UserWarning, match=r"Gradients do not exist for variables \['nonegrad_w:0'\]"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(None, w), (np.float32(rid() + 1), b)]))
    n = mirrored_strategy.num_replicas_in_sync
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert_all_components_close(mirrored_strategy, b, np.float32(1.0 - 0.5 * n * (n + 1) / 2))
    assert_good_step(mirrored_strategy, opt, w)


@pytest.mark.replicas(2, 4)
def test_duplicate_variable_raises(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="dup")
    with pytest.raises(ValueError, match="variable dup_w:0 appears more than once"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(np.ones(3, np.float32), w), (np.ones(3, np.float32), w)]))
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert_good_step(mirrored_strategy, opt, w)


@pytest.mark.replicas(2, 4)
def test_non_variable_raises(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="nonvar")
    with pytest.raises(TypeError, match="needs td.Variable objects at entry 1"):
        mirrored_strategy.run(
            lambda: opt.apply_gradients([(np.ones(3, np.float32), w), (np.ones(3, np.float32), np.zeros(3))])
        )
    assert_good_step(mirrored_strategy, opt, w)


@pytest.mark.parametrize(
    "grads_and_vars, error, match",
    [
        pytest.param(5, TypeError, "takes an iterable of \\(gradient, variable\\) pairs", id="not_iterable"),
        pytest.param([(1, 2, 3)], ValueError, "entry 0 of grads_and_vars is not a \\(gradient, variable\\) pair",
                     id="not_a_pair"),
    ],
)
def test_malformed_grads_and_vars_raise(grads_and_vars, error, match):
    opt = td.optimizers.SGD()
    with pytest.raises(error, match=match):
        opt.apply_gradients(grads_and_vars)


@pytest.mark.replicas(2, 4)
def test_shape_mismatch_from_one_replica_names_the_variable_and_replica(mirrored_strategy):
    w, b, opt = simple_setup(mirrored_strategy, name="shape")
    last = mirrored_strategy.num_replicas_in_sync - 1

    def bad_step():
        grad = np.ones(4 if rid() == last else 3, np.float32)
        return opt.apply_gradients([(np.float32(1.0 + rid()), b), (grad, w)])

    with pytest.raises(ValueError, match=rf"gradient of shape_w:0 from replica {last} has shape \(4,\)"):
        mirrored_strategy.run(bad_step)
    # Nothing was updated: not the well-shaped variable, not the step counter.
    assert_all_components_close(mirrored_strategy, b, np.float32(1.0))
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert iteration_counts(mirrored_strategy, opt) == [0] * mirrored_strategy.num_replicas_in_sync
    assert_good_step(mirrored_strategy, opt, w)


def test_shape_mismatch_in_cross_replica_context_names_the_variable(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="xshape")
    with pytest.raises(ValueError, match=r"gradient of xshape_w:0 has shape \(2,\), but the variable has shape"):
        opt.apply_gradients([(np.ones(2, np.float32), w)])
    assert_good_step(mirrored_strategy, opt, w)


BAD_DTYPE_GRADIENTS = {
    "complex": (np.ones(3, np.complex64), "has dtype complex64, but the variable has dtype float32: its imaginary part"),
    "object": (np.array([1.0, 2.0, 3.0], dtype=object), "has dtype object, but the variable has dtype float32: it is not"),
    "string": (np.array(["1", "2", "3"]), "has dtype <U1, but the variable has dtype float32: it is not"),
}


@pytest.mark.replicas(2, 4)
@pytest.mark.parametrize("kind", BAD_DTYPE_GRADIENTS)
def test_gradient_of_a_dtype_that_does_not_convert_raises_in_replica_context(mirrored_strategy, kind):
    w, _, opt = simple_setup(mirrored_strategy, name=f"dtype_{kind}")
    grad, words = BAD_DTYPE_GRADIENTS[kind]
    with pytest.raises(td.errors.InvalidArgumentError, match=rf"gradient of dtype_{kind}_w:0 from replica \d {words}"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(grad.copy(), w)]))
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert iteration_counts(mirrored_strategy, opt) == [0] * mirrored_strategy.num_replicas_in_sync
    assert_good_step(mirrored_strategy, opt, w)


@pytest.mark.parametrize("kind", BAD_DTYPE_GRADIENTS)
def test_gradient_of_a_dtype_that_does_not_convert_raises_in_cross_replica_context(mirrored_strategy, kind):
    w, _, opt = simple_setup(mirrored_strategy, name=f"xdtype_{kind}")
    grad, words = BAD_DTYPE_GRADIENTS[kind]
    with pytest.raises(td.errors.InvalidArgumentError, match=rf"gradient of xdtype_{kind}_w:0 {words}"):
        opt.apply_gradients([(grad, w)])
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert_good_step(mirrored_strategy, opt, w)


def test_complex_gradient_of_a_complex_variable_is_applied():
    w = td.Variable(np.array([1.0 + 1.0j], np.complex64))
    td.optimizers.SGD(0.5).apply_gradients([(np.array([2.0 + 4.0j], np.complex64), w)])
    np.testing.assert_allclose(w.numpy(), [0.0 - 1.0j])


@pytest.mark.parametrize("grad", [np.ones(3, np.float64), np.ones(3, np.int32)], ids=["float64", "int32"])
def test_gradients_of_a_kind_that_converts_are_applied(grad):
    w = td.Variable(np.zeros(3, np.float32))
    td.optimizers.SGD(1.0).apply_gradients([(grad, w)])
    np.testing.assert_array_equal(w.numpy(), -np.ones(3, np.float32))
    assert w.dtype == np.float32


@pytest.mark.replicas(2, 4)
def test_same_gradient_object_in_every_replica_raises_when_aggregating(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="sameobj")
    grad = np.ones(3, np.float32)
    n = mirrored_strategy.num_replicas_in_sync
    with pytest.raises(ValueError, match=rf"gradient of sameobj_w:0 is the same object in all {n} replicas"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(grad, w)]))
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert_good_step(mirrored_strategy, opt, w)


def test_list_gradients_in_replica_context_are_summed(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, lr=0.5, name="listgrad")
    mirrored_strategy.run(lambda: opt.apply_gradients([([1.0 + rid(), 2.0, 0.0], w)]))
    assert_all_components_close(mirrored_strategy, w, np.array([0.0, 1.0, 2.0]) - 0.5 * np.array([3.0, 4.0, 0.0]))


def test_list_gradients_in_cross_replica_context_are_applied(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, lr=0.5, name="xlistgrad")
    opt.apply_gradients([([1.0, 2.0, 0.0], w)])
    assert_all_components_close(mirrored_strategy, w, np.array([0.0, 1.0, 2.0]) - 0.5 * np.array([1.0, 2.0, 0.0]))


@pytest.mark.parametrize(
    "factory, match",
    [
        pytest.param(lambda: td.optimizers.SGD(-0.1), "`learning_rate` should be a float >= 0", id="lr_negative"),
        pytest.param(lambda: td.optimizers.SGD(float("nan")), "`learning_rate` should be", id="lr_nan"),
        pytest.param(lambda: td.optimizers.Adam(float("inf")), "`learning_rate` should be", id="lr_inf"),
        pytest.param(lambda: td.optimizers.SGD(True), "`learning_rate` should be", id="lr_bool"),
        pytest.param(lambda: td.optimizers.SGD("0.1"), "`learning_rate` should be", id="lr_str"),
        pytest.param(lambda: td.optimizers.SGD(momentum=1.5), "`momentum` must be a float between", id="momentum_big"),
        pytest.param(lambda: td.optimizers.SGD(momentum=-0.1), "`momentum` must be a float", id="momentum_neg"),
        pytest.param(lambda: td.optimizers.Adam(beta_1=1.0), r"`beta_1` must be a float in \[0, 1\)", id="beta_1_one"),
        pytest.param(lambda: td.optimizers.Adam(beta_1=-0.5), "`beta_1` must be a float", id="beta_1_neg"),
        pytest.param(lambda: td.optimizers.Adam(beta_2=1.0), r"`beta_2` must be a float in \[0, 1\)", id="beta_2_one"),
        pytest.param(lambda: td.optimizers.Adam(beta_2=2.0), "`beta_2` must be a float", id="beta_2_big"),
        pytest.param(lambda: td.optimizers.Adam(epsilon=-1e-7), "`epsilon` must be a float >= 0", id="eps_neg"),
        pytest.param(lambda: td.optimizers.Adam(epsilon=None), "`epsilon` must be a float >= 0", id="eps_none"),
    ],
)
def test_bad_hyperparameters_raise(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def test_bad_learning_rate_assignment_raises_and_keeps_the_old_rate():
    opt = td.optimizers.SGD(0.3)
    with pytest.raises(ValueError, match="`learning_rate` should be a float >= 0"):
        opt.learning_rate = -1.0
    assert opt.learning_rate == 0.3


def test_momentum_one_is_allowed():
    assert td.optimizers.SGD(momentum=1.0).momentum == 1.0


@pytest.mark.replicas(2, 4)
def test_schedule_returning_a_negative_rate_raises(mirrored_strategy):
    w, _, _ = simple_setup(mirrored_strategy, name="negsched")
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(lambda step: -0.5)
    with pytest.raises(ValueError, match="the learning rate must be a finite number >= 0.*returned -0.5 at step 0"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(np.full(3, rid() + 1.0, np.float32), w)]))
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert iteration_counts(mirrored_strategy, opt) == [0] * mirrored_strategy.num_replicas_in_sync
    opt.learning_rate = 0.5
    assert_good_step(mirrored_strategy, opt, w)


def test_variables_of_two_strategies_raise(mirrored_strategy, other_mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="two_a")
    u, _, _ = simple_setup(other_mirrored_strategy, name="two_b")
    with pytest.raises(ValueError, match="the variables belong to different strategies: two_a_w:0"):
        opt.apply_gradients([(np.ones(3, np.float32), w), (np.ones(3, np.float32), u)])
    assert_good_step(mirrored_strategy, opt, w)


def test_optimizer_bound_to_one_strategy_rejects_another_strategys_variables(mirrored_strategy, other_mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="bound_a")
    u, _, _ = simple_setup(other_mirrored_strategy, name="bound_b")
    assert_good_step(mirrored_strategy, opt, w)
    with pytest.raises(ValueError, match="this optimizer already optimizes variables of"):
        other_mirrored_strategy.run(lambda: opt.apply_gradients([(np.full(3, rid() + 1.0, np.float32), u)]))
    assert_good_step(mirrored_strategy, opt, w)


def test_optimizer_used_under_another_strategys_scope_raises(mirrored_strategy, other_mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="wrongscope")
    with pytest.raises(ContextError, match=r"Mixing different strategies: SGD\.apply_gradients\(\)"):
        with other_mirrored_strategy.scope():
            opt.apply_gradients([(np.ones(3, np.float32), w)])
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    assert_good_step(mirrored_strategy, opt, w)


def _apply_in_run(strategy, opt, var):
    strategy.run(lambda: opt.apply_gradients([(np.ones(var.shape, np.float32), var)]))


def _apply_in_scope(strategy, opt, var):
    with strategy.scope():
        opt.apply_gradients([(np.ones(var.shape, np.float32), var)])


@pytest.mark.parametrize(
    ("call", "where"),
    [(_apply_in_run, r"is called from replica \d \(on /cpu:\d\) of MirroredStrategy"),
     (_apply_in_scope, "is called in cross-replica context of MirroredStrategy")],
    ids=["in_run", "in_scope"],
)
def test_a_variable_created_outside_the_scope_is_named_not_the_optimizer(mirrored_strategy, call, where):
    # TensorFlow 2.21 raises a bare AssertionError (in MirroredStrategy's update) here.
    w = td.Variable(np.arange(3, dtype=np.float32), name="outside_w")
    with mirrored_strategy.scope():
        opt = td.optimizers.SGD(0.5)
    with pytest.raises(td.errors.ValidationError) as info:
        call(mirrored_strategy, opt, w)
    assert isinstance(info.value, AssertionError)
    message = str(info.value)
    assert message.startswith(
        "SGD.apply_gradients() got a variable created outside strategy.scope(): 'outside_w' (shape (3,)) is a "
        "plain variable of no strategy, but the optimizer "
    )
    assert re.search(where, message), message
    assert message.endswith("Create it inside `with strategy.scope():` so that every replica has a copy to update.")
    assert "Mixing different strategies" not in message
    np.testing.assert_array_equal(w.numpy(), np.arange(3, dtype=np.float32))
    with mirrored_strategy.scope():
        good = td.Variable(np.arange(3, dtype=np.float32), name="inside_w")
    assert_good_step(mirrored_strategy, opt, good)


def test_variables_created_outside_the_scope_are_all_named(mirrored_strategy):
    w = td.Variable(np.zeros(3, np.float32), name="plain_w")
    b = td.Variable(np.float32(0.0), name="plain_b")
    opt = td.optimizers.SGD(0.5)  # created outside too: the variables are still what is at fault
    with pytest.raises(
        td.errors.ValidationError,
        match=r"got variables created outside strategy.scope\(\): 'plain_w' \(shape \(3,\)\), 'plain_b' "
        r"\(shape \(\)\) are plain variables of no strategy.* Create them inside",
    ):
        mirrored_strategy.run(lambda: opt.apply_gradients([(np.ones(3, np.float32), w), (np.float32(1.0), b)]))


def test_a_plain_variable_given_to_an_optimizer_bound_to_a_strategy_is_named(mirrored_strategy):
    w, _, opt = simple_setup(mirrored_strategy, name="boundplain")
    assert_good_step(mirrored_strategy, opt, w)
    plain = td.Variable(np.zeros(3, np.float32), name="plain_v")
    with pytest.raises(
        td.errors.ValidationError,
        match=r"'plain_v' \(shape \(3,\)\) is a plain variable of no strategy, but the optimizer already "
        r"optimizes variables of MirroredStrategy",
    ):
        opt.apply_gradients([(np.ones(3, np.float32), plain)])


def test_plain_variables_and_optimizer_with_no_strategy_work():
    w = td.Variable(np.ones(2, np.float32))
    opt = td.optimizers.SGD(0.5)
    opt.apply_gradients([(np.ones(2, np.float32), w)])
    np.testing.assert_allclose(w.numpy(), [0.5, 0.5])


def test_iterations_created_under_another_strategy_raise(mirrored_strategy):
    w, _, _ = simple_setup(mirrored_strategy, name="itdefault")
    opt = td.optimizers.SGD(0.5)  # no scope: the counter goes to the default strategy
    assert int(opt.iterations.numpy()) == 0
    with pytest.raises(ValueError, match="step counter was created under DefaultStrategy"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(np.full(3, rid() + 1.0, np.float32), w)]))
    assert_all_components_close(mirrored_strategy, w, np.arange(3, dtype=np.float32))
    with mirrored_strategy.scope():
        good = td.optimizers.SGD(0.5)
    assert_good_step(mirrored_strategy, good, w)


def test_get_slot_errors(mirrored_strategy):
    w, b, _ = simple_setup(mirrored_strategy, name="getslot")
    with mirrored_strategy.scope():
        opt = td.optimizers.Adam()
    opt.build([w])
    with pytest.raises(KeyError, match="variable getslot_w:0 has no such slot. Got slot_name='momentum'"):
        opt.get_slot(w, "momentum")
    with pytest.raises(KeyError, match="variable getslot_b:0 has not been optimized yet"):
        opt.get_slot(b, "m")
    with pytest.raises(TypeError, match="needs td.Variable objects"):
        opt.get_slot(np.zeros(3), "m")
    assert opt.get_slot(w, "m").shape == (3,)


# --- 4. configuration ---------------------------------------------------------------------------


def _schedule(step):
    return 0.1 * 0.5**step


@pytest.mark.parametrize(
    "kind, hparams",
    [*CONFIGS, pytest.param("Adam", {"learning_rate": _schedule, "epsilon": 1e-3, "name": "my_adam"}, id="schedule")],
)
def test_get_config_from_config_round_trip(kind, hparams):
    opt = make_optimizer(kind, hparams)
    config = opt.get_config()
    for key, value in hparams.items():
        assert config[key] == value
    twin = type(opt).from_config(config)
    assert type(twin) is type(opt)
    assert twin.get_config() == config
    assert twin.get_slot_names() == opt.get_slot_names()
    assert twin.name == hparams.get("name", kind)
    assert twin.learning_rate == opt.learning_rate


@pytest.mark.parametrize("kind, hparams", CONFIGS)
def test_repr_shows_the_class_and_config(kind, hparams):
    opt = make_optimizer(kind, hparams)
    text = repr(opt)
    assert text.startswith(f"{kind}(name='{kind}', ")
    for key, value in opt.get_config().items():
        assert f"{key}={value!r}" in text


def test_sgd_and_adam_defaults():
    sgd, adam = td.optimizers.SGD(), td.optimizers.Adam()
    assert (sgd.learning_rate, sgd.momentum, sgd.nesterov, sgd.name) == (0.01, 0.0, False, "SGD")
    assert (adam.learning_rate, adam.beta_1, adam.beta_2, adam.epsilon, adam.amsgrad, adam.name) == (
        0.001, 0.9, 0.999, 1e-7, False, "Adam"
    )


# --- 5. td.nn.compute_average_loss and scale_regularization_loss -------------------------------


def tf_weighted_average(losses, weights, global_batch_size):
    """TensorFlow's rule: weight in float32, cast back to the loss dtype, sum, divide."""
    losses = np.asarray(losses)
    weighted = (losses.astype(np.float32) * np.asarray(weights, np.float32)).astype(losses.dtype)
    return weighted.sum() / global_batch_size


def test_compute_average_loss_defaults_to_the_local_batch_without_strategy():
    losses = np.array([1.0, 2.0, 6.0], np.float32)
    result = td.nn.compute_average_loss(losses)
    assert result.dtype == np.float32 and result.shape == ()
    assert float(result) == pytest.approx(3.0)


def test_compute_average_loss_with_global_batch_size():
    result = td.nn.compute_average_loss(np.array([1.0, 2.0, 3.0]), global_batch_size=6)
    assert result.dtype == np.float64
    assert float(result) == 1.0


@pytest.mark.replicas(2, 4)
def test_compute_average_loss_in_replicas_uses_the_global_batch(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync

    def fn():
        r = rid()
        losses = np.array([1.0, 2.0, 3.0], np.float32) * (r + 1)
        return td.nn.compute_average_loss(losses), td.nn.compute_average_loss(losses, global_batch_size=2)

    per_replica, explicit = mirrored_strategy.run(fn)
    local = [float(x) for x in mirrored_strategy.experimental_local_results(per_replica)]
    assert local == pytest.approx([6.0 * (r + 1) / (3 * n) for r in range(n)])
    summed = float(mirrored_strategy.reduce(ReduceOp.SUM, per_replica, axis=None))
    assert summed == pytest.approx(np.mean([6.0 * (r + 1) / 3 for r in range(n)]))
    assert [float(x) for x in mirrored_strategy.experimental_local_results(explicit)] == pytest.approx(
        [6.0 * (r + 1) / 2 for r in range(n)]
    )


def test_compute_average_loss_in_cross_replica_context_needs_global_batch_size(mirrored_strategy):
    losses = np.array([1.0, 2.0])
    with mirrored_strategy.scope():
        with pytest.raises(RuntimeError, match="calling `compute_average_loss` in cross replica context"):
            td.nn.compute_average_loss(losses)
        assert float(td.nn.compute_average_loss(losses, global_batch_size=4)) == 0.75


@pytest.mark.parametrize(
    "losses, weights",
    [
        pytest.param(np.array([1.0, 2.0, 3.0], np.float32), np.array([[1.0], [2.0], [3.0]]), id="rank_plus_1"),
        pytest.param(np.ones((3, 2), np.float32) * [1.0, 3.0], np.array([1.0, 2.0, 3.0]), id="rank_minus_1"),
        pytest.param(np.array([0.1, 0.2, 0.3]), 0.7, id="scalar"),
        pytest.param(np.array([[0.1, 0.5], [0.2, 0.7]]), np.array([[0.3, 1.0], [2.0, 0.9]]), id="same_shape"),
        pytest.param(np.array([1, 2, 3], np.int32), np.array([0.5, 0.5, 0.5]), id="int_truncated"),
    ],
)
def test_sample_weight_broadcasting(losses, weights):
    weights_array = np.asarray(weights)
    if weights_array.ndim == losses.ndim + 1:
        weights_array = weights_array[..., 0]
    elif 0 < weights_array.ndim == losses.ndim - 1:
        weights_array = weights_array[..., None]
    result = td.nn.compute_average_loss(losses, sample_weight=weights, global_batch_size=2)
    expected = tf_weighted_average(losses, weights_array, 2)
    out_dtype = losses.dtype if losses.dtype.kind == "f" else np.float64
    assert result.dtype == out_dtype
    np.testing.assert_allclose(result, expected, rtol=1e-7)


def test_weighted_losses_are_computed_in_float32():
    losses = np.array([0.1, 1.0 + 1e-9])
    result = td.nn.compute_average_loss(losses, sample_weight=np.array([1.0, 1.0]), global_batch_size=1)
    assert result.dtype == np.float64
    assert float(result) == float(losses.astype(np.float32).astype(np.float64).sum())
    assert float(result) != float(losses.sum())


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_losses_give_float64(dtype):
    result = td.nn.compute_average_loss(np.array([1, 2, 3], dtype), global_batch_size=4)
    assert result.dtype == np.float64
    assert float(result) == 1.5


def test_float16_losses_keep_their_dtype():
    result = td.nn.compute_average_loss(np.array([1.0, 2.0, 3.0], np.float16), global_batch_size=2)
    assert result.dtype == np.float16
    assert float(result) == 3.0


@pytest.mark.parametrize("batch", [0, np.int32(0), np.int64(0)], ids=["int", "int32", "int64"])
def test_global_batch_size_zero_gives_zero(batch):
    result = td.nn.compute_average_loss(np.array([1.0, 2.0]), global_batch_size=batch)
    assert float(result) == 0.0
    assert result.dtype == np.float64


def test_numpy_integer_global_batch_size_is_accepted():
    assert float(td.nn.compute_average_loss(np.array([2.0, 4.0]), global_batch_size=np.int64(3))) == 2.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        pytest.param({"per_example_loss": np.float32(1.0)}, ValueError, "Expected a tensor with at least rank 1",
                     id="rank0"),
        pytest.param({"global_batch_size": 2.0}, TypeError, "global_batch_size must be an integer", id="float"),
        pytest.param({"global_batch_size": True}, TypeError, "global_batch_size must be an integer", id="bool"),
        pytest.param({"global_batch_size": -1}, InvalidArgumentError, "global_batch_size must be non-negative",
                     id="negative"),
        pytest.param({"global_batch_size": [2]}, ValueError, "global_batch_size must be scalar", id="vector"),
        pytest.param({"sample_weight": np.ones((3, 2))}, InvalidArgumentError, "does not broadcast",
                     id="weights_last_axis_not_1"),
        pytest.param({"sample_weight": np.ones(2)}, InvalidArgumentError, "does not broadcast", id="weights_length"),
    ],
)
def test_compute_average_loss_errors(kwargs, error, match):
    kwargs = {"per_example_loss": np.array([1.0, 2.0, 3.0]), **kwargs}
    with pytest.raises(error, match=match):
        td.nn.compute_average_loss(**kwargs)


def test_negative_global_batch_size_is_a_value_error_too():
    assert issubclass(InvalidArgumentError, ValueError)
    with pytest.raises(ValueError):
        td.nn.compute_average_loss(np.array([1.0]), global_batch_size=-3)


def test_same_rank_weights_may_broadcast_the_losses_like_tensorflow():
    result = td.nn.compute_average_loss(np.ones((3, 1), np.float32), sample_weight=np.ones((3, 2)), global_batch_size=3)
    assert float(result) == pytest.approx(np.ones((3, 2)).sum() / 3)


@pytest.mark.replicas(2, 4)
def test_scale_regularization_loss_divides_by_the_replicas(mirrored_strategy):
    n = mirrored_strategy.num_replicas_in_sync
    result = mirrored_strategy.run(lambda: td.nn.scale_regularization_loss(np.array([1.0, 2.0, 3.0], np.float32)))
    for value in mirrored_strategy.experimental_local_results(result):
        assert value.dtype == np.float32
        assert float(value) == pytest.approx(6.0 / n)


def test_scale_regularization_loss_without_strategy():
    assert float(td.nn.scale_regularization_loss(np.float32(3.0))) == 3.0
    result = td.nn.scale_regularization_loss(np.array([1, 2, 3], np.int32))
    assert result.dtype == np.float64 and float(result) == 6.0


def test_scale_regularization_loss_in_cross_replica_context_raises(mirrored_strategy):
    with mirrored_strategy.scope():
        with pytest.raises(RuntimeError, match="calling `scale_regularization_loss` in cross replica context"):
            td.nn.scale_regularization_loss(np.float32(1.0))
    # Still usable in replica context: the replicas' shares of the term sum back to it.
    shares = mirrored_strategy.run(lambda: td.nn.scale_regularization_loss(np.float32(1.0)))
    assert float(mirrored_strategy.reduce(ReduceOp.SUM, shares, axis=None)) == pytest.approx(1.0)


# --- 6. td.Module -----------------------------------------------------------------------------


class Dense(td.Module):
    def __init__(self, n_in, n_out, name=None):
        super().__init__(name=name)
        self.w = td.Variable(np.zeros((n_in, n_out), np.float32), name="w")
        self.b = td.Variable(np.zeros(n_out, np.float32), name="b")


class MyModel(td.Module):
    def __init__(self):
        super().__init__()
        self.layers = [Dense(2, 3, name="first"), Dense(3, 1, name="second")]
        self.extras = {"steps": td.Variable(0, trainable=False, name="st"), "scale": td.Variable(1.0, name="scale")}
        self.z_alias = self.extras["scale"]  # the same variable twice
        self.again = self.layers[0]  # the same module twice
        self.plain = 3  # not tracked


def test_module_finds_variables_in_attributes_lists_dicts_and_submodules():
    model = MyModel()
    first, second = model.layers
    found = model.variables
    expected = {id(v) for v in (first.w, first.b, second.w, second.b, model.extras["scale"], model.extras["steps"])}
    assert {id(v) for v in found} == expected
    assert len(found) == len(expected)  # deduplicated


def test_module_trainable_filtering():
    model = MyModel()
    assert {id(v) for v in model.non_trainable_variables} == {id(model.extras["steps"])}
    assert len(model.trainable_variables) == 5
    assert all(v.trainable for v in model.trainable_variables)
    assert isinstance(model.variables, tuple) and isinstance(model.trainable_variables, tuple)


def test_module_variables_are_in_tensorflows_order():
    model = MyModel()
    first, second = model.layers
    # TF 2.21 (the same classes): ['scale:0', 'st:0', 'first_b:0', 'first_w:0', 'second_b:0', 'second_w:0'] --
    # the module's own (extras by key: scale, steps), then its sub-modules' (again = first, then second)
    assert [id(v) for v in model.variables] == [
        id(model.extras["scale"]), id(model.extras["steps"]), id(first.b), id(first.w), id(second.b), id(second.w)
    ]


def test_module_submodules_are_nested_modules_deduplicated():
    model = MyModel()
    submodules = model.submodules
    assert {id(m) for m in submodules} == {id(m) for m in model.layers}
    assert len(submodules) == 2
    assert model not in submodules


def test_module_cycles_terminate():
    parent = Dense(1, 1, name="parent")
    child = Dense(1, 1, name="child")
    parent.child = child
    child.parent = parent
    assert {id(v) for v in parent.variables} == {id(parent.w), id(parent.b), id(child.w), id(child.b)}
    assert [m.name for m in parent.submodules] == ["child"]


@pytest.mark.parametrize(
    "class_name, expected",
    [("MyModule", "my_module"), ("HTTPServer", "http_server"), ("Dense2D", "dense2_d"), ("MLP", "mlp"),
     ("ResNet50V2", "res_net50_v2"), ("myModule", "my_module")],
)
def test_module_default_name_is_snake_case_of_the_class(class_name, expected):
    cls = type(class_name, (td.Module,), {})
    assert cls().name == expected


def test_module_default_name_of_a_private_class_matches_tensorflow():
    cls = type("_PrivateModule", (td.Module,), {})
    assert cls().name == "__private_module"


def test_module_explicit_name_and_repr():
    module = Dense(1, 1, name="layer_1")
    assert module.name == "layer_1"
    assert repr(module) == "<Dense name='layer_1'>"


@pytest.mark.parametrize("name", ["1abc", "a b", "", "a.b", "a/b", 3])
def test_module_invalid_name_raises(name):
    with pytest.raises(ValueError, match="td.Module name must be a valid Python identifier"):
        td.Module(name=name)


def test_module_non_ascii_name_raises():
    with pytest.raises(ValueError, match="td.Module name must be a valid Python identifier"):
        td.Module(name="modulé")


def test_module_trainable_variables_train_with_an_optimizer(mirrored_strategy):
    """A Module's trainable variables go straight into apply_gradients; the non-trainable one is untouched."""
    with mirrored_strategy.scope():
        model = MyModel()
        opt = td.optimizers.SGD(0.5)
    trainable = model.trainable_variables

    def step():
        return opt.apply_gradients((np.full(v.shape, rid() + 1.0, v.dtype), v) for v in trainable)

    mirrored_strategy.run(step)
    for var in trainable:
        start = 1.0 if var is model.extras["scale"] else 0.0
        assert_all_components_close(mirrored_strategy, var, np.full(var.shape, start - 0.5 * 3.0, np.float32))
    assert [int(v) for v in host_values(mirrored_strategy, model.extras["steps"])] == [0, 0]
