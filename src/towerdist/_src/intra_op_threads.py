"""How many threads one operation may use (``tf.config.threading``'s intra-op parallelism).

numpy's matrix products run in a BLAS library (OpenBLAS, MKL, BLIS, ...) that by default
starts one thread per core for each large product. CPU replicas are threads themselves, one
per core: N replicas whose products each want every core oversubscribe the machine N-fold,
and training gets several times *slower* than on one replica (measured with the digits MLP:
17k examples/s on one replica and 4.9k on two, against ~150k pinned).

So, unless told otherwise, towerdist gives each CPU replica its share of the cores: the first
time more than one CPU replica of this host runs at once (the replicas of a
``MirroredStrategy`` over logical CPUs, or the ranks of a ``MultiWorkerMirroredStrategy`` on
one host times their replicas), and the BLAS libraries' threads times those replicas exceed
the usable cores, it limits the BLAS libraries to ``max(1, cores // replicas)`` threads for
the rest of the process and says so once (``towerdist`` logger, WARNING). It does this
through threadpoolctl (``pip install threadpoolctl``, or the ``towerdist[blas]`` extra);
without it, it says once that it could not check.

It leaves the BLAS threads alone when the user chose them: one of the environment variables
``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``, ``BLIS_NUM_THREADS`` or
``VECLIB_MAXIMUM_THREADS`` is set, or :func:`set_intra_op_parallelism_threads` was called with
a number > 0 (which applies that number at once, to every BLAS library).
"""

from __future__ import annotations

import logging
import numbers
import os
import threading
from typing import Any

from towerdist._src import waiting

__all__ = ["for_concurrent_replicas", "get_intra_op_parallelism_threads", "set_intra_op_parallelism_threads"]

logger = logging.getLogger("towerdist")

_USER_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS")

_lock = threading.Lock()
_chosen = 0  # set_intra_op_parallelism_threads(n): n > 0 fixes the BLAS threads; 0 lets towerdist pick
_limiters: list[Any] = []  # threadpoolctl limiters of the user's n > 0, to undo on set(0)
_limited_for = 1  # the most concurrent replicas the BLAS threads were limited for (1: never limited)
_said = False  # the one message about limiting (or not being able to) has been logged


def set_intra_op_parallelism_threads(num_threads: int) -> None:
    """Sets how many threads one operation (a BLAS call such as a matrix product) may use.

    ``0`` (the default) lets towerdist pick: the BLAS libraries keep their own default until
    concurrent CPU replicas would oversubscribe the cores, then each replica gets its share
    (see the module docstring); setting ``0`` after a number puts back the threads the
    libraries had before it. A number > 0 applies at once to every BLAS library numpy (or
    cupy's host code) loaded, and towerdist no longer picks. Unlike TensorFlow, this may be
    called at any time.

    Args:
      num_threads: an int >= 0.

    Raises:
      TypeError: ``num_threads`` is not an int.
      ValueError: it is negative.
      ModuleNotFoundError: a number > 0 without threadpoolctl, which sets BLAS threads
        (``pip install threadpoolctl``).
    """
    global _chosen
    if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral):
        raise TypeError(
            f"set_intra_op_parallelism_threads() takes the number of threads as an int. Got num_threads="
            f"{num_threads!r} of type {type(num_threads).__name__}."
        )
    if num_threads < 0:
        raise ValueError(
            f"set_intra_op_parallelism_threads() needs num_threads >= 0 (0: let towerdist pick). Got {num_threads}."
        )
    with _lock:
        if num_threads > 0:
            controller = _controller()
            if controller is None:
                raise ModuleNotFoundError(
                    "set_intra_op_parallelism_threads() sets the BLAS libraries' threads through threadpoolctl, which "
                    "is not installed. Install it with: pip install threadpoolctl (or towerdist[blas]); or set "
                    "OMP_NUM_THREADS before numpy is imported."
                )
            _limiters.append(controller.limit(limits=int(num_threads), user_api="blas"))
        else:
            while _limiters:  # the latest first: back to the threads before the first number
                _limiters.pop().restore_original_limits()
        _chosen = int(num_threads)


def get_intra_op_parallelism_threads() -> int:
    """The number set with :func:`set_intra_op_parallelism_threads` (0: towerdist picks)."""
    return _chosen


def for_concurrent_replicas(replicas: int) -> None:
    """Called before ``replicas`` CPU replicas of this host run at once: limits BLAS threads if needed.

    Cheap after the first call for a given count (the hot path of ``strategy.run``).
    """
    if replicas <= _limited_for or _chosen:
        return
    with _lock:
        _limit(replicas)


def _limit(replicas: int) -> None:
    global _limited_for, _said
    if replicas <= _limited_for or _chosen:
        return
    _limited_for = replicas
    chosen_by = [name for name in _USER_VARIABLES if os.environ.get(name, "").strip()]
    if chosen_by:
        return  # the user chose (e.g. OMP_NUM_THREADS=1): theirs to keep
    controller = _controller()
    cores = waiting.usable_cores()
    if controller is None:
        if not _said:
            _said = True
            logger.warning(
                f"towerdist could not check how many threads the BLAS library uses for {replicas} CPU replicas on "
                f"{cores} cores (threadpoolctl is not installed). If training is slower than on one replica, "
                f"install threadpoolctl (pip install threadpoolctl), or set OMP_NUM_THREADS={max(1, cores // replicas)} "
                f"before numpy is imported."
            )
        return
    pools = [info for info in controller.info() if info.get("user_api") == "blas"]
    busiest = max((int(info.get("num_threads", 1)) for info in pools), default=1)
    if busiest * replicas <= cores:
        return
    share = max(1, cores // replicas)
    controller.limit(limits=share, user_api="blas")
    libraries = ", ".join(sorted({str(info.get("internal_api")) for info in pools}))
    if not _said:
        _said = True
        logger.warning(
            f"towerdist limited the BLAS threads ({libraries}) from {busiest} to {share} per operation: {replicas} "
            f"CPU replicas run at once on {cores} cores, and {busiest} threads each would oversubscribe them. Choose "
            f"yourself with td.config.threading.set_intra_op_parallelism_threads(n) or OMP_NUM_THREADS."
        )


def _controller() -> Any:
    """threadpoolctl's view of the thread pools loaded now (~1 ms), or None without threadpoolctl."""
    try:
        import threadpoolctl  # noqa: PLC0415  (an optional dependency)
    except ImportError:
        return None
    return threadpoolctl.ThreadpoolController()
