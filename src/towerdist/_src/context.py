"""The context model, and every "called in the wrong context" error.

A thread is always in exactly one of these contexts:

* **default replica context** — no strategy scope is active. ``get_replica_context()``
  returns the default strategy's replica context (``replica_id_in_sync_group == 0``).
* **cross-replica context** — inside ``strategy.scope()`` or a ``merge_fn``.
  ``get_replica_context()`` is None and ``in_cross_replica_context()`` is True.
* **replica context** — inside the function given to ``strategy.run``.
  ``get_replica_context()`` returns that replica's ``ReplicaContext``.

An **update context** (inside ``StrategyExtended.update``) is entered from cross-replica
context and additionally names the device being updated (``get_update_device()``).

The guards at the end of this module are the only place that words a wrong-context
error, so every API reports it the same way: what was called, where it was called from,
and what to do instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from towerdist._src import device as device_lib
from towerdist._src import thread_state
from towerdist._src.errors import ContextError
from towerdist._src.thread_state import Mode, UpdateEntry

if TYPE_CHECKING:
    # Only for the return types of the public queries (``get_strategy() -> Strategy``), so
    # that a user's type checker knows what they get, and for the replica context a check is
    # given; nothing here runs, and every strategy this module takes in is a ``StrategyLike``.
    from towerdist._src.device import DeviceSpec
    from towerdist._src.strategies.replica_context import ReplicaContext
    from towerdist._src.strategies.strategy import Strategy

__all__ = [
    "StrategyLike",
    "experimental_set_strategy",
    "get_cross_replica_context",
    "get_replica_context",
    "get_strategy",
    "get_update_device",
    "has_strategy",
    "in_cross_replica_context",
]



class ExtendedLike(Protocol):
    """What this module reads of a strategy's ``extended``: the device its scope makes current."""

    @property
    def _default_device(self) -> DeviceSpec | None: ...


class StrategyLike(Protocol):
    """What this module needs of a strategy (it sits below ``strategies/`` and imports none of it).

    Scopes and guards compare strategies by identity, print them with ``repr`` and read the
    default device of their ``extended``; ``Strategy`` and its subclasses match.
    """

    @property
    def extended(self) -> ExtendedLike: ...


_S = TypeVar("_S", bound=StrategyLike)

_state = thread_state.state
_default_strategy_factory: Callable[[], Strategy] | None = None


def register_default_strategy(factory: Callable[[], Strategy]) -> None:
    """Called once by the default strategy's module (it depends on this one)."""
    global _default_strategy_factory
    _default_strategy_factory = factory


def default_strategy() -> Strategy:
    if _default_strategy_factory is None:  # only if towerdist's own import order is broken
        raise ContextError("The default strategy is not registered: import towerdist before using it.")
    return _default_strategy_factory()


# --- queries ------------------------------------------------------------------------------


def get_replica_context() -> ReplicaContext | None:
    """The current ``ReplicaContext``, or None in cross-replica context.

    Outside any strategy scope this is the default strategy's replica context, whose
    ``replica_id_in_sync_group`` is 0 and ``num_replicas_in_sync`` is 1.
    """
    modes = _state.modes
    if modes:
        current: ReplicaContext | None = modes[-1].replica_context
        return current
    return default_replica_context()


def default_replica_context() -> ReplicaContext:
    """The replica context outside any strategy scope (the default strategy's)."""
    extended: Any = default_strategy().extended  # a DefaultExtended, defined in a module importing this one
    replica_context: ReplicaContext = extended._default_replica_context
    return replica_context


def get_cross_replica_context() -> Strategy | None:
    """The current strategy in cross-replica context, else None.

    Exactly one of ``get_replica_context()`` and ``get_cross_replica_context()`` is None.
    """
    modes = _state.modes
    strategy: Strategy | None = modes[-1].cross_replica if modes else None
    return strategy


def in_cross_replica_context() -> bool:
    """True inside ``strategy.scope()`` or a ``merge_fn``; False in any replica context."""
    modes = _state.modes
    return bool(modes) and modes[-1].cross_replica is not None


def get_strategy() -> Strategy:
    """The current strategy: that of the innermost scope or replica, else the default strategy."""
    modes = _state.modes
    strategy: Strategy = modes[-1].strategy if modes else default_strategy()
    return strategy


def has_strategy() -> bool:
    """True if a strategy other than the default one is current."""
    modes = _state.modes
    return bool(modes) and modes[-1].strategy is not default_strategy()


def get_update_device() -> str | None:
    """The canonical name of the device being updated inside ``extended.update``, else None."""
    updates = _state.updates
    if not updates or updates[-1].device is None:
        return None
    return updates[-1].device.name


def replica_context_in_run() -> ReplicaContext | None:
    """The ``ReplicaContext`` of the ``strategy.run`` replica function this thread is in, else None.

    This is the one answer to "am I inside ``strategy.run``?": it is the replica's context
    inside the function ``run`` calls (of any strategy, the default strategy's ``run``
    included), and None in cross-replica context, in a ``merge_fn`` and outside any scope
    (where ``get_replica_context()`` returns the default replica context instead).
    """
    modes = _state.modes
    return modes[-1].replica_context if modes else None


def current_replica_id() -> int | None:
    """The replica id of this thread: its replica context's, else its update context's."""
    modes = _state.modes
    if modes and modes[-1].replica_context is not None:
        return int(modes[-1].replica_context._replica_id)
    updates = _state.updates
    if updates:
        return updates[-1].replica_id
    return None


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Makes ``strategy`` current in this thread, as if ``strategy.scope()`` were entered.

    Calling it again replaces the previous one; ``None`` clears it.

    Raises:
      ContextError: called inside a ``strategy.scope()`` block.
    """
    previous = _state.global_scope
    if previous is not None:
        _state.global_scope = None
        previous.__exit__(None, None, None)
    if has_strategy():
        raise ContextError(
            f"experimental_set_strategy() must not be called inside a strategy scope, but "
            f"{describe_location()}; exit the `with strategy.scope():` block first.",
            api="experimental_set_strategy()",
        )
    if strategy is not None:
        scope = strategy.scope()
        scope.__enter__()
        _state.global_scope = scope


# --- scopes -------------------------------------------------------------------------------


class StrategyScope(Generic[_S]):
    """The context manager returned by ``Strategy.scope()``; ``with`` binds the strategy.

    Entering it makes the strategy current and enters cross-replica context. Entering the
    scope of the strategy that is already current only counts the re-entry. A scope is
    exited on the thread that entered it (each thread has its own context stack).
    """

    def __init__(self, strategy: _S) -> None:
        self._strategy = strategy
        # Per entering thread: the stack depths to restore on exit (None for a re-entry).
        self._entries: dict[int, list[tuple[int, int, Any] | None]] = {}

    def __enter__(self) -> _S:
        strategy = self._strategy
        entries = self._entries.setdefault(threading.get_ident(), [])
        if has_strategy():
            require_cross_replica_or_default(strategy, "Strategy.scope()")
            entries.append(None)
            return strategy
        depths = (len(_state.modes), len(_state.devices))
        _state.modes.append(Mode(strategy, strategy, None))
        default_device = strategy.extended._default_device
        gpu = device_lib.activate(default_device)  # OneDeviceStrategy("GPU:1"): its GPU is current
        if default_device is not None:
            _state.devices.append(default_device)
        gpu.__enter__()
        entries.append((*depths, gpu))
        return strategy

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        thread = threading.get_ident()
        entries = self._entries.get(thread)
        if not entries:
            raise _exit_on_other_thread(self._strategy, self._entries)
        depths = entries.pop()
        if not entries:
            del self._entries[thread]
        if depths is not None:
            del _state.modes[depths[0] :]
            del _state.devices[depths[1] :]
            depths[2].__exit__(None, None, None)


class DefaultStrategyScope(Generic[_S]):
    """``scope()`` of the default strategy: checks nesting, changes no other state.

    It counts its entries on the thread, so that a strategy scope entered inside it can
    refuse to create variables (TensorFlow's "mixing different strategies").
    """

    def __init__(self, strategy: _S) -> None:
        self._strategy = strategy
        self._entries: dict[int, int] = {}

    def __enter__(self) -> _S:
        if has_strategy():
            raise ContextError(
                f"Must not nest strategy scopes: the default strategy's scope() was entered "
                f"while {describe_location()}; exit that scope first.",
                api="Strategy.scope()",
            )
        thread = threading.get_ident()
        self._entries[thread] = self._entries.get(thread, 0) + 1
        _state.default_scopes += 1
        return self._strategy

    def __exit__(self, *exc_info: object) -> None:
        thread = threading.get_ident()
        count = self._entries.get(thread, 0)
        if not count:
            raise _exit_on_other_thread(self._strategy, self._entries)
        if count == 1:
            del self._entries[thread]
        else:
            self._entries[thread] = count - 1
        _state.default_scopes -= 1


def _exit_on_other_thread(strategy: StrategyLike, entries: dict[int, Any]) -> ContextError:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    entered = ", ".join(repr(names.get(ident, f"thread {ident}")) for ident in entries) or "no thread"
    return ContextError(
        f"{strategy!r}.scope() was exited on thread {threading.current_thread().name!r}, which did not enter "
        f"it (entered on: {entered}). Each thread has its own strategy context: exit a scope on the thread "
        f"that entered it, e.g. with a `with strategy.scope():` block in that thread.",
        api="Strategy.scope()",
    )


def require_no_mixed_scopes(api: str) -> None:
    """Raises if the current strategy's scope was entered inside the default strategy's scope.

    TensorFlow allows entering it, but refuses to create variables there: the default
    strategy's variable creator would receive a variable of another strategy.
    """
    if _state.default_scopes and has_strategy():
        raise ContextError(
            f"Mixing different strategies: {api} was {describe_location()}, whose scope was entered inside "
            f"the default strategy's scope() ({default_strategy()!r}). Exit the default strategy's scope "
            f"first, or create the variable outside {get_strategy()!r}.scope().",
            api=api,
        )


class UpdateContext:
    """The update context of one component inside ``extended.update`` (names its device)."""

    def __init__(self, device: DeviceSpec | None, replica_id: int | None) -> None:
        self._entry = UpdateEntry(device, replica_id)
        self._depths: list[tuple[int, int, Any]] = []

    def __enter__(self) -> None:
        gpu = device_lib.activate(self._entry.device)  # the component's GPU is cupy's current device
        gpu.__enter__()
        self._depths.append((len(_state.updates), len(_state.devices), gpu))
        _state.updates.append(self._entry)
        _state.devices.append(self._entry.device)

    def __exit__(self, *exc_info: object) -> None:
        updates_depth, devices_depth, gpu = self._depths.pop()
        del _state.updates[updates_depth:]
        del _state.devices[devices_depth:]
        gpu.__exit__(None, None, None)


def cross_replica_mode(strategy: StrategyLike) -> Mode:
    """The mode entry of cross-replica context for ``strategy`` (used around ``merge_fn``)."""
    return Mode(strategy, strategy, None)


# --- guards: the only place that words wrong-context errors --------------------------------


def describe_location() -> str:
    """Where this thread is, in words, e.g. "called from replica 1 (on /cpu:1) of ..."."""
    modes = _state.modes
    if not modes:
        return "called outside any strategy scope"
    top = modes[-1]
    if top.replica_context is not None:
        ctx = top.replica_context
        where = f" (on {ctx._device.short_name})" if getattr(ctx, "_device", None) is not None else ""
        return f"called from replica {int(ctx._replica_id)}{where} of {top.strategy!r}"
    return f"called in cross-replica context of {top.strategy!r}"


def require_cross_replica_or_default(strategy: StrategyLike, api: str, fix: str | None = None) -> None:
    """Passes in cross-replica context of ``strategy`` or outside any scope; raises otherwise."""
    modes = _state.modes
    if not modes:
        return
    top = modes[-1]
    if top.cross_replica is strategy:
        return
    if top.strategy is not strategy:
        raise wrong_strategy_scope(strategy, api)
    raise ContextError(
        f"{api} must be called in cross-replica context, but was "
        f"{describe_location()}; "
        + (fix or "call it outside strategy.run(), or from a function passed to get_replica_context().merge_call()")
        + ".",
        api=api,
    )


def require_strategy_scope(strategy: StrategyLike, api: str) -> None:
    """Passes if ``strategy`` is the current strategy (any context); raises otherwise."""
    if get_strategy() is not strategy:
        raise wrong_strategy_scope(strategy, api)


def wrong_strategy_scope(strategy: StrategyLike, api: str) -> ContextError:
    """The error for using ``strategy`` while another strategy (or none) is current."""
    if not has_strategy():
        return ContextError(
            f'{api} needs to be inside "with strategy.scope()" for {strategy!r}, but was called '
            f"outside any strategy scope; enter it first: `with strategy.scope(): ...`.",
            api=api,
        )
    current = get_strategy()
    return ContextError(
        f"Mixing different strategies: {api} belongs to {strategy!r}, but the current strategy "
        f"is another object, {current!r} ({describe_location()}); use one strategy's scope at a "
        f"time.",
        api=api,
    )


def require_replica_context(replica_context: ReplicaContext, api: str) -> None:
    """Passes if ``replica_context`` is this thread's current replica context."""
    current = get_replica_context()
    if current is replica_context:
        return
    if current is None:
        raise ContextError(
            f"{api} must be called in a replica context (inside the function passed to "
            f"strategy.run()), but was {describe_location()}; call it from the replica function.",
            api=api,
        )
    if current._strategy is replica_context._strategy:
        raise ContextError(
            f"Mismatching ReplicaContext: {api} was called on the context of replica "
            f"{int(replica_context._replica_id)} of a strategy.run() call that is over or belongs to "
            f"another replica (it was {describe_location()}); call td.distribute.get_replica_context() "
            f"where you use it instead of keeping it.",
            api=api,
        )
    raise ContextError(
        f"Mismatching strategies: {api} was called on a replica context of "
        f"{replica_context._strategy!r}, but the current strategy is {current._strategy!r}; "
        f"call td.distribute.get_replica_context() where you use it instead of keeping it.",
        api=api,
    )


def require_outside_run(api: str, fix: str) -> None:
    """Passes unless called inside a ``strategy.run`` replica function (of any strategy).

    Raises:
      ContextError: called from a replica function; ``fix`` says what to do instead.
    """
    if replica_context_in_run() is not None:
        raise ContextError(
            f"{api} must be called outside strategy.run(), but was {describe_location()}; {fix}.",
            api=api,
        )


def require_outside_replica_fn(strategy: StrategyLike, api: str) -> None:
    """Passes outside ``strategy.run``'s replica functions (and under no other strategy).

    Raises:
      ContextError: another strategy is current.
      ValueError: called inside a replica function of ``strategy`` (TensorFlow's type).
    """
    modes = _state.modes
    if not modes:
        return
    top = modes[-1]
    if top.strategy is not strategy and top.strategy is not default_strategy():
        raise wrong_strategy_scope(strategy, api)
    if top.replica_context is not None and top.strategy is strategy:
        raise ValueError(
            f"next(iterator) should be called from outside of replica_fn. e.g. strategy.run(replica_fn, "
            f"args=(next(iterator),)). {api} was {describe_location()}; take the next element before "
            f"strategy.run() and pass it in."
        )
