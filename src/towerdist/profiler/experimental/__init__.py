"""``tf.profiler.experimental``: record a timeline of ``strategy.run`` steps.

``start(logdir)`` begins recording, ``stop()`` writes a Chrome trace-event file
``<logdir>/<host>_<pid>[.rank<r>].trace.json`` (open it in Perfetto), and ``Trace(name)``
marks a span of your own::

    import towerdist as tf

    tf.profiler.experimental.start("logs")
    with tf.profiler.experimental.Trace("train", step_num=0):
        strategy.run(step_fn)
    tf.profiler.experimental.stop()

Each replica thread gets a track (``replica i (device)``), the calling thread the track
``main``; the events are described in the docs' *Profiler* page. Recording is off by default
and costs one flag check per instrumented place while off.
"""

from towerdist._src.profiler import Trace as Trace
from towerdist._src.profiler import start as start
from towerdist._src.profiler import stop as stop

__all__ = ["Trace", "start", "stop"]
