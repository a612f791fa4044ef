"""``gpuscope loadgen``: drive an OpenAI-compatible endpoint through a load ladder and report.

Exit status: 0 when every step ran and no request failed, 1 when a request failed or the
run could not start, 130 after Ctrl-C (the steps measured so far are still reported).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, TextIO, TypeVar

from gpuscope import flags
from gpuscope.loadgen import record
from gpuscope.loadgen.options import LOADGEN_HELP, LoadgenOptions, LoadOptions
from gpuscope.loadgen.output import Progress, table
from gpuscope.loadgen.results import StepResult
from gpuscope.loadgen.runner import Runner, Target

ENV_PREFIX = "GPUSCOPE_LOADGEN_"
T = TypeVar("T")


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> LoadgenOptions:
    parser = flags.build_parser(
        LoadgenOptions,
        prog="gpuscope loadgen",
        description="Put a ladder of load steps on an OpenAI-compatible endpoint and report "
        "latency percentiles, TTFT, throughput and errors per step; with --exporter-url, "
        f"also where the time went. Every flag has a {ENV_PREFIX}* environment twin.",
        help=LOADGEN_HELP,
        env_prefix=ENV_PREFIX,
    )
    return flags.parse_or_exit(LoadgenOptions, parser, argv, environ, ENV_PREFIX)


# Ctrl-C, and how a supervisor (kill, timeout, make, systemd) or a closed terminal asks
# to stop: each ends the run cleanly, so the processes it started never outlive it.
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_with_ctrl_c(make: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> tuple[T, bool]:
    """Run ``make(stop)``; SIGINT, SIGTERM or SIGHUP sets ``stop`` instead of ending the
    process. Returns (result, stopped)."""

    async def main() -> tuple[T, bool]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for stop_signal in STOP_SIGNALS:
            loop.add_signal_handler(stop_signal, stop.set)
        try:
            return await make(stop), stop.is_set()
        finally:
            for stop_signal in STOP_SIGNALS:
                loop.remove_signal_handler(stop_signal)

    return asyncio.run(main())


def write_outputs(
    options: LoadOptions, results: Sequence[StepResult], env: str, *, with_record: bool = True
) -> None:
    """The record, JSON, CSV and plot files the options ask for."""
    rows = [record.step_row(result, env) for result in results]
    if with_record and options.record is not None and rows:
        record.append_record(options.record, rows)
    if options.json is not None:
        record.write_output(options.json, record.json_text(results, env))
    if options.csv is not None:
        record.write_output(options.csv, record.csv_text(rows))
    if options.plot is not None and results:
        from gpuscope.loadgen.plot import plot_results

        plot_results(results, options.plot)


def table_stream(options: LoadOptions) -> TextIO:
    """Standard error when JSON or CSV go to standard output, so that it stays parseable."""
    return sys.stderr if "-" in (options.json, options.csv) else sys.stdout


def plot_unavailable(options: LoadOptions, prog: str) -> bool:
    """Say so (before any load runs) when --plot is asked for without matplotlib."""
    if options.plot is None:
        return False
    from gpuscope.loadgen.plot import require_matplotlib

    problem = require_matplotlib()
    if problem is not None:
        print(f"{prog}: --plot: {problem}", file=sys.stderr)
    return problem is not None


def main(argv: Sequence[str]) -> int:
    options = parse_args(argv)
    if plot_unavailable(options, "gpuscope loadgen"):
        return 2
    progress = Progress()
    target = Target(options.url, options.exporter_url, options.model)

    def runner(stop: asyncio.Event) -> Coroutine[Any, Any, list[StepResult]]:
        plan = options.plan(options.label)
        specs = options.request_stream()
        return Runner(plan, target, specs, stop, tick=progress, on_step=progress.step_done).run()

    try:
        results, stopped = run_with_ctrl_c(runner)
    except RuntimeError as exc:
        print(f"gpuscope loadgen: {exc}", file=sys.stderr)
        return 1
    env = record.environment()
    print(table(results, env), end="", file=table_stream(options), flush=True)
    write_outputs(options, results, env)
    if stopped:
        print(
            "stopped (Ctrl-C, SIGTERM or SIGHUP); the table shows what was measured",
            file=sys.stderr,
        )
        return 130
    return 0 if results and all(not r.errors for r in results) else 1
