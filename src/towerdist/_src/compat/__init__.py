"""The TF 1.x tower dialect (``towerdist.compat.v1``, ``towerdist.contrib.distribute``)."""
