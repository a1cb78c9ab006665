"""PreemptionCheckpointHandler, TerminationConfig and PreemptionWatcher in one process (TF's "local mode").

TensorFlow 2.21's behaviour (``reference/preemption.md``): a SIGTERM handled while ``run()``
call k is under way makes the handler save after ``S = k + 1`` calls (``checkpointed_runs = S``
in the user's checkpoint, one ``ckpt-1`` in ``checkpoint_dir``) and raise ``SystemExit(42)``
from ``run()``; created again, it restores the checkpoint and ``total_run_calls`` is S.
The two-process protocol is tested under mpiexec in ``test_preemption_mpi.py``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist.testing.pytest_plugin import mirrored_strategy_for

pytestmark = pytest.mark.timeout(60)

Handler = td.distribute.experimental.PreemptionCheckpointHandler
TerminationConfig = td.distribute.experimental.TerminationConfig


@pytest.fixture(autouse=True)
def sigterm_restored() -> Iterator[None]:
    """Each test's handler installs a SIGTERM handler; the disposition is put back after it."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


class Job:
    """A model (a variable and SGD with momentum) under a 2-replica MirroredStrategy, with a handler."""

    def __init__(self, directory: Path, config: TerminationConfig | None = None, manager: bool = False) -> None:
        self.strategy = mirrored_strategy_for(2)
        with self.strategy.scope():
            self.w = td.Variable(np.linspace(-1.0, 1.0, 3), name="w")
            self.optimizer = td.optimizers.SGD(0.05, momentum=0.9)
            self.checkpoint = td.train.Checkpoint(w=self.w, optimizer=self.optimizer)
            self.directory = directory / "ckpt"
            target: Any = self.checkpoint
            if manager:
                target = td.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=2)
            self.handler = Handler(None, target, None if manager else str(self.directory), config)

    def step(self, number: int, signal_at: int | None = None) -> None:
        def replica_fn() -> None:
            replica = td.distribute.get_replica_context().replica_id_in_sync_group
            self.optimizer.apply_gradients([(np.cos(number * (replica + 1) + np.arange(3.0)), self.w)])

        self.strategy.run(replica_fn)
        if number == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def train(self, steps: int, signal_at: int | None = None) -> None:
        while self.handler.total_run_calls < steps:
            self.handler.run(self.step, self.handler.total_run_calls + 1, signal_at)


def saved_runs(directory: Path) -> int:
    state = json.loads((directory / "checkpoint").read_text())
    index = json.loads((directory / f"{state['model_checkpoint_path']}.index").read_text())
    with np.load(directory / index["data_file"]) as data:
        return int(data[index["entries"]["checkpointed_runs"]["member"]])


def test_termination_config_keeps_its_four_fields() -> None:
    exit_fn, save_fn, watcher = (lambda: None), (lambda: None), (lambda: False)
    config = TerminationConfig(termination_watcher_fn=watcher, exit_fn=exit_fn, grace_period=5, save_fn=save_fn)
    assert (config.termination_watcher_fn, config.exit_fn, config.grace_period, config.save_fn) == (
        watcher,
        exit_fn,
        5,
        save_fn,
    )
    empty = TerminationConfig()
    assert (empty.termination_watcher_fn, empty.exit_fn, empty.grace_period, empty.save_fn) == (None,) * 4
    assert repr(TerminationConfig(grace_period=5)) == "TerminationConfig(grace_period=5)"


def test_sigterm_during_step_10_saves_after_11_runs_exits_42_and_a_restart_resumes_bit_identical(
    tmp_path: Path,
) -> None:
    reference = Job(tmp_path / "reference")
    reference.train(20)
    expected = reference.w.numpy().tolist()

    job = Job(tmp_path)
    with pytest.raises(SystemExit) as exited:
        job.train(20, signal_at=10)
    assert exited.value.code == 42
    assert job.handler.total_run_calls == 11
    assert int(job.optimizer.iterations.numpy()) == 11  # step 11 ran, step 12 did not
    assert sorted(p.name for p in job.directory.iterdir()) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    assert saved_runs(job.directory) == 11

    restarted = Job(tmp_path)
    assert restarted.handler.total_run_calls == 11
    assert np.array_equal(restarted.w.numpy(), job.w.numpy())
    restarted.train(20)
    assert restarted.w.numpy().tolist() == expected


def test_a_signal_from_inside_a_replica_function_is_handled_the_same(tmp_path: Path) -> None:
    # The signal lands while the caller runs replica 0 or waits for replica 1 (towerdist holds
    # the handler back while it waits, then runs it): still counted in run() call 10.
    job = Job(tmp_path)

    def step(number: int) -> None:
        def replica_fn() -> None:
            if number == 10 and td.distribute.get_replica_context().replica_id_in_sync_group == 1:
                os.kill(os.getpid(), signal.SIGTERM)

        job.strategy.run(replica_fn)

    with pytest.raises(SystemExit):
        while True:
            job.handler.run(step, job.handler.total_run_calls + 1)
    assert job.handler.total_run_calls == 11
    assert saved_runs(job.directory) == 11


def test_save_checkpoint_if_preempted_saves_at_the_same_step(tmp_path: Path) -> None:
    job = Job(tmp_path)
    with pytest.raises(SystemExit) as exited:
        for number in range(1, 21):
            job.step(number, signal_at=10)
            job.handler.save_checkpoint_if_preempted()
    assert exited.value.code == 42
    # As in TF: the check comes before the count, so call 10 (after step 10, signalled) proposes
    # S = 9 + 1 = 10, and call 11 (after step 11) saves checkpointed_runs = 10. TF's docs pair
    # this API with a step counter of the user's own, saved in the checkpoint.
    assert (job.handler.total_run_calls, number) == (10, 11)
    assert saved_runs(job.directory) == 10


def test_a_checkpoint_manager_is_used_as_it_is_and_save_arguments_reach_it(tmp_path: Path) -> None:
    job = Job(tmp_path, manager=True)
    with pytest.raises(SystemExit):
        for number in range(1, 21):
            job.step(number, signal_at=3)
            job.handler.save_checkpoint_if_preempted(checkpoint_number=1000)
    assert (job.directory / "ckpt-1000.index").exists()
    assert saved_runs(job.directory) == 3


def test_exit_fn_and_save_fn_are_called_instead_and_training_goes_on_if_exit_fn_returns(tmp_path: Path) -> None:
    calls: list[str] = []
    job = Job(tmp_path)
    config = TerminationConfig(
        exit_fn=lambda: calls.append(f"exit at {job.handler.total_run_calls}"),
        save_fn=lambda: calls.append(f"save at {job.handler.total_run_calls}"),
    )
    job = Job(tmp_path, config)
    job.train(20, signal_at=5)
    job.step(21, signal_at=21)  # a later signal changes nothing: TF never lets SIGTERM through again
    job.train(25)
    assert calls == ["save at 6", "exit at 6"]
    assert job.handler.total_run_calls == 25
    assert not (job.directory / "checkpoint").exists()  # save_fn replaced the save


def test_a_save_that_fails_is_tried_again_at_the_next_call_as_in_tensorflow(tmp_path: Path) -> None:
    # TF 2.21, the same script: run() raised the save's OSError at 4; the next run() saved and exited 42.
    saves: list[int] = []
    job = Job(tmp_path)

    def save_fn() -> None:
        saves.append(job.handler.total_run_calls)
        if len(saves) == 1:
            raise OSError("disk full (transient)")

    job = Job(tmp_path, TerminationConfig(save_fn=save_fn))
    with pytest.raises(OSError, match="disk full"):
        job.train(10, signal_at=3)
    assert job.handler.total_run_calls == 4
    with pytest.raises(SystemExit) as exited:
        job.train(10)
    assert exited.value.code == 42
    assert saves == [4, 4] and job.handler.total_run_calls == 4


def test_a_signal_during_the_last_step_is_lost(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.train(20, signal_at=20)
    assert job.handler.total_run_calls == 20
    assert not (job.directory / "checkpoint").exists()


def test_a_grace_period_saves_at_once_then_again_before_it_ends(tmp_path: Path) -> None:
    saves: list[int] = []
    job = Job(tmp_path)
    manager = td.train.CheckpointManager(job.checkpoint, tmp_path / "grace", max_to_keep=1)

    def save_fn() -> None:
        saves.append(job.handler.total_run_calls)
        manager.save()

    job = Job(tmp_path, TerminationConfig(grace_period=0.3, save_fn=save_fn))
    with pytest.raises(SystemExit):
        job.train(10**9, signal_at=4)
    assert saves[0] == 5 and len(saves) == 2 and saves[1] > 5
    assert sorted(p.name for p in (tmp_path / "grace").iterdir()) == [
        "checkpoint",
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
    ]


def test_a_termination_watcher_fn_replaces_sigterm(tmp_path: Path) -> None:
    asked = threading.Event()

    def told() -> bool:
        asked.set()
        return True

    job = Job(tmp_path, TerminationConfig(termination_watcher_fn=told))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # no SIGTERM handler with a watcher fn
    with pytest.raises(SystemExit):
        job.train(10**9)  # until the watcher thread (polling every second) says so
    assert asked.is_set()
    assert saved_runs(job.directory) == job.handler.total_run_calls
    watchers = [t for t in threading.enumerate() if t.name.startswith("WorkerTerminationSignalWatcher")]
    for thread in watchers:
        thread.join(timeout=10)  # it ends once it has told the handler
    assert not any(t.is_alive() for t in watchers)


def test_an_existing_checkpointed_runs_variable_is_reused_and_a_wrong_one_refused(tmp_path: Path) -> None:
    runs = td.Variable(np.int64(7), trainable=False)
    checkpoint = td.train.Checkpoint(checkpointed_runs=runs)
    handler = Handler(None, checkpoint, str(tmp_path / "a"))
    assert handler.total_run_calls == 7

    wrong = td.train.Checkpoint(checkpointed_runs=td.Variable(np.zeros(2)))
    with pytest.raises(TypeError, match="checkpointed_runs"):
        Handler(None, wrong, str(tmp_path / "b"))


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ((None, "not a checkpoint", "/tmp/x"), TypeError, "Checkpoint or td.train.CheckpointManager"),
        ((None, td.train.Checkpoint(), None), td.errors.InvalidArgumentError, "checkpoint_dir must be passed"),
        ((None, td.train.Checkpoint(), None), TypeError, "checkpoint_dir must be passed"),  # TF's observed type
        (("resolver", td.train.Checkpoint(), "/tmp/x"), TypeError, "cluster resolver"),
    ],
)
def test_bad_arguments_get_clear_errors(arguments: tuple[Any, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Handler(*arguments)


def test_clusters_with_parameter_servers_or_other_workers_are_refused(tmp_path: Path) -> None:
    with_ps = td.distribute.cluster_resolver.SimpleClusterResolver(
        td.train.ClusterSpec({"worker": ["a:1"], "ps": ["b:1"]}), task_type="worker", task_id=0
    )
    with pytest.raises(NotImplementedError, match="parameter servers"):
        Handler(with_ps, td.train.Checkpoint(), str(tmp_path))
    two = td.distribute.cluster_resolver.SimpleClusterResolver(
        td.train.ClusterSpec({"worker": ["a:1", "b:1"]}), task_type="worker", task_id=0
    )
    with pytest.raises(td.errors.InvalidArgumentError, match="2 workers"):
        Handler(two, td.train.Checkpoint(), str(tmp_path))


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (TerminationConfig(exit_fn=42), TypeError),  # type: ignore[arg-type]
        (TerminationConfig(grace_period=-1), ValueError),
        (TerminationConfig(grace_period="1"), ValueError),  # type: ignore[arg-type]
        ("config", TypeError),
    ],
)
def test_bad_termination_configs_are_refused(tmp_path: Path, config: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        Handler(None, td.train.Checkpoint(), str(tmp_path), config)


def test_created_outside_the_main_thread_it_raises_value_error(tmp_path: Path) -> None:
    caught: list[BaseException] = []

    def create() -> None:
        try:
            Handler(None, td.train.Checkpoint(), str(tmp_path))
        except BaseException as error:  # handed to the test thread and asserted there
            caught.append(error)

    thread = threading.Thread(target=create)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], ValueError)
    assert "main thread" in str(caught[0])


def test_total_run_calls_logs_tensorflows_deprecation_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    handler = Handler(None, td.train.Checkpoint(), str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        assert handler.total_run_calls == 0
        assert handler.total_run_calls == 0
    assert sum("deprecated" in r.getMessage() for r in caplog.records) == 1


def test_watch_preemption_scope_runs_its_body_and_lets_errors_through(tmp_path: Path) -> None:
    handler = Handler(None, td.train.Checkpoint(), str(tmp_path))
    ran = []
    with handler.watch_preemption_scope():
        ran.append(True)
    assert ran == [True]
    with pytest.raises(td.errors.ResourceExhaustedError), handler.watch_preemption_scope():
        raise td.errors.ResourceExhaustedError(None, None, "Running out of resources")


def test_preemption_watcher_has_nothing_to_watch_as_tensorflow_off_borg(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="towerdist"):
        watcher = td.distribute.experimental.PreemptionWatcher()
    assert watcher.preemption_message is None
    assert watcher.block_until_worker_exit() is None
    assert any("PreemptionWatcher" in r.getMessage() for r in caplog.records)


def _run_python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60
    )


def test_sigterm_before_a_handler_exists_ends_the_process_as_usual() -> None:
    # DESIGN 10.20: TF's MWMS swallows it; towerdist keeps Python's default.
    done = _run_python(
        """
        import os, signal
        import towerdist as td
        strategy = td.distribute.MirroredStrategy(["CPU:0"])
        os.kill(os.getpid(), signal.SIGTERM)
        print("still running")
        """
    )
    assert done.returncode == -signal.SIGTERM, done
    assert "still running" not in done.stdout


def test_once_the_handler_is_gone_sigterm_does_what_it_did_before() -> None:
    done = _run_python(
        """
        import gc, os, signal
        import towerdist as td
        handler = td.distribute.experimental.PreemptionCheckpointHandler(None, td.train.Checkpoint(), "%s")
        del handler
        gc.collect()
        os.kill(os.getpid(), signal.SIGTERM)
        print("still running")
        """
        % Path(os.environ.get("TMPDIR", "/tmp"), f"towerdist-gone-{os.getpid()}")
    )
    assert done.returncode == -signal.SIGTERM, done
    assert "still running" not in done.stdout
