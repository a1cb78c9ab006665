"""The seam that chooses the array module of the GPU backend: cupy, or the simulated GPUs.

``cupy_backend`` asks :func:`array_module` for the module it places arrays and launches work
with. The choice is made once, on first use: the simulated GPUs (``backend/simulated``) when
``TOWERDIST_SIMULATE_GPUS=n`` is set or :func:`simulate` was called, else cupy itself.
:func:`simulate` (``towerdist.testing.simulate_gpus``) makes the simulated GPUs the choice at
any time, so what was looked up before (no cupy, no GPU) is looked up again, on them. The
simulator is loaded only when simulated GPUs are asked for.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeAlias

from towerdist._src.errors import MissingDependencyError

__all__ = ["ENV_VAR", "GpuArray", "array_module", "is_simulated_array", "num_simulated_gpus", "simulate", "simulated"]

ENV_VAR = "TOWERDIST_SIMULATE_GPUS"

# An array of the GPU backend's module: a ``cupy.ndarray``, or a simulated GPU's ``SimulatedArray``
# (``backend/simulated/array.py``), which mimics it. cupy ships no type information (mypy sees the
# whole package as Any), so this stays Any; the name says what flows where a signature takes one.
GpuArray: TypeAlias = Any

_INSTALL_HINT = 'install it with pip install "towerdist[cuda12]" (CUDA 12) or "towerdist[cuda13]" (CUDA 13)'

_lock = threading.Lock()
_chosen: ModuleType | None = None  # the array module GPUs use, once chosen (or simulated)
_simulated: ModuleType | None = None  # the simulated GPUs' cupy module, once they are on
_requested: int | None = None  # the number of GPUs simulate() was asked for
_cupy_missing: ImportError | None = None  # why cupy did not import, once it did not
_owns: Callable[[object], bool] | None = None  # the simulator's test for its arrays, once it is on


def array_module() -> ModuleType:
    """The array module of the GPU backend: the simulated GPUs' module, else cupy.

    Raises:
      MissingDependencyError: cupy is not installed (and no simulated GPUs are asked for).
      ValueError: ``TOWERDIST_SIMULATE_GPUS`` is set but is not a positive number.
    """
    chosen = _chosen
    if chosen is None:
        chosen = _choose()
    return chosen


def _choose() -> ModuleType:
    global _chosen
    module = simulated()
    if module is None:
        module = _cupy()
    with _lock:
        if _chosen is None:
            _chosen = module
        return _chosen


def _cupy() -> ModuleType:
    """cupy, imported (its absence is looked up once, as an import is)."""
    global _cupy_missing
    if _cupy_missing is None:
        try:
            import cupy  # noqa: PLC0415  (an optional dependency)
        except ImportError as error:
            _cupy_missing = error
        else:
            loaded: ModuleType = cupy
            return loaded
    raise MissingDependencyError(f"GPU devices need cupy, which is not installed; {_INSTALL_HINT}.") from _cupy_missing


def simulate(num_gpus: int) -> ModuleType:
    """Switches the process-wide simulation on with ``num_gpus`` GPUs and makes it the GPU backend's array module.

    Raises:
      ValueError: ``num_gpus`` is not a positive int.
      RuntimeError: the simulation is already on with another number of GPUs.
    """
    global _chosen, _simulated, _requested, _owns
    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 1:
        raise ValueError(f"simulate_gpus() needs a positive number of GPUs. Got n={num_gpus!r}.")
    from towerdist._src.backend.simulated import cupy as simulated_cupy  # noqa: PLC0415  (startup cost: only for simulated GPUs)

    with _lock:
        if _simulated is not None and _simulated.cuda.runtime.getDeviceCount() != num_gpus:
            raise RuntimeError(
                f"simulate_gpus({num_gpus}) was called after the simulation started with "
                f"{_simulated.cuda.runtime.getDeviceCount()} GPUs; the number of simulated GPUs is fixed once "
                "devices are used. Call simulate_gpus() once, at program start."
            )
        if _simulated is None:
            _simulated = simulated_cupy.module(num_gpus)
        _requested = num_gpus
        _owns = simulated_cupy.owns
        _chosen = _simulated
        return _simulated


def simulated() -> ModuleType | None:
    """The simulated cupy module if the simulation is on (:func:`simulate` or the environment), else None.

    Raises:
      ValueError: ``TOWERDIST_SIMULATE_GPUS`` is set but is not a positive number.
    """
    if _simulated is not None:
        return _simulated
    if _requested is None and not os.environ.get(ENV_VAR, "").strip():
        return None
    return simulate(_requested if _requested is not None else _env_gpus())


def is_simulated_array(value: object) -> bool:
    """True if ``value`` is an array of the simulated GPUs (False while they are off)."""
    owns = _owns
    return owns is not None and owns(value)


def num_simulated_gpus() -> int:
    """The number of simulated GPUs, 0 when the simulation is off."""
    active = simulated()
    return 0 if active is None else int(active.cuda.runtime.getDeviceCount())


def _env_gpus() -> int:
    text = os.environ.get(ENV_VAR, "").strip()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{ENV_VAR} must be a positive number of simulated GPUs. Got {ENV_VAR}={text!r}; set it to the number "
            f"of GPUs to simulate (e.g. {ENV_VAR}=2), or unset it to use the real GPUs."
        )
    return value
