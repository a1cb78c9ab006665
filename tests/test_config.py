"""``td.config``: physical/logical devices and replica timeouts.

The test process was configured with 8 logical CPUs by conftest (and they are already
initialized), so behaviours of a fresh process run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import towerdist as td

from conftest import NUM_CPUS

CPU0 = td.config.PhysicalDevice(name="/physical_device:CPU:0", device_type="CPU")


def run_fresh(code: str) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a new interpreter (no TOWERDIST_* environment overrides)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERDIST_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, env=env
    )


def last_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    return result.stderr.strip().splitlines()[-1]


# --- physical and logical devices ---------------------------------------------------------


def test_one_physical_cpu():
    assert td.config.list_physical_devices("CPU") == [CPU0]


def test_physical_device_repr():
    assert repr(td.config.list_physical_devices("CPU")[0]) == (
        "PhysicalDevice(name='/physical_device:CPU:0', device_type='CPU')"
    )


def test_all_physical_devices_include_the_cpu():
    assert td.config.list_physical_devices()[0] == CPU0


def test_conftest_configured_eight_logical_cpus():
    assert td.config.list_logical_devices("CPU") == [
        td.config.LogicalDevice(name=f"/device:CPU:{i}", device_type="CPU") for i in range(NUM_CPUS)
    ]


def test_logical_device_fields():
    device = td.config.list_logical_devices("CPU")[3]
    assert (device.name, device.device_type) == ("/device:CPU:3", "CPU")


def test_get_logical_device_configuration_returns_the_configuration():
    assert td.config.get_logical_device_configuration(CPU0) == [td.config.LogicalDeviceConfiguration()] * NUM_CPUS


def test_setting_the_same_configuration_again_is_a_no_op():
    td.config.set_logical_device_configuration(CPU0, [td.config.LogicalDeviceConfiguration()] * NUM_CPUS)
    assert len(td.config.list_logical_devices("CPU")) == NUM_CPUS


@pytest.mark.parametrize("count", [1, 4, NUM_CPUS + 1])
def test_changing_the_configuration_after_initialization_raises(count):
    with pytest.raises(RuntimeError, match="Logical devices cannot be changed after they have been initialized"):
        td.config.set_logical_device_configuration(CPU0, [td.config.LogicalDeviceConfiguration()] * count)
    assert len(td.config.list_logical_devices("CPU")) == NUM_CPUS


def test_resetting_to_the_default_after_initialization_raises():
    with pytest.raises(RuntimeError, match="Logical devices cannot be changed after they have been initialized"):
        td.config.set_logical_device_configuration(CPU0, None)
    assert len(td.config.list_logical_devices("CPU")) == NUM_CPUS


def test_empty_configuration_list_raises_value_error():
    with pytest.raises(ValueError, match="set_logical_device_configuration\\(\\) needs at least one"):
        td.config.set_logical_device_configuration(CPU0, [])


def test_memory_limit_on_a_cpu_raises_value_error():
    with pytest.raises(ValueError, match="Setting a memory limit on logical CPU devices is not supported"):
        td.config.set_logical_device_configuration(CPU0, [td.config.LogicalDeviceConfiguration(memory_limit=1024)])


def test_configuration_entries_must_be_logical_device_configurations():
    with pytest.raises(ValueError, match="logical_devices\\[0\\] must be a td.config.LogicalDeviceConfiguration"):
        td.config.set_logical_device_configuration(CPU0, [{}])


@pytest.mark.parametrize(
    "device",
    [td.config.PhysicalDevice("/physical_device:CPU:7", "CPU"), "CPU:0", "/physical_device:CPU:0", None],
    ids=["unknown-physical-device", "device-string", "physical-name-string", "none"],
)
def test_set_configuration_of_an_unknown_device_raises_value_error(device):
    with pytest.raises(ValueError, match="set_logical_device_configuration\\(\\) needs a device from"):
        td.config.set_logical_device_configuration(device, [td.config.LogicalDeviceConfiguration()])


def test_get_configuration_of_an_unknown_device_raises_value_error():
    with pytest.raises(ValueError, match="get_logical_device_configuration\\(\\) needs a device from"):
        td.config.get_logical_device_configuration(td.config.PhysicalDevice("/physical_device:CPU:7", "CPU"))


@pytest.mark.parametrize("device_type", ["TPU", "banana", 3])
def test_list_physical_devices_with_a_bad_device_type_raises_value_error(device_type):
    with pytest.raises(ValueError, match="device_type must be 'CPU', 'GPU' or None"):
        td.config.list_physical_devices(device_type)


@pytest.mark.parametrize("device_type", ["TPU", "banana", 3])
def test_list_logical_devices_with_a_bad_device_type_raises_value_error(device_type):
    with pytest.raises(ValueError, match="device_type must be 'CPU', 'GPU' or None"):
        td.config.list_logical_devices(device_type)


# --- a fresh process ----------------------------------------------------------------------


def test_fresh_process_has_exactly_one_logical_cpu():
    result = run_fresh(
        """
        import towerdist as td
        cpu = td.config.list_physical_devices("CPU")[0]
        print(td.config.get_logical_device_configuration(cpu))
        print([d.name for d in td.config.list_logical_devices("CPU")])
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["None", "['/device:CPU:0']"]


def test_fresh_mirrored_strategy_without_devices_uses_the_one_logical_cpu():
    result = run_fresh(
        """
        import towerdist as td
        strategy = td.distribute.MirroredStrategy()
        print(strategy.num_replicas_in_sync)
        print(list(strategy.extended.worker_devices))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["1", "['/job:localhost/replica:0/task:0/device:CPU:0']"]


def test_fresh_mirrored_strategy_on_an_unconfigured_cpu_raises_value_error():
    result = run_fresh(
        """
        import towerdist as td
        td.distribute.MirroredStrategy(["CPU:1"])
        """
    )
    line = last_error_line(result)
    assert line.startswith("ValueError: MirroredStrategy got device /cpu:1, which does not exist")
    assert "set_logical_device_configuration" in line


def test_fresh_process_configured_with_three_cpus_mirrors_over_all_three():
    result = run_fresh(
        """
        import towerdist as td
        cpu = td.config.list_physical_devices("CPU")[0]
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * 3)
        strategy = td.distribute.MirroredStrategy()
        print(strategy.num_replicas_in_sync)
        print(list(strategy.extended.worker_devices))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "3",
        str([f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)]),
    ]


def test_fresh_process_may_reconfigure_before_initialization():
    result = run_fresh(
        """
        import towerdist as td
        cpu = td.config.list_physical_devices("CPU")[0]
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * 2)
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * 5)
        print(len(td.config.list_logical_devices("CPU")))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["5"]


@pytest.mark.parametrize(
    "first_use",
    ['td.config.list_logical_devices()', 'td.distribute.MirroredStrategy(["CPU:0"])'],
    ids=["list_logical_devices", "MirroredStrategy"],
)
def test_fresh_process_cannot_reconfigure_after_initialization(first_use):
    result = run_fresh(
        f"""
        import towerdist as td
        cpu = td.config.list_physical_devices("CPU")[0]
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * 2)
        {first_use}
        td.config.set_logical_device_configuration(cpu, [td.config.LogicalDeviceConfiguration()] * 4)
        """
    )
    assert last_error_line(result).startswith(
        "RuntimeError: Logical devices cannot be changed after they have been initialized"
    )


def test_fresh_process_replica_timeout_defaults():
    result = run_fresh(
        """
        import towerdist as td
        print(td.config.get_replica_timeouts())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str({"warning_seconds": 60.0, "timeout_seconds": None})]


# --- replica timeouts ---------------------------------------------------------------------


# What towerdist's pytest plugin sets for a test session (one process): 20 s warnings, 60 s timeouts.
SUITE_TIMEOUTS = {"warning_seconds": 20.0, "timeout_seconds": 60.0}


def test_the_pytest_plugins_replica_timeouts_are_in_force():
    assert td.config.get_replica_timeouts() == SUITE_TIMEOUTS


def test_set_replica_timeouts_changes_them(replica_timeouts):
    replica_timeouts(warning_seconds=5.0, timeout_seconds=30.0)
    assert td.config.get_replica_timeouts() == {"warning_seconds": 5.0, "timeout_seconds": 30.0}


@pytest.mark.parametrize("never", [None, float("inf"), np.inf], ids=["None", "inf", "np.inf"])
def test_replica_timeouts_may_be_disabled_with_none_or_infinity(replica_timeouts, mirrored_strategy, never):
    replica_timeouts(warning_seconds=never, timeout_seconds=never)
    assert td.config.get_replica_timeouts() == {"warning_seconds": None, "timeout_seconds": None}
    result = mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: "merged"))
    assert result == "merged"


@pytest.mark.parametrize("seconds", [np.float64(2.5), np.float32(2.5), np.int64(3), 7])
def test_replica_timeouts_accept_numpy_and_python_numbers(replica_timeouts, mirrored_strategy, seconds):
    replica_timeouts(warning_seconds=seconds, timeout_seconds=seconds)
    stored = td.config.get_replica_timeouts()
    assert stored == {"warning_seconds": float(seconds), "timeout_seconds": float(seconds)}
    assert all(type(v) is float for v in stored.values())
    assert mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: 1)) == 1


def test_a_huge_finite_timeout_is_usable(replica_timeouts, mirrored_strategy):
    replica_timeouts(warning_seconds=1e300, timeout_seconds=1e300)
    assert mirrored_strategy.run(lambda: td.distribute.get_replica_context().merge_call(lambda s: 1)) == 1


def test_get_replica_timeouts_returns_a_copy():
    td.config.get_replica_timeouts()["timeout_seconds"] = 1.0
    assert td.config.get_replica_timeouts() == SUITE_TIMEOUTS


@pytest.mark.parametrize(
    "kwargs",
    [
        {"warning_seconds": 0},
        {"warning_seconds": -1.0},
        {"warning_seconds": 5.0, "timeout_seconds": 0},
        {"warning_seconds": 5.0, "timeout_seconds": -5},
        {"warning_seconds": float("nan")},
        {"warning_seconds": -float("inf")},
    ],
)
def test_non_positive_replica_timeouts_raise_and_change_nothing(replica_timeouts, kwargs):
    name = next(k for k, v in kwargs.items() if not v > 0)
    with pytest.raises(ValueError, match=f"set_replica_timeouts\\(\\) needs {name} > 0, or None \\(never\\)"):
        replica_timeouts(**kwargs)
    assert td.config.get_replica_timeouts() == SUITE_TIMEOUTS


@pytest.mark.parametrize("value", ["5", b"5", [5], True], ids=["str", "bytes", "list", "bool"])
def test_replica_timeouts_that_are_not_numbers_raise_and_change_nothing(replica_timeouts, mirrored_strategy, value):
    with pytest.raises(TypeError, match="set_replica_timeouts\\(\\) takes timeout_seconds as a number of seconds"):
        replica_timeouts(warning_seconds=5.0, timeout_seconds=value)
    assert td.config.get_replica_timeouts() == SUITE_TIMEOUTS
    assert mirrored_strategy.run(lambda: 3) == 3


@pytest.mark.parametrize(
    "raw, expected",
    [("2.5", 2.5), ("inf", None), ("none", None), ("off", None), ("0", None), (" 7 ", 7.0)],
)
def test_replica_timeout_environment_variables_are_read_at_import(raw, expected):
    result = run_fresh(
        """
        import os
        import towerdist as td
        print(td.config.get_replica_timeouts())
        """.replace("import os", f"import os; os.environ['TOWERDIST_REPLICA_TIMEOUT_SECONDS'] = {raw!r}")
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str({"warning_seconds": 60.0, "timeout_seconds": expected})


@pytest.mark.parametrize("raw", ["abc", "-3", "nan", "5s"])
def test_an_invalid_replica_timeout_environment_variable_fails_the_import_naming_it(raw):
    result = run_fresh(
        f"""
        import os
        os.environ["TOWERDIST_REPLICA_WARNING_SECONDS"] = {raw!r}
        import towerdist
        """
    )
    assert last_error_line(result).startswith(
        f"ValueError: The environment variable TOWERDIST_REPLICA_WARNING_SECONDS={raw!r} is not a number of seconds"
    )
