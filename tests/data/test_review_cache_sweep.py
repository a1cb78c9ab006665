"""Review: a checkpoint saved beside a cache file being filled must not delete the cache's reserved file."""

from __future__ import annotations

import os
import time

import numpy as np

import towerdist as td


def test_a_checkpoint_sweep_leaves_a_long_first_cache_pass_alone(tmp_path):
    cache = str(tmp_path / "train.cache")
    iterator = iter(td.data.Dataset.range(6).cache(cache))
    first = [int(next(iterator)) for _ in range(3)]  # the pass has reserved its file beside the cache
    reserved = [name for name in os.listdir(tmp_path) if name != "train.cache"]
    assert len(reserved) == 1
    # The first epoch has run for more than an hour (the reserved file is written only at the end).
    old = time.time() - 2 * 3600
    os.utime(tmp_path / reserved[0], (old, old))
    # Meanwhile the training loop saves a checkpoint in the same directory.
    td.train.Checkpoint(v=td.Variable(np.zeros(2, np.float32))).save(str(tmp_path / "ckpt"))
    rest = [int(x) for x in iterator]  # the end of the first pass writes the cache file
    assert first + rest == list(range(6))
    assert os.path.exists(cache)
    assert [int(x) for x in td.data.Dataset.range(0).cache(cache)] == list(range(6))  # read from the file
