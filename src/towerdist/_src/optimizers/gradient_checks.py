"""The checks ``apply_gradients`` makes on its (gradient, variable) pairs before any update.

Every check runs before the first variable changes, so a bad step changes nothing. The
common case (numpy gradients of the variables' shape and dtype, the variables of the
previous step) is checked inline by the optimizer and never reaches the slow paths here.

Errors whose message reads on after the public method's name are raised
:func:`~towerdist._src.failures.unworded` and worded by ``apply_gradients`` (or
``build``/``get_slot``). The others name the API in a form the mechanism cannot put in
front with a colon (``"SGD.apply_gradients(): the gradient of v ..."``: ``separator=": "``)
or in mid-sentence (the :data:`~towerdist._src.failures.API` slot). No check takes the
API's name: :func:`check_pairs` hands back the variables without a gradient, and the
optimizer warns about them under its own name.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from towerdist._src import backend
from towerdist._src.errors import InvalidArgumentError
from towerdist._src.failures import API, unworded
from towerdist._src.indexed_slices import IndexedSlices, check_indices
from towerdist._src.type_aliases import Array, TensorLike
from towerdist._src.values.distributed_values import DistributedValues, PerReplica
from towerdist._src.variables.variable import Variable, VariableRef

__all__ = [
    "check_gradient",
    "check_pairs",
    "check_sparse_gradient",
    "columns_of",
    "gradient_columns",
    "to_sum",
    "variable_ref",
    "warn_skipped",
    "where_from",
]

# ``to_sum``'s answer when no gradient is summed (compared by identity).
NOTHING_TO_SUM: list[bool] = []


def check_pairs(grads_and_vars: Iterable[tuple[Any, Variable]]) -> tuple[list[tuple[Any, Variable]], list[str]]:
    """The pairs with a gradient, as a list, and the names of the variables without one (to warn about).

    Raises (all :func:`unworded`):
      TypeError: not an iterable of pairs, or an entry's variable is not a ``td.Variable``.
      ValueError: an entry is not a pair, a variable is listed twice, no gradient at all.
    """
    try:
        pairs = [tuple(pair) for pair in grads_and_vars]
    except TypeError:
        raise unworded(
            TypeError(
                f"takes an iterable of (gradient, variable) pairs, e.g. zip(grads, model.trainable_variables). "
                f"Got {grads_and_vars!r}."
            )
        ) from None
    kept: list[tuple[Any, Variable]] = []
    skipped: list[str] = []
    seen: set[int] = set()
    for k, pair in enumerate(pairs):
        if len(pair) != 2:
            raise unworded(
                ValueError(f"entry {k} of grads_and_vars is not a (gradient, variable) pair. Got {pair!r}."),
                separator=": ",
            )
        grad, var = pair
        if not isinstance(var, Variable):
            variable_ref(var, index=k)  # raises the TypeError naming the entry
        if id(var) in seen:
            raise unworded(
                ValueError(
                    f"variable {var.name} appears more than once in grads_and_vars; sum its gradients and pass it once."
                ),
                separator=": ",
            )
        seen.add(id(var))
        if grad is None:
            skipped.append(var.name)
        elif type(grad) is np.ndarray:  # the common case
            kept.append((grad, var))
        else:
            kept.append((_as_gradient(grad, var), var))
    if not kept:
        names = ", ".join(skipped) or "(no variables)"
        raise unworded(
            ValueError(f"No gradients provided for any variable: {names}. {API} needs at least one gradient.")
        )
    return kept, skipped


def warn_skipped(skipped: list[str], api: str, stacklevel: int) -> None:
    """Warns that the variables ``skipped`` (without a gradient) are left unchanged by ``api``.

    A warning is shown when it is issued, so it cannot be worded on the way out: the public
    method passes its name.
    """
    warnings.warn(
        f"Gradients do not exist for variables {skipped} when calling {api}; they are left unchanged.",
        UserWarning,
        stacklevel=stacklevel + 1,
    )


def _as_gradient(grad: TensorLike, var: Variable) -> TensorLike:
    """``grad`` as an array (or distributed value): lists and numbers become one array, so
    that ``merge_call`` treats them as one value per replica, not as nested structures."""
    if isinstance(grad, (Variable, DistributedValues, IndexedSlices)) or backend.is_array(grad):
        return grad
    array = np.asarray(grad)
    if array.dtype.kind not in "biufc":
        raise unworded(
            TypeError(
                f"the gradient of {var.name} must be an array of numbers. Got {grad!r} of type {type(grad).__name__}."
            ),
            separator=": ",
        )
    return array


def variable_ref(var: object, index: int | None = None) -> VariableRef:
    """``var.ref()``; raises an unworded TypeError if ``var`` is not a variable (naming entry ``index``)."""
    if not isinstance(var, Variable):
        where = f" at entry {index}" if index is not None else ""
        raise unworded(
            TypeError(
                f"needs td.Variable objects{where}; got {var!r} of type {type(var).__name__}. Create "
                f"model parameters with td.Variable(...)."
            )
        )
    return var.ref()


def columns_of(grad: TensorLike) -> list[TensorLike]:
    """A gradient given in cross-replica context as a column: a ``PerReplica``'s components,
    else the one value (it stands for every replica)."""
    if isinstance(grad, PerReplica):
        return list(grad.values)
    return [grad]


def gradient_columns(per_replica: list[list[tuple[Any, Variable]]]) -> list[list[Any]]:
    """Each variable's gradients from every replica, after checking the replicas agree on the variables.

    Raises:
      ValueError: (unworded) the replicas passed different variables.
    """
    first = per_replica[0]
    if len(per_replica) == 1:
        return [[grad] for grad, _ in first]
    for replica, pairs in enumerate(per_replica[1:], start=1):
        same = len(pairs) == len(first)
        if same:
            for (_, var), (_, var0) in zip(pairs, first):
                if var is not var0:
                    same = False
                    break
        if not same:
            mine = ", ".join(var.name for _, var in first)
            theirs = ", ".join(var.name for _, var in pairs)
            raise unworded(
                ValueError(
                    f"was called by the replicas with different variables: replica 0 passed [{mine}] and replica "
                    f"{replica} passed [{theirs}]. Every replica must apply gradients to the same variables, in the "
                    f"same order."
                )
            )
    return [list(column) for column in zip(*[[grad for grad, _ in pairs] for pairs in per_replica])]


def to_sum(
    columns: list[list[Any]],
    variables: list[Variable],
    from_replicas: bool,
    workers: int,
    given: list[list[Any]] | None = None,
) -> list[bool]:
    """Which gradients are given per replica and must be summed (checked before any update).

    With several workers (MultiWorkerMirroredStrategy) every gradient is summed across them.
    ``given``: the objects the replicas passed, where ``columns`` holds copies of some.

    Raises:
      ValueError: (unworded) in replica context, one gradient object stands for every replica.
    """
    replicas = len(columns[0]) if columns else 1
    if replicas == 1:  # several workers: a replica's own gradient; in cross-replica context, applied as given
        return [True] * len(columns) if workers > 1 and from_replicas else NOTHING_TO_SUM
    summed = [False] * len(columns)
    objects = columns if given is None else given
    for k, column in enumerate(objects):
        if len(column) > 1:
            if from_replicas:
                first = column[0]
                for grad in column:
                    if grad is not first:
                        break
                else:
                    raise unworded(
                        ValueError(
                            f"the gradient of {variables[k].name} is the same object in all {replicas} replicas, "
                            f"so summing it across replicas would count it {replicas} times. Compute gradients per "
                            f"replica, or pass experimental_aggregate_gradients=False if they are already summed."
                        ),
                        separator=": ",
                    )
            summed[k] = True
    return [True] * len(columns) if workers > 1 else summed


_CONVERTS: dict[tuple[np.dtype[Any], np.dtype[Any]], bool] = {}


def check_gradient(column: list[Any], var: Variable, current: Array, from_replicas: bool) -> None:
    """Checks each replica's gradient of ``var``: the variable's shape, a dtype that converts.

    Its errors are :func:`unworded` (``separator=": "``): ``apply_gradients`` names itself.

    A gradient converts when numpy's ``same_kind`` rule allows it (an int or float64
    gradient of a float32 variable); a complex gradient of a real variable (its imaginary
    part would be dropped) and non-numeric (object, string) gradients are refused.
    """
    var_shape = current.shape  # the variable's current value (``current``) says its shape and dtype
    var_dtype = current.dtype
    for part in column:  # the common case: arrays of the variable's shape and dtype
        if type(part) is not np.ndarray or part.shape != var_shape or part.dtype != var_dtype:
            break
    else:
        return
    for replica, part in enumerate(column):
        if isinstance(part, Variable):
            part = part.value()
        shape = part.shape if type(part) is np.ndarray else tuple(np.shape(part))
        if shape != var_shape:
            where = where_from(replica, from_replicas, len(column))
            raise unworded(
                ValueError(
                    f"the gradient of {var.name}{where} has shape {tuple(shape)}, but the variable has shape "
                    f"{tuple(var_shape)}. Pass a gradient of the variable's shape."
                ),
                separator=": ",
            )
        dtype = (
            part.dtype if type(part) is np.ndarray else np.dtype(getattr(part, "dtype", None) or np.asarray(part).dtype)
        )
        _check_dtype(dtype, var, var_dtype, where_from(replica, from_replicas, len(column)))


def where_from(replica: int, from_replicas: bool, replicas: int) -> str:
    """`` from replica 1`` when the gradients came from several replicas, else nothing (for messages)."""
    return f" from replica {replica}" if from_replicas or replicas > 1 else ""


def _check_dtype(dtype: np.dtype[Any], var: Variable, var_dtype: np.dtype[Any], where: str) -> None:
    """Raises if a gradient of ``dtype`` does not convert to the variable's dtype (numpy's ``same_kind``)."""
    key = (dtype, var_dtype)
    converts = _CONVERTS.get(key)
    if converts is None:
        converts = _CONVERTS[key] = dtype.kind in "biufc" and bool(np.can_cast(dtype, var_dtype, "same_kind"))
    if converts:
        return
    if dtype.kind == "c":
        why = "its imaginary part would be dropped; pass grad.real if that is what you mean"
    elif dtype.kind not in "biuf":
        why = "it is not an array of numbers; compute the gradient as a numeric array"
    else:
        why = f"it does not convert without losing information; cast it with td.cast(grad, {var_dtype.name})"
    raise unworded(
        InvalidArgumentError(
            f"the gradient of {var.name}{where} has dtype {dtype}, but the variable has dtype {var_dtype}: {why}."
        ),
        separator=": ",
    )


def check_sparse_gradient(part: IndexedSlices, var: Variable, current: Array, where: str) -> None:
    """Checks one replica's ``IndexedSlices`` gradient of ``var`` (``current`` is its value).

    The dense shape (when known) must be the variable's, every slice one of its rows, every
    index one of its rows' numbers, and the values' dtype must convert to the variable's.
    ``where`` says whose gradient it is in messages (`` from replica 1`` or nothing). Its
    errors are :func:`unworded` (``separator=": "``) ``InvalidArgumentError``s, as TensorFlow
    raises for these gradients.
    """
    var_shape = tuple(current.shape)
    if not var_shape:
        raise unworded(
            InvalidArgumentError(
                f"the gradient of {var.name}{where} is an IndexedSlices, but the variable is a scalar (shape ()), "
                f"which has no rows to slice. Pass a dense gradient."
            ),
            separator=": ",
        )
    if part.dense_shape is not None and tuple(int(d) for d in part.dense_shape) != var_shape:
        raise unworded(
            InvalidArgumentError(
                f"the gradient of {var.name}{where} is an IndexedSlices of dense_shape "
                f"{tuple(int(d) for d in part.dense_shape)}, but the variable has shape {var_shape}. Pass slices of "
                f"the variable: IndexedSlices(values, indices, dense_shape={list(var_shape)})."
            ),
            separator=": ",
        )
    rows = tuple(part.values.shape[part.indices.ndim :])
    if rows != var_shape[1:]:
        raise unworded(
            InvalidArgumentError(
                f"the gradient of {var.name}{where} is an IndexedSlices whose slices have shape {rows} (values of "
                f"shape {tuple(part.values.shape)}), but the rows of the variable, of shape {var_shape}, have shape "
                f"{var_shape[1:]}. Pass one row of the variable per index."
            ),
            separator=": ",
        )
    _check_dtype(np.dtype(part.dtype), var, current.dtype, where)
    try:
        check_indices(part.indices, var_shape, f"the gradient of {var.name}{where} (an IndexedSlices)")
    except InvalidArgumentError as error:
        raise unworded(error, separator=": ") from None
