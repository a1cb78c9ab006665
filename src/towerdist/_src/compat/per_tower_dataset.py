"""TF 1.x's ``distribute_dataset``: one whole dataset element per tower.

TF 1.8-1.12 treated the dataset's batch as the *per-tower* batch: each step takes the
next ``num_towers`` elements and gives element ``i`` to tower ``i``; a last group too
short to feed every tower is dropped. (TF 2's ``experimental_distribute_dataset`` splits
each global batch instead.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from towerdist._src.data.dataset import Dataset
from towerdist._src.data.iterator import DatasetIterator
from towerdist._src.errors import OutOfRangeError
from towerdist._src.failures import worded_at
from towerdist._src.input.device_copies import place_on_device
from towerdist._src.input.foreign import as_dataset
from towerdist._src.type_aliases import Nest
from towerdist._src.values.regroup import regroup

if TYPE_CHECKING:
    from towerdist._src.strategies.strategy import Strategy

__all__ = ["PerTowerDataset", "PerTowerIterator"]


class PerTowerDataset:
    """The result of ``distribute_dataset``: a dataset split across towers, one element each.

    Use it as TF 1.8 did (``get_next()`` on it directly), as TF 1.9-1.11 did
    (``make_one_shot_iterator()`` / ``make_initializable_iterator()``), or iterate it.
    """

    def __init__(
        self, strategy: Strategy, dataset: Iterable[Nest] | Callable[[], Iterable[Nest]], prefetch: bool = False
    ) -> None:
        if callable(dataset) and not isinstance(dataset, Dataset) and not hasattr(dataset, "element_spec"):
            made = dataset()
            if not isinstance(made, Dataset) and not hasattr(made, "element_spec"):
                raise ValueError(
                    f"dataset_fn() must return a tf.data.Dataset when using a DistributionStrategy. "
                    f"distribute_dataset() called {dataset!r}, which returned {type(made).__name__}."
                )
            dataset = made
        with worded_at("distribute_dataset()"):
            self._dataset = as_dataset(dataset)
        if prefetch:
            self._dataset = self._dataset.prefetch(2)
        self._strategy = strategy
        self._default: PerTowerIterator | None = None

    def make_one_shot_iterator(self) -> PerTowerIterator:
        """A new iterator over the per-tower groups."""
        return PerTowerIterator(self)

    def make_initializable_iterator(self) -> PerTowerIterator:
        """A new iterator; ``initialize()`` (or its ``initializer``) restarts it from the beginning."""
        return PerTowerIterator(self)

    def get_next(self, name: str | None = None) -> Nest:
        """The next group from this object's own iterator (TF 1.8's ``distribute_dataset`` returned an iterator).

        Raises:
          OutOfRangeError: the dataset has fewer elements left than there are towers.
        """
        if self._default is None:
            self._default = PerTowerIterator(self)
        return self._default.get_next(name)

    def __iter__(self) -> PerTowerIterator:
        return PerTowerIterator(self)


class PerTowerIterator:
    """Iterates a :class:`PerTowerDataset`: each step is a ``PerReplica`` with one element per tower.

    It can be saved in a ``td.train.Checkpoint`` as the dataset's own iterator can (its
    position is the dataset iterator's: the next step starts at the next element, whatever
    the number of towers it is restored with).
    """

    def __init__(self, source: PerTowerDataset) -> None:
        self._source = source
        self._elements: DatasetIterator = iter(source._dataset)

    def initialize(self) -> None:
        """Restarts from the first element (TF 1.x's ``iterator.initializer``)."""
        self._elements = iter(self._source._dataset)

    @property
    def initializer(self) -> Callable[[], None]:
        """``initialize`` (TF 1.x code runs ``session.run(iterator.initializer)``; here call it)."""
        return self.initialize

    def get_next(self, name: str | None = None) -> Nest:
        """The next ``num_towers`` elements, element ``i`` on tower ``i``'s device.

        Raises:
          OutOfRangeError: fewer elements are left than there are towers (they are dropped).
        """
        del name
        devices = self._source._strategy.extended._replica_devices
        group = []
        for _ in devices:
            try:
                group.append(next(self._elements))
            except StopIteration:
                raise OutOfRangeError(
                    f"End of sequence: distribute_dataset() needs {len(devices)} more elements for one step "
                    f"(one per tower) and the dataset has {len(group)} left; TF 1.x drops such a remainder."
                ) from None
        placed = [place_on_device(element, device) for element, device in zip(group, devices)]
        # Several towers always get a PerReplica, even when the elements are one object.
        return regroup(placed, devices, always_wrap=len(devices) > 1)

    def __iter__(self) -> PerTowerIterator:
        return self

    def __next__(self) -> Nest:
        try:
            return self.get_next()
        except OutOfRangeError:
            raise StopIteration from None

    # --- checkpointing -----------------------------------------------------------------------

    def _checkpoint_state(self) -> bytes:
        """This iterator's position as bytes, for ``td.train.Checkpoint`` (the dataset iterator's)."""
        return self._elements._checkpoint_state()

    def _checkpoint_restorer(self, state: bytes) -> Callable[[], None]:
        """Prepares restoring the position ``state``; the result commits it (see ``DatasetIterator``)."""
        return self._elements._checkpoint_restorer(state)
