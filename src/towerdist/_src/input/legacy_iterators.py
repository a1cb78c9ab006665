"""The iterators of ``make_dataset_iterator`` and ``make_input_fn_iterator`` (TF 1.x-style input).

They are the iterators of the modern distributed datasets, plus what TF 1.x code calls to
start an epoch: ``initialize()``, and the ``initializer`` that TF 1.x ran in a session. In
TensorFlow 2's eager mode both restart the iterator from the first element and give
``None`` (reading ``initializer`` runs ``initialize()``); towerdist does the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from towerdist._src.data.dataset import Dataset
from towerdist._src.data.iterator import DatasetIterator
from towerdist._src.input.distributed_dataset import _DistributedInput
from towerdist._src.input.distributed_iterator import DistributedIterator
from towerdist._src.type_aliases import Nest

__all__ = ["DefaultInputIterator", "DistributedIteratorV1", "input_iterator"]


class DistributedIteratorV1(DistributedIterator):
    """A ``DistributedIterator`` that can be restarted (``tf.distribute``'s TF 1.x-style iterator)."""

    def initialize(self) -> None:
        """Restarts the iteration from the first element; returns ``None``, as TensorFlow 2 does eagerly.

        The read-ahead of the current pass is dropped; the next ``get_next()`` starts a new
        pass (a ``shuffle`` reshuffles).
        """
        self._restart()

    @property
    def initializer(self) -> None:
        """Restarts the iteration, as ``initialize()``, and is ``None`` (TensorFlow 2's eager behaviour).

        TF 1.x code runs ``session.run(iterator.initializer)``; here reading the property is
        the whole of it.
        """
        self.initialize()


class DefaultInputIterator(DatasetIterator):
    """The default strategy's TF 1.x-style iterator: the dataset's own, restartable.

    (TensorFlow 2.21's ``initialize()`` of this iterator raises ``AttributeError``; here it
    restarts, as on the other strategies.)
    """

    def initialize(self) -> None:
        """Restarts the iteration from the first element; returns ``None``."""
        self._restart()

    @property
    def initializer(self) -> None:
        """Restarts the iteration, as ``initialize()``, and is ``None``."""
        self.initialize()


def input_iterator(distributed: Iterable[Nest]) -> Iterator[Nest]:
    """The TF 1.x-style iterator over what a strategy's input distribution returned.

    A distributed dataset (or the dataset the default strategy hands back) gets a restartable
    iterator; anything else (a foreign input the default strategy passed through) its own.
    """
    if isinstance(distributed, _DistributedInput):
        return DistributedIteratorV1(distributed)
    if isinstance(distributed, Dataset):
        return DefaultInputIterator(distributed)
    return iter(distributed)
