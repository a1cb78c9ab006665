"""Testing aids: run GPU code on simulated GPUs, on machines without GPUs.

``simulate_gpus(n)`` (or ``TOWERDIST_SIMULATE_GPUS=n`` in the environment) makes
towerdist see ``n`` simulated GPUs: numpy arrays on the CPU that enforce the rules of real
GPUs (the current device of each thread, no implicit host copies, NCCL's rules), so
GPU-bound code and tests run on CPU-only machines and fail where real GPUs would. The
simulation proves placement and ordering logic, not speed or NCCL itself.
``simulated_gpu_stats()`` counts the host synchronisations the simulated GPUs saw (free
here, costly on real GPUs), by GPU, by call and by the line that made them.
"""

from towerdist._src.backend.simulation import simulate_gpus as simulate_gpus
from towerdist._src.backend.simulation import simulated_gpu_stats as simulated_gpu_stats
from towerdist._src.backend.simulation import simulated_gpus_enabled as simulated_gpus_enabled

__all__ = ["simulate_gpus", "simulated_gpu_stats", "simulated_gpus_enabled"]
