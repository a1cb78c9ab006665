"""Device names: parsing, canonical form, and the ``td.device(...)`` scope.

TensorFlow spells one device many ways: ``"GPU:1"``, ``"/gpu:1"``, ``"/device:GPU:1"``,
``"/job:localhost/replica:0/task:0/device:GPU:1"``. All of them name the same
:class:`DeviceSpec`, whose canonical string is the last form. towerdist knows two device
types, ``CPU`` (numpy, host memory; split into logical CPUs by ``td.config``) and ``GPU``
(cupy).

A process that joins a multi-worker job (``MultiWorkerMirroredStrategy`` over several
processes) names its own devices as TensorFlow does then, ``/job:worker/replica:0/task:<rank>/...``
(:func:`join_cluster`); both that name and the ``/job:localhost`` one parse to the same local
device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from towerdist._src import thread_state
from towerdist._src.backend import cupy_backend  # imports no cupy until a GPU is used

if TYPE_CHECKING:
    from towerdist._src.type_aliases import DeviceLike  # it names DeviceSpec: only named here

__all__ = ["DeviceSpec", "activate", "canonicalize", "current", "device", "join_cluster", "parse"]

DEVICE_TYPES = ("CPU", "GPU")
_LOCAL_JOB = "localhost"
_DEVICE_RE = re.compile(r"^(?:device:)?([A-Za-z_]+):(\d+|\*)$")

# (job, task) this process's devices are named with once it is a worker of a multi-worker job.
_process_task: tuple[str, int] | None = None


@dataclasses.dataclass(frozen=True, order=True)
class DeviceSpec:
    """A fully specified device: ``/job:<job>/replica:<r>/task:<t>/device:<TYPE>:<index>``."""

    job: str = _LOCAL_JOB
    replica: int = 0
    task: int = 0
    device_type: str = "CPU"
    device_index: int = 0

    @property
    def name(self) -> str:
        """The canonical device string (a local device of a multi-worker job: its job and task there)."""
        job, task = self.job, self.task
        if _process_task is not None and job == _LOCAL_JOB and task == 0 and self.replica == 0:
            job, task = _process_task
        return f"/job:{job}/replica:{self.replica}/task:{task}/device:{self.device_type}:{self.device_index}"

    @property
    def short_name(self) -> str:
        """A compact name for messages and reprs, e.g. ``'/cpu:0'``."""
        if self.job == _LOCAL_JOB and self.replica == 0 and self.task == 0:
            return f"/{self.device_type.lower()}:{self.device_index}"
        return self.name

    @property
    def is_local(self) -> bool:
        return self.job == _LOCAL_JOB

    def __str__(self) -> str:
        return self.name


HOST = DeviceSpec()
"""The host CPU (``/job:localhost/replica:0/task:0/device:CPU:0``), where numpy arrays live."""


def parse(spec: DeviceLike) -> DeviceSpec:
    """Parses a device given as a string, a ``DeviceSpec`` or a logical-device object.

    Missing fields take their defaults (job ``localhost``, replica 0, task 0, type CPU,
    index 0), so ``parse("GPU:1").name == "/job:localhost/replica:0/task:0/device:GPU:1"``.

    Raises:
      ValueError: the string is not a device name, or names a device type other than CPU/GPU.
      TypeError: ``spec`` is not a string, a DeviceSpec or a device object.
    """
    if isinstance(spec, DeviceSpec):
        return spec
    name = getattr(spec, "name", None) if not isinstance(spec, str) else spec
    if not isinstance(name, str):
        raise TypeError(
            f"A device must be given as a string such as 'GPU:0' or '/cpu:1', a DeviceSpec or a "
            f"logical device object. Got {spec!r} of type {type(spec).__name__}."
        )
    return _parse_string(name)


def _parse_string(text: str) -> DeviceSpec:
    fields: dict[str, Any] = {}
    parts = [p for p in text.strip().split("/") if p]
    if not parts:
        raise ValueError(f"Invalid device name {text!r}: it is empty. Use e.g. 'CPU:0' or '/gpu:1'.")
    for part in parts:
        key, _, value = part.partition(":")
        if key in ("job", "replica", "task") and value:
            if key == "job":
                fields["job"] = value
            elif value.isdigit():
                fields[key] = int(value)
            else:
                raise _invalid(text, f"{key} must be a non-negative integer, got {value!r}")
            continue
        match = _DEVICE_RE.match(part)
        if match is None:
            raise _invalid(text, f"cannot understand the component {part!r}")
        device_type, index = match.group(1).upper(), match.group(2)
        if device_type not in DEVICE_TYPES:
            raise ValueError(
                f"Unsupported device type {device_type!r} in device name {text!r}; towerdist "
                f"places data on CPU (numpy) and GPU (cupy) devices only."
            )
        fields["device_type"] = device_type
        fields["device_index"] = 0 if index == "*" else int(index)
    own = (fields.get("job"), fields.get("task", 0)) == _process_task and fields.get("replica", 0) == 0
    if _process_task is not None and own:
        del fields["job"]  # this process's own name in its multi-worker job: a local device
        fields.pop("task", None)
    return DeviceSpec(**fields)


def _invalid(text: str, why: str) -> ValueError:
    return ValueError(
        f"Invalid device name {text!r}: {why}. Use a form such as 'CPU:0', '/gpu:1', "
        f"'/device:GPU:1' or '/job:localhost/replica:0/task:0/device:CPU:0'."
    )


def join_cluster(job: str, task: int) -> None:
    """Names this process's devices ``/job:<job>/replica:0/task:<task>/...`` from now on.

    Called when the process becomes a worker of a multi-worker job; as in TensorFlow, the
    renaming lasts for the rest of the process, and a local device keeps its identity
    (``parse`` maps both names to it).
    """
    global _process_task
    _process_task = (job, int(task))


def canonicalize(spec: DeviceLike) -> str:
    """Returns the canonical device string of ``spec`` (see :func:`parse`)."""
    return parse(spec).name


_NO_GPU = contextlib.nullcontext()


def activate(spec: DeviceSpec | None) -> contextlib.AbstractContextManager[Any]:
    """A context making ``spec``'s GPU cupy's current device in this thread (nothing for CPUs).

    cupy allocates and launches on the thread's current device, so every scope that names a
    GPU (``td.device``, a replica's thread, an update context) enters this too.
    """
    if spec is None or spec.device_type != "GPU":
        return _NO_GPU
    if spec.device_index >= cupy_backend.device_count():
        return _NO_GPU  # no such GPU: the scope only names it; creating an array there raises
    manager: contextlib.AbstractContextManager[Any] = cupy_backend.on_device(spec)
    return manager


def current() -> DeviceSpec | None:
    """The device of the innermost ``td.device`` scope of this thread, or None."""
    devices = thread_state.state.devices
    return devices[-1] if devices else None


@contextmanager
def device(device_name: DeviceLike | None) -> Iterator[None]:
    """Places new arrays created by towerdist helpers on ``device_name`` within the block.

    ``td.device(None)`` clears the device scope. The scope is per thread, like
    ``tf.device``; replica threads run inside the scope of their replica's device.

    Example:
      >>> import towerdist as td
      >>> with td.device("CPU:0"):
      ...     x = td.constant([1.0, 2.0])
    """
    spec = None if device_name is None else parse(device_name)
    stack = thread_state.state.devices
    stack.append(spec)
    depth = len(stack)
    try:
        with activate(spec):
            yield
    finally:
        # Restore exactly the entry we pushed, even if the block left the stack unbalanced.
        del thread_state.state.devices[depth - 1 :]
