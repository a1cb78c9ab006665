"""``PreemptionCheckpointHandler``: save at one agreed step on every worker when the job is told to stop.

What happens (TensorFlow 2.21's protocol, facts in ``reference/preemption.md``; the
agreement rides on MPI instead of TensorFlow's coordination service):

1. The handler is created on every worker (in the main thread). It adds a
   ``checkpointed_runs`` variable to the user's checkpoint, restores the latest checkpoint
   of ``checkpoint_dir`` on every worker, and resumes its run counter from it. From then on
   ``SIGTERM`` (or ``TerminationConfig.termination_watcher_fn``) only sets a flag.
2. At the start of the next ``run()`` on a signalled worker, it proposes to save after step
   ``S = runs begun when the signal came + 1`` (``step_agreement``); every worker learns S
   during that step, since every step has a collective.
3. At the start of ``run()`` number S + 1, every worker sets ``checkpointed_runs = S``, saves
   (the chief writes; ``save_fn`` if given), and calls ``exit_fn`` (default ``sys.exit(42)``).
   Later signals are ignored. With a grace period the workers train on after that save, and
   the signalled worker proposes a final step once the grace period is about to end.
4. A restarted job constructs the handler again, which restores the checkpoint:
   ``total_run_calls`` is S and the first ``run()`` trains step S + 1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import numpy as np

from towerdist._src import steps
from towerdist._src.checkpoint.checkpoint import Checkpoint
from towerdist._src.checkpoint.manager import CheckpointManager
from towerdist._src.errors import InternalError, InvalidArgumentError, UnimplementedError
from towerdist._src.multi_worker import workers as workers_lib
from towerdist._src.preemption.step_agreement import StepAgreement
from towerdist._src.preemption.termination_config import TerminationConfig
from towerdist._src.variables import creation
from towerdist._src.variables.variable import Variable

if TYPE_CHECKING:  # named in annotations only
    from towerdist._src.cluster_resolver.cluster_resolver import ClusterResolver

__all__ = ["PreemptionCheckpointHandler"]

logger = logging.getLogger("towerdist")

_R = TypeVar("_R")  # what the training step returns (run passes it back)

_RUNS_VARIABLE = "checkpointed_runs"
_EXIT_STATUS = 42  # TensorFlow's restart code off Google Cloud
_POLL_SECONDS = 1.0  # how often termination_watcher_fn is asked (TensorFlow's period)
_GRACE_MARGIN_STEPS = 6  # the final save starts this many mean step times before the grace period ends


class _CheckpointDirMissing(InvalidArgumentError, TypeError):
    """A Checkpoint was given without ``checkpoint_dir`` (TensorFlow raises TypeError here)."""


def _exit() -> NoReturn:
    sys.exit(_EXIT_STATUS)


class PreemptionCheckpointHandler:
    """Saves a checkpoint at the same step on every worker when a worker is told to stop, then exits.

    Create it on every worker, in the main thread, after the strategy and the objects to
    save; then call each training step through :meth:`run` (or call
    :meth:`save_checkpoint_if_preempted` once per step). On ``SIGTERM`` (what Slurm and
    Kubernetes send before ``SIGKILL``), every worker saves after the same step and
    ``run()`` raises ``SystemExit(42)``. Started again, the job resumes from that checkpoint:
    the handler restores it when it is created, and ``total_run_calls`` says where.

    Args:
      cluster_resolver: the strategy's ``cluster_resolver`` (``None`` for one process).
        Under ``MultiWorkerMirroredStrategy`` the workers are the MPI job's ranks: the
        handler agrees with them even if ``None`` is passed.
      checkpoint_or_checkpoint_manager: a ``td.train.Checkpoint`` (the handler keeps one
        checkpoint in ``checkpoint_dir``) or a ``td.train.CheckpointManager`` (used as it is).
      checkpoint_dir: where to save and restore; required with a ``Checkpoint``.
      termination_config: a ``TerminationConfig`` (signal, exit, grace period, save function).

    Raises:
      InvalidArgumentError: a ``Checkpoint`` without ``checkpoint_dir`` (also a ``TypeError``,
        as TensorFlow's error is), or a cluster of other workers than the MPI job's.
      ValueError: created outside the main thread without a ``termination_watcher_fn``
        (signal handlers run in the main thread only).
      TypeError: an argument of the wrong type.
      UnimplementedError: a cluster with parameter servers (``"ps"``).

    Example:
      >>> with strategy.scope():
      ...     model, optimizer = make_model(), td.optimizers.SGD(0.1)
      ...     checkpoint = td.train.Checkpoint(model=model, optimizer=optimizer)
      ...     handler = td.distribute.experimental.PreemptionCheckpointHandler(
      ...         strategy.cluster_resolver, checkpoint, "/shared/ckpt")
      >>> while handler.total_run_calls < steps:
      ...     loss = handler.run(train_step, next(iterator))
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None,
        checkpoint_or_checkpoint_manager: Checkpoint | CheckpointManager,
        checkpoint_dir: str | None = None,
        termination_config: TerminationConfig | None = None,
    ) -> None:
        config = _checked_config(termination_config)
        self._watcher_fn = config.termination_watcher_fn
        self._exit_fn: Callable[[], Any] = config.exit_fn if config.exit_fn is not None else _exit
        self._grace_period = float(config.grace_period or 0)
        self._save_fn = config.save_fn
        if self._watcher_fn is None and threading.current_thread() is not threading.main_thread():
            raise ValueError(
                f"PreemptionCheckpointHandler must be created in the main thread (it was created in "
                f"{threading.current_thread().name!r}): it installs a SIGTERM handler, and Python runs signal "
                f"handlers in the main thread only. Create it there, or pass "
                f"TerminationConfig(termination_watcher_fn=...) to be told of a preemption by a function instead."
            )
        steps.track()  # input iterators keep what they hand out for a step, for this handler's saves
        self._manager = _manager(checkpoint_or_checkpoint_manager, checkpoint_dir)
        self._workers, self._id = _workers(cluster_resolver)
        self._agreement = StepAgreement(self._workers)
        self._checkpointed_runs = _runs_variable(self._manager.checkpoint)
        self._manager.restore_or_initialize()  # on every worker, from the chief's view of the directory
        self._runs = int(self._checkpointed_runs.numpy())
        self._mean_run_seconds = 0.0
        self._timed_runs = 0
        self._last_call: float | None = None  # save_checkpoint_if_preempted: when it was last called
        self._signal_time: float | None = None  # set by the signal handler (only that)
        self._signals = 0
        self._reported_signals = 0
        self._proposals = 0  # steps this worker proposed to save at (it leads once it has)
        self._acted_on = 0  # the agreed step this worker last saved at
        self._counting_down = False  # grace period: saved once, training on until the final save
        self._final_deadline = 0.0  # grace period: when the leader proposes the final save
        self._finished = False
        self._warned_total_run_calls = False
        self._stop_watching = threading.Event()
        if self._watcher_fn is None:
            _install_sigterm_handler(weakref.ref(self))
        else:
            self._start_watcher_thread(self._watcher_fn)
        logger.info(
            "PreemptionCheckpointHandler initialized%s: %d run() calls so far.",
            " and restored" if self._manager.latest_checkpoint else "",
            self._runs,
        )

    # --- the API ---------------------------------------------------------------------------------

    @property
    def total_run_calls(self) -> int:
        """The number of :meth:`run` calls, including those before a restart (deprecated in TensorFlow)."""
        if not self._warned_total_run_calls:
            self._warned_total_run_calls = True
            logger.warning(
                "PreemptionCheckpointHandler.total_run_calls is deprecated in TensorFlow 2.21 (track your own "
                "step counter in the checkpoint instead); towerdist keeps it."
            )
        return self._runs

    def run(self, distributed_train_function: Callable[..., _R], *args: object, **kwargs: object) -> _R:
        """Runs one training step, first saving and exiting if the workers agreed to stop at this step.

        Call it on every worker, with a function that trains exactly one step (it calls
        ``strategy.run``). Returns what the function returns.

        Raises:
          SystemExit: the default ``exit_fn``, with status 42, once the checkpoint is saved.
        """
        self._check((), {})
        begin = time.monotonic()
        result = distributed_train_function(*args, **kwargs)
        self._count_run(time.monotonic() - begin)
        return result

    def save_checkpoint_if_preempted(self, *args: object, **kwargs: object) -> None:
        """Saves and exits if the workers agreed to stop here; else counts one step. Call once per step.

        The alternative to :meth:`run` for loops that train outside it. ``args`` and
        ``kwargs`` go to ``CheckpointManager.save`` (or to ``save_fn``).
        """
        self._check(args, kwargs)
        now = time.monotonic()
        self._count_run(0.0 if self._last_call is None else now - self._last_call)
        self._last_call = now

    @contextlib.contextmanager
    def watch_preemption_scope(self) -> Iterator[None]:
        """A scope for TPU training in TensorFlow; here it only runs its body (errors pass through).

        Under ``MultiWorkerMirroredStrategy`` an error on one worker already stops every worker.
        """
        yield

    # --- the protocol ----------------------------------------------------------------------------

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """At the start of a step, on every worker: save and exit at the agreed step, or propose one."""
        if self._finished:
            return
        agreed = self._agreement.latest()
        if agreed > self._acted_on:
            if self._runs > agreed:
                raise InternalError(
                    f"PreemptionCheckpointHandler on worker {self._id}: the workers agreed to save after run() call "
                    f"{agreed}, but this worker has made {self._runs} calls already. Call run() (or "
                    f"save_checkpoint_if_preempted()) once per step on every worker, from the same step count."
                )
            if self._runs == agreed:
                self._save(args, kwargs)  # if it raises, the next call saves again (as TensorFlow)
                self._acted_on = agreed
                if self._grace_period <= 0 or self._counting_down:
                    self._exit()
                    return
                logger.info("Continue training for the grace period.")
                self._counting_down = True
        self._maybe_propose(agreed)
        self._agreement.checked()

    def _maybe_propose(self, agreed: int) -> None:
        """Proposes the step to save at: first after a notice, then (grace period) near its end."""
        if self._signal_time is None:
            return
        if self._signals != self._reported_signals:
            self._report_signals(agreed)
        if self._proposals == 0:
            if agreed > 0:
                return  # another worker was told first: it leads
            logger.info("Termination caught in main thread on preempted worker.")
            # As TensorFlow: the final save starts 6 mean step times before the grace period ends.
            margin = _GRACE_MARGIN_STEPS * self._mean_run_seconds
            self._final_deadline = self._signal_time + self._grace_period - margin
        elif self._proposals > 1 or not self._counting_down or time.monotonic() < self._final_deadline:
            return  # proposed already, or the grace period goes on
        else:
            logger.info("Grace period almost ended. Final call to save a checkpoint!")
        self._proposals += 1
        step = self._runs + 1
        self._agreement.propose(step)
        logger.info("PreemptionCheckpointHandler: every worker saves after run() call %d.", step)

    def _report_signals(self, agreed: int) -> None:
        first = self._reported_signals == 0
        self._reported_signals = self._signals
        if first and agreed == 0:
            logger.info("Member %s has received termination notice.", self._id)
        else:
            logger.info(
                "Member %s has received termination notice again, or after another worker did; it is ignored: "
                "a step to save at is already proposed or agreed.",
                self._id,
            )

    def _save(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        logger.info("PreemptionCheckpointHandler: Starting saving a checkpoint.")
        self._checkpointed_runs.assign(self._runs, read_value=False)
        # The batches drawn for the step this save comes before (TensorFlow's loop draws them
        # before run() decides to save) are saved as not used: a restored job trains them.
        with steps.preemption_save():
            if self._save_fn is not None:
                self._save_fn(*args, **kwargs)
            else:
                self._manager.save(*args, **kwargs)
        logger.info("Checkpoint finished at path %s", self._manager.directory)

    def _exit(self) -> None:
        self._finished = True
        self._stop_watching.set()
        logger.info("PreemptionCheckpointHandler: checkpoint saved. Exiting.")
        self._exit_fn()

    def _count_run(self, seconds: float) -> None:
        self._runs += 1
        self._timed_runs += 1
        self._mean_run_seconds += (seconds - self._mean_run_seconds) / self._timed_runs

    # --- being told --------------------------------------------------------------------------------

    def _notice(self) -> None:
        """This worker will be stopped. Runs in a signal handler or the watcher thread: it only records."""
        if self._signal_time is None:
            self._signal_time = time.monotonic()
        self._signals += 1

    def _start_watcher_thread(self, watcher_fn: Callable[[], bool]) -> None:
        me = weakref.ref(self)
        stop = self._stop_watching

        def watch() -> None:
            while not stop.wait(_POLL_SECONDS):
                try:
                    told = watcher_fn()
                except Exception:  # a failing watcher must not end training; it is logged each time
                    logger.exception("PreemptionCheckpointHandler: termination_watcher_fn raised; asking again.")
                    continue
                handler = me()
                if handler is None:
                    return
                if told:
                    handler._notice()
                    return
                del handler

        name = f"WorkerTerminationSignalWatcher-{self._id}"
        threading.Thread(target=watch, name=name, daemon=True).start()

    def __repr__(self) -> str:
        return (
            f"PreemptionCheckpointHandler(checkpoint_dir={self._manager.directory!r}, worker={self._id}, "
            f"total_run_calls={self._runs})"
        )


# --- construction ------------------------------------------------------------------------------------


def _checked_config(config: TerminationConfig | None) -> TerminationConfig:
    if config is None:
        return TerminationConfig()
    if not isinstance(config, TerminationConfig):
        raise TypeError(
            f"PreemptionCheckpointHandler: termination_config must be a "
            f"td.distribute.experimental.TerminationConfig or None, got {config!r}."
        )
    for name in ("termination_watcher_fn", "exit_fn", "save_fn"):
        fn = getattr(config, name)
        if fn is not None and not callable(fn):
            raise TypeError(f"TerminationConfig.{name} must be callable or None, got {fn!r}.")
    grace = config.grace_period
    if grace is not None and (
        isinstance(grace, bool) or not isinstance(grace, (int, float, np.integer, np.floating)) or not grace >= 0
    ):
        raise ValueError(f"TerminationConfig.grace_period must be a number of seconds >= 0 or None, got {grace!r}.")
    return config


def _manager(target: object, checkpoint_dir: str | None) -> CheckpointManager:
    if isinstance(target, CheckpointManager):
        return target
    if not isinstance(target, Checkpoint):
        raise TypeError(
            f"PreemptionCheckpointHandler needs a td.train.Checkpoint or td.train.CheckpointManager as "
            f"checkpoint_or_checkpoint_manager, got {target!r}."
        )
    if checkpoint_dir is None:
        raise _CheckpointDirMissing(
            "PreemptionCheckpointHandler: with a td.train.Checkpoint, checkpoint_dir must be passed as well (the "
            "directory it saves to and restores from); or pass a td.train.CheckpointManager instead."
        )
    return CheckpointManager(target, checkpoint_dir, max_to_keep=1)


def _workers(cluster_resolver: object) -> tuple[workers_lib.Workers | None, str]:
    """The workers to agree with (None: this process alone) and this worker's id for messages."""
    jobs: dict[str, Any] = {}
    if cluster_resolver is not None:
        spec = getattr(cluster_resolver, "cluster_spec", None)
        if not callable(spec):
            raise TypeError(
                f"PreemptionCheckpointHandler: cluster_resolver must be a cluster resolver (the strategy's "
                f"cluster_resolver) or None, got {cluster_resolver!r}."
            )
        jobs = dict(spec().as_dict())
    if "ps" in jobs:
        raise UnimplementedError(
            "PreemptionCheckpointHandler does not support clusters with parameter servers ('ps' tasks); towerdist "
            "has no ParameterServerStrategy."
        )
    workers = workers_lib.current()
    listed = sum(len(jobs.get(job, ())) for job in ("chief", "worker"))
    if workers is None:
        if listed > 1:
            raise InvalidArgumentError(
                f"PreemptionCheckpointHandler: the cluster resolver lists {listed} workers, but this process has no "
                f"MultiWorkerMirroredStrategy over several MPI ranks to agree with. Create the strategy first (on "
                f"every worker, under mpiexec), then the handler."
            )
        return None, "single_worker"
    if listed not in (0, workers.size):
        raise InvalidArgumentError(
            f"PreemptionCheckpointHandler: the cluster resolver lists {listed} workers, but the MPI job has "
            f"{workers.size} ranks; pass the strategy's cluster_resolver."
        )
    return workers, str(workers.rank)


def _runs_variable(checkpoint: Checkpoint) -> Variable:
    """The checkpoint's ``checkpointed_runs`` variable, added to it unless it has one (TensorFlow's name)."""
    existing = checkpoint._tracked(_RUNS_VARIABLE)
    if existing is not None:
        if not isinstance(existing, Variable) or np.dtype(existing.dtype).kind not in "iu" or existing.shape != ():
            raise TypeError(
                f"PreemptionCheckpointHandler stores the number of run() calls in the checkpoint as "
                f"{_RUNS_VARIABLE!r}, but the checkpoint already holds {existing!r} under that name; rename it."
            )
        return existing
    variable = creation.host_counter(_RUNS_VARIABLE)  # the same on every worker: no strategy needed
    checkpoint._track(_RUNS_VARIABLE, variable)
    return variable


# --- SIGTERM --------------------------------------------------------------------------------------------


def _install_sigterm_handler(handler: weakref.ReferenceType[PreemptionCheckpointHandler]) -> None:
    """Makes SIGTERM tell ``handler``; once the handler is gone, SIGTERM does what it did before."""
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        target = handler()
        if target is not None:
            target._notice()  # ignored once the handler has saved: TensorFlow never lets SIGTERM through again
            return
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signum)  # the default action: the process ends, as it would have

    signal.signal(signal.SIGTERM, on_sigterm)
