"""DESIGN section 12: every bad input in scope gives a clear error of the documented type,
and leaves the strategy usable.

Each row triggers one error on the plugin's ``mirrored_strategy`` (2 CPU replicas) and pins the exception type and the first
words of the message; the test then checks that ``run`` and ``reduce`` still work. The rows
about variables and datasets are here too (and in depth in their own tests); errors
concerning MPI are tested with that feature.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src.backend import cupy_backend

from conftest import cpus


def ctx() -> td.distribute.ReplicaContext:
    return td.distribute.get_replica_context()


def rid() -> int:
    return int(ctx().replica_id_in_sync_group)


def per_replica(s, make):
    return s.experimental_distribute_values_from_function(lambda c: make(c.replica_id_in_sync_group))


def _other_scope(s):
    with td.distribute.MirroredStrategy(cpus(2)).scope():
        s.run(lambda: None)


def _unequal_merge_calls(s):
    def fn():
        if rid() == 0:
            ctx().merge_call(lambda strategy: None)

    s.run(fn)


def _merge_call_outside(s):
    stale = s.experimental_local_results(s.run(td.distribute.get_replica_context))[0]
    with s.scope():
        stale.merge_call(lambda strategy: None)


def _three_component_per_replica(s):
    s.reduce("sum", td.distribute.PerReplica([1.0, 2.0, 3.0]), axis=None)


def _variable(s, initial_value=1.0, **kwargs):
    with s.scope():
        return td.Variable(initial_value, **kwargs)


def _variable_of_another_strategy(s):
    v = _variable(td.distribute.MirroredStrategy(cpus(2)), aggregation=td.VariableAggregation.SUM)
    s.run(lambda: v.assign_add(td.constant(1.0)))


def _variable_in_a_scope_inside_the_default_scope(s):
    with td.distribute.get_strategy().scope(), s.scope():
        td.Variable(1.0)


def _scope_exited_on_another_thread(s):
    scope = s.scope()
    scope.__enter__()
    failures: list[BaseException] = []
    try:
        thread = threading.Thread(target=lambda: _record(failures, lambda: scope.__exit__(None, None, None)))
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive()
    finally:
        scope.__exit__(None, None, None)
    raise failures[0]


def _record(failures: list[BaseException], fn: Callable[[], Any]) -> None:
    try:
        fn()
    except BaseException as error:  # re-raised on the test's thread
        failures.append(error)


def _deepcopy_under_another_strategy(s):
    v = _variable(s)
    with td.distribute.MirroredStrategy(cpus(2)).scope():
        copy.deepcopy(v)


def _central_storage_none_write(s):
    central = td.distribute.experimental.CentralStorageStrategy(compute_devices=cpus(2), parameter_device="CPU:0")
    v = _variable(central)
    central.run(lambda: v.assign(td.constant(2.0)))


def _all_reduce_structure_mismatch(s):
    s.run(lambda: ctx().all_reduce("sum", [1.0] * (rid() + 1)))


def _all_reduce_shape_mismatch(s):
    s.run(lambda: ctx().all_reduce("sum", {"logits": np.ones(3 + rid())}))


def _complex_gradient(s):
    w, optimizer = _model(s)
    s.run(lambda: optimizer.apply_gradients([(np.ones(3, np.complex64), w)]))


def _sync_on_read_float_into_int(s):
    with s.scope():
        v = td.Variable(0, synchronization=td.VariableSynchronization.ON_READ, aggregation=td.VariableAggregation.SUM)
    v.assign(np.array(3.7))


def _next_inside_replica_fn(s):
    iterator = iter(s.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2)))
    s.run(lambda: next(iterator))


def _scalar_dataset(s):
    next(iter(s.experimental_distribute_dataset(td.data.Dataset.range(4))))


def _indivisible_global_batch(s):
    s.distribute_datasets_from_function(lambda c: td.data.Dataset.range(10).batch(c.get_per_replica_batch_size(5)))


def _sync_on_read_sum_assign_add(s):
    v = _variable(s, synchronization=td.VariableSynchronization.ON_READ, aggregation=td.VariableAggregation.SUM)
    v.assign_add(1.0)


def _model(s):
    with s.scope():
        return td.Variable(np.zeros(3, np.float32), name="w"), td.optimizers.SGD(0.1)


def _gradient_of_the_wrong_shape(s):
    w, optimizer = _model(s)
    s.run(lambda: optimizer.apply_gradients([(np.ones(3 + rid(), np.float32), w)]))


def _variable_created_outside_the_scope(s):
    w = td.Variable(np.zeros(3, np.float32), name="w")
    _, optimizer = _model(s)
    s.run(lambda: optimizer.apply_gradients([(np.ones(3, np.float32), w)]))


def _no_gradients(s):
    w, optimizer = _model(s)
    s.run(lambda: optimizer.apply_gradients([(None, w)]))


def _corrupt_checkpoint(s, tmp):
    w, _ = _model(s)
    checkpoint = td.train.Checkpoint(w=w)
    path = checkpoint.write(str(tmp / "ckpt"))
    data = tmp / "ckpt.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-10])
    checkpoint.restore(path)


def _checkpoint_shape_mismatch(s, tmp):
    w, _ = _model(s)
    path = td.train.Checkpoint(w=w).write(str(tmp / "ckpt"))
    with s.scope():
        other = td.Variable(np.zeros(4, np.float32))
    td.train.Checkpoint(w=other).restore(path)


def _save_inside_run(s, tmp):
    w, _ = _model(s)
    checkpoint = td.train.Checkpoint(w=w)
    s.run(lambda: checkpoint.save(str(tmp / "ckpt")))


def _flipped_index(s, tmp):
    w, _ = _model(s)
    path = td.train.Checkpoint(w=w).write(str(tmp / "ckpt"))
    index = tmp / "ckpt.index"
    text = index.read_text()
    swapped = text.replace('"member": "a0"', "@").replace('"member": "a1"', '"member": "a0"').replace("@", '"member": "a1"')
    assert swapped != text  # which member holds which variable is swapped
    index.write_text(swapped)
    td.train.Checkpoint(w=w).restore(path)


def _iterator_of_another_pipeline(s, tmp):
    iterator = iter(s.experimental_distribute_dataset(td.data.Dataset.range(8).shuffle(4, seed=1).batch(2)))
    s.run(lambda x: x, args=(next(iterator),))
    path = td.train.Checkpoint(data=iterator).write(str(tmp / "ckpt"))
    td.train.Checkpoint(data=iter(s.experimental_distribute_dataset(td.data.Dataset.range(8).batch(2)))).restore(path)


def _generator_saved_mid_pass(s, tmp):
    dataset = td.data.Dataset.from_generator(lambda: iter(range(4)), output_signature=td.TensorSpec((), td.int64))
    iterator = iter(dataset)
    next(iterator)
    td.train.Checkpoint(data=iterator).write(str(tmp / "ckpt"))


def _per_replica_input_onto_other_replicas(s, tmp):
    options = td.distribute.InputOptions(experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA)
    iterator = iter(s.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(8).batch(2), options))
    s.run(lambda x: x, args=(next(iterator),))
    path = td.train.Checkpoint(data=iterator).write(str(tmp / "ckpt"))
    four = td.distribute.MirroredStrategy(cpus(4))
    dataset = four.distribute_datasets_from_function(lambda ctx: td.data.Dataset.range(8).batch(2), options)
    td.train.Checkpoint(data=iter(dataset)).restore(path)


def _object_dtype_save(s, tmp):
    td.train.Checkpoint(v=td.Variable(np.array([1, None], dtype=object))).save(str(tmp / "ckpt"))


def _write_into_a_cached_element(s):
    dataset = td.data.Dataset.from_tensor_slices(np.zeros((4, 2), np.float32)).cache()
    for element in dataset:
        element /= 2


def _metric_sample_mismatch(s):
    with s.scope():
        accuracy = td.metrics.SparseCategoricalAccuracy()
    s.run(lambda: accuracy.update_state(np.zeros(3), np.zeros((2, 4), np.float32)))


ERRORS: list[tuple[str, Callable[[Any], Any], type[BaseException], str]] = [
    ("unknown reduce op", lambda s: s.reduce("MAX", per_replica(s, float), None), ValueError, "'MAX' is not a valid ReduceOp"),
    ("reduce op of a wrong type", lambda s: s.reduce(5, per_replica(s, float), 0), TypeError, "Expected `reduce_op` to be"),
    ("run with a wrong-size PerReplica", lambda s: s.run(lambda x: x, args=(td.distribute.PerReplica([1, 2, 3]),)),
     ValueError, r"Strategy.run\(\) got a PerReplica with 3 components"),
    ("reduce a wrong-size PerReplica", _three_component_per_replica, ValueError, r"Strategy.reduce\(\) got a PerReplica with 3"),
    ("shape mismatch across replicas", lambda s: s.reduce("sum", per_replica(s, lambda i: np.ones(i + 1)), None),
     td.errors.InvalidArgumentError, r"Reducing across replicas needs every replica's value to have the same shape"),
    ("dtype mismatch across replicas",
     lambda s: s.reduce("sum", per_replica(s, lambda i: np.ones(2, dtype=[np.float32, np.float64][i])), None),
     td.errors.InvalidArgumentError, r"Reducing across replicas needs every replica's value to have the same shape and dtype"),
    ("SUM of a non-distributed value", lambda s: s.reduce("sum", td.constant(1.0), None), ValueError, "A non-DistributedValues value"),
    ("scope of another strategy", _other_scope, td.errors.ContextError, "Mixing different strategies"),
    ("run inside run", lambda s: s.run(lambda: s.run(lambda: 1)), td.errors.ContextError, r"Strategy.run\(\) must be called in cross-replica context"),
    ("merge_call outside a replica context", _merge_call_outside, td.errors.ContextError, r"ReplicaContext.merge_call\(\) must be called in a replica context"),
    ("unequal merge_call counts", _unequal_merge_calls, td.errors.MergeCallCountError, "Some replicas made a different number of merge_call"),
    ("exception in one replica", lambda s: s.run(lambda: 1 / rid()), ZeroDivisionError, "division by zero"),
    ("exception in merge_fn", lambda s: s.run(lambda: ctx().merge_call(lambda strategy: {}["missing"])), KeyError, "missing"),
    ("args not a list or tuple", lambda s: s.run(lambda x: x, args=np.ones(2)), ValueError, "positional args must be a list or tuple"),
    ("destinations of a wrong kind", lambda s: s.extended.reduce_to("sum", per_replica(s, float), 3.5), ValueError, "destinations must be one of"),
    ("list destinations", lambda s: s.extended.reduce_to("sum", per_replica(s, float), ["/cpu:0"]), td.errors.ValidationError,
     r"StrategyExtended.reduce_to\(\) takes one destination"),
    ("a variable of another strategy", _variable_of_another_strategy, td.errors.ContextError, "Mixing different strategies"),
    ("a variable in a scope entered inside the default strategy's scope", _variable_in_a_scope_inside_the_default_scope,
     td.errors.ContextError, r"Mixing different strategies: td.Variable\(\) was called in cross-replica context"),
    ("a scope exited on another thread", _scope_exited_on_another_thread, td.errors.ContextError,
     r"MirroredStrategy\(devices=\('/cpu:0', '/cpu:1'\)\).scope\(\) was exited on thread"),
    ("all_reduce of differently structured values", _all_reduce_structure_mismatch, td.errors.InvalidArgumentError,
     r"ReplicaContext.all_reduce\(\) needs the same nested structure from every replica"),
    ("all_reduce of differently shaped values", _all_reduce_shape_mismatch, td.errors.InvalidArgumentError,
     r"ReplicaContext.all_reduce\(\) needs every replica's value to have the same shape and dtype, but at \['logits'\]"),
    ("a float assigned to an integer sync-on-read SUM variable", _sync_on_read_float_into_int, td.errors.InvalidArgumentError,
     r"SyncOnReadVariable.assign\(\) of Variable:0: cannot convert an array of dtype float64 to dtype int32"),
    ("broadcast_to of None", lambda s: s.extended.broadcast_to(None, "CPU:0"), ValueError,
     r"Attempt to convert a value \(None\) with an unsupported type"),
    ("a ragged list given to td.Variable", lambda s: _variable(s, initial_value=[[1.0], [1.0, 2.0]]), ValueError,
     "Can't convert non-rectangular Python sequence to an array"),
    ("a number assigned to a string variable", lambda s: _variable(s, initial_value="text").assign(3), TypeError,
     r"Variable.assign\(\): cannot convert an array of dtype int64 to dtype <U4: strings convert only"),
    ("deepcopy of a variable under another strategy", _deepcopy_under_another_strategy, td.errors.ContextError,
     r"Mixing different strategies: copy.deepcopy\(\)"),
    ("NONE aggregation write to a CentralStorage variable in a replica", _central_storage_none_write, ValueError,
     "You must specify an aggregation method to update a AggregatingVariable"),
    ("a replica timeout of zero", lambda s: td.config.set_replica_timeouts(0, None), ValueError,
     r"set_replica_timeouts\(\) needs warning_seconds > 0, or None \(never\)"),
    ("replica timeouts that are not numbers", lambda s: td.config.set_replica_timeouts("5", None), TypeError,
     r"set_replica_timeouts\(\) takes warning_seconds as a number of seconds"),
    ("run_replicas_sequentially given something that is not a bool",
     lambda s: td.config.run_replicas_sequentially(1), TypeError, r"run_replicas_sequentially\(\) takes a bool"),
    ("a TensorFlow name towerdist does not provide", lambda s: td.matmul, AttributeError,
     r"module 'towerdist' has no attribute 'matmul' \(tf.matmul\)\. towerdist's values are numpy"),
    ("a negative number of threads per operation",
     lambda s: td.config.threading.set_intra_op_parallelism_threads(-1), ValueError,
     r"set_intra_op_parallelism_threads\(\) needs num_threads >= 0"),
    ("a number of threads per operation that is not an int",
     lambda s: td.config.threading.set_intra_op_parallelism_threads(2.0), TypeError,
     r"set_intra_op_parallelism_threads\(\) takes the number of threads as an int"),
    ("sync-on-read SUM assign_add across replicas", _sync_on_read_sum_assign_add, ValueError,
     "SyncOnReadVariable does not support `assign_add` in cross-replica context"),
    ("NONE synchronization in a scope", lambda s: _variable(s, synchronization=td.VariableSynchronization.NONE),
     ValueError, "`NONE` variable synchronization mode is not supported"),
    ("variable creation mismatch in run", lambda s: s.run(lambda: td.Variable(1.0, name=f"v{rid()}")), RuntimeError,
     "Tried to create variable 'v1' with mismatching name"),
    ("next(iterator) inside a replica function", _next_inside_replica_fn, ValueError,
     r"next\(iterator\) should be called from outside of replica_fn"),
    ("distributing a dataset of scalars", _scalar_dataset, ValueError, "Call the `batch` method on the input Dataset"),
    ("global batch not divisible by the replicas", _indivisible_global_batch, ValueError,
     "The `global_batch_size` 5 is not divisible by `num_replicas_in_sync` 2"),
    ("PER_REPLICA input in experimental_distribute_dataset",
     lambda s: s.experimental_distribute_dataset(td.data.Dataset.range(4).batch(2), td.distribute.InputOptions(
         experimental_replication_mode=td.distribute.InputReplicationMode.PER_REPLICA)),
     NotImplementedError, "InputReplicationMode.PER_REPLICA is only supported"),
    ("an array given as a dataset", lambda s: s.experimental_distribute_dataset(np.ones(4)), TypeError,
     r"experimental_distribute_dataset\(\) takes a dataset whose elements are global batches"),
    ("gather of scalars", lambda s: s.gather(per_replica(s, float), axis=0), td.errors.InvalidArgumentError, r"Strategy.gather\(\) cannot concatenate scalars"),
    ("a gradient of the wrong shape", _gradient_of_the_wrong_shape, ValueError,
     r"SGD.apply_gradients\(\): the gradient of w:0 from replica 1 has shape \(4,\)"),
    ("a complex gradient of a real variable", _complex_gradient, td.errors.InvalidArgumentError,
     r"SGD.apply_gradients\(\): the gradient of w:0 from replica 0 has dtype complex64, but the variable has dtype float32"),
    ("a variable created outside the scope given to an optimizer", _variable_created_outside_the_scope,
     td.errors.ValidationError, r"SGD.apply_gradients\(\) got a variable created outside strategy.scope\(\): 'w'"),
    ("no gradients at all", _no_gradients, ValueError, "No gradients provided for any variable: w:0"),
    ("a metric given mismatched labels", _metric_sample_mismatch, ValueError,
     r"SparseCategoricalAccuracy.update_state\(\): y_true and y_pred must have the same number of samples"),
    ("shuffle with buffer_size 0", lambda s: td.data.Dataset.range(4).shuffle(0), td.errors.InvalidArgumentError,
     r"Dataset.shuffle\(\) buffer_size must be greater than zero or td.data.UNKNOWN_CARDINALITY"),
    ("enumerate from outside int64", lambda s: td.data.Dataset.range(4).enumerate(2**63), td.errors.InvalidArgumentError,
     r"Dataset.enumerate\(\) counts in int64"),
    ("an in-place write into a cached element", _write_into_a_cached_element, ValueError, "read-only"),
    ("compute_average_loss of a scalar", lambda s: s.run(lambda: td.nn.compute_average_loss(td.constant(1.0))),
     ValueError, "Invalid value passed for `per_example_loss`"),
]

CHECKPOINT_ERRORS: list[tuple[str, Callable[[Any, Any], Any], type[BaseException], str]] = [
    ("a truncated checkpoint", _corrupt_checkpoint, td.errors.DataLossError, "Checkpoint data file .* is truncated or corrupt"),
    ("a checkpoint of another shape", _checkpoint_shape_mismatch, ValueError, "Cannot restore .*: 'w' .* shape"),
    ("save inside strategy.run", _save_inside_run, td.errors.ContextError, r"Checkpoint.save\(\) must be called outside"),
    ("a missing checkpoint", lambda s, tmp: td.train.Checkpoint().restore(str(tmp / "nothing")), td.errors.NotFoundError,
     "Failed to find any matching files"),
    ("a changed checkpoint index", _flipped_index, td.errors.DataLossError,
     r"Checkpoint index .* is corrupt: its content does not match its index_sha256 checksum"),
    ("saving an object-dtype variable", _object_dtype_save, TypeError, r"Checkpoint cannot save .*: its dtype object cannot be"),
    ("a checkpoint path of a wrong type", lambda s, tmp: td.train.Checkpoint().save(42), TypeError,
     r"Checkpoint.save\(\) expects file_prefix to be a path"),
    ("an input iterator restored into another pipeline", _iterator_of_another_pipeline, td.errors.NotFoundError,
     r"Checkpoint.restore\(\) cannot restore the iterator: its pipeline differs from the saved one at operation 2"),
    ("a generator's iterator saved in the middle of its pass", _generator_saved_mid_pass,
     td.errors.FailedPreconditionError,
     r"Checkpoint.write\(\) cannot save the iterator: its pipeline keeps state outside itself \(Dataset.from_generator"),
    ("a per-replica input restored onto another number of replicas", _per_replica_input_onto_other_replicas,
     td.errors.FailedPreconditionError,
     r"Checkpoint.restore\(\) cannot restore the distributed iterator exactly: it was saved on 1 worker of 2 "
     r"replicas and is restored on 1 worker of 4 replicas"),
]


@pytest.mark.parametrize("name, trigger, error, first_words", ERRORS, ids=[row[0] for row in ERRORS])
def test_bad_input_raises_clearly_and_leaves_the_strategy_usable(mirrored_strategy, name, trigger, error, first_words):
    with pytest.raises(error, match=first_words):
        trigger(mirrored_strategy)
    assert not td.distribute.has_strategy()
    ids = mirrored_strategy.run(lambda: ctx().replica_id_in_sync_group)
    assert mirrored_strategy.reduce("sum", ids, axis=None) == 1


@pytest.mark.parametrize("name, trigger, error, first_words", CHECKPOINT_ERRORS, ids=[row[0] for row in CHECKPOINT_ERRORS])
def test_bad_checkpoints_raise_clearly_and_leave_the_strategy_usable(
    mirrored_strategy, tmp_path, name, trigger, error, first_words
):
    with pytest.raises(error, match=first_words):
        trigger(mirrored_strategy, tmp_path)
    assert not td.distribute.has_strategy()
    ids = mirrored_strategy.run(lambda: ctx().replica_id_in_sync_group)
    assert mirrored_strategy.reduce("sum", ids, axis=None) == 1


@pytest.mark.parametrize(
    "devices, error, first_words",
    [
        (["CPU:0", "/cpu:0"], td.errors.ValidationError, "No duplicates allowed in `devices`"),
        (["CPU:0", "CPU:99"], ValueError, "MirroredStrategy got device /cpu:99, which does not exist"),
        (["TPU:0"], ValueError, "Unsupported device type 'TPU'"),
        (["GPU:0"], ValueError, "MirroredStrategy got device /gpu:0, which does not exist"),
        (["/job:worker/task:1/device:CPU:0"], RuntimeError, "In-graph multi-worker training"),
        (["CPU:0", "/job:worker/task:1/device:CPU:0"], ValueError, "MirroredStrategy devices must all be local"),
        (["not a device"], ValueError, "Invalid device name"),
    ],
)
def test_bad_devices_are_rejected(devices, error, first_words):
    if devices == ["GPU:0"] and cupy_backend.device_count() > 0:
        pytest.skip("a GPU is present, so GPU:0 exists")
    with pytest.raises(error, match=first_words):
        td.distribute.MirroredStrategy(devices)


def test_missing_cupy_names_the_extra_to_install():
    if cupy_backend.device_count() > 0:
        pytest.skip("cupy is installed and sees a GPU")
    from towerdist._src.backend.cupy_backend import nccl_unavailable_reason

    reason = nccl_unavailable_reason()
    assert reason is not None
    assert "towerdist[cuda12]" in reason or "no CUDA GPU" in reason


def test_nccl_on_cpu_devices_names_them():
    with pytest.raises(ValueError, match="NcclAllReduce needs every device to be a GPU, but got /cpu:0, /cpu:1"):
        td.distribute.MirroredStrategy(cpus(2), cross_device_ops=td.distribute.NcclAllReduce())


def test_cupy_import_error_is_a_missing_dependency_error():
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cupy is installed")
    with pytest.raises(td.errors.MissingDependencyError, match=r"GPU devices need cupy.*towerdist\[cuda12\]"):
        cupy_backend.cupy_module()
