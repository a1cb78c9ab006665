"""Choosing the default cross-device ops for a device set (and saying why)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from towerdist._src.backend import gpu_module
from towerdist._src.backend.cupy_backend import nccl_unavailable_reason
from towerdist._src.cross_device_ops.base import CrossDeviceOps
from towerdist._src.cross_device_ops.hierarchical_copy import HierarchicalCopyAllReduce
from towerdist._src.cross_device_ops.nccl_all_reduce import NcclAllReduce
from towerdist._src.cross_device_ops.shared_memory import SharedMemoryAllReduce
from towerdist._src.device import DeviceSpec

__all__ = ["select_cross_device_ops"]

logger = logging.getLogger("towerdist")


def choose_cross_device_ops(devices: Sequence[DeviceSpec]) -> tuple[CrossDeviceOps, str]:
    """The default cross-device ops for ``devices`` and the reason for the choice.

    * all GPUs and NCCL usable -> ``NcclAllReduce``;
    * all GPUs, no NCCL -> ``HierarchicalCopyAllReduce``;
    * any CPU device -> ``SharedMemoryAllReduce`` (the devices share host memory).
    """
    if devices and all(d.device_type == "GPU" for d in devices):
        reason = nccl_unavailable_reason()
        if reason is None:
            simulated = " (SIMULATED GPUs and NCCL: towerdist.testing)" if gpu_module.simulated() else ""
            return NcclAllReduce(num_packs=1), f"all devices are GPUs and NCCL is available{simulated}"
        return HierarchicalCopyAllReduce(num_packs=1), f"all devices are GPUs but NCCL is unavailable: {reason}"
    return SharedMemoryAllReduce(), "the devices include CPUs, which share host memory"


def select_cross_device_ops(devices: Sequence[DeviceSpec], session_config: object = None) -> CrossDeviceOps:
    """The default cross-device ops for ``devices``; logs the choice and its reason."""
    del session_config  # accepted for TensorFlow compatibility
    ops, reason = choose_cross_device_ops(devices)
    logger.info("Using %r for %d device(s): %s.", ops, len(devices), reason)
    return ops
