"""What the ``test_checkpoint_*.py`` files share: the objects under test, training steps, the files a save writes.

Together, those files test the following.

``td.train`` checkpoints: format v3 (v2 still read), restore into any strategy, deferred slots, crash safety, the manager.

Pins DESIGN section 7 ("Checkpoints"): one aggregated value saved per variable, a
documented and versioned format (``<prefix>.index``, JSON, and ``<prefix>.data-00000-of-00001``,
an ``.npz``) with every byte checksummed, crash-safe writes (temp file + fsync + rename, the
index the commit point), restore inside or outside ``scope()``
and into another replica count, all-or-nothing restores, string variables, dtypes refused
before anything is written, and TensorFlow's ``Checkpoint`` / ``CheckpointManager`` /
``latest_checkpoint`` API (bytes paths, damaged state files). The crash tests run
``checkpoint_child.py`` in a child process and SIGKILL it at chosen points of a save (and
once at a moment nobody chooses); the sweep tests pause it mid-save and check that another
process's sweep leaves its files alone. Stale files are made by setting their modification
time, never by waiting.

Values are chosen so that every comparison can be exact: gradients are fixed per
(step, replica, variable), metric inputs are small integers, and sync-on-read values are
dyadic, so ``value / N`` and sums over 1, 2 or 4 copies are exact in float32.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import towerdist as td
from towerdist._src.checkpoint import files
from towerdist._src.variables.distributed_variable import DistributedVariable, SyncOnReadVariable

from conftest import TEST_PROGRAMS, mirrored_param

A = td.VariableAggregation
ON_READ = td.VariableSynchronization.ON_READ
DataLossError = td.errors.DataLossError
NotFoundError = td.errors.NotFoundError

CHILD_SCRIPT = str(TEST_PROGRAMS / "checkpoint_child.py")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(td.__file__)))  # so the child imports this towerdist
CHILD_WAIT_SECONDS = 30.0  # bound on every wait for the child (a line, an exit)

ROUND_TRIP_STRATEGIES = [
    "default", "one_device_cpu", mirrored_param(1), mirrored_param(2), mirrored_param(4), "central_storage_2cpu",
]


# --- the objects under test --------------------------------------------------------------------


class Dense(td.Module):
    def __init__(self, n_in: int, n_out: int, seed: int) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = td.Variable(rng.standard_normal((n_in, n_out)).astype(np.float32), name="w")
        self.b = td.Variable(rng.standard_normal(n_out).astype(np.float32), name="b")


class Net(td.Module):
    """Two layers in a list, a trainable scalar and a non-trainable integer counter."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.layers = [Dense(3, 5, seed), Dense(5, 2, seed + 1)]
        self.scale = td.Variable(np.float32(1.0), name="scale")
        self.seen = td.Variable(np.int64(0), trainable=False, name="seen")


# The keys graph.walk gives Net's trainable variables (attributes in name order, list items by index).
NET_TRAINABLE_KEYS = ["model/layers/0/b", "model/layers/0/w", "model/layers/1/b", "model/layers/1/w", "model/scale"]


class State(NamedTuple):
    strategy: Any
    net: Net
    optimizer: td.optimizers.Adam
    metric: td.metrics.Mean

    def checkpoint(self) -> td.train.Checkpoint:
        return td.train.Checkpoint(model=self.net, optimizer=self.optimizer, metric=self.metric)


def make_state(strategy: Any, seed: int = 0, build: bool = False) -> State:
    """A model, Adam and a Mean metric created in ``strategy``'s scope (slots built if ``build``)."""
    with strategy.scope():
        net = Net(seed)
        optimizer = td.optimizers.Adam(0.05)
        metric = td.metrics.Mean()
    if build:
        optimizer.build(net.trainable_variables)
    return State(strategy, net, optimizer, metric)


def gradient(step: int, replica: int, index: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng([step, replica, index]).standard_normal(shape).astype(np.float32)


def train(state: State, steps: int, first_step: int = 0) -> None:
    """``steps`` optimizer steps (gradients fixed per step and replica) and metric updates."""
    variables = state.net.trainable_variables

    def replica_fn(step: int) -> None:
        replica = int(td.distribute.get_replica_context().replica_id_in_sync_group)
        grads = [gradient(step, replica, k, tuple(v.shape)) for k, v in enumerate(variables)]
        state.optimizer.apply_gradients(zip(grads, variables))
        state.metric.update_state([float(step + replica), 1.0])  # integers: sums are exact

    for step in range(first_step, first_step + steps):
        state.strategy.run(replica_fn, args=(step,))
        state.net.seen.assign_add(1, read_value=False)


def variables_of(state: State) -> dict[str, Any]:
    """Every variable of ``state`` that a checkpoint saves, by a readable name."""
    found = {f"net[{k}]": v for k, v in enumerate(state.net.variables)}
    for k, variable in enumerate(state.net.trainable_variables):
        for slot in ("m", "v"):
            found[f"{slot}[{k}]"] = state.optimizer.get_slot(variable, slot)
    found["iterations"] = state.optimizer.iterations
    found["metric/total"] = state.metric.total
    found["metric/count"] = state.metric.count
    return found


def values(variables: dict[str, Any]) -> dict[str, np.ndarray]:
    """Each variable's value as cross-replica code reads it (the aggregate of a sync-on-read one)."""
    return {name: np.array(variable.numpy()) for name, variable in variables.items()}


def copies(variable: Any) -> list[np.ndarray]:
    """The value held by each copy of ``variable`` (one for a plain or aggregating variable)."""
    if isinstance(variable, DistributedVariable):
        return [np.array(component.numpy()) for component in variable.values]
    return [np.array(variable.numpy())]


def expected_copies(variable: Any, aggregate: np.ndarray) -> list[np.ndarray]:
    """What each copy holds after ``aggregate`` is restored (assigned in cross-replica context)."""
    if not isinstance(variable, DistributedVariable):
        return [aggregate]
    n = len(variable.values)
    if isinstance(variable, SyncOnReadVariable) and variable.aggregation is A.SUM:
        if aggregate.dtype.kind in "iu":
            share = aggregate // n
            return [aggregate - share * (n - 1)] + [share] * (n - 1)  # the remainder on copy 0
        return [(aggregate / n).astype(aggregate.dtype)] * n
    return [aggregate] * n  # mirrored, MEAN and ONLY_FIRST_REPLICA: the value in every copy


def assert_same_values(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert actual[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def assert_restored(variables: dict[str, Any], saved: dict[str, np.ndarray]) -> None:
    """Every variable reads back its saved aggregate, and each copy holds its share of it."""
    assert_same_values(values(variables), saved)
    for name, variable in variables.items():
        for k, (got, want) in enumerate(zip(copies(variable), expected_copies(variable, saved[name]), strict=True)):
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, copy {k}")


def snapshot(variables: dict[str, Any]) -> dict[str, list[np.ndarray]]:
    """Every copy of every variable (to show that a failed restore changed nothing)."""
    return {name: copies(variable) for name, variable in variables.items()}


def assert_unchanged(before: dict[str, list[np.ndarray]], after: dict[str, list[np.ndarray]]) -> None:
    assert before.keys() == after.keys()
    for name in before:
        for got, want in zip(after[name], before[name], strict=True):
            np.testing.assert_array_equal(got, want, err_msg=name)


INDEX = ".index"
DATA = ".data-00000-of-00001"


def index_file(prefix: str | Path) -> Path:
    return Path(f"{prefix}{INDEX}")


def data_file(prefix: str | Path) -> Path:
    return Path(f"{prefix}{DATA}")


def read_index(prefix: str | Path) -> dict[str, Any]:
    with open(index_file(prefix), encoding="utf-8") as stream:
        return json.load(stream)


def data_files(prefix: str | Path) -> list[Path]:
    """Every data file of ``prefix``: the current one and any pending one (``<data>.<hash>.pending``)."""
    prefix = Path(prefix)
    return sorted(prefix.parent.glob(f"{prefix.name}.data-*"))


def saved_counter(ckpt: td.train.Checkpoint) -> int:
    return int(ckpt.save_counter.numpy())


def slot_keys(variable_keys: list[str]) -> list[str]:
    return sorted(f"optimizer/.slots/{key}/{slot}" for key in variable_keys for slot in ("m", "v"))


def seal(index: dict[str, Any]) -> None:
    """Sets ``index_sha256`` by the recipe docs/training.md documents (what a writer does)."""
    content = {k: v for k, v in index.items() if k != "index_sha256"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    index["index_sha256"] = hashlib.sha256(canonical.encode("ascii")).hexdigest()


def counter_checkpoint() -> tuple[td.train.Checkpoint, Any]:
    v = td.Variable(np.zeros(4, np.float32))
    return td.train.Checkpoint(v=v), v


def state_file(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "checkpoint").read_text(encoding="utf-8"))


def checkpoint_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ckpt-"))


def assert_files(directory: Path, *numbers: int) -> None:
    """The directory holds exactly the index and the one data file of checkpoints ``numbers``."""
    assert checkpoint_files(directory) == sorted(name for n in numbers for name in (f"ckpt-{n}{INDEX}", f"ckpt-{n}{DATA}"))


def age(*paths: Path, seconds: float = files.STALE_SECONDS + 60.0) -> None:
    """Makes ``paths`` look last modified ``seconds`` ago (by default: stale, older than the sweep's bound)."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def save_numbered(manager: td.train.CheckpointManager, v: Any, count: int) -> list[str]:
    paths = []
    for _ in range(count):
        v.assign(np.full(4, saved_counter(manager.checkpoint) + 1, np.float32))
        paths.append(manager.save())
    return paths


# --- objects saved as one opaque state -------------------------------------------------------------


class Stub:
    """An object saved as one opaque state (the ``Saveable`` protocol), recording what it is asked.

    ``log`` (shared between stubs to see their order) gets ``("state", name)`` for each
    ``_checkpoint_state()``, ``("prepare", name, watched)`` for each restorer built and
    ``("commit", name, watched)`` for each commit, where ``watched`` is ``watch()`` at that
    moment (e.g. a variable's value). ``refuse``: the restorer raises
    ``FailedPreconditionError`` instead.
    """

    def __init__(
        self, name: str, state: bytes = b"", collective: bool = False, refuse: bool = False,
        log: list[Any] | None = None, watch: Any = None,
    ) -> None:
        self.name = name
        self.state = state
        self._checkpoint_collective = collective
        self.refuse = refuse
        self.log = [] if log is None else log
        self.watch = watch or (lambda: None)

    def _checkpoint_state(self) -> bytes:
        self.log.append(("state", self.name))
        return self.state

    def _checkpoint_restorer(self, state: bytes) -> Any:
        self.log.append(("prepare", self.name, self.watch()))
        if self.refuse:
            raise td.errors.FailedPreconditionError(f"{self.name} refuses the state {state!r}")

        def commit() -> None:
            self.log.append(("commit", self.name, self.watch()))
            self.state = state

        return commit
