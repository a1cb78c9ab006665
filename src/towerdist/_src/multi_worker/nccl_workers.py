"""``NcclWorkers``: sums GPU buffers across the workers with NCCL, one communicator over one GPU per worker.

Used by ``MultiWorkerMirroredStrategy`` when every local replica is a GPU: each worker
first sums its own GPUs (in process), then this sums one buffer per dtype across the
workers, on each worker's first GPU, in place; the result is then copied to the worker's
other GPUs. Workers on one host use different GPUs (``gpu_assignment.py``): NCCL refuses
two ranks of one communicator on one GPU.

Written to the rules of ``reference/cupy.md``:

* the NCCL unique id is made on worker 0 and broadcast over MPI, in the form the
  installed cupy returns and takes (``bytes`` since cupy 14, a tuple of ints before);
  each worker creates its rank with its GPU current;
* every collective is first checked across the workers over MPI (``Communicator.agree``),
  so NCCL never sees mismatched calls;
* the all-reduce runs on a stream the communicator owns (``nccl_cliques.Clique``), ordered
  after the caller's stream by an event; the caller's stream waits for its "done" event:
  the host does not wait;
* the work in flight is watched by a background thread (:class:`_Watch`): an asynchronous
  NCCL error, or a collective still running ``timeout`` seconds after its stream reached it
  (a peer or a link stalled), aborts the communicator (which ends the stalled work, so
  nothing waits forever for it) and marks the workers' communication broken, as for MPI;
  the next collective raises.
"""

from __future__ import annotations

import logging
import threading
import time
from types import ModuleType
from typing import Any, Protocol

from towerdist._src.backend import cupy_backend, cupy_streams
from towerdist._src.cross_device_ops import nccl_all_reduce, nccl_cliques
from towerdist._src.cross_device_ops.nccl_cliques import Clique
from towerdist._src.errors import DeadlineExceededError, UnavailableError
from towerdist._src.multi_worker.communicator import Call
from towerdist._src.multi_worker.workers import Workers

__all__ = ["NCCL_DTYPES", "GpuEvent", "NcclWorkers", "shared_unique_id"]


class GpuEvent(Protocol):
    """A recorded CUDA event (``cupy.cuda.Event``, or the simulated GPUs'): whether its stream reached it."""

    @property
    def done(self) -> bool: ...

logger = logging.getLogger("towerdist")

# numpy dtype name -> NCCL type name: NcclAllReduce's table, and complex values as pairs of floats (SUM).
NCCL_DTYPES = {**nccl_all_reduce.NCCL_DTYPES, "complex64": "NCCL_FLOAT32", "complex128": "NCCL_FLOAT64"}


def shared_unique_id(workers: Workers, nccl: ModuleType, collective: str) -> bytes | tuple[int, ...]:
    """Worker 0's new NCCL unique id on every worker, as the installed cupy takes it.

    cupy 14 returns and takes ``bytes``; earlier versions a tuple of signed ints. The id is
    sent as bytes, with a tag saying which form worker 0's cupy gave.
    """
    data = b""
    if workers.rank == 0:
        made = nccl.get_unique_id()
        if isinstance(made, (bytes, bytearray)):
            data = b"b" + bytes(made)
        else:
            data = b"t" + bytes(int(v) & 0xFF for v in made)
    received = workers.broadcast_bytes(data, collective)
    kind, raw = received[:1], received[1:]
    if kind == b"b":
        return bytes(raw)
    return tuple(b - 256 if b > 127 else b for b in raw)


class NcclWorkers:
    """One NCCL communicator across the workers, on each worker's GPU ``device_index``.

    Creating it is collective (every worker must create it at the same point).

    Raises:
      UnavailableError: NCCL could not create the communicator (e.g. two workers on one GPU).
    """

    def __init__(self, workers: Workers, device_index: int) -> None:
        nccl = cupy_backend.nccl()
        self._workers = workers
        self._device_index = device_index
        self._nccl = nccl
        collective = "MultiWorkerMirroredStrategy (NCCL communicator set-up)"
        unique_id = shared_unique_id(workers, nccl, collective)
        cuda = cupy_backend.cupy_module().cuda
        what = f"MultiWorkerMirroredStrategy's workers (worker {workers.rank} of {workers.size}, GPU:{device_index})"
        try:
            with cuda.Device(device_index):
                comm = nccl.NcclCommunicator(workers.size, unique_id, workers.rank)
        except Exception as error:
            raise UnavailableError(
                f"Worker {workers.rank} could not create its rank of the workers' NCCL communicator on "
                f"GPU:{device_index}: {error}. Every worker needs a GPU of its own (workers on one host are given "
                f"different GPUs unless devices are passed explicitly); check CUDA_VISIBLE_DEVICES.",
                devices=(device_index,),
            ) from error
        self._clique = Clique([device_index], [comm], what)
        self._watch = _Watch(self._clique, workers)

    def sum(
        self, buffers: list[Any], collective: str, timeout: float | None, warning: float | None, op: str = "SUM"
    ) -> None:
        """Sums each contiguous GPU buffer (on the communicator's GPU) across the workers, in place.

        ``op`` is the reduction the user asked for (a MEAN is this sum, divided by the
        caller); the workers compare it before NCCL runs, as ``Workers.sum`` does.

        Returns once the collective is queued: the calling thread's stream of the GPU waits
        for it (an event); nothing waits on the host.

        Raises:
          UnavailableError: the communicator is broken (an earlier collective failed or timed out).
        """
        communicator = self._workers.communicator
        assert communicator is not None
        nccl = self._nccl
        clique = self._clique
        index = self._device_index
        # A communicator known to be broken refuses before the handshake: the other workers
        # then wait in MPI (bounded, with a diagnosis), never in NCCL work that cannot end.
        self._watch.raise_if_failed(collective)
        with nccl_cliques.gpus_locked([index]):
            self._check(collective)
        signature = ", ".join(f"{b.dtype}[{b.size}]" for b in buffers)
        communicator.agree(Call(collective, f"{op} over NCCL", signature), timeout, warning)
        cuda = cupy_backend.cupy_module().cuda
        with nccl_cliques.gpus_locked([index]):
            self._check(collective)  # (an asynchronous error found meanwhile)
            stream = clique.streams[0]
            with cuda.Device(index):
                cupy_streams.wait_for_stream(stream, index, cuda.get_current_stream(), index)
                # Completes when the stream reaches the collective: its timeout counts from there,
                # not from now (the caller's queued work may take longer than the timeout).
                started = cupy_streams.record(stream, index)
                for buffer in buffers:
                    count = buffer.size * (2 if buffer.dtype.kind == "c" else 1)
                    kind = getattr(nccl, NCCL_DTYPES[buffer.dtype.name])
                    clique.comms[0].allReduce(buffer.data.ptr, buffer.data.ptr, count, kind, nccl.NCCL_SUM, stream.ptr)
            clique.finished()
            self._watch.add(started, clique.last_done[0], collective, timeout)


    def _check(self, collective: str) -> None:
        """``Clique.check``, and a failure breaks the workers' communication (as the watch's do)."""
        try:
            self._clique.check(collective)
        except UnavailableError:
            communicator = self._workers.communicator
            if communicator is not None and self._clique.broken is not None:
                communicator.mark_broken(self._clique.broken)
            raise


class _Watch:
    """Watches the workers' NCCL collectives in flight from a background thread (see the module doc).

    A collective's timeout counts from the moment its stream reaches it (its "started"
    event completes), not from the host's launch: the GPU may still be busy with the
    caller's earlier work. The watch takes the GPU's launch lock for each look, so it never
    checks or aborts the communicator while a collective is being launched.
    """

    def __init__(self, clique: Clique, workers: Workers) -> None:
        self._clique = clique
        self._workers = workers
        self._lock = threading.Lock()
        # (started event, done event, collective, timeout, when the stream reached it or None)
        self._pending: list[tuple[GpuEvent, GpuEvent, str, float | None, float | None]] = []
        self._failure: str | None = None
        self._thread: threading.Thread | None = None

    def add(self, started: GpuEvent, done: GpuEvent, collective: str, timeout: float | None) -> None:
        with self._lock:
            self._pending.append((started, done, collective, timeout, None))
            if self._thread is None and self._failure is None:
                self._thread = threading.Thread(target=self._run, name="towerdist-nccl-watch", daemon=True)
                self._thread.start()

    def raise_if_failed(self, collective: str) -> None:
        """Raises ``DeadlineExceededError`` (a timed-out collective) or ``UnavailableError`` after a failure."""
        failure = self._failure
        if failure is None:
            return
        error = DeadlineExceededError if "did not complete" in failure else UnavailableError
        raise error(
            f"{collective} cannot run: {failure}. The workers' NCCL communicator was aborted and the job is aborted at "
            f"exit; restart it.",
            missing=[],
        )

    def _run(self) -> None:
        while True:
            with nccl_cliques.gpus_locked(self._clique.device_ids), self._lock:
                try:
                    self._check()
                except Exception as error:  # a CUDA error while looking: the communicator cannot be trusted
                    self._fail(f"watching the NCCL collectives failed ({type(error).__name__}: {error})")
                if not self._pending or self._failure is not None:
                    self._thread = None
                    return
                shortest = min((t for _, _, _, t, _ in self._pending if t is not None), default=None)
            # A poll interval (not a synchronisation): a tenth of the shortest timeout, at most 50 ms.
            time.sleep(0.05 if shortest is None else min(0.05, max(shortest / 10, 0.001)))

    def _check(self) -> None:
        """One look at the collectives in flight (the locks are held)."""
        clique = self._clique
        now = time.monotonic()
        still: list[tuple[Any, Any, str, float | None, float | None]] = []
        for started, done, collective, timeout, began in self._pending:
            if done.done:
                continue
            if began is None and started.done:
                began = now
            if timeout is not None and began is not None and now - began > timeout:
                self._fail(
                    f"{collective} did not complete within {timeout:g} s in NCCL between the workers: every worker had "
                    f"arrived, but the GPU all-reduce on GPU:{clique.device_ids[0]} of worker {self._workers.rank} "
                    f"stalled (a peer or a link)"
                )
                return
            still.append((started, done, collective, timeout, began))
        try:
            clique.comms[0].check_async_error()
        except Exception as error:  # cupy's NcclError
            self._fail(f"NCCL reported an asynchronous error on GPU:{clique.device_ids[0]}: {error}")
            return
        self._pending = still

    def _fail(self, reason: str) -> None:
        self._failure = reason
        self._pending = []
        self._clique.abort(reason)  # ends the stalled work: nothing waits forever for it
        communicator = self._workers.communicator
        if communicator is not None:
            communicator.mark_broken(reason)
        logger.error("towerdist: %s; the NCCL communicator was aborted.", reason)
