"""Device configuration (``tf.config``): physical and logical devices, threads per operation, replica timeouts, sequential replicas."""

from towerdist._src.config import LogicalDevice as LogicalDevice
from towerdist._src.config import LogicalDeviceConfiguration as LogicalDeviceConfiguration
from towerdist._src.config import PhysicalDevice as PhysicalDevice
from towerdist._src.config import get_logical_device_configuration as get_logical_device_configuration
from towerdist._src.config import list_logical_devices as list_logical_devices
from towerdist._src.config import list_physical_devices as list_physical_devices
from towerdist._src.config import set_logical_device_configuration as set_logical_device_configuration
from towerdist._src.replica_timeouts import get_replica_timeouts as get_replica_timeouts
from towerdist._src.replica_timeouts import set_replica_timeouts as set_replica_timeouts
from towerdist._src.strategies.replica_threads import replicas_run_sequentially as replicas_run_sequentially
from towerdist._src.strategies.replica_threads import run_replicas_sequentially as run_replicas_sequentially
from towerdist.config import threading as threading

__all__ = [
    "LogicalDevice",
    "LogicalDeviceConfiguration",
    "PhysicalDevice",
    "get_logical_device_configuration",
    "get_replica_timeouts",
    "list_logical_devices",
    "list_physical_devices",
    "replicas_run_sequentially",
    "run_replicas_sequentially",
    "set_logical_device_configuration",
    "set_replica_timeouts",
    "threading",
]
