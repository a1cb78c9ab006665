"""The ``towerdist`` command (``python -m towerdist``): ``info`` and ``bench``.

``main.py`` parses the command line and dispatches; ``info.py`` gathers and prints what
towerdist sees on this machine; ``bench_allreduce.py`` and ``bench_run.py`` measure, with
``timing.py`` (samples taken in rotation), ``sizes.py`` (``1K:64M`` and friends),
``bench_devices.py`` (the strategy a benchmark runs on), ``mpi_launch.py`` (``--mpi``:
the same command re-launched under ``mpiexec``) and ``progress.py`` (a progress bar on
stderr for long runs).
"""
