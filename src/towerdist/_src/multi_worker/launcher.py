"""Starting and stopping MPI jobs from Python: finding ``mpiexec``, ending a job's processes.

Used by the ``towerdist`` command's ``--mpi`` modes, the benchmarks and the test suite, which
run ``mpiexec -n N python ...`` as a child process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["find_mpiexec", "kill_process_group"]


def find_mpiexec() -> str | None:
    """The ``mpiexec`` next to this Python (the mpich extra's), else the one on ``PATH``, else None."""
    beside = Path(sys.executable).parent / "mpiexec"  # not resolved: a virtualenv's python is a symlink
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def kill_process_group(process: subprocess.Popen[Any]) -> None:
    """Ends a job started in its own process group (``start_new_session=True``): mpiexec, its proxies, the ranks."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
