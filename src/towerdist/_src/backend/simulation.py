"""``towerdist.testing.simulate_gpus``: run towerdist's GPU code paths on simulated GPUs.

The simulated GPUs are numpy arrays on the CPU that follow the rules of real GPUs (see
``backend/simulated/cupy.py``): code that runs on them places data and launches work the way it
would on real GPUs, and code that breaks a rule fails here as it would there.
"""

from __future__ import annotations

from typing import Any

from towerdist._src.backend import gpu_module

__all__ = ["simulate_gpus", "simulated_gpu_stats", "simulated_gpus_enabled"]


def simulate_gpus(n: int) -> None:
    """Runs towerdist's GPU code on ``n`` simulated GPUs (numpy on the CPU), for tests on machines without GPUs.

    Call it once at program start, before any device is used (listed, or used by a
    strategy), or set the environment variable ``TOWERDIST_SIMULATE_GPUS=n`` instead.
    Afterwards ``td.config.list_physical_devices("GPU")`` lists ``n`` GPUs and everything
    placed on them (``MirroredStrategy``, ``NcclAllReduce``, variables, optimizers,
    checkpoints) runs through towerdist's cupy code on simulated arrays. cupy need not be
    installed; if it is, it is not used.

    The simulation enforces what real GPUs require and raises where they would fail,
    hang or silently compute garbage: each thread has its own current GPU and kernels run
    on it; an operand on another GPU raises (as without peer access); device arrays never
    turn into numpy arrays implicitly; non-contiguous arrays cannot be copied between
    GPUs; a stream is used only on its own GPU; NCCL buffers must stay alive until
    ``groupEnd``; a communicator cannot be used from two threads at once, nor two of its
    ranks share a GPU; NCCL unique ids are cupy 14's ``bytes``; data written on one stream
    cannot be read or overwritten on another (another thread's stream with
    ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``), nor data read on one stream overwritten on
    another, nor a freed block reused by cupy's pool on its stream while another stream may
    still use it, until an event or a synchronisation orders the two. Host synchronisations
    cost nothing here, so they are counted (:func:`simulated_gpu_stats`). Ranks of an NCCL
    communicator in several processes of one host meet and exchange data through files, so
    ``MultiWorkerMirroredStrategy`` runs on simulated GPUs under ``mpiexec``. It proves
    placement and ordering logic, not speed or timing, and it does not run NCCL itself: keep
    tests on real GPUs for those.

    Example::

        from towerdist.testing import simulate_gpus
        simulate_gpus(2)
        strategy = td.distribute.MirroredStrategy()  # GPU:0 and GPU:1, simulated

    Args:
      n: the number of simulated GPUs (at least 1).

    Raises:
      ValueError: ``n`` is not a positive int.
      RuntimeError: the simulation already runs with another number of GPUs.
    """
    gpu_module.simulate(n)  # the GPU backend's array module from now on


def simulated_gpus_enabled() -> bool:
    """True if towerdist runs on simulated GPUs (``simulate_gpus`` or ``TOWERDIST_SIMULATE_GPUS``).

    Raises:
      ValueError: ``TOWERDIST_SIMULATE_GPUS`` is set but is not a positive number.
    """
    return gpu_module.num_simulated_gpus() > 0


def simulated_gpu_stats(reset: bool = False) -> dict[str, Any]:
    """Counts of the host-blocking synchronisations on the simulated GPUs so far.

    On real GPUs each synchronisation stalls the calling thread until the GPU has drained its
    queue; the simulation runs kernels eagerly, so a test pins their number instead. Counted,
    each once, on the GPU it waits for: ``cupy.cuda.Device(i).synchronize()``,
    ``cupy.cuda.runtime.deviceSynchronize()``, ``Stream.synchronize()``, ``Event.synchronize()``,
    and blocking copies to the host (``ndarray.get()``, ``cupy.asnumpy``, ``item``, ``tolist``,
    ``bool``/``int``/``float``/``complex`` and ``repr``/``str``/``format`` of an array). Not
    counted: ``Stream.done`` and ``Event.done`` (non-blocking queries, counted apart), uploads
    (``cupy.asarray`` of a numpy array, ``set``), and the simulator's own waits.

    Example::

        from towerdist.testing import simulate_gpus, simulated_gpu_stats
        simulate_gpus(2)
        ...
        simulated_gpu_stats(reset=True)         # start counting here
        strategy.run(step)
        stats = simulated_gpu_stats()
        assert stats["host_syncs"] == {0: 0, 1: 0}, stats["host_sync_sites"]

    Args:
      reset: zero the counters after taking the snapshot.

    Beside the synchronisations, ``host_work`` counts the host's other calls into CUDA, each a
    few microseconds of host time on a real GPU: ``kernel_launches``, ``h2d`` (uploads from
    pageable memory), ``h2d_async`` (asynchronous uploads from pinned memory), ``d2h``,
    ``d2d``, ``events_created``, ``event_records``, ``event_waits``, ``device_switches``
    (``cudaSetDevice``), ``pinned_allocs`` and ``nccl_calls``; with
    ``cupy.machine.stats.work_sites = True`` they are also counted by call site
    (``host_work_sites``).

    Returns:
      ``{"host_syncs": {gpu: n}, "host_syncs_by_call": {"Stream.synchronize": n, ...},
      "host_sync_sites": {"path/file.py:LINE (function)": n}, "queries": {gpu: n},
      "host_work": {"kernel_launches": n, ...}, "host_work_sites": {"kind at site": n}}``; a
      site is the innermost caller outside the simulator (a line of towerdist or of the
      caller's code).

    Raises:
      RuntimeError: the simulation is off.
    """
    active = gpu_module.simulated()
    if active is None:
        raise RuntimeError(
            "simulated_gpu_stats() counts the synchronisations of simulated GPUs, but the simulation is off; "
            "call towerdist.testing.simulate_gpus(n) or set TOWERDIST_SIMULATE_GPUS=n first."
        )
    stats: dict[str, Any] = active.machine.stats.snapshot(reset)
    return stats
