"""Physical and logical devices (``td.config``), configured as in TensorFlow.

The host is one physical CPU, which by default is one logical CPU device
(``/device:CPU:0``). To run several CPU replicas, split it into logical devices at
program start, exactly as with TensorFlow::

    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * 4)
    strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2", "CPU:3"])

Each visible CUDA GPU (through cupy) is one physical and one logical GPU device.
The logical devices are fixed once they are first used (listed, or used by a strategy);
changing them afterwards raises ``RuntimeError``, as in TensorFlow.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from towerdist._src import device as device_lib
from towerdist._src.backend import cupy_backend
from towerdist._src.errors import UnimplementedError

__all__ = [
    "LogicalDevice",
    "LogicalDeviceConfiguration",
    "PhysicalDevice",
    "get_logical_device_configuration",
    "list_logical_devices",
    "list_physical_devices",
    "set_logical_device_configuration",
]


class PhysicalDevice(NamedTuple):
    """A physical device, e.g. ``PhysicalDevice(name='/physical_device:CPU:0', device_type='CPU')``."""

    name: str
    device_type: str


class LogicalDevice(NamedTuple):
    """A logical device, e.g. ``LogicalDevice(name='/device:CPU:1', device_type='CPU')``."""

    name: str
    device_type: str


class LogicalDeviceConfiguration(NamedTuple):
    """How to configure one logical device (``tf.config.LogicalDeviceConfiguration``).

    ``memory_limit`` (MiB) and the experimental fields are accepted for GPUs to keep
    TensorFlow code running; towerdist does not split GPUs, so a GPU may have only one.
    """

    memory_limit: int | None = None
    experimental_priority: int | None = None
    experimental_device_ordinal: int | None = None


_lock = threading.Lock()
_cpu_configuration: tuple[LogicalDeviceConfiguration, ...] | None = None
_cpus_by_name = 0  # CPUs usable when named, beyond those configured (reserve_cpus_by_name)
_initialized_by: str | None = None
# In a multi-worker job: (job, this worker's task, every worker's (logical CPUs, GPUs) by task).
_cluster: tuple[str, int, tuple[tuple[int, int], ...]] | None = None


def list_physical_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    """Lists the physical devices, optionally only those of ``device_type`` ('CPU'/'GPU')."""
    wanted = _check_type(device_type)
    devices = [PhysicalDevice("/physical_device:CPU:0", "CPU")]
    devices += [PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(_gpu_count())]
    return [d for d in devices if wanted is None or d.device_type == wanted]


def list_logical_devices(device_type: str | None = None) -> list[LogicalDevice]:
    """Lists the logical devices; after this call they can no longer be reconfigured.

    In one process they are named ``/device:CPU:0``, ... Once the process is a worker of a
    ``MultiWorkerMirroredStrategy`` job, the list holds every worker's devices, named
    ``/job:worker/replica:0/task:<rank>/device:CPU:0`` and so on, this worker's first and
    then the others' in task order, as in TensorFlow.
    """
    wanted = _check_type(device_type)
    mark_initialized("td.config.list_logical_devices()")
    if _cluster is None:
        devices = [LogicalDevice(f"/device:CPU:{i}", "CPU") for i in range(logical_cpu_count())]
        devices += [LogicalDevice(f"/device:GPU:{i}", "GPU") for i in range(_gpu_count())]
    else:
        job, task, counts = _cluster
        devices = []
        for t in [task, *(t for t in range(len(counts)) if t != task)]:
            prefix = f"/job:{job}/replica:0/task:{t}/device"
            cpus, gpus = counts[t]
            devices += [LogicalDevice(f"{prefix}:CPU:{i}", "CPU") for i in range(cpus)]
            devices += [LogicalDevice(f"{prefix}:GPU:{i}", "GPU") for i in range(gpus)]
    return [d for d in devices if wanted is None or d.device_type == wanted]


def set_logical_device_configuration(
    device: PhysicalDevice, logical_devices: Sequence[LogicalDeviceConfiguration] | None
) -> None:
    """Splits a physical device into logical devices (``tf.config.set_logical_device_configuration``).

    Args:
      device: a ``PhysicalDevice`` from :func:`list_physical_devices`.
      logical_devices: one ``LogicalDeviceConfiguration`` per logical device wanted, or
        None to go back to the default (one logical device).

    Raises:
      ValueError: ``device`` is unknown, or the configuration is invalid for it.
      RuntimeError: the logical devices were already used and the configuration changes them.
      UnimplementedError: several logical devices for one GPU (a ``NotImplementedError`` too).
    """
    global _cpu_configuration
    if not isinstance(device, PhysicalDevice) or device not in list_physical_devices():
        raise ValueError(
            f"set_logical_device_configuration() needs a device from "
            f"td.config.list_physical_devices(). Got device={device!r}."
        )
    configs = None if logical_devices is None else tuple(logical_devices)
    if configs is not None:
        _check_configurations(device, configs)
    if device.device_type == "GPU":
        if configs is not None and len(configs) > 1:
            raise UnimplementedError(
                f"towerdist does not split a GPU into several logical GPUs. Got {len(configs)} "
                f"configurations for {device.name}; use one logical device per GPU."
            )
        return  # one logical device per GPU, with or without a memory limit
    with _lock:
        current = _cpu_configuration or (LogicalDeviceConfiguration(),)
        requested = configs or (LogicalDeviceConfiguration(),)
        if requested == current:
            return
        if _initialized_by is not None:
            raise RuntimeError(
                f"Logical devices cannot be changed after they have been initialized (first used "
                f"by {_initialized_by}); there are {len(current)} logical CPUs and the new "
                f"configuration asks for {len(requested)}. Call "
                f"td.config.set_logical_device_configuration() at program start, before creating "
                f"a strategy or listing logical devices."
            )
        _cpu_configuration = configs


def get_logical_device_configuration(device: PhysicalDevice) -> list[LogicalDeviceConfiguration] | None:
    """The configuration set for ``device``, or None if it has the default one."""
    if not isinstance(device, PhysicalDevice) or device not in list_physical_devices():
        raise ValueError(
            f"get_logical_device_configuration() needs a device from "
            f"td.config.list_physical_devices(). Got device={device!r}."
        )
    if device.device_type == "CPU" and _cpu_configuration is not None:
        return list(_cpu_configuration)
    return None


# --- internal helpers used by strategies --------------------------------------------------


def logical_cpu_count() -> int:
    return len(_cpu_configuration) if _cpu_configuration else 1


def mark_initialized(by: str) -> None:
    """Fixes the logical device configuration; ``by`` names the first user, for messages."""
    global _initialized_by
    if _initialized_by is None:
        with _lock:
            if _initialized_by is None:
                _initialized_by = by


def join_cluster(job: str, task: int, counts: list[tuple[int, int]]) -> None:
    """Makes this process task ``task`` of ``job``, whose workers have ``counts`` (logical CPUs, GPUs).

    From now on, local devices are named by that job and task, and ``list_logical_devices``
    lists every worker's devices (``MultiWorkerMirroredStrategy`` over several processes).
    """
    global _cluster
    _cluster = (job, int(task), tuple((int(c), int(g)) for c, g in counts))
    device_lib.join_cluster(job, task)


def local_devices(device_type: str) -> list[device_lib.DeviceSpec]:
    """The local logical devices of one type, in index order."""
    count = logical_cpu_count() if device_type == "CPU" else _gpu_count()
    return [device_lib.DeviceSpec(device_type=device_type, device_index=i) for i in range(count)]


def reserve_cpus_by_name(count: int) -> None:
    """Makes ``CPU:0`` ... ``CPU:<count - 1>`` usable when named, without configuring them.

    For towerdist's pytest plugin: its ``mirrored_strategy`` fixture names the CPUs it runs
    on, while what the program sees — ``list_logical_devices()``, the default devices of a
    ``MirroredStrategy()`` built without names — stays as configured (one CPU by default).
    """
    global _cpus_by_name
    with _lock:
        _cpus_by_name = max(_cpus_by_name, int(count))


def device_exists(spec: device_lib.DeviceSpec) -> bool:
    if not spec.is_local or spec.replica != 0 or spec.task != 0:
        return False
    count = max(logical_cpu_count(), _cpus_by_name) if spec.device_type == "CPU" else _gpu_count()
    return spec.device_index < count


def _gpu_count() -> int:
    return cupy_backend.device_count()


def _check_type(device_type: object) -> str | None:
    if device_type is None:
        return None
    if not isinstance(device_type, str) or device_type.upper() not in device_lib.DEVICE_TYPES:
        raise ValueError(f"device_type must be 'CPU', 'GPU' or None. Got device_type={device_type!r}.")
    return device_type.upper()


def _check_configurations(device: PhysicalDevice, configs: tuple[Any, ...]) -> None:
    if not configs:
        raise ValueError(
            f"set_logical_device_configuration() needs at least one LogicalDeviceConfiguration "
            f"for {device.name} (or None for the default). Got an empty list."
        )
    for i, config in enumerate(configs):
        if not isinstance(config, LogicalDeviceConfiguration):
            raise ValueError(f"logical_devices[{i}] must be a td.config.LogicalDeviceConfiguration. Got {config!r}.")
        if device.device_type == "CPU" and config.memory_limit is not None:
            raise ValueError(
                f"Setting a memory limit on logical CPU devices is not supported. Got "
                f"logical_devices[{i}].memory_limit={config.memory_limit!r}; leave it None."
            )
