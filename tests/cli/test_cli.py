"""The ``towerdist`` command: ``info`` and ``bench``, as a subprocess and in-process through ``main``.

Subprocess runs get an environment of our choosing (CPU only, simulated GPUs, under
``mpiexec -n 2``); in-process runs share this test process's devices (the suite's 8 logical
CPUs, and simulated GPUs when the suite runs in that mode), so their assertions compare with
what the library itself reports. Every subprocess has a timeout. No test asserts a timing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from towerdist._src.backend import cupy_backend
from towerdist._src.cli import bench_allreduce
from towerdist._src.cli.main import build_parser, main
from towerdist._src.cli.sizes import format_size, parse_size, parse_sizes

TIMEOUT = 60
MPIEXEC = Path(sys.executable).parent / "mpiexec"
QUICK = ["--repeats", "3", "--sample-ms", "2"]
HAS_CUPY = importlib.util.find_spec("cupy") is not None
INFO_KEYS = {
    "towerdist": str,
    "python": dict,
    "packages": dict,
    "devices": dict,
    "gpus": dict,
    "nccl": dict,
    "mpi": dict,
    "mirrored_strategy": dict,
}


def cpu_env(**extra: str) -> dict[str, str]:
    """This environment without simulated GPUs or an MPI launcher's variables, plus ``extra``."""
    launcher = ("PMI_", "OMPI_", "MV2_", "MPI_LOCALNRANKS", "SLURM_", "HYDRA_")
    env = {k: v for k, v in os.environ.items() if k != "TOWERDIST_SIMULATE_GPUS" and not k.startswith(launcher)}
    env.update(extra)
    return env


def towerdist(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m towerdist args...`` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "towerdist", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env or cpu_env())


def table_rows(text: str) -> list[list[str]]:
    """The data rows of a bench table (every line not starting with ``#``), split into cells."""
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def check_info_types(info: dict[str, Any]) -> None:
    assert set(info) == set(INFO_KEYS)
    for key, kind in INFO_KEYS.items():
        assert isinstance(info[key], kind), key
    assert set(info["packages"]) == {"numpy", "optree", "cupy", "mpi4py", "tqdm"}
    assert all(v is None or isinstance(v, str) for v in info["packages"].values())
    assert isinstance(info["packages"]["numpy"], str)
    assert set(info["devices"]) == {"physical", "logical"}
    assert set(info["gpus"]) == {"count", "simulated", "names"}
    assert isinstance(info["gpus"]["count"], int) and len(info["gpus"]["names"]) == info["gpus"]["count"]
    assert set(info["nccl"]) == {"available", "simulated", "reason", "install"}
    assert info["nccl"]["available"] == (info["nccl"]["reason"] is None)
    assert set(info["mpi"]) == {"mpi4py", "mpiexec", "launcher_size", "under_launcher", "install", "rank", "size",
                                "library", "ranks", "error"}
    assert set(info["mirrored_strategy"]) == {"devices", "cross_device_ops", "reason"}


# --- info -----------------------------------------------------------------------------------------


def test_info_as_json_on_cpu_reports_devices_backends_and_the_choice() -> None:
    result = towerdist("info", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    check_info_types(info)
    assert info["devices"]["physical"][0] == "/physical_device:CPU:0"
    assert info["devices"]["logical"] == ["/device:CPU:0"]
    assert info["mpi"]["under_launcher"] is False and info["mpi"]["launcher_size"] == 1
    assert info["mpi"]["rank"] is None and info["mpi"]["ranks"] is None
    assert info["gpus"]["simulated"] is False
    if not HAS_CUPY:
        assert info["packages"]["cupy"] is None and info["gpus"]["count"] == 0
        assert info["nccl"]["reason"].startswith("cupy is not installed")
        assert "towerdist[cuda12]" in info["nccl"]["install"]
        assert info["mirrored_strategy"] == {
            "devices": ["/cpu:0"], "cross_device_ops": "SharedMemoryAllReduce",
            "reason": "the devices include CPUs, which share host memory",
        }


def test_info_without_a_launcher_neither_starts_mpi_nor_imports_cupy() -> None:
    script = textwrap.dedent("""
        import contextlib, io, sys
        from towerdist._src.cli.main import build_parser, main
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["info"])
        print(code, "mpi4py.MPI" in sys.modules, "cupy" in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                            env=cpu_env())
    assert result.returncode == 0, result.stderr
    code, mpi_started, cupy_imported = result.stdout.split()
    assert (code, mpi_started) == ("0", "False")
    if not HAS_CUPY:
        assert cupy_imported == "False"


def test_info_for_people_names_each_section() -> None:
    result = towerdist("info")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("towerdist ")
    for heading in ("Python", "packages", "devices", "NCCL", "MPI", "MirroredStrategy()", "cross-device ops"):
        assert heading in out
    assert "no launcher: this process is one worker" in out
    if not HAS_CUPY:
        assert "cupy not installed" in out and 'pip install "towerdist[cuda12]"' in out


def test_info_on_simulated_gpus_says_so_and_chooses_nccl() -> None:
    result = towerdist("info", "--json", env=cpu_env(TOWERDIST_SIMULATE_GPUS="2"))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    check_info_types(info)
    assert info["gpus"] == {"count": 2, "simulated": True, "names": ["GPU:0 (simulated)", "GPU:1 (simulated)"]}
    assert info["nccl"] == {"available": True, "simulated": True, "reason": None, "install": None}
    assert info["mirrored_strategy"]["devices"] == ["/gpu:0", "/gpu:1"]
    assert info["mirrored_strategy"]["cross_device_ops"] == "NcclAllReduce"
    assert "SIMULATED" in info["mirrored_strategy"]["reason"]


def test_info_in_process_agrees_with_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    check_info_types(info)
    assert info["gpus"]["count"] == cupy_backend.device_count()
    assert len([d for d in info["devices"]["logical"] if "CPU" in d]) == 8  # conftest's logical CPUs


def test_info_fails_with_a_message_when_the_simulation_variable_is_malformed() -> None:
    result = towerdist("info", env=cpu_env(TOWERDIST_SIMULATE_GPUS="two"))
    assert result.returncode == 1
    assert result.stderr.startswith("towerdist: error: TOWERDIST_SIMULATE_GPUS must be a positive number")
    assert "Traceback" not in result.stderr


@pytest.mark.launches_mpi
@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable} (the mpi-mpich extra)")
def test_info_under_mpiexec_reports_rank_and_size_once() -> None:
    command = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "towerdist", "info", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT,
                            env=cpu_env(MPIEXEC_TIMEOUT=str(TIMEOUT)))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)  # one JSON object: rank 0 alone prints
    check_info_types(info)
    mpi = info["mpi"]
    assert (mpi["under_launcher"], mpi["launcher_size"], mpi["rank"], mpi["size"]) == (True, 2, 0, 2)
    assert [r["rank"] for r in mpi["ranks"]] == [0, 1] and mpi["error"] is None
    assert mpi["library"]


# --- bench ----------------------------------------------------------------------------------------


def test_bench_allreduce_prints_an_nccl_tests_table_with_correct_results(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allreduce", "--sizes", "1K,4K", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "MirroredStrategy over 2 logical CPUs" in out and "floor: numpy" in out
    rows = table_rows(out)
    assert [row[:4] for row in rows] == [["1024", "256", "float32", "sum"], ["4096", "1024", "float32", "sum"]]
    for row in rows:
        size, count, dtype, op, time, algbw, busbw, correct, floor, floor_algbw, ratio = row
        assert correct == "ok"
        assert float(time) > 0 and float(floor) > 0
        assert float(algbw) == pytest.approx(int(size) / float(time) / 1e3, rel=0.02, abs=1e-3)
        assert float(busbw) == pytest.approx(float(algbw), abs=1e-3)  # 2(n-1)/n = 1 for n = 2
        assert float(ratio) == pytest.approx(float(time) / float(floor), rel=0.02)
    assert "# Wrong results        : none (all 2 sizes OK)" in out


def test_bench_allreduce_reports_wrong_results_and_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_allreduce, "_all_reduce_step", lambda x: x)  # each replica keeps its own buffer
    assert main(["bench", "allreduce", "--sizes", "1K", *QUICK]) == 1
    captured = capsys.readouterr()
    (row,) = table_rows(captured.out)
    assert row[7] != "ok" and 0 < int(row[7]) <= 2 * 2 * 256  # first and last call, 2 replicas, 256 elements
    assert "# Wrong results        : 1 of 1 sizes (1 KiB)" in captured.out
    assert "towerdist: error: all_reduce gave wrong results at 1 KiB" in captured.err


def test_bench_allreduce_shows_progress_on_stderr_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allreduce", "--sizes", "1K:2K", "--dtype", "float64", "--progress", "on", *QUICK]) == 0
    captured = capsys.readouterr()
    assert [row[2] for row in table_rows(captured.out)] == ["float64", "float64"]
    assert "bench allreduce: 1/2 (1 KiB)" in captured.err and "bench allreduce: 2/2 (2 KiB)" in captured.err


def test_bench_run_prints_the_step_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "run", *QUICK]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert [row[0] for row in rows] == ["strategy.run(no-op)", "strategy.run(all_reduce"]
    assert all(float(row[-4]) > 0 for row in rows)
    assert "the 4 KiB all_reduce adds" in out


def test_bench_with_gpus_fails_clearly_without_any() -> None:
    result = towerdist("bench", "allreduce", "--gpus", "--sizes", "1K", *QUICK)
    if HAS_CUPY and cupy_backend.device_count() > 0:
        pytest.skip("this machine has GPUs")
    assert result.returncode == 1
    assert "--gpus needs at least one GPU" in result.stderr and "TOWERDIST_SIMULATE_GPUS=2" in result.stderr


def test_bench_allreduce_on_simulated_gpus_labels_them() -> None:
    result = towerdist("bench", "allreduce", "--gpus", "--sizes", "1K", *QUICK,
                       env=cpu_env(TOWERDIST_SIMULATE_GPUS="2"))
    assert result.returncode == 0, result.stderr
    assert "over 2 SIMULATED GPUs" in result.stdout and "cross-device ops: NcclAllReduce" in result.stdout
    assert [row[7] for row in table_rows(result.stdout)] == ["ok"]


@pytest.mark.launches_mpi
@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable} (the mpi-mpich extra)")
def test_bench_allreduce_with_mpi_relaunches_itself_against_raw_mpi() -> None:
    result = towerdist("bench", "allreduce", "--mpi", "--timeout", str(TIMEOUT), "--sizes", "1K", "--progress", "on",
                       *QUICK)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("bench allreduce: 1/1 (1 KiB)") == 1  # rank 0's progress; rank 1 shows none
    assert "MultiWorkerMirroredStrategy over 1 logical CPU (/cpu:0) on each of 2 MPI ranks" in result.stdout
    assert "floor: mpi4py comm.Allreduce(MPI.IN_PLACE, buf)" in result.stdout
    assert [row[:4] + row[7:8] for row in table_rows(result.stdout)] == [["1024", "256", "float32", "sum", "ok"]]


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        pytest.param([], "towerdist", id="no-command"),
        pytest.param(["bench"], "towerdist bench", id="no-benchmark"),
        pytest.param(["bench", "allreduce", "--sizes", "3"], "towerdist bench allreduce", id="size-not-whole-elements"),
        pytest.param(["bench", "allreduce", "--sizes", "6", "--dtype", "float64"], "towerdist bench allreduce",
                     id="size-not-whole-float64-elements"),
        pytest.param(["bench", "allreduce", "--sizes", "4M:1K"], "towerdist bench allreduce", id="backwards-range"),
        pytest.param(["bench", "allreduce", "--replicas", "0"], "towerdist bench allreduce", id="zero-replicas"),
        pytest.param(["bench", "run", "--repeats", "x"], "towerdist bench run", id="repeats-not-a-number"),
        pytest.param(["bench", "run", "--bogus"], "towerdist bench run", id="unknown-bench-option"),
        pytest.param(["bench", "allreduce", "--sizes", "1K", "extra"], "towerdist bench allreduce", id="extra-word"),
        pytest.param(["info", "--yaml"], "towerdist info", id="unknown-option"),
    ],
)
def test_usage_errors_exit_with_status_2_and_the_subcommands_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {usage} ") and f"\n{usage}: error: " in err


@pytest.mark.parametrize("argv", [["bench", "run", "--rep", "3"], ["bench", "allreduce", "--mp"], ["info", "--js"]])
def test_options_must_be_spelled_out(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # argparse's prefix matching would let "--mp" mean --mpi, past the relaunch that removes --mpi by name
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {' '.join(argv[-2:] if argv[-1] == '3' else argv[-1:])}" in capsys.readouterr().err


BENCHES = ("allreduce", "run")
BAD_VALUES = [
    ("--replicas", "100000", "a whole number from 1 to 256"),
    ("--replicas", "-1", "a whole number from 1 to 256"),
    ("--replicas", "nan", "a whole number from 1 to 256"),
    ("--replicas", "2.5", "a whole number from 1 to 256"),
    ("--ranks", "1", "a whole number from 2 to 256"),
    ("--ranks", "100000", "a whole number from 2 to 256"),
    ("--ranks", "inf", "a whole number from 2 to 256"),
    ("--timeout", "inf", "a number of seconds from 1 to 86400"),
    ("--timeout", "nan", "a number of seconds from 1 to 86400"),
    ("--timeout", "-5", "a number of seconds from 1 to 86400"),
    ("--timeout", "0.5", "a number of seconds from 1 to 86400"),
    ("--timeout", "1e9", "a number of seconds from 1 to 86400"),
    ("--repeats", "0", "a whole number from 1 to 1000"),
    ("--repeats", "1000000", "a whole number from 1 to 1000"),
    ("--repeats", "inf", "a whole number from 1 to 1000"),
    ("--sample-ms", "inf", "a number of milliseconds above 0 and at most 10000"),
    ("--sample-ms", "nan", "a number of milliseconds above 0 and at most 10000"),
    ("--sample-ms", "0", "a number of milliseconds above 0 and at most 10000"),
    ("--sample-ms", "-1", "a number of milliseconds above 0 and at most 10000"),
    ("--sample-ms", "1e9", "a number of milliseconds above 0 and at most 10000"),
]


@pytest.mark.parametrize("bench", BENCHES)
@pytest.mark.parametrize(("option", "value", "allowed"), BAD_VALUES, ids=[f"{o}={v}" for o, v, _ in BAD_VALUES])
def test_every_numeric_option_rejects_nan_inf_and_out_of_range_values(
    bench: str, option: str, value: str, allowed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", bench, option, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: towerdist bench {bench} ")
    assert f"error: argument {option}: must be {allowed}. Got {value!r}." in err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("inf", "a size must be a whole, positive number of bytes. Got 'inf'"),
        ("nan", "a size must be a whole, positive number of bytes. Got 'nan'"),
        ("1K:inf", "a size must be a whole, positive number of bytes. Got 'inf'"),
        ("-1K", "a size must be a whole, positive number of bytes. Got '-1K'"),
        ("1e30", "a size must be at most 16G (16 GiB per replica). Got '1e30'"),
        ("1K:17G", "a size must be at most 16G (16 GiB per replica). Got '17G'"),
    ],
)
def test_sizes_option_rejects_nan_inf_and_absurd_sizes(value: str, message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", "allreduce", f"--sizes={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: towerdist bench allreduce ") and f"error: argument --sizes: {message}" in err


@pytest.mark.parametrize("bench", BENCHES)
def test_the_bounds_of_every_numeric_option_are_accepted(bench: str) -> None:
    args = build_parser().parse_args(["bench", bench, "--replicas", "256", "--ranks", "256", "--timeout", "86400",
                                      "--repeats", "1000", "--sample-ms", "10000"])
    assert (args.replicas, args.ranks, args.timeout, args.repeats, args.sample_ms) == (256, 256, 86400.0, 1000, 1e4)
    args = build_parser().parse_args(["bench", bench, "--replicas", "1", "--ranks", "2", "--timeout", "1",
                                      "--repeats", "1", "--sample-ms", "0.001"])
    assert (args.replicas, args.ranks, args.timeout, args.repeats, args.sample_ms) == (1, 2, 1.0, 1, 0.001)


# --- sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1K:8K", [1024, 2048, 4096, 8192]),
        ("1K:64M", [1024 << k for k in range(17)]),
        ("1K:64K:4", [1024, 4096, 16384, 65536]),
        ("4K,1K,4K", [1024, 4096]),
        ("512,1KiB,2MB", [512, 1024, 2 << 20]),
        ("1K:3K", [1024, 2048]),
    ],
)
def test_parse_sizes_reads_ranges_and_lists(text: str, expected: list[int]) -> None:
    assert parse_sizes(text, itemsize=4) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty entry"),
        ("1K,,2K", "empty entry"),
        ("abc", "a size is a number"),
        ("0", "whole, positive"),
        ("8K:1K", "must run upwards"),
        ("1K:8K:1", "FACTOR must be a whole number >= 2"),
        ("1:2:3:4", "START:STOP or START:STOP:FACTOR"),
        ("inf", "whole, positive"),
        ("nan", "whole, positive"),
        ("1K:1e400", "whole, positive"),
        ("32G", "at most 16G"),
        ("6", "whole number of 4-byte elements"),
    ],
)
def test_parse_sizes_rejects_malformed_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sizes(text, itemsize=4)


def test_sizes_format_for_people() -> None:
    assert [format_size(n) for n in (12, 4096, 64 << 20, 1 << 30, 1536)] == ["12 B", "4 KiB", "64 MiB", "1 GiB",
                                                                            "1536 B"]
    assert parse_size("1.5K") == 1536
