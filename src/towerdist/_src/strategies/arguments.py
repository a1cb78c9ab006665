"""The argument checks of ``Strategy`` and ``StrategyExtended``'s public methods.

Each check raises an :func:`~towerdist._src.failures.unworded` error; the public method
that called it puts its own name in front (see ``failures.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from towerdist._src import device as device_lib
from towerdist._src.cross_device_ops.gather import axis_index
from towerdist._src.cross_device_ops.placement import ResolvedDevices
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import ValidationError
from towerdist._src.failures import unworded
from towerdist._src.input.input_context import InputOptions, InputReplicationMode
from towerdist._src.type_aliases import AxisLike

if TYPE_CHECKING:
    from towerdist._src.variables.distributed_variable import DistributedVariable

__all__ = [
    "check_call_arguments",
    "check_destinations",
    "check_input_options",
    "check_replication_options",
    "devices_of",
    "element_count",
    "foreign_variable",
    "reduce_axes",
]


def check_input_options(options: object) -> InputOptions | None:
    """``options`` of the input methods: None or an ``InputOptions``."""
    if options is not None and not isinstance(options, InputOptions):
        raise unworded(TypeError(f"takes options=td.distribute.InputOptions(...). Got options={options!r}."))
    return options


def check_replication_options(options: InputOptions | None) -> None:
    """TensorFlow's consistency checks of ``InputOptions`` for ``distribute_datasets_from_function``."""
    if options is None:
        return
    per_replica = options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    if not per_replica and options.experimental_place_dataset_on_device:
        raise ValueError(
            "When `experimental_place_dataset_on_device` is set for dataset placement, you must also "
            "specify `PER_REPLICA` for the replication mode."
        )
    if per_replica and options.experimental_place_dataset_on_device and options.experimental_fetch_to_device:
        raise ValueError(
            "`experimental_place_dataset_on_device` can not be set to True when experimental_fetch_to_device "
            "is True and replication mode is set to `PER_REPLICA`; pass experimental_fetch_to_device=False."
        )


def reduce_axes(axis: AxisLike, ndim: int) -> tuple[int, ...]:
    """``Strategy.reduce``'s ``axis`` (an int or a sequence of ints) as non-negative axes."""
    raw = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    axes = tuple(axis_index(a, ndim) for a in raw)  # unworded: Strategy.reduce() names them
    if len(set(axes)) != len(axes):
        raise unworded(ValueError(f"got a repeated axis: axis={axis!r}."))
    return axes


def element_count(shape: Sequence[int], axes: Sequence[int]) -> int:
    """How many elements of an array of ``shape`` one reduction along ``axes`` covers."""
    count = 1
    for a in axes:
        count *= int(shape[a])
    return count


def check_call_arguments(args: object, kwargs: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` (a list or tuple) and ``kwargs`` (a dict or None) of a call made for the user."""
    if not isinstance(args, (list, tuple)):
        raise unworded(
            ValueError(
                f"takes args as a list or tuple. Got args of type {type(args).__name__}; "
                f"wrap a single argument as args=(x,)."
            )
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise unworded(TypeError(f"takes kwargs as a dict. Got kwargs of type {type(kwargs).__name__}."))
    return tuple(args), dict(kwargs or {})


def check_destinations(destinations: object) -> None:
    """One destination: not None, not a plain list of devices."""
    if destinations is None:
        raise unworded(ValidationError("needs destinations. Got destinations=None; pass a device string or a value."))
    if isinstance(destinations, (list, tuple)) and not isinstance(destinations, ResolvedDevices):
        raise unworded(
            ValidationError(
                f"takes one destination (a device string, a distributed value or a variable), not a "
                f"list. Got destinations={destinations!r}; to reach several devices pass a distributed value "
                f"that lives on them."
            )
        )


def devices_of(target: object) -> tuple[DeviceSpec, ...]:
    """The devices of a variable, a distributed value, a device string or a tuple of them."""
    if isinstance(target, (str, DeviceSpec)):
        return (device_lib.parse(target),)
    if isinstance(target, (tuple, list)) and target and all(isinstance(d, (str, DeviceSpec)) for d in target):
        return tuple(device_lib.parse(d) for d in target)
    devices = getattr(target, "_devices", None)
    if devices:
        return tuple(devices)
    raise ValueError(
        f"`colocate_vars_with` must only be passed a variable created in this tf.distribute.Strategy.scope() "
        f"(or the result of non_slot_devices()), not: {target!r}."
    )


def foreign_variable(var: DistributedVariable, strategy: str) -> ValidationError:
    """The error for updating ``var`` with a strategy (described by ``strategy``) it does not belong to."""
    return ValidationError(
        f"{var.name} was created in the scope of {var._distribute_strategy!r}, not of {strategy}; a strategy "
        f"can only update variables created in its own scope."
    )
