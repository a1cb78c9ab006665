"""NCCL communicators of this process: created without holding the GIL, launched under per-GPU locks,
with towerdist's own stream on each GPU, checked for asynchronous errors and aborted on failure.

A :class:`Clique` is the set of communicators towerdist drives together: one per GPU of
a ``NcclAllReduce`` device set (one process, several GPUs), or this process's rank of the
workers' communicator (``MultiWorkerMirroredStrategy``, one GPU per worker). The rules it
keeps (``reference/cupy.md``, NCCL's user guide):

* **Creation releases the GIL.** cupy's ``NcclCommunicator.initAll`` calls
  ``ncclCommInitAll`` with the GIL held, which froze every Python thread for the whole
  set-up; the ranks are instead created from one unique id inside an NCCL group, each
  with its GPU current (cupy releases the GIL in both calls).
* **Our own streams.** Every collective runs on a non-blocking stream the clique owns on
  each GPU (never a default stream: cupy passes the legacy null stream to NCCL because the
  per-thread one failed with ``initAll`` communicators, cupy issue 4322). The stream waits
  for an event on the caller's stream before the collective, and the caller's stream waits
  for the clique's "done" event after it: the host does not wait.
* **One launch at a time per GPU.** A communicator must not be used by two threads at once,
  and two cliques sharing a GPU must enqueue their groups in the same order on every GPU:
  :func:`gpus_locked` takes a process-wide lock per GPU, in ascending order.
* **Failures do not hang.** Before each launch the communicators' asynchronous errors are
  checked; a failed group or an asynchronous error aborts every communicator of the clique
  (the other ranks would wait forever) and marks it broken: later calls raise
  ``UnavailableError`` at once. When a clique is closed, communicators with work still
  running are aborted rather than destroyed (``ncclCommDestroy`` would wait for it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from towerdist._src.backend import cupy_backend, cupy_streams
from towerdist._src.errors import UnavailableError

__all__ = ["Clique", "create_local", "gpus_locked"]

_registry_lock = threading.Lock()
_gpu_locks: dict[int, threading.Lock] = {}


@contextlib.contextmanager
def gpus_locked(device_ids: Sequence[int]) -> Iterator[None]:
    """Holds the launch lock of each GPU in ``device_ids`` (taken in ascending order, so never a deadlock)."""
    with _registry_lock:
        locks = [_gpu_locks.setdefault(d, threading.Lock()) for d in sorted(set(device_ids))]
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield


def describe_gpus(device_ids: Sequence[int]) -> str:
    return ", ".join(f"GPU:{d}" for d in device_ids)


class Clique:
    """NCCL communicators driven together, with a stream of towerdist's own on each GPU.

    Attributes:
      device_ids: the GPU of each communicator, in rank order (of this process's ranks).
      comms: the communicators.
      streams: the stream each communicator's collectives run on.
      what: what the clique serves, for messages (e.g. "NcclAllReduce over GPU:0, GPU:1").
      broken: why the clique can no longer be used, or None.
    """

    def __init__(self, device_ids: Sequence[int], comms: Sequence[Any], what: str) -> None:
        cuda = cupy_backend.cupy_module().cuda
        self.device_ids = tuple(device_ids)
        self.comms = list(comms)
        self.what = what
        self.broken: str | None = None
        self._aborted = False
        self._abort_lock = threading.Lock()  # the watch thread and a collective may both abort
        self.streams = []
        for device_id in self.device_ids:
            with cuda.Device(device_id):
                self.streams.append(cuda.Stream(non_blocking=True))
        # The "done" event of the latest collective on each GPU (None before the first).
        self.last_done: list[Any] = [None] * len(self.device_ids)

    def check(self, api: str) -> None:
        """Raises ``UnavailableError`` if the clique is broken or a communicator reports an asynchronous error."""
        if self.broken is None:
            for device_id, comm in zip(self.device_ids, self.comms):
                try:
                    comm.check_async_error()
                except Exception as error:  # cupy's NcclError: the communicator failed while running
                    self.abort(f"NCCL reported an asynchronous error on GPU:{device_id}: {error}")
                    break
        if self.broken is not None:
            raise UnavailableError(
                f"{api} cannot use the NCCL communicators of {self.what}: {self.broken}. They were aborted; "
                f"towerdist creates new ones for the next collective of a single process, but a "
                f"MultiWorkerMirroredStrategy job must be restarted.",
                devices=self.device_ids,
            )

    def abort(self, reason: str) -> None:
        """Aborts every communicator (their queued work ends) and marks the clique broken; once."""
        with self._abort_lock:
            if self._aborted:
                return
            self._aborted = True
            if self.broken is None:
                self.broken = reason
            for comm in self.comms:
                with contextlib.suppress(Exception):  # a communicator NCCL had already torn down
                    comm.abort()

    def finished(self, device_ids: Sequence[int] | None = None) -> None:
        """Records a "done" event on each stream, and makes the caller's current streams wait for it."""
        cuda = cupy_backend.cupy_module().cuda
        for j, device_id in enumerate(self.device_ids):
            if device_ids is not None and device_id not in device_ids:
                continue
            done = cupy_streams.record(self.streams[j], device_id)
            self.last_done[j] = done
            with cuda.Device(device_id):
                cuda.get_current_stream().wait_event(done)

    def close(self) -> None:
        """Destroys the communicators; one with a collective still running is aborted instead."""
        for done, comm in zip(self.last_done, self.comms):
            try:
                busy = done is not None and not done.done
                comm.abort() if busy else comm.destroy()
            except Exception:  # noqa: S112  (closing at exit: nothing left to report to)
                continue


def create_local(device_ids: Sequence[int], what: str) -> Clique:
    """Communicators over ``device_ids`` (GPUs of this process), rank = position, created without the GIL.

    Raises:
      UnavailableError: NCCL could not create them (the message names the GPUs).
    """
    cupy = cupy_backend.cupy_module()
    nccl = cupy_backend.nccl()
    unique_id = nccl.get_unique_id()  # passed on as cupy returns it (bytes since cupy 14, a tuple before)
    comms: list[Any] = []
    with gpus_locked(device_ids):
        try:
            nccl.groupStart()
            try:
                for rank, device_id in enumerate(device_ids):
                    with cupy.cuda.Device(device_id):
                        comms.append(nccl.NcclCommunicator(len(device_ids), unique_id, rank))
            finally:
                nccl.groupEnd()
        except Exception as error:
            for comm in comms:
                with contextlib.suppress(Exception):
                    comm.abort()
            raise UnavailableError(
                f"NCCL could not create communicators over {describe_gpus(device_ids)} for {what}: {error}. Check "
                f"that each GPU appears once and is visible (CUDA_VISIBLE_DEVICES), or use "
                f"HierarchicalCopyAllReduce.",
                devices=tuple(device_ids),
            ) from error
    return Clique(device_ids, comms, what)
