"""``Workers``: the processes of a ``MultiWorkerMirroredStrategy`` and the host-side collectives between them.

Each worker first combines its own replicas (the local, in-process step); ``Workers`` then
combines one host array per worker across the processes. Arrays are numpy arrays here:
GPU values are staged through host memory by the strategy.

* ``sum``: packs the arrays by dtype (and ``bytes_per_pack``) into contiguous host buffers
  and sums each across the workers into an output buffer (small ones in the message that
  carries the collective's check, larger ones after it); integers stay exact.
* ``gather``: concatenates along an axis; the sizes along it may differ per worker.
* ``broadcast``: rank 0's arrays everywhere.
* ``sparse_sum``: ``IndexedSlices`` rows summed, exchanging only the rows (or densely past a size).
* ``flags``: every worker's yes or no (the input's "who has data" agreement).

One worker (no launcher) makes every operation an identity, without MPI.

Every ``Workers`` of a process shares one ``Communicator`` (one duplicate of
``COMM_WORLD``, made when the first ``MultiWorkerMirroredStrategy`` is created), so the
collectives of several strategies, and of checkpoints, are numbered in one sequence.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from towerdist._src import errors, mpi_runtime, replica_timeouts
from towerdist._src.backend import numpy_backend as host
from towerdist._src.multi_worker.communicator import Call, Communicator
from towerdist._src.options import CommunicationOptions

__all__ = ["Workers", "current"]

# Dtypes MPI's SUM does not cover everywhere travel as a wider type and come back.
_TRANSFER = {np.dtype(np.float16): np.dtype(np.float32), np.dtype(np.bool_): np.dtype(np.int32)}
_MAX_SIGNATURE = 240  # characters of a signature kept for messages


class Workers:
    """This job's workers: ``rank`` (this worker's index) and ``size`` (how many).

    Args:
      options: the strategy's ``CommunicationOptions`` (per-call options override them).
    """

    def __init__(self, options: CommunicationOptions) -> None:
        global _current
        self._options = options
        world = mpi_runtime.world()
        self.rank = 0 if world is None else world.rank
        self.size = 1 if world is None else world.size
        self._communicator = _shared_communicator(world, self.bounds(None))
        self._pool = _BufferPool()
        if self._communicator is not None:
            _current = self

    @property
    def communicator(self) -> Communicator | None:
        return self._communicator

    def bounds(self, options: CommunicationOptions | None) -> tuple[float | None, float | None]:
        """``(timeout, warning)`` seconds for a collective with per-call ``options``.

        The timeout is ``CommunicationOptions.timeout_seconds`` (per call, else the
        strategy's), else the replica timeout of ``td.config.set_replica_timeouts``. A
        ``timeout_seconds`` of 0 or less (or infinity) means no bound, as in TensorFlow, whose
        collective ops schedule a timeout only when it is positive.
        """
        replica = replica_timeouts.get_replica_timeouts()
        timeout = (self._options if options is None else self._options.merge(options)).timeout_seconds
        if timeout is None:
            return replica["timeout_seconds"], replica["warning_seconds"]
        return (float(timeout) if 0 < timeout < math.inf else None), replica["warning_seconds"]

    # --- collectives ------------------------------------------------------------------------

    def sum(
        self,
        arrays: Sequence[np.ndarray],
        collective: str,
        options: CommunicationOptions | None,
        out: Sequence[Any] | None = None,
        op: str = "SUM",
    ) -> list[np.ndarray]:
        """Each array summed over the workers (same shapes and dtypes), in arrays the caller owns.

        ``op`` names the reduction the user asked for (``"MEAN"`` is a sum the caller then
        divides): the workers compare it, so a rank asking for MEAN while another asks for
        SUM fails on every rank instead of each computing its own answer.

        ``out[k]``, when given and of array ``k``'s shape and dtype, is reduced into and
        returned. Otherwise the result is a view of a pooled buffer, reused only once no
        result (or view of one) refers to it any more (fresh memory handed to MPI
        page-faulted on every call, which cost more than the transfer itself). A pack of one
        contiguous array of its transfer dtype is sent as it is and its sum written straight
        into the result; other packs are copied once, into the result buffer, and summed there.
        """
        communicator = self._communicator
        if communicator is None:
            return [_result(a, out, k) for k, a in enumerate(arrays)]
        bytes_per_pack = (self._options if options is None else self._options.merge(options)).bytes_per_pack
        packs = _packs(arrays, bytes_per_pack)
        if len(packs) > 1:
            op = f"{op} in packs of {[len(pack) for _, pack in packs]} arrays"
        call = Call(collective, op, _signature(arrays))
        targets = []  # each pack's result: the caller's own ``out`` where it fits, else a pooled buffer
        for dtype, pack in packs:
            target = _own_buffer(out, pack[0], arrays[pack[0]], dtype) if len(pack) == 1 else None
            targets.append(self._pool.take(dtype, sum(arrays[k].size for k in pack)) if target is None else target)
        parts = _parts(arrays, packs, communicator)
        if parts is not None:  # in the host's window: the arrays are written there as they are, no pack first
            communicator.allreduce_parts(parts, targets, call, *self.bounds(options))
            return _unpacked(arrays, packs, targets)
        sends = []
        for (dtype, pack), target in zip(packs, targets):
            source = _as_sent(arrays[pack[0]], dtype, target) if len(pack) == 1 else None
            if source is None:  # packed, converted, or written over by its own result: copied into the result
                source = _fill(arrays, pack, target)
            sends.append(source)
        communicator.allreduce(sends, targets, call, *self.bounds(options))
        return _unpacked(arrays, packs, targets)

    def gather(self, array: np.ndarray, axis: int, collective: str, options: CommunicationOptions | None) -> np.ndarray:
        """Every worker's ``array`` concatenated along ``axis``, in rank order (any dtype but object)."""
        communicator = self._communicator
        if communicator is None:
            return np.array(array, copy=True)
        _check_movable(array, collective)
        moved = np.ascontiguousarray(np.moveaxis(array, axis, 0))
        rest = moved.shape[1:]
        shape = ", ".join(["*" if d == axis else str(n) for d, n in enumerate(array.shape)])
        call = Call(collective, f"gather along axis {axis}", f"{array.dtype}[{shape}]", extra=moved.shape[0])
        row_bytes = int(np.prod(rest, dtype=np.int64)) * array.dtype.itemsize
        # Gathering moves bytes: any fixed-size dtype (strings, datetimes) travels as it is.
        flat, rows = communicator.allgatherv(moved.reshape(-1).view(np.uint8), row_bytes, call, *self.bounds(options))
        return np.moveaxis(flat.view(array.dtype).reshape((sum(rows), *rest)), 0, axis)

    def broadcast(
        self, arrays: Sequence[np.ndarray], collective: str, options: CommunicationOptions | None, detail: str = ""
    ) -> list[np.ndarray]:
        """Rank 0's arrays on every worker (the shapes and dtypes must agree; any dtype but object), as new arrays."""
        communicator = self._communicator
        copies = [np.array(a, copy=True, order="C") for a in arrays]
        if communicator is None:
            return copies
        for array in copies:
            _check_movable(array, collective)
        call = Call(collective, "broadcast from rank 0", _signature(arrays), detail=detail)
        timeout, warning = self.bounds(options)
        if len(copies) == 1:
            communicator.broadcast(copies[0].reshape(-1).view(np.uint8), call, timeout, warning)
            return copies
        sizes = [c.nbytes for c in copies]
        buffer = np.empty(sum(sizes), np.uint8)  # broadcasting moves bytes: one buffer for every dtype
        offset = 0
        for copy, size in zip(copies, sizes):
            buffer[offset : offset + size] = copy.reshape(-1).view(np.uint8)
            offset += size
        communicator.broadcast(buffer, call, timeout, warning)
        offset = 0
        for k, (copy, size) in enumerate(zip(copies, sizes)):
            copies[k] = buffer[offset : offset + size].view(copy.dtype).reshape(copy.shape)
            offset += size
        return copies

    def sparse_sum(
        self,
        indices: np.ndarray,
        values: np.ndarray,
        dense_shape: Sequence[int | None],
        collective: str,
        options: CommunicationOptions | None,
        op: str = "SUM",
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """The workers' ``IndexedSlices`` summed: ``(indices, values, path)``, each index once, sorted.

        ``indices`` (int64, strictly increasing: the canonical form) and ``values`` are this
        worker's rows. The workers first agree on their row counts (the handshake also
        compares dtype and ``dense_shape``, so a mismatch raises on every worker naming
        both); then either every worker's rows travel (one ``Allgatherv`` of index and
        row together, ``path == "rows"``) or, when that would move more bytes than a dense
        all-reduce of the table, the rows are scattered into the table and summed densely
        with a mask of the rows touched (``path == "dense"``). Both give the same result:
        the union of the rows, each summed in rank order.
        """
        communicator = self._communicator
        if communicator is None:
            return np.array(indices, copy=True), np.array(values, copy=True), "rows"
        rows = values.shape[0]
        table_rows = dense_shape[0]  # None: unknown (slices without dense_shape), so the rows travel
        row_shape = tuple(int(d or 0) for d in dense_shape[1:])
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * values.dtype.itemsize
        signature = f"IndexedSlices of {values.dtype}[{', '.join('?' if d is None else str(int(d)) for d in dense_shape)}]"
        timeout, warning = self.bounds(options)
        counts = communicator.agree(Call(collective, f"sparse {op} (row counts)", signature, extra=rows), timeout, warning)
        gathered_bytes = sum(counts) * (row_bytes + 8)
        dense_bytes = None if table_rows is None else 2 * (self.size - 1) / self.size * table_rows * (row_bytes + 4)
        if dense_bytes is not None and table_rows is not None and gathered_bytes > dense_bytes:
            table = np.zeros((table_rows, *row_shape), values.dtype)
            touched = np.zeros(table_rows, np.int32)
            table[indices] = values
            touched[indices] = 1
            table, touched = self.sum([table, touched], f"{collective} (sparse, dense path)", options, op=op)
            union = np.flatnonzero(touched).astype(np.int64)
            return union, table if union.shape[0] == table_rows else table[union], "dense"
        record = 8 + row_bytes
        send = np.empty((rows, record), np.uint8)
        send[:, :8] = np.ascontiguousarray(indices, np.int64).view(np.uint8).reshape(rows, 8)
        send[:, 8:] = np.ascontiguousarray(values).reshape(rows, row_bytes // values.dtype.itemsize).view(np.uint8)
        call = Call(collective, f"sparse {op} (rows)", signature, extra=rows)
        flat, _ = communicator.allgatherv(send.reshape(-1), record, call, timeout, warning)
        received = flat.reshape(-1, record)  # every rank's rows, in rank order: each rank's in canonical form
        all_indices = np.ascontiguousarray(received[:, :8]).view(np.int64).reshape(-1)
        all_values = np.ascontiguousarray(received[:, 8:]).view(values.dtype).reshape((-1, *row_shape))
        union, summed_values = host.unique_rows_sum(all_indices, all_values)
        return union, summed_values, "rows"

    def flags(self, flag: bool, collective: str) -> list[bool]:
        """Every worker's ``flag``, in rank order."""
        return [bool(x) for x in self.agree_extra(collective, int(flag), None)]

    def agree_extra(self, collective: str, extra: int, options: CommunicationOptions | None) -> list[int]:
        """Every worker's ``extra`` (a handshake without payload)."""
        if self._communicator is None:
            return [extra]
        return self._communicator.agree(Call(collective, "agree", "", extra=extra), *self.bounds(options))

    # --- agreeing on outcomes ---------------------------------------------------------------------

    @property
    def seq(self) -> int:
        """How many collectives the workers have begun (-1 without other workers): mark it before preparing one."""
        communicator = self._communicator
        return -1 if communicator is None else communicator.seq

    def failed_before(self, seq: int, collective: str, error: BaseException) -> None:
        """Tells the other workers that this one failed preparing the collective it began at ``seq``.

        Call it with the error, then re-raise it. If this worker has not reached the
        collective's handshake yet (no collective began since ``seq``), it joins it as
        failed: every other worker raises ``AbortedError`` naming it and the error, instead
        of waiting for it, and the workers stay in step.
        """
        communicator = self._communicator
        if communicator is None or communicator.seq != seq or communicator.broken is not None:
            return
        try:
            text = f"{type(error).__name__}: {error}"
        except Exception:  # an error whose __str__ fails still fails every worker
            text = type(error).__name__
        try:
            communicator.fail(collective, text[:2000], *self.bounds(None))
        except Exception as telling:  # the user's error stays the one raised; this one is noted on it
            note = f"towerdist could not tell the other workers about it: {type(telling).__name__}: {telling}"
            if hasattr(error, "add_note"):
                error.add_note(note)

    def settle(self, error: BaseException | None, collective: str) -> None:
        """Agrees whether every worker succeeded at a step; raises on every worker if one failed.

        A worker that failed raises its own ``error``; the others raise ``AbortedError``
        naming the failed ranks.
        """
        flags = self.agree_extra(f"{collective} (did every worker succeed?)", 0 if error is None else 1, None)
        failed = [rank for rank, flag in enumerate(flags) if flag]
        if error is not None:
            raise error
        if failed:
            raise errors.AbortedError(
                f"{collective} failed on rank(s) {', '.join(map(str, failed))} (see their error), so rank {self.rank} "
                f"stops too: every worker takes part in it, and they stay in step.",
                ranks=failed,
            )

    def run_on_chief(self, fn: Callable[[], Any], collective: str) -> Any:
        """Runs ``fn`` on worker 0 only and returns its JSON-able result on every worker.

        An exception ``fn`` raises on worker 0 is raised on every worker: the same exception
        on worker 0; on the others the same class (for towerdist's errors and the common
        built-in ones, else ``OpError``), message and ``path``.
        """
        mine: Exception | None = None
        data = b""
        if self.rank == 0:
            try:
                data = json.dumps({"result": fn()}).encode()
            except Exception as error:  # re-raised on every worker, below
                mine = error
                path = getattr(error, "path", None)
                details = {"path": path} if isinstance(path, str) else {}
                data = json.dumps({"error": [type(error).__name__, str(error), details]}).encode()
        received = json.loads(self.broadcast_bytes(data, collective))
        if "error" in received:
            if mine is not None:
                raise mine
            name, message, details = received["error"]
            raise _chief_error(name, f"{message} (raised on the chief, worker 0)", details)
        return received["result"]

    def gather_bytes(self, data: bytes, collective: str) -> list[bytes]:
        """Every worker's ``data``, in rank order (the lengths may differ)."""
        if self._communicator is None:
            return [data]
        lengths = self.agree_extra(f"{collective} (lengths)", len(data), None)
        gathered = self.gather(np.frombuffer(data, np.uint8), 0, collective, None)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return [bytes(gathered[offsets[k] : offsets[k + 1]].tobytes()) for k in range(len(lengths))]

    def broadcast_bytes(self, data: bytes, collective: str) -> bytes:
        """Worker 0's ``data`` on every worker."""
        if self._communicator is None:
            return data
        (length,) = self.agree_extra(f"{collective} (length)", len(data), None)[:1]
        buffer = np.frombuffer(data, np.uint8).copy() if self.rank == 0 else np.empty(length, np.uint8)
        return bytes(self.broadcast([buffer], collective, None)[0].tobytes())


_current: Workers | None = None
_communicator: Communicator | None = None
_lock = threading.Lock()


def current() -> Workers | None:
    """The ``Workers`` of the latest multi-worker strategy of this process, if there are several workers."""
    return _current


def _shared_communicator(
    world: mpi_runtime.World | None, bounds: tuple[float | None, float | None]
) -> Communicator | None:
    global _communicator
    if world is None or world.size == 1:
        return None
    with _lock:
        if _communicator is None:
            _communicator = Communicator(world, *bounds)
            atexit.register(_close, _communicator)
        return _communicator


def _close(communicator: Communicator) -> None:
    """At exit: every rank leaves together (a rank still in a collective learns this one left)."""
    replica = replica_timeouts.get_replica_timeouts()
    communicator.close(replica["timeout_seconds"], replica["warning_seconds"])


_RAISED_AS_IS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        errors.AbortedError,
        errors.DataLossError,
        errors.DeadlineExceededError,
        errors.InvalidArgumentError,
        errors.NotFoundError,
        errors.OutOfRangeError,
        errors.UnavailableError,
        errors.ValidationError,
        errors.MissingDependencyError,
        FileNotFoundError,
        PermissionError,
        OSError,
        TypeError,
        ValueError,
        KeyError,
        RuntimeError,
    )
}


def _chief_error(name: str, message: str, details: dict[str, Any]) -> Exception:
    """The chief's exception, rebuilt on another worker from its class name, message and details."""
    cls = _RAISED_AS_IS.get(name, errors.OpError)
    if issubclass(cls, errors.OpError):
        return cls(message, **details)
    return cls(message)


def _check_movable(array: np.ndarray, collective: str) -> None:
    if array.dtype.hasobject:
        raise TypeError(
            f"{collective} cannot send values of dtype {array.dtype} between workers (Python objects have no fixed "
            f"byte layout). Use a numeric, bool, string or datetime dtype."
        )


_signatures: dict[tuple[Any, ...], str] = {}


def _signature(arrays: Sequence[np.ndarray]) -> str:
    """What must be equal on every worker: each array's dtype and shape, as text (cached)."""
    key = tuple((a.dtype, a.shape) for a in arrays)
    text = _signatures.get(key)
    if text is None:
        text = ", ".join(f"{a.dtype}{list(a.shape)}" for a in arrays)
        if len(text) > _MAX_SIGNATURE:  # shortened for messages; the digest of the whole keeps it exact
            digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
            text = f"{len(arrays)} arrays: {text[:_MAX_SIGNATURE]}... (digest {digest})"
        if len(_signatures) > 4096:
            _signatures.clear()
        _signatures[key] = text
    return text


def _result(array: np.ndarray, out: Sequence[Any] | None, k: int) -> np.ndarray:
    """A copy of ``array``: into ``out[k]`` when that fits, else a new array."""
    target = _own_buffer(out, k, array, array.dtype)
    if target is None:
        return np.array(array, copy=True)
    np.copyto(target, array.reshape(-1))
    return target.reshape(array.shape)


def _own_buffer(out: Sequence[Any] | None, k: int, array: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray | None:
    """``out[k]`` flattened, if it can hold ``array``'s values as ``dtype`` (same dtype, writable, contiguous)."""
    target = out[k] if out is not None else None
    if (
        isinstance(target, np.ndarray)
        and target.shape == array.shape
        and target.dtype == array.dtype == dtype
        and target.flags.writeable
        and target.flags.c_contiguous
    ):
        return target.reshape(-1)
    return None


class _BufferPool:
    """Host buffers to reduce into, reused once nothing outside the pool refers to them.

    A result handed out is a view of its buffer, and every view of a view refers to the
    buffer itself, so the buffer stays busy while any result (or view of one) lives. The
    pool keeps at most ``_PER_SIZE`` buffers per dtype and size and ``_MAX_BYTES`` in all,
    dropping the sizes used least recently first (a dropped busy buffer lives on with its
    results).
    """

    _PER_SIZE = 4
    _MAX_BYTES = 256 << 20

    def __init__(self) -> None:
        self._buffers: dict[tuple[np.dtype[Any], int], list[np.ndarray]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, dtype: np.dtype[Any], size: int) -> np.ndarray:
        with self._lock:
            key = (dtype, size)
            kept = self._buffers.pop(key, [])
            self._buffers[key] = kept  # now the most recently used
            for buffer in kept:
                if _refcount(buffer) <= _FREE:
                    return buffer
            buffer = np.empty(size, dtype)
            if len(kept) < self._PER_SIZE and buffer.nbytes <= self._MAX_BYTES:
                kept.append(buffer)
                self._bytes += buffer.nbytes
                while self._bytes > self._MAX_BYTES:
                    oldest = next(iter(self._buffers))
                    self._bytes -= sum(b.nbytes for b in self._buffers.pop(oldest))
            return buffer


def _refcount(buffer: np.ndarray) -> int:
    return sys.getrefcount(buffer)


def _count_in_loop(kept: list[np.ndarray]) -> int:
    for buffer in kept:  # the same references as in ``_BufferPool.take``'s loop
        return _refcount(buffer)
    return 0


# The count of a buffer only the pool's list refers to, measured the way ``take`` measures it
# (interpreters differ in which references they count, e.g. borrowed references on the stack).
_FREE = _count_in_loop([np.empty(0)])


def _packs(arrays: Sequence[np.ndarray], bytes_per_pack: int) -> list[tuple[np.dtype[Any], list[int]]]:
    """Indices of ``arrays`` grouped by transfer dtype, split at ``bytes_per_pack`` (0: one pack per dtype)."""
    if len(arrays) == 1:
        return [(_TRANSFER.get(arrays[0].dtype, arrays[0].dtype), [0])]
    by_dtype: dict[np.dtype[Any], list[list[int]]] = {}
    sizes: dict[np.dtype[Any], int] = {}
    for k, array in enumerate(arrays):
        dtype = _TRANSFER.get(array.dtype, array.dtype)
        groups = by_dtype.setdefault(dtype, [[]])
        nbytes = array.size * dtype.itemsize
        if bytes_per_pack and groups[-1] and sizes[dtype] + nbytes > bytes_per_pack:
            groups.append([])
            sizes[dtype] = 0
        groups[-1].append(k)
        sizes[dtype] = sizes.get(dtype, 0) + nbytes
    return [(dtype, group) for dtype, groups in by_dtype.items() for group in groups]


def _parts(
    arrays: Sequence[np.ndarray], packs: list[tuple[np.dtype[Any], list[int]]], communicator: Communicator
) -> list[list[np.ndarray]] | None:
    """Each pack's arrays flattened, to be written into the host's window apart, or None.

    When the sum fits the window and every array is contiguous and of its transfer dtype;
    otherwise the packs are filled first (and converted) as MPI messages need.
    """
    nbytes = 0
    for array in arrays:
        if not array.flags.c_contiguous or array.dtype in _TRANSFER:
            return None
        nbytes += array.nbytes
    if not communicator.window_fits(nbytes):
        return None
    return [[arrays[k].reshape(-1) for k in pack] for _, pack in packs]


def _unpacked(
    arrays: Sequence[np.ndarray], packs: list[tuple[np.dtype[Any], list[int]]], buffers: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """Each array's sum: its place in its pack's buffer, in its shape (and dtype)."""
    results: list[np.ndarray] = [np.empty(0)] * len(arrays)
    for (_, pack), buffer in zip(packs, buffers):
        offset = 0
        for k in pack:
            size = arrays[k].size
            part = buffer[offset : offset + size].reshape(arrays[k].shape)
            results[k] = part if part.dtype == arrays[k].dtype else part.astype(arrays[k].dtype)
            offset += size
    return results


def _as_sent(array: np.ndarray, dtype: np.dtype[Any], target: np.ndarray) -> np.ndarray | None:
    """``array`` flattened, to send as it is, if it is contiguous, of ``dtype`` and apart from ``target``."""
    if array.dtype != dtype or not array.flags.c_contiguous or np.may_share_memory(array, target):
        return None
    return array.reshape(-1)


def _fill(arrays: Sequence[np.ndarray], pack: list[int], buffer: np.ndarray) -> np.ndarray:
    """``buffer`` holding ``arrays[k]`` for ``k`` in ``pack``, one after another."""
    offset = 0
    for k in pack:
        size = arrays[k].size
        buffer[offset : offset + size] = arrays[k].reshape(-1)
        offset += size
    return buffer

