"""``--mpi``: the same ``towerdist`` command re-launched as an MPI job, and bounded.

``towerdist bench allreduce --mpi`` runs ``mpiexec -n RANKS python -m towerdist bench
allreduce ...`` (without ``--mpi``) with this Python, and the ranks notice the launcher
(``mpi_runtime.launcher_size``) and run ``MultiWorkerMirroredStrategy``. The ``mpiexec``
is the one next to ``sys.executable`` (the ``mpich`` wheel of ``towerdist[mpi-mpich]`` puts
it in the virtualenv's ``bin/``), else the one on ``PATH``. The job runs in its own process
group; past ``--timeout`` seconds the whole group is killed, so a hung rank ends the
command instead of blocking it. Rank 0's output goes straight to this process's stdout.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from towerdist._src.cli.command_error import CommandError
from towerdist._src.multi_worker.launcher import find_mpiexec, kill_process_group

__all__ = ["MPI_INSTALL", "find_mpiexec", "run_under_mpiexec"]

MPI_INSTALL = (
    'pip install "towerdist[mpi]" (mpi4py, with your cluster\'s MPI) or "towerdist[mpi-mpich]" '
    "(mpi4py and MPICH, for laptops and CI)"
)


def run_under_mpiexec(ranks: int, arguments: list[str], timeout: float) -> None:
    """Runs ``python -m towerdist *arguments`` as ``ranks`` MPI processes and waits for them.

    Args:
      ranks: how many processes (at least 2).
      arguments: the subcommand and its options, without ``--mpi``.
      timeout: seconds before the job is killed.

    Raises:
      CommandError: mpi4py or mpiexec is missing, the job failed, or it ran past ``timeout``.
    """
    if importlib.util.find_spec("mpi4py") is None:
        raise CommandError(f"--mpi needs mpi4py, which is not installed; {MPI_INSTALL}.")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise CommandError(
            f"--mpi needs an MPI launcher, but there is no mpiexec next to {sys.executable} nor on PATH; "
            f'pip install "towerdist[mpi-mpich]" installs one, or start the job yourself: '
            f"mpiexec -n {ranks} {sys.executable} -m towerdist {' '.join(arguments)}."
        )
    command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "towerdist", *arguments]
    print(f"# launching: {' '.join(command)}", flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPIEXEC_TIMEOUT=str(int(timeout) + 1))
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process_group(process)
        raise CommandError(f"the MPI job ran past its limit of {timeout:g} s and was killed (--timeout).") from None
    except KeyboardInterrupt:
        kill_process_group(process)
        raise
    if code != 0:
        raise CommandError(f"the MPI job failed (mpiexec exit status {code}); its ranks' messages are above.")
