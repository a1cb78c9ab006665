"""towerdist's main job: data-parallel training of an MLP on scikit-learn's digits.

A 64-256-256-10 ReLU network with softmax cross-entropy, written in plain numpy (cupy on
GPUs) with hand-written backpropagation, trained with ``MirroredStrategy``: every GPU if
there are any, otherwise one logical CPU replica per core this process may run on (at most
8). It uses the whole training kit: a distributed dataset, ``td.nn.compute_average_loss``,
``td.optimizers.Adam``, ``td.metrics`` and a ``td.train.CheckpointManager`` (saved every
``--checkpoint-every`` epochs and after the last; ``--resume`` continues a run).

    python examples/train_digits.py                  # the default run (~97% test accuracy)
    python examples/train_digits.py --replicas 1     # the same curve on one replica
    python examples/train_digits.py --resume         # continue from the last checkpoint
    mpiexec -n 2 python examples/train_digits.py     # two processes (MultiWorkerMirroredStrategy)

The digits (1797 8x8 images) ship with scikit-learn; nothing is downloaded. Every
replica computes the gradient of its slice of the global batch divided by the *global*
batch size; ``apply_gradients`` sums them, so the update is the same for any number of
replicas and so is the accuracy curve.

On CPUs the replicas are the parallelism, so the BLAS library is asked for one thread per
call (``OPENBLAS_NUM_THREADS`` and friends, unless already set): with its own thread pool
per matrix product, two replicas on two cores ran ~4x slower than with one BLAS thread.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # before numpy loads its BLAS; see the docstring

import argparse  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import towerdist as td  # noqa: E402

MAX_DEFAULT_CPU_REPLICAS = 8


# --- data ------------------------------------------------------------------------------------


def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits as float32 pixels in [0, 1] and int64 labels: a stratified 80/20 split."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    digits = sklearn_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return x_train, y_train, x_test, y_test


# --- the model -------------------------------------------------------------------------------


class MLP(td.Module):
    """Dense layers with ReLU between them; He-initialised weights, zero biases."""

    def __init__(self, sizes: tuple[int, ...] = (64, 256, 256, 10), seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.kernels = []
        self.biases = []
        for k, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            scale = np.sqrt(2.0 / fan_in)
            self.kernels.append(td.Variable(
                (rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32), name=f"dense_{k}/kernel"))
            self.biases.append(td.Variable(np.zeros(fan_out, np.float32), name=f"dense_{k}/bias"))

    @property
    def parameters(self) -> list[Any]:
        """Kernels and biases, interleaved layer by layer (the order of ``gradients``)."""
        return [v for pair in zip(self.kernels, self.biases) for v in pair]

    def forward(self, x: Any) -> tuple[Any, list[Any]]:
        """The logits for ``x``, and every layer's input (kept for the backward pass)."""
        inputs = []
        h = x
        last = len(self.kernels) - 1
        for k, (kernel, bias) in enumerate(zip(self.kernels, self.biases)):
            inputs.append(h)
            h = h @ kernel.value() + bias.value()
            if k < last:
                h = h * (h > 0)  # ReLU
        return h, inputs

    def gradients(self, inputs: list[Any], dlogits: Any) -> list[Any]:
        """Backpropagates ``dlogits``; returns a gradient per entry of ``parameters``."""
        grads: list[Any] = []
        delta = dlogits
        for k in reversed(range(len(self.kernels))):
            grads[:0] = [inputs[k].T @ delta, delta.sum(axis=0)]
            if k:
                delta = (delta @ self.kernels[k].value().T) * (inputs[k] > 0)
        return grads


def softmax_cross_entropy(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per-example losses and the gradient of their sum with respect to the logits."""
    xp = array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(len(labels))
    losses = xp.log(total[:, 0]) - shifted[rows, labels]
    dlogits = exp / total
    dlogits[rows, labels] -= 1.0
    return losses, dlogits


def array_module(x: Any) -> Any:
    """numpy, or cupy for a cupy array."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


# --- devices ---------------------------------------------------------------------------------


def default_cpu_replicas() -> int:
    """One replica per core this process may run on, at most ``MAX_DEFAULT_CPU_REPLICAS``.

    Each CPU replica is a thread running numpy, which releases the GIL inside its kernels,
    so replicas beyond the cores only add hand-offs.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity mask
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_CPU_REPLICAS))


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (``mpiexec -n N``, N > 1) started this process."""
    sizes = (os.environ.get(name, "1") for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))
    return any(size.isdigit() and int(size) > 1 for size in sizes)


def make_strategy(replicas: int | None) -> td.distribute.Strategy:
    """Every GPU (or ``replicas`` of them); without GPUs, ``replicas`` logical CPUs.

    ``replicas=None`` on CPUs means :func:`default_cpu_replicas`. Started by ``mpiexec``,
    each process is a worker of a ``MultiWorkerMirroredStrategy`` with its GPUs, or one CPU
    replica (``replicas`` logical CPUs when given).
    """
    if launched_by_mpi():
        if replicas is not None and not td.config.list_physical_devices("GPU"):
            cpu = td.config.list_physical_devices("CPU")[0]
            td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * replicas)
        return td.distribute.MultiWorkerMirroredStrategy()
    gpus = td.config.list_physical_devices("GPU")
    if gpus and (replicas is None or replicas <= len(gpus)):
        return td.distribute.MirroredStrategy([f"GPU:{i}" for i in range(replicas or len(gpus))])
    replicas = replicas or default_cpu_replicas()
    cpu = td.config.list_physical_devices("CPU")[0]
    configured = td.config.get_logical_device_configuration(cpu) or []
    if len(configured) < replicas:  # keep a larger configuration made earlier in this process
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * replicas)
    return td.distribute.MirroredStrategy([f"CPU:{i}" for i in range(replicas)])


# --- training --------------------------------------------------------------------------------


def train(
    *,
    replicas: int | None = None,
    epochs: int = 40,
    batch_size: int = 512,
    learning_rate: float = 4e-3,
    seed: int = 0,
    checkpoint_dir: str = "checkpoints/train_digits",
    checkpoint_every: int = 10,
    resume: bool = False,
    progress: bool = True,
    log: Any = print,
) -> dict[str, Any]:
    """Trains and evaluates; returns the per-epoch history and the final figures.

    A checkpoint is written every ``checkpoint_every`` epochs and after the last one. The
    digits' epochs are short (two steps at the default batch of 512): writing the model and
    Adam's slots took about as long as an epoch's training (~7 ms each on a 2-core VM).
    """
    from tqdm.auto import tqdm

    if checkpoint_every < 1:
        raise ValueError(f"train(checkpoint_every=...) must be at least 1, got {checkpoint_every}")
    strategy = make_strategy(replicas)
    if not strategy.extended.should_checkpoint:  # a worker other than the chief: the chief reports
        progress, log = False, _quiet
    x_train, y_train, x_test, y_test = load_digits(seed)
    with strategy.scope():
        model = MLP(seed=seed)
        optimizer = td.optimizers.Adam(learning_rate)
        train_loss = td.metrics.Mean("train_loss")
        train_accuracy = td.metrics.SparseCategoricalAccuracy("train_accuracy")
        test_accuracy = td.metrics.SparseCategoricalAccuracy("test_accuracy")
    epoch_counter = td.Variable(0, name="epoch", trainable=False)
    checkpoint = td.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_counter)
    manager = td.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=3)
    if resume and manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        log(f"Resumed from {manager.latest_checkpoint} (epoch {int(epoch_counter.numpy())}).")

    def train_step(x: Any, y: Any) -> Any:
        logits, inputs = model.forward(x)
        losses, dlogits = softmax_cross_entropy(logits, y)
        loss = td.nn.compute_average_loss(losses, global_batch_size=batch_size)
        grads = model.gradients(inputs, dlogits / batch_size)
        optimizer.apply_gradients(zip(grads, model.parameters))
        train_loss.update_state(losses)
        train_accuracy.update_state(y, logits)
        return loss

    def test_step(x: Any, y: Any) -> None:
        logits, _ = model.forward(x)
        test_accuracy.update_state(y, logits)

    test_data = strategy.experimental_distribute_dataset(
        td.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size))
    steps_per_epoch = len(x_train) // batch_size
    history: list[dict[str, float]] = []
    train_seconds = 0.0
    examples = 0
    log(f"Training on {strategy.num_replicas_in_sync} replica(s) "
        f"({', '.join(d.rsplit('/', 1)[-1] for d in strategy.extended.worker_devices)}), "
        f"global batch {batch_size}, {len(x_train)} training / {len(x_test)} test examples.")
    for epoch in range(int(epoch_counter.numpy()), epochs):
        # One seed per epoch: a resumed run sees exactly the batches the uninterrupted run would.
        train_data = strategy.experimental_distribute_dataset(
            td.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(len(x_train), seed=seed * 1000 + epoch, reshuffle_each_iteration=False)
            .batch(batch_size, drop_remainder=True))
        for metric in (train_loss, train_accuracy, test_accuracy):
            metric.reset_state()
        bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch + 1}/{epochs}", unit="step", leave=False,
                   disable=not progress)
        start = time.perf_counter()
        for x, y in train_data:
            strategy.run(train_step, args=(x, y))
            bar.update()
        train_seconds += time.perf_counter() - start
        examples += steps_per_epoch * batch_size
        bar.close()
        for x, y in test_data:
            strategy.run(test_step, args=(x, y))
        record = {
            "epoch": epoch + 1,
            "loss": float(train_loss.result()),
            "train_accuracy": float(train_accuracy.result()),
            "test_accuracy": float(test_accuracy.result()),
        }
        history.append(record)
        epoch_counter.assign(epoch + 1)
        saved = ""
        if (epoch + 1) % checkpoint_every == 0 or epoch + 1 == epochs:
            saved = f"  [{os.path.basename(manager.save(checkpoint_number=epoch + 1))}]"
        log(f"epoch {epoch + 1:3d}/{epochs}  loss {record['loss']:.4f}  train acc {record['train_accuracy']:.4f}  "
            f"test acc {record['test_accuracy']:.4f}{saved}")
    final = history[-1]["test_accuracy"] if history else float("nan")
    speed = examples / train_seconds if train_seconds else float("nan")
    log(f"Test accuracy {final:.4f}; {speed:,.0f} training examples/s on {strategy.num_replicas_in_sync} "
        f"replica(s).")
    return {"history": history, "test_accuracy": final, "examples_per_second": speed,
            "replicas": strategy.num_replicas_in_sync, "checkpoint": manager.latest_checkpoint,
            "model": model, "optimizer": optimizer}


def _quiet(*args: Any, **kwargs: Any) -> None:
    del args, kwargs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=None,
                        help="number of replicas (default: every GPU, else one logical CPU per core, at most "
                             f"{MAX_DEFAULT_CPU_REPLICAS}; here {default_cpu_replicas()})")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=512, help="the global batch size")
    parser.add_argument("--learning-rate", type=float, default=4e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default="checkpoints/train_digits")
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="EPOCHS",
                        help="save every EPOCHS epochs and after the last (default 10)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.replicas is not None and args.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {args.replicas}")
    if args.batch_size < 1 or args.epochs < 0 or args.checkpoint_every < 1:
        parser.error("--batch-size and --checkpoint-every must be at least 1, --epochs at least 0")
    return train(replicas=args.replicas, epochs=args.epochs, batch_size=args.batch_size,
                 learning_rate=args.learning_rate, seed=args.seed, checkpoint_dir=args.checkpoint_dir,
                 checkpoint_every=args.checkpoint_every,
                 resume=args.resume, progress=not args.no_progress)


if __name__ == "__main__":
    main()
