"""``padded_batch``: batching elements of different shapes by padding them to a common shape.

Every component of a batch is padded, dimension by dimension, to its *padded shape*: a
fixed size where ``padded_shapes`` gives one, otherwise the largest size among the batch's
elements (TensorFlow's rule). Padding goes at the end of each dimension and uses the
component's padding value: zero, ``False`` or ``b""`` unless ``padding_values`` says
otherwise. ``bucket_by_sequence_length`` (in ``windowing``) batches its buckets with the
helpers here.

A padding value must have its component's dtype exactly, as in TensorFlow, where a Python
``int`` is an int32 and a Python ``float`` a float32: ``padding_values=0`` on int64 data is
a ``TypeError`` (pass ``np.int64(0)``), ``-1.0`` on float32 data is fine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from towerdist._src import backend, nest
from towerdist._src.data.cursor import State
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.saved_errors import raise_saved_error, save_error
from towerdist._src.data.spec import ElementSpec, TensorSpec, dtype_name
from towerdist._src.data.structure import to_component
from towerdist._src.data.transforms import batched_cardinality, read_chunk
from towerdist._src.errors import DataLossError, InvalidArgumentError
from towerdist._src.failures import name_api, unworded, worded_at
from towerdist._src.type_aliases import Nest, TensorLike

__all__ = [
    "ComponentPlan",
    "PaddedBatchDataset",
    "int_argument",
    "pad_batch",
    "padded_spec",
    "plan_padding",
    "refuse_unrepresentable",
    "up_to",
]

Shape = tuple[int | None, ...]


class ComponentPlan(NamedTuple):
    """How one component is padded: its padded shape (``None``: the batch's largest) and value."""

    shape: Shape
    value: TensorLike  # a scalar of the component's dtype (``bytes`` for strings)


def int_argument(value: object, name: str) -> int:
    """``value`` as a Python int; an unworded ``TypeError`` naming ``name`` for anything else."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise unworded(TypeError(f"takes an integer {name}. Got {name}={value!r}."))
    return int(value)


def up_to(treespec: nest.PyTreeSpec, value: Nest, name: str) -> list[Any]:
    """The parts of ``value`` at the leaves of the element structure ``treespec``.

    As in ``tf.data``, a list is a leaf (a shape, a value), not a structure.

    Raises:
      TypeError: ``value`` has a leaf where the element has a structure, or another kind
        of structure.
      ValueError: the structures have different lengths or keys.
    """
    try:
        return list(treespec.flatten_up_to(value))
    except (ValueError, TypeError) as error:
        text = str(error)
        kind = TypeError if "Expected an instance" in text else ValueError
        raise unworded(
            kind(f"{name} must have the structure of the dataset's elements, {treespec}. Got {name}={value!r} ({text})")
        ) from None


def _padded_shape(value: Any, index: int) -> Shape:
    """One component's ``padded_shapes`` entry as a shape (an int means a vector of that size)."""
    # Any: the entry as the user wrote it (a list, a TensorShape, an int, or anything else, refused here).
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = [value]
    if hasattr(value, "as_list") and callable(value.as_list):  # a TensorShape-like object
        value = value.as_list()
    if value is None or isinstance(value, (str, bytes, dict)):
        raise unworded(
            ValueError(
                f"padded_shapes entry for component {index} must be a shape (a list of sizes, None or -1 for "
                f"the batch's largest size). Got {value!r}."
            )
        )
    try:
        entries = list(value)
    except TypeError:
        raise unworded(
            TypeError(f"padded_shapes entry for component {index} must be a shape. Got {value!r}.")
        ) from None
    dims: list[int | None] = []
    for entry in entries:
        if entry is None:
            dims.append(None)
            continue
        if isinstance(entry, bool) or not isinstance(entry, (int, np.integer)):
            raise unworded(
                TypeError(
                    f"padded shape must be an int64 vector: component {index} has the entry {entry!r} "
                    f"(a {type(entry).__name__}). Got padded shape {value!r}."
                )
            )
        size = int(entry)
        if size < -1:
            raise unworded(
                ValueError(
                    f"padded shape dimension {size} of component {index} must be >= 0, or None / -1 for the "
                    f"batch's largest size. Got padded shape {value!r}."
                )
            )
        dims.append(None if size == -1 else size)
    return tuple(dims)


def _padding_value(value: object, spec: TensorSpec, index: int) -> TensorLike:
    """One component's padding value, converted as TensorFlow converts it and checked against ``spec``."""
    if value is None:
        return b"" if spec.dtype == np.object_ else spec.dtype.type(0)
    converted = to_component(value)
    if np.ndim(converted) != 0:
        raise unworded(
            ValueError(
                f"padding_values must be scalars, but the value for component {index} has shape "
                f"{np.shape(converted)}. Got {value!r}."
            )
        )
    dtype = np.dtype(np.object_) if isinstance(converted, bytes) else np.asarray(converted).dtype
    if dtype != spec.dtype:
        hint = ""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            hint = (
                f" (a Python {type(value).__name__} is {dtype_name(dtype)}, as in TensorFlow; pass "
                f"np.{dtype_name(spec.dtype)}({value!r}))"
            )
        raise unworded(
            TypeError(
                f"padding_values must have the dtype of their component: the value for component {index} is "
                f"{dtype_name(dtype)}{hint}, the component is {dtype_name(spec.dtype)}. Got {value!r}."
            )
        )
    return converted if isinstance(converted, bytes) else np.asarray(converted)[()]


def plan_padding(
    spec: ElementSpec, padded_shapes: Nest, padding_values: Nest, *, rank_only: bool = False
) -> tuple[list[ComponentPlan], nest.PyTreeSpec]:
    """The padding plan of every component of elements of ``spec``, and their structure.

    ``rank_only`` says that ``spec`` was learnt from one element: its sizes are not static,
    so only its ranks and dtypes are checked against ``padded_shapes``.

    Raises:
      ValueError: a component has an unknown rank and no padded shape, or a padded shape
        does not fit the component's shape.
      TypeError: a padding value has another dtype than its component, or a structure
        does not match the elements'.
    """
    specs, treespec = nest.flatten(spec)
    shapes = [None] * len(specs) if padded_shapes is None else up_to(treespec, padded_shapes, "padded_shapes")
    values = [None] * len(specs) if padding_values is None else up_to(treespec, padding_values, "padding_values")
    plans = []
    for index, (component, shape, value) in enumerate(zip(specs, shapes, values, strict=True)):
        refuse_spec(component, index)
        if padded_shapes is None:
            if component.shape is None:
                raise unworded(
                    ValueError(
                        f"needs padded_shapes: component {index} has an unknown rank, so its padded shape "
                        f"cannot be inferred. Give padded_shapes (e.g. [None] for a vector)."
                    )
                )
            padded: Shape = tuple(None for _ in component.shape) if rank_only else component.shape
        else:
            padded = _padded_shape(shape, index)
            known = component.shape
            if known is not None and rank_only:
                known = tuple(None for _ in known)
            if not _fits(padded, known):
                raise unworded(
                    ValueError(
                        f"padded shape {padded} is not compatible with the shape {component.shape} of component "
                        f"{index} of the elements (same rank, and a fixed size no smaller than a known one)."
                    )
                )
        plans.append(ComponentPlan(padded, _padding_value(value, component, index)))
    return plans, treespec


def _fits(padded: Shape, known: Shape | None) -> bool:
    """True if elements of shape ``known`` can be padded to ``padded`` (same rank, no size smaller)."""
    if known is None:
        return True
    return len(padded) == len(known) and all(
        p is None or k is None or p >= k for p, k in zip(padded, known, strict=True)
    )


def refuse_spec(component: object, index: int) -> None:
    """Refuses a component that is not a dense array (a dataset, ...) by its spec."""
    if not isinstance(component, TensorSpec):
        raise unworded(
            TypeError(
                f"pads dense array components only, but component {index} of the elements is "
                f"{component!r}. Ragged and sparse tensors and datasets have no numpy form to pad."
            )
        )


def refuse_unrepresentable(leaf: TensorLike, index: int) -> TensorLike:
    """``leaf`` as an array, or a ``TypeError`` for values numpy cannot hold densely.

    TensorFlow's ragged and sparse tensors have no numpy representation; their stand-ins
    (an object array of arrays, a ``tf.RaggedTensor``, a scipy sparse matrix) are refused
    with a message that says so, instead of being padded or stacked into nonsense.
    """
    if isinstance(leaf, bytes):
        return np.array(leaf, dtype=object)
    if isinstance(leaf, np.generic):
        return np.asarray(leaf)
    if isinstance(leaf, np.ndarray):
        if leaf.dtype == np.object_ and not all(isinstance(item, bytes) for item in leaf.reshape(-1).tolist()):
            raise unworded(
                TypeError(
                    f"cannot pad component {index}: it is an object array holding non-string items, the numpy "
                    f"stand-in for a ragged tensor. numpy has no ragged or sparse tensors; give every element as a "
                    f"dense array (one per row) instead."
                )
            )
        return leaf
    if backend.is_array(leaf):
        return leaf  # a cupy array
    raise unworded(
        TypeError(
            f"pads dense arrays only, but component {index} is a {type(leaf).__module__}.{type(leaf).__name__}. "
            f"Ragged and sparse tensors have no numpy representation; convert it to a dense array first "
            f"(e.g. RaggedTensor.to_tensor() or a sparse matrix's toarray())."
        )
    )


def pad_batch(elements: Sequence[Nest], plans: Sequence[ComponentPlan], treespec: nest.PyTreeSpec) -> Nest:
    """Pads the components of ``elements`` to their plans' shapes and stacks them.

    Raises:
      DataLossError: an element is larger than a fixed padded size (TensorFlow's error).
      InvalidArgumentError: an element has another structure or rank than the others.
    """
    columns: list[list[Any]] = [[] for _ in plans]
    for position, element in enumerate(elements):
        leaves, spec = nest.flatten(element)
        if spec != treespec:
            raise unworded(
                InvalidArgumentError(
                    f"cannot batch elements of different structures: {treespec} and {spec} (element {position})."
                )
            )
        for index, leaf in enumerate(leaves):
            columns[index].append(refuse_unrepresentable(leaf, index))
    return treespec.unflatten(
        [_pad_component(column, plan, k) for k, (column, plan) in enumerate(zip(columns, plans, strict=True))]
    )


def _pad_component(column: list[TensorLike], plan: ComponentPlan, index: int) -> TensorLike:
    rank = len(plan.shape)
    for position, array in enumerate(column):
        if isinstance(plan.value, bytes) and array.dtype != np.object_:
            raise unworded(
                TypeError(
                    f"cannot pad component {index}: its spec says strings (an object array), but element "
                    f"{position} is a {dtype_name(array.dtype)} array of shape {tuple(array.shape)}. An object array of "
                    f"arrays is numpy's stand-in for a ragged tensor, and numpy has no ragged or sparse tensors; give "
                    f"every element as a dense array (one per row) instead."
                )
            )
        if array.ndim != rank:
            raise unworded(
                InvalidArgumentError(
                    f"component {index} must have rank {rank} (its padded shape is {plan.shape}), but element "
                    f"{position} of the batch has shape {tuple(array.shape)}."
                )
            )
    target = []
    for dim, fixed in enumerate(plan.shape):
        largest = max(int(array.shape[dim]) for array in column)
        if fixed is not None and largest > fixed:
            position = next(p for p, array in enumerate(column) if array.shape[dim] > fixed)
            raise unworded(
                DataLossError(
                    f"attempted to pad to a smaller size than the input element: component {index} of element "
                    f"{position} of the batch has shape {tuple(column[position].shape)}, larger than its padded shape "
                    f"{plan.shape} in dimension {dim}. Make the padded shape large enough, or use None for the batch's "
                    f"largest size."
                )
            )
        target.append(largest if fixed is None else fixed)
    first = column[0]
    dtype = first.dtype
    xp = backend.for_array(first).xp
    out = xp.full((len(column), *target), plan.value, dtype=dtype)
    for position, array in enumerate(column):
        # The trailing Ellipsis makes the target a (possibly 0-d) view, never a single item:
        # assigning a 0-d object array to an item would store the array itself, not its string.
        out[(position, *(slice(0, int(size)) for size in array.shape), ...)] = array
    return out


def padded_spec(
    plans: Sequence[ComponentPlan], input_specs: Sequence[TensorSpec], batch: int | None
) -> list[TensorSpec]:
    """The specs of padded batches: the batch dimension, then each component's padded shape."""
    return [TensorSpec((batch, *plan.shape), spec.dtype) for plan, spec in zip(plans, input_specs, strict=True)]


class PaddedBatchDataset(Dataset):
    def __init__(
        self, input_dataset: Dataset, batch_size: int, padded_shapes: Nest, padding_values: Nest, drop_remainder: bool
    ) -> None:
        self._inputs = (input_dataset,)
        self._api = "Dataset.padded_batch()"
        self._size = int_argument(batch_size, "batch_size")
        if self._size <= 0:
            raise unworded(InvalidArgumentError(f"batch size must be greater than zero. Got batch_size={self._size}."))
        self._drop = bool(drop_remainder)
        self._padded_shapes = padded_shapes
        self._padding_values = padding_values
        # TensorFlow checks the arguments against the element spec when the dataset is made;
        # so do we where the spec is known without running the pipeline.
        spec = input_dataset._spec(probe=False)
        self._static_plan = None if spec is None else plan_padding(spec, padded_shapes, padding_values)

    def _learnt_spec(self, element: Nest) -> ElementSpec:
        """The spec the padding of a pass is planned from when the input's is not static: ``element``'s."""
        leaves, treespec = nest.flatten(element)
        specs = []
        for index, leaf in enumerate(leaves):
            array = refuse_unrepresentable(leaf, index)
            specs.append(TensorSpec(array.shape, array.dtype))
        return treespec.unflatten(specs)

    def _iterate(self, state: State) -> Iterator[Any]:
        # The position: the input's pass, and ``learnt``, the spec the padding was planned from
        # (the first element's, when the input's spec is not static; None until then).
        if not state.resumed:
            state.learnt = None
        source = state.input()
        plan = self._static_plan
        if plan is None and state.learnt is not None:
            plan = plan_padding(state.learnt, self._padded_shapes, self._padding_values, rank_only=True)
        try:
            raise_saved_error(state)
            while True:
                chunk, failure = read_chunk(source, self._size)
                if failure is not None and (self._drop or not chunk):
                    raise failure
                if not chunk or (self._drop and len(chunk) < self._size):
                    return
                try:
                    if plan is None:
                        state.learnt = self._learnt_spec(chunk[0])
                        plan = plan_padding(state.learnt, self._padded_shapes, self._padding_values, rank_only=True)
                    batch = pad_batch(chunk, plan[0], plan[1])
                except BaseException as error:
                    name_api(error, self._api)
                    raise
                if failure is not None:
                    # The elements read before the error come first, as a short batch (as in batch()).
                    state.error = save_error(failure)
                    yield batch
                    raise failure
                yield batch
        finally:
            source.close()

    def _spec(self, probe: bool) -> ElementSpec:
        static = self._inputs[0]._spec(probe=False)
        if static is not None:
            spec, rank_only = static, False
        else:
            spec, rank_only = self._inputs[0]._spec(probe), True  # learnt from one element: sizes vary
            if spec is None:
                return None
        with worded_at(self._api):
            plans, treespec = plan_padding(spec, self._padded_shapes, self._padding_values, rank_only=rank_only)
        specs, _ = nest.flatten(spec)
        return treespec.unflatten(padded_spec(plans, specs, self._size if self._drop else None))

    def _cardinality(self) -> int:
        return batched_cardinality(self._inputs[0]._cardinality(), self._size, self._drop)

    def _batch_size(self) -> int | None:
        return self._size
