"""Objects a checkpoint saves as one opaque state: input iterators, and anything that follows the protocol.

A variable is saved as its value. Some objects have no value of that kind but a state
only they can interpret: a ``td.data`` iterator's position in its pipeline, a
distributed iterator's position on every worker. Such an object is a :class:`Saveable`:
``td.train.Checkpoint`` keys it like a variable, stores its bytes as one ``uint8`` array
(an index entry of kind ``"object"`` naming its class) and, on restore, hands the bytes
back to the object it finds under the same key.

Restoring is two-phase, so that a restore stays all or nothing across several objects:
``_checkpoint_restorer(state)`` checks that ``state`` fits the object and prepares
everything (raising with nothing changed if it does not fit), and returns a function that
commits the prepared state and cannot fail. A checkpoint prepares every object before it
assigns the first variable, and commits them after the last.

``_checkpoint_collective`` is True for an object whose saving needs every worker of a
``MultiWorkerMirroredStrategy`` (a distributed iterator: its ``_checkpoint_state()`` is a
collective that returns, on every worker, the same bytes holding every worker's state).
A checkpoint then calls ``_checkpoint_state()`` on every worker in the order of the
objects' keys, and restores such objects through the collective path (the chief reads
the files and sends their content to every worker), so that each worker gets the same
bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Saveable", "is_saveable"]


@runtime_checkable
class Saveable(Protocol):
    """An object a checkpoint saves as one opaque state (see the module docstring)."""

    _checkpoint_collective: bool

    def _checkpoint_state(self) -> bytes:
        """The object's state now, as bytes (a collective when ``_checkpoint_collective``)."""
        ...

    def _checkpoint_restorer(self, state: bytes) -> Callable[[], None]:
        """Checks and prepares restoring ``state``; the returned function commits it.

        Raises (changing nothing) if ``state`` does not fit this object.
        """
        ...


def is_saveable(value: object) -> bool:
    """True for an instance (not a class) that follows the :class:`Saveable` protocol."""
    return not isinstance(value, type) and isinstance(value, Saveable)
