"""How a global batch is split into per-replica pieces: TensorFlow's two rules.

* **Legacy rule** (sharding by data, what AUTO resolves to on a source that reads no files,
  or a batch size that cannot be seen): each global batch of actual size ``b`` becomes ``N``
  consecutive pieces of ``ceil(b / N)`` rows; the last pieces are shorter or empty (0 rows,
  other dimensions kept). Global batch boundaries are respected.
* **Cycling rule** (a known batch size ``B``, sharding by file, also on one worker, by hint,
  or not at all): a worker's rows are re-cut into pieces of ``batch_sizes_for_worker(B, W,
  R, w)`` sizes, cycled across batch boundaries; when the data ends, the missing pieces of
  the last step are padded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from towerdist._src import nest
from towerdist._src.data.dataset import Dataset
from towerdist._src.data.spec import TensorSpec
from towerdist._src.data.structure import unstack_count
from towerdist._src.type_aliases import HostArray, Nest, TensorLike

__all__ = ["batch_sizes_for_worker", "compute_batch_size", "dummy_like", "legacy_split", "replica_spec"]


def batch_sizes_for_worker(
    global_batch_size: int, num_workers: int, num_replicas_per_worker: int, worker_index: int
) -> list[int]:
    """The per-replica batch sizes worker ``worker_index`` cycles through (TensorFlow's rule).

    ``N = num_workers * num_replicas_per_worker`` pieces per global batch: the first
    ``global_batch_size % N`` get one row more; worker ``w``'s list is worker 0's rotated
    left by ``w * num_replicas_per_worker``.

    Example:
      >>> batch_sizes_for_worker(7, 2, 2, 1)
      [2, 1, 2, 2]
    """
    n = num_workers * num_replicas_per_worker
    floor = global_batch_size // n
    num_ceil = global_batch_size - n * floor
    worker_0 = [floor + 1] * num_ceil + [floor] * (n - num_ceil)
    shift = worker_index * num_replicas_per_worker
    return worker_0[shift:] + worker_0[:shift]


def _needs_batch(n: int) -> ValueError:
    return ValueError(
        f"Call the `batch` method on the input Dataset in order to be able to split your input across {n} "
        f"replicas: its elements are scalars, so there is no batch dimension to split. Batch it with the "
        f"global batch size, e.g. dataset.batch(64), or use distribute_datasets_from_function to give each "
        f"replica whole elements."
    )


def legacy_split(element: Nest, num_pieces: int) -> list[Nest]:
    """Splits one global batch into ``num_pieces`` pieces of ``ceil(b / num_pieces)`` rows (views)."""
    if not isinstance(element, (tuple, dict)):
        if np.ndim(element) == 0:
            raise _needs_batch(num_pieces)
        b = len(element)
        size = -(-b // num_pieces)
        return [element[min(i * size, b) : min((i + 1) * size, b)] for i in range(num_pieces)]
    leaves, treespec = nest.flatten(element)
    if any(np.ndim(leaf) == 0 for leaf in leaves):
        raise _needs_batch(num_pieces)
    b = unstack_count(leaves, "split")
    size = -(-b // num_pieces)
    return [
        treespec.unflatten([leaf[min(i * size, b) : min((i + 1) * size, b)] for leaf in leaves])
        for i in range(num_pieces)
    ]


def compute_batch_size(dataset: Dataset) -> int | None:
    """The global batch size of ``dataset``'s elements when it is known without iterating.

    The size given to the last ``batch``/``rebatch`` (looking through transformations that
    keep it), else a static leading dimension shared by every component. None if unknown.
    """
    hint = dataset._batch_size()
    if hint is not None:
        return hint
    spec = dataset._spec(probe=False)
    if spec is None:
        return None
    leaves, _ = nest.flatten(spec)
    firsts = {s.shape[0] if s.shape else None for s in leaves}
    if len(firsts) == 1:
        first = firsts.pop()
        return first
    return None


def replica_spec(spec: Nest, num_pieces: int, multi_worker: bool) -> Nest:
    """The spec of one replica's piece: the batch dimension divided when it divides evenly."""

    def piece(s: TensorSpec) -> TensorSpec:
        if not s.shape:
            return s
        b = s.shape[0]
        static = b // num_pieces if b is not None and b % num_pieces == 0 and not multi_worker else None
        return TensorSpec((static, *s.shape[1:]), s.dtype)

    return nest.map_structure(piece, spec)


def dummy_like(spec: Nest, present: Nest) -> Nest:
    """An empty piece for a replica without data (TensorFlow's rule).

    Unknown dimensions become 0, and so does the leading dimension of a fully known shape;
    scalars become zeros. Without a spec, the shapes of a present piece are used with 0 rows.
    """
    if spec is not None:
        return nest.map_structure(_dummy_from_spec, spec)
    return nest.map_structure(_dummy_from_piece, present)


def _dummy_from_spec(s: TensorSpec) -> HostArray:
    dims = [0 if d is None else d for d in (s.shape or ())]
    if dims and s.shape is not None and None not in s.shape:
        dims[0] = 0
    return np.zeros(dims, dtype=s.dtype)


def _dummy_from_piece(leaf: TensorLike) -> HostArray:
    shape: Sequence[int] = np.shape(leaf)
    dtype = np.object_ if isinstance(leaf, bytes) else getattr(leaf, "dtype", np.asarray(leaf).dtype)
    return np.zeros((0, *shape[1:]) if shape else (), dtype=dtype)
