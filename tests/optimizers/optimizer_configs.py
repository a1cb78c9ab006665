"""The optimizer configurations the optimizer tests run (Keras 3 / TF 2.21 literals are per test file)."""

from __future__ import annotations

from typing import Any

# name -> (td.optimizers class name, constructor arguments)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("SGD", {"learning_rate": 0.1}),
    "sgd_momentum": ("SGD", {"learning_rate": 0.1, "momentum": 0.9}),
    "sgd_nesterov": ("SGD", {"learning_rate": 0.1, "momentum": 0.8, "nesterov": True}),
    "adam": ("Adam", {"learning_rate": 0.05}),
    "amsgrad": ("Adam", {"learning_rate": 0.05, "beta_1": 0.8, "beta_2": 0.5, "amsgrad": True}),
    "adagrad": ("Adagrad", {"learning_rate": 0.1}),
    "adagrad_no_initial": ("Adagrad", {"learning_rate": 0.1, "initial_accumulator_value": 0.0, "epsilon": 1e-3}),
    "rmsprop": ("RMSprop", {"learning_rate": 0.05}),
    "rmsprop_momentum": ("RMSprop", {"learning_rate": 0.05, "momentum": 0.5}),
    "rmsprop_centered": ("RMSprop", {"learning_rate": 0.05, "rho": 0.8, "centered": True}),
    "rmsprop_centered_momentum": ("RMSprop", {"learning_rate": 0.05, "momentum": 0.5, "centered": True}),
    "adamw": ("AdamW", {"learning_rate": 0.05, "weight_decay": 0.1}),
    "adamw_amsgrad": (
        "AdamW", {"learning_rate": 0.05, "weight_decay": 0.1, "beta_1": 0.8, "beta_2": 0.5, "amsgrad": True}
    ),
}
