"""towerdist quick start: the DistributedValues examples and a merge_call, on 2 CPU replicas.

Runs the examples of TensorFlow's ``tf.distribute.DistributedValues`` documentation and
the ``merge_call`` example of TF 1.x's ``MirroredStrategy`` (written with ``run``), with
``import towerdist as tf`` and numpy arrays where TensorFlow has tensors.

The global batches of ``Dataset.from_tensor_slices([5., 6., 7., 8.]).batch(2)`` are split
across the two replicas by ``strategy.experimental_distribute_dataset``.

Run:  python examples/quickstart.py
"""

from __future__ import annotations

import towerdist as tf


def main() -> None:
    # Two logical CPU devices, configured exactly as in TensorFlow (before first use).
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    print(f"{strategy} with {strategy.num_replicas_in_sync} replicas, "
          f"cross-device ops {strategy.extended._cross_device_ops}\n")

    print("1. Distributed values from a global batch:")
    dataset = tf.data.Dataset.from_tensor_slices([5.0, 6.0, 7.0, 8.0]).batch(2)
    dataset_iterator = iter(strategy.experimental_distribute_dataset(dataset))
    distributed_values = next(dataset_iterator)
    print(repr(distributed_values), "\n")

    print("2. Returned by run:")

    @tf.function
    def replica_id():
        return tf.distribute.get_replica_context().replica_id_in_sync_group

    print(repr(strategy.run(replica_id)), "\n")

    print("3. As input into run:")

    @tf.function
    def add_one(value):
        return value + 1.0

    print(repr(strategy.run(add_one, args=(distributed_values,))), "\n")

    print("4. As input into reduce:")
    print(repr(strategy.reduce(tf.distribute.ReduceOp.SUM, distributed_values, axis=0)), "\n")

    print("5. Inspecting the per-replica values:")
    print(strategy.experimental_local_results(distributed_values), "\n")

    print("6. merge_call (TF 1.x MirroredStrategy docs, written with run):")

    def merge_fn(distribution, three_plus_replica_id):
        # Called once, in cross-replica context: sum the values of all replicas.
        return sum(distribution.experimental_local_results(three_plus_replica_id))

    def fn(three):
        replica_ctx = tf.distribute.get_replica_context()
        v = three + replica_ctx.replica_id_in_sync_group
        s = replica_ctx.merge_call(merge_fn, args=(v,))  # sum of v over all replicas
        return s + v

    with strategy.scope():
        merged_results = strategy.run(fn, args=(3,))
        print(strategy.experimental_local_results(merged_results), "\n")

    print("7. all_reduce inside run (every replica gets the sum):")

    def step():
        ctx = tf.distribute.get_replica_context()
        scale = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        return ctx.all_reduce("sum", tf.constant([1.0, 2.0]) * scale)

    print(strategy.experimental_local_results(strategy.run(step)))


if __name__ == "__main__":
    main()
