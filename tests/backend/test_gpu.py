"""GPU paths: the cupy backend, MirroredStrategy on GPUs, NcclAllReduce, the training kit.

Marked ``gpus(n)`` (towerdist's pytest plugin): they run on real GPUs, and skip (with the reason) where cupy
or a GPU is missing. ``.ci/run`` also runs them in a separate, named mode on 2 and 3
*simulated* GPUs (``TOWERDIST_SIMULATE_GPUS``, see ``towerdist.testing``), which checks
placement and ordering logic on CPU arrays; that is not GPU verification.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import towerdist as td
from towerdist._src import device as device_lib
from towerdist._src.backend import cupy_backend, gpu_module
from towerdist._src.cross_device_ops.select import choose_cross_device_ops


def gpus(n: int) -> list[str]:
    return [f"GPU:{i}" for i in range(n)]


@pytest.mark.gpus(1)
def test_cupy_backend_places_arrays_on_the_device():
    cupy = cupy_backend.cupy_module()
    array = cupy_backend.asarray(np.arange(4, dtype=np.float32), device=device_lib.parse("GPU:0"))
    assert isinstance(array, cupy.ndarray) and array.device.id == 0
    np.testing.assert_array_equal(cupy.asnumpy(cupy_backend.add_n([array, array])), np.arange(4) * 2)


@pytest.mark.gpus(1)
def test_constant_under_a_gpu_device_scope_is_a_cupy_array():
    with td.device("GPU:0"):
        value = td.constant([1.0, 2.0])
    assert cupy_backend.owns(value) and value.dtype == np.float32


@pytest.mark.gpus(1)
def test_mirrored_on_one_gpu_runs_and_reduces():
    strategy = td.distribute.MirroredStrategy(gpus(1))
    result = strategy.run(lambda: td.constant([1.0, 2.0]) * 2.0)
    assert cupy_backend.owns(result)
    np.testing.assert_array_equal(cupy_backend.xp.asnumpy(strategy.reduce("sum", result, axis=None)), [2.0, 4.0])


@pytest.mark.gpus(1)
def test_default_cross_device_ops_for_gpus_is_chosen_with_a_reason():
    ops, reason = choose_cross_device_ops([device_lib.parse("GPU:0")])
    assert isinstance(ops, (td.distribute.NcclAllReduce, td.distribute.HierarchicalCopyAllReduce))
    assert "GPU" in reason


@pytest.mark.gpus(2)
@pytest.mark.parametrize("ops", ["nccl", "hierarchical", "one_device"])
def test_all_reduce_across_gpus(ops):
    cross_device_ops = {
        "nccl": td.distribute.NcclAllReduce,
        "hierarchical": td.distribute.HierarchicalCopyAllReduce,
        "one_device": td.distribute.ReductionToOneDevice,
    }[ops]()
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=cross_device_ops)

    def step():
        ctx = td.distribute.get_replica_context()
        value = td.constant(np.arange(1000, dtype=np.float32)) * td.cast(ctx.replica_id_in_sync_group + 1, td.float32)
        return ctx.all_reduce("sum", value)

    for part in strategy.experimental_local_results(strategy.run(step)):
        np.testing.assert_allclose(cupy_backend.xp.asnumpy(part), np.arange(1000) * 3.0)


@pytest.mark.gpus(1)
def test_variable_under_a_gpu_device_scope_lives_on_the_gpu():
    with td.device("GPU:0"):
        v = td.Variable([1.0, 2.0])
    assert v.device.endswith("GPU:0") and cupy_backend.owns(v.value())
    before = v.value()
    v.assign_add(np.ones(2, np.float32))  # a host value is moved to the variable's device
    np.testing.assert_array_equal(v.numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(cupy_backend.xp.asnumpy(before), [1.0, 2.0])  # reads are snapshots
    assert isinstance(v.numpy(), np.ndarray) and "numpy=array([2., 3.]" in repr(v)


@pytest.mark.gpus(2)
def test_mirrored_variable_on_two_gpus():
    strategy = td.distribute.MirroredStrategy(gpus(2))
    with strategy.scope():
        v = td.Variable(np.zeros(4, np.float32), aggregation=td.VariableAggregation.SUM)
    assert [c.value().device.id for c in v.values] == [0, 1]
    def step():
        replica = td.distribute.get_replica_context().replica_id_in_sync_group
        v.assign_add(td.ones([4]) * td.cast(replica + 1, td.float32))

    strategy.run(step)
    for c in v.values:
        np.testing.assert_array_equal(c.numpy(), [3.0] * 4)
    with strategy.scope():
        counter = td.Variable(
            0.0, synchronization=td.VariableSynchronization.ON_READ, aggregation=td.VariableAggregation.SUM
        )
    strategy.run(lambda: counter.assign_add(td.constant(1.0)))
    assert float(counter.numpy()) == 2.0


@pytest.mark.gpus(1)
@pytest.mark.parametrize("fetch", [True, False])
def test_distributed_dataset_places_pieces_on_the_gpu_unless_told_not_to(fetch):
    cupy = cupy_backend.cupy_module()
    strategy = td.distribute.MirroredStrategy(gpus(1))
    options = td.distribute.InputOptions(experimental_fetch_to_device=fetch)
    batches = list(strategy.experimental_distribute_dataset(td.data.Dataset.range(6).batch(4), options))
    assert [isinstance(b, cupy.ndarray) for b in batches] == [fetch, fetch]
    np.testing.assert_array_equal(np.concatenate([cupy.asnumpy(b) if fetch else b for b in batches]), np.arange(6))


@pytest.mark.gpus(2)
def test_distributed_dataset_pieces_live_on_their_replicas_gpus():
    cupy = cupy_backend.cupy_module()
    strategy = td.distribute.MirroredStrategy(gpus(2))
    batch = next(iter(strategy.experimental_distribute_dataset(td.data.Dataset.range(3).batch(3))))
    pieces = strategy.experimental_local_results(batch)
    assert [p.device.id for p in pieces] == [0, 1]
    assert [cupy.asnumpy(p).tolist() for p in pieces] == [[0, 1], [2]]


# --- the training kit on GPUs ---------------------------------------------------------------


def _adam_reference(w0: np.ndarray, grads: list[np.ndarray], lr: float = 0.01) -> np.ndarray:
    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    b1, b2, one = np.float32(0.9), np.float32(0.999), np.float32(1)
    for t, g in enumerate(grads, start=1):
        alpha = np.float32(lr) * np.sqrt(one - b2 ** np.float32(t)) / (one - b1 ** np.float32(t))
        m = m + (g - m) * (one - b1)
        v = v + (g * g - v) * (one - b2)
        w = w - m * alpha / (np.sqrt(v) + np.float32(1e-7))
    return w


@pytest.mark.gpus(1)
def test_adam_on_one_gpu_matches_numpy_and_keeps_slots_on_the_gpu():
    strategy = td.distribute.MirroredStrategy(gpus(1))
    w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    grads = [np.full((3, 4), k + 1, np.float32) for k in range(3)]
    with strategy.scope():
        w = td.Variable(w0)
        optimizer = td.optimizers.Adam(0.01)
    for g in grads:
        strategy.run(lambda g=g: optimizer.apply_gradients([(td.constant(g), w)]))
    assert cupy_backend.owns(optimizer.get_slot(w, "m").values[0].value())
    np.testing.assert_allclose(w.numpy(), _adam_reference(w0, grads), rtol=1e-5)


@pytest.mark.gpus(2)
def test_adam_across_gpus_sums_the_replicas_gradients():
    strategy = td.distribute.MirroredStrategy(gpus(2))
    w0 = np.zeros(5, np.float32)
    with strategy.scope():
        w = td.Variable(w0)
        optimizer = td.optimizers.Adam(0.01)

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        optimizer.apply_gradients([(td.constant(np.arange(5, dtype=np.float32) * (rid + 1)), w)])

    strategy.run(step)
    summed = np.arange(5, dtype=np.float32) * 3
    for component in w.values:
        np.testing.assert_allclose(cupy_backend.xp.asnumpy(component.value()), _adam_reference(w0, [summed]), rtol=1e-5)


@pytest.mark.gpus(1)
def test_checkpoint_of_gpu_variables_restores_on_the_cpu(tmp_path):
    strategy = td.distribute.MirroredStrategy(gpus(1))
    with strategy.scope():
        w = td.Variable(np.arange(6, dtype=np.float32))
        mean = td.metrics.Mean()
    strategy.run(lambda: mean.update_state(td.constant([1.0, 3.0])))
    path = td.train.Checkpoint(w=w, mean=mean).save(str(tmp_path / "ckpt"))
    cpu_w = td.Variable(np.zeros(6, np.float32))
    cpu_mean = td.metrics.Mean()
    td.train.Checkpoint(w=cpu_w, mean=cpu_mean).restore(path).assert_consumed()
    np.testing.assert_array_equal(cpu_w.numpy(), np.arange(6))
    assert float(cpu_mean.result()) == 2.0


# --- the defects of issue 16, part A (each failed on simulated GPUs before its fix) ----------


@pytest.mark.gpus(2)
def test_each_replica_computes_on_its_own_gpu():
    # Defect 1: cupy launches on the thread's current device; a replica thread must make its GPU current.
    cupy = cupy_backend.cupy_module()
    strategy = td.distribute.MirroredStrategy(gpus(2))

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        value = td.ones([4]) * td.cast(rid + 1, td.float32)  # the original GPU test's expression
        return cupy.cuda.runtime.getDevice(), value, value * 2.0

    current, value, doubled = strategy.run(step)
    assert strategy.experimental_local_results(current) == (0, 1)
    assert [v.device.id for v in strategy.experimental_local_results(value)] == [0, 1]
    assert [v.device.id for v in strategy.experimental_local_results(doubled)] == [0, 1]


@pytest.mark.gpus(2)
@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
def test_optimizer_updates_keep_every_copy_and_slot_on_its_gpu(optimizer):
    # Defect 1: updates ran on GPU 0 and stored GPU-0 arrays into GPU-1 copies.
    strategy = td.distribute.MirroredStrategy(gpus(2))
    with strategy.scope():
        w = td.Variable(np.zeros((3, 2), np.float32))
        opt = td.optimizers.SGD(0.1, momentum=0.9) if optimizer == "sgd_momentum" else td.optimizers.Adam(0.01)

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        grad = td.constant(np.arange(6, dtype=np.float64).reshape(3, 2)) * td.cast(rid + 1, td.float64)  # cast too
        opt.apply_gradients([(grad, w)])

    for _ in range(2):
        strategy.run(step)
    assert [c.value().device.id for c in w.values] == [0, 1]
    for name in opt.get_slot_names():
        assert [c.value().device.id for c in opt.get_slot(w, name).values] == [0, 1]
    first, second = (cupy_backend.xp.asnumpy(c.value()) for c in w.values)
    np.testing.assert_array_equal(first, second)


@pytest.mark.gpus(2)
@pytest.mark.parametrize("size", [3, 1 << 21], ids=["small", "8 MiB (past the parallel-update threshold)"])
def test_each_replica_updates_the_copies_on_its_own_gpu_on_its_own_thread(size):
    # The optimizer update ran on one thread launching every GPU's kernels in turn; past the
    # size where host updates are split over the parked threads, GPU updates were split too,
    # onto threads and streams the step did not order.
    import threading

    launched = []

    class RecordingSGD(td.optimizers.SGD):
        def _compute(self, xp, var, grad, slots, coefficients, out):
            launched.append((var.device.id, threading.current_thread().name, xp.cuda.runtime.getDevice()))
            return super()._compute(xp, var, grad, slots, coefficients, out)

    strategy = td.distribute.MirroredStrategy(gpus(2))
    with strategy.scope():
        w = td.Variable(np.zeros(size, np.float32))
        v = td.Variable(np.zeros(size, np.float32))
        opt = RecordingSGD(0.5)

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        grad = td.ones([size]) * td.cast(rid + 1, td.float32)
        opt.apply_gradients([(grad, w), (grad * 2.0, v)])
        return w.value(), v.value()  # this replica's copies, already updated when apply_gradients returns

    values = strategy.experimental_local_results(strategy.run(step))
    me = threading.current_thread().name
    assert sorted(launched) == [(0, me, 0), (0, me, 0), (1, "towerdist-replica-1", 1), (1, "towerdist-replica-1", 1)]
    for w_value, v_value in values:
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(w_value)[:3], [-1.5] * 3)
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(v_value)[-3:], [-3.0] * 3)
    assert opt.iterations.numpy() == 1


@pytest.mark.gpus(2)
@pytest.mark.parametrize("num_packs", [0, 1, 2])
def test_nccl_all_reduce_of_views_keeps_its_temporaries_on_their_gpus(num_packs):
    # Defects 2 and 3: contiguous copies and pack buffers must be made on each rank's GPU and
    # stay alive until the group completes.
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=td.distribute.NcclAllReduce(num_packs))

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        base = td.constant(np.arange(12, dtype=np.float32).reshape(3, 4)) * td.cast(rid + 1, td.float32)
        return td.distribute.get_replica_context().all_reduce("sum", [base.T, base[:, ::2], base + 1.0])

    results = strategy.experimental_local_results(strategy.run(step))
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    for device, (t, strided, plus) in enumerate(results):
        assert {t.device.id, strided.device.id, plus.device.id} == {device}
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(t), base.T * 3)
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(strided), base[:, ::2] * 3)
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(plus), base * 3 + 2)


@pytest.mark.gpus(2)
@pytest.mark.parametrize("ops", ["hierarchical", "one_device"])
def test_views_on_another_gpu_are_copied_contiguously(ops):
    # Defect 4: cupy refuses to copy a non-contiguous array between GPUs.
    cross_device_ops = {"hierarchical": td.distribute.HierarchicalCopyAllReduce, "one_device":
                        td.distribute.ReductionToOneDevice}[ops]()
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=cross_device_ops)
    values = strategy.run(lambda: (td.constant(np.arange(8, dtype=np.float32).reshape(2, 4))
                                   * td.cast(td.distribute.get_replica_context().replica_id_in_sync_group + 1,
                                             td.float32))[:, ::2])
    total = strategy.reduce("sum", values, axis=None)
    expected = np.arange(8, dtype=np.float32).reshape(2, 4)[:, ::2]
    np.testing.assert_array_equal(cupy_backend.xp.asnumpy(total), expected * 3)
    gathered = strategy.gather(values, axis=0)
    np.testing.assert_array_equal(cupy_backend.xp.asnumpy(gathered), np.concatenate([expected, expected * 2]))


@pytest.mark.gpus(2)
def test_constants_and_casts_follow_the_device_scope():
    # Defect 5: the backend was chosen by the input, not by the scope.
    cupy = cupy_backend.cupy_module()
    with td.device("GPU:1"):
        scalar = td.cast(np.int32(2), td.float32)
        constant = td.constant(np.ones(3))
        product = td.ones([3]) * scalar
    assert [scalar.device.id, constant.device.id, product.device.id] == [1, 1, 1]
    with td.device("GPU:0"):
        on_gpu = td.constant([1.0, 2.0])
    with td.device("CPU:0"):
        back = td.constant(on_gpu)
    assert isinstance(back, np.ndarray) and back.tolist() == [1.0, 2.0]
    assert isinstance(on_gpu, cupy.ndarray)


@pytest.mark.gpus(2)
def test_convert_to_tensor_and_identity_follow_the_device_scope():
    # convert_to_tensor and identity ignored the device scope (constant and cast followed it).
    cupy = cupy_backend.cupy_module()
    with td.device("GPU:1"):
        converted = td.convert_to_tensor(np.arange(3.0))
        from_python = td.convert_to_tensor([1.0, 2.0])
        copied = td.identity(np.arange(2))
    assert [converted.device.id, from_python.device.id, copied.device.id] == [1, 1, 1]
    with td.device("GPU:0"):
        on_gpu0 = td.constant([1.0, 2.0])
    with td.device("GPU:1"):
        unchanged = td.convert_to_tensor(on_gpu0)  # TF returns an existing tensor as it is
        moved = td.identity(on_gpu0)  # tf.identity is placed on the scope's device
    assert unchanged is on_gpu0 and moved.device.id == 1 and cupy.asnumpy(moved).tolist() == [1.0, 2.0]
    with td.device("CPU:0"):
        back = td.identity(on_gpu0)
    assert isinstance(back, np.ndarray) and back.tolist() == [1.0, 2.0]
    strings = np.array(["a", "b"])
    with td.device("GPU:0"):
        assert td.convert_to_tensor(strings) is strings  # cupy holds numbers only; strings stay on the host


@pytest.mark.gpus(2)
@pytest.mark.parametrize("metric", ["sparse_categorical_accuracy", "mean_squared_error"])
def test_metric_functions_on_another_gpus_data_compute_there(metric):
    # Called from the main thread (current GPU 0) on GPU 1's data, they launched on GPU 0.
    with td.device("GPU:1"):
        predictions = td.constant([[0.1, 0.9], [0.8, 0.2]])
    labels = np.array([1, 1]) if metric == "sparse_categorical_accuracy" else np.array([[0.0, 1.0], [1.0, 0.0]])
    result = getattr(td.metrics, metric)(labels, predictions)
    expected = [1.0, 0.0] if metric == "sparse_categorical_accuracy" else [0.01, 0.04]
    assert result.device.id == 1
    np.testing.assert_allclose(cupy_backend.xp.asnumpy(result), expected, rtol=1e-6)


@pytest.mark.gpus(2)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_the_multi_worker_mean_divides_on_the_totals_gpu_whichever_gpu_is_current(dtype):
    # N4: MultiWorkerMirroredStrategy's MEAN divided in place on the current GPU, which is the
    # GPU of whichever replica arrived last, not necessarily the total's.
    from towerdist._src.strategies.multi_worker_mirrored import _mean

    cupy = cupy_backend.cupy_module()
    with cupy.cuda.Device(1):
        total = cupy.asarray(np.array([4, 8], dtype))
    with cupy.cuda.Device(0):
        mean = _mean(total, 4)
    assert mean.device.id == 1 and cupy.asnumpy(mean).tolist() == [1.0, 2.0]


@pytest.mark.gpus(2)
@pytest.mark.parametrize("devices", [["GPU:1"], ["GPU:1", "GPU:2"]], ids=["GPU:1", "GPU:1 and GPU:2"])
def test_arithmetic_on_a_variable_of_other_gpus_runs_on_its_gpu_from_the_main_thread(devices):
    # A variable on GPU 1 read from the main thread (current GPU 0) computed on GPU 0.
    if len(devices) > cupy_backend.device_count() - 1:
        pytest.skip(f"needs {len(devices) + 1} GPUs")
    strategy = td.distribute.MirroredStrategy(devices)
    with strategy.scope():
        v = td.Variable([1.0, 2.0])
    results = [v + 1.0, 2.0 * v, -v, v[1:], v[np.array([1, 0])], np.sqrt(v), v @ v]
    assert [r.device.id for r in results] == [1] * len(results)
    np.testing.assert_allclose(cupy_backend.xp.asnumpy(results[0]), [2.0, 3.0])
    np.testing.assert_allclose(cupy_backend.xp.asnumpy(results[4]), [2.0, 1.0])
    np.testing.assert_allclose(float(cupy_backend.xp.asnumpy(results[-1])), 5.0)


@pytest.mark.gpus(1)
def test_identity_of_strings_in_a_gpu_scope_stays_on_the_host():
    # cupy holds numbers only: identity (e.g. inside a GPU replica) copies strings on the host, as TF.
    strings = np.array(["a", "b"])
    with td.device("GPU:0"):
        copied = td.identity(strings)
    assert isinstance(copied, np.ndarray) and copied is not strings and copied.tolist() == ["a", "b"]


@pytest.mark.gpus(1)
def test_string_features_stay_on_the_host():
    # Defect 6: cupy holds numbers only; TF keeps string features on the host.
    cupy = cupy_backend.cupy_module()
    strategy = td.distribute.MirroredStrategy(gpus(1))
    dataset = td.data.Dataset.from_tensor_slices((np.arange(4.0), np.array(["a", "b", "c", "d"]))).batch(2)
    numbers, words = next(iter(strategy.experimental_distribute_dataset(dataset)))
    assert isinstance(numbers, cupy.ndarray) and isinstance(words, np.ndarray)
    assert words.tolist() == [b"a", b"b"]


@pytest.mark.gpus(2)
@pytest.mark.parametrize("dtype", [np.complex64, np.int16, np.uint16])
def test_nccl_reduces_dtypes_it_has_no_type_for(dtype):
    # Defect 7: complex as pairs of floats; int16/uint16 by copies.
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=td.distribute.NcclAllReduce())
    value = np.array([1, 2, 3], dtype) * (dtype(1 + 1j) if np.dtype(dtype).kind == "c" else dtype(1))

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        return td.distribute.get_replica_context().all_reduce("sum", td.constant(value) * dtype(rid + 1))

    for part in strategy.experimental_local_results(strategy.run(step)):
        assert part.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(part), value * 3)


@pytest.mark.gpus(1)
def test_a_gpu_that_does_not_exist_is_named():
    # Defect 10: a raw CUDA error before.
    with pytest.raises(td.errors.InvalidArgumentError, match="GPU:7 does not exist"):
        with td.device("GPU:7"):
            td.constant([1.0])


@pytest.mark.gpus(2)
@pytest.mark.parametrize("move", ["to_device", "copy"])
def test_a_view_on_one_gpu_copies_to_another(move):
    # Defect 4, directly: cupy copies only contiguous arrays between GPUs.
    gpu0, gpu1 = device_lib.parse("GPU:0"), device_lib.parse("GPU:1")
    on_gpu1 = cupy_backend.asarray(np.arange(8, dtype=np.float32).reshape(2, 4), device=gpu1)
    moved = getattr(cupy_backend, move)(on_gpu1[:, ::2], gpu0)  # neither C- nor F-contiguous
    assert moved.device.id == 0
    np.testing.assert_array_equal(cupy_backend.xp.asnumpy(moved), np.arange(8, dtype=np.float32).reshape(2, 4)[:, ::2])


@pytest.mark.gpus(2)
def test_the_main_job_on_every_gpu_matches_the_cpu_run_and_keeps_each_copy_on_its_gpu(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    sys.path.insert(0, str(examples))
    try:
        import train_digits
    finally:
        sys.path.remove(str(examples))
    n = cupy_backend.device_count()
    result = train_digits.train(epochs=3, checkpoint_dir=str(tmp_path / "gpu"), progress=False, log=lambda *a: None)
    assert result["replicas"] == n
    for variable in result["model"].parameters:
        assert [c.value().device.id for c in variable.values] == list(range(n))
        for name in result["optimizer"].get_slot_names():
            assert [c.value().device.id for c in result["optimizer"].get_slot(variable, name).values] == list(range(n))
    env = {k: v for k, v in os.environ.items() if k != "TOWERDIST_SIMULATE_GPUS"}  # the CPU run
    cpu = subprocess.run(
        [sys.executable, str(examples / "train_digits.py"), "--replicas", str(n), "--epochs", "3", "--no-progress",
         "--checkpoint-dir", str(tmp_path / "cpu")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert cpu.returncode == 0, cpu.stderr
    cpu_accuracy = float(cpu.stdout.split("Test accuracy ")[1].split(";")[0])
    assert result["test_accuracy"] == pytest.approx(cpu_accuracy, abs=0.01)


@pytest.mark.gpus(2)
def test_the_kmeans_example_on_gpus_matches_numpy():
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    sys.path.insert(0, str(examples))
    try:
        import kmeans
    finally:
        sys.path.remove(str(examples))
    points = kmeans.make_blobs(2000, 4, 3, seed=0)
    initial = points[:4].copy()
    strategy = td.distribute.MirroredStrategy(gpus(cupy_backend.device_count()))
    centroids, _ = kmeans.distributed_kmeans(strategy, points, initial, iterations=5)
    np.testing.assert_allclose(np.asarray(centroids), kmeans.numpy_kmeans(points, initial, 5), rtol=1e-4, atol=1e-4)


class _Wrapped:
    """An NCCL communicator with one method replaced (tests of failures and of the clique's life)."""

    def __init__(self, comm, rank, **methods):
        self._comm, self._rank, self._methods = comm, rank, methods

    def __getattr__(self, name):
        if name in self._methods:
            return lambda *args: self._methods[name](self._comm, self._rank, *args)
        return getattr(self._comm, name)


def _all_reduce_step():
    rid = td.distribute.get_replica_context().replica_id_in_sync_group
    return td.distribute.get_replica_context().all_reduce("sum", td.ones([3]) * td.cast(rid + 1, td.float32))


def _only_clique(ops):
    ((key, clique),) = ops._cliques.items()
    return key, clique


@pytest.mark.gpus(2)
def test_a_failed_nccl_call_aborts_its_communicators_and_the_next_reduce_works():
    # Defect 9: a call failing inside a group left the other ranks' collectives waiting forever.
    ops = td.distribute.NcclAllReduce(num_packs=0)
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=ops)
    strategy.run(_all_reduce_step)  # creates the communicators
    key, clique = _only_clique(ops)
    aborted = []

    def fail_on_rank_1(comm, rank, *args):
        if rank == 1:
            raise RuntimeError("NCCL call failed on purpose")
        return comm.allReduce(*args)

    def record_abort(comm, rank):
        aborted.append(rank)
        comm.abort()

    clique.comms = [
        _Wrapped(c, r, allReduce=fail_on_rank_1, abort=record_abort) for r, c in enumerate(clique.comms)
    ]
    with pytest.raises(td.errors.UnavailableError, match=r"GPU:0, GPU:1 failed: NCCL call failed on purpose"):
        strategy.run(_all_reduce_step)
    assert sorted(aborted) == [0, 1] and key not in ops._cliques
    for part in strategy.experimental_local_results(strategy.run(_all_reduce_step)):  # new communicators
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(part), [3.0] * 3)


@pytest.mark.gpus(2)
def test_a_failed_group_end_aborts_the_communicators_too():
    # N5: an NcclError from groupEnd() skipped the abort and left broken communicators cached.
    ops = td.distribute.NcclAllReduce(num_packs=0)
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=ops)
    strategy.run(_all_reduce_step)
    key, clique = _only_clique(ops)
    nccl = cupy_backend.nccl()
    real_group_end = nccl.groupEnd

    def failing_group_end():
        real_group_end()
        raise nccl.NcclError("NCCL_ERROR_UNHANDLED_CUDA_ERROR", "failed on purpose at groupEnd")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nccl, "groupEnd", failing_group_end)
        with pytest.raises(td.errors.UnavailableError, match="failed on purpose at groupEnd") as raised:
            strategy.run(_all_reduce_step)
    assert raised.value.devices == (0, 1) and clique.broken and key not in ops._cliques
    assert all(comm._aborted for comm in clique.comms) if gpu_module.simulated() else True
    for part in strategy.experimental_local_results(strategy.run(_all_reduce_step)):
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(part), [3.0] * 3)


@pytest.mark.gpus(2)
def test_an_asynchronous_nccl_error_is_raised_at_the_next_collective_and_recovers():
    # N5: errors NCCL reports while running (check_async_error) were never looked at.
    ops = td.distribute.NcclAllReduce(num_packs=0)
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=ops)
    strategy.run(_all_reduce_step)
    key, clique = _only_clique(ops)

    def report_error(comm, rank):
        if rank == 1:
            raise cupy_backend.nccl().NcclError("NCCL_ERROR_REMOTE_ERROR", "link down on purpose")

    clique.comms = [_Wrapped(c, r, check_async_error=report_error) for r, c in enumerate(clique.comms)]
    with pytest.raises(td.errors.UnavailableError, match=r"asynchronous error on GPU:1.*link down on purpose"):
        strategy.run(_all_reduce_step)
    assert clique.broken and key not in ops._cliques
    for part in strategy.experimental_local_results(strategy.run(_all_reduce_step)):
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(part), [3.0] * 3)


@pytest.mark.gpus(2)
def test_nccl_communicators_are_made_in_a_group_from_one_unique_id_not_with_init_all(monkeypatch):
    # N7: cupy's initAll calls ncclCommInitAll holding the GIL, freezing every Python thread
    # while the communicators are set up; ranks made in a group release it.
    nccl = cupy_backend.nccl()
    calls = []
    real_communicator = nccl.NcclCommunicator

    class Recording:
        def __new__(cls, ndev, commId, rank):  # noqa: N803  (cupy's name)
            calls.append(("rank", rank, cupy_backend.xp.cuda.runtime.getDevice(), type(commId).__name__))
            return real_communicator(ndev, commId, rank)

        @staticmethod
        def initAll(devices):  # noqa: N802
            raise AssertionError("initAll holds the GIL while NCCL sets up")

    monkeypatch.setattr(nccl, "NcclCommunicator", Recording)
    for name in ("groupStart", "groupEnd"):
        real = getattr(nccl, name)
        monkeypatch.setattr(nccl, name, lambda real=real, name=name: (calls.append((name,)), real())[1])
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=td.distribute.NcclAllReduce())
    strategy.run(_all_reduce_step)
    made = type(nccl.get_unique_id()).__name__
    assert calls[:4] == [("groupStart",), ("rank", 0, 0, made), ("rank", 1, 1, made), ("groupEnd",)]


@pytest.mark.gpus(2)
def test_nccl_launches_hold_a_lock_per_gpu_shared_by_every_strategy():
    # N6: two strategies over the same GPUs, used from two threads, drove their communicators at once.
    from towerdist._src.cross_device_ops import nccl_cliques

    held = []
    strategies = []
    for _ in range(2):
        ops = td.distribute.NcclAllReduce(num_packs=0)
        strategies.append(td.distribute.MirroredStrategy(gpus(2), cross_device_ops=ops))
        strategies[-1].run(_all_reduce_step)
        _, clique = _only_clique(ops)

        def record_locks(comm, rank, *args):
            held.append(tuple(nccl_cliques._gpu_locks[d].locked() for d in (0, 1)))
            return comm.allReduce(*args)

        clique.comms = [_Wrapped(c, r, allReduce=record_locks) for r, c in enumerate(clique.comms)]
    for strategy in strategies:
        strategy.run(_all_reduce_step)
    assert held == [(True, True)] * 4


@pytest.mark.gpus(2)
@pytest.mark.parametrize("ops", ["nccl", "hierarchical", "one_device"])
def test_means_axis_reductions_and_aggregated_variables_across_gpus(ops):
    # Defect 1: MEAN's division, reduce(axis=...) and aggregated writes run on each array's own GPU.
    cross_device_ops = {"nccl": td.distribute.NcclAllReduce, "hierarchical": td.distribute.HierarchicalCopyAllReduce,
                        "one_device": td.distribute.ReductionToOneDevice}[ops]()
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=cross_device_ops)

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        value = td.ones([4]) * td.cast(rid + 1, td.float32)
        return td.distribute.get_replica_context().all_reduce("mean", [value, td.cast(value, td.int32)])

    for device, (mean, int_mean) in enumerate(strategy.experimental_local_results(strategy.run(step))):
        assert mean.device.id == int_mean.device.id == device and int_mean.dtype == np.float64
        np.testing.assert_array_equal(cupy_backend.xp.asnumpy(mean), [1.5] * 4)
    rows = strategy.run(lambda: td.ones([2 + td.distribute.get_replica_context().replica_id_in_sync_group]))
    assert float(np.asarray(strategy.reduce("mean", rows, axis=0))) == 1.0
    assert float(np.asarray(strategy.reduce("sum", rows, axis=0))) == 5.0
    with strategy.scope():
        v = td.Variable(np.zeros(3, np.float32), aggregation=td.VariableAggregation.MEAN)
        counter = td.Variable(0.0, synchronization=td.VariableSynchronization.ON_READ,
                              aggregation=td.VariableAggregation.SUM)
    strategy.run(lambda: (v.assign_add(td.ones([3])), counter.assign_add(td.constant(2.0))))
    assert [c.value().device.id for c in v.values] == [0, 1]
    np.testing.assert_array_equal(v.numpy(), [1.0] * 3)
    with strategy.scope():
        assert float(np.asarray(counter.read_value())) == 4.0


@pytest.mark.gpus(2)
def test_central_storage_hands_gpu_replicas_their_own_copy_of_the_variables():
    # Defect 5: CentralStorage's aggregating variables handed host arrays to GPU replicas.
    strategy = td.distribute.experimental.CentralStorageStrategy(compute_devices=gpus(2), parameter_device="CPU:0")
    with strategy.scope():
        v = td.Variable(np.ones(3, np.float32))
        optimizer = td.optimizers.SGD(0.1)

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        doubled = v * 2.0
        optimizer.apply_gradients([(td.ones([3]) * td.cast(rid + 1, td.float32), v)])
        return doubled

    doubled = strategy.experimental_local_results(strategy.run(step))
    assert [d.device.id for d in doubled] == [0, 1]
    np.testing.assert_allclose(v.numpy(), [1.0 - 0.1 * 3] * 3, rtol=1e-6)


@pytest.mark.gpus(2)
def test_nccl_communicators_are_destroyed_with_their_cross_device_ops():
    # Defect 9: communicators were never destroyed explicitly.
    import gc

    ops = td.distribute.NcclAllReduce()
    strategy = td.distribute.MirroredStrategy(gpus(2), cross_device_ops=ops)
    strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", td.ones([2])))
    destroyed = []

    def record_destroy(comm, rank):
        destroyed.append(rank)
        comm.destroy()

    _, clique = _only_clique(ops)
    clique.comms = [_Wrapped(c, r, destroy=record_destroy) for r, c in enumerate(clique.comms)]
    del strategy, ops, clique
    gc.collect()
    assert sorted(destroyed) == [0, 1]


@pytest.mark.gpus(2)
def test_communicators_with_a_collective_still_running_are_aborted_not_destroyed():
    # N5: the finalizer's ncclCommDestroy waits for pending work (it could block at exit).
    from towerdist._src.cross_device_ops.nccl_cliques import Clique

    class Pending:
        done = False

    calls = []
    clique = Clique.__new__(Clique)
    clique.comms = [_Wrapped(None, r, abort=lambda c, r: calls.append(("abort", r)),
                             destroy=lambda c, r: calls.append(("destroy", r))) for r in range(2)]  # fmt: skip
    clique.last_done = [Pending(), None]
    clique.close()
    assert calls == [("abort", 0), ("destroy", 1)]


@pytest.mark.gpus(1)
def test_the_gpu_backend_refuses_cpu_devices():
    # Defect 5: a cupy input under a CPU device scope was copied to the GPU with the CPU's index.
    with pytest.raises(ValueError, match="not a GPU"):
        cupy_backend.asarray(np.ones(2), device=device_lib.parse("CPU:0"))


@pytest.mark.gpus(2)
def test_results_read_from_the_main_thread_are_computed_on_their_gpu():
    # Kernels reading a GPU-1 array run on GPU 1, whichever GPU the calling thread has current.
    strategy = td.distribute.OneDeviceStrategy("GPU:1")
    with strategy.scope():
        mean = td.metrics.Mean()
    strategy.run(lambda: mean.update_state(td.ones([3])))
    assert float(np.asarray(mean.result().get())) == 1.0
    with td.device("GPU:1"):
        losses = td.ones([4])
    assert float(np.asarray(td.nn.compute_average_loss(losses, global_batch_size=8).get())) == 0.5


@pytest.mark.gpus(1)
def test_a_gpu_and_a_cpu_replica_all_reduce_one_array():
    strategy = td.distribute.MirroredStrategy(["GPU:0", "CPU:0"])
    result = strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", td.ones([2])))
    for part in strategy.experimental_local_results(result):
        np.testing.assert_array_equal(np.asarray(part.get() if cupy_backend.owns(part) else part), [2.0, 2.0])


@pytest.mark.gpus(1)
def test_gpu_arrays_combine_with_variables_on_either_side():
    # cupy hands an operator to the right operand only through __array_ufunc__ (no __array_priority__).
    strategy = td.distribute.OneDeviceStrategy("GPU:0")
    with strategy.scope():
        v = td.Variable(np.full(2, 3.0, np.float32))
        w = td.Variable(np.ones((2, 2), np.float32))
    left, matmul, right = strategy.run(lambda: (td.ones([2]) * v, td.ones([2]) @ w, v * 2.0))
    assert [cupy_backend.xp.asnumpy(x).tolist() for x in (left, matmul, right)] == [[3.0, 3.0], [2.0, 2.0], [6.0, 6.0]]
