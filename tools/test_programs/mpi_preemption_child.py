"""A training job with a PreemptionCheckpointHandler, run under ``mpiexec -n 2`` by ``test_preemption_mpi.py``.

``python tools/test_programs/mpi_preemption_child.py '<json config>'`` trains ``steps`` steps of SGD with
momentum on a float64 variable, whose gradient depends on the step and the worker, so a
resumed run must restore the variable, the optimizer's slots and the step count exactly to
end bit-identical to an uninterrupted one. Config keys:

* ``dir``: the checkpoint directory; ``steps``: how many ``run()`` calls to train in all;
* ``signals``: ``[{"rank": r, "step": k, "when": "during" | "between" | "save"}]``: rank r
  sends itself SIGTERM inside step k, after ``run()`` k returned, or inside the save;
* ``grace_period``, ``exit_status`` (a custom ``exit_fn``), ``save_fn`` (use one);
* ``no_collective``: the step trains nothing and the workers exchange nothing in it;
* ``two_handlers``: handler A saves once (its exit_fn returns), then handler B trains unsignalled;
* ``pid_after``: after this step, print ``pid of rank <rank>: <pid>.`` (the test signals from outside).

Each rank writes ``report-<rank>.json`` into ``dir`` before it exits, however it exits.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any

import numpy as np

import towerdist as td

logging.basicConfig(format="rank %(process)d: %(message)s")
logging.getLogger("towerdist").setLevel(logging.INFO)  # the handler's protocol, as TF logs it
config: dict[str, Any] = json.loads(sys.argv[1])
directory = config["dir"]
strategy = td.distribute.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
signals = [s for s in config.get("signals", []) if s["rank"] == rank]


def signal_self(when: str, step: int) -> None:
    if any(s["when"] == when and s["step"] == step for s in signals):
        os.kill(os.getpid(), signal.SIGTERM)




def two_handlers_in_turn() -> None:
    """Handler A saves at 4 (signal in step 3, an exit_fn that returns); then handler B, never signalled."""
    exits: list[str] = []
    for phase in ("a", "b"):
        runs = td.Variable(np.int64(0), trainable=False)

        def exit_fn(phase: str = phase, runs: td.Variable = runs) -> None:
            exits.append(f"{phase} at {runs.numpy()}")

        def train_step(runs: td.Variable = runs) -> None:
            strategy.reduce("SUM", strategy.run(lambda: 1.0), None)  # a collective
            runs.assign_add(1)

        handler = td.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver,
            td.train.Checkpoint(runs=runs),
            os.path.join(directory, phase),
            td.distribute.experimental.TerminationConfig(exit_fn=exit_fn),
        )
        while handler.total_run_calls < 10:
            step = handler.total_run_calls + 1
            handler.run(train_step)
            if phase == "a" and step == 3 and rank == 1:
                os.kill(os.getpid(), signal.SIGTERM)
    with open(os.path.join(directory, f"report-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "exits": exits, "b_files": sorted(os.listdir(os.path.join(directory, "b")))}, f)


if config.get("two_handlers"):
    two_handlers_in_turn()
    sys.exit(0)

with strategy.scope():
    w = td.Variable(np.linspace(-1.0, 1.0, 4), name="w")
    optimizer = td.optimizers.SGD(0.05, momentum=0.9)
    checkpoint = td.train.Checkpoint(w=w, optimizer=optimizer)
    manager = td.train.CheckpointManager(checkpoint, os.path.join(directory, "ckpt"), max_to_keep=1)
    saved_at: list[int] = []

    def save_fn() -> None:
        saved_at.append(handler.total_run_calls)
        signal_self("save", handler.total_run_calls)
        manager.save()

    termination = td.distribute.experimental.TerminationConfig(
        exit_fn=(lambda: sys.exit(config["exit_status"])) if "exit_status" in config else None,
        grace_period=config.get("grace_period"),
        save_fn=save_fn if config.get("save_fn") else None,
    )
    handler = td.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, os.path.join(directory, "ckpt"), termination
    )
started_at = handler.total_run_calls


def train_step(step: int) -> None:
    def replica_fn() -> None:
        worker = td.distribute.get_replica_context().replica_id_in_sync_group
        gradient = np.sin(step * (worker + 1) + np.arange(4.0))
        optimizer.apply_gradients([(gradient, w)])

    if not config.get("no_collective"):
        strategy.run(replica_fn)
    signal_self("during", step)


def report(exit_status: Any) -> None:
    fields = {
        "rank": rank,
        "exit": exit_status,
        "started_at": started_at,
        "runs": handler.total_run_calls,
        "w": [float(x) for x in np.asarray(w.numpy())],
        "saved_at": saved_at,
    }
    with open(os.path.join(directory, f"report-{rank}.json"), "w") as f:
        json.dump(fields, f)


try:
    while handler.total_run_calls < config["steps"]:
        step = handler.total_run_calls + 1
        handler.run(train_step, step)
        signal_self("between", step)
        if config.get("pid_after") == step:
            print(f"pid of rank {rank}: {os.getpid()}.", flush=True)
except SystemExit as exiting:
    report(exiting.code)
    raise
report(0)
