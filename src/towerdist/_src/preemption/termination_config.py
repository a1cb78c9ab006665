"""``TerminationConfig``: how a ``PreemptionCheckpointHandler`` learns of, and reacts to, a preemption."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TerminationConfig"]


class TerminationConfig:
    """What a ``PreemptionCheckpointHandler`` watches for, and what it does once it has saved.

    Every field is optional; an unset field takes the handler's default (as TensorFlow's does
    outside Google Cloud):

    Args:
      termination_watcher_fn: a function returning True once this worker is about to be
        stopped, polled every second on a daemon thread. Default: none; the notice is
        ``SIGTERM`` (what Slurm and Kubernetes send before ``SIGKILL``).
      exit_fn: called on every worker once the checkpoint is saved. Default: ``sys.exit(42)``,
        so ``run()`` raises ``SystemExit(42)`` and each process exits with status 42.
      grace_period: seconds between the notice and the kill. Default 0: save at the agreed
        step and exit. With a grace period the workers save once at once, train on, and save
        again and exit shortly before it ends.
      save_fn: called (with ``save_checkpoint_if_preempted``'s arguments) instead of
        ``CheckpointManager.save()``, on every worker.

    Example:
      >>> config = td.distribute.experimental.TerminationConfig(exit_fn=lambda: sys.exit(143))
      >>> handler = td.distribute.experimental.PreemptionCheckpointHandler(
      ...     strategy.cluster_resolver, checkpoint, "/ckpt", termination_config=config)
    """

    def __init__(
        self,
        termination_watcher_fn: Callable[[], bool] | None = None,
        exit_fn: Callable[[], Any] | None = None,
        grace_period: float | None = None,
        save_fn: Callable[..., Any] | None = None,
    ) -> None:
        self.termination_watcher_fn = termination_watcher_fn
        self.exit_fn = exit_fn
        self.grace_period = grace_period
        self.save_fn = save_fn

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in ("termination_watcher_fn", "exit_fn", "grace_period", "save_fn")
            if getattr(self, name) is not None
        )
        return f"TerminationConfig({fields})"
