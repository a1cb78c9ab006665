"""Where a training step's time goes, read from towerdist's own timeline.

Records ``--steps`` steps of ``train_scaling.py``'s sgd task (the digits MLP, global batch
256, plain SGD: one gradient all-reduce and ``apply_gradients`` per step) on ``--replicas``
logical CPUs with ``td.profiler.experimental`` and prints, per step (medians):

* the step's wall time (``strategy.run``, as the caller sees it);
* **wake-ups**: waits that blocked (the thread slept and had to be woken: the timeline's
  ``blocked: <what>`` spans), counted by the step in which the thread woke, per kind of wait
  (``the next step``: a replica thread waiting for ``run``; ``barrier``: a replica parked at
  ``apply_gradients``; ``the end of the step``: the caller waiting for the replica threads);
* hand-overs: replicas that went on from ``apply_gradients`` instead of waiting there (the
  timeline's ``hand over: ...`` spans), and the copy of their gradients that takes;
* when each replica starts after ``run`` is called, how long its function runs, how long
  the round's ``merge_fn`` (the sum and the update) takes, and how long after the last
  replica returned ``run`` returns.

Run:
    python benchmarks/step_timeline.py [--replicas 2] [--steps 2000]
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_name] = "1"  # as train_scaling.py: one BLAS thread per replica

import argparse  # noqa: E402
import bisect  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

import towerdist as td  # noqa: E402
import train_scaling  # noqa: E402

from _machine import machine_info  # noqa: E402

TARGET_WAKEUPS = 2.0  # issue 35: wake-ups per 2-replica training step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    n = args.replicas
    cpu = td.config.list_physical_devices("CPU")[0]
    td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * max(n, 1))
    print(machine_info())
    step = train_scaling.towerdist_step(n, train_scaling.GLOBAL_BATCH // n, train_scaling.GLOBAL_BATCH, "sgd")
    for _ in range(300):  # threads started, buffers made, spin predictions settled
        step()
    with tempfile.TemporaryDirectory() as logdir:
        td.profiler.experimental.start(logdir)
        for _ in range(args.steps):
            step()
        path = td.profiler.experimental.stop()
        assert path is not None
        with open(path, encoding="utf-8") as file:
            events = json.load(file)["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    runs = sorted((e for e in spans if e["name"].startswith("strategy.run")), key=lambda e: e["ts"])
    starts = [r["ts"] for r in runs]

    def step_of(ts: float) -> int | None:
        k = bisect.bisect_right(starts, ts) - 1
        if k < 0 or ts > runs[k]["ts"] + runs[k]["dur"]:
            return None
        return k

    wakeups: dict[str, list[int]] = collections.defaultdict(lambda: [0] * len(runs))
    phases: dict[str, list[float]] = collections.defaultdict(list)
    hand_overs = [0] * len(runs)
    for e in spans:
        end = e["ts"] + e["dur"]
        if e["name"].startswith("blocked: "):
            k = step_of(end)
            if k is not None:
                wakeups[e["name"][len("blocked: "):]][k] += 1
            continue
        k = step_of(e["ts"])
        if k is None:
            continue
        run = runs[k]
        if e["name"].startswith("run: "):
            phases[f"{tracks[e['tid']]}: starts after run is called"].append(e["ts"] - run["ts"])
            phases[f"{tracks[e['tid']]}: runs its function"].append(e["dur"])
        elif e["name"].startswith("merge_fn: "):
            phases["merge_fn (sum and update)"].append(e["dur"])
        elif e["name"].startswith("hand over: "):
            hand_overs[k] += 1
            phases["hand over (the gradients' copy)"].append(e["dur"])
    last_return = []
    for k, run in enumerate(runs):
        ends = [e["ts"] + e["dur"] for e in spans if e["name"].startswith("run: ") and step_of(e["ts"]) == k]
        if ends:
            last_return.append(run["ts"] + run["dur"] - max(ends))
    print(f"{n} replica(s), {len(runs)} steps of the sgd task (global batch {train_scaling.GLOBAL_BATCH}); medians")
    print(f"  step (strategy.run)                            {statistics.median(r['dur'] for r in runs):8.1f} us")
    total = [sum(counts[k] for counts in wakeups.values()) for k in range(len(runs))]
    print(f"  wake-ups per step                              {statistics.mean(total):8.2f} (mean; median "
          f"{statistics.median(total):g}; issue 35's target <= {TARGET_WAKEUPS:g}: "
          f"{'met' if statistics.mean(total) <= TARGET_WAKEUPS else 'MISSED'})")
    print(f"  hand-overs per step                            {statistics.mean(hand_overs):8.2f} (mean)")
    for what, counts in sorted(wakeups.items()):
        print(f"    waiting for {what:<34} {statistics.mean(counts):8.2f}")
    for name, values in sorted(phases.items()):
        print(f"  {name:<46} {statistics.median(values):8.1f} us")
    print(f"  run returns after the last replica returned    {statistics.median(last_return):8.1f} us")


if __name__ == "__main__":
    main()
