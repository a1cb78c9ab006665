"""``NcclAllReduce``: one process driving all its GPUs through NCCL (via cupy).

One NCCL communicator per GPU is created once per device set (``nccl_cliques.py``); each
pack is all-reduced inside an NCCL group call, each GPU on a stream of towerdist's own.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from towerdist._src.backend import cupy_backend, cupy_streams
from towerdist._src.backend.cupy_backend import nccl_unavailable_reason
from towerdist._src.cross_device_ops import nccl_cliques
from towerdist._src.cross_device_ops.all_reduce_ops import AllReduceCrossDeviceOps
from towerdist._src.cross_device_ops.base import library_algorithm
from towerdist._src.cross_device_ops.nccl_cliques import Clique
from towerdist._src.device import DeviceSpec
from towerdist._src.errors import MissingDependencyError, UnavailableError

__all__ = ["NCCL_DTYPES", "NcclAllReduce"]

def _close(cliques: dict[tuple[int, ...], Clique]) -> None:
    for clique in cliques.values():
        clique.close()
    cliques.clear()


def _sum_by_copies(devices: tuple[DeviceSpec, ...], components: list[Any]) -> list[Any]:
    """The sum of ``components`` (``components[j]`` on ``devices[j]``) on every device, by GPU copies."""
    first = devices[0]
    with cupy_backend.on_device(first):
        total = cupy_backend.add_n([cupy_backend.to_device(c, first) for c in components])
    return [total if d == first else cupy_backend.copy(total, d) for d in devices]


NCCL_DTYPES = {
    "int8": "NCCL_INT8",
    "uint8": "NCCL_UINT8",
    "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32",
    "int64": "NCCL_INT64",
    "uint64": "NCCL_UINT64",
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
}


@library_algorithm
class NcclAllReduce(AllReduceCrossDeviceOps):
    """All-reduce with NCCL across the GPUs of this process (``tf.distribute.NcclAllReduce``).

    Args:
      num_packs: how many packs each dtype's values are concatenated and cut into;
        0 reduces every value on its own.

    Requires every device to be a GPU and cupy with NCCL (``towerdist[cuda12]`` or
    ``towerdist[cuda13]``); a strategy created with it on other devices raises at once.

    Each pack is summed by one NCCL group call on a stream of towerdist's own per GPU,
    ordered after the work that produced the pack and before the work that reads the sum by
    CUDA events: the host does not wait for the GPUs (``nccl_cliques.py``).
    """

    def __init__(self, num_packs: int = 1) -> None:
        if not isinstance(num_packs, int) or num_packs < 0:
            raise ValueError(f"NCCL all-reduce requires num_packs >= 0, but {num_packs} is specified")
        super().__init__(num_packs)
        self._cliques: dict[tuple[int, ...], Clique] = {}
        self._lock = threading.Lock()  # guards ``_cliques``
        # The NCCL communicators are closed with this object (its strategy going away).
        weakref.finalize(self, _close, self._cliques)

    def check_devices(self, devices: Sequence[DeviceSpec]) -> None:
        """Raises unless ``devices`` are GPUs and NCCL is usable."""
        not_gpu = [d.short_name for d in devices if d.device_type != "GPU"]
        reason = nccl_unavailable_reason()
        if not_gpu:
            missing = f"; also, {reason}" if reason else ""
            raise ValueError(
                f"NcclAllReduce needs every device to be a GPU, but got {', '.join(not_gpu)}{missing}. "
                f"Use the default cross-device ops (or ReductionToOneDevice) for CPU devices."
            )
        if reason is not None:
            raise MissingDependencyError(f"NcclAllReduce cannot run: {reason}.")

    def _clique(self, key: tuple[int, ...]) -> Clique:
        """The communicators over the GPUs ``key``, made on first use (again after a failure)."""
        with self._lock:
            clique = self._cliques.get(key)
            if clique is not None and clique.broken is None:
                return clique
        made = nccl_cliques.create_local(key, f"NcclAllReduce over {nccl_cliques.describe_gpus(key)}")
        with self._lock:
            clique = self._cliques.get(key)
            if clique is not None and clique.broken is None:  # another thread made them meanwhile
                made.close()
                return clique
            self._cliques[key] = made
        return made

    def _forget(self, key: tuple[int, ...], clique: Clique) -> None:
        with self._lock:
            if self._cliques.get(key) is clique:  # not a newer clique another thread made
                del self._cliques[key]

    def _all_reduce_pack(self, devices: tuple[DeviceSpec, ...], components: list[Any], pack_index: int) -> list[Any]:
        """Sums ``components[j]`` (on ``devices[j]``) with one NCCL group call; the sum on every device.

        The rules of ``reference/cupy.md``: each input is made contiguous on its own GPU; the
        clique's stream on each GPU waits for the calling thread's stream (which produced or
        was ordered after the inputs), allocates the output from its own pool and runs the
        collective; the calling thread's streams then wait for the clique's "done" events.
        The inputs stay referenced until then by the caller's stream order (its next work on
        their memory comes after the "done" event). A failed group aborts the clique's
        communicators (the other ranks would wait forever) and raises ``UnavailableError``;
        the next call makes new ones.
        """
        self.check_devices(devices)
        cupy = cupy_backend.cupy_module()
        cuda = cupy.cuda
        nccl = cupy_backend.nccl()

        dtype = components[0].dtype
        if dtype.kind == "c":  # NCCL has no complex type: a sum of complex numbers is a sum of float pairs
            floats = [cupy_backend.flat(c).view(f"f{dtype.itemsize // 2}") for c in components]
            summed = self._all_reduce_pack(devices, floats, pack_index)
            return [s.view(dtype).reshape(c.shape) for s, c in zip(summed, components)]
        dtype_name = NCCL_DTYPES.get(str(dtype))
        if dtype_name is None:  # int16, uint16, bool: NCCL has no such type; sum by copies instead
            return _sum_by_copies(devices, components)
        key = tuple(d.device_index for d in devices)
        clique = self._clique(key)
        inputs, outputs = [], []
        for device, component, stream in zip(devices, components, clique.streams):
            index = device.device_index
            with cuda.Device(index):
                source = cupy_backend.flat(cupy_backend.to_device(component, device))
                cupy_streams.wait_for_stream(stream, index, cuda.get_current_stream(), index)
                with stream:  # from the clique stream's own pool: freed blocks come back to it
                    outputs.append(cupy.empty_like(source))
                inputs.append(source)
        api = "NcclAllReduce"
        with nccl_cliques.gpus_locked(key):
            try:
                clique.check(api)
            except UnavailableError:
                self._forget(key, clique)
                raise
            failure: BaseException | None = None
            nccl.groupStart()
            try:
                for comm, source, target, stream in zip(clique.comms, inputs, outputs, clique.streams):
                    comm.allReduce(
                        source.data.ptr, target.data.ptr, source.size, getattr(nccl, dtype_name), nccl.NCCL_SUM,
                        stream.ptr,
                    )  # fmt: skip
            except BaseException as error:  # re-raised below, once the group is closed
                failure = error
            finally:
                try:
                    nccl.groupEnd()
                except Exception as error:
                    failure = failure or error
            if failure is not None:
                clique.abort(f"a collective failed ({type(failure).__name__}: {failure})")
                self._forget(key, clique)
                # Ranks launched before the failure may still touch their buffers until the
                # abort has ended them: the buffers stay referenced until their streams are done.
                for index, stream, source, target in zip(key, clique.streams, inputs, outputs):
                    cupy_streams.keep_alive(cupy_streams.record(stream, index), [source, target])
                if not isinstance(failure, Exception):
                    raise failure  # KeyboardInterrupt and friends, as they are
                raise UnavailableError(
                    f"NcclAllReduce over {nccl_cliques.describe_gpus(key)} failed: {failure}. Its communicators "
                    f"were aborted; the next all-reduce creates new ones.",
                    devices=key,
                ) from failure
            clique.finished()
        return [out.reshape(component.shape) for out, component in zip(outputs, components)]
