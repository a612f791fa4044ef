"""``gpuscope loadgen``: drive an OpenAI-compatible endpoint through a load ladder and report.

Exit status: 0 when every step ran and no request failed, 1 when a request failed or the
run could not start, 130 after Ctrl-C (the steps measured so far are still reported).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from gpuscope import flags
from gpuscope.children import run_until_stopped
from gpuscope.loadgen import record
from gpuscope.loadgen.options import LoadgenOptions
from gpuscope.loadgen.output import Progress, plot_unavailable, table, table_stream, write_outputs
from gpuscope.loadgen.results import StepResult
from gpuscope.loadgen.runner import Runner, Target


def main(argv: Sequence[str]) -> int:
    options = flags.parse(LoadgenOptions, argv)
    if plot_unavailable(options, "gpuscope loadgen"):
        return 2
    progress = Progress()
    run = record.run_stamp()
    target = Target(options.url, options.exporter_url, options.model)

    def runner(stop: asyncio.Event) -> Coroutine[Any, Any, list[StepResult]]:
        plan = options.plan(options.label)
        specs = options.request_stream()
        return Runner(plan, target, specs, stop, tick=progress, on_step=progress.step_done).run()

    try:
        results, stopped = run_until_stopped(runner)
    except RuntimeError as exc:
        print(f"gpuscope loadgen: {exc}", file=sys.stderr)
        return 1
    env = record.environment()
    print(table(results, env), end="", file=table_stream(options), flush=True)
    write_outputs(options, results, env, run=run)
    if stopped:
        print(
            "stopped (Ctrl-C, SIGTERM or SIGHUP); the table shows what was measured",
            file=sys.stderr,
        )
        return 130
    return 0 if results and all(not r.errors for r in results) else 1
