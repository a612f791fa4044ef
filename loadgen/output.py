"""What a person sees: the live progress line and the end-of-run tables."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO

from gpuscope.loadgen.record import PHASE_COLUMNS, step_row
from gpuscope.loadgen.results import StepResult
from gpuscope.loadgen.runner import Live
from gpuscope.loadgen.stats import percentile

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
        text += "\nwhere the time went (exporter; phases: mean ms (share of the mean)):\n"
        text += _columns(
            [r for r, res in zip(rows, results, strict=True) if res.server], SERVER_COLUMNS
        )
    notes = [f"{_name(res)}: {note}" for res in results for note in res.notes]
    text += "".join(f"note: {note}\n" for note in notes)
    return text


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
