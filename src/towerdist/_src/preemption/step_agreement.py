"""``StepAgreement``: the workers agree on the step at which they all save, at no cost per step.

A worker that is told it will be stopped *proposes* a step (the number of ``run()`` calls
after which every worker saves). Under ``MultiWorkerMirroredStrategy`` the proposal rides
in the header of the workers' next collective (``Communicator.notice``), so every worker
learns it at the same collective and no message is added to a step. A training step always
has one (the gradients' all-reduce, the distributed iterator's end-of-data check); a step
with none makes ``latest()`` run one small handshake at the next check instead, and every
worker sees the same collectives, so all of them decide alike. With one worker a proposal is
agreed at once.
"""

from __future__ import annotations

from towerdist._src.multi_worker.workers import Workers

__all__ = ["StepAgreement"]

_API = "PreemptionCheckpointHandler (is a worker being preempted?)"


class StepAgreement:
    """The latest step the workers agreed to save at (0: none yet), proposed by any of them.

    Args:
      workers: the multi-worker strategy's workers, or None for one worker.
    """

    def __init__(self, workers: Workers | None) -> None:
        self._workers = workers if workers is not None and workers.communicator is not None else None
        self._communicator = None if self._workers is None else self._workers.communicator
        self._local = 0
        self._seen = 0
        if self._communicator is not None:
            # The communicator outlives handlers: a step an earlier handler agreed on must not
            # reach this one. Every worker creates its handler at the same point of its program
            # (the constructor is collective), so every one forgets at the same collective.
            self._communicator.notice = self._communicator.agreed_notice = 0
            self._seen = self._communicator.seq

    @property
    def multi_worker(self) -> bool:
        """Whether proposals travel to other workers."""
        return self._communicator is not None

    def propose(self, step: int) -> None:
        """Announces ``step`` to every worker (with the next collective); a later proposal must be larger."""
        communicator = self._communicator
        if communicator is None:
            self._local = max(self._local, step)
        else:
            communicator.notice = max(communicator.notice, step)

    def latest(self) -> int:
        """The largest step any worker has proposed, as every worker knows it at this point.

        Called at the same point of the program on every worker (the start of
        ``PreemptionCheckpointHandler.run``): when no collective ran since the previous
        call, it runs a handshake, so a proposal is never stuck on one worker.
        """
        communicator, workers = self._communicator, self._workers
        if communicator is None or workers is None:
            return self._local
        if communicator.seq == self._seen:
            workers.agree_extra(_API, 0, None)
        return communicator.agreed_notice

    def checked(self) -> None:
        """Marks the end of a check: ``latest()`` handshakes next time only if no collective runs until then."""
        if self._communicator is not None:
            self._seen = self._communicator.seq
