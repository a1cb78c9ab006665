"""``PreemptionWatcher``: TensorFlow's watcher of Borg TPU preemption notices, which has none to watch here."""

from __future__ import annotations

import logging

__all__ = ["PreemptionWatcher"]

logger = logging.getLogger("towerdist")


class PreemptionWatcher:
    """Watches for a preemption notice from TensorFlow's coordination service (Borg TPU jobs).

    TensorFlow's watcher does nothing in any other environment: it logs a warning, and
    ``preemption_message`` stays ``None``. towerdist's environments are all "other" (no
    coordination service: the workers are MPI ranks), so this one does the same. To save
    and exit on ``SIGTERM``, use ``PreemptionCheckpointHandler``.

    Example:
      >>> watcher = td.distribute.experimental.PreemptionWatcher()  # logs a warning
      >>> watcher.preemption_message is None
      True
    """

    def __init__(self) -> None:
        self._preemption_message: str | None = None
        logger.warning(
            "PreemptionWatcher: there is no preemption notice to watch here (TensorFlow's watcher serves Borg TPU "
            "jobs only); preemption_message stays None. Use PreemptionCheckpointHandler to save and exit on SIGTERM."
        )

    @property
    def preemption_message(self) -> str | None:
        """The preemption notice received, or None (always None here)."""
        return self._preemption_message

    def block_until_worker_exit(self) -> None:
        """Would block until a preempted worker exits; returns at once, as TensorFlow's does off Borg TPU."""
