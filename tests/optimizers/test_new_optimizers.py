"""Adagrad, RMSprop and AdamW (dense gradients): Keras 3's rules, arguments, slots and configs.

The expected numbers are Keras 3.15.1 / TF 2.21's (CPU): ``tf.Variable(VAR0)``, the optimizer,
three ``opt.apply_gradients([(tf.constant(DENSE[step]), var)])`` steps; then the variable and
each slot (``opt.variables``), printed as float32. Keras's AdamW slots ``momentum``,
``velocity``, ``velocity_hat`` are ``m``, ``v``, ``vhat`` here (as for Adam).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from optimizer_configs import CONFIGS as ALL_CONFIGS

import towerdist as td

from conftest import mirrored_param

VAR0 = np.arange(10, dtype=np.float32).reshape(5, 2) * np.float32(0.1) + np.float32(0.05)
DENSE = [
    np.array([[0.1, 0.2], [0.3, -0.4], [0.5, 0.6], [0.0, 0.0], [-1.0, 0.5]], np.float32),
    np.array([[0.0, 0.0], [0.25, 0.75], [-0.2, 0.1], [1.5, -0.5], [0.0, 0.0]], np.float32),
    np.array([[0.4, -0.1], [0.0, 0.0], [0.2, 0.3], [-0.6, 0.2], [0.3, 0.3]], np.float32),
]
CONFIGS = {name: config for name, config in ALL_CONFIGS.items() if config[0] in ("Adagrad", "RMSprop", "AdamW")}

# Keras 3.15.1 / TF 2.21: the variable and its slots after the three dense steps.
EXPECTED = {
    "adagrad": {
        "var": [[-0.05713115, 0.12236766], [0.13142344, 0.34574878], [0.3670105, 0.40685916], [0.58859825, 0.80248976], [0.91784537, 0.82025796]],
        "accumulator": [[0.27, 0.15], [0.2525, 0.8225], [0.42999998, 0.56], [2.71, 0.39], [1.19, 0.44]],
    },
    "adagrad_no_initial": {
        "var": [[-0.14207642, 0.095507786], [0.086741395, 0.3615147], [0.3525117, 0.38953626], [0.5871542, 0.81272537], [0.92122847, 0.7988254]],
        "accumulator": [[0.17000002, 0.050000004], [0.1525, 0.7225], [0.32999998, 0.46], [2.6100001, 0.29], [1.09, 0.34]],
    },
    "rmsprop": {
        "var": [[-0.262363, 0.06867407], [-0.012460627, 0.36703038], [0.29339382, 0.2886306], [0.5533157, 0.8466842], [0.9581139, 0.7041808]],
        "velocity": [[0.01681, 0.00424], [0.012915, 0.063585], [0.02785, 0.03906], [0.2385, 0.0265], [0.089999996, 0.02925]],
    },
    "rmsprop_momentum": {
        "var": [[-0.38094246, -0.049909864], [-0.18321918, 0.4150739], [0.20552331, 0.156366], [0.47425878, 0.92574096], [1.0766993, 0.5855956]],
        "velocity": [[0.01681, 0.00424], [0.012915, 0.063585], [0.02785, 0.03906], [0.2385, 0.0265], [0.089999996, 0.02925]],
        "momentum": [[0.19378349, -0.037258003], [0.09170206, 0.03101318], [0.06873574, 0.12910478], [0.017627425, -0.017627385], [0.010471523, 0.12723404]],
    },
    "rmsprop_centered": {
        "var": [[-0.20233491, 0.08438717], [0.029953964, 0.371274], [0.32216713, 0.32881925], [0.5714239, 0.828576], [0.93510634, 0.7443878]],
        "velocity": [[0.03328, 0.00712], [0.021520002, 0.11048], [0.046400007, 0.065680005], [0.432, 0.048000004], [0.14600001, 0.050000004]],
        "average_gradient": [[0.092800006, 0.0056], [0.07840001, 0.0688], [0.072000004, 0.15280002], [0.120000005, -0.040000003], [-0.068, 0.124000005]],
    },
    "rmsprop_centered_momentum": {
        "var": [[-0.40776157, -0.06452619], [-0.21540937, 0.42772564], [0.18961918, 0.12985307], [0.46216708, 0.93783253], [1.0909281, 0.56206906]],
        "velocity": [[0.01681, 0.00424], [0.012915, 0.063585], [0.02785, 0.03906], [0.2385, 0.0265], [0.089999996, 0.02925]],
        "momentum": [[0.20777544, -0.035470344], [0.09958124, 0.029646825], [0.07254828, 0.14093906], [0.02116634, -0.02116628], [0.009071875, 0.13793156]],
        "average_gradient": [[0.048100002, 0.0061999997], [0.0468, 0.035099998], [0.042499997, 0.08760001], [0.075, -0.024999997], [-0.05099999, 0.0705]],
    },
    "adamw": {
        "var": [[-0.07084328, 0.05606336], [0.10914983, 0.36409152], [0.3529397, 0.41203386], [0.58844393, 0.7906607], [0.93576634, 0.81433934]],
        "m": [[0.048100002, 0.0062000006], [0.046800002, 0.0351], [0.0425, 0.08760001], [0.075, -0.025], [-0.051000003, 0.0705]],
        "v": [[0.00016998003, 0.000049920047], [0.00015225759, 0.0007216177], [0.00032946028, 0.0004592704], [0.0026077502, 0.00028975002], [0.0010880011, 0.00033950026]],
    },
    "adamw_amsgrad": {
        "var": [[-0.05853045, 0.06738442], [0.11376814, 0.36448446], [0.36072442, 0.4250501], [0.59560496, 0.7834999], [0.92311215, 0.8256254]],
        "m": [[0.092800006, 0.0056000017], [0.0784, 0.06879999], [0.072, 0.15280001], [0.120000005, -0.04], [-0.067999996, 0.124]],
        "v": [[0.081250004, 0.010000001], [0.026875, 0.160625], [0.06125, 0.0925], [0.7425, 0.0825], [0.17, 0.07625]],
        "vhat": [[0.081250004, 0.020000001], [0.05375, 0.32125], [0.125, 0.18], [1.125, 0.125], [0.5, 0.125]],
    },
}


def make(config: str, strategy=None):
    kind, hparams = CONFIGS[config]
    if strategy is None:
        return td.Variable(VAR0.copy(), name="w"), getattr(td.optimizers, kind)(**hparams)
    with strategy.scope():
        return td.Variable(VAR0.copy(), name="w"), getattr(td.optimizers, kind)(**hparams)


def assert_matches_keras(strategy, var, opt, config: str) -> None:
    expected = EXPECTED[config]
    assert sorted(opt.get_slot_names()) == sorted(name for name in expected if name != "var")
    for name, values in expected.items():
        target = var if name == "var" else opt.get_slot(var, name)
        for component in strategy.experimental_local_results(target):
            got = np.asarray(component.numpy())
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, np.asarray(values, np.float32), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_one_process_matches_keras(default, config):
    var, opt = make(config)
    for grad in DENSE:
        opt.apply_gradients([(grad, var)])
    assert_matches_keras(default, var, opt, config)


@pytest.mark.parametrize("strategy_name", [mirrored_param(1), mirrored_param(2), mirrored_param(4)])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_replicas_sum_their_gradients_and_match_keras(request, strategy_name, config):
    strategy = request.getfixturevalue(strategy_name)
    replicas = strategy.num_replicas_in_sync
    var, opt = make(config, strategy)
    for grad in DENSE:  # each replica passes an equal share (exact in binary: 1/1, 1/2, 1/4)
        strategy.run(lambda grad=grad: opt.apply_gradients([(grad / np.float32(replicas), var)]))
    assert_matches_keras(strategy, var, opt, config)


@pytest.mark.gpus(2)
@pytest.mark.replicas(2)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_two_gpus_match_keras(mirrored_strategy, config):
    var, opt = make(config, mirrored_strategy)
    for grad in DENSE:
        mirrored_strategy.run(lambda grad=grad: opt.apply_gradients([(grad / np.float32(2), var)]))
    assert_matches_keras(mirrored_strategy, var, opt, config)


@pytest.mark.gpus(3)
@pytest.mark.replicas(3)
@pytest.mark.parametrize("config", ["adagrad", "rmsprop_centered_momentum", "adamw_amsgrad"])
def test_three_gpus_match_keras(mirrored_strategy, config):
    var, opt = make(config, mirrored_strategy)
    for grad in DENSE:  # replica 0 passes the gradient, the others zeros: the sum is exact
        def step_fn(grad=grad):
            replica = int(td.distribute.get_replica_context().replica_id_in_sync_group)
            opt.apply_gradients([(grad if replica == 0 else np.zeros_like(grad), var)])

        mirrored_strategy.run(step_fn)
    assert_matches_keras(mirrored_strategy, var, opt, config)


# --- arguments, defaults, configs, slots ----------------------------------------------------------


# Keras 3.15.1: inspect.signature(keras.optimizers.X.__init__), without the arguments towerdist's
# optimizers do not take (weight_decay except AdamW's, clipnorm, clipvalue, global_clipnorm, use_ema,
# ema_momentum, ema_overwrite_frequency, loss_scale_factor, gradient_accumulation_steps, **kwargs),
# as for SGD and Adam. Keras's default names are generated ("adagrad"); towerdist's are the class's.
SIGNATURES = {
    "Adagrad": {"learning_rate": 0.001, "initial_accumulator_value": 0.1, "epsilon": 1e-07, "name": "Adagrad"},
    "RMSprop": {
        "learning_rate": 0.001, "rho": 0.9, "momentum": 0.0, "epsilon": 1e-07, "centered": False, "name": "RMSprop"
    },
    "AdamW": {
        "learning_rate": 0.001, "weight_decay": 0.004, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07,
        "amsgrad": False, "name": "AdamW",
    },
}


@pytest.mark.parametrize("kind", list(SIGNATURES))
def test_arguments_defaults_and_order_follow_keras(kind):
    parameters = inspect.signature(getattr(td.optimizers, kind)).parameters
    assert {name: p.default for name, p in parameters.items()} == SIGNATURES[kind]
    assert list(parameters) == list(SIGNATURES[kind])
    opt = getattr(td.optimizers, kind)()
    for name, default in SIGNATURES[kind].items():
        assert getattr(opt, name) == default


@pytest.mark.parametrize(
    "kind, hparams, slots",
    [
        ("Adagrad", {}, ["accumulator"]),
        ("RMSprop", {}, ["velocity"]),
        ("RMSprop", {"momentum": 0.5}, ["velocity", "momentum"]),
        ("RMSprop", {"centered": True}, ["velocity", "average_gradient"]),
        ("RMSprop", {"momentum": 0.5, "centered": True}, ["velocity", "momentum", "average_gradient"]),
        ("AdamW", {}, ["m", "v"]),
        ("AdamW", {"amsgrad": True}, ["m", "v", "vhat"]),
    ],
)
def test_slot_names(kind, hparams, slots):
    assert getattr(td.optimizers, kind)(**hparams).get_slot_names() == slots


def test_adagrad_accumulator_starts_at_its_initial_value(mirrored_strategy):
    with mirrored_strategy.scope():
        var = td.Variable(np.ones((2, 3), np.float64))
        opt = td.optimizers.Adagrad(initial_accumulator_value=0.25)
    opt.build([var])
    for component in mirrored_strategy.experimental_local_results(opt.get_slot(var, "accumulator")):
        assert component.numpy().dtype == np.float64
        np.testing.assert_array_equal(component.numpy(), np.full((2, 3), 0.25))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_get_config_from_config_round_trip(config):
    kind, hparams = CONFIGS[config]
    opt = getattr(td.optimizers, kind)(**hparams, name="mine")
    config_dict = opt.get_config()
    assert config_dict["name"] == "mine"
    for key, value in hparams.items():
        assert config_dict[key] == value
    twin = type(opt).from_config(config_dict)
    assert type(twin) is type(opt) and twin.get_config() == config_dict
    assert twin.get_slot_names() == opt.get_slot_names()
    assert repr(opt).startswith(f"{kind}(name='mine', learning_rate=")


@pytest.mark.parametrize(
    "factory, match",
    [
        pytest.param(lambda: td.optimizers.Adagrad(initial_accumulator_value=-0.1), "`initial_accumulator_value` must",
                     id="accumulator_negative"),
        pytest.param(lambda: td.optimizers.Adagrad(epsilon=None), "`epsilon` must be a float >= 0", id="adagrad_eps"),
        pytest.param(lambda: td.optimizers.RMSprop(rho=1.5), "`rho` must be a float between", id="rho"),
        pytest.param(lambda: td.optimizers.RMSprop(momentum=-0.5), "`momentum` must be a float between", id="mom"),
        pytest.param(lambda: td.optimizers.RMSprop(epsilon=-1.0), "`epsilon` must be a float >= 0", id="rms_eps"),
        pytest.param(lambda: td.optimizers.AdamW(weight_decay=None), "Argument `weight_decay` must be a float",
                     id="wd_none"),
        pytest.param(lambda: td.optimizers.AdamW(weight_decay=float("nan")), "must be a finite float", id="wd_nan"),
        pytest.param(lambda: td.optimizers.AdamW(beta_1=1.0), "`beta_1` must be a float in", id="beta_1"),
        pytest.param(lambda: td.optimizers.Adagrad(learning_rate=-1.0), "Argument `learning_rate` should be",
                     id="lr"),
    ],
)
def test_bad_hyperparameters_raise(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


# --- AdamW's weight decay -------------------------------------------------------------------------------


def test_adamw_decays_before_adams_step_and_excluded_variables_take_adams_step_only(mirrored_strategy):
    with mirrored_strategy.scope():
        kernel = td.Variable(VAR0.copy(), name="dense/kernel")
        bias = td.Variable(VAR0.copy(), name="dense/bias")
        listed = td.Variable(VAR0.copy(), name="listed")
        reference = td.Variable(VAR0.copy(), name="reference")
        opt = td.optimizers.AdamW(learning_rate=0.05, weight_decay=0.1)
        adam = td.optimizers.Adam(learning_rate=0.05)
    opt.exclude_from_weight_decay(var_list=[listed], var_names=["bias"])
    for grad in DENSE:
        opt.apply_gradients([(grad, kernel), (grad, bias), (grad, listed)])
        adam.apply_gradients([(grad, reference)])
    np.testing.assert_allclose(kernel.numpy(), EXPECTED["adamw"]["var"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(bias.numpy(), reference.numpy())
    np.testing.assert_array_equal(listed.numpy(), reference.numpy())


def test_adamw_exclusions_after_build_raise():
    var = td.Variable(VAR0.copy())
    opt = td.optimizers.AdamW()
    opt.build([var])
    with pytest.raises(ValueError, match=r"AdamW\.exclude_from_weight_decay\(\) can only be called before"):
        opt.exclude_from_weight_decay(var_names=["w"])


# --- checkpoints ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["adagrad", "rmsprop_centered_momentum", "adamw_amsgrad"])
def test_checkpoint_restores_the_slots_and_training_continues_identically(mirrored_strategy, tmp_path, config):
    var, opt = make(config, mirrored_strategy)
    for grad in DENSE[:2]:
        mirrored_strategy.run(lambda grad=grad: opt.apply_gradients([(grad / np.float32(2), var)]))
    path = td.train.Checkpoint(w=var, opt=opt).save(str(tmp_path / "ckpt"))
    mirrored_strategy.run(lambda: opt.apply_gradients([(DENSE[2] / np.float32(2), var)]))

    twin_var, twin_opt = make(config, mirrored_strategy)
    td.train.Checkpoint(w=twin_var, opt=twin_opt).restore(path)
    assert int(twin_opt.iterations.numpy()) == 2
    mirrored_strategy.run(lambda: twin_opt.apply_gradients([(DENSE[2] / np.float32(2), twin_var)]))
    np.testing.assert_array_equal(twin_var.numpy(), var.numpy())
    for name in opt.get_slot_names():
        np.testing.assert_array_equal(twin_opt.get_slot(twin_var, name).numpy(), opt.get_slot(var, name).numpy())
    assert_matches_keras(mirrored_strategy, twin_var, twin_opt, config)
