"""``HierarchicalCopyAllReduce``: a two-level tree all-reduce, correct for any device count.

The devices are split into two halves (the first ``ceil(n/2)`` and the rest). Each half
sums onto its root, the two roots exchange their sums, and each root sends the total
back to its half. Pack ``p`` uses the ``p``-th device of each half as its root, so with
several packs the work rotates over the devices. Unlike TensorFlow's version, an odd
device count does not drop the last device.
"""

from __future__ import annotations

from typing import Any

from towerdist._src import backend
from towerdist._src.cross_device_ops.all_reduce_ops import AllReduceCrossDeviceOps
from towerdist._src.cross_device_ops.base import library_algorithm
from towerdist._src.device import DeviceSpec

__all__ = ["HierarchicalCopyAllReduce"]


@library_algorithm
class HierarchicalCopyAllReduce(AllReduceCrossDeviceOps):
    """Hierarchical-copy all-reduce (``tf.distribute.HierarchicalCopyAllReduce``).

    Args:
      num_packs: how many packs each dtype's values are concatenated and cut into;
        0 reduces every value on its own.

    Example:
      >>> strategy = td.distribute.MirroredStrategy(
      ...     ["CPU:0", "CPU:1", "CPU:2"], cross_device_ops=td.distribute.HierarchicalCopyAllReduce())
    """

    def __init__(self, num_packs: int = 1) -> None:
        if not isinstance(num_packs, int) or num_packs < 0:
            raise ValueError(f"HierarchicalCopy requires num_packs >= 0, but {num_packs} is specified")
        super().__init__(num_packs)

    def _all_reduce_pack(self, devices: tuple[DeviceSpec, ...], components: list[Any], pack_index: int) -> list[Any]:
        n = len(devices)
        if n == 1:
            return [backend.for_device(devices[0]).copy(components[0], devices[0])]
        half = (n + 1) // 2
        groups = [list(range(half)), list(range(half, n))]
        roots = [group[pack_index % len(group)] for group in groups]
        sums = []
        for group, root in zip(groups, roots):
            impl = backend.for_device(devices[root])
            sums.append(impl.add_n([impl.to_device(components[j], devices[root]) for j in group]))
        root0, root1 = devices[roots[0]], devices[roots[1]]
        impl0 = backend.for_device(root0)
        total0 = impl0.add_n([sums[0], impl0.to_device(sums[1], root0)])
        total1 = backend.for_device(root1).to_device(total0, root1)
        totals = [total0, total1]
        out = []
        for j, device in enumerate(devices):
            source = totals[0 if j < half else 1]
            out.append(backend.for_device(device).to_device(source, device))
        return out
