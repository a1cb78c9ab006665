"""Old ``tf.distribute.Strategy`` members (TF 2.0-2.3 names and TF 1.x leftovers).

Each function here is the implementation of one old name, listed in :data:`STRATEGY_OLD_NAMES`
(or :data:`EXTENDED_OLD_NAMES`), which ``strategy.py`` installs on :class:`Strategy` through
the alias registry (``towerdist._src.aliases``) with a one-time ``DeprecationWarning``. They
take the strategy as ``self`` and forward to the modern API, so subclasses' overrides apply.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from towerdist._src import aliases, context
from towerdist._src.data.dataset import Dataset
from towerdist._src.input.input_context import InputContext, InputOptions, InputReplicationMode
from towerdist._src.input.legacy_iterators import input_iterator
from towerdist._src.options import RunOptions
from towerdist._src.type_aliases import Nest

if TYPE_CHECKING:  # strategy.py installs these names: it imports this module
    from towerdist._src.strategies.strategy import Strategy
    from towerdist._src.strategies.strategy_extended import StrategyExtended

__all__ = [
    "EXTENDED_OLD_NAMES",
    "STRATEGY_OLD_NAMES",
    "colocate_vars_with",
    "configure",
    "experimental_distribute_datasets_from_function",
    "experimental_make_numpy_dataset",
    "experimental_run",
    "experimental_run_v2",
    "make_dataset_iterator",
    "make_input_fn_iterator",
    "unwrap",
    "update_config_proto",
]

T = TypeVar("T")


def experimental_run_v2(
    self: Strategy,
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    options: RunOptions | None = None,
) -> Nest:
    """TensorFlow 2.0/2.1's name of ``Strategy.run`` (same arguments, same result)."""
    return self.run(fn, args, kwargs, options)


def experimental_distribute_datasets_from_function(
    self: Strategy, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None = None
) -> Any:
    """TensorFlow 2.0-2.3's name of ``Strategy.distribute_datasets_from_function``."""
    return self.distribute_datasets_from_function(dataset_fn, options)


def experimental_make_numpy_dataset(
    self: Strategy | StrategyExtended, numpy_input: Nest, session: object = None
) -> Dataset:
    """A ``td.data.Dataset`` of the rows of ``numpy_input`` (a nest of arrays); ``session`` is ignored.

    The same as ``td.data.Dataset.from_tensor_slices(numpy_input)``; distribute it with
    ``experimental_distribute_dataset`` after ``batch``.
    """
    del self, session
    return Dataset.from_tensor_slices(numpy_input)


def unwrap(self: Strategy, value: object) -> tuple[Any, ...]:
    """TensorFlow's deprecated name of ``Strategy.experimental_local_results`` (returns a tuple)."""
    result: tuple[Any, ...] = self.experimental_local_results(value)
    return result


def colocate_vars_with(self: Strategy, colocate_with_variable: object) -> AbstractContextManager[None]:
    """``Strategy.extended.colocate_vars_with``: a scope creating variables on ``colocate_with_variable``'s devices."""
    return self.extended.colocate_vars_with(colocate_with_variable)


def configure(
    self: Strategy,
    session_config: object = None,
    cluster_spec: object = None,
    task_type: object = None,
    task_id: object = None,
) -> None:
    """Accepts TF 1.x session configuration and changes nothing (towerdist has no sessions).

    Raises:
      ValueError: ``cluster_spec``, ``task_type`` or ``task_id`` is given. towerdist does not
        configure clusters this way; multi-worker training runs one process per worker
        under MPI (DESIGN section 9).
    """
    del session_config
    given = {k: v for k, v in (("cluster_spec", cluster_spec), ("task_type", task_type), ("task_id", task_id)) if v}
    if given:
        raise ValueError(
            f"{self!r}.configure() got {', '.join(f'{k}={v!r}' for k, v in given.items())}: towerdist does not "
            f"configure clusters through configure(). Multi-worker training runs one process per worker "
            f"under MPI; call configure() with session_config only, or not at all."
        )


def update_config_proto(self: Strategy, config_proto: T) -> T:
    """Returns a copy of ``config_proto``: towerdist has no session options to add."""
    del self
    return copy.deepcopy(config_proto)


def make_dataset_iterator(self: Strategy, dataset: Iterable[Nest]) -> Any:
    """An iterator over ``experimental_distribute_dataset(dataset)`` (TF 1.x style input).

    Besides ``get_next()``, it has ``initialize()`` (and ``initializer``), which restart it
    from the first element and return ``None``, as in TensorFlow 2's eager mode.
    """
    return input_iterator(self.experimental_distribute_dataset(dataset))


def make_input_fn_iterator(
    self: Strategy,
    input_fn: Callable[[InputContext], Any],
    replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER,
) -> Any:
    """An iterator over ``distribute_datasets_from_function(input_fn)`` (TF 1.x style input).

    Besides ``get_next()``, it has ``initialize()`` (and ``initializer``), which restart it
    from the first element and return ``None``, as in TensorFlow 2's eager mode. Call it in
    cross-replica context or outside any scope, as in TensorFlow.

    Raises:
      ValueError: ``replication_mode`` is not ``InputReplicationMode.PER_WORKER``.
      ContextError: called inside a replica function, or under another strategy's scope.
    """
    if replication_mode is not InputReplicationMode.PER_WORKER:
        raise ValueError(
            f"Input replication mode not supported: {replication_mode!r}. make_input_fn_iterator() only "
            f"supports InputReplicationMode.PER_WORKER."
        )
    context.require_cross_replica_or_default(self, "Strategy.make_input_fn_iterator()")
    return input_iterator(self.distribute_datasets_from_function(input_fn))


def experimental_run(self: Strategy, fn: Callable[..., Any], input_iterator: Iterator[Nest] | None = None) -> Nest:
    """Runs ``fn`` once per replica on the next element of ``input_iterator`` (or with no arguments).

    ``input_iterator`` comes from ``make_dataset_iterator``/``make_input_fn_iterator`` or
    ``iter()`` of a distributed dataset.
    """
    args: tuple[Any, ...] = ()
    if input_iterator is not None:
        get_next = getattr(input_iterator, "get_next", None)
        args = (get_next() if get_next is not None else next(input_iterator),)
    return self.run(fn, args=args)


def _member(fn: Callable[..., Any], new: str, since: str, owner: str = aliases.STRATEGY) -> aliases.Alias:
    return aliases.Alias(f"{owner}.{fn.__name__}", new, fn, since, "method")


# The TF 2.0-2.3 names and TF 1.x leftovers on tf.distribute.Strategy.
STRATEGY_OLD_NAMES = (
    _member(experimental_run_v2, "Strategy.run()", "2.2"),
    _member(experimental_distribute_datasets_from_function, "Strategy.distribute_datasets_from_function()", "2.4"),
    _member(experimental_make_numpy_dataset, "td.data.Dataset.from_tensor_slices()", "2.2"),
    _member(unwrap, "Strategy.experimental_local_results()", "2.0"),
    _member(colocate_vars_with, "Strategy.extended.colocate_vars_with()", "2.0"),
    _member(configure, "Strategy.update_config_proto()", "2.0"),
    _member(update_config_proto, "nothing (towerdist has no sessions)", "2.0"),
    _member(make_dataset_iterator, "iter(Strategy.experimental_distribute_dataset(dataset))", "2.0"),
    _member(make_input_fn_iterator, "iter(Strategy.distribute_datasets_from_function(dataset_fn))", "2.0"),
    _member(experimental_run, "Strategy.run(fn, args=(next(iterator),))", "2.0"),
)

# TF 2.2's StrategyExtended.experimental_make_numpy_dataset.
EXTENDED_OLD_NAMES = (
    _member(experimental_make_numpy_dataset, "td.data.Dataset.from_tensor_slices()", "2.2", aliases.EXTENDED),
)
