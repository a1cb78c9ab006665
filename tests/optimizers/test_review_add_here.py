"""Review: the sums added on the merging thread equal the all-reduce's in edge cases."""

from __future__ import annotations

import numpy as np
import pytest

import towerdist as td


def rid() -> int:
    return int(td.distribute.get_replica_context().replica_id_in_sync_group)


def _train(strategy, shapes, dtype, make_optimizer, grads, cross_replica, name):
    with strategy.scope():
        variables = [td.Variable(np.full(shape, 1.0, dtype), name=f"{name}{k}") for k, shape in enumerate(shapes)]
        opt = make_optimizer()
    for step_grads in grads:
        if cross_replica:
            pr = [td.distribute.PerReplica([step_grads[r][k] for r in range(len(step_grads))]) for k in range(len(shapes))]
            opt.apply_gradients(zip(pr, variables))
        else:
            strategy.run(lambda g=step_grads: opt.apply_gradients(zip(g[rid()], variables)))
    return [np.array(v.values[0].numpy()) for v in variables]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shapes", [((),), ((), (3,)), ((5, 7), ())])
@pytest.mark.parametrize("cross_replica", [False, True])
@pytest.mark.parametrize("ops", ["default", "chunked"])
@pytest.mark.parametrize("make_optimizer", [lambda: td.optimizers.SGD(0.1), lambda: td.optimizers.Adam(0.1),
                                            lambda: td.optimizers.RMSprop(0.1, momentum=0.5, centered=True)],
                         ids=["sgd", "adam", "rms"])
def test_added_here_equals_the_all_reduce(monkeypatch, dtype, shapes, cross_replica, ops, make_optimizer):
    kwargs = {} if ops == "default" else {"cross_device_ops": td.distribute.SharedMemoryAllReduce(chunk_bytes=8, parallel_threshold_bytes=16, pack_bytes=1 << 20)} if hasattr(td.distribute, "SharedMemoryAllReduce") else {}
    strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"], **kwargs)
    rng = np.random.default_rng(3)
    grads = [[[np.array(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 3, size=shape), dtype=dtype) for shape in shapes]
              for _ in range(3)] for _ in range(4)]
    assert strategy.extended._sums_host_arrays_in_order()
    real = type(strategy.extended)._all_reduce
    calls = [0]

    def counting(self, *a, **k):
        calls[0] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(type(strategy.extended), "_all_reduce", counting)
    added = _train(strategy, shapes, dtype, make_optimizer, grads, cross_replica, "a")
    monkeypatch.setattr(type(strategy.extended), "_sums_host_arrays_in_order", lambda self: False)
    added_calls = calls[0]
    reduced = _train(strategy, shapes, dtype, make_optimizer, grads, cross_replica, "r")
    assert added_calls < calls[0] - added_calls, (added_calls, calls[0])
    for a, b in zip(added, reduced):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
