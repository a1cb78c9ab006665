"""Tests that user code blocked for good inside a pipeline never keeps the process alive.

Each case runs a script in a subprocess whose pipeline blocks forever in user code (a generator
or a ``map`` function waiting on an event nobody sets) on one of the pipeline's background
threads; the script then returns from its main thread, and the process must exit at once with
status 0. (``concurrent.futures`` joins its pool threads at exit, which would hang here.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
EXIT_SECONDS = 30.0  # far above the ~1 s the scripts take; a hang is what this bounds

PRELUDE = """
import threading
import towerdist as td
from towerdist._src.data import interleave, mapping

never = threading.Event()  # never set: user code waiting on it is blocked for good
started = threading.Event()  # set when user code starts waiting on it
int64 = td.TensorSpec((), td.int64)

def block():
    started.set()
    never.wait()

def gen():
    yield 1
    block()
    yield 2

def blocked_generator():
    return td.data.Dataset.from_generator(gen, output_signature=int64)
"""

# Each pipeline gives its first element, then a background thread blocks in user code.
PIPELINES = {
    "map": "td.data.Dataset.range(10).map(lambda x: block() if x == 1 else x + 1, num_parallel_calls=2)",
    "interleave": (
        "td.data.Dataset.range(2).interleave(lambda i: blocked_generator(), cycle_length=2, num_parallel_calls=2)"
    ),
    "prefetch": "blocked_generator().prefetch(2)",
}


def run_script(body: str) -> subprocess.CompletedProcess[str]:
    """Runs ``PRELUDE`` + ``body`` in a new interpreter; raises ``TimeoutExpired`` if it does not exit in time."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    script = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=EXIT_SECONDS, env=env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_the_process_exits_while_a_pipeline_thread_is_blocked_in_user_code(pipeline):
    result = run_script(
        f"""
        iterator = iter({PIPELINES[pipeline]})
        print(int(next(iterator)), flush=True)
        assert started.wait(timeout=30), "the pipeline never reached the blocking call"
        print("main returns", flush=True)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "main", "returns"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pipeline", ["map", "interleave"])
def test_closing_an_iterator_blocked_in_user_code_warns_and_the_process_exits(pipeline):
    # Closing waits a bounded time (shortened here) for the blocked call, warns, and returns.
    result = run_script(
        f"""
        import warnings
        warnings.simplefilter("always")
        mapping._STOP_SECONDS = interleave._STOP_SECONDS = 0.2
        iterator = iter({PIPELINES[pipeline]})
        next(iterator)
        assert started.wait(timeout=30), "the pipeline never reached the blocking call"
        iterator.close()
        print("closed", flush=True)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["closed"]
    assert "ResourceWarning" in result.stderr and "did not stop within 0.2 s" in result.stderr


# A user function busy inside C++ code that calls back into Python (optree's tree_map) when the
# interpreter exits: a daemon thread ended there aborts the process ("terminate called without
# an active exception"), so exit waits for it to finish its element.
BUSY_PIPELINES = {
    "map": "td.data.Dataset.range(100).map(busy_in_cpp, num_parallel_calls=2)",
    "interleave": (
        "td.data.Dataset.range(4).interleave(lambda i: td.data.Dataset.range(100).map(busy_in_cpp), cycle_length=2, "
        "num_parallel_calls=2)"
    ),
    "prefetch": "td.data.Dataset.range(100).map(busy_in_cpp).prefetch(3)",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pipeline", sorted(BUSY_PIPELINES))
def test_the_process_exits_cleanly_while_a_pipeline_thread_is_busy_in_cpp_code(pipeline):
    result = run_script(
        f"""
        import optree
        tree = {{str(i): (i, [i, i]) for i in range(20000)}}

        def busy_in_cpp(x):
            for _ in range(10):
                optree.tree_map(lambda v: v + 1, tree)
            return x

        iterator = iter({BUSY_PIPELINES[pipeline]})
        next(iterator)
        print("main returns", flush=True)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["main", "returns"]


@pytest.mark.timeout(120)
def test_at_exit_a_prefetch_thread_finishes_its_element_not_its_buffer(tmp_path):
    # Exit waited for the producer to fill its whole buffer (here up to 500 elements of 20 ms of
    # CPU each, until the 10 s bound); it must stop after the element it is making. The script
    # marks the start of exit ("|", from an atexit hook that runs before towerdist's) and each
    # element made ("x"): after the mark, only the element under way may be finished.
    made = tmp_path / "made"
    result = run_script(
        f"""
        import atexit, time
        def make(x):
            end = time.thread_time() + 0.02  # 20 ms of CPU: the thread counts as working, not blocked
            while time.thread_time() < end:
                pass
            with open({str(made)!r}, "a") as f:
                f.write("x")
            return x
        iterator = iter(td.data.Dataset.range(10**6).map(make).prefetch(500))
        print(int(next(iterator)), flush=True)
        atexit.register(lambda: open({str(made)!r}, "a").write("|"))  # runs first: registered last
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0"]
    before, _, after = made.read_text().partition("|")
    assert len(before) >= 1 and len(after) <= 2, (len(before), len(after))
