"""How threads wait for a peer (``_src/waiting.py``): the measured spin budget, the per-site
prediction, the rules that turn spinning off, and the pacing of MPI polls."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading

import pytest

from towerdist._src import waiting

WAIT = 10.0


@pytest.fixture
def budget(monkeypatch):
    """Sets the spin budget (µs) for one test, with no back-off in force; the measured one comes back afterwards."""
    monkeypatch.setattr(waiting, "_shared_until", 0.0)
    monkeypatch.setattr(waiting, "_override", waiting._override)  # restored afterwards
    return waiting.set_spin_budget


def test_the_calibration_measures_the_machine_once():
    found = waiting.calibration()
    assert found is waiting.calibration()  # cached
    if waiting.usable_cores() < 2:
        assert found == waiting.Calibration(0.0, 0.0, 0.0, 0.0)
        return
    assert found.blocking > 0 and found.spinning > 0 and found.slowdown >= 0
    saving = found.blocking - found.spinning
    if saving < waiting._MIN_SAVING_SECONDS:
        assert found.budget == 0
    else:
        assert found.budget == pytest.approx(min(saving / max(found.slowdown, 0.1), waiting._MAX_SPIN_SECONDS))


def test_no_spinning_with_more_threads_than_cores_or_alone(budget, monkeypatch):
    budget(100)
    monkeypatch.setattr(waiting, "_CORES", 2)
    assert waiting.spin_budget(2) == pytest.approx(100e-6)
    assert waiting.spin_budget(3) == 0.0  # a spinner would take a core a peer needs
    assert waiting.spin_budget(1) == 0.0  # nobody to wait for


def test_a_spinner_that_shared_its_core_turns_spinning_off_for_a_while(budget, monkeypatch):
    budget(200)
    monkeypatch.setattr(waiting, "_CORES", 8)
    monkeypatch.setattr(waiting, "_shared_until", 0.0)
    monkeypatch.setattr(waiting.time, "thread_time", lambda: 0.0)  # as if never on the CPU while spinning
    mailbox: queue.SimpleQueue[int] = queue.SimpleQueue()
    site = waiting.Site("test")
    with pytest.raises(queue.Empty):
        waiting.get(mailbox, waiting.spin_budget(2), 0.001, site)
    assert waiting.spin_budget(2) == 0.0  # backed off
    monkeypatch.setattr(waiting, "_shared_until", 0.0)
    assert waiting.spin_budget(2) == pytest.approx(200e-6)


def test_a_site_spins_only_while_its_waits_are_usually_short(budget):
    budget(50)
    site = waiting.Site("test")
    assert site.budget(2) == waiting.spin_budget(2)
    for _ in range(10):
        site.record(1.0, 50e-6)  # long waits: the peer was far away
    assert site.budget(2) == 0.0
    for _ in range(10):
        site.record(10e-6, 0.0)  # short ones again (judged against the current budget)
    assert site.budget(2) == waiting.spin_budget(2)


@pytest.mark.parametrize("spin", [0, 300])
def test_get_returns_what_arrives_and_raises_empty_on_timeout(budget, spin):
    budget(spin)
    mailbox: queue.SimpleQueue[str] = queue.SimpleQueue()
    site = waiting.Site("test")
    with pytest.raises(queue.Empty):
        waiting.get(mailbox, waiting.spin_budget(2), 0.01, site)
    thread = threading.Thread(target=mailbox.put, args=("hello",))
    thread.start()
    assert waiting.get(mailbox, waiting.spin_budget(2), WAIT, site) == "hello"
    thread.join(WAIT)
    mailbox.put("already there")
    assert waiting.get(mailbox, 0.0, None, site) == "already there"


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_set_spin_budget_refuses_bad_values(value):
    with pytest.raises(ValueError, match="set_spin_budget\\(\\) takes microseconds >= 0, or None"):
        waiting.set_spin_budget(value)


def test_the_environment_variable_sets_or_refuses_the_budget():
    code = "from towerdist._src import waiting; print(waiting.spin_budget(2) if waiting._CORES >= 2 else 0.0)"
    env = {**os.environ, "TOWERDIST_SPIN_MICROSECONDS": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and float(done.stdout) == 0.0
    env["TOWERDIST_SPIN_MICROSECONDS"] = "fast"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "TOWERDIST_SPIN_MICROSECONDS='fast' is not a number of microseconds" in done.stderr


def test_mpi_polls_yield_when_the_jobs_own_ranks_crowd_the_cores(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(waiting, "_yield", lambda: calls.append("yield"))
    monkeypatch.setattr(waiting.time, "sleep", lambda seconds: calls.append(f"sleep {seconds}"))
    monkeypatch.setattr(waiting.Poller, "_FREE_POLLS", 2)
    monkeypatch.setattr(waiting, "_foreign_load", lambda: True)

    def pauses(poller: waiting.Poller, count: int) -> None:
        for _ in range(count):
            poller.pause()

    pauses(waiting.Poller(crowded=True), 3)
    assert calls == ["yield"]  # the first polls go back to back
    pauses(waiting.Poller(crowded=False), 3)
    monkeypatch.setattr(waiting, "_foreign_load", lambda: False)
    pauses(waiting.Poller(crowded=False), 3)
    assert calls == ["yield", f"sleep {waiting._SHARED_POLL_SECONDS}", "yield"]


def test_foreign_load_reads_the_runnable_tasks(monkeypatch, tmp_path):
    monkeypatch.setattr(waiting, "_CORES", 2)
    real_open = open
    path = tmp_path / "loadavg"

    def opened(name, *args, **kwargs):
        return real_open(path if name == "/proc/loadavg" else name, *args, **kwargs)

    monkeypatch.setattr("builtins.open", opened)

    def fake(running: int) -> None:
        path.write_text(f"0.50 0.40 0.30 {running}/250 12345\n")
        monkeypatch.setattr(waiting, "_load", [float("-inf"), False])

    fake(3)
    assert waiting._foreign_load() is True
    fake(2)
    assert waiting._foreign_load() is False
