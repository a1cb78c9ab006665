"""Streaming metrics whose state lives in sync-on-read variables (``td.metrics``).

Created in ``strategy.scope()``, a metric's state variables are ``SyncOnReadVariable``\\ s
with SUM aggregation: inside ``strategy.run`` each replica accumulates into its own
copy with no communication; ``result()`` in cross-replica context reads the sum over
replicas, inside ``run`` each replica's own copies. Outside any strategy they are plain
variables. Semantics (dtypes, sample-weight broadcasting, shapes) follow Keras 3's metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from towerdist._src import aliases, backend, context
from towerdist._src.module import snake_case
from towerdist._src.type_aliases import ArrayModule, DTypeLike, TensorLike
from towerdist._src.variable_enums import VariableAggregation, VariableSynchronization
from towerdist._src.variables import creation
from towerdist._src.variables.variable import Variable

__all__ = ["Mean", "MeanMetricWrapper", "Metric", "Sum"]


class Metric:
    """Base class of metrics: state variables, ``update_state``, ``result``, ``reset_state``.

    Subclasses create their state with :meth:`add_variable` in ``__init__`` and implement
    ``update_state`` and ``result``. Create a metric where you create the model's
    variables (inside ``strategy.scope()`` for a distributed one).

    Contexts:
      ``update_state``: inside ``strategy.run`` (each replica updates its own copy) or in
      cross-replica context / with no strategy (the update counts once).
      ``result``: anywhere; inside ``strategy.run`` it is this replica's own value (its
      copies of the state), in cross-replica context the aggregate over replicas.
      ``reset_state``: outside ``strategy.run``.
    """

    def __init__(self, name: str | None = None, dtype: DTypeLike | None = None) -> None:
        self._name = name or snake_case(type(self).__name__)
        self._dtype = np.dtype(dtype if dtype is not None else np.float32)
        if self._dtype.kind != "f":
            raise ValueError(
                f"{type(self).__name__}: the metric dtype must be a floating dtype. Received: dtype={dtype!r}"
            )
        self._variables: dict[str, Variable] = {}

    @property
    def name(self) -> str:
        """The metric's name."""
        return self._name

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype of the state and of the result."""
        return self._dtype

    @property
    def variables(self) -> list[Variable]:
        """The state variables, in creation order."""
        return list(self._variables.values())

    def add_variable(self, name: str, shape: tuple[int, ...] = (), dtype: DTypeLike | None = None) -> Variable:
        """Creates a zero-initialised, SUM-aggregated sync-on-read state variable."""
        if name in self._variables:
            raise ValueError(f"{type(self).__name__} already has a state variable named {name!r}.")
        variable: Variable = creation.create_variable(
            np.zeros(shape, dtype=np.dtype(dtype) if dtype is not None else self._dtype),
            name=f"{self._name}/{name}",
            trainable=False,
            synchronization=VariableSynchronization.ON_READ,
            aggregation=VariableAggregation.SUM,
        )
        self._variables[name] = variable
        return variable

    def update_state(self, *args: TensorLike, **kwargs: TensorLike) -> None:
        """Accumulates statistics from a batch."""
        raise NotImplementedError

    def result(self) -> TensorLike:
        """The metric's value over every batch seen since the last reset.

        In cross-replica context (or with no strategy), aggregated over the replicas.
        Inside ``strategy.run``, this replica's own value, computed from its copies of the
        state with no communication, as in TensorFlow (``[4.0, 5.0]`` on two replicas that
        saw 4.0 and 5.0, where cross-replica code reads 4.5 for a ``Mean``).
        """
        return self._result()

    def _result(self) -> TensorLike:
        raise NotImplementedError

    def reset_state(self) -> None:
        """Sets every state variable back to zero (on every replica). Call it outside ``strategy.run``."""
        for variable in self._variables.values():
            variable.assign(np.zeros(variable.shape, variable.dtype), read_value=False)

    def __call__(self, *args: TensorLike, **kwargs: TensorLike) -> TensorLike:
        """``update_state(*args, **kwargs)``, then ``result()``."""
        self.update_state(*args, **kwargs)
        return self.result()

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments."""
        return {"name": self._name, "dtype": self._dtype.name}

    def _checkpoint_dependencies(self) -> list[tuple[str, Any]]:
        return list(self._variables.items())

    def _accumulate(self, variable: Variable, delta: TensorLike) -> None:
        """Adds ``delta`` to ``variable``'s copy for this replica (once in cross-replica context)."""
        strategy = variable.distribute_strategy
        replica_context = context.replica_context_in_run()
        if replica_context is not None and replica_context.strategy is strategy:
            variable.assign_add(delta, read_value=False)
        else:
            target = strategy.experimental_local_results(variable)[0]
            target.assign_add(delta, read_value=False)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self._name!r} dtype={self._dtype.name}>"


def reset_states(self: Metric) -> None:
    """Keras 2's name of :meth:`Metric.reset_state`, which it calls (a subclass's override included)."""
    self.reset_state()


aliases.install(
    Metric,
    [
        aliases.Alias(
            f"{aliases.METRIC}.reset_states",
            "Metric.reset_state()",
            reset_states,
            "2.5 (removed in 2.16 with Keras 3)",
            "method",
        )
    ],
)


class Sum(Metric):
    """The (weighted) sum of the values given: state ``total``.

    Example:
      >>> m = td.metrics.Sum()
      >>> m.update_state([1.0, 3.0, 5.0, 7.0])
      >>> m.result()
      array(16., dtype=float32)
    """

    def __init__(self, name: str = "sum", dtype: DTypeLike | None = None) -> None:
        super().__init__(name, dtype)
        self.total = self.add_variable("total")

    def update_state(self, values: TensorLike, sample_weight: TensorLike = None) -> None:
        xp, values = _as_array(values, self._dtype)
        values, _ = _samplewise(xp, values, sample_weight, self._dtype, xp.sum, self)
        self._accumulate(self.total, xp.sum(values))

    def _result(self) -> TensorLike:
        return _read(self.total)


class Mean(Metric):
    """The (weighted) mean of the values given: states ``total`` and ``count``.

    Values of rank > 1 are first averaged per sample (over all axes but the first), as
    in Keras; ``sample_weight`` weighs samples.

    Example:
      >>> m = td.metrics.Mean()
      >>> m.update_state([1.0, 3.0, 5.0, 7.0], sample_weight=[1, 1, 0, 0])
      >>> m.result()
      array(2., dtype=float32)
    """

    def __init__(self, name: str = "mean", dtype: DTypeLike | None = None) -> None:
        super().__init__(name, dtype)
        self.total = self.add_variable("total")
        self.count = self.add_variable("count")

    def update_state(self, values: TensorLike, sample_weight: TensorLike = None) -> None:
        xp, values = _as_array(values, self._dtype)
        values, weights = _samplewise(xp, values, sample_weight, self._dtype, xp.mean, self)
        self._accumulate(self.total, xp.sum(values))
        if weights is not None:
            count = xp.sum(weights)
        else:
            count = values.shape[0] if values.ndim >= 1 else 1
        self._accumulate(self.count, xp.asarray(count, dtype=self._dtype))

    def _result(self) -> TensorLike:
        total, count = _read(self.total), _read(self.count)
        impl = backend.for_array(total)
        with impl.on_array_device(total):  # on the metric's own GPU, whichever is current
            if float(count) == 0:
                return impl.xp.zeros((), dtype=self._dtype)
            return impl.xp.asarray(total / count, dtype=self._dtype)


class MeanMetricWrapper(Mean):
    """The mean of ``fn(y_true, y_pred)`` over samples (the base of accuracy and error metrics).

    Args:
      fn: computes one value per sample from ``y_true`` and ``y_pred`` arrays.
      name: the metric's name; defaults to ``"mean_metric_wrapper"``.
      dtype: a floating dtype for the state and the result; float32 by default.
      **kwargs: passed on to ``fn`` after ``y_true`` and ``y_pred``.
    """

    def __init__(
        self, fn: Callable[..., TensorLike], name: str | None = None, dtype: DTypeLike | None = None, **kwargs: object
    ) -> None:
        super().__init__(name or "mean_metric_wrapper", dtype)
        self._fn = fn
        self._fn_kwargs = kwargs

    def update_state(  # type: ignore[override]
        self, y_true: TensorLike, y_pred: TensorLike, sample_weight: TensorLike = None
    ) -> None:
        xp, y_pred = _as_array(y_pred, None)
        _, y_true = _as_array(y_true, None)
        if y_true.shape[:1] != y_pred.shape[:1]:
            raise ValueError(
                f"{type(self).__name__}.update_state(): y_true and y_pred must have the same number of samples. "
                f"Got y_true of shape {tuple(y_true.shape)} and y_pred of shape {tuple(y_pred.shape)}."
            )
        super().update_state(self._fn(y_true, y_pred, **self._fn_kwargs), sample_weight=sample_weight)


# --- helpers --------------------------------------------------------------------------------


def _as_array(value: TensorLike, dtype: DTypeLike | None) -> tuple[ArrayModule, TensorLike]:
    """``value`` as an array of ``dtype`` (None: keep) and its array module."""
    if isinstance(value, Variable):
        value = value.value()
    if not backend.is_array(value):
        value = np.asarray(value)
    xp = backend.for_array(value).xp
    if dtype is not None and value.dtype != dtype:
        value = value.astype(dtype)
    return xp, value


def _samplewise(
    xp: ArrayModule,
    values: TensorLike,
    sample_weight: TensorLike,
    dtype: np.dtype[Any],
    reduce: Callable[..., TensorLike],
    metric: Metric,
) -> tuple[TensorLike, TensorLike]:
    """Keras's ``reduce_to_samplewise_values``: weigh, then reduce each sample to one value."""
    weights = None
    if sample_weight is not None:
        _, weights = _as_array(sample_weight, dtype)
        weights = xp.asarray(weights)
        values, weights = _same_rank(values, weights)
        if values.ndim > weights.ndim:
            values = reduce(values, axis=tuple(range(weights.ndim, values.ndim)))
        try:
            weights = xp.broadcast_to(weights, values.shape)
        except ValueError:
            raise ValueError(
                f"{type(metric).__name__}({metric.name!r}).update_state(): sample_weight of shape "
                f"{tuple(weights.shape)} cannot be broadcast to the values' shape "
                f"{tuple(values.shape)}; pass one weight per sample."
            ) from None
        values = values * weights
        if weights.ndim > 1:
            weights = reduce(weights, axis=tuple(range(1, weights.ndim)))
    if values.ndim > 1:
        values = reduce(values, axis=tuple(range(1, values.ndim)))
    return values, weights


def _same_rank(x1: TensorLike, x2: TensorLike) -> tuple[TensorLike, TensorLike]:
    """Keras's ``squeeze_or_expand_to_same_rank``: fix ranks that differ by a trailing 1."""
    if x1.ndim == x2.ndim + 1 and x1.shape[-1] == 1:
        if x2.ndim == 1:
            x2 = x2[..., None]
        else:
            x1 = x1.reshape(x1.shape[:-1])
    if x2.ndim == x1.ndim + 1 and x2.shape[-1] == 1:
        if x1.ndim == 1:
            x1 = x1[..., None]
        else:
            x2 = x2.reshape(x2.shape[:-1])
    return x1, x2


def _read(variable: Variable) -> TensorLike:
    """The variable's value here: the sum over replicas in cross-replica context, the local copy in a replica."""
    return variable.value()
