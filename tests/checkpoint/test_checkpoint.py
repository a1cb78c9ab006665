"""``td.train`` checkpoints: format v2, restore into any strategy, deferred slots, crash safety, the manager.

Pins DESIGN section 7 ("Checkpoints"): one aggregated value saved per variable, a
documented and versioned ``.npz`` + JSON index format with every byte checksummed, atomic
writes (temp file + fsync + rename, the index last), restore inside or outside ``scope()``
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

import contextlib
import hashlib
import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import towerdist as td
from towerdist._src.checkpoint import checkpoint as checkpoint_module
from towerdist._src.checkpoint import files
from towerdist._src.variables.distributed_variable import DistributedVariable, SyncOnReadVariable

from conftest import mirrored
from programs import checkpoint_child

A = td.VariableAggregation
ON_READ = td.VariableSynchronization.ON_READ
DataLossError = td.errors.DataLossError
NotFoundError = td.errors.NotFoundError

CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs", "checkpoint_child.py")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(td.__file__)))  # so the child imports this towerdist
CHILD_WAIT_SECONDS = 30.0  # bound on every wait for the child (a line, an exit)

ROUND_TRIP_STRATEGIES = [
    "default", "one_device_cpu", "mirrored_1cpu", "mirrored_2cpu", "mirrored_4cpu", "central_storage_2cpu",
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


def read_index(prefix: str | Path) -> dict[str, Any]:
    with open(f"{prefix}.index.json", encoding="utf-8") as stream:
        return json.load(stream)


def data_files(prefix: str | Path) -> list[Path]:
    prefix = Path(prefix)
    return sorted(prefix.parent.glob(f"{prefix.name}.data-*.npz"))


def saved_counter(ckpt: td.train.Checkpoint) -> int:
    return int(ckpt.save_counter.numpy())


# --- 1. round trip ----------------------------------------------------------------------------


@pytest.mark.parametrize("strategy_name", ROUND_TRIP_STRATEGIES)
def test_round_trip_restores_model_adam_slots_iterations_and_metric_exactly(request, tmp_path, strategy_name):
    strategy = request.getfixturevalue(strategy_name)
    source = make_state(strategy, seed=0)
    train(source, steps=3)
    saved = values(variables_of(source))
    path = source.checkpoint().save(str(tmp_path / "ckpt"))
    assert path == str(tmp_path / "ckpt-1")

    fresh = make_state(strategy, seed=7, build=True)
    before = values(variables_of(fresh))
    assert all(not np.array_equal(before[name], saved[name]) for name in saved)  # the restore has work to do
    status = fresh.checkpoint().restore(path)

    assert isinstance(status, td.train.CheckpointLoadStatus)
    assert status.assert_consumed() is status
    status.assert_existing_objects_matched().assert_nontrivial_match().expect_partial()
    assert_restored(variables_of(fresh), saved)
    assert int(fresh.optimizer.iterations.numpy()) == 3
    np.testing.assert_array_equal(fresh.metric.result(), source.metric.result())


# --- 2. another replica count -------------------------------------------------------------------


def make_sync_on_read(strategy: Any) -> dict[str, Any]:
    """Sync-on-read variables of each aggregation a checkpoint can save (besides the metric's SUM)."""
    with strategy.scope():
        return {
            "mean": td.Variable(np.zeros(3, np.float32), synchronization=ON_READ, aggregation=A.MEAN),
            "first": td.Variable(np.zeros(3, np.float32), synchronization=ON_READ, aggregation=A.ONLY_FIRST_REPLICA),
            "int_sum": td.Variable(np.zeros(3, np.int64), synchronization=ON_READ, aggregation=A.SUM),
        }


SYNC_ON_READ_AGGREGATES = {
    "mean": np.array([0.75, -1.5, 4.0], np.float32),
    "first": np.array([1.0, 10.0, -0.25], np.float32),
    "int_sum": np.array([15, -15, 12], np.int64),  # odd sums: the split over 2 and 4 copies has a remainder
}


def set_per_replica(strategy: Any, variables: dict[str, Any]) -> None:
    """Gives each replica its own copy values whose aggregate is ``SYNC_ON_READ_AGGREGATES``."""
    n = strategy.num_replicas_in_sync

    def replica_fn() -> None:
        r = int(td.distribute.get_replica_context().replica_id_in_sync_group)
        offset = np.float32(0.5) * np.float32(r - (n - 1) / 2)  # sums to 0 over the replicas
        variables["mean"].assign(SYNC_ON_READ_AGGREGATES["mean"] + offset)
        first = SYNC_ON_READ_AGGREGATES["first"] + (0 if r == 0 else np.float32(100 + r))
        variables["first"].assign(first)
        others = sum(np.array([k, -2 * k, 3], np.int64) for k in range(1, n))
        mine = np.array([r, -2 * r, 3], np.int64) if r else SYNC_ON_READ_AGGREGATES["int_sum"] - others
        variables["int_sum"].assign(mine)

    strategy.run(replica_fn)


@pytest.mark.parametrize("replica_counts", [(4, 2, 1), (1, 4, 2), (2, 4)], ids=lambda c: "->".join(map(str, c)))
def test_restore_into_another_replica_count(tmp_path, replica_counts):
    first, *later = replica_counts
    strategy = mirrored(first)
    state = make_state(strategy)
    extras = make_sync_on_read(strategy)
    train(state, steps=2)
    set_per_replica(strategy, extras)
    assert_same_values(values(extras), SYNC_ON_READ_AGGREGATES)
    saved = {**values(variables_of(state)), **values(extras)}
    path = td.train.Checkpoint(model=state.net, optimizer=state.optimizer, metric=state.metric, extras=extras).save(
        str(tmp_path / "ckpt")
    )
    for hop, n in enumerate(later):
        strategy = mirrored(n)
        state = make_state(strategy, seed=hop + 10, build=True)
        extras = make_sync_on_read(strategy)
        ckpt = td.train.Checkpoint(model=state.net, optimizer=state.optimizer, metric=state.metric, extras=extras)
        ckpt.restore(path).assert_consumed()

        restored = {**variables_of(state), **extras}
        assert all(len(copies(v)) == n for v in restored.values())
        assert_restored(restored, saved)  # SUM copies hold aggregate/N; integers split with the remainder on copy 0
        assert saved_counter(ckpt) == hop + 1
        path = ckpt.save(str(tmp_path / "ckpt"))  # and on to the next replica count
        assert path == str(tmp_path / f"ckpt-{hop + 2}")


@pytest.mark.parametrize(
    "n, int_copies",
    [(1, [[15, -15, 12]]), (2, [[8, -7, 6], [7, -8, 6]]), (4, [[6, -3, 3], [3, -4, 3], [3, -4, 3], [3, -4, 3]])],
)
def test_integer_sum_sync_on_read_splits_exactly_with_the_remainder_on_copy_0(tmp_path, n, int_copies):
    source = make_sync_on_read(mirrored(2))
    set_per_replica(source["int_sum"].distribute_strategy, source)
    path = td.train.Checkpoint(extras=source).write(str(tmp_path / "ints"))

    target = make_sync_on_read(mirrored(n))
    td.train.Checkpoint(extras=target).restore(path).assert_consumed()

    assert [c.tolist() for c in copies(target["int_sum"])] == int_copies
    np.testing.assert_array_equal(target["int_sum"].numpy(), SYNC_ON_READ_AGGREGATES["int_sum"])


# --- 3. scopes and strategies ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["in_scope", "no_scope"])
@pytest.mark.parametrize("target_name", ["default", "one_device_cpu", "mirrored_2cpu", "central_storage_2cpu"])
@pytest.mark.parametrize("source_name", ["default", "mirrored_4cpu", "central_storage_2cpu"])
def test_restore_into_another_strategy_inside_or_outside_its_scope(request, tmp_path, source_name, target_name, where):
    def scope(strategy: Any) -> Any:
        return strategy.scope() if where == "in_scope" else contextlib.nullcontext()

    source = make_state(request.getfixturevalue(source_name))
    train(source, steps=2)
    saved = values(variables_of(source))
    with scope(source.strategy):
        path = source.checkpoint().save(str(tmp_path / "ckpt"))

    target = make_state(request.getfixturevalue(target_name), seed=3, build=True)
    ckpt = target.checkpoint()
    with scope(target.strategy):
        status = ckpt.restore(path)
    status.assert_consumed()
    assert_restored(variables_of(target), saved)
    assert saved_counter(ckpt) == 1

    # The restored objects train on in their strategy: the step counter continues from the saved one.
    train(target, steps=1, first_step=2)
    assert int(target.optimizer.iterations.numpy()) == 3


# --- 4. deferred slots ------------------------------------------------------------------------


def slot_keys(variable_keys: list[str]) -> list[str]:
    return sorted(f"optimizer/.slots/{key}/{slot}" for key in variable_keys for slot in ("m", "v"))


@pytest.mark.parametrize("trigger", ["build", "step"])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored_2cpu", "central_storage_2cpu"])
def test_slots_restored_before_they_exist_are_applied_when_created(request, tmp_path, strategy_name, trigger):
    strategy = request.getfixturevalue(strategy_name)
    uninterrupted = make_state(strategy)
    train(uninterrupted, steps=3)
    path = uninterrupted.checkpoint().save(str(tmp_path / "ckpt"))
    saved = values(variables_of(uninterrupted))
    train(uninterrupted, steps=2, first_step=3)  # the run that never stopped

    resumed = make_state(strategy, seed=5)  # a fresh optimizer: no slots yet
    status = resumed.checkpoint().restore(path)
    with pytest.raises(AssertionError, match="not fully consumed: optimizer slot values waiting") as pending:
        status.assert_consumed()
    assert str(slot_keys(NET_TRAINABLE_KEYS)) in str(pending.value)
    status.assert_existing_objects_matched().assert_nontrivial_match()  # what exists now did match
    assert int(resumed.optimizer.iterations.numpy()) == 3
    with pytest.raises(KeyError):
        resumed.optimizer.get_slot(resumed.net.scale, "m")

    if trigger == "build":
        first_layer_w = resumed.net.layers[0].w
        resumed.optimizer.build([first_layer_w])
        with pytest.raises(AssertionError) as still_pending:
            status.assert_consumed()
        assert str(slot_keys([k for k in NET_TRAINABLE_KEYS if k != "model/layers/0/w"])) in str(still_pending.value)
        resumed.optimizer.build(resumed.net.trainable_variables)
        status.assert_consumed()
        assert_restored(variables_of(resumed), saved)  # the slots got the saved values when created
        train(resumed, steps=2, first_step=3)
    else:
        train(resumed, steps=1, first_step=3)
        status.assert_consumed()
        train(resumed, steps=1, first_step=4)

    assert_same_values(values(variables_of(resumed)), values(variables_of(uninterrupted)))


# --- 5. crash safety: SIGKILL during a save ----------------------------------------------------


class Child:
    """``checkpoint_child.py`` in a child process; every wait on it is bounded."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.directory = tmp_path / "ckpts"
        self.directory.mkdir()
        self._stderr_path = tmp_path / "child-stderr.txt"
        self._stderr = open(self._stderr_path, "wb")  # a file, not a pipe: it cannot fill up and block the child
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, CHILD_SCRIPT, str(self.directory), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
        )
        self._buffer = b""

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=CHILD_WAIT_SECONDS)
        for stream in (self.process.stdin, self.process.stdout, self._stderr):
            if stream is not None:
                stream.close()

    def _diagnostics(self) -> str:
        self._stderr.flush()
        return f"child exit status {self.process.poll()}; stderr:\n{self._stderr_path.read_text(errors='replace')}"

    def line(self) -> str:
        """The child's next line of output, waiting at most ``CHILD_WAIT_SECONDS``."""
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        deadline = time.monotonic() + CHILD_WAIT_SECONDS
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"the child printed no line within {CHILD_WAIT_SECONDS} s. {self._diagnostics()}")
            ready, _, _ = select.select([descriptor], [], [], remaining)
            if ready:
                chunk = os.read(descriptor, 4096)
                if not chunk:
                    self.process.wait(timeout=CHILD_WAIT_SECONDS)
                    pytest.fail(f"the child closed its output. {self._diagnostics()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def expect(self, start: str) -> str:
        """Reads a line that must start with ``start``; returns the rest."""
        line = self.line()
        assert line.startswith(start), f"expected {start!r}..., got {line!r}. {self._diagnostics()}"
        return line[len(start):]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(timeout=CHILD_WAIT_SECONDS) == -signal.SIGKILL

    def resume(self) -> None:
        """Lets a blocked child go on with its save."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"continue\n")
        self.process.stdin.flush()

    def exit_status(self) -> int:
        return self.process.wait(timeout=CHILD_WAIT_SECONDS)


KILL_POINTS = {  # name: (os function the child blocks in, which call of it during the second write)
    "data_fsync": ("fsync", 1),
    "before_data_rename": ("replace", 1),
    "before_index_rename": ("replace", 2),
    "before_state_rename": ("replace", 3),
}


def blocked_file(kill_point: str, name: str) -> str:
    """A regular expression of the file the child reports at ``kill_point`` (``name``: the second prefix's)."""
    return {
        "data_fsync": r"\.tmp-\w+\.part",
        "before_data_rename": rf"{name}\.data-[0-9a-f]{{16}}\.npz",
        "before_index_rename": rf"{name}\.index\.json",
        "before_state_rename": "checkpoint",
    }[kill_point]


def restored_child_values(path: str) -> dict[str, np.ndarray]:
    ckpt = checkpoint_child.make_objects()
    ckpt.restore(path).assert_consumed()
    return checkpoint_child.read_values(ckpt)


def assert_child_values(path: str, n: int) -> None:
    assert_same_values(restored_child_values(path), checkpoint_child.expected(n))


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(select, "select"), reason="needs POSIX signals")
@pytest.mark.parametrize(
    "saver, kill_point",
    [("save", point) for point in KILL_POINTS] + [("write", point) for point in KILL_POINTS if "state" not in point],
)
def test_sigkill_in_the_middle_of_a_save_leaves_the_previous_checkpoint(tmp_path, saver, kill_point):
    function, k = KILL_POINTS[kill_point]
    with Child(tmp_path, "block", saver, function, str(k)) as child:
        directory = child.directory
        first = str(directory / ("ckpt-1" if saver == "save" else "ckpt"))
        second = str(directory / ("ckpt-2" if saver == "save" else "ckpt"))
        assert child.expect("SAVED ") == first
        blocked = child.expect("BLOCKED ")
        # The child stopped exactly where this case says, in the second write, before that step ran.
        assert re.fullmatch(rf"{function} {blocked_file(kill_point, os.path.basename(second))}", blocked), blocked
        names = {p.name for p in directory.iterdir()}
        temporaries = [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
        assert len(temporaries) == 1, names
        if kill_point == "data_fsync":
            assert temporaries[0].read_bytes().startswith(b"PK\x03\x04"), "the temporary being synced is the npz"
        new_data_files = len(data_files(second)) - (1 if saver == "write" else 0)
        assert new_data_files == (1 if kill_point in ("before_index_rename", "before_state_rename") else 0), names
        assert os.path.isfile(f"{second}.index.json") == (kill_point == "before_state_rename" or saver == "write")
        child.kill()

    if saver == "save":
        assert td.train.latest_checkpoint(str(directory)) == first
        if kill_point == "before_state_rename":
            assert_child_values(second, 2)  # complete (its index is the commit point), just not recorded
    assert_child_values(first, 1)
    assert any(p.name.startswith(".tmp-") for p in directory.iterdir())  # the crash left a stray temporary

    # Saving and restoring go on, unbothered by the strays. Young strays stay: they could
    # be another process's save in progress.
    ckpt = checkpoint_child.make_objects()
    ckpt.restore(first).assert_consumed()
    checkpoint_child.set_values(ckpt, 3)
    path = ckpt.save(str(directory / "ckpt")) if saver == "save" else ckpt.write(str(directory / "ckpt"))
    assert path == second
    killed_before_its_index = 1 if kill_point == "before_index_rename" else 0  # its data file has no index
    assert len(data_files(second)) == 1 + killed_before_its_index
    assert any(p.name.startswith(".tmp-") for p in directory.iterdir())
    assert_child_values(path, 3)

    # Once the strays are stale, the next save (or a manager's start) removes them, and no
    # data file an index points to, however old.
    age(*directory.iterdir())
    if saver == "save":
        assert td.train.latest_checkpoint(str(directory)) == second
        manager = td.train.CheckpointManager(ckpt, str(directory), max_to_keep=1)
        assert manager.latest_checkpoint == second
        assert_swept(directory)
        assert manager.save() == str(directory / "ckpt-3")
        assert manager.checkpoints == [str(directory / "ckpt-3")]
        assert_child_values(str(directory / "ckpt-3"), 3)
    else:
        assert ckpt.write(str(directory / "ckpt")) == second
        assert_swept(directory)


def age(*paths: Path, seconds: float = files.STALE_SECONDS + 60.0) -> None:
    """Makes ``paths`` look last modified ``seconds`` ago (by default: stale, older than the sweep's bound)."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def assert_swept(directory: Path) -> None:
    """No temporary file is left, and every prefix has exactly the one data file its index names."""
    names = sorted(p.name for p in directory.iterdir())
    assert not [n for n in names if n.startswith(".tmp-")], names
    for index in directory.glob("*.index.json"):
        prefix = str(index)[: -len(".index.json")]
        assert [p.name for p in data_files(prefix)] == [read_index(prefix)["data_file"]], names


KILL_AFTER = 5  # the parent kills the looping child once it has announced this save


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(select, "select"), reason="needs POSIX signals")
def test_sigkill_at_an_unchosen_moment_leaves_a_consistent_latest_checkpoint(tmp_path):
    with Child(tmp_path, "loop") as child:
        for n in range(1, KILL_AFTER + 1):
            assert child.expect("SAVING ") == str(n)
        child.kill()  # somewhere in save KILL_AFTER or a later one: wherever the child happens to be
    directory = str(child.directory)

    latest = td.train.latest_checkpoint(directory)
    assert latest is not None
    number = int(latest.rsplit("-", 1)[1])
    assert latest == os.path.join(directory, f"ckpt-{number}")
    assert number >= KILL_AFTER - 1  # save KILL_AFTER - 1 had returned when SAVING KILL_AFTER was printed
    ckpt = checkpoint_child.make_objects()
    ckpt.restore(latest).assert_consumed()
    assert_same_values(checkpoint_child.read_values(ckpt), checkpoint_child.expected(number))  # all from one save
    assert saved_counter(ckpt) == number

    manager = td.train.CheckpointManager(ckpt, directory, max_to_keep=2)
    assert manager.latest_checkpoint == latest
    assert manager.checkpoints[-1] == latest
    for path in manager.checkpoints:  # every checkpoint it lists is complete and holds its own save
        assert_child_values(path, int(path.rsplit("-", 1)[1]))
    checkpoint_child.set_values(ckpt, number + 1)
    assert manager.save() == os.path.join(directory, f"ckpt-{number + 1}")
    assert_child_values(manager.latest_checkpoint, number + 1)
    assert td.train.latest_checkpoint(directory) == manager.latest_checkpoint
    assert len(manager.checkpoints) == 2


# --- 6. corrupt, truncated and missing files ----------------------------------------------------


def seal(index: dict[str, Any]) -> None:
    """Sets ``index_sha256`` by the recipe docs/training.md documents (what a writer does)."""
    content = {k: v for k, v in index.items() if k != "index_sha256"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    index["index_sha256"] = hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _edit_index(prefix: Path, edit: Any, reseal: bool = True) -> Path:
    """Edits the index; ``reseal`` gives it a valid checksum (a wrong index written by other means)."""
    index = read_index(prefix)
    edit(index)
    if reseal:
        seal(index)
    path = Path(f"{prefix}.index.json")
    path.write_text(json.dumps(index), encoding="utf-8")
    return path


def _truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _flip_byte(path: Path) -> Path:
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x10
    path.write_bytes(bytes(content))
    return path


def _overwrite_index(prefix: Path, content: bytes) -> Path:
    path = Path(f"{prefix}.index.json")
    path.write_bytes(content)
    return path


def _delete_data(prefix: Path) -> Path:
    (path,) = data_files(prefix)
    path.unlink()
    return path


def _point_index_at_missing_data(prefix: Path) -> Path:
    sha256 = "0123456789abcdef" * 4
    missing = f"ckpt-1.data-{sha256[:16]}.npz"
    _edit_index(prefix, lambda index: index.update(data_file=missing, data_sha256=sha256))
    return prefix.parent / missing


def _edit_first_entry(prefix: Path, reseal: bool = True, **fields: Any) -> Path:
    """Edits the entry of ``model/layers/0/w``; the index is at fault."""
    return _edit_index(prefix, lambda index: index["entries"]["model/layers/0/w"].update(fields), reseal)


def _first_entry_shares_a_member(prefix: Path, reseal: bool) -> Path:
    """Points ``model/layers/0/w``'s entry at the array of another entry of the same shape and dtype."""
    index = read_index(prefix)
    other = index["entries"]["optimizer/.slots/model/layers/0/w/m"]["member"]
    return _edit_first_entry(prefix, reseal, member=other)


def _as_format_version_1(index: dict[str, Any]) -> None:
    index.update(format_version=1)
    del index["index_sha256"]


def _duplicate_key(prefix: Path) -> Path:
    path = Path(f"{prefix}.index.json")
    text = path.read_text(encoding="utf-8")
    return _overwrite_index(prefix, text.replace('"entries": {', '"data_size": 0,\n "entries": {', 1).encode())


def _drop_entry(index: dict[str, Any]) -> None:
    del index["entries"]["model/scale"]


INDEX_CHECKSUM = r"Checkpoint index .* is corrupt: its content does not match its index_sha256 checksum"
MALFORMED = r"Checkpoint index .* is malformed: "

CORRUPTIONS = {  # name: (corrupt(prefix) -> the file at fault, the message's first words)
    "truncated_data": (lambda p: _truncate(data_files(p)[0]), r"Checkpoint data file .* is truncated or corrupt"),
    "flipped_data_byte": (lambda p: _flip_byte(data_files(p)[0]), r"Checkpoint data file .* is corrupt: its SHA-256"),
    "deleted_data": (_delete_data, r"Checkpoint data file .* named by its index is missing"),
    "index_names_missing_data": (
        _point_index_at_missing_data, r"Checkpoint data file .* named by its index is missing"
    ),
    "truncated_index": (lambda p: _truncate(Path(f"{p}.index.json")), r"Checkpoint index .* is truncated or corrupt"),
    "empty_index": (lambda p: _overwrite_index(p, b""), r"Checkpoint index .* is truncated or corrupt"),
    "garbage_index": (
        lambda p: _overwrite_index(p, bytes(range(256)) * 3), r"Checkpoint index .* is truncated or corrupt"
    ),
    "index_with_a_duplicate_key": (
        _duplicate_key, r"Checkpoint index .* is truncated or corrupt \(duplicate key 'data_size'\)"
    ),
    "index_not_an_object": (lambda p: _overwrite_index(p, b"[1, 2, 3]"), r".* is not a towerdist checkpoint index"),
    "other_format": (
        lambda p: _edit_index(p, lambda i: i.update(format="tensorflow")), r".* is not a towerdist checkpoint index"
    ),
    "newer_format_version": (
        lambda p: _edit_index(p, lambda i: i.update(format_version=3)),
        r"Checkpoint .* has format_version 3; this towerdist reads version 2",
    ),
    "format_version_1": (
        lambda p: _edit_index(p, _as_format_version_1, reseal=False),
        r"Checkpoint .* has format_version 1, whose index carries no checksum",
    ),
    # Edits made without updating index_sha256, as a corrupted byte would make them.
    "entry_shares_a_member_unsealed": (lambda p: _first_entry_shares_a_member(p, reseal=False), INDEX_CHECKSUM),
    "entry_shape_edited_unsealed": (lambda p: _edit_first_entry(p, reseal=False, shape=[5, 3]), INDEX_CHECKSUM),
    "variable_name_edited_unsealed": (lambda p: _edit_first_entry(p, reseal=False, variable="v:0"), INDEX_CHECKSUM),
    "version_edited_unsealed": (
        lambda p: _edit_index(p, lambda i: i.update(format_version=3), reseal=False),
        INDEX_CHECKSUM + r" \(it says format_version 3",
    ),
    "checksum_edited": (
        lambda p: _edit_index(p, lambda i: i.update(index_sha256="0" * 64), reseal=False), INDEX_CHECKSUM
    ),
    "checksum_removed": (
        lambda p: _edit_index(p, lambda i: i.pop("index_sha256"), reseal=False),
        r"Checkpoint index .* is corrupt: its content has no index_sha256 checksum",
    ),
    # Checksum-valid indexes that are wrong all the same (written by other means).
    "index_without_entries": (lambda p: _edit_index(p, lambda i: i.pop("entries")), MALFORMED + "its fields are"),
    "entry_shares_a_member": (
        lambda p: _first_entry_shares_a_member(p, reseal=True),
        MALFORMED + r"entry '.*' names array 'a\d+', which another entry names too",
    ),
    "index_names_another_prefixs_data": (
        lambda p: _edit_index(p, lambda i: i.update(data_file=i["data_file"].replace("ckpt-1", "ckpt-2"))),
        MALFORMED + r"data_file is 'ckpt-2\.data-[0-9a-f]{16}\.npz', but the data file of .*ckpt-1 is named",
    ),
    "index_lists_fewer_arrays_than_the_data": (
        lambda p: _edit_index(p, _drop_entry), r"Checkpoint .*: .*\.npz holds arrays \['a\d+'\] that its index"
    ),
    "entry_names_missing_member": (
        lambda p: _edit_first_entry(p, member="a999"), r"Checkpoint .*: the index .* names array 'a999'"
    ),
    "entry_shape_disagrees_with_array": (
        lambda p: _edit_first_entry(p, shape=[5, 3]),
        r"Checkpoint .*: entry 'model/layers/0/w' holds an array of shape \(3, 5\)",
    ),
    "entry_dtype_disagrees_with_array": (
        lambda p: _edit_first_entry(p, dtype="float64"),
        r"Checkpoint .*: entry 'model/layers/0/w' holds an array of shape \(3, 5\) and dtype float32",
    ),
    "entry_dtype_is_not_a_dtype": (
        lambda p: _edit_first_entry(p, dtype="flo&t32"), MALFORMED + r"entry '.*' has dtype 'flo&t32', which is not"
    ),
    "entry_dtype_is_object": (
        lambda p: _edit_first_entry(p, dtype="object"), MALFORMED + r"entry '.*' has dtype 'object', which is not"
    ),
    "entry_dtype_is_not_written_so": (
        lambda p: _edit_first_entry(p, dtype="f4"), MALFORMED + r"entry '.*' has dtype 'f4', which is not"
    ),
    "entry_shape_is_negative": (
        lambda p: _edit_first_entry(p, shape=[-3, 5]), MALFORMED + r"entry '.*' has shape \[-3, 5\], not a list"
    ),
}


@pytest.fixture
def saved_and_target(tmp_path, mirrored_2cpu):
    """A checkpoint of a trained 2-replica state, and a differently initialised state to restore into."""
    source = make_state(mirrored_2cpu)
    train(source, steps=2)
    prefix = Path(source.checkpoint().save(str(tmp_path / "ckpt")))
    target = make_state(mirrored_2cpu, seed=4, build=True)
    train(target, steps=1)
    return prefix, target


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_checkpoint_raises_data_loss_naming_the_file_and_changes_nothing(saved_and_target, corruption):
    prefix, target = saved_and_target
    corrupt, first_words = CORRUPTIONS[corruption]
    at_fault = corrupt(prefix)
    ckpt = target.checkpoint()
    before = snapshot(variables_of(target))

    with pytest.raises(DataLossError, match=first_words) as error:
        ckpt.restore(str(prefix))

    assert error.value.path == str(at_fault)
    assert str(at_fault) in str(error.value)
    assert_unchanged(before, snapshot(variables_of(target)))
    assert saved_counter(ckpt) == 0


def two_variable_checkpoint(tmp_path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """A checkpoint of two variables of the same shape and dtype (which a swapped index would mix up)."""
    saved = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([30.0, 40.0], np.float32)}
    path = td.train.Checkpoint(**{k: td.Variable(v) for k, v in saved.items()}).write(str(tmp_path / "ckpt"))
    return path, saved


def test_an_index_with_swapped_members_raises_data_loss_and_changes_nothing(tmp_path):
    path, _ = two_variable_checkpoint(tmp_path)

    def swap(index: dict[str, Any]) -> None:
        a, b = index["entries"]["a"], index["entries"]["b"]
        a["member"], b["member"] = b["member"], a["member"]

    index_file = _edit_index(Path(path), swap, reseal=False)
    targets = {"a": td.Variable(np.zeros(2, np.float32)), "b": td.Variable(np.zeros(2, np.float32))}
    with pytest.raises(DataLossError, match=INDEX_CHECKSUM) as error:
        td.train.Checkpoint(**targets).restore(path)
    assert error.value.path == str(index_file)
    for variable in targets.values():
        np.testing.assert_array_equal(variable.numpy(), np.zeros(2, np.float32))


@pytest.mark.parametrize("bit", range(8))
def test_every_flipped_bit_of_the_index_raises_data_loss_and_changes_nothing(tmp_path, bit):
    path, saved = two_variable_checkpoint(tmp_path)
    index_file = Path(f"{path}.index.json")
    original = index_file.read_bytes()
    targets = {"a": td.Variable(np.zeros(2, np.float32)), "b": td.Variable(np.zeros(2, np.float32))}
    ckpt = td.train.Checkpoint(**targets)
    # Every byte, this bit: key names, member names, shapes, dtypes, the data file's name,
    # sizes, hashes, the version, punctuation and whitespace. The index holds no tab or
    # carriage return, so no flip turns whitespace into other whitespace: each one fails.
    for offset in range(len(original)):
        flipped = bytearray(original)
        flipped[offset] ^= 1 << bit
        index_file.write_bytes(bytes(flipped))
        context = original[max(0, offset - 20):offset + 20]
        where = f"bit {bit} of byte {offset}: {original[offset:offset + 1]!r} in {context!r}"
        with pytest.raises(DataLossError) as error:
            ckpt.restore(path)
            pytest.fail(f"restored without error after flipping {where}")
        assert error.value.path == str(index_file), where
        for variable in targets.values():
            np.testing.assert_array_equal(variable.numpy(), np.zeros(2, np.float32), err_msg=where)
        assert saved_counter(ckpt) == 0, where
    index_file.write_bytes(original)
    ckpt.restore(path).assert_consumed()  # the intact index restores
    for name, variable in targets.items():
        np.testing.assert_array_equal(variable.numpy(), saved[name])


def test_missing_checkpoint_raises_not_found_naming_the_index(tmp_path):
    v = td.Variable(np.arange(3, dtype=np.float32))
    missing = str(tmp_path / "nothing-1")
    with pytest.raises(NotFoundError, match="Failed to find any matching files for") as error:
        td.train.Checkpoint(v=v).restore(missing)
    assert error.value.path == f"{missing}.index.json"
    assert f"{missing}.index.json" in str(error.value) and "Pass the prefix that save() or write() returned" in str(
        error.value
    )
    np.testing.assert_array_equal(v.numpy(), np.arange(3, dtype=np.float32))


def test_a_directory_instead_of_a_prefix_gets_a_hint(tmp_path):
    v = td.Variable(np.float32(1.0))
    ckpt = td.train.Checkpoint(v=v)
    ckpt.save(str(tmp_path / "ckpt"))
    with pytest.raises(NotFoundError, match="Failed to find any matching files") as error:
        ckpt.restore(str(tmp_path))
    assert f"{str(tmp_path)!r} is a directory: pass td.train.latest_checkpoint(" in str(error.value)


def test_the_index_file_name_instead_of_the_prefix_is_not_found(tmp_path):
    ckpt = td.train.Checkpoint(v=td.Variable(np.float32(1.0)))
    path = ckpt.save(str(tmp_path / "ckpt"))
    with pytest.raises(NotFoundError, match="without the .index.json suffix"):
        ckpt.restore(f"{path}.index.json")


# --- 7. shape and dtype mismatches --------------------------------------------------------------


class Small(td.Module):
    def __init__(self, b_shape: tuple[int, ...], b_dtype: Any, fill: float) -> None:
        super().__init__()
        self.a = td.Variable(np.full(3, fill, np.float32))
        self.b = td.Variable(np.full(b_shape, fill, b_dtype))
        self.c = td.Variable(np.full((2, 2), fill, np.float32))


@pytest.mark.parametrize("slots", ["built", "deferred"])
@pytest.mark.parametrize("mismatch", ["shape", "dtype"])
@pytest.mark.parametrize("strategy_name", ["default", "mirrored_2cpu"])
def test_shape_or_dtype_mismatch_raises_naming_the_key_and_changes_nothing(
    request, tmp_path, strategy_name, mismatch, slots
):
    strategy = request.getfixturevalue(strategy_name)
    with strategy.scope():
        model = Small((2,), np.float32, 1.0)
        optimizer = td.optimizers.SGD(0.1, momentum=0.9)
    optimizer.apply_gradients([(np.ones_like(v.numpy()), v) for v in model.trainable_variables])
    path = td.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

    b_shape, b_dtype = ((4,), np.float32) if mismatch == "shape" else ((2,), np.float64)
    with strategy.scope():
        other = Small(b_shape, b_dtype, 7.0)
        other_optimizer = td.optimizers.SGD(0.1, momentum=0.9)
    if slots == "built":
        other_optimizer.build(other.trainable_variables)
    ckpt = td.train.Checkpoint(model=other, optimizer=other_optimizer)
    watched = {"a": other.a, "b": other.b, "c": other.c, "iterations": other_optimizer.iterations,
               "save_counter": ckpt.save_counter}
    before = snapshot(watched)

    with pytest.raises(ValueError, match=r"^Cannot restore .*ckpt-1: 'model/b' \(") as error:
        ckpt.restore(path)
    message = str(error.value)
    detail = "shape (2,), the variable has shape (4,)" if mismatch == "shape" else "dtype float32, the variable has"
    assert detail in message
    assert "'optimizer/.slots/model/b/momentum'" in message  # the slot of b mismatches too, built or not
    assert "'model/a'" not in message and "'model/c'" not in message
    assert "No variable was changed" in message
    assert_unchanged(before, snapshot(watched))  # not even a and c, whose values did match
    other_optimizer.build(other.trainable_variables)
    for variable in other.trainable_variables:  # and no slot value was left waiting for its slot
        np.testing.assert_array_equal(other_optimizer.get_slot(variable, "momentum").numpy(), 0)


# --- 8. CheckpointManager ---------------------------------------------------------------------


def counter_checkpoint() -> tuple[td.train.Checkpoint, Any]:
    v = td.Variable(np.zeros(4, np.float32))
    return td.train.Checkpoint(v=v), v


def state_file(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "checkpoint").read_text(encoding="utf-8"))


def checkpoint_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ckpt-"))


def assert_files(directory: Path, *numbers: int) -> None:
    """The directory holds exactly the index and the one data file of checkpoints ``numbers``."""
    got = sorted(re.sub(r"data-[0-9a-f]{16}", "data-*", name) for name in checkpoint_files(directory))
    assert got == sorted(name for n in numbers for name in (f"ckpt-{n}.index.json", f"ckpt-{n}.data-*.npz"))


def save_numbered(manager: td.train.CheckpointManager, v: Any, count: int) -> list[str]:
    paths = []
    for _ in range(count):
        v.assign(np.full(4, saved_counter(manager.checkpoint) + 1, np.float32))
        paths.append(manager.save())
    return paths


def test_manager_keeps_the_newest_max_to_keep_and_records_them(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    assert manager.directory == str(tmp_path) and manager.checkpoint is ckpt

    paths = save_numbered(manager, v, 5)

    assert paths == [str(tmp_path / f"ckpt-{n}") for n in range(1, 6)]
    assert manager.checkpoints == paths[-2:]
    assert manager.latest_checkpoint == paths[-1] == td.train.latest_checkpoint(str(tmp_path))
    assert_files(tmp_path, 4, 5)  # index and data of the older ones are gone
    state = state_file(tmp_path)
    assert state["model_checkpoint_path"] == "ckpt-5"
    assert state["all_model_checkpoint_paths"] == ["ckpt-4", "ckpt-5"]
    assert len(state["all_model_checkpoint_timestamps"]) == 2
    restored, w = counter_checkpoint()
    restored.restore(manager.checkpoints[0]).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 4, np.float32))


def test_manager_with_max_to_keep_none_keeps_everything(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=None)
    paths = save_numbered(manager, v, 4)
    assert manager.checkpoints == paths
    assert_files(tmp_path, 1, 2, 3, 4)
    assert state_file(tmp_path)["all_model_checkpoint_paths"] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]


def test_a_new_manager_recovers_the_checkpoints_and_goes_on(tmp_path):
    ckpt, v = counter_checkpoint()
    first = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3)
    save_numbered(first, v, 4)

    resumed_ckpt, w = counter_checkpoint()
    second = td.train.CheckpointManager(resumed_ckpt, str(tmp_path), max_to_keep=3)
    assert second.checkpoints == first.checkpoints == [str(tmp_path / f"ckpt-{n}") for n in (2, 3, 4)]
    assert second.latest_checkpoint == first.latest_checkpoint
    resumed_ckpt.restore(second.latest_checkpoint).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 4, np.float32))
    assert save_numbered(second, w, 1) == [str(tmp_path / "ckpt-5")]  # numbering continues from save_counter
    assert second.checkpoints == [str(tmp_path / f"ckpt-{n}") for n in (3, 4, 5)]
    assert_files(tmp_path, 3, 4, 5)


def test_a_new_manager_skips_listed_checkpoints_whose_files_are_gone(tmp_path):
    ckpt, v = counter_checkpoint()
    save_numbered(td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3), v, 3)
    os.remove(tmp_path / "ckpt-2.index.json")
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3)
    assert manager.checkpoints == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-3")]


def test_manager_checkpoint_number_names_the_file_and_still_counts_saves(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2, checkpoint_name="model")
    assert manager.save(checkpoint_number=100) == str(tmp_path / "model-100")
    assert manager.save(checkpoint_number=np.int64(7)) == str(tmp_path / "model-7")
    assert saved_counter(ckpt) == 2
    assert manager.save() == str(tmp_path / "model-3")
    assert manager.checkpoints == [str(tmp_path / "model-7"), str(tmp_path / "model-3")]
    assert td.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model-3")
    assert not (tmp_path / "model-100.index.json").exists()


def test_manager_checkpoint_interval_skips_saves_until_enough_steps(tmp_path):
    ckpt, _ = counter_checkpoint()
    step = td.Variable(np.int64(0), trainable=False)
    manager = td.train.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=None, step_counter=step, checkpoint_interval=3
    )
    assert manager.checkpoint_interval == 3
    saved_at = {}
    for current in range(8):
        step.assign(current)
        saved_at[current] = manager.save()
    assert [s for s, path in saved_at.items() if path is not None] == [0, 3, 6]
    assert saved_at[6] == str(tmp_path / "ckpt-3")
    step.assign(7)
    assert manager.save(check_interval=False) == str(tmp_path / "ckpt-4")  # forced
    assert manager.save() is None  # the forced save counts: 7 - 7 < 3


def test_a_manager_never_deletes_checkpoints_saved_by_checkpoint_save(tmp_path):
    # TensorFlow 2.21 (its testContinueFromUnmanaged): Checkpoint.save(prefix) twice, then a manager
    # with max_to_keep=2: latest 'unusual_prefix-2', checkpoints [], save_counter 2; three saves
    # list ['ckpt-3'], ['ckpt-3', 'ckpt-4'], ['ckpt-4', 'ckpt-5']; unusual_prefix-1 and -2 stay.
    ckpt, _ = counter_checkpoint()
    first = ckpt.save(str(tmp_path / "unusual_prefix"))
    second = ckpt.save(str(tmp_path / "unusual_prefix"))
    resumed, _ = counter_checkpoint()
    manager = td.train.CheckpointManager(resumed, str(tmp_path), max_to_keep=2)
    assert manager.latest_checkpoint == second
    assert manager.checkpoints == []
    resumed.restore(manager.latest_checkpoint)
    assert saved_counter(resumed) == 2
    lists = []
    for _ in range(3):
        manager.save()
        lists.append([os.path.basename(p) for p in manager.checkpoints])
    assert lists == [["ckpt-3"], ["ckpt-3", "ckpt-4"], ["ckpt-4", "ckpt-5"]]
    assert files.checkpoint_exists(first) and files.checkpoint_exists(second)
    again = td.train.CheckpointManager(resumed, str(tmp_path), max_to_keep=2)
    assert [os.path.basename(p) for p in again.checkpoints] == ["ckpt-4", "ckpt-5"]


def test_a_manager_never_deletes_a_checkpoint_written_with_checkpoint_write(tmp_path):
    # TensorFlow 2.21: Checkpoint.write('<dir>/unusual_prefix-2') then a manager (max_to_keep=1):
    # latest None, checkpoints []; its saves never touch the written checkpoint's files.
    ckpt, _ = counter_checkpoint()
    written = ckpt.write(str(tmp_path / "unusual_prefix-2"))
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    for _ in range(3):
        manager.save()
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-3"]
    assert files.checkpoint_exists(written)


def test_manager_with_an_interval_saves_once_per_step_even_when_forced(tmp_path):
    # TensorFlow 2.21, checkpoint_interval=10: step 0 save(check_interval=False) twice -> a path,
    # then None; save() -> None; step 5: save() None, forced save a path, forced again None;
    # step 10: save() None (5 steps since the forced save), forced a path; step 12 None; 25 a path;
    # save(checkpoint_number=7, check_interval=False) at step 25 again -> None.
    ckpt, _ = counter_checkpoint()
    step = td.Variable(np.int64(0), trainable=False)
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=5, step_counter=step, checkpoint_interval=10)
    outcomes = []
    for value, check in [(0, False), (0, False), (0, True), (5, True), (5, False), (5, False), (10, True),
                         (10, False), (12, True), (25, True), (25, False)]:
        step.assign(value)
        path = manager.save(check_interval=check) if value != 25 or check else manager.save(7, check_interval=False)
        outcomes.append(None if path is None else os.path.basename(path))
    assert outcomes == ["ckpt-1", None, None, None, "ckpt-2", None, None, "ckpt-3", None, "ckpt-4", None]
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]


def test_manager_without_an_interval_saves_every_time_at_one_step(tmp_path):
    # TensorFlow 2.21: a step_counter without checkpoint_interval: three saves at one step write three.
    ckpt, _ = counter_checkpoint()
    step = td.Variable(np.int64(3), trainable=False)
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=5, step_counter=step)
    paths = [manager.save(), manager.save(), manager.save(check_interval=False)]
    assert [os.path.basename(p) for p in paths] == ["ckpt-1", "ckpt-2", "ckpt-3"]


def test_restore_or_initialize_calls_init_fn_only_when_there_is_no_checkpoint(tmp_path):
    calls = []
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=1, init_fn=lambda: calls.append(v.assign(np.ones(4, np.float32)))
    )
    assert manager.restore_or_initialize() is None
    assert len(calls) == 1
    v.assign(np.full(4, 2.5, np.float32))
    path = manager.save()

    restored, w = counter_checkpoint()
    again = td.train.CheckpointManager(
        restored, str(tmp_path), max_to_keep=1, init_fn=lambda: calls.append("called")
    )
    assert again.restore_or_initialize() == path
    assert len(calls) == 1
    np.testing.assert_array_equal(w.numpy(), np.full(4, 2.5, np.float32))
    empty = td.train.CheckpointManager(counter_checkpoint()[0], str(tmp_path / "empty"), max_to_keep=1)
    assert empty.restore_or_initialize() is None  # no init_fn: nothing to do


@pytest.mark.parametrize("max_to_keep", [0, -1, 1.5, True, "3"])
def test_manager_rejects_an_invalid_max_to_keep(tmp_path, max_to_keep):
    with pytest.raises(ValueError, match=r"^Expected a positive integer or `None` for `max_to_keep`, got"):
        td.train.CheckpointManager(counter_checkpoint()[0], str(tmp_path), max_to_keep=max_to_keep)


@pytest.mark.parametrize(
    "interval, with_step_counter, first_words",
    [
        (2, False, "`step_counter` should be passed if `checkpoint_interval` is not None."),
        (0, True, "`checkpoint_interval` must be a positive integer, got 0."),
        (1.5, True, "`checkpoint_interval` must be a positive integer, got 1.5."),
    ],
)
def test_manager_rejects_bad_interval_arguments(tmp_path, interval, with_step_counter, first_words):
    step_counter = td.Variable(np.int64(0)) if with_step_counter else None
    with pytest.raises(ValueError, match=f"^{re.escape(first_words)}"):
        td.train.CheckpointManager(
            counter_checkpoint()[0], str(tmp_path), max_to_keep=1, step_counter=step_counter,
            checkpoint_interval=interval,
        )


def test_manager_needs_a_checkpoint(tmp_path):
    with pytest.raises(TypeError, match="^CheckpointManager needs a td.train.Checkpoint"):
        td.train.CheckpointManager({"v": td.Variable(1.0)}, str(tmp_path), max_to_keep=1)


def test_manager_keep_checkpoint_every_n_hours_keeps_swept_files_on_disk(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1, keep_checkpoint_every_n_hours=0.0)
    save_numbered(manager, v, 3)
    assert manager.checkpoints == [str(tmp_path / "ckpt-3")]
    assert_files(tmp_path, 1, 2, 3)  # no longer managed, but preserved


def test_latest_checkpoint_is_none_without_a_complete_latest_checkpoint(tmp_path):
    assert td.train.latest_checkpoint(str(tmp_path)) is None  # empty directory
    assert td.train.latest_checkpoint(str(tmp_path / "no-such-dir")) is None
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    save_numbered(manager, v, 2)
    assert td.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-2")
    os.remove(tmp_path / "ckpt-2.index.json")
    for data in data_files(tmp_path / "ckpt-2"):
        data.unlink()
    assert td.train.latest_checkpoint(str(tmp_path)) is None  # ckpt-1 is complete, but not the latest


# --- 9. Checkpoint API details -------------------------------------------------------------------


def test_save_numbers_from_the_save_counter_which_is_saved_and_restored(tmp_path):
    ckpt, v = counter_checkpoint()
    prefix = str(tmp_path / "ckpt")
    assert saved_counter(ckpt) == 0
    assert [ckpt.save(prefix) for _ in range(3)] == [f"{prefix}-{n}" for n in (1, 2, 3)]
    assert saved_counter(ckpt) == 3
    assert td.train.latest_checkpoint(str(tmp_path)) == f"{prefix}-3"
    assert read_index(f"{prefix}-2")["entries"]["save_counter"]["shape"] == []

    restored, _ = counter_checkpoint()
    restored.restore(f"{prefix}-2").assert_consumed()
    assert saved_counter(restored) == 2
    assert restored.save(prefix) == f"{prefix}-3"  # numbering continues from the restored counter


def test_write_does_not_touch_the_save_counter_or_the_state_file(tmp_path):
    ckpt, _ = counter_checkpoint()
    assert ckpt.write(str(tmp_path / "plain")) == str(tmp_path / "plain")
    assert saved_counter(ckpt) == 0
    assert not (tmp_path / "checkpoint").exists()
    assert td.train.latest_checkpoint(str(tmp_path)) is None
    restored, _ = counter_checkpoint()
    restored.read(str(tmp_path / "plain")).assert_consumed()


@pytest.mark.parametrize("same_values", [True, False])
def test_rewriting_a_prefix_leaves_one_data_file(tmp_path, same_values):
    ckpt, v = counter_checkpoint()
    prefix = str(tmp_path / "model")
    v.assign(np.full(4, 1.0, np.float32))
    ckpt.write(prefix)
    old = data_files(prefix)
    if not same_values:
        v.assign(np.full(4, 2.0, np.float32))
    ckpt.write(prefix)
    assert len(data_files(prefix)) == 1
    assert (data_files(prefix) == old) == same_values
    assert read_index(prefix)["data_file"] == data_files(prefix)[0].name
    restored, w = counter_checkpoint()
    restored.restore(prefix).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), v.numpy())


def test_restore_none_restores_nothing_and_its_asserts_raise():
    ckpt, v = counter_checkpoint()
    status = ckpt.restore(None)
    assert status.expect_partial() is status
    status.run_restore_ops()
    for check in (status.assert_consumed, status.assert_existing_objects_matched, status.assert_nontrivial_match):
        with pytest.raises(AssertionError, match=r"^No checkpoint specified \(save_path=None\)"):
            check()
    np.testing.assert_array_equal(v.numpy(), np.zeros(4, np.float32))


def test_assert_nontrivial_match_fails_when_no_key_matches(tmp_path):
    v = td.Variable(np.ones(2, np.float32))
    path = td.train.Checkpoint(model=v).save(str(tmp_path / "ckpt"))
    w = td.Variable(np.zeros(2, np.float32))
    status = td.train.Checkpoint(net=w).restore(path)
    with pytest.raises(AssertionError, match="^Nothing except the save counter was restored from"):
        status.assert_nontrivial_match()
    unmatched_both_ways = r"to no object: \['model'\]; variables with no value in the checkpoint: \['net'\]"
    with pytest.raises(AssertionError, match=unmatched_both_ways):
        status.assert_consumed()
    with pytest.raises(AssertionError, match=r"has no value for these variables: \['net'\]"):
        status.assert_existing_objects_matched()
    assert status.expect_partial() is status
    np.testing.assert_array_equal(w.numpy(), np.zeros(2, np.float32))


def test_assert_existing_objects_matched_allows_extra_saved_values(tmp_path):
    source = make_state(td.distribute.get_strategy())
    train(source, steps=1)
    path = td.train.Checkpoint(model=source.net, optimizer=source.optimizer, extra=td.Variable(3.0)).save(
        str(tmp_path / "ckpt")
    )
    net = Net(seed=8)
    status = td.train.Checkpoint(model=net).restore(path)  # no optimizer, no extra
    status.assert_existing_objects_matched().assert_nontrivial_match()
    with pytest.raises(AssertionError, match=r"matched to no object: \['extra', 'optimizer/.slots/model/layers"):
        status.assert_consumed()
    for mine, theirs in zip(net.variables, source.net.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


@pytest.mark.parametrize("value", [3, 2.5, "w", np.zeros(3), None, object()])
def test_non_trackable_objects_are_rejected(value):
    with pytest.raises(ValueError, match="^Checkpoint was expecting model to be a trackable object"):
        td.train.Checkpoint(model=value)


@pytest.mark.parametrize("name", ["save_counter", "_private"])
def test_reserved_names_are_rejected(name):
    with pytest.raises(ValueError, match=f"^Checkpoint: the name {name!r} is reserved"):
        td.train.Checkpoint(**{name: td.Variable(1.0)})


def test_lists_dicts_and_escaped_names_are_keys(tmp_path):
    objects = {
        "layers": [td.Variable(np.float32(1)), "not trackable", td.Variable(np.float32(2))],
        "table": {"a/b": td.Variable(np.float32(3)), ".slots": td.Variable(np.float32(4)), "100%": td.Variable(5.0)},
    }
    path = td.train.Checkpoint(**objects).save(str(tmp_path / "ckpt"))
    keys = set(read_index(path)["entries"])
    assert keys == {"layers/0", "layers/2", "table/a%2Fb", "table/%2Eslots", "table/100%25", "save_counter"}

    fresh = {
        "layers": [td.Variable(np.float32(0)), "not trackable", td.Variable(np.float32(0))],
        "table": {"a/b": td.Variable(np.float32(0)), ".slots": td.Variable(np.float32(0)), "100%": td.Variable(0.0)},
    }
    td.train.Checkpoint(**fresh).restore(path).assert_consumed()
    assert [float(fresh["layers"][k].numpy()) for k in (0, 2)] == [1.0, 2.0]
    assert [float(v.numpy()) for v in fresh["table"].values()] == [3.0, 4.0, 5.0]


def test_dict_keys_must_be_strings(tmp_path):
    with pytest.raises(TypeError, match=r"^Checkpoint: the dict at 'table' has a key of type int"):
        td.train.Checkpoint(table={1: td.Variable(1.0)}).save(str(tmp_path / "ckpt"))


def test_a_variable_reachable_twice_is_saved_once_under_its_first_key(tmp_path):
    shared = td.Variable(np.arange(3, dtype=np.float32))
    module = td.Module()
    module.first = shared
    module.second = [shared]
    path = td.train.Checkpoint(a=shared, b=[shared], m=module).save(str(tmp_path / "ckpt"))
    assert set(read_index(path)["entries"]) == {"a", "save_counter"}
    again = td.Variable(np.zeros(3, np.float32))
    module.first = module.second[0] = again
    td.train.Checkpoint(a=again, b=[again], m=module).restore(path).assert_consumed()
    np.testing.assert_array_equal(again.numpy(), np.arange(3, dtype=np.float32))


def test_an_optimizer_without_its_model_is_refused_at_save(tmp_path):
    state = make_state(td.distribute.get_strategy())
    train(state, steps=1)
    ckpt = td.train.Checkpoint(optimizer=state.optimizer)
    with pytest.raises(ValueError, match=r"^Checkpoint: the optimizer at 'optimizer' has slots for \w+:0, which this"):
        ckpt.save(str(tmp_path / "ckpt"))
    assert saved_counter(ckpt) == 0  # the failed save did not count
    assert list(tmp_path.iterdir()) == []


def test_a_none_aggregation_sync_on_read_variable_is_refused_at_save(tmp_path, mirrored_2cpu):
    with mirrored_2cpu.scope():
        v = td.Variable(np.zeros(2, np.float32), synchronization=ON_READ, aggregation=A.NONE, name="per_replica")
    ckpt = td.train.Checkpoint(v=v)
    with pytest.raises(ValueError, match=r"^Checkpoint cannot save per_replica:0 \(at 'v'\): a sync-on-read variable"):
        ckpt.save(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="^Checkpoint cannot save per_replica:0"):
        ckpt.write(str(tmp_path / "plain"))
    assert saved_counter(ckpt) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("api", ["save", "write", "restore", "manager.save"])
def test_save_and_restore_inside_strategy_run_raise_context_error(tmp_path, mirrored_2cpu, api):
    with mirrored_2cpu.scope():
        v = td.Variable(np.ones(2, np.float32))
    ckpt = td.train.Checkpoint(v=v)
    path = ckpt.write(str(tmp_path / "ready"))
    calls = {
        "save": lambda: ckpt.save(str(tmp_path / "inside")),
        "write": lambda: ckpt.write(str(tmp_path / "inside")),
        "restore": lambda: ckpt.restore(path),
        "manager.save": lambda: manager.save(),
    }
    manager = td.train.CheckpointManager(ckpt, str(tmp_path / "manager-dir"), max_to_keep=1)
    called = "CheckpointManager.save" if api == "manager.save" else f"Checkpoint.{api}"

    with pytest.raises(td.errors.ContextError, match=rf"^{called}\(\) must be called outside strategy.run"):
        mirrored_2cpu.run(calls[api])
    assert saved_counter(ckpt) == 0
    assert manager.latest_checkpoint is None and list((tmp_path / "manager-dir").iterdir()) == []
    assert not list(tmp_path.glob("inside*"))
    ckpt.restore(path).assert_consumed()  # fine between steps, and the strategy still works
    replica_ids = mirrored_2cpu.run(lambda: td.distribute.get_replica_context().replica_id_in_sync_group)
    assert [int(r) for r in mirrored_2cpu.experimental_local_results(replica_ids)] == [0, 1]


def test_the_index_documents_the_format(tmp_path, mirrored_2cpu):
    state = make_state(mirrored_2cpu)
    train(state, steps=1)
    path = state.checkpoint().save(str(tmp_path / "ckpt"))
    index = read_index(path)
    assert list(index) == [
        "format", "format_version", "towerdist_version", "data_file", "data_sha256", "data_size", "entries",
        "index_sha256",
    ]
    assert index["format"] == "towerdist-checkpoint"
    assert index["format_version"] == 2
    assert index["towerdist_version"] == td.__version__
    recorded = index["index_sha256"]
    seal(index)  # the documented recipe gives the recorded checksum
    assert index["index_sha256"] == recorded
    (data,) = data_files(path)
    assert index["data_file"] == data.name
    assert re.fullmatch(r"ckpt-1\.data-[0-9a-f]{16}\.npz", data.name)
    assert data.name == f"ckpt-1.data-{index['data_sha256'][:16]}.npz"
    assert index["data_size"] == data.stat().st_size
    entries = index["entries"]
    assert list(entries) == sorted(entries)
    assert set(entries) == {
        *NET_TRAINABLE_KEYS, "model/seen", *slot_keys(NET_TRAINABLE_KEYS), "optimizer/iterations",
        "metric/total", "metric/count", "save_counter",
    }
    assert entries["model/layers/0/w"] | {"member": "-"} == {
        "member": "-", "shape": [3, 5], "dtype": "float32", "variable": "w:0", "class": "MirroredVariable",
        "synchronization": "ON_WRITE", "aggregation": "NONE",
    }
    assert entries["model/seen"]["dtype"] == "int64" and entries["model/seen"]["shape"] == []
    assert entries["metric/total"]["class"] == "SyncOnReadVariable"
    assert (entries["metric/total"]["synchronization"], entries["metric/total"]["aggregation"]) == ("ON_READ", "SUM")
    assert entries["optimizer/iterations"]["aggregation"] == "ONLY_FIRST_REPLICA"
    with np.load(data, allow_pickle=False) as archive:  # a plain npz: one member per entry, no pickles
        assert sorted(archive.files) == sorted(e["member"] for e in entries.values())
        np.testing.assert_array_equal(archive[entries["model/layers/0/w"]["member"]], state.net.layers[0].w.numpy())
        np.testing.assert_array_equal(archive[entries["metric/count"]["member"]], state.metric.count.numpy())


def test_root_lends_its_dependencies_to_the_checkpoint(tmp_path):
    module = td.Module()
    module.a = td.Variable(np.float32(2.0))
    module.b = [td.Variable(np.float32(3.0))]
    path = td.train.Checkpoint(root=module).write(str(tmp_path / "root"))
    assert set(read_index(path)["entries"]) == {"a", "b/0", "save_counter"}
    with pytest.raises(ValueError, match="^Checkpoint was expecting root to be a trackable object"):
        td.train.Checkpoint(root=3)


def test_paths_may_be_pathlib_paths(tmp_path):
    ckpt, v = counter_checkpoint()
    v.assign(np.full(4, 6.0, np.float32))
    path = ckpt.save(tmp_path / "ckpt")
    assert path == str(tmp_path / "ckpt-1")
    assert td.train.latest_checkpoint(tmp_path) == path
    restored, w = counter_checkpoint()
    restored.restore(tmp_path / "ckpt-1").assert_consumed()
    np.testing.assert_array_equal(w.numpy(), v.numpy())
    manager = td.train.CheckpointManager(restored, tmp_path, max_to_keep=1)
    assert manager.latest_checkpoint == path
    assert manager.save() == str(tmp_path / "ckpt-2")


def test_manager_resaving_a_kept_number_makes_it_the_newest(tmp_path):
    ckpt, v = counter_checkpoint()
    manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    save_numbered(manager, v, 2)
    assert manager.save(checkpoint_number=1) == str(tmp_path / "ckpt-1")
    assert manager.checkpoints == [str(tmp_path / "ckpt-2"), str(tmp_path / "ckpt-1")]
    assert manager.save() == str(tmp_path / "ckpt-4")  # the fourth save
    assert manager.checkpoints == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-4")]
    assert_files(tmp_path, 1, 4)
    assert state_file(tmp_path)["all_model_checkpoint_paths"] == ["ckpt-1", "ckpt-4"]


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_checkpoint_files_get_the_mode_of_ordinarily_created_files(tmp_path, umask_022):
    ckpt, _ = counter_checkpoint()
    path = ckpt.save(str(tmp_path / "ckpt"))
    ordinary = tmp_path / "ordinary.txt"
    ordinary.write_text("x")
    expected_mode = stat.S_IMODE(ordinary.stat().st_mode)  # 0o644 under umask 022
    for written in (Path(f"{path}.index.json"), *data_files(path), tmp_path / "checkpoint"):
        assert oct(stat.S_IMODE(written.stat().st_mode)) == oct(expected_mode), written.name


# --- 10. dtypes: strings, dates, and what a checkpoint cannot hold -------------------------------


STRINGS = {
    "str": np.array([["a", "bc"], ["déjà", ""]]),  # numpy str_ ('<U4')
    "bytes": np.array([b"a", b"\x00\xffz", b""]),  # numpy bytes_ ('|S3')
}


def blank_like(values: np.ndarray, width: int | None = None) -> np.ndarray:
    dtype = values.dtype if width is None else np.dtype(f"{values.dtype.kind}{width}")
    return np.zeros(values.shape, dtype)  # empty strings


@pytest.mark.parametrize("kind", list(STRINGS))
@pytest.mark.parametrize("strategy_name", ["default", "mirrored_2cpu"])
def test_string_variables_save_and_restore(request, tmp_path, strategy_name, kind):
    strategy = request.getfixturevalue(strategy_name)
    values = STRINGS[kind]

    def make(initial: np.ndarray) -> dict[str, Any]:
        with strategy.scope():
            return {
                "mirrored": td.Variable(initial, trainable=False, name="vocabulary"),
                "on_read": td.Variable(initial, synchronization=ON_READ, aggregation=A.ONLY_FIRST_REPLICA),
            }

    source = make(values)
    path = td.train.Checkpoint(strings=source).save(str(tmp_path / "ckpt"))
    entry = read_index(path)["entries"]["strings/mirrored"]
    assert (entry["dtype"], entry["shape"]) == (values.dtype.str, list(values.shape))
    with np.load(data_files(path)[0], allow_pickle=False) as archive:  # no pickle needed to read them
        np.testing.assert_array_equal(archive[entry["member"]], values)

    target = make(blank_like(values))
    td.train.Checkpoint(strings=target).restore(path).assert_consumed()
    for name, variable in target.items():
        assert variable.dtype == values.dtype, name
        for k, copy in enumerate(copies(variable)):
            np.testing.assert_array_equal(copy, values, err_msg=f"{name}, copy {k}")


@pytest.mark.parametrize("width", [1, 4, 10], ids=lambda w: f"width{w}")
@pytest.mark.parametrize("kind", list(STRINGS))
def test_strings_restore_into_a_string_variable_of_any_width_as_assign_stores_them(tmp_path, kind, width):
    values = STRINGS[kind]  # up to 4 characters / 3 bytes long
    path = td.train.Checkpoint(v=td.Variable(values)).write(str(tmp_path / "ckpt"))
    assigned = td.Variable(blank_like(values, width))
    assigned.assign(values)  # what a string variable of this width makes of the saved strings
    target = td.Variable(blank_like(values, width), name="vocabulary")

    if np.array_equal(assigned.numpy(), values):
        td.train.Checkpoint(v=target).restore(path).assert_consumed()
        np.testing.assert_array_equal(target.numpy(), values)
        assert target.dtype == assigned.dtype
    else:  # variables of fixed width: restore refuses to cut a string, where assign() would
        with pytest.raises(ValueError, match=r"^Cannot restore .*: 'v' \(vocabulary:0\): the checkpoint holds strings"):
            td.train.Checkpoint(v=target).restore(path)
        np.testing.assert_array_equal(target.numpy(), blank_like(values, width))


@pytest.mark.parametrize("kind", list(STRINGS))
def test_a_restore_that_would_cut_strings_is_refused_and_changes_nothing(tmp_path, monkeypatch, kind):
    values = STRINGS[kind]
    path = td.train.Checkpoint(v=td.Variable(values, name="vocabulary"), w=td.Variable(1.0)).write(str(tmp_path / "c"))
    # A string variable that keeps its width when assigned (numpy's own conversion cuts longer strings).
    monkeypatch.setattr(checkpoint_module, "to_array", lambda array, dtype, what: array.astype(dtype))
    narrow = td.Variable(np.full(values.shape, "z" if kind == "str" else b"z"), name="vocabulary")
    other = td.Variable(0.0)
    longest, unit = (4, "characters") if kind == "str" else (3, "bytes")  # 'déjà', b'\x00\xffz'
    too_long = rf"the checkpoint holds strings of up to {longest} {unit}, longer than the variable's dtype"
    with pytest.raises(ValueError, match=r"^Cannot restore .*c: 'v' \(vocabulary:0\): " + too_long) as error:
        td.train.Checkpoint(v=narrow, w=other).restore(path)
    assert f"e.g. dtype='{values.dtype.kind}{longest}'" in str(error.value)
    np.testing.assert_array_equal(narrow.numpy(), np.full(values.shape, "z" if kind == "str" else b"z"))
    assert float(other.numpy()) == 0.0  # not even the variable that fitted


def test_str_and_bytes_strings_do_not_restore_into_each_other(tmp_path):
    path = td.train.Checkpoint(v=td.Variable(np.array(["ab", "c"]))).write(str(tmp_path / "ckpt"))
    as_bytes = td.Variable(np.array([b"xy", b"z"]))
    kinds = r"the checkpoint holds dtype <U2, the variable has dtype \|S2"
    with pytest.raises(ValueError, match=r"^Cannot restore .*: " + kinds):
        td.train.Checkpoint(v=as_bytes).restore(path)
    np.testing.assert_array_equal(as_bytes.numpy(), np.array([b"xy", b"z"]))


@pytest.mark.parametrize(
    "value",
    [
        np.array([True, False]),
        np.array([0, 255], np.uint8),
        np.array([-7, 7], np.int16),
        np.array([0.5, -2.0], np.float16),
        np.array([1.5, -2.0], ">f4"),  # big-endian
        np.array([1 + 2j, -3j], np.complex64),
        np.array(["2024-02-29T12:00:01", "1969-07-20T20:17:40"], "datetime64[s]"),
        np.array([1500, -3], "timedelta64[ms]"),
    ],
    ids=lambda v: v.dtype.str,
)
def test_every_storable_dtype_round_trips_exactly(tmp_path, value):
    path = td.train.Checkpoint(v=td.Variable(value)).write(str(tmp_path / "ckpt"))
    assert np.dtype(read_index(path)["entries"]["v"]["dtype"]) == value.dtype
    target = td.Variable(np.zeros_like(value))
    td.train.Checkpoint(v=target).restore(path).assert_consumed()
    assert target.dtype == value.dtype
    np.testing.assert_array_equal(target.numpy(), value)


UNSTORABLE = {  # name: (value, the dtype as the message prints it, words of the reason)
    "object": (np.array(["a", 1], dtype=object), "object", "object arrays can only be stored with pickle"),
    "structured": (np.zeros(2, [("x", "f4"), ("y", "i4")]), r"\[\('x', '<f4'\), \('y', '<i4'\)\]",
                   "structured and void dtypes have no TensorFlow dtype"),
    "void": (np.zeros(2, "V4"), r"\|V4", "structured and void dtypes have no TensorFlow dtype"),
    "string_dtype": (np.array(["a", "bc"], dtype=np.dtypes.StringDType()), r"StringDType\(\)",
                     "numpy's variable-width StringDType can only be stored with pickle"),
}


@pytest.mark.parametrize("api", ["save", "write", "manager.save"])
@pytest.mark.parametrize("dtype_name", list(UNSTORABLE))
def test_a_dtype_no_checkpoint_can_hold_is_refused_at_save_before_anything_is_written(tmp_path, dtype_name, api):
    value, printed, reason = UNSTORABLE[dtype_name]
    ckpt = td.train.Checkpoint(good=td.Variable(np.ones(2, np.float32)), zbad=td.Variable(value, name="bad"))
    saves = {
        "save": lambda: ckpt.save(str(tmp_path / "ckpt")),
        "write": lambda: ckpt.write(str(tmp_path / "ckpt")),
        "manager.save": lambda: td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1).save(),
    }
    prefix = re.escape(str(tmp_path / "ckpt"))
    with pytest.raises(TypeError, match=rf"^Checkpoint cannot save bad:0 \(at 'zbad'\) to {prefix}(-1)?: its dtype "
                                        rf"{printed} cannot be stored: {re.escape(reason)}") as error:
        saves[api]()
    assert "Checkpoints hold bool, integer, float, complex, string" in str(error.value)
    assert list(tmp_path.iterdir()) == []  # not a byte written
    assert saved_counter(ckpt) == 0


# --- 11. paths, the state file, and what crashed saves leave behind ---------------------------------


PATH_APIS = ["save", "write", "restore", "read", "latest_checkpoint", "CheckpointManager"]


@pytest.mark.parametrize("api", PATH_APIS)
def test_paths_may_be_bytes(tmp_path, monkeypatch, api):
    working = tmp_path / "working-directory"
    working.mkdir()
    monkeypatch.chdir(working)  # a bytes path mistaken for a str would land here
    directory = tmp_path / "ckpts"
    ckpt, v = counter_checkpoint()
    v.assign(np.full(4, 6.0, np.float32))
    saved = ckpt.save(str(directory / "ckpt"))
    restored, w = counter_checkpoint()
    encoded = os.fsencode

    if api == "save":
        assert ckpt.save(encoded(str(directory / "ckpt"))) == str(directory / "ckpt-2")
        assert td.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-2")
    elif api == "write":
        assert ckpt.write(encoded(str(directory / "plain"))) == str(directory / "plain")
        restored.restore(str(directory / "plain")).assert_consumed()
    elif api in ("restore", "read"):
        getattr(restored, api)(encoded(saved)).assert_consumed()
    elif api == "latest_checkpoint":
        assert td.train.latest_checkpoint(encoded(str(directory))) == saved
    else:
        manager = td.train.CheckpointManager(restored, encoded(str(directory)), max_to_keep=1)
        assert manager.directory == str(directory) and manager.latest_checkpoint == saved
        restored.restore(manager.latest_checkpoint).assert_consumed()
        assert manager.save() == str(directory / "ckpt-2")
    if api in ("write", "restore", "read", "CheckpointManager"):
        np.testing.assert_array_equal(w.numpy(), v.numpy())
    assert list(working.iterdir()) == []


@pytest.mark.parametrize("api", PATH_APIS)
def test_a_path_of_another_type_is_refused_naming_the_argument(tmp_path, api):
    ckpt, _ = counter_checkpoint()
    calls = {
        "save": (lambda: ckpt.save(7), r"Checkpoint\.save\(\) expects file_prefix"),
        "write": (lambda: ckpt.write(7), r"Checkpoint\.write\(\) expects file_prefix"),
        "restore": (lambda: ckpt.restore(7), r"Checkpoint\.restore\(\) expects save_path"),
        "read": (lambda: ckpt.read(7), r"Checkpoint\.restore\(\) expects save_path"),
        "latest_checkpoint": (lambda: td.train.latest_checkpoint(7), r"latest_checkpoint\(\) expects checkpoint_dir"),
        "CheckpointManager": (
            lambda: td.train.CheckpointManager(ckpt, 7, max_to_keep=1), r"CheckpointManager\(\) expects directory"
        ),
    }
    call, first_words = calls[api]
    with pytest.raises(TypeError, match=rf"^{first_words} to be a path: a str, bytes or os.PathLike. Got \w+=7 of type "
                                        rf"int; pass e.g."):
        call()
    assert saved_counter(ckpt) == 0


STATE_FILE_DAMAGE = {  # name: (the state file's bytes, given the valid state; the fault the warning names)
    "non_numeric_timestamp": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": ["yesterday", 1.0]}).encode(),
        r"all_model_checkpoint_timestamps\[0\] is 'yesterday', not a number of seconds",
    ),
    "null_timestamp": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": [1.0, None]}).encode(),
        r"all_model_checkpoint_timestamps\[1\] is None, not a number of seconds",
    ),
    "nan_timestamp": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": [1.0, float("nan")]}).encode(),
        r"all_model_checkpoint_timestamps\[1\] is nan, not a number of seconds",
    ),
    "timestamps_missing_one": (
        lambda state: json.dumps({**state, "all_model_checkpoint_timestamps": [1.0]}).encode(),
        r"it lists 2 checkpoints but 1 timestamps",
    ),
    "non_numeric_last_preserved": (
        lambda state: json.dumps({**state, "last_preserved_timestamp": "now"}).encode(),
        r"last_preserved_timestamp is 'now', not a number of seconds",
    ),
    "paths_not_a_list": (
        lambda state: json.dumps({**state, "all_model_checkpoint_paths": "ckpt-3"}).encode(),
        r"all_model_checkpoint_paths is 'ckpt-3', not a list of paths",
    ),
    "no_latest": (
        lambda state: json.dumps({k: v for k, v in state.items() if k != "model_checkpoint_path"}).encode(),
        r"model_checkpoint_path is None, not a path",
    ),
    "not_an_object": (lambda state: b"[1, 2]", r"it holds a JSON list, not an object"),
    "truncated": (lambda state: json.dumps(state).encode()[:25], r"it is not JSON"),
    "not_utf8": (lambda state: b"\xff\xfe\x00garbage", r"it is not UTF-8 text"),
    "tensorflow_text_format": (
        lambda state: b'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n',
        r"it is not JSON .*TensorFlow's text-format state files are not read",
    ),
}


def damaged_state_directory(tmp_path: Path, damage: str) -> tuple[Path, td.train.Checkpoint, Any]:
    """ckpt-2 and ckpt-3 on disk (ckpt-3 the newer), and a state file damaged as ``damage`` says."""
    ckpt, v = counter_checkpoint()
    save_numbered(td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2), v, 3)
    age(Path(f"{tmp_path / 'ckpt-2'}.index.json"), seconds=200.0)
    age(Path(f"{tmp_path / 'ckpt-3'}.index.json"), seconds=100.0)
    (tmp_path / "checkpoint").write_bytes(STATE_FILE_DAMAGE[damage][0](state_file(tmp_path)))
    return tmp_path, ckpt, v


@pytest.mark.parametrize("damage", list(STATE_FILE_DAMAGE))
def test_a_manager_with_an_unusable_state_file_warns_and_starts_from_the_newest_checkpoint(tmp_path, damage):
    directory, _, _ = damaged_state_directory(tmp_path, damage)
    fault = STATE_FILE_DAMAGE[damage][1]
    ckpt, v = counter_checkpoint()
    unusable = rf"the state file .*checkpoint is unusable \({fault}"
    with pytest.warns(RuntimeWarning, match=rf"^CheckpointManager: {unusable}") as w:
        manager = td.train.CheckpointManager(ckpt, str(directory), max_to_keep=2)
    message = str(w[0].message)
    assert f"starts from the newest complete checkpoint in the directory, {directory / 'ckpt-3'}" in message
    assert f"leaves the older ones on disk, unmanaged (it never deletes them, since it cannot tell which were " \
           f"preserved): {[str(directory / 'ckpt-2')]}" in message
    assert manager.latest_checkpoint == str(directory / "ckpt-3")
    assert manager.checkpoints == [str(directory / "ckpt-3")]
    ckpt.restore(manager.latest_checkpoint).assert_consumed()
    np.testing.assert_array_equal(v.numpy(), np.full(4, 3, np.float32))

    save_numbered(manager, v, 2)  # ckpt-4, ckpt-5: ckpt-3 leaves the window; ckpt-2 was never managed
    assert_files(directory, 2, 4, 5)
    assert state_file(directory)["all_model_checkpoint_paths"] == ["ckpt-4", "ckpt-5"]  # rewritten, valid
    assert td.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-5")


@pytest.mark.parametrize("damage", list(STATE_FILE_DAMAGE))
def test_latest_checkpoint_with_an_unusable_state_file_warns_and_finds_the_newest_checkpoint(tmp_path, damage):
    directory, _, _ = damaged_state_directory(tmp_path, damage)
    fault = STATE_FILE_DAMAGE[damage][1]
    unusable = rf"the state file .*checkpoint is unusable \({fault}"
    with pytest.warns(RuntimeWarning, match=rf"^latest_checkpoint\(\): {unusable}"):
        assert td.train.latest_checkpoint(str(directory)) == str(directory / "ckpt-3")


def test_an_unusable_state_file_in_a_directory_without_checkpoints_gives_none_and_an_empty_manager(tmp_path):
    (tmp_path / "checkpoint").write_text("{not json")
    with pytest.warns(RuntimeWarning, match=r"holds no complete numbered checkpoint, so there is no latest one"):
        assert td.train.latest_checkpoint(str(tmp_path)) is None
    ckpt, v = counter_checkpoint()
    with pytest.warns(RuntimeWarning, match=r"holds no complete checkpoint named ckpt-<number>, so it starts empty"):
        manager = td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1)
    assert manager.latest_checkpoint is None and manager.checkpoints == []
    assert manager.save() == str(tmp_path / "ckpt-1")
    assert td.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-1")  # the state file is valid again


SWEEPS = ["save", "write", "manager_start", "manager_save"]


def sweep_by(trigger: str, directory: Path) -> None:
    """Runs the save (or manager start) ``trigger`` names in ``directory``."""
    ckpt, _ = counter_checkpoint()
    if trigger == "save":
        ckpt.save(str(directory / "model"))
    elif trigger == "write":
        ckpt.write(str(directory / "model"))
    elif trigger == "manager_start":
        td.train.CheckpointManager(ckpt, str(directory), max_to_keep=1)
    else:
        td.train.CheckpointManager(ckpt, str(directory), max_to_keep=1).save()


@pytest.mark.parametrize("trigger", SWEEPS)
def test_stale_temporary_files_are_swept_and_younger_ones_kept(tmp_path, trigger):
    stale = tmp_path / ".tmp-crashed1.part"  # left by a save that crashed long ago
    stale.write_bytes(b"PK\x03\x04 half an npz")
    age(stale)
    young = tmp_path / ".tmp-writing2.part"  # another process's save, being written now
    young.write_bytes(b"PK\x03\x04 half an npz")
    not_quite = tmp_path / ".tmp-writing3.part"  # untouched for a little less than the bound
    not_quite.write_bytes(b"{")
    age(not_quite, seconds=files.STALE_SECONDS - 60.0)
    not_ours = [tmp_path / "notes.part", tmp_path / ".tmp-notes.txt"]
    for path in not_ours:
        path.write_text("keep me")
        age(path)

    sweep_by(trigger, tmp_path)

    assert not stale.exists()
    assert young.exists() and not_quite.exists() and all(path.exists() for path in not_ours)


def fake_data_file(prefix: Path, digits: str) -> Path:
    """A data file for ``prefix`` that no index points to (as a save killed before its index leaves)."""
    path = prefix.parent / f"{prefix.name}.data-{digits * 16}.npz"
    path.write_bytes(b"PK\x03\x04 an orphan")
    return path


def test_a_rewrite_removes_the_replaced_data_file_and_stale_orphans_of_its_prefix_only(tmp_path):
    ckpt, v = counter_checkpoint()
    prefix = tmp_path / "model"
    ckpt.write(str(prefix))
    (replaced,) = data_files(prefix)
    stale_orphan, young_orphan = fake_data_file(prefix, "a"), fake_data_file(prefix, "b")
    other_prefix_orphan = fake_data_file(tmp_path / "model-1", "c")
    age(replaced, stale_orphan, other_prefix_orphan)

    v.assign(np.full(4, 5.0, np.float32))
    ckpt.write(str(prefix))

    (current,) = [p for p in data_files(prefix) if p not in (replaced, stale_orphan, young_orphan)]
    assert read_index(prefix)["data_file"] == current.name
    assert not replaced.exists() and not stale_orphan.exists()
    assert young_orphan.exists()  # may be another process's save of this prefix, its index to come
    assert other_prefix_orphan.exists()  # not this prefix's
    restored, w = counter_checkpoint()
    restored.restore(str(prefix)).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 5.0, np.float32))


def test_a_manager_start_removes_stale_unreferenced_data_files_of_its_checkpoints(tmp_path):
    ckpt, v = counter_checkpoint()
    save_numbered(td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=None), v, 3)
    referenced = [path for n in (1, 2, 3) for path in data_files(tmp_path / f"ckpt-{n}")]
    stale = [fake_data_file(tmp_path / "ckpt-2", "a"), fake_data_file(tmp_path / "ckpt-9", "a")]  # 9: no index
    young = [fake_data_file(tmp_path / "ckpt-2", "b"), fake_data_file(tmp_path / "ckpt-8", "b")]
    unreadable_index = fake_data_file(tmp_path / "ckpt-3", "c")  # its index is damaged below: it may name this
    other_name = fake_data_file(tmp_path / "model-4", "d")
    Path(f"{tmp_path / 'ckpt-3'}.index.json").write_bytes(b"\x00 damaged")
    age(*referenced, *stale, unreadable_index, other_name)  # referenced files are never removed, however old

    td.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=None)

    assert [path.name for path in stale if path.exists()] == []
    assert all(path.exists() for path in [*referenced, *young, unreadable_index, other_name])


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(select, "select"), reason="needs POSIX signals")
@pytest.mark.parametrize(
    "saver, kill_point, sweeper",
    [
        ("save", "data_fsync", "manager_start"),
        ("save", "data_fsync", "save_elsewhere"),
        ("save", "before_index_rename", "manager_start"),
        ("save", "before_index_rename", "save_elsewhere"),
        ("write", "before_index_rename", "rewrite_same_prefix"),
    ],
)
def test_a_save_in_progress_in_another_process_is_not_swept(tmp_path, saver, kill_point, sweeper):
    function, k = KILL_POINTS[kill_point]
    with Child(tmp_path, "block", saver, function, str(k)) as child:
        directory = child.directory
        second = str(directory / ("ckpt-2" if saver == "save" else "ckpt"))
        child.expect("SAVED ")
        child.expect(f"BLOCKED {function} ")  # paused inside its second save, files half done
        in_progress = [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
        in_progress += data_files(second)[-1:] if kill_point == "before_index_rename" else []
        assert in_progress

        ours = checkpoint_child.make_objects()  # this process saves into the same directory meanwhile
        checkpoint_child.set_values(ours, 3)
        if sweeper == "manager_start":
            td.train.CheckpointManager(ours, str(directory), max_to_keep=1)
        elif sweeper == "save_elsewhere":
            ours.save(str(directory / "other"))
        else:
            ours.write(second)
        assert all(path.exists() for path in in_progress), sorted(p.name for p in directory.iterdir())

        child.resume()
        assert child.expect("SAVED ") == second
        assert child.expect("DONE") == ""
        assert child.exit_status() == 0
    assert_child_values(second, 2)  # the other process's save completed intact (its index came last)
