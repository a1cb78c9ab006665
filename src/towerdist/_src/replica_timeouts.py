"""The replica timeouts: how long replicas wait for each other before a warning, and before failing.

A setting (``td.config.set_replica_timeouts``, or the environment variables
``TOWERDIST_REPLICA_WARNING_SECONDS`` and ``TOWERDIST_REPLICA_TIMEOUT_SECONDS``) read by the
step watch (``strategies/watchdog.py``) and by the workers' handshakes
(``multi_worker/workers.py``); it sits below both.
"""

from __future__ import annotations

import math
import numbers
import os

__all__ = ["bounds", "get_replica_timeouts", "set_replica_timeouts"]


def _seconds(value: object, name: str, where: str) -> float | None:
    """A bound in seconds: a number > 0; None or infinity mean "never"."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{where} takes {name} as a number of seconds, or None (never). Got {name}={value!r} of type "
            f"{type(value).__name__}."
        )
    seconds = float(value)
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(f"{where} needs {name} > 0, or None (never). Got {name}={value!r}.")
    return None if math.isinf(seconds) else seconds


def _env_seconds(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip().lower()
    if text in ("none", "off", "never", "0"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value < 0:
        raise ValueError(
            f"The environment variable {name}={raw!r} is not a number of seconds. Set it to a number > 0, "
            f"or to 'none', 'off', 'never', 'inf' or 0 to disable the bound (or unset it for the default)."
        )
    return _seconds(value, name, f"The environment variable {name}")


# The live bounds: read by the step watch and the handshakes, written only by set_replica_timeouts.
bounds: dict[str, float | None] = {
    "warning_seconds": _env_seconds("TOWERDIST_REPLICA_WARNING_SECONDS", 60.0),
    "timeout_seconds": _env_seconds("TOWERDIST_REPLICA_TIMEOUT_SECONDS", None),
}


def set_replica_timeouts(warning_seconds: float | None = 60.0, timeout_seconds: float | None = None) -> None:
    """Bounds how long replicas wait for each other at a ``merge_call`` barrier.

    Only replicas that wait are timed: a replica computing longer than the others while
    nobody waits for it at a barrier (they returned, or it runs alone) is never timed.

    Args:
      warning_seconds: after this long, warn (``td.errors.ReplicaStallWarning`` and a
        ``towerdist`` log record) naming the replicas that have not arrived. None (or
        ``float("inf")``) disables it.
      timeout_seconds: after this long, stop the step and raise
        ``td.errors.DeadlineExceededError`` naming the missing replicas. None (the default,
        also ``float("inf")``) waits forever, since user code may legitimately be slow;
        test suites should set it.

    The defaults can also come from the environment variables
    ``TOWERDIST_REPLICA_WARNING_SECONDS`` and ``TOWERDIST_REPLICA_TIMEOUT_SECONDS`` (a
    number of seconds; ``none``, ``off``, ``never``, ``inf`` or ``0`` disable the bound);
    an invalid value fails the import with a ``ValueError`` naming the variable.

    Raises:
      TypeError: a bound is not a number (numpy scalars are numbers).
      ValueError: a bound is NaN, zero or negative.
    """
    warning = _seconds(warning_seconds, "warning_seconds", "set_replica_timeouts()")
    timeout = _seconds(timeout_seconds, "timeout_seconds", "set_replica_timeouts()")
    bounds["warning_seconds"] = warning
    bounds["timeout_seconds"] = timeout


def get_replica_timeouts() -> dict[str, float | None]:
    """The current ``{"warning_seconds": ..., "timeout_seconds": ...}``."""
    return dict(bounds)
