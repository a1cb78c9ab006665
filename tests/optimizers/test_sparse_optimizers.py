"""Optimizers applying ``IndexedSlices`` gradients, checked against Keras 3's numbers.

Keras 3.15.1 / TF 2.21 (CPU), per configuration: ``tf.Variable(VAR0)``, the optimizer, and
three ``opt.apply_gradients([(tf.IndexedSlices(values, indices, [5, 2]), var)])`` steps with
the slices of ``SLICES`` (duplicate rows within a step; row 3 untouched until step 2, row 4
touched in step 1 only); then the variable and each slot (``opt.variables``), printed as
float32. The same steps under ``tf.distribute.MirroredStrategy`` over 1, 2, 3 and 4 logical
CPUs (``tf.config.set_logical_device_configuration``), the slices split between the replicas
as ``OWNER`` says (a row sent by two replicas; replicas with an empty ``IndexedSlices``),
inside ``strategy.run``, gave bit-identical numbers: TensorFlow's all-reduce concatenates the
replicas' slices, so each slice is squared on its own wherever it came from. towerdist sums
the slices' squares beside the slices (``optimizers/sparse_gradients.py``) and gets them too.

Keras's slot names map to towerdist's: Adam's ``momentum``/``velocity``/``velocity_hat`` are
``m``/``v``/``vhat`` here; the others are the same.
"""

from __future__ import annotations

import numpy as np
import pytest
from optimizer_configs import CONFIGS

import towerdist as td

from conftest import mirrored_param

InvalidArgumentError = td.errors.InvalidArgumentError

VAR0 = np.arange(10, dtype=np.float32).reshape(5, 2) * np.float32(0.1) + np.float32(0.05)
SLICES = [  # per step: (row, slice)
    [(0, [0.1, 0.2]), (2, [0.3, -0.4]), (0, [0.5, 0.6])],
    [(4, [-1.0, 0.5]), (1, [0.25, 0.75])],
    [(2, [0.2, 0.1]), (2, [-0.3, 0.4]), (3, [1.5, -0.5])],
]
OWNER = {  # per replica count, per step: the replica that sends each slice
    1: [[0, 0, 0], [0, 0], [0, 0, 0]],
    2: [[0, 0, 1], [0, 0], [0, 1, 1]],
    3: [[0, 1, 2], [1, 2], [0, 1, 2]],
    4: [[0, 2, 3], [0, 0], [0, 1, 2]],
}


# Keras 3.15.1 / TF 2.21: the variable and its slots after the three steps (see the module docstring).
EXPECTED = {
    "sgd": {
        "var": [[-0.010000002, 0.07000001], [0.225, 0.27500004], [0.43, 0.54], [0.5, 0.8], [0.95000005, 0.90000004]],
    },
    "sgd_momentum": {
        "var": [[-0.1126, -0.066800006], [0.2025, 0.20750004], [0.37870002, 0.60840005], [0.5, 0.8], [1.0400001, 0.855]],
        "momentum": [[-0.0486, -0.0648], [-0.022499999, -0.0675], [-0.0143, -0.017600004], [-0.15, 0.05], [0.089999996, -0.044999998]],
    },
    "sgd_nesterov": {
        "var": [[-0.12712002, -0.086160004], [0.189, 0.16700001], [0.37944004, 0.57808006], [0.38000003, 0.84000003], [1.094, 0.828]],
        "momentum": [[-0.038400006, -0.051200002], [-0.020000001, -0.060000002], [-0.009200003, -0.024400003], [-0.15, 0.05], [0.080000006, -0.040000003]],
    },
    "adam": {
        "var": [[-0.07872984, 0.011619426], [0.18403348, 0.28403294], [0.35675678, 0.6237111], [0.6180595, 0.78194034], [0.91596717, 0.8840331]],
        "m": [[0.048600003, 0.0648], [0.0225, 0.0675], [0.0143, 0.0176], [0.15, -0.05], [-0.09, 0.045]],
        "v": [[0.00025948024, 0.00039920042], [0.0000624375, 0.0005619375], [0.0002198201, 0.00032968022], [0.0022500001, 0.00025], [0.000999, 0.00024975]],
    },
    "amsgrad": {
        "var": [[-0.061275195, 0.03038276], [0.19429284, 0.29429284], [0.36639714, 0.61278284], [0.6228919, 0.7771081], [0.9057072, 0.8942929]],
        "m": [[0.0768, 0.102400005], [0.04, 0.120000005], [0.0184, 0.0488], [0.3, -0.1], [-0.16, 0.08]],
        "v": [[0.0325, 0.05], [0.015625, 0.140625], [0.07625, 0.105000004], [1.125, 0.125], [0.25, 0.0625]],
        "vhat": [[0.13, 0.2], [0.03125, 0.28125], [0.07625, 0.105000004], [1.125, 0.125], [0.5, 0.125]],
    },
    "adagrad": {
        "var": [[-0.049999986, 0.036862932], [0.18798265, 0.25785577], [0.39885297, 0.55219716], [0.55215085, 0.8345154], [0.9453463, 0.86548465]],
        "accumulator": [[0.36, 0.5], [0.1625, 0.6625], [0.32, 0.43], [2.35, 0.35], [1.1, 0.35]],
    },
    "adagrad_no_initial": {
        "var": [[-0.067444056, 0.02366671], [0.15079053, 0.25008878], [0.37182277, 0.56278175], [0.55002224, 0.8498006], [0.9499501, 0.85019946]],
        "accumulator": [[0.26, 0.4], [0.0625, 0.5625], [0.22000001, 0.33000004], [2.25, 0.25], [1., 0.25]],
    },
    "rmsprop": {
        "var": [[-0.13605174, -0.049999744], [0.091887385, 0.19188628], [0.3269887, 0.56367975], [0.4918862, 0.9081136], [1.0081139, 0.79188645]],
        "velocity": [[0.02106, 0.0324], [0.0056249998, 0.050625], [0.02029, 0.02996], [0.22500001, 0.025], [0.089999996, 0.022499999]],
    },
    "rmsprop_momentum": {
        "var": [[-0.27559057, -0.19999956], [0.012831077, 0.1128294], [0.20840394, 0.6822648], [0.4918862, 0.9081136], [1.0871707, 0.71282965]],
        "velocity": [[0.02106, 0.0324], [0.0056249998, 0.050625], [0.02029, 0.02996], [0.22500001, 0.025], [0.089999996, 0.022499999]],
        "momentum": [[0.04651294, 0.049999937], [0.07905631, 0.079056874], [0.004426576, 0.10490531], [0.15811385, -0.15811357], [-0.0790569, 0.079056785]],
    },
    "rmsprop_centered": {
        "var": [[-0.10471298, -0.021498427], [0.12500063, 0.22500008], [0.35093066, 0.5654714], [0.52500004, 0.8749998], [0.97499996, 0.8250002]],
        "velocity": [[0.03328, 0.051200002], [0.010000001, 0.09], [0.037520003, 0.05448], [0.45000002, 0.05], [0.16000001, 0.040000003]],
        "average_gradient": [[0.07680001, 0.102400005], [0.040000003, 0.120000005], [0.018400006, 0.048800007], [0.3, -0.1], [-0.16000001, 0.080000006]],
    },
    "rmsprop_centered_momentum": {
        "var": [[-0.3007796, -0.23188071], [0.0000022053719, 0.10000026], [0.19361505, 0.69647956], [0.4833334, 0.91666627], [1.0999999, 0.70000064]],
        "velocity": [[0.02106, 0.0324], [0.0056249998, 0.050625], [0.02029, 0.02996], [0.22500001, 0.025], [0.089999996, 0.022499999]],
        "momentum": [[0.050111372, 0.054554388], [0.0833326, 0.083333254], [0.006386496, 0.10351963], [0.16666663, -0.1666663], [-0.08333329, 0.08333315]],
        "average_gradient": [[0.0486, 0.0648], [0.022499999, 0.0675], [0.0143, 0.017600004], [0.15, -0.05], [-0.089999996, 0.044999998]],
    },
    "adamw": {
        "var": [[-0.07869211, 0.010223407], [0.18048823, 0.2789952], [0.35070673, 0.61483604], [0.6083582, 0.77074647], [0.90309477, 0.87004024]],
        "m": [[0.048600003, 0.0648], [0.0225, 0.0675], [0.0143, 0.0176], [0.15, -0.05], [-0.09, 0.045]],
        "v": [[0.00025948024, 0.00039920042], [0.0000624375, 0.0005619375], [0.0002198201, 0.00032968022], [0.0022500001, 0.00025], [0.000999, 0.00024975]],
    },
    "adamw_amsgrad": {
        "var": [[-0.061274443, 0.028946988], [0.19073166, 0.28923914], [0.36031568, 0.6039392], [0.6131906, 0.7659142], [0.8928507, 0.88028413]],
        "m": [[0.0768, 0.102400005], [0.04, 0.120000005], [0.0184, 0.0488], [0.3, -0.1], [-0.16, 0.08]],
        "v": [[0.0325, 0.05], [0.015625, 0.140625], [0.07625, 0.105000004], [1.125, 0.125], [0.25, 0.0625]],
        "vhat": [[0.13, 0.2], [0.03125, 0.28125], [0.07625, 0.105000004], [1.125, 0.125], [0.5, 0.125]],
    },
}

KERAS_SLOT = {"m": "m", "v": "v", "vhat": "vhat"}


def replica_slices(step: int, replicas: int, replica: int) -> td.IndexedSlices:
    """The slices replica ``replica`` of ``replicas`` sends at ``step`` (possibly none)."""
    mine = [s for s, owner in zip(SLICES[step], OWNER[replicas][step]) if owner == replica]
    indices = np.asarray([row for row, _ in mine], np.int64)
    values = np.asarray([values for _, values in mine], np.float32).reshape(-1, 2)
    return td.IndexedSlices(values, indices, dense_shape=[5, 2])


def make(config: str, strategy=None, name: str = "w"):
    kind, hparams = CONFIGS[config]
    if strategy is None:
        return td.Variable(VAR0.copy(), name=name), getattr(td.optimizers, kind)(**hparams)
    with strategy.scope():
        return td.Variable(VAR0.copy(), name=name), getattr(td.optimizers, kind)(**hparams)


def assert_matches_keras(strategy, var, opt, config: str) -> None:
    expected = EXPECTED[config]
    local = strategy.experimental_local_results if strategy is not None else (lambda v: (v,))
    assert sorted(opt.get_slot_names()) == sorted(name for name in expected if name != "var")
    for name, values in expected.items():
        target = var if name == "var" else opt.get_slot(var, name)
        for component in local(target):
            got = np.asarray(component.numpy())
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, np.asarray(values, np.float32), rtol=1e-5, atol=1e-6, err_msg=name)


def run_replica_steps(strategy, var, opt) -> None:
    replicas = strategy.num_replicas_in_sync
    for step in range(len(SLICES)):
        def step_fn(step=step):
            replica = int(td.distribute.get_replica_context().replica_id_in_sync_group)
            opt.apply_gradients([(replica_slices(step, replicas, replica), var)])

        strategy.run(step_fn)


# --- Keras's numbers: one process, replicas, GPUs -----------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS))
def test_one_process_matches_keras(config):
    var, opt = make(config)
    for step in range(len(SLICES)):
        opt.apply_gradients([(replica_slices(step, 1, 0), var)])
    assert_matches_keras(None, var, opt, config)
    assert int(opt.iterations.numpy()) == 3


@pytest.mark.parametrize("strategy_name", [mirrored_param(1), mirrored_param(2), mirrored_param(4)])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_replicas_summing_sparse_gradients_match_keras(request, strategy_name, config):
    strategy = request.getfixturevalue(strategy_name)
    var, opt = make(config, strategy)
    run_replica_steps(strategy, var, opt)
    assert_matches_keras(strategy, var, opt, config)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_one_device_strategy_matches_keras(one_device_cpu, config):
    var, opt = make(config, one_device_cpu)
    run_replica_steps(one_device_cpu, var, opt)
    assert_matches_keras(one_device_cpu, var, opt, config)


@pytest.mark.gpus(2)
@pytest.mark.replicas(2)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_two_gpus_match_keras(mirrored_strategy, config):
    var, opt = make(config, mirrored_strategy)
    run_replica_steps(mirrored_strategy, var, opt)
    assert all("GPU" in d for d in mirrored_strategy.extended.worker_devices)
    assert_matches_keras(mirrored_strategy, var, opt, config)


@pytest.mark.gpus(3)
@pytest.mark.replicas(3)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_three_gpus_match_keras(mirrored_strategy, config):
    var, opt = make(config, mirrored_strategy)
    run_replica_steps(mirrored_strategy, var, opt)
    assert all("GPU" in d for d in mirrored_strategy.extended.worker_devices)
    assert_matches_keras(mirrored_strategy, var, opt, config)


@pytest.mark.parametrize("config", ["amsgrad", "adagrad", "rmsprop_centered_momentum"])
def test_cross_replica_per_replica_slices_are_summed(mirrored_strategy, config):
    var, opt = make(config, mirrored_strategy)
    for step in range(len(SLICES)):
        gradient = mirrored_strategy.experimental_distribute_values_from_function(
            lambda context, step=step: replica_slices(step, 2, context.replica_id_in_sync_group)
        )
        opt.apply_gradients([(gradient, var)])
    assert_matches_keras(mirrored_strategy, var, opt, config)


@pytest.mark.parametrize("config", ["sgd", "adam", "adagrad", "rmsprop"])
def test_cross_replica_plain_slices_are_applied_as_given(mirrored_strategy, config):
    var, opt = make(config, mirrored_strategy)
    for step in range(len(SLICES)):
        opt.apply_gradients([(replica_slices(step, 1, 0), var)])
    assert_matches_keras(mirrored_strategy, var, opt, config)


@pytest.mark.parametrize("config", ["adam", "adagrad", "rmsprop_momentum"])
def test_without_aggregation_each_replica_applies_the_whole_step(mirrored_strategy, config):
    var, opt = make(config, mirrored_strategy)
    for step in range(len(SLICES)):
        def step_fn(step=step):  # every replica passes the whole step, its own object
            opt.apply_gradients([(replica_slices(step, 1, 0), var)], experimental_aggregate_gradients=False)

        mirrored_strategy.run(step_fn)
    assert_matches_keras(mirrored_strategy, var, opt, config)


# --- what Keras does with slices, in small cases ------------------------------------------------


def test_squares_of_a_rows_slices_are_summed_not_the_square_of_their_sum():
    # Keras 3.15.1 / TF 2.21: Adagrad(learning_rate=0.1), slices 1.0 and 2.0 of row 0 of a (2, 1)
    # variable: accumulator [[5.1], [0.1]] (0.1 + 1 + 4), not [[9.1], [0.1]] (0.1 + 3**2).
    var = td.Variable(np.zeros((2, 1), np.float32))
    opt = td.optimizers.Adagrad(learning_rate=0.1)
    opt.apply_gradients([(td.IndexedSlices(np.array([[1.0], [2.0]], np.float32), np.array([0, 0]), [2, 1]), var)])
    np.testing.assert_allclose(opt.get_slot(var, "accumulator").numpy(), [[5.1], [0.1]], rtol=1e-6)


@pytest.mark.parametrize("config", ["sgd", "adagrad", "rmsprop"])
def test_row_wise_rules_leave_other_rows_and_their_slots_untouched(config):
    var, opt = make(config)
    opt.apply_gradients([(replica_slices(0, 1, 0), var)])  # rows 0 and 2
    untouched = [1, 3, 4]
    np.testing.assert_array_equal(var.numpy()[untouched], VAR0[untouched])
    for name in opt.get_slot_names():
        slot = opt.get_slot(var, name).numpy()
        initial = 0.1 if config == "adagrad" else 0.0
        np.testing.assert_array_equal(slot[untouched], np.full((3, 2), initial, np.float32))


@pytest.mark.parametrize("config", ["sgd_momentum", "adam", "rmsprop_momentum", "adamw"])
def test_densifying_rules_move_rows_without_a_gradient(config):
    var, opt = make(config)
    opt.apply_gradients([(replica_slices(1, 1, 0), var)])  # rows 4 and 1
    opt.apply_gradients([(replica_slices(0, 1, 0), var)])  # rows 0 and 2: the momentum moves rows 1 and 4 again
    after_two = var.numpy()
    opt.apply_gradients([(td.IndexedSlices(np.zeros((0, 2), np.float32), np.zeros(0, np.int64), [5, 2]), var)])
    assert not np.array_equal(var.numpy()[[1, 4]], after_two[[1, 4]])


@pytest.mark.parametrize("config", list(CONFIGS))
def test_an_empty_gradient_counts_a_step(config):
    var, opt = make(config)
    opt.apply_gradients([(td.IndexedSlices(np.zeros((0, 2), np.float32), np.zeros(0, np.int64), [5, 2]), var)])
    assert int(opt.iterations.numpy()) == 1
    if config in ("sgd", "adagrad", "adagrad_no_initial", "rmsprop", "rmsprop_centered", "sgd_momentum",
                  "sgd_nesterov", "adam", "amsgrad", "rmsprop_momentum", "rmsprop_centered_momentum"):
        np.testing.assert_array_equal(var.numpy(), VAR0)  # no gradient, zero slots: nothing moves
    else:  # AdamW decays every weight
        np.testing.assert_allclose(var.numpy(), VAR0 * np.float32(1 - 0.05 * 0.1), rtol=1e-6)


def test_float64_slices_of_a_float32_variable_are_cast():
    var = td.Variable(np.ones((3, 2), np.float32))
    td.optimizers.SGD(learning_rate=0.5).apply_gradients(
        [(td.IndexedSlices(np.ones((1, 2), np.float64), np.array([1], np.int32), [3, 2]), var)]
    )
    assert var.dtype == np.float32
    np.testing.assert_array_equal(var.numpy(), [[1, 1], [0.5, 0.5], [1, 1]])


def test_slices_without_dense_shape_are_rows_of_the_variable():
    var = td.Variable(np.ones((3, 2), np.float32))
    td.optimizers.SGD(learning_rate=0.5).apply_gradients([(td.IndexedSlices(np.ones((1, 2), np.float32), [2]), var)])
    np.testing.assert_array_equal(var.numpy(), [[1, 1], [1, 1], [0.5, 0.5]])


def test_two_dimensional_indices_name_one_row_each():
    var = td.Variable(np.zeros((3, 2), np.float32))
    values = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    td.optimizers.SGD(learning_rate=1.0).apply_gradients([(td.IndexedSlices(values, np.array([[0, 2], [2, 0]])), var)])
    np.testing.assert_array_equal(var.numpy(), [[-6, -8], [0, 0], [-6, -8]])


def test_replicas_mixing_slices_and_dense_gradients_sum_them_densely(mirrored_strategy):
    with mirrored_strategy.scope():
        var = td.Variable(np.zeros((3, 2), np.float32))
        opt = td.optimizers.SGD(learning_rate=1.0)

    def step_fn():
        if int(td.distribute.get_replica_context().replica_id_in_sync_group) == 0:
            grad = td.IndexedSlices(np.ones((2, 2), np.float32), np.array([1, 1]), [3, 2])
        else:
            grad = np.full((3, 2), 0.5, np.float32)
        opt.apply_gradients([(grad, var)])

    mirrored_strategy.run(step_fn)
    for component in mirrored_strategy.experimental_local_results(var):
        np.testing.assert_array_equal(component.numpy(), [[-0.5, -0.5], [-2.5, -2.5], [-0.5, -0.5]])


def test_sparse_and_dense_variables_in_one_step(mirrored_strategy):
    with mirrored_strategy.scope():
        table = td.Variable(VAR0.copy(), name="table")
        bias = td.Variable(np.zeros(2, np.float32), name="bias")
        opt = td.optimizers.Adam(learning_rate=0.05)
    for step in range(len(SLICES)):
        def step_fn(step=step):
            replica = int(td.distribute.get_replica_context().replica_id_in_sync_group)
            opt.apply_gradients([(replica_slices(step, 2, replica), table), (np.ones(2, np.float32), bias)])

        mirrored_strategy.run(step_fn)
    assert_matches_keras(mirrored_strategy, table, opt, "adam")
    # bias: Adam with a constant gradient 2 (1 per replica) moves by lr each step
    np.testing.assert_allclose(bias.numpy(), [-0.15, -0.15], rtol=1e-5)


# --- errors: TF's types, named at apply_gradients, nothing changed, the strategy still works ----------


BAD_SLICES = [
    pytest.param(
        lambda: td.IndexedSlices(np.ones((1, 2), np.float32), np.array([1]), [6, 2]),
        r"SGD\.apply_gradients\(\): the gradient of w(:0)?( from replica 1)? is an IndexedSlices of dense_shape "
        r"\(6, 2\), but the variable has shape \(5, 2\)",
        id="dense_shape",
    ),
    pytest.param(
        lambda: td.IndexedSlices(np.ones((1, 3), np.float32), np.array([1])),
        r"SGD\.apply_gradients\(\): the gradient of w(:0)?( from replica 1)? is an IndexedSlices whose slices have "
        r"shape \(3,\)",
        id="row_shape",
    ),
    pytest.param(
        lambda: td.IndexedSlices(np.ones((2, 2), np.float32), np.array([1, 5]), [5, 2]),
        r"SGD\.apply_gradients\(\): the gradient of w(:0)?( from replica 1)? \(an IndexedSlices\): indices\[1\] = 5 "
        r"is not in \[0, 5\)",
        id="index_too_large",
    ),
    pytest.param(
        lambda: td.IndexedSlices(np.ones((1, 2), np.float32), np.array([-1]), [5, 2]),
        r"SGD\.apply_gradients\(\): the gradient of w(:0)?( from replica 1)? \(an IndexedSlices\): indices\[0\] = -1 "
        r"is not in \[0, 5\)",
        id="negative_index",
    ),
    pytest.param(
        lambda: td.IndexedSlices(np.array([["a", "b"]]), np.array([1]), [5, 2]),
        r"SGD\.apply_gradients\(\): the gradient of w(:0)?( from replica 1)? has dtype <U1, but the variable has "
        r"dtype float32: it is not an array of numbers",
        id="strings",
    ),
    pytest.param(
        lambda: td.IndexedSlices(np.ones((1, 2), np.complex64), np.array([1]), [5, 2]),
        r"SGD\.apply_gradients\(\): the gradient of w(:0)?( from replica 1)? has dtype complex64, but the variable "
        r"has dtype float32: its imaginary part would be dropped",
        id="complex",
    ),
]


def assert_still_works(strategy, var, opt) -> None:
    """The variable kept its value; the next good step works."""
    for component in strategy.experimental_local_results(var):
        np.testing.assert_array_equal(component.numpy(), VAR0)
    good = td.IndexedSlices(np.ones((1, 2), np.float32), np.array([0]), [5, 2])

    def step_fn():
        opt.apply_gradients([(good, var)], experimental_aggregate_gradients=False)

    strategy.run(step_fn)
    for component in strategy.experimental_local_results(var):
        np.testing.assert_allclose(component.numpy()[0], VAR0[0] - 0.1, rtol=1e-6)
        np.testing.assert_array_equal(component.numpy()[1:], VAR0[1:])


@pytest.mark.parametrize("bad, match", BAD_SLICES)
def test_bad_slices_from_one_replica_raise_and_change_nothing(mirrored_strategy, bad, match):
    var, opt = make("sgd", mirrored_strategy)

    def step_fn():
        replica = int(td.distribute.get_replica_context().replica_id_in_sync_group)
        grad = bad() if replica == 1 else td.IndexedSlices(np.ones((1, 2), np.float32), np.array([0]), [5, 2])
        opt.apply_gradients([(grad, var)])

    with pytest.raises(InvalidArgumentError, match=match) as raised:
        mirrored_strategy.run(step_fn)
    assert "from replica 1" in str(raised.value)
    assert int(opt.iterations.numpy()) == 0
    assert_still_works(mirrored_strategy, var, opt)


@pytest.mark.parametrize("bad, match", BAD_SLICES)
def test_bad_slices_in_one_process_raise_and_change_nothing(bad, match):
    var, opt = make("sgd")
    with pytest.raises(InvalidArgumentError, match=match):
        opt.apply_gradients([(bad(), var)])
    np.testing.assert_array_equal(var.numpy(), VAR0)
    opt.apply_gradients([(td.IndexedSlices(np.ones((1, 2), np.float32), np.array([0]), [5, 2]), var)])
    np.testing.assert_allclose(var.numpy()[0], VAR0[0] - 0.1, rtol=1e-6)


def test_slices_of_a_scalar_variable_raise():
    var = td.Variable(np.float32(1.0), name="s")
    with pytest.raises(InvalidArgumentError, match=r"Adam\.apply_gradients\(\): the gradient of s(:0)? is an "
                       r"IndexedSlices, but the variable is a scalar"):
        td.optimizers.Adam().apply_gradients([(td.IndexedSlices(np.ones(1, np.float32), np.array([0])), var)])
    assert float(var.numpy()) == 1.0


def test_a_bad_second_variable_leaves_the_first_unchanged(mirrored_strategy):
    with mirrored_strategy.scope():
        first = td.Variable(np.ones(2, np.float32), name="first")
        var = td.Variable(VAR0.copy(), name="w")
        opt = td.optimizers.Adam()
    bad = td.IndexedSlices(np.ones((1, 2), np.float32), np.array([9]), [5, 2])
    with pytest.raises(InvalidArgumentError, match=r"Adam\.apply_gradients\(\): the gradient of w"):
        mirrored_strategy.run(lambda: opt.apply_gradients([(np.ones(2, np.float32), first), (bad, var)]))
    np.testing.assert_array_equal(first.numpy(), [1, 1])
    np.testing.assert_array_equal(var.numpy(), VAR0)
