"""``tf.profiler``: the timeline of ``strategy.run`` steps (see ``towerdist.profiler.experimental``)."""

from towerdist.profiler import experimental as experimental

__all__ = ["experimental"]
