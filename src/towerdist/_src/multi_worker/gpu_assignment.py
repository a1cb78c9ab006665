"""Which GPUs each worker of a host uses: one set per worker, never shared.

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"), so
workers started on one host (``mpiexec -n 2 python train.py`` on a 2-GPU machine) must not
all take GPU 0, as each did when every worker used every GPU it could see. The workers of
a host (MPI's shared-memory split, ``Communicator.local_rank``/``local_size``) compare the
GPUs they see, named by their PCI address (else by ``CUDA_VISIBLE_DEVICES``' entries, else
by index):

* every worker sees different GPUs (``CUDA_VISIBLE_DEVICES`` set per rank, as TensorFlow
  expects, or a container per rank): each uses all of its own;
* every worker sees the same GPUs: they are split in contiguous blocks by local rank
  (``GPU:0`` for local rank 0, ``GPU:1`` for local rank 1, ... as Horovod and PyTorch DDP
  place them), ``visible // local_size`` GPUs each (the rest unused);
* anything else (some GPUs shared, or fewer GPUs than workers) raises ``ValueError``
  naming the host, the workers and their GPUs.

Devices passed to the strategy explicitly are used as they are.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["assign_gpus", "visible_gpu_names"]

logger = logging.getLogger("towerdist")


def visible_gpu_names(count: int, properties: Callable[[int], dict[str, Any]] | None = None) -> list[str]:
    """Host-wide names of the ``count`` GPUs this process sees.

    A GPU's PCI address (``pci:<domain>:<bus>:<device>``, from ``properties(i)``, cupy's
    ``cudaGetDeviceProperties``) names it on the host whatever each process's numbering;
    without it, ``CUDA_VISIBLE_DEVICES``' entries, else the indices.
    """
    if properties is not None:
        try:
            names = []
            for index in range(count):
                found = properties(index)
                names.append(f"pci:{found['pciDomainID']:04x}:{found['pciBusID']:02x}:{found['pciDeviceID']:02x}")
            return names
        except Exception:  # noqa: S110  (no properties here, e.g. simulated GPUs: the environment's names)
            pass
    listed = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if len(listed) >= count:
        return listed[:count]
    return [str(index) for index in range(count)]


def assign_gpus(local_rank: int, everyone: Sequence[Sequence[str]]) -> tuple[int, ...]:
    """The indices of the visible GPUs worker ``local_rank`` of this host uses.

    Args:
      local_rank: this worker's rank among the workers of its host.
      everyone: each local worker's visible GPU names (``visible_gpu_names``), in local rank order.

    Raises:
      ValueError: the workers cannot each have GPUs of their own (see the module doc).
    """
    mine = list(everyone[local_rank])
    workers = len(everyone)
    if workers == 1:
        return tuple(range(len(mine)))
    seen = [set(names) for names in everyone]
    if sum(len(names) for names in seen) == len(set().union(*seen)):
        return tuple(range(len(mine)))  # disjoint: each worker was given its own (CUDA_VISIBLE_DEVICES)
    if all(list(names) == mine for names in everyone):
        per_worker = len(mine) // workers
        if per_worker == 0:
            raise ValueError(
                f"MultiWorkerMirroredStrategy: {workers} workers run on host {socket.gethostname()!r}, which has "
                f"{len(mine)} visible GPU(s) ({', '.join(mine) or 'none'}); NCCL needs a GPU of its own for each "
                f"worker. Start at most {len(mine)} process(es) per host, or pass CPU devices."
            )
        first = local_rank * per_worker
        chosen = tuple(range(first, first + per_worker))
        unused = len(mine) - per_worker * workers
        logger.info(
            "towerdist: worker %d of host %s uses GPU(s) %s of the %d visible ones (%d worker(s) on this host%s).",
            local_rank, socket.gethostname(), ", ".join(map(str, chosen)), len(mine), workers,
            f"; {unused} GPU(s) left unused" if unused else "",
        )  # fmt: skip
        return chosen
    counts = collections.Counter(name for names in seen for name in names)
    shared = sorted(name for name, count in counts.items() if count > 1)
    listing = "; ".join(f"local rank {r}: {', '.join(names) or 'none'}" for r, names in enumerate(everyone))
    raise ValueError(
        f"MultiWorkerMirroredStrategy: the workers on host {socket.gethostname()!r} see overlapping GPU sets "
        f"({listing}); GPU(s) {', '.join(shared)} would be used by two workers, which NCCL refuses. Give every "
        f"worker the same CUDA_VISIBLE_DEVICES (towerdist then splits the GPUs by local rank) or disjoint ones."
    )
