"""The strategy a benchmark runs on: ``MirroredStrategy`` on this process, or across MPI ranks.

* no launcher, no ``--gpus``: ``MirroredStrategy`` over ``--replicas`` logical CPUs (the host
  CPU is split into that many at start, as ``td.config.set_logical_device_configuration``
  does; a process that already has at least that many uses the first ones);
* ``--gpus``: ``MirroredStrategy`` over the first ``--replicas`` GPUs (default: all), real or
  simulated (``TOWERDIST_SIMULATE_GPUS``), which the description says;
* under an MPI launcher (``mpiexec -n 2 towerdist bench ...``): ``MultiWorkerMirroredStrategy``
  with ``--replicas`` local replicas per rank (default 1 CPU replica, or every GPU with
  ``--gpus``), and a duplicate of ``COMM_WORLD`` for the timing and the raw-MPI floor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from towerdist._src import config, mpi_runtime
from towerdist._src.backend import cupy_backend, gpu_module
from towerdist._src.backend.cupy_backend import nccl_unavailable_reason
from towerdist._src.cli.command_error import CommandError
from towerdist._src.device import DeviceSpec
from towerdist._src.strategies.mirrored import MirroredStrategy
from towerdist._src.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy
from towerdist._src.strategies.strategy import Strategy

__all__ = ["BenchTarget", "make_target"]

_SIMULATE_HINT = "set TOWERDIST_SIMULATE_GPUS=2 to try the GPU code paths on simulated GPUs"


@dataclasses.dataclass
class BenchTarget:
    """A strategy to benchmark and what the table's header says about it.

    Attributes:
      strategy: the strategy (``MirroredStrategy`` or ``MultiWorkerMirroredStrategy``).
      devices: this process's replica devices.
      description: e.g. ``"MirroredStrategy over 2 logical CPUs (CPU:0, CPU:1)"``.
      num_replicas: the replicas in sync (every rank's).
      simulated: the devices are simulated GPUs.
      comm: a duplicate of ``COMM_WORLD`` under an MPI launcher, else None.
      rank: this process's MPI rank (0 without a launcher).
      ranks: the MPI job's size (1 without a launcher).
    """

    strategy: Strategy
    devices: tuple[DeviceSpec, ...]
    description: str
    num_replicas: int
    simulated: bool = False
    comm: Any = None
    rank: int = 0
    ranks: int = 1

    @property
    def on_gpus(self) -> bool:
        """True when the replicas run on GPUs (real or simulated)."""
        return bool(self.devices) and self.devices[0].device_type == "GPU"

    def close(self) -> None:
        """Frees the MPI communicator (the strategy's threads end with it)."""
        if self.comm is not None:
            self.comm.Free()
            self.comm = None


def _gpu_devices(replicas: int | None) -> tuple[DeviceSpec, ...]:
    count = cupy_backend.device_count()
    if count == 0:
        reason = nccl_unavailable_reason() or "no CUDA GPU is visible"
        raise CommandError(f"--gpus needs at least one GPU, but none is usable ({reason}); {_SIMULATE_HINT}.")
    wanted = count if replicas is None else replicas
    if wanted > count:
        raise CommandError(f"--gpus --replicas {wanted} needs {wanted} GPUs, but {count} are visible.")
    return tuple(DeviceSpec(device_type="GPU", device_index=i) for i in range(wanted))


def _cpu_devices(replicas: int) -> tuple[DeviceSpec, ...]:
    if config.logical_cpu_count() < replicas:
        cpu = config.list_physical_devices("CPU")[0]
        try:
            config.set_logical_device_configuration(cpu, [config.LogicalDeviceConfiguration()] * replicas)
        except RuntimeError as error:
            raise CommandError(f"cannot make {replicas} logical CPUs in this process: {error}") from error
    return tuple(DeviceSpec(device_type="CPU", device_index=i) for i in range(replicas))


def _describe(kind: str, devices: tuple[DeviceSpec, ...], simulated: bool) -> str:
    names = ", ".join(d.short_name for d in devices)
    if devices[0].device_type == "GPU":
        what = "SIMULATED GPU" if simulated else "GPU"
    else:
        what = "logical CPU"
    what += "" if len(devices) == 1 else "s"
    if simulated:
        what += " (towerdist.testing: numpy on the CPU; not GPU speed)"
    return f"{kind} over {len(devices)} {what} ({names})"


def make_target(replicas: int | None, gpus: bool) -> BenchTarget:
    """The strategy for ``--replicas`` and ``--gpus``, on this process or across MPI ranks.

    Args:
      replicas: replicas (per rank under MPI); None for the default (2 CPUs, all GPUs, or 1
        CPU replica per rank under MPI).
      gpus: run on GPUs (real or simulated).

    Raises:
      CommandError: the devices asked for do not exist or cannot be made.
    """
    simulated = gpu_module.simulated() is not None
    if mpi_runtime.launcher_size() <= 1:
        devices = _gpu_devices(replicas) if gpus else _cpu_devices(2 if replicas is None else replicas)
        strategy: Strategy = MirroredStrategy([d.name for d in devices])
        return BenchTarget(
            strategy, devices, _describe("MirroredStrategy", devices, simulated), len(devices), simulated and gpus
        )
    world = mpi_runtime.world()
    if world is None:  # launcher_size() > 1 always starts MPI; this keeps the types honest
        raise CommandError("an MPI launcher was detected but MPI did not start.")
    devices = _gpu_devices(replicas) if gpus else _cpu_devices(1 if replicas is None else replicas)
    strategy = MultiWorkerMirroredStrategy._from_local_devices([d.name for d in devices])
    description = _describe("MultiWorkerMirroredStrategy", devices, simulated and gpus)
    description += f" on each of {world.size} MPI ranks"
    return BenchTarget(
        strategy,
        devices,
        description,
        len(devices) * world.size,
        simulated and gpus,
        world.MPI.COMM_WORLD.Dup(),
        world.rank,
        world.size,
    )
