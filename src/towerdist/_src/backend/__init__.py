"""Array backends behind one interface.

Each backend module (``numpy_backend``, ``cupy_backend``) exports the same functions:
``owns``, ``asarray``, ``to_device``, ``to_device_of``, ``copy``, ``buffer_id``, ``share``, ``freeze``, ``empty``, ``zeros``, ``flat``,
``accumulate_into``, ``divide_into``, ``unique_rows_sum``, ``add_n``, ``add``, ``true_divide``, ``concat``, ``split``,
``synchronize``, ``on_device``, ``on_array_device``, and the array module as ``xp``. Code that places, moves or reduces data
goes through these functions and never calls numpy or cupy directly, so the same code
serves CPU and GPU devices.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from towerdist._src.backend import cupy_backend, numpy_backend

if TYPE_CHECKING:  # device names import the backends: only the type is named here
    from towerdist._src.device import DeviceSpec

__all__ = ["for_array", "for_device", "host", "is_array"]


def host() -> ModuleType:
    """The backend of host memory (numpy)."""
    return numpy_backend


def for_device(device: DeviceSpec | None) -> ModuleType:
    """The backend that stores arrays for ``device`` (a DeviceSpec or None for the host)."""
    if device is not None and device.device_type == "GPU":
        return cupy_backend
    return numpy_backend


def for_array(value: object) -> ModuleType:
    """The backend that owns ``value``; Python scalars and lists belong to numpy."""
    if cupy_backend.owns(value):
        return cupy_backend
    return numpy_backend


def is_array(value: object) -> bool:
    """True for numpy or cupy arrays and numpy scalars."""
    return numpy_backend.owns(value) or cupy_backend.owns(value)
