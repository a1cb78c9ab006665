"""The timeline (``td.profiler.experimental``): the trace-event file and its tracks and events."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

import towerdist as td
from towerdist._src import profiler as profiler_lib

from conftest import mirrored

experimental = td.profiler.experimental


def _step() -> Any:
    ctx = td.distribute.get_replica_context()
    assert ctx is not None
    total = ctx.all_reduce("sum", td.constant(1.0))
    return ctx.merge_call(lambda strategy, value: value, args=(total,))


def _trace(logdir: str) -> dict[str, Any]:
    strategy = mirrored(2)
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
        mirrored(2).run(_step)
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
            mirrored(2).run(fails)
    finally:
        path = experimental.stop()
    assert path is not None
    with open(path, encoding="utf-8") as file:
        runs = [e for e in json.load(file)["traceEvents"] if e["name"] == "run: test_a_failing_replica_still_closes_its_event.<locals>.fails"]
    assert len(runs) == 2 and all(e["args"]["error"] == "ValueError" for e in runs)


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
