"""The hooks every node of a dataset pipeline implements (``Dataset`` adds the public API).

A dataset is a graph of nodes: sources (``from_tensor_slices``, ``range``, files, ...) and
transformations (``batch``, ``map``, ``shuffle``, ...), each a subclass of ``Dataset``
implementing a few hooks:

* ``_iterate(state)``: a generator of elements for one pass, keeping its position in
  ``state`` (see :mod:`~towerdist._src.data.cursor`: everything that outlives an element is
  a public attribute of ``state`` whenever the generator yields; inputs are iterated
  through ``state.input()``);
* ``_save_state(state)``, ``_state_params()``, ``_restored_input(key, state)``,
  ``_external_state()``, ``_symbolic_checkpoint()``: how a pass's position is saved and
  checked on restore (the defaults suit most nodes);
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

from towerdist._src.data.cursor import Cursor, Saved, State, saved_state
from towerdist._src.data.spec import ElementSpec, EmptyDatasetError, structure_of

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

    def _iterate(self, state: State) -> Iterator[Any]:
        raise NotImplementedError

    def _cursor(self, saved: Saved | None = None, may_continue: bool = False) -> Cursor:
        """A new pass over this node (at the position ``saved``, if given).

        ``may_continue``: the reader is a dataset iterator, which goes on after an error of an
        operation that holds elements (see ``continuing``).
        """
        return Cursor(cast("Dataset", self), saved, may_continue=may_continue)

    # --- saving a pass's position (see cursor) ----------------------------------------------

    def _save_state(self, state: State) -> Saved:
        """The position of the pass ``state`` belongs to; called between elements."""
        return saved_state(cast("Dataset", self), state)

    def _state_name(self) -> str:
        """The operation's name in a saved position, checked on restore."""
        return type(self).__name__

    def _state_params(self) -> dict[str, Any]:
        """Arguments a saved position is only valid for, checked on restore (plain JSON values)."""
        return {}

    def _state_params_hint(self) -> str | None:
        """What a user should know when ``_state_params`` differ from the saved ones (e.g. a default
        that depends on the machine), or None."""
        return None

    def _restored_input(self, key: str, state: State) -> Dataset:
        """The node the saved child ``key`` of a restored ``state`` iterates (by default input ``key``)."""
        return self._inputs[int(key)]

    def _external_state(self) -> str | None:
        """What state of this node lives outside the pipeline (a Python generator's position), or None."""
        return None

    def _symbolic_checkpoint(self) -> bool:
        """Whether TensorFlow can checkpoint this operation symbolically (``experimental_symbolic_checkpoint``)."""
        return True

    def _random_state(self) -> dict[str, Any] | None:
        """What this node's future passes draw from that belongs to the dataset, not to a pass
        (a seed drawn for this process, the next epoch number), or None; saved with an iterator."""
        return None

    def _restore_random_state(self, saved: dict[str, Any]) -> None:
        """Adopts the ``_random_state`` of the saved run's node (only called if it had one)."""

    def _spec(self, probe: bool) -> ElementSpec:
        return self._inputs[0]._spec(probe)

    def _cardinality(self) -> int:
        return self._inputs[0]._cardinality()

    def _batch_size(self) -> int | None:
        return None

    def _batch_rows(self) -> tuple[int | None, str | None]:
        """The number of rows of this node's elements when they are batches whose rows can be cut
        again into batches of another size exactly (a pass restored onto another per-replica batch
        size does that), else ``(None, why not)``. Nodes that keep the rows of each element as they
        are, in order (``map``, ``prefetch``, ``with_options``), answer for their input.
        """
        return None, f"its last operation is a {self._state_name()}, not a batch"

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

    def _probe_spec(self) -> ElementSpec:
        """The exact spec of the first element (runs the pipeline up to it)."""
        iterator = self._cursor()
        try:
            first = next(iterator)
        except StopIteration:
            raise EmptyDatasetError(
                f"Cannot determine the element_spec of {type(self).__name__}: the dataset is empty and "
                f"its structure is decided by user code. Give from_generator an output_signature."
            ) from None
        finally:
            iterator.close()
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
