"""The simulated GPUs: a strict stand-in, in numpy on the CPU, for the parts of cupy and NCCL towerdist uses.

``cupy.module(n)`` builds a cupy-like module over ``n`` simulated GPUs; the rules live with the
concepts they govern (``cuda``: devices, streams, events, ordering; ``memory``: allocations and
the pool; ``array``: arrays and kernel launches; ``nccl`` and ``nccl_files``: NCCL within and
across processes; ``stats``: host synchronisations). ``backend/gpu_module.py`` makes such a
module the GPU backend's array module when simulated GPUs are asked for
(``towerdist.testing.simulate_gpus(n)`` or ``TOWERDIST_SIMULATE_GPUS=n``). Nothing here is
imported otherwise.
"""
