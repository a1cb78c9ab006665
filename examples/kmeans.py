"""Distributed k-means: each replica owns a shard of the points; one all-reduce per iteration.

Every iteration, each replica assigns its points to the nearest centroid and computes
per-cluster sums and counts; ``ReplicaContext.all_reduce(SUM, ...)`` adds them up across
replicas, and every replica then computes the same new centroids and assigns them to a
mirrored variable (``aggregation=ONLY_FIRST_REPLICA``: the replicas agree, so the first
one's value is kept). The result is checked against a single-process numpy k-means
started from the same centroids.

    python examples/kmeans.py                     # 4 logical CPU replicas (or every GPU)
    python examples/kmeans.py --replicas 2 --points 200000 --clusters 16
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import towerdist as td


def make_blobs(points: int, clusters: int, dims: int, seed: int) -> np.ndarray:
    """Gaussian blobs around random centres, shuffled, float32."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, (clusters, dims))
    labels = rng.integers(0, clusters, points)
    return (centres[labels] + rng.standard_normal((points, dims))).astype(np.float32)


def assign_and_sum(x: Any, centroids: Any) -> tuple[Any, Any, Any]:
    """Per-cluster sums and counts of ``x``'s points, and their squared distance to the nearest centroid.

    Written with array methods and numpy functions only, so it runs unchanged on numpy and
    on cupy arrays (numpy functions dispatch to cupy through ``__array_function__``).
    """
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2, without the (n, k, d) intermediate.
    distances = (x * x).sum(1)[:, None] - 2 * x @ centroids.T + (centroids * centroids).sum(1)[None, :]
    nearest = distances.min(1, keepdims=True)
    one_hot = (distances == nearest).astype(x.dtype)
    inertia = nearest.clip(0).sum()
    return one_hot.T @ x, one_hot.sum(0), inertia


def new_centroids(sums: Any, counts: Any, old: Any) -> Any:
    """Cluster means; an empty cluster keeps its centroid."""
    return np.where(counts[:, None] > 0, sums / counts.clip(1)[:, None], old).astype(old.dtype)


def distributed_kmeans(strategy: Any, points: np.ndarray, initial: np.ndarray, iterations: int) -> tuple[Any, list]:
    """k-means over ``strategy``'s replicas; returns the centroids and the inertia of each iteration."""
    shards = np.array_split(points, strategy.num_replicas_in_sync)
    # Each replica's shard is placed on its device once and stays there.
    local_points = strategy.experimental_distribute_values_from_function(
        lambda ctx: td.constant(shards[ctx.replica_id_in_sync_group]))
    with strategy.scope():
        centroids = td.Variable(initial, aggregation=td.VariableAggregation.ONLY_FIRST_REPLICA, name="centroids")

    def step(x: Any) -> Any:
        context = td.distribute.get_replica_context()
        sums, counts, inertia = assign_and_sum(x, centroids.value())
        sums, counts, inertia = context.all_reduce(td.distribute.ReduceOp.SUM, [sums, counts, inertia])
        centroids.assign(new_centroids(sums, counts, centroids.value()))
        return inertia

    history = []
    for _ in range(iterations):
        before = centroids.numpy()
        inertia = strategy.experimental_local_results(strategy.run(step, args=(local_points,)))[0]
        history.append(float(inertia))
        if np.array_equal(centroids.numpy(), before):
            break  # no point changed cluster: a fixed point
    return centroids.numpy(), history


def numpy_kmeans(points: np.ndarray, initial: np.ndarray, iterations: int) -> np.ndarray:
    """The same algorithm in one process, for comparison."""
    centroids = initial.copy()
    for _ in range(iterations):
        sums, counts, _ = assign_and_sum(points, centroids)
        before, centroids = centroids, new_centroids(sums, counts, centroids)
        if np.array_equal(centroids, before):
            break
    return centroids


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=None, help="default: every GPU, else 4 logical CPUs")
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, default=8)
    parser.add_argument("--dims", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from train_digits import make_strategy  # the same device choice as the main job

    strategy = make_strategy(args.replicas)
    points = make_blobs(args.points, args.clusters, args.dims, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    initial = points[rng.choice(len(points), args.clusters, replace=False)]
    centroids, history = distributed_kmeans(strategy, points, initial, args.iterations)
    reference = numpy_kmeans(points, initial, args.iterations)
    matches = bool(np.allclose(centroids, reference, rtol=1e-4, atol=1e-4))
    print(f"k-means of {args.points} points in {args.dims} dimensions into {args.clusters} clusters on "
          f"{strategy.num_replicas_in_sync} replica(s): {len(history)} iterations, inertia "
          f"{history[0]:.1f} -> {history[-1]:.1f}.")
    print(f"Matches single-process numpy k-means: {matches}")
    return {"centroids": centroids, "history": history, "reference": reference, "matches": matches}


if __name__ == "__main__":
    main()
