"""How GPU work is ordered: by CUDA events, with the host waiting only where it reads.

These tests read the simulator's counters and stream-ordering checks, so they run on
simulated GPUs only (``.ci/run`` runs them on 2 and 3 simulated GPUs, with the legacy null
stream and with a stream per thread); on real GPUs they skip. They are the contract of
DESIGN 11's "at most 2 host-blocking synchronisations per GPU per training step".
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

import towerdist as td
from towerdist._src.backend import cupy_backend
from towerdist.testing import simulated_gpus_enabled

pytestmark = pytest.mark.skipif(
    not simulated_gpus_enabled(),
    reason="reads the simulated GPUs' counters: run with TOWERDIST_SIMULATE_GPUS=2 (or 3)",
)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))


def stats(reset: bool = False):
    from towerdist.testing import simulated_gpu_stats

    return simulated_gpu_stats(reset=reset)


def every_gpu() -> list[str]:
    return [d.name for d in td.config.list_logical_devices("GPU")]


def digits_step(strategy, batch):
    import train_digits

    with strategy.scope():
        model = train_digits.MLP(seed=0)
        optimizer = td.optimizers.Adam(4e-3)
        loss_metric = td.metrics.Mean("loss")
        accuracy = td.metrics.SparseCategoricalAccuracy("accuracy")

    def step(x, y):
        logits, inputs = model.forward(x)
        losses, dlogits = train_digits.softmax_cross_entropy(logits, y)
        loss = td.nn.compute_average_loss(losses, global_batch_size=batch)
        optimizer.apply_gradients(zip(model.gradients(inputs, dlogits / batch), model.parameters))
        loss_metric.update_state(losses)
        accuracy.update_state(y, logits)
        return loss

    return step, model, loss_metric


def test_a_digits_training_step_makes_at_most_two_host_syncs_per_gpu():
    # Before the event design: 13 per GPU per step (device-wide syncs at every hand-off,
    # before and after each NCCL pack, in every contiguous copy).
    strategy = td.distribute.MirroredStrategy(every_gpu())
    batch = 512
    step, model, loss_metric = digits_step(strategy, batch)
    rng = np.random.default_rng(0)
    data = strategy.experimental_distribute_dataset(
        td.data.Dataset.from_tensor_slices((rng.random((2048, 64), np.float32), rng.integers(0, 10, 2048)))
        .repeat()
        .batch(batch, drop_remainder=True)
    )
    iterator = iter(data)
    strategy.run(step, args=next(iterator))  # variables and slots created, communicators made
    stats(reset=True)
    steps = 4
    for _ in range(steps):
        strategy.run(step, args=next(iterator))
    counted = stats()
    gpus = len(every_gpu())
    per_step = {gpu: counted["host_syncs"].get(gpu, 0) / steps for gpu in range(gpus)}
    assert max(per_step.values()) <= 2, (per_step, counted["host_sync_sites"])
    # The training still trains: reading the loss is the host's (one counted read per GPU it reads).
    assert np.isfinite(float(loss_metric.result()))
    first, second = (cupy_backend.xp.asnumpy(c.value()) for c in model.parameters[0].values[:2])
    np.testing.assert_array_equal(first, second)


def test_reading_a_result_on_the_host_is_where_the_host_waits():
    strategy = td.distribute.MirroredStrategy(every_gpu())
    result = strategy.run(lambda: td.distribute.get_replica_context().all_reduce("sum", td.ones([4])))
    stats(reset=True)
    value = cupy_backend.xp.asnumpy(strategy.experimental_local_results(result)[1])
    counted = stats()
    assert value.tolist() == [float(len(every_gpu()))] * 4
    assert counted["host_syncs_by_call"] == {"cupy.asnumpy": 1}
    assert {gpu: n for gpu, n in counted["host_syncs"].items() if n} == {1: 1}


def test_input_pieces_are_copied_on_a_stream_of_their_own_and_handed_out_ordered():
    from towerdist._src.backend.simulated.cuda import UnorderedAccessError
    from towerdist._src.device import DeviceSpec
    from towerdist._src.input.device_copies import DeviceCopier

    cp = cupy_backend.xp
    devices = [DeviceSpec(device_type="GPU", device_index=i) for i in range(2)]
    copier = DeviceCopier()
    placed = copier.place([np.arange(3.0), np.arange(3.0)], devices, object())
    with cp.cuda.Device(1), pytest.raises(UnorderedAccessError, match="unordered read"):
        cp.sum(placed.pieces[1])  # copied on the copy stream: not yet ordered before this thread's stream
    pieces = copier.place([np.arange(3.0), np.arange(3.0)], devices, object()).hand_out()
    with cp.cuda.Device(1):
        assert float(cp.sum(pieces[1])) == 3.0
    assert [p.device.id for p in pieces] == [0, 1]


def test_nccl_runs_on_its_own_streams_and_the_callers_stream_follows():
    # N3: the per-thread default stream was handed to initAll communicators; the simulator
    # refuses it, and towerdist's own streams are used instead.
    ops = td.distribute.NcclAllReduce(num_packs=0)
    strategy = td.distribute.MirroredStrategy(every_gpu()[:2], cross_device_ops=ops)

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        return td.distribute.get_replica_context().all_reduce("sum", td.ones([2]) * td.cast(rid + 1, td.float32))

    result = strategy.run(step)
    ((_, clique),) = ops._cliques.items()
    assert all(stream.ptr not in (0, 1, 2) for stream in clique.streams)
    assert [cupy_backend.xp.asnumpy(v).tolist() for v in strategy.experimental_local_results(result)] == [[3.0, 3.0]] * 2


# With a stream per thread (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1, a mode .ci/run runs these
# tests in) the hand-offs of a step must order every GPU, not only each replica's own: the
# simulator raises on an unordered read, and real GPUs would read stale data.


def test_a_callers_argument_on_another_gpu_is_ordered_before_the_replica_that_copies_it():
    strategy = td.distribute.MirroredStrategy(every_gpu()[:2])
    with td.device("GPU:0"):
        made = td.ones([3]) * 2.0  # on the caller's stream of GPU 0

    def step(x):
        return td.identity(x)  # replica 1 copies it to GPU 1

    copies = strategy.experimental_local_results(strategy.run(step, args=(made,)))
    assert [c.device.id for c in copies] == [0, 1]
    assert [cupy_backend.xp.asnumpy(c).tolist() for c in copies] == [[2.0] * 3] * 2


def test_a_merge_result_on_another_gpu_is_ordered_before_the_replicas_that_read_it():
    # Run as a TF 1.x sequential step (replica 0, then replica 1) so that replica 1 settles the
    # round: its total lands on GPU 1 on its stream, and replica 0 (the caller) then copies it.
    strategy = td.distribute.MirroredStrategy(every_gpu()[:2])

    def merge(strategy, value):
        return strategy.extended.reduce_to("sum", value, destinations="GPU:1")

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        total = td.distribute.get_replica_context().merge_call(merge, args=(td.ones([2]) * td.cast(rid + 1, td.float32),))
        return td.identity(total)  # each replica copies the GPU-1 total to its own GPU

    results = strategy.extended._call_for_each_replica(step, (), {}, sequential=True)
    assert [r.device.id for r in strategy.experimental_local_results(results)] == [0, 1]
    assert [cupy_backend.xp.asnumpy(r).tolist() for r in strategy.experimental_local_results(results)] == [[3.0, 3.0]] * 2


def test_a_replicas_work_on_another_gpu_is_ordered_before_the_caller_reads_it():
    strategy = td.distribute.MirroredStrategy(every_gpu()[:2])

    def step():
        rid = td.distribute.get_replica_context().replica_id_in_sync_group
        with td.device("GPU:0"):  # replica 1 launches on GPU 0, on its own stream there
            return td.ones([2]) * td.cast(rid + 10, td.float32)

    results = strategy.experimental_local_results(strategy.run(step))
    assert [r.device.id for r in results] == [0, 0]
    assert [cupy_backend.xp.asnumpy(r).tolist() for r in results] == [[10.0, 10.0], [11.0, 11.0]]


@pytest.mark.timeout(60)
def test_a_batch_taken_on_another_thread_is_ordered_before_the_step_that_uses_it():
    import threading

    strategy = td.distribute.MirroredStrategy(every_gpu()[:2])
    iterator = iter(strategy.experimental_distribute_dataset(td.data.Dataset.from_tensor_slices(np.arange(8.0)).batch(4)))
    taken = []
    taker = threading.Thread(target=lambda: taken.append(next(iterator)))
    taker.start()
    taker.join(timeout=30)
    assert not taker.is_alive() and len(taken) == 1
    doubled = strategy.experimental_local_results(strategy.run(lambda x: x * 2.0, args=(taken[0],)))
    assert [cupy_backend.xp.asnumpy(d).tolist() for d in doubled] == [[0.0, 2.0], [4.0, 6.0]]


def test_arrays_kept_for_a_cross_gpu_copy_are_let_go_at_the_end_of_the_step():
    # They were held until the next keep_alive call, possibly for ever (a model moved to
    # another GPU stayed resident on the first).
    from towerdist._src.backend import cupy_streams

    class Later:
        """An event still running when first asked (simulated events complete at once)."""

        def __init__(self) -> None:
            self.asked = 0

        @property
        def done(self) -> bool:
            self.asked += 1
            return self.asked > 1

    real_keep_alive = cupy_streams.keep_alive
    events = []

    def keep_alive(event, arrays):
        events.append(Later())
        real_keep_alive(events[-1], arrays)

    strategy = td.distribute.MirroredStrategy(every_gpu()[:2])
    with td.device("GPU:0"):
        source = td.ones([1024])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cupy_streams, "keep_alive", keep_alive)
        strategy.run(lambda x: td.identity(x), args=(source,))  # replica 1 copies it from GPU 0
    assert len(events) == 1 and events[0].asked >= 2  # asked when added (running), then at the step's end
    assert len(cupy_streams._held._entries) == 0


def test_a_cuda_error_while_a_replica_leaves_is_the_steps_error(monkeypatch):
    # It killed the replica thread; run raised "replica threads ended without finishing".
    import threading

    from towerdist._src.backend import cupy_streams

    strategy = td.distribute.MirroredStrategy(every_gpu()[:2])
    real_mark = cupy_streams.mark

    def mark(device_ids, own=None):
        if threading.current_thread().name == "towerdist-replica-1":
            raise RuntimeError("cudaErrorIllegalAddress (staged)")
        return real_mark(device_ids, own)

    monkeypatch.setattr(cupy_streams, "mark", mark)
    with pytest.raises(RuntimeError, match="staged") as raised:
        strategy.run(lambda: td.ones([2]))
    assert any("replica 1" in note for note in getattr(raised.value, "__notes__", []))
    monkeypatch.setattr(cupy_streams, "mark", real_mark)
    assert len(strategy.experimental_local_results(strategy.run(lambda: td.ones([2])))) == 2
