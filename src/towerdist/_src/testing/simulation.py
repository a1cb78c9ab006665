"""``towerdist.testing.simulate_gpus``: run towerdist's GPU code paths on simulated GPUs.

The simulated GPUs are numpy arrays on the CPU that follow the rules of real GPUs (see
``simulated_cupy``): code that runs on them places data and launches work the way it
would on real GPUs, and code that breaks a rule fails here as it would there.
"""

from __future__ import annotations

from towerdist._src.backend import cupy_backend
from towerdist._src.cross_device_ops import nccl_all_reduce
from towerdist._src.testing import simulated_cupy

__all__ = ["simulate_gpus", "simulated_gpus_enabled"]


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
    GPUs; NCCL buffers must stay alive until ``groupEnd``; a communicator cannot be used
    from two threads at once; data written on one stream cannot be used on another (another
    thread's stream with ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``) until an event or a
    synchronisation orders the two. It proves placement and ordering logic, not speed, and it
    does not run NCCL itself: keep tests on real GPUs for those.

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
    simulated_cupy.enable(n)
    # What was looked up before (no cupy, no GPU) is looked up again, now on the simulation.
    cupy_backend._import.cache_clear()
    cupy_backend.device_count.cache_clear()
    nccl_all_reduce.nccl_unavailable_reason.cache_clear()


def simulated_gpus_enabled() -> bool:
    """True if towerdist runs on simulated GPUs (``simulate_gpus`` or ``TOWERDIST_SIMULATE_GPUS``).

    Raises:
      ValueError: ``TOWERDIST_SIMULATE_GPUS`` is set but is not a positive number.
    """
    return simulated_cupy.num_simulated_gpus() > 0
