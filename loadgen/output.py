"""What a run shows and leaves: the live progress line, the end-of-run tables, and the
record, JSON, CSV and plot files its options ask for (``gpuscope loadgen`` and
``gpuscope tune`` alike)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from gpuscope.loadgen import record
from gpuscope.loadgen.engine_metrics import agreement
from gpuscope.loadgen.record import PHASE_COLUMNS, step_row
from gpuscope.loadgen.results import StepResult
from gpuscope.loadgen.runner import Live
from gpuscope.loadgen.stats import percentile

if TYPE_CHECKING:
    from gpuscope.loadgen.options import LoadOptions

CLIENT_COLUMNS = (
    "config", "load", "ok", "errors", "missed", "req/s", "tok/s",
    "p50 ms", "p95 ms", "p99 ms", "max ms", "ttft p50 ms", "tpot p50 ms",
)  # fmt: skip
SERVER_COLUMNS = (
    "config",
    "load",
    "batch",
    *PHASE_COLUMNS,
    "p99 led by",
    "sm occ",
    "clock",
    "pcie MB/s",
)
ENGINE_COLUMNS = ("config", "load", "requests", "batch", *PHASE_COLUMNS)
PLAIN_EVERY_S = 5.0


class Progress:
    """One line rewritten in place on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._last_plain = 0.0

    def __call__(self, live: Live) -> None:
        now = time.monotonic()
        if not self.tty and now - max(self._last_plain, live.started_s) < PLAIN_EVERY_S:
            return
        self._last_plain = now
        outcomes = list(live.outcomes)
        good = [o.latency_s for o in outcomes if o.ok]
        p99 = percentile(good, 99)
        line = (
            f"step {live.index + 1}/{live.steps} {live.load.label}: {now - live.started_s:5.1f} s, "
            f"{len(good)} ok, {len(outcomes) - len(good)} errors, {live.missed} missed"
            + (f", p99 {p99 * 1000:.1f} ms" if p99 is not None else "")
        )
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def step_done(self, result: StepResult) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        p99 = result.latency_ms.get("p99")
        self.stream.write(
            f"done {result.config + ' ' if result.config else ''}{result.load.label}: "
            f"{result.ok} ok, {sum(result.errors.values())} errors, {result.missed} missed, "
            f"{result.throughput_rps:.1f} req/s"
            + (f", p99 {p99:.1f} ms" if p99 is not None else "")
            + "\n"
        )
        self.stream.flush()


def table(results: Sequence[StepResult], env: str) -> str:
    """The client-side table, the exporter's table when there is one, and notes."""
    rows = [step_row(result, env) for result in results]
    text = _columns(rows, CLIENT_COLUMNS)
    if any(result.server is not None for result in results):
        text += "\nwhere the time went (server side; phases: mean ms (share of the mean)):\n"
        text += _columns(
            [r for r, res in zip(rows, results, strict=True) if res.server], SERVER_COLUMNS
        )
    compared = [res for res in results if res.server is not None and res.engine is not None]
    if compared:
        text += (
            "\nthe same requests in the engine's own /metrics (phases: mean ms, the tuner's / "
            "the engine's (difference)):\n"
        )
        sides = [engine_row(res) for res in compared]
        # only the phases both views have (an engine's own metrics split fewer), and the
        # batch where either view has one
        measured = (*PHASE_COLUMNS, "batch")
        shown = [c for c in ENGINE_COLUMNS if c not in measured or any(r[c] for r in sides)]
        text += _columns(sides, shown)
    notes = [f"{_name(res)}: {note}" for res in results for note in res.notes]
    text += "".join(f"note: {note}\n" for note in notes)
    return text


def engine_row(result: StepResult) -> dict[str, str]:
    """A step's phase means as the tuner and the engine each counted them."""
    server, engine = result.server, result.engine
    assert server is not None and engine is not None
    row = dict.fromkeys(ENGINE_COLUMNS, "")
    row.update(
        config=result.config or "-",
        load=result.load.label,
        requests=f"{server.requests} / {engine.requests}",
    )
    for phase, (ours, theirs, diff) in agreement(server, engine).items():
        row[f"{phase} ms"] = f"{ours:.2f} / {theirs:.2f} ({diff:.1%})"
    if server.batch_size_mean is not None or engine.batch_size_mean is not None:
        row["batch"] = " / ".join(
            "-" if batch is None else f"{batch:.2f}"
            for batch in (server.batch_size_mean, engine.batch_size_mean)
        )
    return row


def _name(result: StepResult) -> str:
    return f"{result.config} {result.load.label}" if result.config else result.load.label


def _columns(rows: Sequence[dict[str, str]], columns: Sequence[str]) -> str:
    if not rows:
        return "(no step measured)\n"
    shown = [c for c in columns if c != "config" or any(r[c] != "-" for r in rows)]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in shown}
    lines = ["  ".join(c.rjust(widths[c]) for c in shown)]
    lines += ["  ".join(r[c].rjust(widths[c]) for c in shown) for r in rows]
    return "\n".join(lines) + "\n"


def write_outputs(
    options: LoadOptions,
    results: Sequence[StepResult],
    env: str,
    *,
    with_record: bool = True,
    run: str = "",
    verdicts: Mapping[str, tuple[str, str]] | None = None,
    view: str = "exporter",
) -> None:
    """The record, JSON, CSV and plot files the options ask for; ``verdicts`` (tune's,
    per configuration) fill the rows' verdict and why; ``view`` is whose server-side
    view the steps hold (``plot.VIEWS``)."""
    rows = [record.step_row(result, env, run=run) for result in results]
    for row, result in zip(rows, results, strict=True):
        if verdicts and (result.config or "-") in verdicts:
            row["verdict"], row["why"] = verdicts[result.config or "-"]
    if with_record and options.record is not None and rows:
        record.append_record(options.record, rows)
    if options.json is not None:
        record.write_output(options.json, record.json_text(results, env))
    if options.csv is not None:
        record.write_output(options.csv, record.csv_text(rows))
    if options.plot is not None and results:
        from gpuscope.loadgen.plot import plot_results

        if options.plot_record and options.record is not None and options.record.exists():
            plotted = record.plotted_steps(record.read_record(options.record.read_text()))
            if plotted:
                plot_results(plotted, options.plot, view="record")
        else:
            plot_results(results, options.plot, view=view)


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
