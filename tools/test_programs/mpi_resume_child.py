"""A preempted job that resumes its input exactly, on the same or another number of workers.

``python tools/test_programs/mpi_resume_child.py '<json config>'`` (under ``mpiexec -n N``, or
alone) trains a linear regression with SGD and momentum, in TensorFlow's loop shape::

    for step in range(handler.total_run_calls, STEPS):
        handler.run(train_step, next(iterator))

with a ``PreemptionCheckpointHandler`` whose checkpoint holds the weights, the optimizer and
the distributed iterator. The input is ``from_tensor_slices`` of 160 examples, shuffled (with
reshuffling between epochs), mapped, repeated, batched by the global batch size and
prefetched by a background thread, so the run crosses epochs. Every step, the chief records the ids of the examples the step trains
on, in replica order (``steps-<pid>.jsonl`` in ``dir``); a test checks that an interrupted run
and its restart (perhaps on another number of workers) trained on exactly the steps an
uninterrupted run trains on. Config keys:

* ``dir``: the checkpoint directory and the reports; ``steps``: how many steps in all;
* ``global_batch``: the global batch size (the same whatever the number of workers);
* ``local``: logical CPU replicas per worker (default 1);
* ``signal``: ``{"rank": r, "step": k}``: rank r sends itself SIGTERM inside step k;
* ``policy``: the dataset's AutoShardPolicy name (default AUTO, i.e. DATA here).

Each rank writes ``report-<rank>.json`` (its exit status, the steps it ran, the weights) before it exits.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
from typing import Any

import numpy as np

import towerdist as td

config: dict[str, Any] = json.loads(sys.argv[1])
directory = config["dir"]
steps = int(config["steps"])
global_batch = int(config["global_batch"])
local = int(config.get("local", 1))
if local > 1:
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * local)
strategy = td.distribute.MultiWorkerMirroredStrategy()
rank = strategy.cluster_resolver.task_id
report: dict[str, Any] = {"rank": rank, "workers": strategy.extended._num_workers, "exit": None, "runs": 0}

EXAMPLES, FEATURES = 160, 5
rng = np.random.default_rng(0)
ids = np.arange(EXAMPLES, dtype=np.int64)
features = rng.normal(size=(EXAMPLES, FEATURES))
targets = features @ np.arange(1.0, FEATURES + 1.0) + 0.1 * rng.normal(size=EXAMPLES)


def input_pipeline() -> td.data.Dataset:
    dataset = td.data.Dataset.from_tensor_slices((ids, features, targets))
    dataset = dataset.shuffle(64, seed=11).map(lambda i, x, y: (i, x * 0.5, y * 0.5))
    dataset = dataset.repeat().batch(global_batch, drop_remainder=True).prefetch(2)
    if "policy" in config:
        options = td.data.Options()
        options.experimental_distribute.auto_shard_policy = getattr(td.data.experimental.AutoShardPolicy, config["policy"])
        dataset = dataset.with_options(options)
    return dataset


with strategy.scope():
    w = td.Variable(np.zeros(FEATURES), name="w")
    optimizer = td.optimizers.SGD(learning_rate=0.05, momentum=0.9)
iterator = iter(strategy.experimental_distribute_dataset(input_pipeline()))
checkpoint = td.train.Checkpoint(w=w, optimizer=optimizer, iterator=iterator)
handler = td.distribute.experimental.PreemptionCheckpointHandler(
    strategy.cluster_resolver, checkpoint, checkpoint_dir=os.path.join(directory, "ckpt")
)
report["started_at"] = handler.total_run_calls
signal_at = config.get("signal")
log = open(os.path.join(directory, f"steps-{os.getpid()}.jsonl"), "a") if rank == 0 else None  # noqa: SIM115


def write_report() -> None:
    report["w"] = w.numpy().tolist()
    with open(os.path.join(directory, f"report-{rank}.json"), "w") as f:
        json.dump(report, f)


def replica_step(batch: Any) -> None:
    _, x, y = batch
    residual = x @ w.value() - y
    gradient = x.T @ residual / global_batch
    optimizer.apply_gradients([(gradient, w)])


def train_step(batch: Any) -> None:
    step = report["runs"] + report["started_at"] + 1
    if signal_at is not None and signal_at["rank"] == rank and signal_at["step"] == step:
        os.kill(os.getpid(), signal.SIGTERM)  # handled between bytecodes: during this step
    trained = np.asarray(strategy.gather(batch[0], axis=0)).tolist()  # every replica's ids, in order
    strategy.run(replica_step, args=(batch,))
    if log is not None:
        log.write(json.dumps({"step": step, "ids": trained}) + "\n")
        log.flush()
    report["runs"] += 1


def on_exit() -> None:
    if report["exit"] is None:
        report["exit"] = 0
    write_report()


atexit.register(on_exit)
try:
    for _ in range(handler.total_run_calls, steps):
        handler.run(train_step, next(iterator))
except SystemExit as stop:
    report["exit"] = stop.code
    raise
