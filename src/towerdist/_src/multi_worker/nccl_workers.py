"""``NcclWorkers``: sums GPU buffers across the workers with NCCL, one communicator over their first GPUs.

Used by ``MultiWorkerMirroredStrategy`` when every local replica is a GPU: each worker first
sums its own GPUs (in process), then this sums one buffer per dtype across the workers, on
each worker's first GPU, in place; the result is then copied to the worker's other GPUs.

Written to the rules of ``reference/cupy.md`` and **not verified on GPUs** (none is
available to this project):

* the NCCL unique id is made on worker 0 and broadcast over MPI; each worker creates its
  communicator with its GPU current;
* every collective is first checked across the workers over MPI (``Communicator.agree``), so
  NCCL never sees mismatched calls;
* the all-reduce runs on a stream of the communicator's own, ordered after the work that
  produced the buffers (an event recorded on the caller's stream), and every buffer stays
  referenced until the stream is done;
* the wait is bounded: the stream is polled against the deadline, with
  ``check_async_error``; on a timeout the communicator is aborted and the workers'
  communication is marked broken, as for MPI.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from towerdist._src.backend import cupy_backend
from towerdist._src.cross_device_ops import nccl_all_reduce
from towerdist._src.errors import DeadlineExceededError
from towerdist._src.multi_worker.communicator import Call
from towerdist._src.multi_worker.workers import Workers

__all__ = ["NCCL_DTYPES", "NcclWorkers"]

# numpy dtype name -> NCCL type name: NcclAllReduce's table, and complex values as pairs of floats (SUM).
NCCL_DTYPES = {**nccl_all_reduce.NCCL_DTYPES, "complex64": "NCCL_FLOAT32", "complex128": "NCCL_FLOAT64"}


class NcclWorkers:
    """One NCCL communicator across the workers, on each worker's GPU ``device_index``.

    Creating it is collective (every worker must create it at the same point).
    """

    def __init__(self, workers: Workers, device_index: int) -> None:
        nccl = cupy_backend.nccl()
        self._workers = workers
        self._device_index = device_index
        self._nccl = nccl
        self._lock = threading.Lock()
        unique_id = workers.run_on_chief(lambda: list(nccl.get_unique_id()), "NCCL communicator set-up (unique id)")
        cupy = cupy_backend._import()
        with cupy.cuda.Device(device_index):
            self._comm = nccl.NcclCommunicator(workers.size, tuple(unique_id), workers.rank)
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def sum(self, buffers: list[Any], api: str, timeout: float | None, warning: float | None) -> None:
        """Sums each contiguous GPU buffer (on the communicator's GPU) across the workers, in place."""
        communicator = self._workers.communicator
        assert communicator is not None
        signature = ", ".join(f"{b.dtype}[{b.size}]" for b in buffers)
        communicator.agree(Call(api, "SUM over NCCL", signature), timeout, warning)
        cupy = cupy_backend._import()
        nccl = self._nccl
        with self._lock, cupy.cuda.Device(self._device_index):
            ready = cupy.cuda.Event()
            ready.record(cupy.cuda.get_current_stream())  # the buffers' producers come first
            self._stream.wait_event(ready)
            for buffer in buffers:
                count = buffer.size * (2 if buffer.dtype.kind == "c" else 1)
                kind = getattr(nccl, NCCL_DTYPES[buffer.dtype.name])
                self._comm.allReduce(buffer.data.ptr, buffer.data.ptr, count, kind, nccl.NCCL_SUM, self._stream.ptr)
            self._wait(api, timeout)

    def _wait(self, api: str, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stream.done:
            self._comm.check_async_error()
            if deadline is not None and time.monotonic() > deadline:
                self._comm.abort()
                reason = f"{api} timed out in NCCL between the workers"
                communicator = self._workers.communicator
                if communicator is not None:
                    communicator.mark_broken(reason)
                raise DeadlineExceededError(
                    f"{reason}: every worker had arrived, but the GPU all-reduce did not complete within "
                    f"{timeout:g} s (a GPU or a link stalled). The NCCL communicator was aborted and the job is "
                    f"aborted at exit; restart it.",
                    missing=[],
                )
            time.sleep(0)
