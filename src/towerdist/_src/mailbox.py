"""The messages replica threads receive in their mailboxes.

Every replica thread owns a mailbox (a ``queue.SimpleQueue``) and acts on tuples whose
first item is a :class:`Message`:

==========================  ================================================================
message                     meaning
==========================  ================================================================
``(RUN, step)``             run this replica's part of a ``strategy.run`` step
``(TASK, job, part)``       run part ``part`` of a parallel job (``parallel.py``)
``(RESUME, value)``         leave the barrier; ``value`` is this replica's part of the result
``(STOP,)``                 leave the barrier: the step failed elsewhere
``(SHUTDOWN,)``             exit the thread (its pool was collected or abandoned)
``(INTERRUPTED,)``          (replica 0's mailbox, read by the caller) a SIGINT arrived while the
                            caller waited at the barrier: run its handler now
==========================  ================================================================

A replica parked at a barrier accepts TASK messages too, so the thread running a
``merge_fn`` can spread a large reduction over the parked replicas.
"""

from __future__ import annotations

import enum

__all__ = ["INTERRUPTED", "Message", "RESUME", "RUN", "SHUTDOWN", "STOP", "TASK"]


class Message(enum.Enum):
    """The kinds of mailbox messages (the first item of every message tuple)."""

    RUN = "run"
    TASK = "task"
    RESUME = "resume"
    STOP = "stop"
    SHUTDOWN = "shutdown"
    INTERRUPTED = "interrupted"


# Module-level names: the hot paths compare with ``is`` against these.
RUN = Message.RUN
TASK = Message.TASK
RESUME = Message.RESUME
STOP = Message.STOP
SHUTDOWN = Message.SHUTDOWN
INTERRUPTED = Message.INTERRUPTED
