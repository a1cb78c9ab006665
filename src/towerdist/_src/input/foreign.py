"""Inputs that are not ``td.data.Dataset``: a ``tf.data.Dataset``, a PyTorch ``DataLoader``, any iterable.

Each element of a foreign input is one global batch. TensorFlow and PyTorch are never
imported here: an object is recognised as theirs only if its library is already loaded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from towerdist._src import backend, nest
from towerdist._src.data import options as options_lib
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.sources import ExternalSource
from towerdist._src.data.spec import TensorSpec, structure_of
from towerdist._src.data.structure import close_iterator, normalize_output, read_only_element
from towerdist._src.failures import unworded
from towerdist._src.type_aliases import Nest, TensorLike

__all__ = ["as_dataset"]


def _is_tf_dataset(obj: object) -> bool:
    tf = sys.modules.get("tensorflow")
    data = getattr(tf, "data", None)
    return data is not None and isinstance(obj, data.Dataset)


def _foreign_leaf(leaf: TensorLike) -> TensorLike:
    if hasattr(leaf, "detach") and hasattr(leaf, "numpy"):  # a torch tensor, possibly on a GPU
        return leaf.detach().cpu().numpy()
    if type(leaf).__module__.startswith("tensorflow") and hasattr(leaf, "numpy"):
        return leaf.numpy()
    return leaf


def _element(value: Nest) -> Nest:
    if isinstance(value, list):
        value = tuple(value)  # a DataLoader's default collate gives [features, labels]
    # The arrays may be the caller's own (a list of batches is iterated again every epoch):
    # replicas get read-only views, so that a step writing into its piece cannot change them.
    return read_only_element(normalize_output(nest.map_structure(_foreign_leaf, value)))


# obj: whatever the user passed, checked here; Any, not object, so that an array's shape is read with np.shape.
def as_dataset(obj: Any) -> Dataset:
    """``obj`` as a ``td.data.Dataset`` whose elements are global batches.

    Raises:
      TypeError: ``obj`` is an array, a string, a mapping, or not iterable (unworded: the
        public method that was given ``obj`` names itself in front).
    """
    if isinstance(obj, Dataset):
        return obj
    if backend.is_array(obj):
        raise unworded(
            TypeError(
                f"takes a dataset whose elements are global batches, not an array (an array would be "
                f"iterated row by row). Got an array of shape {np.shape(obj)}; use "
                f"td.data.Dataset.from_tensor_slices(array).batch(global_batch_size)."
            )
        )
    if _is_tf_dataset(obj):
        return TFDataset(obj)
    if isinstance(obj, (str, bytes, dict)) or not isinstance(obj, Iterable):
        raise unworded(
            TypeError(
                f"takes a td.data.Dataset, a tf.data.Dataset, a torch DataLoader or an iterable of global "
                f"batches. Got {type(obj).__name__}: {obj!r:.80}."
            )
        )
    return IterableDataset(obj)


class IterableDataset(ExternalSource):
    """Global batches from any iterable (a list, a DataLoader, a one-shot generator)."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self._iterable = iterable
        self._one_shot = iter(iterable) is iterable
        self._started = False
        self._peeked: list[Any] = []  # a one-shot input's first element, read for its spec
        self._lock = threading.Lock()

    def _external_state(self) -> str | None:
        return f"a {type(self._iterable).__name__} iterated as a dataset: its position"

    def _generate(self) -> Iterator[Any]:
        with self._lock:
            if self._one_shot and self._started:
                raise ValueError(
                    f"The input {type(self._iterable).__name__} is a one-shot iterator and was already iterated; "
                    f"it cannot start a new epoch. Pass a re-iterable (a list, a DataLoader) or use "
                    f"td.data.Dataset.from_generator with a generator function."
                )
            self._started = True
            peeked, self._peeked = self._peeked, []
        yield from peeked
        source = iter(self._iterable)
        try:
            for value in source:
                yield _element(value)
        finally:
            close_iterator(source)

    def _spec(self, probe: bool) -> Nest:
        """Learnt from the first element, with an unknown batch dimension (kept for one-shot inputs)."""
        if not probe:
            return None
        with self._lock:
            if self._one_shot and not self._started and not self._peeked:
                try:
                    self._peeked.append(_element(next(iter(self._iterable))))
                except StopIteration:
                    pass
            first = self._peeked[0] if self._peeked else None
        if first is None:
            if self._one_shot:
                raise ValueError(
                    "Cannot determine the element_spec of a one-shot input that is empty or already iterated."
                )
            source = iter(self._iterable)
            try:
                first = _element(next(source))
            except StopIteration:
                raise ValueError("Cannot determine the element_spec of an empty input.") from None
            finally:
                close_iterator(source)
        return nest.map_structure(
            lambda s: TensorSpec((None, *s.shape[1:]) if s.shape else (), s.dtype), structure_of(first)
        )

    def _cardinality(self) -> int:
        try:
            return len(self._iterable)  # type: ignore[arg-type]
        except TypeError:
            return options_lib.UNKNOWN


class TFDataset(ExternalSource):
    """A ``tf.data.Dataset``, iterated with ``as_numpy_iterator()``."""

    # dataset: a tf.data.Dataset. TensorFlow is optional and never imported here, so its objects
    # (this one, and the specs of _from_tf_spec) are Any: a checker cannot see their types.
    def __init__(self, dataset: Any) -> None:
        self._tf_dataset = dataset
        policy = int(dataset.options().experimental_distribute.auto_shard_policy)
        self._own_options = options_lib.Options()
        self._own_options.experimental_distribute.auto_shard_policy = options_lib.AutoShardPolicy(policy)

    def _external_state(self) -> str | None:
        return "a tf.data.Dataset iterated as a dataset: the position of TensorFlow's iterator"

    def _generate(self) -> Iterator[Any]:
        source = self._tf_dataset.as_numpy_iterator()
        for value in source:
            yield normalize_output(value)

    def _spec(self, probe: bool) -> Nest:
        return nest.map_structure(_from_tf_spec, self._tf_dataset.element_spec)

    def _cardinality(self) -> int:
        return int(self._tf_dataset.cardinality())

    def _batch_size(self) -> int | None:
        compute: Callable[[Any], Any] | None = None
        try:
            from tensorflow.python.data.experimental.ops.distribute import (  # type: ignore[import-untyped]  # noqa: PLC0415  (TensorFlow is optional)
                compute_batch_size,
            )

            compute = compute_batch_size
        except ImportError:  # a TensorFlow without it: fall back to the static shape
            return None
        size = int(compute(self._tf_dataset))
        return size if size >= 0 else None


def _from_tf_spec(spec: Any) -> TensorSpec:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorSpec(shape, np.dtype(spec.dtype.as_numpy_dtype))
