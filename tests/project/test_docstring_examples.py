"""Every ``>>>`` example of towerdist's docstrings prints what it shows (as jax's ``lax.psum`` example does).

The examples are collected with the standard library's ``doctest`` from every module of the
package (the public classes are defined in ``_src``, so those are the docstrings that
``help()`` and the API reference show) and run in one fresh subprocess, with a timeout,
that first splits the host CPU into 4 logical devices: the examples build
``MirroredStrategy(["CPU:0", "CPU:1"])``, and logical devices can be configured only once
per process, before any strategy exists. Each docstring runs in its module's namespace
plus ``td`` (towerdist), ``np`` (numpy) and ``strategy`` (a fresh ``MirroredStrategy``
over two logical CPUs, for the examples that use one without building it), in a scratch
working directory, and is reported as a test of its own.

A docstring whose example is a sketch (it uses the reader's model or needs an MPI
launcher) is listed in ``NOT_RUN`` with the reason, and reported as a skip. The public
collectives must each have an example that runs (``COLLECTIVES``).

Run as a script (``python test_docstring_examples.py OUT.json``), this module is the
child process: it runs the examples and writes each docstring's outcome to ``OUT.json``.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import json
import os
import pathlib
import pkgutil
import subprocess
import sys
import textwrap
from collections.abc import Callable

import numpy as np
import pytest

import towerdist

TIMEOUT = 120  # seconds for all the examples; they run in a few
pytestmark = pytest.mark.timeout(TIMEOUT + 30)

# The examples that do not run here, by docstring, and why.
NOT_RUN = {
    "towerdist._src.checkpoint.checkpoint.Checkpoint": "a sketch: model, optimizer and iterator are the reader's",
    "towerdist._src.checkpoint.manager.CheckpointManager": "a sketch: ckpt is the reader's checkpoint",
    "towerdist._src.cluster_resolver.mpi.MPIClusterResolver": "its output is rank 0's under mpiexec -n 2",
    "towerdist._src.preemption.checkpoint_handler.PreemptionCheckpointHandler": (
        "a sketch: make_model, train_step, steps and iterator are the reader's"
    ),
    "towerdist._src.preemption.termination_config.TerminationConfig": "a sketch: checkpoint is the reader's",
}

# The public collectives, each of which must carry an example that runs.
COLLECTIVES: dict[str, Callable[..., object]] = {
    "ReplicaContext.all_reduce": towerdist.distribute.ReplicaContext.all_reduce,
    "ReplicaContext.all_gather": towerdist.distribute.ReplicaContext.all_gather,
    "ReplicaContext.merge_call": towerdist.distribute.ReplicaContext.merge_call,
    "Strategy.run": towerdist.distribute.Strategy.run,
    "Strategy.reduce": towerdist.distribute.Strategy.reduce,
    "Strategy.gather": towerdist.distribute.Strategy.gather,
    "Strategy.experimental_distribute_dataset": towerdist.distribute.Strategy.experimental_distribute_dataset,
}


def docstring_tests() -> dict[str, doctest.DocTest]:
    """The docstrings of towerdist that have ``>>>`` examples, by doctest name (module.qualname)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found: dict[str, doctest.DocTest] = {}
    names = ["towerdist", *(m.name for m in pkgutil.walk_packages(towerdist.__path__, "towerdist."))]
    for name in names:
        if name.rsplit(".", 1)[-1] == "__main__":
            continue  # the command line's entry point: importing it would run the command
        for test in finder.find(importlib.import_module(name)):
            if test.examples:
                found.setdefault(test.name, test)
    return found


TESTS = docstring_tests()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What running one docstring's examples gave: how many ran, how many failed, doctest's report."""

    attempted: int
    failed: int
    report: str


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Runs every example not in ``NOT_RUN`` in one child process; the outcome of each docstring."""
    scratch = tmp_path_factory.mktemp("docstring_examples")
    out = scratch / "outcomes.json"
    # The child runs elsewhere (scratch), so a relative PYTHONPATH would miss the towerdist under test.
    source_root = str(pathlib.Path(towerdist.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source_root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, __file__, str(out)], capture_output=True, text=True, timeout=TIMEOUT, cwd=scratch, env=env
    )
    assert done.returncode == 0, f"the examples' process failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return {name: Outcome(**fields) for name, fields in json.loads(out.read_text()).items()}


def _id(name: str) -> str:
    return name.removeprefix("towerdist._src.")


@pytest.mark.parametrize("name", sorted(TESTS), ids=_id)
def test_a_docstring_example_prints_what_it_shows(name: str, outcomes: dict[str, Outcome]) -> None:
    if name in NOT_RUN:
        pytest.skip(NOT_RUN[name])
    outcome = outcomes[name]
    assert outcome.failed == 0, f"{name}: {outcome.failed} of {outcome.attempted} examples failed:\n{outcome.report}"
    assert outcome.attempted == len(TESTS[name].examples), outcome.report


def test_every_example_not_listed_ran(outcomes: dict[str, Outcome]) -> None:
    assert set(outcomes) == set(TESTS) - set(NOT_RUN)


@pytest.mark.parametrize("api", COLLECTIVES)
def test_a_public_collective_has_an_example_on_two_cpus_that_runs(api: str, outcomes: dict[str, Outcome]) -> None:
    function = COLLECTIVES[api]
    name = f"{function.__module__}.{function.__qualname__}"
    assert name in TESTS, f"{api} has no >>> example in its docstring"
    assert 'MirroredStrategy(["CPU:0", "CPU:1"])' in (TESTS[name].docstring or ""), (
        f"{api}'s example builds no strategy"
    )
    assert name not in NOT_RUN
    outcome = outcomes[name]
    assert outcome.failed == 0, outcome.report
    assert outcome.attempted >= 3, f"{api}'s example has {outcome.attempted} lines to run"


def test_every_not_run_entry_names_a_docstring_with_examples() -> None:
    # An entry left behind after its example was fixed or removed would hide nothing, silently.
    stale = sorted(set(NOT_RUN) - set(TESTS))
    assert not stale, f"NOT_RUN names docstrings without >>> examples: {stale}"


def test_the_finder_sees_methods_of_private_modules_and_module_docstrings() -> None:
    # Guards the collection itself: a finder that missed a kind of docstring would pass vacuously.
    assert "towerdist._src.strategies.replica_context.ReplicaContext.all_reduce" in TESTS
    assert "towerdist._src.cluster_resolver.cluster_spec" in TESTS  # a module docstring
    assert "towerdist.compat.v1" in TESTS  # a public package's docstring


def test_a_wrong_output_fails(tmp_path: pathlib.Path) -> None:
    """The runner reports an example whose output differs from the docstring's as failed."""
    module = tmp_path / "wrong_output_example.py"
    module.write_text(
        textwrap.dedent(
            '''\
            def f():
                """Adds.

                Example:
                  >>> strategy = td.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
                  >>> strategy.num_replicas_in_sync + 1
                  4
                """
            '''
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        (test,) = doctest.DocTestFinder().find(importlib.import_module("wrong_output_example"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("wrong_output_example", None)
    outcome = run_docstring(test)
    assert (outcome.attempted, outcome.failed) == (2, 1)
    assert "Expected:\n    4\nGot:\n    3" in outcome.report


def run_docstring(test: doctest.DocTest) -> Outcome:
    """Runs one docstring's examples in its module's namespace plus ``td``, ``np`` and ``strategy``."""
    environ = dict(os.environ)  # an example may set variables (TF_CONFIG): not for the next one
    test.globs = {
        **test.globs,
        "td": towerdist,
        "np": np,
        "strategy": towerdist.distribute.MirroredStrategy(["CPU:0", "CPU:1"]),
    }
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    try:
        result = runner.run(test, out=report.append)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        test.globs.clear()
    return Outcome(result.attempted, result.failed, "".join(report))


def _child(out: str) -> int:
    """Splits the CPU into 4 logical devices, runs the examples, writes the outcomes to ``out``."""
    cpu = towerdist.config.list_physical_devices("CPU")[0]
    towerdist.config.set_logical_device_configuration(cpu, [towerdist.config.LogicalDeviceConfiguration()] * 4)
    results = {name: run_docstring(test) for name, test in TESTS.items() if name not in NOT_RUN}
    pathlib.Path(out).write_text(json.dumps({name: dataclasses.asdict(o) for name, o in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
