"""The examples: the digits training job (shortened and in full), k-means, the notebook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import kmeans  # noqa: E402
import train_digits  # noqa: E402

pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (pip install -e '.[test]')")


def short_run(tmp_path, **overrides):
    options = dict(replicas=4, epochs=2, checkpoint_dir=str(tmp_path / "ckpt"), progress=False, log=lambda *_: None)
    options.update(overrides)
    return train_digits.train(**options)


def test_two_epochs_lower_the_loss_and_raise_the_accuracy(tmp_path):
    result = short_run(tmp_path)
    first, second = result["history"]
    assert result["replicas"] == 4
    assert second["loss"] < first["loss"]
    assert second["train_accuracy"] > first["train_accuracy"]
    assert second["test_accuracy"] >= first["test_accuracy"]
    assert result["examples_per_second"] > 0


def test_one_replica_gives_the_same_curve_as_four(tmp_path):
    four = short_run(tmp_path / "four")["history"]
    one = short_run(tmp_path / "one", replicas=1)["history"]
    for a, b in zip(four, one):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)
        assert a["train_accuracy"] == pytest.approx(b["train_accuracy"], abs=0.01)
        assert a["test_accuracy"] == pytest.approx(b["test_accuracy"], abs=0.01)


def test_resume_continues_exactly_where_the_run_stopped(tmp_path):
    uninterrupted = short_run(tmp_path / "straight", epochs=3)["history"]
    short_run(tmp_path / "resumed", epochs=2)
    resumed = short_run(tmp_path / "resumed", epochs=3, resume=True)
    assert [r["epoch"] for r in resumed["history"]] == [3]  # epochs 1-2 came from the checkpoint
    assert resumed["history"][0]["loss"] == pytest.approx(uninterrupted[2]["loss"], rel=1e-5)
    assert resumed["history"][0]["test_accuracy"] == pytest.approx(uninterrupted[2]["test_accuracy"], abs=1e-6)
    assert resumed["checkpoint"].endswith("ckpt-3")


def test_manual_backprop_matches_finite_differences():
    model = train_digits.MLP(sizes=(5, 7, 3), seed=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5)).astype(np.float64)
    y = np.array([0, 2, 1, 2])
    logits, inputs = model.forward(x.astype(np.float32))
    _, dlogits = train_digits.softmax_cross_entropy(logits.astype(np.float64), y)
    grads = model.gradients([i.astype(np.float64) for i in inputs], dlogits)

    def loss_with(parameter, index, delta):
        values = [p.numpy().astype(np.float64) for p in model.parameters]
        values[parameter][index] += delta
        h = x
        for k in range(0, len(values), 2):
            h = h @ values[k] + values[k + 1]
            if k + 2 < len(values):
                h = h * (h > 0)
        losses, _ = train_digits.softmax_cross_entropy(h, y)
        return losses.sum()

    for parameter, grad in enumerate(grads):
        index = tuple(0 for _ in grad.shape)
        numeric = (loss_with(parameter, index, 1e-6) - loss_with(parameter, index, -1e-6)) / 2e-6
        assert grad[index] == pytest.approx(numeric, rel=1e-3, abs=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_default_run_reaches_95_percent(tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_digits.py"), "--no-progress", "--checkpoint-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=280,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("Test accuracy"), done.stdout
    accuracy = float(last.split()[2].rstrip(";"))
    assert accuracy >= 0.95, done.stdout
    assert f"on {train_digits.default_cpu_replicas()} replica(s)" in last or "GPU" in done.stdout
    assert sorted(p.name for p in tmp_path.glob("*.index")) == ["ckpt-20.index", "ckpt-30.index", "ckpt-40.index"]


def test_checkpoints_are_written_every_n_epochs_and_after_the_last(tmp_path):
    short_run(tmp_path, replicas=2, epochs=5, checkpoint_every=2)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.index")) == ["ckpt-2.index", "ckpt-4.index", "ckpt-5.index"]
    with pytest.raises(ValueError, match="checkpoint_every"):
        short_run(tmp_path, checkpoint_every=0)


def test_the_default_cpu_replica_count_follows_the_cores(monkeypatch):
    monkeypatch.setattr(train_digits.os, "sched_getaffinity", lambda pid: set(range(3)), raising=False)
    assert train_digits.default_cpu_replicas() == 3
    monkeypatch.setattr(train_digits.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert train_digits.default_cpu_replicas() == train_digits.MAX_DEFAULT_CPU_REPLICAS
    monkeypatch.setattr(train_digits.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert train_digits.default_cpu_replicas() == 1


@pytest.mark.timeout(120)
def test_the_example_pins_blas_to_one_thread_unless_told_otherwise():
    """The variables are set when the example is imported, before numpy loads its BLAS."""
    code = (f"import os, sys; sys.path.insert(0, {str(EXAMPLES)!r}); import train_digits; "
            "print(os.environ['OPENBLAS_NUM_THREADS'], os.environ['OMP_NUM_THREADS'])")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    pinned = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert pinned.stdout.split() == ["1", "1"], pinned.stderr
    chosen = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "2"},
                            capture_output=True, text=True, timeout=60)
    assert chosen.stdout.split() == ["2", "1"], chosen.stderr


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_kmeans_matches_single_process_numpy(replicas):
    result = kmeans.main(["--replicas", str(replicas), "--points", "4000", "--clusters", "5", "--dims", "3"])
    assert result["matches"]
    assert np.allclose(result["centroids"], result["reference"], rtol=1e-4, atol=1e-4)
    history = result["history"]
    assert all(later <= earlier * (1 + 1e-6) for earlier, later in zip(history, history[1:]))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_quickstart_notebook_executes(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )
    assert "replicas: 2" in text
    assert "both replicas hold the same w: True" in text
    assert not any(output.get("output_type") == "error" for cell in notebook.cells for output in cell.get("outputs", []))
