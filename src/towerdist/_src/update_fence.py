"""The fence a replica's reads wait at while an update it handed over is applied by another replica.

Inside ``strategy.run``, a replica that reaches ``apply_gradients`` before the others need
not wait there: it hands its gradients over (a private copy of them) and goes on with its
function, and the last replica to arrive sums every replica's gradients and updates the
variables (``strategies/replica_step.py``, "Handing over"). Until that update is done the
variables are half old, half new, so the replica that went on raises its *fence* around the
variables the update writes: its next read or write of one of them (and its next collective)
first waits for the update. Other variables (metrics updated after ``apply_gradients``) and a
replica function that reads nothing after it (``return loss``) never wait.

The fence belongs to the thread that raised it; :func:`wait` is the one check on the read
path (``ResourceVariable.value()`` and the writes), and costs one module attribute read
while no fence is up anywhere in the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

__all__ = ["lower", "raise_fence", "up", "wait"]

# How many threads have a fence up (changed under ``_lock``). Read without the lock by the
# read path: the thread that raised a fence always sees its own increment.
up = 0
_lock = threading.Lock()
_local = threading.local()


def raise_fence(await_update: Callable[[], None], fenced: Collection[int]) -> None:
    """Raises this thread's fence: its next access to a variable in ``fenced`` first calls ``await_update``.

    ``fenced`` holds the ``id`` of every single-device variable the update writes;
    ``await_update`` blocks until the update handed over is applied (or raises to stop the
    replica when the step failed). One fence per thread: a second replaces the first.
    """
    global up
    if getattr(_local, "await_update", None) is None:
        with _lock:
            up += 1
    _local.await_update = await_update
    _local.fenced = fenced


def lower() -> None:
    """Lowers this thread's fence without waiting (the replica function is over)."""
    global up
    if getattr(_local, "await_update", None) is not None:
        _local.await_update = None
        _local.fenced = ()
        with _lock:
            up -= 1


def wait(variable: object = None) -> None:
    """Waits for the update this thread handed over if its fence is up (around ``variable``, if given).

    Call it before reading or writing a single-device variable, or with no variable before
    anything that may see the update (the optimizer's own state, a collective). Callers check
    ``up`` first: the common case, no fence anywhere, costs nothing more.
    """
    await_update = getattr(_local, "await_update", None)
    if await_update is not None and (variable is None or id(variable) in _local.fenced):
        lower()
        await_update()
