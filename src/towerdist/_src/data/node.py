"""The hooks every node of a dataset pipeline implements (``Dataset`` adds the public API).

A dataset is a graph of nodes: sources (``from_tensor_slices``, ``range``, files, ...) and
transformations (``batch``, ``map``, ``shuffle``, ...), each a subclass of ``Dataset``
implementing a few hooks:

* ``_iterate()``: a generator of elements for one pass;
* ``_spec(probe)``: the element spec, derived from the inputs' specs; ``probe=True`` allows
  running the pipeline up to its first element where user code decides the structure
  (``map``, ``from_generator`` without a signature);
* ``_cardinality()``: the number of elements, or ``INFINITE``/``UNKNOWN``;
* ``_batch_size()``: the global batch size this node's elements come in, when known
  statically (what TensorFlow's ``compute_batch_size`` finds);
* ``_reads_files()``: whether the node reads the files named by its first input (what
  FILE auto-sharding shards);
* ``_tolerant()``: for nodes that run user code on every element, a copy that drops an
  element whose code raised (what ``ignore_errors`` rewrites the pipeline with);
* ``_gather_plan()``: for nodes that only select and reorder elements, a faster plan that
  runs the node on element *indices* and gathers whole batches at once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from towerdist._src.data.spec import EmptyDatasetError, structure_of

if TYPE_CHECKING:
    from towerdist._src.data.dataset import Dataset

__all__ = ["ErrorHandler", "GatherPlan", "Node", "tolerant"]

ErrorHandler = Callable[[BaseException], None]


class GatherPlan(NamedTuple):
    """Run ``indices`` (a dataset of int indices) and gather batches with ``gather(index_array)``."""

    indices: Dataset
    gather: Callable[[np.ndarray], Any]


class Node:
    """A node of a pipeline: its inputs and the hooks (every ``Dataset`` is one)."""

    _inputs: tuple[Dataset, ...] = ()
    _op = ""  # the Dataset method that makes this node, for a node that calls user code per element

    def _iterate(self) -> Iterator[Any]:
        raise NotImplementedError

    def _spec(self, probe: bool) -> Any:
        return self._inputs[0]._spec(probe)

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()

    def _batch_size(self) -> int | None:
        return None

    def _reads_files(self) -> bool:
        """True if this node reads the files named by its first input (what FILE auto-sharding shards)."""
        return False

    def _tolerant(self) -> Dataset | None:
        """A copy of this node that drops an element whose user code raised; None if it runs none.

        ``tolerant`` sets the copy's inputs and its ``_on_error``, which is called with the error.
        """
        return None

    def _gather_plan(self) -> GatherPlan | None:
        return None

    def _clone(self, inputs: tuple[Dataset, ...]) -> Dataset:
        """This node over other inputs (used to rewrite pipelines for sharding)."""
        clone = copy.copy(self)
        clone._inputs = inputs
        return cast("Dataset", clone)

    def _walk(self) -> Iterator[Dataset]:
        """This node and every node upstream of it."""
        yield cast("Dataset", self)
        for node in self._inputs:
            yield from node._walk()

    def _note_failed_element(self, error: BaseException, index: int) -> None:
        """Notes on ``error``, raised by the user function on input element ``index``, where it was raised."""
        error.add_note(f"td.data.Dataset.{self._op}(): raised by the user function on element {index} of its input.")

    def _probe_spec(self) -> Any:
        """The exact spec of the first element (runs the pipeline up to it)."""
        iterator = self._iterate()
        try:
            first = next(iterator)
        except StopIteration:
            raise EmptyDatasetError(
                f"Cannot determine the element_spec of {type(self).__name__}: the dataset is empty and "
                f"its structure is decided by user code. Give from_generator an output_signature."
            ) from None
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
        return structure_of(first)


def tolerant(dataset: Dataset, on_error: ErrorHandler) -> Dataset:
    """A copy of ``dataset`` whose per-element user code drops failing elements (``ignore_errors``)."""

    def rewrite(node: Dataset) -> Dataset:
        inputs = tuple(rewrite(i) for i in node._inputs)
        clone = node._tolerant()
        if clone is None:
            return node if all(a is b for a, b in zip(inputs, node._inputs, strict=True)) else node._clone(inputs)
        clone._inputs = inputs
        clone._on_error = on_error  # type: ignore[attr-defined]
        return clone

    return rewrite(dataset)
