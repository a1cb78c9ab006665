"""Starting a benchmark's MPI workers from the benchmark itself (``--mpi`` modes).

``python benchmarks/x.py --mpi`` runs ``mpiexec -n N python benchmarks/x.py --mpi-worker ...``
as a child process: the ``mpiexec`` next to this Python (the ``mpich`` wheel puts it in the
virtualenv's ``bin/``), else the one on ``PATH``. The job runs in its own process group and
every wait for it is bounded (``run_mpi``: the whole job, also through hydra's
``MPIEXEC_TIMEOUT``; ``MPIJob``: each answer), past which the group is killed from here, so
a hung rank ends the benchmark instead of blocking it.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from towerdist._src.multi_worker import launcher

__all__ = ["MPIJob", "answer", "find_mpiexec", "mpi_command", "next_command", "run_mpi"]


def find_mpiexec() -> str:
    """The ``mpiexec`` that belongs to this Python's environment, else the one on ``PATH``.

    Raises:
      SystemExit: neither mpi4py nor an ``mpiexec`` can be found (with how to install them).
    """
    try:
        import mpi4py  # noqa: F401  (only whether it is importable; MPI itself starts in the workers)
    except ImportError as error:
        raise SystemExit(f"--mpi needs mpi4py ({error}). Install it with: pip install mpi4py mpich") from error
    found = launcher.find_mpiexec()
    if found is None:
        raise SystemExit(f"--mpi needs an MPI launcher, but there is no mpiexec next to {sys.executable} nor on "
                         f"PATH. Install one with: pip install mpich (or launch the --mpi-worker mode yourself).")
    return found


def mpi_command(ranks: int, script: Path, arguments: list[str]) -> list[str]:
    """``mpiexec -n ranks python script arguments...`` with this Python."""
    return [find_mpiexec(), "-n", str(ranks), sys.executable, str(script), *arguments]


def _environment(job_limit: float | None) -> dict[str, str]:
    env = dict(os.environ)
    if job_limit is not None:
        env["MPIEXEC_TIMEOUT"] = str(int(job_limit) + 1)  # hydra's own bound on the whole job
    env["PYTHONUNBUFFERED"] = "1"  # rank 0's lines arrive as they are printed
    return env


def run_mpi(command: list[str], timeout: float) -> None:
    """Runs ``command`` (rank 0's output goes straight to this process's stdout).

    Raises:
      SystemExit: the job failed or ran past ``timeout`` seconds (it is then killed).
    """
    print(f"launching: {' '.join(command)}", flush=True)
    process = subprocess.Popen(command, env=_environment(timeout), start_new_session=True, text=True)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher.kill_process_group(process)
        raise SystemExit(f"the MPI job ran past its limit of {timeout:g} s and was killed (--timeout).") from None
    except KeyboardInterrupt:
        launcher.kill_process_group(process)
        raise
    if code != 0:
        raise SystemExit(f"the MPI job failed (mpiexec exit status {code}); its ranks' errors are above.")


class MPIJob:
    """A long-lived MPI job that rank 0 drives line by line over its stdin and stdout.

    ``ask("sample")`` writes a line to rank 0 (hydra forwards this process's pipe to rank 0's
    stdin) and returns rank 0's next answer line (lines starting with ``"@ "``); any other line
    the job prints (hydra merges every rank's stdout) is echoed here with a prefix. Every wait
    is bounded by ``timeout``.
    """

    ANSWER = "@ "

    def __init__(self, command: list[str], timeout: float) -> None:
        print(f"launching: {' '.join(command)}", flush=True)
        self._timeout = timeout
        self._process = subprocess.Popen(
            command, env=_environment(None), start_new_session=True, text=True,  # each answer is bounded
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1,
        )
        self._answers: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(self.ANSWER):
                self._answers.put(line[len(self.ANSWER):].strip())
            else:
                print(f"  [mpi job] {line.rstrip()}", flush=True)
        self._answers.put(None)  # end of output: the job ended

    def answer(self) -> str:
        """Rank 0's next answer line.

        Raises:
          SystemExit: the job ended or did not answer within the timeout (it is then killed).
        """
        try:
            line = self._answers.get(timeout=self._timeout)
        except queue.Empty:
            self.kill()
            raise SystemExit(f"the MPI job did not answer within {self._timeout:g} s and was killed.") from None
        if line is None:
            code = self._process.wait(timeout=self._timeout)
            raise SystemExit(f"the MPI job ended early (mpiexec exit status {code}); its ranks' errors are above.")
        return line

    def ask(self, command: str) -> str:
        assert self._process.stdin is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self.answer()

    def close(self) -> None:
        """Tells rank 0 to end the job and waits for it (killing it past the timeout)."""
        if self._process.poll() is None:
            try:
                assert self._process.stdin is not None
                self._process.stdin.write("quit\n")
                self._process.stdin.close()
                self._process.wait(timeout=self._timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()

    def kill(self) -> None:
        launcher.kill_process_group(self._process)

    def __enter__(self) -> MPIJob:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.kill()


# --- the worker's side ---------------------------------------------------------------------------


def answer(text: str) -> None:
    """Rank 0's answer to the line ``MPIJob.ask`` sent."""
    print(f"{MPIJob.ANSWER}{text}", flush=True)


def next_command(comm: object, width: int = 64) -> str:
    """The next line rank 0 reads from its stdin, on every rank (``"quit"`` at end of input).

    The other ranks wait with short sleeps (not MPI's busy-waiting), so an idle job leaves
    the cores to whatever the benchmark measures meanwhile.
    """
    text = bytearray(width)
    if comm.Get_rank() == 0:  # type: ignore[attr-defined]
        line = sys.stdin.readline().strip() or "quit"
        text[:] = line.encode()[:width].ljust(width)
    request = comm.Ibcast(text, root=0)  # type: ignore[attr-defined]
    while not request.Test():
        time.sleep(0.001)
    return bytes(text).decode().strip()
