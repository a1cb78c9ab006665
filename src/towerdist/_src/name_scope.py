"""``td.name_scope``: a prefix for the names of the variables created within it (``tf.name_scope``).

The scope is a string ending in ``"/"`` (``""`` at the top), kept per thread, as
TensorFlow keeps it. Replica functions of strategies that run replicas on threads of their
own (``MirroredStrategy`` and its kin) start at the top, as TensorFlow's replica threads
do, even the replica that runs on the caller's thread here; a scope entered inside the
replica function applies there. Single-device strategies call the function in the
caller's scope. TensorFlow 2's rules, which eager code sees:

* ``name_scope("main")`` inside scope ``S`` makes the scope ``S + "main/"``;
* a name ending in ``"/"`` is the whole new scope (``name_scope("main/")`` is ``"main/"``
  wherever it is entered), and ``name_scope("")`` goes back to the top;
* names are used as given: entering ``"main"`` twice gives ``"main/"`` twice (TF 1.x graph
  mode made the second ``"main_1/"``), and no characters are refused.

A variable named ``n`` created in scope ``S`` is named ``S + n`` (``S + "Variable"`` when no
name is given), except that a name ending in ``"/"`` is used without it and without the
scope, and the empty name stays empty; see :func:`variable_name`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from towerdist._src import context

if TYPE_CHECKING:
    from towerdist._src.strategies.replica_context import ReplicaContext

__all__ = ["current", "name_scope", "name_scope_v1", "variable_name"]


class _Scopes(threading.local):
    def __init__(self) -> None:
        # (scope, owner): owner is the replica context of a threaded strategy's run the
        # scope was entered in, else None.
        self.stack: list[tuple[str, Any]] = []


_scopes = _Scopes()


def _owner() -> ReplicaContext | None:
    """The replica context whose scopes apply here: a threaded strategy's, else None."""
    replica_context = context.replica_context_in_run()
    if replica_context is None or getattr(replica_context.strategy.extended, "_scheduler", None) is None:
        return None  # outside run, or a strategy that calls the function on the caller's thread
    return replica_context


def current() -> str:
    """The current thread's scope: ``""`` at the top, else a string ending in ``"/"``."""
    stack = _scopes.stack
    if not stack:
        return ""
    top: str = stack[-1][0]
    if stack[-1][1] is None and context.replica_context_in_run() is None:
        return top  # the common case, outside strategy.run
    here = _owner()
    for scope, owner in reversed(stack):
        if owner is here:
            return str(scope)
    return ""


def variable_name(name: str | None) -> str:
    """The name of a variable created here with ``name`` (None: TensorFlow's default, ``"Variable"``)."""
    if name is None:
        return current() + "Variable"
    if not name:
        return name
    if name.endswith("/"):
        return name[:-1]
    return current() + name


def _enter(scope: str) -> int:
    stack = _scopes.stack
    stack.append((scope, _owner()))
    return len(stack)


def _exit(depth: int) -> None:
    # Drop exactly what the matching enter pushed, even if the block left the stack unbalanced.
    del _scopes.stack[depth - 1 :]


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise ValueError(
            f"name for name_scope must be a string. Got name={name!r} of type {type(name).__name__}; "
            f"pass a string such as 'main' (or '' for the top scope)."
        )


class name_scope:  # noqa: N801  (TensorFlow's public name)
    """A context manager prefixing the names of variables created within it (``tf.name_scope``).

    ``with td.name_scope("main") as scope:`` makes ``scope`` the new scope, ``"main/"``
    inside no other scope. Nested scopes join: ``"main/foo/"``. A name ending in ``"/"``
    is the whole new scope, and ``""`` the top one. The scope is per thread.

    Args:
      name: the scope's name, a string.

    Raises:
      ValueError: ``name`` is not a string.

    Example:
      >>> with td.name_scope("main"):
      ...     a = td.Variable(1.0, name="a")
      ...     with td.name_scope("foo"):
      ...         c = td.Variable(1.0, name="c")
      >>> a.name, c.name
      ('main/a:0', 'main/foo/c:0')
    """

    def __init__(self, name: str) -> None:
        _check_name(name)
        self._name = name
        self._depths: list[int] = []  # one per entry: the object may be entered again while open

    @property
    def name(self) -> str:
        """The name given (not the scope it makes, which ``with ... as scope`` gives)."""
        return self._name

    def __enter__(self) -> str:
        name = self._name
        if not name or name.endswith("/"):
            scope = name
        else:
            scope = current() + name + "/"
        self._depths.append(_enter(scope))
        return scope

    def __exit__(self, *exc_info: object) -> None:
        _exit(self._depths.pop())

    def __repr__(self) -> str:
        return f"name_scope({self._name!r})"


class name_scope_v1:  # noqa: N801  (TensorFlow's public name)
    """TF 1.x's ``tf.compat.v1.name_scope(name, default_name=None, values=None)``.

    As :class:`name_scope`, with ``default_name`` used when ``name`` is None (both None:
    the top scope). ``values`` (graph-mode inputs) is accepted and ignored. Eager names are
    not made unique, as in TensorFlow's eager mode.

    Raises:
      ValueError: ``name`` (or, when it is None, ``default_name``) is not a string or None.
    """

    def __init__(self, name: str | None, default_name: str | None = None, values: object = None) -> None:
        del values  # graph-mode inputs to colocate the scope with
        chosen = default_name if name is None else name
        if chosen is not None:
            _check_name(chosen)
        self._name = chosen
        self._scope = name_scope("" if chosen is None else chosen)

    @property
    def name(self) -> str | None:
        """The name given (``default_name`` when ``name`` is None)."""
        return self._name

    def __enter__(self) -> str:
        return self._scope.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self._scope.__exit__(*exc_info)

    def __repr__(self) -> str:
        return f"name_scope_v1({self._name!r})"
