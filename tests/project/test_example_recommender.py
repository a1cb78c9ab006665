"""The sparse-gradient example: examples/embedding_recommender.py (matrix factorisation, IndexedSlices)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import embedding_recommender  # noqa: E402


def short_run(**overrides):
    options = dict(replicas=2, users=300, items=150, examples=60_000, epochs=3, log=lambda *_: None)
    options.update(overrides)
    return embedding_recommender.train(**options)


def test_training_learns_the_hidden_model():
    result = short_run()
    aucs = [record["test_auc"] for record in result["history"]]
    assert result["replicas"] == 2
    assert aucs[-1] > aucs[0] and aucs[-1] > 0.6, aucs
    assert aucs[-1] <= result["oracle_auc"] + 0.02  # the hidden model bounds what can be learned
    assert result["examples_per_second"] > 0


def test_one_replica_gives_the_same_curve_as_two():
    two = short_run()
    one = short_run(replicas=1)
    for a, b in zip(two["history"], one["history"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["test_auc"] == pytest.approx(b["test_auc"], abs=1e-4)
    np.testing.assert_allclose(
        two["model"].user_embedding.numpy(), one["model"].user_embedding.numpy(), rtol=1e-4, atol=1e-6
    )


def test_the_gradients_are_sparse_and_match_finite_differences():
    model = embedding_recommender.MatrixFactorization(users=5, items=4, dim=3, seed=1)
    users, items = np.array([0, 3, 0]), np.array([1, 1, 2])
    labels = np.array([1.0, 0.0, 1.0], np.float32)

    def loss() -> float:
        logits, _, _ = model.forward(users, items)
        losses, _ = embedding_recommender.sigmoid_cross_entropy(logits.astype(np.float64), labels)
        return float(losses.sum())

    logits, user_rows, item_rows = model.forward(users, items)
    _, dlogits = embedding_recommender.sigmoid_cross_entropy(logits, labels)
    grads = model.gradients(users, items, user_rows, item_rows, dlogits, l2=0.0)
    assert all(isinstance(g, embedding_recommender.td.IndexedSlices) for g in grads)
    dense = embedding_recommender.td.convert_to_tensor(grads[0])  # repeated user 0 summed
    table = model.user_embedding.numpy()
    step = 1e-3
    for row, column in ((0, 1), (3, 2), (1, 0)):
        bumped = table.copy()
        bumped[row, column] += step
        model.user_embedding.assign(bumped)
        up = loss()
        bumped[row, column] -= 2 * step
        model.user_embedding.assign(bumped)
        down = loss()
        model.user_embedding.assign(table)
        assert dense[row, column] == pytest.approx((up - down) / (2 * step), abs=2e-3)


def test_auc_counts_ties_as_half():
    assert embedding_recommender.auc(np.array([0.1, 0.4, 0.4, 0.9]), np.array([0, 0, 1, 1])) == pytest.approx(0.875)
    assert embedding_recommender.auc(np.array([1.0, 1.0]), np.array([0, 1])) == pytest.approx(0.5)


@pytest.mark.timeout(300)
def test_the_script_runs_from_the_command_line():
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "embedding_recommender.py"), "--epochs", "1", "--examples", "20000"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("Test AUC ") and "training examples/s on" in last, done.stdout
