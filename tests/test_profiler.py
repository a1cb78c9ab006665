"""The timeline (``td.profiler.experimental``): the trace-event file and its tracks and events."""

from __future__ import annotations

import errno
import json
import os
import threading
from typing import Any

import numpy as np
import pytest

import towerdist as td
from towerdist._src import profiler as profiler_lib
from towerdist.testing.pytest_plugin import mirrored_strategy_for

experimental = td.profiler.experimental


def _step() -> Any:
    ctx = td.distribute.get_replica_context()
    assert ctx is not None
    total = ctx.all_reduce("sum", td.constant(1.0))
    return ctx.merge_call(lambda strategy, value: value, args=(total,))


def _trace(logdir: str) -> dict[str, Any]:
    strategy = mirrored_strategy_for(2)
    strategy.run(_step)  # threads started before recording
    experimental.start(logdir)
    try:
        with experimental.Trace("train", step_num=3):
            strategy.run(_step)
        iterator = iter(strategy.experimental_distribute_dataset(td.data.Dataset.range(8).batch(4)))
        next(iterator)
    finally:
        path = experimental.stop()
    assert path is not None and os.path.dirname(path) == logdir
    assert path.endswith(f"_{os.getpid()}.trace.json")
    with open(path, encoding="utf-8") as file:
        document: dict[str, Any] = json.load(file)
    return document


def test_the_trace_is_valid_trace_event_json_with_the_expected_tracks_and_events(tmp_path):
    document = _trace(str(tmp_path))
    assert document["displayTimeUnit"] == "ms"
    events = document["traceEvents"]
    for event in events:
        assert {"name", "ph", "pid", "tid"} <= event.keys()
        assert event["ph"] in ("X", "M")
        assert event["pid"] == os.getpid()
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and isinstance(event["dur"], (int, float))
            assert event["ts"] >= 0 and event["dur"] >= 0
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    # The caller runs replica 0 itself: its track says so; replica 1 has a thread of its own.
    main = "main (replica 0, /cpu:0)"
    assert sorted(tracks.values()) == [main, "replica 1 (/cpu:1)"]

    complete = [e for e in events if e["ph"] == "X"]

    def on(track: str) -> list[str]:
        return [e["name"] for e in complete if tracks[e["tid"]] == track]

    for track in tracks.values():
        assert on(track).count("run: _step") == 1
    assert on(main).count("strategy.run: _step") == 1
    assert "input: next step" in on(main)
    merges = [e for e in complete if e["name"].startswith("merge_fn: ")]
    assert {e["name"] for e in merges} == {"merge_fn: ReplicaContext.all_reduce()", "merge_fn: merge_call()"}
    waits = [e for e in complete if e["name"] == "wait at merge_call"]
    assert len(waits) == 2  # one replica parks in each of the two rounds
    assert all(e["args"]["waiting_for"] for e in waits)
    (user,) = [e for e in complete if e["name"] == "train"]
    assert user["args"] == {"step_num": 3} and tracks[user["tid"]] == main
    # The user span contains the step, which contains each replica's function.
    (outer,) = [e for e in complete if e["name"] == "strategy.run: _step"]
    assert user["ts"] <= outer["ts"] and outer["ts"] + outer["dur"] <= user["ts"] + user["dur"] + 1
    for run in (e for e in complete if e["name"] == "run: _step"):
        assert outer["ts"] <= run["ts"] and run["ts"] + run["dur"] <= outer["ts"] + outer["dur"] + 1


def test_stop_without_start_raises_like_tensorflow():
    with pytest.raises(td.errors.UnavailableError, match="No profiler is running"):
        experimental.stop()


def test_start_twice_raises_already_exists_and_keeps_the_first_profiler(tmp_path):
    experimental.start(str(tmp_path))
    try:
        # TensorFlow 2.21 raises AlreadyExistsError here.
        with pytest.raises(td.errors.AlreadyExistsError, match="Another profiler is running"):
            experimental.start(str(tmp_path / "other"))
    finally:
        path = experimental.stop()
    assert path is not None and os.path.exists(path)
    assert not profiler_lib.active


def test_nothing_is_recorded_while_off_and_trace_is_a_no_op(tmp_path):
    with experimental.Trace("ignored"):
        mirrored_strategy_for(2).run(_step)
    assert not profiler_lib._events
    experimental.start(str(tmp_path))
    assert experimental.stop(save=False) is None
    assert not os.listdir(tmp_path)


def test_a_failing_replica_still_closes_its_event(tmp_path):
    def fails() -> None:
        raise ValueError("boom")

    experimental.start(str(tmp_path))
    try:
        with pytest.raises(ValueError, match="boom"):
            mirrored_strategy_for(2).run(fails)
    finally:
        path = experimental.stop()
    assert path is not None
    with open(path, encoding="utf-8") as file:
        runs = [e for e in json.load(file)["traceEvents"] if e["name"] == "run: test_a_failing_replica_still_closes_its_event.<locals>.fails"]
    assert len(runs) == 2 and all(e["args"]["error"] == "ValueError" for e in runs)


def _strict_json(path: str) -> dict[str, Any]:
    """The file parsed as strict JSON: bare NaN, Infinity and -Infinity are rejected."""

    def reject(constant: str) -> Any:
        raise AssertionError(f"{path} holds {constant}, which is not JSON")

    with open(path, encoding="utf-8") as file:
        document: dict[str, Any] = json.loads(file.read(), parse_constant=reject)
    return document


@pytest.fixture
def stopped_afterwards():
    """Stops a profiler a failing test left running, so that it does not leak into the next test."""
    yield
    if profiler_lib.active:
        experimental.stop(save=False)


def test_non_finite_trace_arguments_are_written_as_strings_so_the_file_is_strict_json(tmp_path, stopped_afterwards):
    experimental.start(str(tmp_path))
    with experimental.Trace(
        "loss", nan=float("nan"), inf=float("inf"), ninf=-float("inf"), np_nan=np.float32("nan"),
        np_int=np.int64(7), np_float=np.float64(0.5), finite=2.5, nested=[1.0, (float("inf"), None)],
        mapping={"lr": float("nan"), 3: "x"},
    ):
        pass
    path = experimental.stop()
    assert path is not None
    (event,) = [e for e in _strict_json(path)["traceEvents"] if e["name"] == "loss"]
    assert event["args"] == {
        "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "np_nan": "NaN", "np_int": 7, "np_float": 0.5,
        "finite": 2.5, "nested": [1.0, ["Infinity", None]], "mapping": {"lr": "NaN", "3": "x"},
    }


def test_a_trace_name_or_argument_that_is_no_string_is_written_with_str(tmp_path, stopped_afterwards):
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no str")

    experimental.start(str(tmp_path))
    with experimental.Trace(42, thing=Unprintable()):  # TensorFlow accepts any name
        pass
    path = experimental.stop()
    assert path is not None
    (event,) = [e for e in _strict_json(path)["traceEvents"] if e["name"] == "42"]
    assert event["args"] == {"thing": "<Unprintable object>"}


@pytest.mark.timeout(30)
def test_tracks_are_sorted_start_thread_first_then_replicas_by_id(tmp_path, stopped_afterwards):
    release = threading.Event()  # threads stay alive to the end: a finished thread's ident can be reused

    def replica(i: int | None, recorded: threading.Event) -> None:
        if i is not None:
            profiler_lib.name_replica_thread(i, f"/cpu:{i}")
        with profiler_lib.Span(f"event {i}"):
            pass
        recorded.set()
        release.wait(timeout=20)

    experimental.start(str(tmp_path))
    threads = []
    for i, name in ((3, None), (None, "helper"), (1, None)):  # replica 3's track appears first
        recorded = threading.Event()
        threads.append(threading.Thread(target=replica, args=(i, recorded), name=name))
        threads[-1].start()
        assert recorded.wait(timeout=10)
    with experimental.Trace("on the thread that called start()"):
        pass
    release.set()
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive()
    path = experimental.stop()
    assert path is not None
    events = _strict_json(path)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    order = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    by_order = [names[tid] for tid in sorted(names, key=order.__getitem__)]
    assert by_order == ["main", "replica 1 (/cpu:1)", "replica 3 (/cpu:3)", "helper"]
    assert sorted(order.values()) == list(range(4))


@pytest.mark.parametrize("below", [pytest.param("", id="logdir-is-a-file"), pytest.param("sub", id="parent-is-a-file")])
def test_start_into_a_file_raises_failed_precondition_and_does_not_start(tmp_path, below, stopped_afterwards):
    blocker = tmp_path / "taken"
    blocker.write_text("not a directory")
    logdir = os.path.join(str(blocker), below) if below else str(blocker)
    # TensorFlow 2.21 starts here and raises FailedPreconditionError in stop(), losing the recording.
    with pytest.raises(td.errors.FailedPreconditionError, match="needs a directory for logdir, but .*taken' is a file"):
        experimental.start(logdir)
    assert not profiler_lib.active
    experimental.start(str(tmp_path / "good"))  # nothing was left running
    assert experimental.stop() is not None


def test_stop_that_cannot_write_keeps_recording_so_a_retry_writes_everything(tmp_path, stopped_afterwards):
    logdir = tmp_path / "logs"
    experimental.start(str(logdir))
    with experimental.Trace("before"):
        pass
    logdir.write_text("a file now stands where the trace goes")
    with pytest.raises(td.errors.FailedPreconditionError, match="cannot write the trace to .*logs' is a file") as info:
        experimental.stop()
    assert "call stop() again" in str(info.value) and info.value.logdir == str(logdir)
    assert profiler_lib.active  # still running: nothing is lost
    with experimental.Trace("after"):
        pass
    logdir.unlink()
    path = experimental.stop()
    assert path is not None and not profiler_lib.active
    names = [e["name"] for e in _strict_json(path)["traceEvents"] if e["ph"] == "X"]
    assert names == ["before", "after"]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        pytest.param(OSError(errno.ENOSPC, "No space left on device"), td.errors.ResourceExhaustedError, id="disk-full"),
        pytest.param(PermissionError(errno.EACCES, "Permission denied"), td.errors.PermissionDeniedError, id="denied"),
        pytest.param(OSError(errno.EIO, "Input/output error"), td.errors.UnknownError, id="other"),
    ],
)
def test_stop_that_fails_mid_write_raises_tfs_type_leaves_no_partial_file_and_keeps_recording(
    tmp_path, monkeypatch, error, kind, stopped_afterwards
):
    def fails(document: Any, file: Any, **kwargs: Any) -> None:
        file.write('{"traceEvents": [')
        raise error

    experimental.start(str(tmp_path))
    with experimental.Trace("kept"):
        pass
    with monkeypatch.context() as patch:
        patch.setattr(profiler_lib.json, "dump", fails)
        with pytest.raises(kind, match=f"cannot write the trace to .*{error.strerror}") as info:
            experimental.stop()
    assert info.value.path == profiler_lib.trace_path(str(tmp_path)) and info.value.__cause__ is error
    assert os.listdir(tmp_path) == [] and profiler_lib.active
    path = experimental.stop()
    assert path is not None
    assert [e["name"] for e in _strict_json(path)["traceEvents"] if e["ph"] == "X"] == ["kept"]


def test_stop_without_saving_after_a_failed_stop_discards_the_recording(tmp_path, stopped_afterwards):
    logdir = tmp_path / "logs"
    experimental.start(str(logdir))
    logdir.write_text("in the way")
    with pytest.raises(td.errors.FailedPreconditionError):
        experimental.stop()
    assert experimental.stop(save=False) is None
    assert not profiler_lib.active and not profiler_lib._events
    with pytest.raises(td.errors.UnavailableError, match="No profiler is running"):
        experimental.stop()


# --- under MPI ---------------------------------------------------------------------------------


@pytest.mark.multi_worker
def test_each_rank_writes_its_own_track_with_its_collectives(multi_worker_strategy, shared_tmp_path):
    # One worker in the default suite; every worker of the job under mpiexec -n 2 (.ci/run).
    strategy = multi_worker_strategy
    extended = strategy.extended
    rank, workers, local = extended._worker_index, extended._num_workers, len(extended.worker_devices)
    logdir = str(shared_tmp_path)
    strategy.run(_step)  # threads and buffers made before recording
    experimental.start(logdir)
    try:
        strategy.run(_step)
    finally:
        path = experimental.stop()
    assert path == profiler_lib.trace_path(logdir, rank if workers > 1 else None)
    # A collective after every rank has written its file: then each rank reads them all.
    assert float(strategy.reduce("sum", strategy.run(lambda: td.constant(1.0)), axis=None)) == workers * local

    files = sorted(name for name in os.listdir(logdir) if name.endswith(".trace.json"))
    assert len(files) == workers
    ranks_seen = set()
    for name in files:
        with open(os.path.join(logdir, name), encoding="utf-8") as file:
            document = json.load(file)
        events = document["traceEvents"]
        (process,) = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
        file_rank = document["otherData"]["rank"]
        ranks_seen.add(file_rank)
        tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        replica_tracks = [t for t in tracks.values() if t.startswith("replica ")]
        complete = [e for e in events if e["ph"] == "X"]
        runs = [tracks[e["tid"]] for e in complete if e["name"] == "run: _step"]
        # The first local replica runs in the caller's thread, the others on their own threads.
        assert sorted(runs) == sorted([t for t in tracks.values() if t.startswith("main (replica ")] + replica_tracks)
        assert len(runs) == local
        collectives = [e for e in complete if e["name"].startswith("MPI ")]
        if workers == 1:
            assert process == "towerdist" and file_rank is None
            assert collectives == []  # one worker has no MPI at all
            continue
        assert process == f"towerdist rank {file_rank}"
        assert name.endswith(f".rank{file_rank}.trace.json")
        # The step's all_reduce and its merge_call, each checked across the ranks first.
        apis = [e["args"]["api"] for e in collectives]
        assert any("all_reduce" in api for api in apis), apis
        for event in collectives:
            assert event["args"]["bytes"] > 0 and event["args"]["packs"] >= 1
            assert event["args"]["algorithm"] and "error" not in event["args"]
            assert tracks[event["tid"]].startswith("main") or tracks[event["tid"]] in replica_tracks
    assert ranks_seen == ({None} if workers == 1 else set(range(workers)))
