"""The MPI job this process belongs to: finding it, and ending it when something goes wrong.

towerdist imports mpi4py only here, and only when ``MultiWorkerMirroredStrategy`` is created
in a process that an MPI launcher started (``mpiexec -n 2 python train.py``) or that has
imported ``mpi4py.MPI`` itself. A process started without a launcher is one worker and needs
no MPI at all.

Failure policy (facts in DESIGN section 9 and ``reference/mpi.md``):

* an uncaught exception on any rank aborts the whole job (``MPI_Abort``), so the launcher
  tears every rank down within seconds instead of leaving them in ``MPI_Finalize``; set
  ``TOWERDIST_MPI_ABORT_ON_ERROR=0`` to handle failures yourself;
* a communicator broken by a timed-out collective aborts the job when the interpreter exits;
* a launcher that started several processes which each see ``size == 1`` (an ``mpiexec``
  from another MPI than mpi4py's) is refused instead of each process training alone.
"""

from __future__ import annotations

import array
import atexit
import os
import stat
import sys
import threading
import time
from traceback import format_exception
from types import ModuleType, TracebackType

from towerdist._src.errors import MissingDependencyError

__all__ = ["World", "launcher_size", "world"]

ABORT_ON_ERROR_VARIABLE = "TOWERDIST_MPI_ABORT_ON_ERROR"
# The longest an abort waits for the launcher to take this rank's last output (a traceback).
_OUTPUT_DRAIN_SECONDS = 2.0

# What launchers put in each process's environment, with the number of processes they started.
_SIZE_VARIABLES = (
    "PMI_SIZE",  # MPICH (hydra), Intel MPI, MVAPICH
    "OMPI_COMM_WORLD_SIZE",  # Open MPI
    "MV2_COMM_WORLD_SIZE",  # MVAPICH2
    "MPI_LOCALNRANKS",  # hydra
    "SLURM_STEP_NUM_TASKS",  # srun
)


def launcher_size() -> int:
    """How many processes the launcher says it started (1 when no launcher is seen)."""
    sizes = []
    for name in _SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            sizes.append(int(value))
    return max(sizes, default=1)


class World:
    """The processes of this MPI job: ``rank``, ``size`` and the ``mpi4py`` module (``MPI``).

    towerdist's own messages go over a duplicate of ``COMM_WORLD`` (``communicator.py``), so
    they never match a user's own MPI calls.
    """

    def __init__(self, mpi: ModuleType) -> None:
        self.MPI = mpi
        self.rank: int = mpi.COMM_WORLD.Get_rank()
        self.size: int = mpi.COMM_WORLD.Get_size()
        self._broken: list[str] = []
        self._lock = threading.Lock()

    def mark_broken(self, reason: str) -> None:
        """Records that a communicator can no longer be trusted: the job aborts at exit."""
        with self._lock:
            self._broken.append(reason)

    def abort(self, code: int, reason: str) -> None:
        """Ends every rank of the job now (``MPI_Abort``), after saying why on stderr.

        What this rank wrote before (a traceback) and the reason reach the launcher first: the
        launcher stops forwarding a rank's output once the job aborts, so the abort waits (at most
        ``_OUTPUT_DRAIN_SECONDS``) until the launcher has read this process's stdout and stderr.
        """
        _flush()
        _write_stderr(f"towerdist: rank {self.rank} of {self.size} aborts the MPI job: {reason}\n")
        _wait_until_output_is_read(_OUTPUT_DRAIN_SECONDS)
        try:
            self.MPI.COMM_WORLD.Abort(code)
        finally:
            # MPICH's Abort may return before the process is killed: never run on.
            os._exit(code)

    def _at_exit(self) -> None:
        if self._broken and self.size > 1:
            self.abort(
                1,
                f"a collective failed earlier ({self._broken[0]}), so the other ranks may be "
                f"waiting in a collective this rank will never join",
            )


_world: World | None = None
_world_lock = threading.Lock()


def world() -> World | None:
    """This process's MPI job, or None when it runs without a launcher (one worker).

    Raises:
      MissingDependencyError: a launcher started several processes but mpi4py is missing.
      RuntimeError: the launcher started several processes, each of which sees an MPI job of
        one (the launcher belongs to another MPI installation than mpi4py's).
    """
    global _world
    if _world is not None:
        return _world
    expected = launcher_size()
    if expected == 1 and "mpi4py.MPI" not in sys.modules:
        return None
    with _world_lock:
        if _world is None:
            _world = _start(expected)
    return _world


def _start(expected: int) -> World:
    try:
        from mpi4py import MPI  # noqa: PLC0415  (mpi4py is optional; importing it starts MPI)
    except ImportError as error:
        raise MissingDependencyError(
            f"MultiWorkerMirroredStrategy runs over MPI, and this process was started by an MPI launcher "
            f"({expected} processes) but mpi4py is not installed ({error}). Install it with "
            f'pip install "towerdist[mpi]" (with your cluster\'s MPI) or pip install "towerdist[mpi-mpich]" '
            f"(MPICH included, for laptops and CI)."
        ) from error
    world = World(MPI)
    if world.size == 1 and expected > 1:
        raise RuntimeError(
            f"MultiWorkerMirroredStrategy: the launcher started {expected} processes, but MPI says this one is "
            f"alone (COMM_WORLD size 1), so each process would silently train on its own. The mpiexec used "
            f"belongs to another MPI than the one mpi4py loaded ({MPI.Get_library_version().splitlines()[0]}). "
            f"Launch with that MPI's mpiexec (with the mpich extra: the mpiexec in your virtualenv's bin/)."
        )
    atexit.register(world._at_exit)
    if world.size > 1 and os.environ.get(ABORT_ON_ERROR_VARIABLE, "1").strip().lower() not in ("0", "false", "no"):
        _install_abort_on_uncaught_exception(world)
    return world


def _install_abort_on_uncaught_exception(world: World) -> None:
    previous = sys.excepthook

    def abort_on_uncaught_exception(
        kind: type[BaseException], error: BaseException, traceback: TracebackType | None
    ) -> None:
        try:
            previous(kind, error, traceback)  # the traceback first, as Python prints it
        except Exception:  # noqa: BLE001  (a broken hook or sys.stderr must not hide the error)
            _write_stderr("".join(format_exception(kind, error, traceback)))
        world.abort(1, f"uncaught {kind.__name__} (set {ABORT_ON_ERROR_VARIABLE}=0 to handle failures yourself)")

    sys.excepthook = abort_on_uncaught_exception


def _write_stderr(text: str) -> None:
    """Writes ``text`` to file descriptor 2 at once, past any Python buffer (or a replaced sys.stderr)."""
    data = text.encode("utf-8", "backslashreplace")
    while data:
        try:
            written = os.write(2, data)
        except InterruptedError:
            continue
        except OSError:
            return
        data = data[written:]


def _unread_bytes(fd: int) -> int:
    """How many bytes written to ``fd`` its reader has not taken yet (0 unless ``fd`` is a pipe)."""
    try:
        import fcntl  # noqa: PLC0415  (POSIX only)
        import termios  # noqa: PLC0415

        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0  # a file or a terminal: written is delivered
        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count)  # on Linux, either end of a pipe says what it holds
    except (ImportError, OSError, ValueError):
        return 0
    return count[0]


def _wait_until_output_is_read(seconds: float) -> None:
    """Waits (at most ``seconds``) until the launcher has read what this process wrote to stdout and stderr.

    Flushing puts the output in the pipe to the launcher (hydra's proxy), but ``MPI_Abort`` makes the
    launcher kill the job and stop forwarding it: a traceback still in the pipe was lost in about a
    quarter of the aborts. The launcher reads its pipes every few milliseconds.
    """
    deadline = time.monotonic() + seconds
    while any(_unread_bytes(fd) for fd in (1, 2)) and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(0.05)  # the launcher forwards what it has read before it handles the abort


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
