"""The position of a pass over a pipeline: what an iterator saves and restores.

Every pass over a node is a :class:`Cursor`: the node's ``_iterate(state)`` generator and
its :class:`State`, the variables that generator keeps from one element to the next. A
node keeps everything that outlives an element as a *public attribute* of ``state`` (a
shuffle's buffer and random generator, a repeat's pass count, ...), and its inputs'
cursors as *children* of the state (``state.input()``, ``state.open(node, key)``). The
rule every node follows:

    **Whenever the generator yields, the state's attributes and children say exactly where
    the pass stands after that element**, so that a generator started afresh over the same
    state (``state.resumed`` true) yields the elements the suspended one would have
    yielded next.

A pass that has set nothing up yet (a generator not started) is saved as *fresh*. A node
whose new pass depends on something outside it (the next epoch number of a
``reshuffle_each_iteration`` shuffle, a seed drawn for this process) draws it when the pass
is created (``_iterate`` sets it up eagerly and returns a generator), so that a pass saved
before its first element restores to the same pass.

Saving is then generic: :meth:`Cursor.save` copies the state's public attributes and
saves each child, recursively, into a plain tree (``{"op", "params", "fields",
"inputs"}``) that :mod:`~towerdist._src.data.state_codec` turns into bytes. A node whose
position lives elsewhere (a C iterator, a background thread's buffer) overrides
``Node._save_state`` to put it into the state first.

Restoring builds the whole cursor tree at once, before a single element is produced: the
saved op names and parameters are checked against the pipeline node by node (a mismatch
raises :class:`PipelineMismatchError` naming the first operation that differs, from the
output), and every saved child is restored eagerly (``Node._restored_input`` tells which
node a saved child key belongs to: an input, or a dataset a user function made, such as an
open input of ``interleave``). So an iterator that fails to restore is left as it was.

Pipelines whose state lives outside them (``from_generator``, a foreign iterable) cannot
be saved: their nodes say so with ``Node._external_state`` and the save follows
``Options.experimental_external_state_policy``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from towerdist._src.errors import NotFoundError
from towerdist._src.failures import unworded
from towerdist._src.type_aliases import Nest

if TYPE_CHECKING:
    from towerdist._src.data.dataset import Dataset

__all__ = [
    "Cursor",
    "PipelineMismatchError",
    "Saved",
    "State",
    "check_pipeline",
    "copy_position",
    "pipeline_signature",
    "random_state",
    "restore_random_state",
]

Saved = dict[str, Any]  # a saved cursor: {"op": str, "params": {...}, "fields": {...}, "inputs": {key: Saved}}


class PipelineMismatchError(NotFoundError):
    """A saved iterator position does not fit the pipeline it is restored into.

    A ``NotFoundError``, as TensorFlow raises when a dataset definition changed between saving
    and restoring its iterator.

    Attributes:
      path: the operations from the iterator's output down to the one that differs.
    """

    def __init__(self, message: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.path = path


class State:
    """The variables one pass over a node keeps between elements (see the module docstring).

    ``resumed`` is True when the state was restored from a saved position: the node's
    generator then starts from its attributes instead of initialising them.
    """

    def __init__(
        self, node: Dataset, saved: Saved | None = None, path: tuple[str, ...] = (), may_continue: bool = False
    ) -> None:
        self._node = node
        self._may_continue = may_continue  # read by an iterator itself: may go on after an error (continuing)
        self._path = (*path, node._state_name())
        self._children: dict[str, Cursor] = {}
        self._resumed = saved is not None and not saved.get("fresh", False)
        if saved is None:
            return
        _check_fits(node, saved, self._path)
        for name, value in saved.get("fields", {}).items():
            setattr(self, name, value)
        try:
            for key, child in saved.get("inputs", {}).items():
                self._children[key] = Cursor(node._restored_input(key, self), child, self._path)
        except BaseException:
            self.close()
            raise

    if TYPE_CHECKING:
        # A pass keeps what it needs as attributes of its own choosing (see the module
        # docstring). Declared for type checkers only: at run time, attribute access stays
        # plain (no Python call per element).
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...

    @property
    def resumed(self) -> bool:
        return self._resumed

    @property
    def node(self) -> Dataset:
        return self._node

    # --- children --------------------------------------------------------------------------

    def input(self, index: int = 0) -> Cursor:
        """The cursor over input ``index`` (restored at its saved position the first time, if any)."""
        return self.open(self._node._inputs[index], str(index))

    def open(self, node: Dataset, key: str) -> Cursor:
        """The child cursor saved under ``key``: the restored one if the state was restored and it is
        not taken yet, else a new pass over ``node`` (replacing any earlier child under ``key``)."""
        child = self._children.get(key)
        if child is not None and child._pending:
            child._pending = False
            return child
        cursor = Cursor(node, path=self._path)
        self._children[key] = cursor
        return cursor

    def child(self, key: str) -> Cursor | None:
        """The child cursor under ``key``, if any."""
        return self._children.get(key)

    def children(self) -> list[Cursor]:
        """Every child cursor (the open passes over this node's inputs)."""
        return list(self._children.values())

    def drop(self, key: str) -> None:
        """Closes the child under ``key`` and forgets it (its pass is over: it is not saved any more)."""
        child = self._children.pop(key, None)
        if child is not None:
            child.close()

    def release(self, key: str) -> Cursor | None:
        """Forgets the child under ``key`` without closing it, and returns it.

        For a child a background thread is still running (blocked in user code when its pass
        is closed): closing it from another thread would fail ("generator already
        executing"), so the thread's owner leaves it to that thread, or to the garbage collector.
        """
        return self._children.pop(key, None)

    def close(self) -> None:
        """Closes every child cursor (and keeps it: a pass that ended still saves where its inputs stand)."""
        for child in list(self._children.values()):
            child.close()

    # --- saving ----------------------------------------------------------------------------

    def begun(self) -> bool:
        """True once the pass has set anything up (an attribute or a child)."""
        return bool(self._children) or any(not name.startswith("_") for name in vars(self))

    def fields(self) -> dict[str, Any]:
        """The public attributes, copied so that later elements do not change them."""
        return {name: copy_position(value) for name, value in vars(self).items() if not name.startswith("_")}

    def saved_inputs(self) -> dict[str, Saved]:
        return {key: child.save() for key, child in self._children.items()}


class Cursor:
    """One pass over a node: iterate it for the elements, ``save()`` it for its position.

    ``for element in cursor`` runs the node's generator itself (no extra call per element);
    ``next(cursor)`` works too.

    Args:
      node: the node to iterate.
      saved: a position from :meth:`save` (of a cursor over the same pipeline) to start at.
      path: the operations above this one, for the messages of a failed restore.
      may_continue: whether the reader (a dataset iterator) goes on after an error the
        node raises while holding elements (see ``continuing``).
    """

    __slots__ = ("_elements", "_pending", "node", "state")

    def __init__(
        self, node: Dataset, saved: Saved | None = None, path: tuple[str, ...] = (), may_continue: bool = False
    ) -> None:
        self.node = node
        self.state = State(node, saved, path, may_continue)
        self._pending = saved is not None  # restored, and not yet taken by its parent's generator
        self._elements: Iterator[Any] = node._iterate(self.state)

    def __iter__(self) -> Iterator[Any]:
        return self._elements

    def __next__(self) -> Nest:
        return next(self._elements)

    def save(self) -> Saved:
        """This pass's position: a tree of plain values, arrays and elements (see the module docstring)."""
        if not self.state.resumed and not self.state.begun():
            return _fresh(self.node)  # a generator not started yet: nothing is set up
        return self.node._save_state(self.state)

    def close(self) -> None:
        """Ends the pass early: closes the generator (running its ``finally``) and every child."""
        close = getattr(self._elements, "close", None)
        if close is not None:
            close()
        self.state.close()


def saved_state(node: Dataset, state: State) -> Saved:
    """The generic save of ``state`` (what ``Node._save_state`` does unless a node overrides it)."""
    saved: Saved = {"op": node._state_name(), "fields": state.fields(), "inputs": state.saved_inputs()}
    params = node._state_params()
    if params:
        saved["params"] = params
    return saved


def _fresh(node: Dataset) -> Saved:
    """The position of a pass that has not started."""
    saved: Saved = {"op": node._state_name(), "fresh": True}
    params = node._state_params()
    if params:
        saved["params"] = params
    return saved


def _check_fits(node: Dataset, saved: Saved, path: tuple[str, ...]) -> None:
    """Raises ``PipelineMismatchError`` if ``saved`` is not a position of ``node``."""
    op = saved.get("op")
    where = " <- ".join(path)
    if op != node._state_name():
        raise unworded(
            PipelineMismatchError(
                f"cannot restore the iterator: its pipeline differs from the saved one at {where}: the checkpoint "
                f"holds the position of a {op} there. Restore into an iterator of the same pipeline (the same "
                f"operations, in the same order) as the one saved.",
                path,
            )
        )
    params, expected = saved.get("params", {}), node._state_params()
    if params != expected:
        raise unworded(
            PipelineMismatchError(
                f"cannot restore the iterator: its pipeline differs from the saved one at {where}: the checkpoint "
                f"was saved with {_describe(params)}, this pipeline has {_describe(expected)}. Restore into a "
                f"pipeline built with the same arguments.{_hint(node)}",
                path,
            )
        )


def pipeline_signature(dataset: Dataset) -> list[list[Any]]:
    """The operations of ``dataset``'s pipeline, from the output (``[name, params]`` each), saved with an iterator."""
    return [[node._state_name(), node._state_params()] for node in dataset._walk()]


def check_pipeline(dataset: Dataset, saved: list[list[Any]]) -> None:
    """Raises ``PipelineMismatchError`` naming the first operation where ``dataset`` differs from ``saved``."""
    nodes = list(dataset._walk())
    for k, node in enumerate(nodes):
        if k >= len(saved):
            break
        name, params = saved[k]
        if name != node._state_name() or params != node._state_params():
            got = node._state_name() + (f"({_describe(node._state_params())})" if node._state_params() else "")
            had = name + (f"({_describe(params)})" if params else "")
            hint = _hint(node) if name == node._state_name() else ""
            path = " <- ".join(n._state_name() for n in nodes[: k + 1])
            raise unworded(
                PipelineMismatchError(
                    f"cannot restore the iterator: its pipeline differs from the saved one at operation {k + 1} "
                    f"from the output ({path}): the checkpoint was saved from {had} there, this pipeline has {got}. "
                    f"Restore into an iterator of the same pipeline (the same operations with the same arguments, "
                    f"in the same order) as the one saved.{hint}",
                    tuple(n._state_name() for n in nodes[: k + 1]),
                )
            )
    if len(nodes) != len(saved):
        raise unworded(
            PipelineMismatchError(
                f"cannot restore the iterator: its pipeline has {len(nodes)} operations, the saved one had "
                f"{len(saved)} ({' <- '.join(str(entry[0]) for entry in saved)}). Restore into an iterator of the "
                f"same pipeline as the one saved."
            )
        )


def random_state(dataset: Dataset) -> list[Any]:
    """Each operation's ``_random_state`` (seeds, epoch numbers), in pipeline order."""
    return [node._random_state() for node in dataset._walk()]


def restore_random_state(dataset: Dataset, saved: list[Any]) -> None:
    """Gives each operation of ``dataset`` the random state saved from its counterpart."""
    for node, state in zip(dataset._walk(), saved, strict=True):
        if state is not None:
            node._restore_random_state(state)


def _hint(node: Dataset) -> str:
    hint = node._state_params_hint()
    return f" ({hint})" if hint else ""


def _describe(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in params.items()) or "no such arguments"


def copy_position(value: object) -> object:
    """``value`` with its containers copied (arrays and elements are shared: they are never written).

    A numpy random ``Generator`` is copied too (its bit generator's state moves on).
    """
    if isinstance(value, list):
        return [copy_position(v) for v in value]
    if isinstance(value, collections.deque):
        return collections.deque(copy_position(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: copy_position(v) for k, v in value.items()}
    if isinstance(value, set):
        return set(value)
    if isinstance(value, np.random.Generator):
        copied = np.random.Generator(type(value.bit_generator)())
        copied.bit_generator.state = value.bit_generator.state
        return copied
    return value
