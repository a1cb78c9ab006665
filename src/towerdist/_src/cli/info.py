"""``towerdist info``: what towerdist sees on this machine, and what it would choose.

Printed for people, or with ``--json`` as one JSON object with these keys (stable; a value
that does not apply is ``null``):

``towerdist``
    towerdist's version (str).
``python``
    ``{"version": str, "implementation": str, "executable": str, "platform": str}``.
``packages``
    ``{"numpy", "optree", "cupy", "mpi4py", "tqdm"}``: each the installed version (str) or
    ``null`` when not installed. Found from the installed distributions; nothing is imported.
``devices``
    ``{"physical": [str], "logical": [str]}``: ``td.config.list_physical_devices()`` and
    ``td.config.list_logical_devices()`` names.
``gpus``
    ``{"count": int, "simulated": bool, "names": [str]}``: ``simulated`` is true when the
    GPUs are towerdist's simulated ones (``TOWERDIST_SIMULATE_GPUS`` or
    ``towerdist.testing.simulate_gpus``): numpy arrays on the CPU, not real GPUs.
``nccl``
    ``{"available": bool, "simulated": bool, "reason": str | null, "install": str | null}``:
    ``reason`` says why NCCL is unavailable, ``install`` which extra would provide it.
``mpi``
    ``{"mpi4py": str | null, "mpiexec": str | null, "launcher_size": int,
    "under_launcher": bool, "install": str | null, "rank": int | null, "size": int | null,
    "library": str | null, "ranks": [{"rank": int, "host": str, "pid": int, "gpus": int}] | null,
    "error": str | null}``. ``launcher_size`` is how many processes an MPI launcher says it
    started (1 without one); only when it is above 1 does the command start MPI (and fill in
    ``rank``, ``size``, ``library`` and ``ranks``); otherwise mpi4py is not even imported.
``mirrored_strategy``
    ``{"devices": [str], "cross_device_ops": str, "reason": str}``: the devices
    ``td.distribute.MirroredStrategy()`` would use and the cross-device ops it would choose,
    with the reason.

Under an MPI launcher every rank gathers its facts and rank 0 alone prints.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import sys
from typing import Any

from towerdist._src import config, mpi_runtime
from towerdist._src.backend import cupy_backend, simulation
from towerdist._src.backend.cupy_backend import nccl_unavailable_reason
from towerdist._src.cli.command_error import CommandError
from towerdist._src.cli.mpi_launch import MPI_INSTALL, find_mpiexec
from towerdist._src.cross_device_ops.select import choose_cross_device_ops
from towerdist._src.errors import MissingDependencyError
from towerdist._src.version import __version__

__all__ = ["CUDA_INSTALL", "format_info", "gather_info", "print_info"]

CUDA_INSTALL = 'pip install "towerdist[cuda12]" (CUDA 12) or "towerdist[cuda13]" (CUDA 13)'
_PACKAGES = ("numpy", "optree", "cupy", "mpi4py", "tqdm")


def _version(package: str) -> str | None:
    """The installed version of the import package ``package``, None if it is missing (not imported)."""
    if importlib.util.find_spec(package) is None:
        return None
    names = [package]
    if package == "cupy":  # cupy comes as cupy-cuda12x, cupy-cuda13x, ...: ask which (a slow scan, so only here)
        names = importlib.metadata.packages_distributions().get(package, names)
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "installed (version unknown)"


def _gpus() -> dict[str, Any]:
    try:
        simulated = simulation.simulated_gpus_enabled()
    except ValueError as error:  # TOWERDIST_SIMULATE_GPUS is malformed
        raise CommandError(str(error)) from error
    count = cupy_backend.device_count()
    names = []
    for i in range(count):
        if simulated:
            names.append(f"GPU:{i} (simulated)")
            continue
        try:
            name = cupy_backend.xp.cuda.runtime.getDeviceProperties(i)["name"]
            names.append(f"GPU:{i} ({name.decode() if isinstance(name, bytes) else name})")
        except Exception:  # the name is decoration: any driver error leaves the plain one
            names.append(f"GPU:{i}")
    return {"count": count, "simulated": simulated, "names": names}


def _nccl(simulated: bool) -> dict[str, Any]:
    reason = nccl_unavailable_reason()
    # nccl_unavailable_reason starts with "cupy" exactly when a package is missing (not a GPU).
    install = CUDA_INSTALL if reason is not None and reason.startswith("cupy") else None
    return {
        "available": reason is None,
        "simulated": simulated and reason is None,
        "reason": reason,
        "install": install,
    }


def _mpi(gpu_count: int) -> dict[str, Any]:
    mpi4py = _version("mpi4py")
    mpiexec = find_mpiexec()
    size = mpi_runtime.launcher_size()
    facts: dict[str, Any] = {
        "mpi4py": mpi4py,
        "mpiexec": mpiexec,
        "launcher_size": size,
        "under_launcher": size > 1,
        "install": MPI_INSTALL
        if mpi4py is None
        else ('pip install "towerdist[mpi-mpich]" (an mpiexec), or use your MPI\'s' if mpiexec is None else None),
        "rank": None,
        "size": None,
        "library": None,
        "ranks": None,
        "error": None,
    }
    if size <= 1:
        return facts  # no launcher: MPI is not started (nor mpi4py.MPI imported)
    try:
        world = mpi_runtime.world()
    except (MissingDependencyError, RuntimeError) as error:
        facts["error"] = str(error)
        return facts
    if world is None:
        return facts
    comm = world.MPI.COMM_WORLD.Dup()
    try:
        ranks = comm.allgather(
            {"rank": world.rank, "host": socket.gethostname(), "pid": os.getpid(), "gpus": gpu_count}
        )
    finally:
        comm.Free()
    facts.update(
        rank=world.rank,
        size=world.size,
        ranks=ranks,
        library=" ".join(world.MPI.Get_library_version().splitlines()[0].split()),
    )
    return facts


def gather_info() -> dict[str, Any]:
    """The facts ``towerdist info`` reports, as the JSON object the module docstring describes.

    Raises:
      CommandError: ``TOWERDIST_SIMULATE_GPUS`` is malformed.
    """
    gpus = _gpus()
    # MirroredStrategy() with no devices takes every GPU, else every logical CPU.
    default_devices = config.local_devices("GPU") or config.local_devices("CPU")
    ops, reason = choose_cross_device_ops(default_devices)
    return {
        "towerdist": __version__,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "platform": platform.platform(),
        },
        "packages": {name: _version(name) for name in _PACKAGES},
        "devices": {
            "physical": [d.name for d in config.list_physical_devices()],
            "logical": [d.name for d in config.list_logical_devices()],
        },
        "gpus": gpus,
        "nccl": _nccl(gpus["simulated"]),
        "mpi": _mpi(gpus["count"]),
        "mirrored_strategy": {
            "devices": [d.short_name for d in default_devices],
            "cross_device_ops": type(ops).__name__,
            "reason": reason,
        },
    }


def _or_missing(version: str | None) -> str:
    return "not installed" if version is None else version


def format_info(info: dict[str, Any]) -> str:
    """``info`` (from ``gather_info``) as the text ``towerdist info`` prints."""
    python, gpus, nccl, mpi, mirrored = (
        info["python"],
        info["gpus"],
        info["nccl"],
        info["mpi"],
        info["mirrored_strategy"],
    )
    packages = ", ".join(f"{name} {_or_missing(version)}" for name, version in info["packages"].items())
    if gpus["count"] == 0:
        gpu_text = "none"
    elif gpus["simulated"]:
        gpu_text = (
            f"{gpus['count']} SIMULATED (towerdist.testing / TOWERDIST_SIMULATE_GPUS: numpy arrays on the "
            f"CPU that enforce GPU rules; not real GPUs): {', '.join(gpus['names'])}"
        )
    else:
        gpu_text = f"{gpus['count']}: {', '.join(gpus['names'])}"
    if nccl["available"]:
        nccl_text = "available" + (" (SIMULATED)" if nccl["simulated"] else "")
    else:
        nccl_text = f"unavailable: {nccl['reason']}"
    mpi_lines = [f"mpi4py {_or_missing(mpi['mpi4py'])}; mpiexec {mpi['mpiexec'] or 'not found'}"]
    if mpi["install"]:
        mpi_lines.append(f"to install: {mpi['install']}")
    if mpi["error"]:
        mpi_lines.append(f"error: {mpi['error']}")
    elif mpi["under_launcher"]:
        mpi_lines.append(
            f"launcher: {mpi['launcher_size']} processes; this is rank {mpi['rank']} of {mpi['size']} "
            f"({mpi['library']})"
        )
        mpi_lines += [f"  rank {r['rank']}: host {r['host']}, pid {r['pid']}, {r['gpus']} GPUs" for r in mpi["ranks"]]
    else:
        mpi_lines.append(
            "no launcher: this process is one worker (MPI not started); `mpiexec -n 2 towerdist info` shows the ranks"
        )
    lines = [
        f"towerdist {info['towerdist']}",
        f"Python    {python['version']} ({python['implementation']}, {python['executable']})",
        f"platform  {python['platform']}",
        f"packages  {packages}",
        "",
        "devices",
        f"  physical  {', '.join(info['devices']['physical'])}",
        f"  logical   {', '.join(info['devices']['logical'])}",
        f"  GPUs      {gpu_text}",
        "",
        f"NCCL      {nccl_text}",
        *(["          to install: " + nccl["install"]] if nccl["install"] and nccl["install"] not in nccl_text else []),
        f"MPI       {mpi_lines[0]}",
        *(f"          {line}" for line in mpi_lines[1:]),
        "",
        "MirroredStrategy()",
        f"  devices           {', '.join(mirrored['devices'])}",
        f"  cross-device ops  {mirrored['cross_device_ops']}: {mirrored['reason']}",
    ]
    return "\n".join(lines)


def print_info(as_json: bool) -> None:
    """Prints ``towerdist info`` (as JSON with ``as_json``); under MPI rank 0 alone prints.

    Raises:
      CommandError: ``TOWERDIST_SIMULATE_GPUS`` is malformed.
    """
    info = gather_info()
    if info["mpi"]["rank"] not in (None, 0):
        return
    print(json.dumps(info, indent=2) if as_json else format_info(info))
