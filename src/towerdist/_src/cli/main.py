"""The ``towerdist`` command line: ``towerdist info`` and ``towerdist bench {allreduce,run}``.

Exit status: 0 on success, 2 for usage errors (argparse's), 1 for failures, which print one
message saying what failed and how to fix it (``CommandError``). Examples::

    towerdist info
    towerdist info --json
    TOWERDIST_SIMULATE_GPUS=2 towerdist info
    mpiexec -n 2 towerdist info
    towerdist bench allreduce --replicas 4 --sizes 1K:64M:4
    towerdist bench allreduce --gpus --sizes 1K,1M
    towerdist bench allreduce --mpi --sizes 4K:4M
    towerdist bench run --replicas 2
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from towerdist._src.cli.command_error import CommandError
from towerdist._src.cli.sizes import parse_sizes

__all__ = ["MAX_RANKS", "MAX_REPEATS", "MAX_REPLICAS", "MAX_SAMPLE_MS", "MAX_TIMEOUT_S", "build_parser", "main"]

_DEFAULT_SIZES = "1K:64M:4"


# The bounds of the numeric options (docs/cli.md lists them): wide enough for any real run,
# narrow enough that a typo (100000 replicas, a timeout of inf) is a usage error, not a
# machine brought to its knees or a command that never ends.
MAX_REPLICAS = 256  # replica threads (or GPUs) per process
MAX_RANKS = 256  # processes of an --mpi job
MAX_REPEATS = 1000  # samples per variant
MAX_SAMPLE_MS = 10_000.0  # 10 s per sample
MAX_TIMEOUT_S = 86_400.0  # one day


def _whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting the whole numbers from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}. Got {text!r}.")
        return value

    return parse


def _number(low: float, high: float, unit: str, *, low_included: bool) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite numbers between ``low`` and ``high`` (``unit`` names them)."""
    allowed = f"from {low:g} to {high:g}" if low_included else f"above {low:g} and at most {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above = value >= low if low_included else value > low
        if not (math.isfinite(value) and above and value <= high):  # also rejects nan and inf
            raise argparse.ArgumentTypeError(f"must be a number of {unit} {allowed}. Got {text!r}.")
        return value

    return parse


def _sizes(text: str) -> str:
    """An argparse ``type`` checking ``--sizes`` (the element size is checked once ``--dtype`` is known)."""
    try:
        parse_sizes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _add_bench_options(parser: argparse.ArgumentParser, repeats: int) -> None:
    parser.add_argument(
        "--replicas",
        type=_whole_number(1, MAX_REPLICAS),
        default=None,
        help="replicas: logical CPUs (default 2), GPUs with --gpus (default all), per rank under MPI "
        f"(default 1); 1 to {MAX_REPLICAS}",
    )
    parser.add_argument(
        "--gpus", action="store_true", help="run on GPUs (real, or simulated with TOWERDIST_SIMULATE_GPUS=n)"
    )
    parser.add_argument(
        "--mpi",
        action="store_true",
        help="MultiWorkerMirroredStrategy across processes: re-launch under mpiexec -n RANKS "
        "(automatic when already started by mpiexec)",
    )
    parser.add_argument(
        "--ranks",
        type=_whole_number(2, MAX_RANKS),
        default=2,
        help=f"--mpi: how many processes, 2 to {MAX_RANKS} (default 2)",
    )
    parser.add_argument(
        "--timeout",
        type=_number(1.0, MAX_TIMEOUT_S, "seconds", low_included=True),
        default=600.0,
        help=f"--mpi: seconds before the MPI job is killed, 1 to {MAX_TIMEOUT_S:g} (default 600)",
    )
    parser.add_argument(
        "--repeats",
        type=_whole_number(1, MAX_REPEATS),
        default=repeats,
        help=f"samples per variant; the median is shown; 1 to {MAX_REPEATS} (default {repeats})",
    )
    parser.add_argument(
        "--sample-ms",
        type=_number(0.0, MAX_SAMPLE_MS, "milliseconds", low_included=False),
        default=20.0,
        help=f"least duration of one sample in ms, above 0 and at most {MAX_SAMPLE_MS:g} (default 20)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``towerdist`` command."""
    from towerdist._src.cli.bench_allreduce import DTYPES  # noqa: PLC0415  (numpy only when benchmarking)

    parser = argparse.ArgumentParser(
        allow_abbrev=False,  # options are matched exactly (a relaunch under mpiexec removes some by name)
        prog="towerdist", description="towerdist: what it sees on this machine (info) and how fast it is (bench)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{info,bench}")
    info = commands.add_parser(
        "info",
        allow_abbrev=False,
        help="versions, devices, GPUs, NCCL and MPI, the default cross-device ops",
        description="Versions, devices, GPUs (real or simulated), NCCL and MPI availability, "
        "and the cross-device ops MirroredStrategy() would choose, and why.",
    )
    info.add_argument("--json", action="store_true", help="print one JSON object (keys: see the docs)")
    info.set_defaults(usage=info)

    bench = commands.add_parser(
        "bench",
        allow_abbrev=False, help="benchmarks: allreduce, run", description="Benchmarks; each prints a table to stdout."
    )
    benches = bench.add_subparsers(dest="bench", required=True, metavar="{allreduce,run}")
    allreduce = benches.add_parser(
        "allreduce",
        allow_abbrev=False,
        help="all_reduce in strategy.run against a floor, in nccl-tests' layout",
        description="all_reduce('sum', x) inside strategy.run, per size, against the plain-numpy floor (or raw MPI "
        "Allreduce under MPI) measured in the same run; columns as nccl-tests.",
    )
    _add_bench_options(allreduce, repeats=5)
    allreduce.set_defaults(usage=allreduce)  # usage errors found after parsing show this parser's usage
    allreduce.add_argument(
        "--sizes",
        type=_sizes,
        default=_DEFAULT_SIZES,
        help="bytes per replica: START:STOP[:FACTOR] (powers of FACTOR, default 2) or a comma "
        f"list, e.g. 1K:64M, 1K:64M:4, 1K,4K,1M; each from 1 to 16G (default {_DEFAULT_SIZES})",
    )
    allreduce.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default float32)")
    allreduce.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="progress on stderr: auto shows it on a terminal (default auto)",
    )
    run = benches.add_parser(
        "run",
        allow_abbrev=False,
        help="step overhead of strategy.run (trivial, and with a 4 KiB all_reduce)",
        description="The time of one strategy.run step: a no-op function, and one with a 4 KiB "
        "all_reduce; medians in microseconds.",
    )
    _add_bench_options(run, repeats=7)
    run.set_defaults(usage=run)
    return parser


def _relaunch_arguments(argv: list[str], progress: bool | None) -> list[str]:
    """``argv`` without ``--mpi``, ``--ranks`` and ``--timeout`` (and with the progress decided here)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name == "--mpi":
            continue
        if name in ("--ranks", "--timeout", "--progress"):
            skip = "=" not in arg
            continue
        out.append(arg)
    if progress is not None:
        out.append(f"--progress={'on' if progress else 'off'}")
    return out


def _dispatch(args: argparse.Namespace, argv: list[str]) -> None:
    if args.command == "info":
        from towerdist._src.cli.info import print_info  # noqa: PLC0415  (one subcommand's imports at a time)

        print_info(args.json)
        return
    from towerdist._src.cli.mpi_launch import run_under_mpiexec  # noqa: PLC0415  (one subcommand's imports at a time)
    from towerdist._src.cli.progress import resolve_progress  # noqa: PLC0415  (one subcommand's imports at a time)
    from towerdist._src.mpi_runtime import launcher_size  # noqa: PLC0415  (one subcommand's imports at a time)

    progress = resolve_progress(args.progress) if args.bench == "allreduce" else None
    if args.mpi and launcher_size() <= 1:
        run_under_mpiexec(args.ranks, _relaunch_arguments(argv, progress), args.timeout)
        return
    if args.bench == "allreduce":
        from towerdist._src.cli.bench_allreduce import bench_allreduce  # noqa: PLC0415  (one subcommand's imports at a time)

        try:
            sizes = parse_sizes(args.sizes, _itemsize(args.dtype))
        except ValueError as error:  # the element size of --dtype (the rest was checked while parsing)
            args.usage.error(f"argument --sizes: {error}")
        bench_allreduce(
            replicas=args.replicas,
            gpus=args.gpus,
            sizes=sizes,
            dtype=args.dtype,
            repeats=args.repeats,
            sample_ms=args.sample_ms,
            progress=bool(progress),
        )
        return
    from towerdist._src.cli.bench_run import bench_run  # noqa: PLC0415  (one subcommand's imports at a time)

    bench_run(replicas=args.replicas, gpus=args.gpus, repeats=args.repeats, sample_ms=args.sample_ms)


def _itemsize(dtype: str) -> int:
    import numpy as np  # noqa: PLC0415  (numpy only when benchmarking)

    return int(np.dtype(dtype).itemsize)


def main(argv: list[str] | None = None) -> int:
    """Runs the ``towerdist`` command with ``argv`` (default: ``sys.argv[1:]``).

    Args:
      argv: the arguments after the program name, e.g. ``["info", "--json"]``.

    Returns:
      The exit status: 0 on success, 1 on a failure (its message printed to stderr), 130 when
      interrupted. Usage errors exit with status 2 through ``SystemExit``, as argparse does.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(arguments)
    if unknown:  # parse_args would report them with the top-level usage; the subcommand's is the useful one
        args.usage.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        _dispatch(args, arguments)
    except CommandError as error:
        sys.stdout.flush()
        print(f"towerdist: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("towerdist: interrupted", file=sys.stderr)
        return 130  # the shell's status for SIGINT
    return 0
