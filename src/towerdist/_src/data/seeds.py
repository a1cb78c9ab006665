"""Seeds and epoch numbers: what makes the passes of a random operation (``shuffle``, ``Dataset.random``,
``sample_from_datasets``) random, kept so that a restored iterator's dataset draws as the saved one would."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["SeedSource", "Seeded"]


class SeedSource:
    """A node's seed and the number of its next pass (epoch).

    An unseeded node draws its seed from the operating system once, for this process. The
    copies of a node that a pipeline rewrite makes (gather plans, auto-sharding) share it.
    """

    def __init__(self, seed: int | None) -> None:
        self.seeded = seed is not None
        self.seed: int = int(np.random.SeedSequence().entropy) if seed is None else seed  # type: ignore[arg-type]
        self._next_epoch = 0
        self._lock = threading.Lock()

    def next_epoch(self) -> int:
        """The number of a new pass (each pass of a reshuffling node draws a new order)."""
        with self._lock:
            epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
            return epoch

    def state(self) -> dict[str, Any]:
        return {"seed": self.seed, "next_epoch": self._next_epoch}

    def restore(self, saved: dict[str, Any]) -> None:
        with self._lock:
            if not self.seeded:
                self.seed = saved["seed"]
            self._next_epoch = saved["next_epoch"]


class Seeded:
    """A node with a :class:`SeedSource`, saved with its iterators.

    An iterator saved in a checkpoint carries the seed and the next epoch number of every
    such node of its pipeline, and a restored iterator's dataset adopts them: the passes
    it makes after the restored one draw the orders the saved run would have drawn.
    """

    _seeds: SeedSource

    def _init_seed(self, seed: int | None) -> None:
        self._seeds = SeedSource(seed)

    @property
    def _seed(self) -> int:
        return self._seeds.seed

    def _random_state(self) -> dict[str, Any] | None:
        return self._seeds.state()

    def _restore_random_state(self, saved: dict[str, Any]) -> None:
        self._seeds.restore(saved)
