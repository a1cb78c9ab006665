"""A recommender trained with sparse gradients: matrix factorisation of synthetic click data.

Each user and each item has an embedding (a row of a table); the model predicts a click
from the dot product of the two rows plus the item's bias. A batch touches a few rows of
each table, so the gradients are ``td.IndexedSlices``: towerdist sums them across replicas
(and workers) by their distinct rows, without densifying the tables, and the optimizer
(Adagrad by default, the classic choice for embeddings) updates only those rows.

    python examples/embedding_recommender.py                 # MirroredStrategy (GPUs, else logical CPUs)
    python examples/embedding_recommender.py --replicas 1    # the same model on one replica
    mpiexec -n 2 python examples/embedding_recommender.py    # two processes (MultiWorkerMirroredStrategy)

The clicks are generated in the script (no download): hidden user and item factors, item
popularity following a power law (popular items repeat within a batch, so the gradients
hold repeated rows), and a click with probability ``sigmoid(user . item + popularity)``.
It prints the test AUC after each epoch (the probability that a random click is scored
above a random non-click: 0.5 is guessing; the hidden model itself scores about 0.8) and
the training speed in examples per second.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one BLAS thread per replica (see train_digits.py)

import argparse  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import towerdist as td  # noqa: E402

from train_digits import make_strategy  # noqa: E402

# --- data ------------------------------------------------------------------------------------


def synthetic_clicks(
    users: int, items: int, examples: int, seed: int, factors: int = 8
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """``(user ids, item ids, clicks, oracle AUC)``: interactions drawn from a hidden model.

    Items are drawn by popularity (a power law), users uniformly; the oracle AUC is the
    hidden model's own score on the drawn clicks (the best a model can do).
    """
    rng = np.random.default_rng(seed)
    user_factors = rng.standard_normal((users, factors)) / np.sqrt(factors) * 2.0
    item_factors = rng.standard_normal((items, factors)) / np.sqrt(factors) * 2.0
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8
    popularity /= popularity.sum()
    item_ids = rng.permutation(items)[rng.choice(items, size=examples, p=popularity)]
    user_ids = rng.integers(0, users, size=examples)
    logits = np.einsum("ij,ij->i", user_factors[user_ids], item_factors[item_ids]) + np.log(popularity[item_ids] * items) * 0.3
    probability = 1.0 / (1.0 + np.exp(-logits))
    clicks = (rng.random(examples) < probability).astype(np.float32)
    return user_ids.astype(np.int64), item_ids.astype(np.int64), clicks, auc(probability, clicks)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the probability that a click outranks a non-click (ties count half)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks of ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(average, counts)
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# --- the model -------------------------------------------------------------------------------


class MatrixFactorization(td.Module):
    """User and item embeddings (``dim`` columns) and an item bias; logit = user . item + bias."""

    def __init__(self, users: int, items: int, dim: int, seed: int) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.user_embedding = td.Variable((rng.standard_normal((users, dim)) * 0.1).astype(np.float32), name="users")
        self.item_embedding = td.Variable((rng.standard_normal((items, dim)) * 0.1).astype(np.float32), name="items")
        self.item_bias = td.Variable(np.zeros(items, np.float32), name="item_bias")

    @property
    def parameters(self) -> list[Any]:
        return [self.user_embedding, self.item_embedding, self.item_bias]

    def forward(self, user_ids: Any, item_ids: Any) -> tuple[Any, Any, Any]:
        """Logits and the rows read (for the gradients)."""
        users = self.user_embedding.sparse_read(user_ids)
        items = self.item_embedding.sparse_read(item_ids)
        logits = (users * items).sum(axis=1) + self.item_bias.sparse_read(item_ids)
        return logits, users, items

    def gradients(self, user_ids: Any, item_ids: Any, users: Any, items: Any, dlogits: Any, l2: float) -> list[Any]:
        """The sparse gradients of the loss with respect to the three tables (rows of the batch only)."""
        column = dlogits[:, None]
        return [
            td.IndexedSlices(column * items + l2 * users, user_ids, self.user_embedding.shape),
            td.IndexedSlices(column * users + l2 * items, item_ids, self.item_embedding.shape),
            td.IndexedSlices(dlogits, item_ids, self.item_bias.shape),
        ]


def sigmoid_cross_entropy(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per-example losses and their gradient with respect to the logits."""
    xp = np if isinstance(logits, np.ndarray) else __import__("cupy")
    losses = xp.maximum(logits, 0) - logits * labels + xp.log1p(xp.exp(-xp.abs(logits)))
    return losses, 1.0 / (1.0 + xp.exp(-logits)) - labels


# Learning rates that train this model in a few epochs (the loss is the batch's mean).
DEFAULT_LEARNING_RATES = {"adagrad": 1.0, "sgd": 30.0, "adam": 0.01}


def make_optimizer(name: str, learning_rate: float | None) -> Any:
    """The optimizer ``name`` (Adagrad starts its accumulators at 1e-3, not Keras's 0.1: rare rows move sooner)."""
    rate = DEFAULT_LEARNING_RATES[name] if learning_rate is None else learning_rate
    if name == "adagrad":
        return td.optimizers.Adagrad(rate, initial_accumulator_value=1e-3)
    return {"sgd": td.optimizers.SGD, "adam": td.optimizers.Adam}[name](rate)


# --- training --------------------------------------------------------------------------------


def train(
    *,
    replicas: int | None = None,
    users: int = 2_000,
    items: int = 1_000,
    examples: int = 400_000,
    dim: int = 16,
    epochs: int = 5,
    batch_size: int = 256,
    optimizer: str = "adagrad",
    learning_rate: float | None = None,
    l2: float = 1e-4,
    seed: int = 0,
    log: Any = print,
) -> dict[str, Any]:
    """Trains and evaluates; returns the per-epoch history, the final test AUC and the speed."""
    strategy = make_strategy(replicas)
    if not strategy.extended.should_checkpoint:
        log = _quiet
    user_ids, item_ids, clicks, oracle = synthetic_clicks(users, items, examples, seed)
    split = int(examples * 0.9)
    train_data = (user_ids[:split], item_ids[:split], clicks[:split])
    test_users, test_items, test_clicks = user_ids[split:], item_ids[split:], clicks[split:]
    with strategy.scope():
        model = MatrixFactorization(users, items, dim, seed)
        opt = make_optimizer(optimizer, learning_rate)
        train_loss = td.metrics.Mean("train_loss")

    def train_step(u: Any, i: Any, y: Any) -> None:
        logits, user_rows, item_rows = model.forward(u, i)
        losses, dlogits = sigmoid_cross_entropy(logits, y)
        grads = model.gradients(u, i, user_rows, item_rows, dlogits / batch_size, l2)
        opt.apply_gradients(zip(grads, model.parameters))
        train_loss.update_state(losses)

    def test_auc() -> float:
        table_u, table_i = np.asarray(model.user_embedding.numpy()), np.asarray(model.item_embedding.numpy())
        bias = np.asarray(model.item_bias.numpy())
        scores = np.einsum("ij,ij->i", table_u[test_users], table_i[test_items]) + bias[test_items]
        return auc(scores, test_clicks)

    log(f"Training on {strategy.num_replicas_in_sync} replica(s), global batch {batch_size}, {split} clicks "
        f"({users} users x {items} items, {dim}-dim embeddings, {optimizer}); hidden model's AUC {oracle:.3f}.")
    history = []
    seconds = 0.0
    trained = 0
    steps = split // batch_size
    for epoch in range(epochs):
        dataset = strategy.experimental_distribute_dataset(
            td.data.Dataset.from_tensor_slices(train_data)
            .shuffle(split, seed=seed * 1000 + epoch, reshuffle_each_iteration=False)
            .batch(batch_size, drop_remainder=True)
        )
        train_loss.reset_state()
        start = time.perf_counter()
        for u, i, y in dataset:
            strategy.run(train_step, args=(u, i, y))
        seconds += time.perf_counter() - start
        trained += steps * batch_size
        record = {"epoch": epoch + 1, "loss": float(train_loss.result()), "test_auc": test_auc()}
        history.append(record)
        log(f"epoch {epoch + 1}/{epochs}  loss {record['loss']:.4f}  test AUC {record['test_auc']:.4f}")
    speed = trained / seconds if seconds else float("nan")
    final = history[-1]["test_auc"] if history else float("nan")
    log(f"Test AUC {final:.4f} (hidden model {oracle:.3f}); {speed:,.0f} training examples/s on "
        f"{strategy.num_replicas_in_sync} replica(s).")
    return {"history": history, "test_auc": final, "oracle_auc": oracle, "examples_per_second": speed,
            "replicas": strategy.num_replicas_in_sync, "model": model}


def _quiet(*args: Any, **kwargs: Any) -> None:
    del args, kwargs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=None,
                        help="number of replicas (default: every GPU, else one logical CPU per core)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256, help="the global batch size")
    parser.add_argument("--optimizer", choices=sorted(DEFAULT_LEARNING_RATES), default="adagrad")
    parser.add_argument("--learning-rate", type=float, default=None,
                        help=f"default: {', '.join(f'{k} {v}' for k, v in DEFAULT_LEARNING_RATES.items())}")
    parser.add_argument("--examples", type=int, default=400_000, help="clicks generated (90%% train, 10%% test)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.replicas is not None and args.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {args.replicas}")
    if args.batch_size < 1 or args.epochs < 0 or args.examples < 10:
        parser.error("--batch-size must be at least 1, --epochs at least 0, --examples at least 10")
    return train(replicas=args.replicas, epochs=args.epochs, batch_size=args.batch_size, optimizer=args.optimizer,
                 learning_rate=args.learning_rate, examples=args.examples, seed=args.seed)


if __name__ == "__main__":
    main()
