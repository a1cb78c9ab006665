"""The child process of test_checkpoint's crash tests (a helper script: pytest does not collect it).

Usage::

    python checkpoint_child.py DIRECTORY block SAVER FUNCTION K
    python checkpoint_child.py DIRECTORY loop

``block``: writes checkpoint 1 (every value derived from 1), then writes checkpoint 2
(values derived from 2) with ``os.FUNCTION`` (``replace`` or ``fsync``) wrapped so that
its K-th call during that second write prints ``BLOCKED <function> <file name>``,
flushes, and waits on stdin *before* doing anything: the parent kills the process with
SIGKILL there, so the kill point is exact without sleeping, or writes ``continue`` to let
the save go on (a save in progress while the parent works in the same directory), after
which the child prints ``SAVED <prefix>`` and ``DONE`` and exits. ``SAVER`` is ``save``
(``Checkpoint.save(DIRECTORY/ckpt)``: ``ckpt-1`` then ``ckpt-2``) or ``write``
(``Checkpoint.write(DIRECTORY/ckpt)`` twice: the same prefix rewritten).

``loop``: saves checkpoints 1, 2, 3, ... through a ``CheckpointManager(max_to_keep=2)``
with every value derived from the checkpoint's number, printing ``SAVING <n>`` before
save ``n`` starts; the parent kills it at a moment it does not choose.

The parent imports this module for :func:`make_objects`, :func:`set_values`,
:func:`expected` and :func:`read_values`, so both processes agree on the objects.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

import towerdist as td

SHAPE = (24, 40)  # big enough that a save is not instantaneous, small enough to stay fast
LOOP_LIMIT_SECONDS = 60.0  # a child the parent forgot (its test crashed) stops by itself


class Model(td.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = td.Variable(np.zeros(SHAPE, np.float32), name="w")
        self.b = td.Variable(np.zeros(SHAPE[1], np.float32), name="b")
        self.steps = td.Variable(np.int64(0), trainable=False, name="steps")


def make_objects() -> td.train.Checkpoint:
    """A model, an Adam optimizer with its slots built, and a Mean metric (default strategy)."""
    model = Model()
    optimizer = td.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)
    return td.train.Checkpoint(model=model, optimizer=optimizer, metric=td.metrics.Mean())


def expected(n: int) -> dict[str, np.ndarray]:
    """The values of checkpoint ``n``: every variable and slot differs from checkpoint ``n - 1``'s."""
    grid = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) / 1024
    return {
        "model/w": grid + np.float32(n),
        "model/b": np.full(SHAPE[1], -n, np.float32),
        "model/steps": np.array(n * 10, np.int64),
        "optimizer/iterations": np.array(n, np.int64),
        "optimizer/m/w": grid * np.float32(n),
        "optimizer/v/w": grid + np.float32(n / 4),
        "optimizer/m/b": np.full(SHAPE[1], n / 2, np.float32),
        "optimizer/v/b": np.full(SHAPE[1], n / 8, np.float32),
        "metric/total": np.array(3 * n, np.float32),
        "metric/count": np.array(n, np.float32),
    }


def _variables(ckpt: td.train.Checkpoint) -> dict[str, Any]:
    model, optimizer, metric = ckpt.model, ckpt.optimizer, ckpt.metric
    return {
        "model/w": model.w,
        "model/b": model.b,
        "model/steps": model.steps,
        "optimizer/iterations": optimizer.iterations,
        "optimizer/m/w": optimizer.get_slot(model.w, "m"),
        "optimizer/v/w": optimizer.get_slot(model.w, "v"),
        "optimizer/m/b": optimizer.get_slot(model.b, "m"),
        "optimizer/v/b": optimizer.get_slot(model.b, "v"),
        "metric/total": metric.total,
        "metric/count": metric.count,
    }


def set_values(ckpt: td.train.Checkpoint, n: int) -> None:
    """Assigns checkpoint ``n``'s values."""
    values = expected(n)
    for name, variable in _variables(ckpt).items():
        variable.assign(values[name], read_value=False)


def read_values(ckpt: td.train.Checkpoint) -> dict[str, np.ndarray]:
    """The current values, keyed like :func:`expected`."""
    return {name: np.asarray(variable.numpy()) for name, variable in _variables(ckpt).items()}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _describe(function: str, args: tuple[Any, ...]) -> str:
    """The file the call is about: the rename's destination, or the fsync-ed descriptor's file."""
    if function == "replace":
        return os.path.basename(os.fspath(args[1]))
    try:
        return os.path.basename(os.readlink(f"/proc/self/fd/{args[0]}"))
    except OSError:
        return "?"


def _block_on(function: str, k: int) -> None:
    """Wraps ``os.<function>`` so that its ``k``-th call announces itself and waits to be killed."""
    real = getattr(os, function)
    calls = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == k:
            _say(f"BLOCKED {function} {_describe(function, args)}")
            if sys.stdin.readline() != "continue\n":  # the parent kills us here; an empty read means it is gone
                _say("NOT KILLED")
                os._exit(3)
        return real(*args, **kwargs)

    setattr(os, function, wrapper)


def _block(directory: str, saver: str, function: str, k: int) -> None:
    ckpt = make_objects()
    prefix = os.path.join(directory, "ckpt")
    save = ckpt.save if saver == "save" else ckpt.write
    set_values(ckpt, 1)
    _say(f"SAVED {save(prefix)}")
    set_values(ckpt, 2)
    _block_on(function, k)
    _say(f"SAVED {save(prefix)}")  # not reached when the parent kills us
    _say("DONE")


def _loop(directory: str) -> None:
    ckpt = make_objects()
    manager = td.train.CheckpointManager(ckpt, directory, max_to_keep=2)
    deadline = time.monotonic() + LOOP_LIMIT_SECONDS
    n = 0
    while time.monotonic() < deadline:
        n += 1
        set_values(ckpt, n)
        _say(f"SAVING {n}")
        manager.save()
    _say("GAVE UP")


def main(argv: list[str]) -> None:
    directory, mode, *rest = argv
    if mode == "block":
        saver, function, k = rest
        _block(directory, saver, function, int(k))
    elif mode == "loop":
        _loop(directory)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
