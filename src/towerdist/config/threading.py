"""Threads of one operation (``tf.config.threading``)."""

from towerdist._src.intra_op_threads import get_intra_op_parallelism_threads as get_intra_op_parallelism_threads
from towerdist._src.intra_op_threads import set_intra_op_parallelism_threads as set_intra_op_parallelism_threads

__all__ = ["get_intra_op_parallelism_threads", "set_intra_op_parallelism_threads"]
