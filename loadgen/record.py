"""One row per step: the record table (Markdown), CSV and JSON, free of I/O but the file writes.

``step_row`` flattens a ``StepResult`` into text columns; the Markdown record appends
those rows under one header so that a person can read the file and ``git diff`` it,
and ``read_record`` parses it back, the tables of older gpuscope versions included
(their missing columns read as empty). Each row carries its run (when the command
started) and, under ``gpuscope tune``, its configuration's verdict and why: the rows
are appended as each value ends, before the verdict exists, and ``settle_verdict``
fills those two cells of the run's rows in place once it does.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuscope import __version__
from gpuscope.loadgen.results import Load, StepResult
from gpuscope.loadgen.server_view import ServerStep
from gpuscope.spans import PHASES

PHASE_COLUMNS = tuple(f"{phase} ms" for phase in PHASES)
COLUMNS = (
    "when",
    "config",
    "load",
    "sent",
    "ok",
    "errors",
    "missed",
    "req/s",
    "tok/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "max ms",
    "ttft p50 ms",
    "tpot p50 ms",
    "batch",
    *PHASE_COLUMNS,
    "p99 led by",
    "sm occ",
    "clock",
    "pcie MB/s",
    "verdict",
    "why",
    "env",
    "run",
)
# The columns of a record table of an earlier version: every one of these, and no
# column the current table lacks.
_REQUIRED = ("when", "config", "load")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
TITLE = (
    "# gpuscope load record\n\nOne row per load step; phase columns: mean ms (share of the mean).\n"
)


def environment() -> str:
    return (
        f"{platform.node()} {os.cpu_count()}cpu py{sys.version_info.major}."
        f"{sys.version_info.minor} gpuscope {__version__}"
    )


def _num(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def run_stamp(started: datetime | None = None) -> str:
    """What the ``run`` column says: when the command started (UTC, to the second)."""
    return (started or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M:%S")


def step_row(
    result: StepResult, env: str, when: datetime | None = None, run: str = ""
) -> dict[str, str]:
    when = when or result.finished
    row = {
        "when": when.strftime("%Y-%m-%d %H:%M:%S"),
        "config": result.config or "-",
        "load": result.load.label + (" (stopped)" if result.interrupted else ""),
        "sent": str(result.sent),
        "ok": str(result.ok),
        "errors": "; ".join(f"{kind}: {n}" for kind, n in result.errors.items()) or "0",
        "missed": str(result.missed),
        "req/s": _num(result.throughput_rps),
        "tok/s": _num(result.tokens_per_s),
        **{f"{p} ms": _num(result.latency_ms.get(p), 2) for p in ("p50", "p95", "p99", "max")},
        "ttft p50 ms": _num(result.ttft_ms.get("p50"), 2),
        "tpot p50 ms": _num(result.tpot_ms.get("p50"), 2),
        "env": env,
        "run": run,
    }
    row.update(_server_columns(result))
    if result.not_started:
        row.update(load="not started", errors=result.not_started)
    return {column: _cell(row.get(column, "")) for column in COLUMNS}


def _cell(text: str) -> str:
    """A table cell on one line: a '|' or a line break (a label, say) would split the row."""
    return _CONTROL.sub(" ", text.replace("|", "/")).strip()


def _server_columns(result: StepResult) -> dict[str, str]:
    server = result.server
    if server is None:
        return {}
    columns = {
        "batch": _num(server.batch_size_mean, 2) or _engine_batch(result),
        "sm occ": _num(server.sm_occupancy, 2),
        "clock": _num(server.clock_ratio, 2),
        "pcie MB/s": _num(
            None if server.pcie_bytes_per_s is None else server.pcie_bytes_per_s / 1e6
        ),
    }
    for phase in PHASES:
        if phase in server.phase_mean_ms:
            share = server.phase_mean_share.get(phase, 0.0)
            columns[f"{phase} ms"] = f"{server.phase_mean_ms[phase]:.2f} ({share:.0%})"
    if server.phase_p99_share:
        phase, share = max(server.phase_p99_share.items(), key=lambda item: item[1])
        columns["p99 led by"] = f"{phase} {share:.0%}"
    return columns


def _engine_batch(result: StepResult) -> str:
    """The engine's own mean batch where the server-side view has none (vLLM's spans
    carry no batch size; its metrics do), marked as the engine's."""
    batch = result.engine.batch_size_mean if result.engine is not None else None
    return "" if batch is None else f"{batch:.2f} (engine)"


def markdown_rows(rows: Iterable[dict[str, str]], header: bool) -> str:
    lines = []
    if header:
        lines.append("| " + " | ".join(COLUMNS) + " |")
        lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    lines += ["| " + " | ".join(row[c] for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def append_record(path: Path, rows: Sequence[dict[str, str]]) -> None:
    """Append ``rows``; a new file gets a title, a file whose last table has other
    columns gets a fresh table under it."""
    existing = path.read_text() if path.exists() else ""
    table_lines = [line for line in existing.splitlines() if line.startswith("| ")]
    same_table = bool(table_lines) and _cells(_last_header(existing)) == list(COLUMNS)
    text = ""
    if not existing.strip():
        text = TITLE + "\n"
    elif not same_table:
        text = "" if existing.endswith("\n\n") else ("\n" if existing.endswith("\n") else "\n\n")
    elif not existing.endswith("\n"):
        text = "\n"
    text += markdown_rows(rows, header=not same_table)
    with path.open("a") as handle:
        handle.write(text)


def _last_header(text: str) -> str:
    lines = text.splitlines()
    for index in range(len(lines) - 1, 0, -1):
        if lines[index].startswith("|---") or lines[index].startswith("| ---"):
            return lines[index - 1]
    return ""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _record_columns(header: str) -> list[str] | None:
    """The columns of a record table's header line, this version's or an earlier one's
    (a subset of ``COLUMNS`` with when, config and load); None for any other table."""
    cells = _cells(header)
    if set(_REQUIRED) <= set(cells) <= set(COLUMNS) and len(set(cells)) == len(cells):
        return cells
    return None


def read_record(text: str) -> list[dict[str, str]]:
    """Every row of every record table in ``text``, each with all of ``COLUMNS`` (those
    an earlier version's table lacks are empty); tables with other columns skipped."""
    rows: list[dict[str, str]] = []
    columns: list[str] | None = None
    previous = ""
    for line in text.splitlines():
        if line.startswith("|---"):
            columns = _record_columns(previous)
        elif line.startswith("| ") and columns is not None:
            cells = dict(zip(columns, _cells(line), strict=True))
            rows.append({column: cells.get(column, "") for column in COLUMNS})
        elif not line.startswith("|"):
            columns = None
        previous = line
    return rows


def settle_verdict(path: Path, run: str, verdicts: Mapping[str, tuple[str, str]]) -> int:
    """Fill the verdict and why of ``run``'s rows in the record at ``path`` from
    ``verdicts`` (configuration -> (verdict, why)); the other rows, tables and text stay
    as they are. Written to a new file moved over the old one, so that a reader never
    sees half of it. How many rows were filled."""
    if not run or not path.exists():
        return 0
    by_cell = {_cell(config or "-"): settled for config, settled in verdicts.items()}
    lines = path.read_text().splitlines(keepends=True)
    columns: list[str] | None = None
    previous, filled = "", 0
    for index, line in enumerate(lines):
        if line.startswith("|---"):
            cells = _cells(previous)
            columns = cells if cells == list(COLUMNS) else None  # only this version's rows
        elif line.startswith("| ") and columns is not None:
            row = dict(zip(columns, _cells(line), strict=True))
            settled = by_cell.get(row["config"])  # the label as its cell writes it
            if row["run"] == _cell(run) and settled is not None:
                row["verdict"], row["why"] = (_cell(text) for text in settled)
                end = "\n" if line.endswith("\n") else ""
                lines[index] = "| " + " | ".join(row[c] for c in COLUMNS) + " |" + end
                filled += 1
        elif not line.startswith("|"):
            columns = None
        previous = line
    if filled:
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=f".{path.name}.", delete=False
        ) as handle:
            handle.write("".join(lines))
        os.chmod(handle.name, path.stat().st_mode & 0o7777)
        os.replace(handle.name, path)
    return filled


_LOAD = re.compile(r"(?:c=([0-9.eE+-]+)|([0-9.eE+-]+)/s)(?: \(stopped\))?")
_MS = re.compile(r"\s*([0-9.eE+-]+)")


def plotted_steps(rows: Sequence[dict[str, str]]) -> list[StepResult]:
    """The record's rows (``read_record``'s) as steps to plot: latency percentiles and
    phase means, each configuration labelled with its run when the rows hold several
    runs, so that one configuration measured twice is two lines. Rows that measured
    nothing (``not started``, no P99) are left out, and so are those of another load
    mode than the last row's: one x axis is client counts or rates, not both."""
    parsed = []
    for row in rows:
        load, latency = _load(row["load"]), _cuts_of(row)
        if load is not None and latency is not None:
            parsed.append((row, load, latency))
    if not parsed:
        return []
    mode = parsed[-1][1].mode
    runs = {row["run"] for row, _, _ in parsed}
    steps = []
    for row, load, latency in parsed:
        if load.mode != mode:
            continue
        config = row["config"] if row["config"] != "-" else ""
        if len(runs) > 1:
            config = f"{config} @{row['run'] or 'earlier'}".strip()
        means = {p: float(m.group(1)) for p in PHASES if (m := _MS.match(row[f"{p} ms"]))}
        server = ServerStep(0, means, {}, {}, None, None, None, None) if means else None
        step = StepResult(
            load=load, config=config, duration_s=0.0, sent=0, ok=0, missed=0, errors={},
            throughput_rps=0.0, tokens_per_s=0.0, latency_ms=latency, ttft_ms={}, tpot_ms={},
            by_kind={}, server=server,
        )  # fmt: skip
        steps.append(step)
    return steps


def _load(label: str) -> Load | None:
    match = _LOAD.fullmatch(label.strip())
    if match is None:
        return None
    if match.group(1) is not None:
        return Load("concurrency", float(match.group(1)))
    return Load("rate", float(match.group(2)))


def _cuts_of(row: dict[str, str]) -> dict[str, float] | None:
    """The row's latency percentiles that it has; None without a P99."""
    cuts = {}
    for point in ("p50", "p95", "p99", "max"):
        try:
            cuts[point] = float(row[f"{point} ms"])
        except ValueError:
            continue
    return cuts if "p99" in cuts else None


def csv_text(rows: Sequence[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def json_text(results: Sequence[StepResult], env: str) -> str:
    steps: list[dict[str, Any]] = [asdict(result) for result in results]
    return json.dumps({"environment": env, "steps": steps}, indent=2, default=str) + "\n"


def read_json(text: str) -> tuple[str, list[StepResult]]:
    """The environment and the steps of ``json_text``'s output (a run's ``--json`` file),
    so that its tables and verdict can be made again without the server."""
    data = json.loads(text)
    steps = []
    for step in data["steps"]:
        fields = dict(step)
        fields["load"] = Load(**step["load"])
        fields["server"] = ServerStep(**step["server"]) if step.get("server") else None
        fields["engine"] = ServerStep(**step["engine"]) if step.get("engine") else None
        fields["finished"] = datetime.fromisoformat(step["finished"])
        steps.append(StepResult(**fields))
    return str(data["environment"]), steps


def write_output(path: str, text: str) -> None:
    """``-`` is standard output."""
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text)
