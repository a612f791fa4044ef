"""The load generator's pure parts on known data: percentiles, histogram deltas, the
objective, the record table, the workload and the flags."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuscope import flags
from gpuscope.loadgen import record
from gpuscope.loadgen.client import Outcome
from gpuscope.loadgen.objective import Objective, ObjectiveError, choose, phase_difference
from gpuscope.loadgen.options import LoadgenOptions
from gpuscope.loadgen.output import Progress
from gpuscope.loadgen.results import Load, StepResult, not_started, summarize
from gpuscope.loadgen.runner import Live
from gpuscope.loadgen.server_view import ServerStep, parse_snapshot, shares, step_view
from gpuscope.loadgen.stats import histogram_quantile, percentile
from gpuscope.loadgen.workload import (
    Lengths,
    WorkloadError,
    parse_mix,
    read_request_file,
    synthetic_requests,
)

# --- percentiles -------------------------------------------------------------------------


def test_percentiles_interpolate_between_order_statistics() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, unsorted
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile(values, 101)


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    buckets = {0.1: 10.0, 0.2: 30.0, 0.4: 40.0, math.inf: 40.0}
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.2 + 0.2 * 9.6 / 10)
    # a quantile in the +Inf bucket is the largest finite bound
    assert histogram_quantile(0.99, {0.1: 1.0, math.inf: 10.0}) == 0.1
    assert histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None
    with pytest.raises(ValueError, match=r"\+Inf"):
        histogram_quantile(0.5, {0.1: 1.0})


# --- the exporter's view of a step ------------------------------------------------------


def _exposition(queue: tuple[int, int, int], compute: tuple[int, int, int], extra: str) -> str:
    """Phase histograms with buckets 1 ms, 10 ms, +Inf (cumulative counts given), split
    over two label sets to check that they are summed."""
    lines = ["# TYPE gpuscope_request_phase_seconds histogram"]
    for phase, counts, total in (("queue", queue, 0.004), ("compute", compute, 0.02)):
        for model, share in (("a", 1), ("b", 0)):
            for le, n in zip(("0.001", "0.01", "+Inf"), counts, strict=True):
                lines.append(
                    f'gpuscope_request_phase_seconds_bucket{{phase="{phase}",model="{model}",'
                    f'le="{le}"}} {n * share}'
                )
            lines.append(
                f'gpuscope_request_phase_seconds_sum{{phase="{phase}",model="{model}"}} '
                f"{total * counts[2] * share}"
            )
            lines.append(
                f'gpuscope_request_phase_seconds_count{{phase="{phase}",model="{model}"}} '
                f"{counts[2] * share}"
            )
    return "\n".join(lines) + "\n" + extra


GPU_BEFORE = """# TYPE gpuscope_request_duration_seconds histogram
gpuscope_request_duration_seconds_bucket{route="/v1/completions",le="0.01"} 5
gpuscope_request_duration_seconds_bucket{route="/v1/completions",le="+Inf"} 5
gpuscope_request_duration_seconds_count{route="/v1/completions"} 5
gpuscope_request_duration_seconds_sum{route="/v1/completions"} 1
# TYPE gpuscope_batch_size histogram
gpuscope_batch_size_bucket{le="+Inf"} 2
gpuscope_batch_size_count 2
gpuscope_batch_size_sum 5
# TYPE gpuscope_gpu_pcie_transmit_bytes counter
gpuscope_gpu_pcie_transmit_bytes_total{gpu="0"} 1000
# TYPE gpuscope_gpu_pcie_receive_bytes counter
gpuscope_gpu_pcie_receive_bytes_total{gpu="0"} 3000
# TYPE gpuscope_gpu_sm_occupancy_ratio gauge
gpuscope_gpu_sm_occupancy_ratio{gpu="0"} 0.1
# TYPE gpuscope_gpu_sm_clock_hertz gauge
gpuscope_gpu_sm_clock_hertz{gpu="0"} 1.0e9
# TYPE gpuscope_gpu_sm_clock_max_hertz gauge
gpuscope_gpu_sm_clock_max_hertz{gpu="0"} 2.0e9
"""


def _after(extra_requests: int, batches: int, batch_sum: int, occupancy: float) -> str:
    return (
        GPU_BEFORE.replace(
            '_count{route="/v1/completions"} 5',
            f'_count{{route="/v1/completions"}} {5 + extra_requests}',
        )
        # the slowest request took more than 10 ms end to end, the others less
        .replace('le="0.01"} 5', f'le="0.01"}} {5 + max(extra_requests - 1, 0)}')
        .replace('le="+Inf"} 5', f'le="+Inf"}} {5 + extra_requests}')
        .replace("gpuscope_batch_size_count 2", f"gpuscope_batch_size_count {2 + batches}")
        .replace("gpuscope_batch_size_sum 5", f"gpuscope_batch_size_sum {5 + batch_sum}")
        .replace('transmit_bytes_total{gpu="0"} 1000', 'transmit_bytes_total{gpu="0"} 6000')
        .replace('occupancy_ratio{gpu="0"} 0.1', f'occupancy_ratio{{gpu="0"}} {occupancy}')
    )


def test_a_step_is_the_difference_of_two_scrapes() -> None:
    before = parse_snapshot(_exposition((0, 0, 0), (0, 0, 0), GPU_BEFORE), taken_s=100.0)
    # 10 requests: queue 9 under 1 ms and 1 above 10 ms; compute 10 within 1-10 ms
    after_text = _exposition((9, 9, 10), (0, 10, 10), _after(10, 4, 10, 0.5)).replace(
        "# TYPE gpuscope_batch_size",  # the model listing loadgen reads is not a request
        'gpuscope_request_duration_seconds_count{route="/v1/models"} 3\n# TYPE gpuscope_batch_size',
    )
    after = parse_snapshot(after_text, taken_s=102.0)
    during = [parse_snapshot(_exposition((0, 0, 0), (0, 0, 0), _after(0, 0, 0, 0.3)), 101.0)]
    view = step_view(before, after, [*during, after])
    assert view.requests == 10
    assert view.phase_mean_ms == pytest.approx({"queue": 4.0, "compute": 20.0})
    assert view.phase_mean_share == pytest.approx({"queue": 4 / 24, "compute": 20 / 24})
    # queue P99 falls in +Inf: 10 ms; compute P99: 1 + 9 * 0.99 ms; both over the
    # end-to-end P99, which falls in +Inf too: 10 ms (not over their sum, 19.9 ms)
    compute_p99 = 1 + 9 * 0.99
    assert view.phase_p99_share == pytest.approx({"queue": 1.0, "compute": compute_p99 / 10})
    assert view.batch_size_mean == pytest.approx(10 / 4)
    assert view.pcie_bytes_per_s == pytest.approx(5000 / 2)
    assert view.sm_occupancy == pytest.approx(0.4)  # mean of 0.3 and 0.5
    assert view.clock_ratio == pytest.approx(0.5)


def test_phases_that_never_happened_stay_absent() -> None:
    empty = parse_snapshot("", taken_s=1.0)
    view = step_view(empty, parse_snapshot("", taken_s=2.0))
    assert view.phase_mean_ms == {} and view.phase_p99_share == {}
    assert view.batch_size_mean is None and view.pcie_bytes_per_s is None
    assert view.sm_occupancy is None and view.clock_ratio is None
    assert shares({"a": 0.0}) == {}


# --- one step's summary -------------------------------------------------------------------


def _outcome(latency_ms: float, error: str | None = None, **kw: float | int) -> Outcome:
    return Outcome("completions-stream", 0.0, latency_ms / 1000, error, **kw)  # type: ignore[arg-type]


def test_a_step_summary_counts_errors_by_kind_and_measures_only_successes() -> None:
    outcomes = [_outcome(float(ms), ttft_s=0.001 * ms / 2, tpot_s=0.002, output_tokens=4)
                for ms in range(1, 101)]  # fmt: skip
    outcomes += [_outcome(5000, "timeout"), _outcome(1, "status 429"), _outcome(1, "status 429")]
    outcomes += [_outcome(1, "status 404"), _outcome(2, "connection")]
    result = summarize(Load("concurrency", 4), outcomes, duration_s=2.0, missed=3)
    assert (result.sent, result.ok, result.missed) == (105, 100, 3)
    assert result.errors == {"connection": 1, "status 404": 1, "status 429": 2, "timeout": 1}
    assert result.latency_ms["p50"] == pytest.approx(50.5)
    assert result.latency_ms["p99"] == pytest.approx(99.01)
    assert result.latency_ms["max"] == pytest.approx(100)
    assert result.ttft_ms["p50"] == pytest.approx(25.25)
    assert result.tpot_ms["p50"] == pytest.approx(2.0)
    assert result.throughput_rps == pytest.approx(50.0)
    assert result.tokens_per_s == pytest.approx(200.0)
    assert any("404" in note and "completions-stream" in note for note in result.notes)


# --- the objective ------------------------------------------------------------------------


def _step(config: str, load: float, p99: float, rps: float, **phases: float) -> StepResult:
    server = None
    if phases:
        server = ServerStep(10, dict(phases), shares(phases), shares(phases), 2.0, None, None, None)
    return StepResult(
        load=Load("concurrency", load), config=config, duration_s=1.0, sent=10, ok=10, missed=0,
        errors={}, throughput_rps=rps, tokens_per_s=0.0,
        latency_ms={"p50": p99 / 2, "p99": p99}, ttft_ms={}, tpot_ms={}, by_kind={},
        server=server,
    )  # fmt: skip


def test_objectives_are_read_from_plain_words() -> None:
    assert Objective.parse("max throughput with p99 <= 50 ms") == Objective("max-throughput", 50)
    assert Objective.parse("MAX throughput with p99 ≤ 2.5ms") == Objective("max-throughput", 2.5)
    assert Objective.parse("min p99 at rate 100/s") == Objective("min-p99", 100)
    for bad in ("fastest", "max throughput with p99 <= 0 ms", "min p99 at rate"):
        with pytest.raises(ObjectiveError, match="--objective"):
            Objective.parse(bad)


def test_the_best_configuration_keeps_p99_under_the_bound_and_the_others_say_why() -> None:
    sweep = {
        "delay=0.1": [_step("delay=0.1", 1, 5, 100, queue=1, batch_wait=0.1, compute=3),
                      _step("delay=0.1", 8, 40, 300, queue=20, batch_wait=0.1, compute=15)],
        "delay=2": [_step("delay=2", 1, 8, 90, queue=1, batch_wait=2, compute=3),
                    _step("delay=2", 8, 45, 380, queue=12, batch_wait=2, compute=20)],
        "delay=5": [_step("delay=5", 1, 60, 60, queue=1, batch_wait=5, compute=3),
                    _step("delay=5", 8, 90, 390, queue=40, batch_wait=5, compute=30)],
    }  # fmt: skip
    verdict = choose(Objective.parse("max throughput with p99 <= 50 ms"), sweep)
    assert verdict.best == "delay=2"
    text = "\n".join(verdict.lines)
    assert "best under 'max throughput with p99 <= 50 ms': delay=2: 380.0 req/s at c=8" in text
    assert "delay=0.1: 300.0 req/s at c=1" not in text  # its best fitting step is c=8
    assert "delay=0.1: 300.0 req/s at c=8 (p99 40.0 ms); at c=8 p99 40.0 ms vs 45.0 ms" in text
    assert "delay=5: no error-free step with p99 <= 50 ms; at c=8 p99 90.0 ms vs 45.0 ms" in text
    assert "queue +28.00 ms mean" in text  # delay=5 lost its tail to the queue
    nothing = choose(Objective.parse("max throughput with p99 <= 1 ms"), sweep)
    assert nothing.best is None


def test_the_verdict_per_configuration_is_the_lines_without_the_name() -> None:
    sweep = {
        "d=1": [_step("d=1", 8, 40, 300, queue=20, compute=15)],
        "d=2": [_step("d=2", 8, 45, 380, queue=12, compute=20)],
        "d=3": [not_started(Load("concurrency", 8), "d=3", "exited with status 3", [])],
    }
    verdict = choose(Objective.parse("max throughput with p99 <= 50 ms"), sweep)
    assert verdict.by_config == {
        "d=2": ("best", "under 'max throughput with p99 <= 50 ms': 380.0 req/s at c=8 "
                "(p99 45.0 ms)"),
        "d=1": ("lost", verdict.lines[1].removeprefix("  d=1: ")),
        "d=3": ("not started", "did not start: exited with status 3"),
    }  # fmt: skip
    assert "queue +8.00 ms mean" in verdict.by_config["d=1"][1]
    nothing = choose(Objective.parse("max throughput with p99 <= 1 ms"), sweep)
    assert nothing.by_config["d=1"] == (
        "none met",
        "no configuration meets 'max throughput with p99 <= 1 ms'; no error-free step with "
        "p99 <= 1 ms",
    )
    assert nothing.by_config["d=3"][0] == "not started"


def test_min_p99_at_a_rate_compares_that_step_only() -> None:
    def at(config: str, rate: float, p99: float) -> StepResult:
        step = _step(config, 1, p99, rate)
        return StepResult(**{**step.__dict__, "load": Load("rate", rate)})

    sweep = {"a": [at("a", 10, 3), at("a", 100, 30)], "b": [at("b", 10, 9), at("b", 100, 20)]}
    assert choose(Objective.parse("min p99 at rate 100"), sweep).best == "b"
    assert choose(Objective.parse("min p99 at rate 10"), sweep).best == "a"


def test_phase_difference_names_the_phase_that_grew() -> None:
    loser = _step("x", 8, 90, 10, queue=40, compute=30)
    winner = _step("y", 8, 45, 10, queue=12, compute=20)
    assert phase_difference(loser, winner) == (
        "p99 90.0 ms vs 45.0 ms; queue +28.00 ms mean (57% of the p99 vs 38%)"
    )


# --- the record ---------------------------------------------------------------------------


def test_the_record_round_trips_and_grows_under_one_header(tmp_path: Path) -> None:
    path = tmp_path / "record.md"
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    first = [record.step_row(_step("delay=1", 1, 5, 100, queue=1, compute=3), "env A", when)]
    second = [record.step_row(_step("delay=2", c, 9, 90), "env|B", when) for c in (1, 4)]
    record.append_record(path, first)
    record.append_record(path, second)
    text = path.read_text()
    assert text.startswith(record.TITLE)
    assert text.count("| when | config |") == 1
    rows = record.read_record(text)
    assert rows == first + second
    assert rows[0]["queue ms"] == "1.00 (25%)" and rows[0]["p99 led by"] == "compute 75%"
    assert rows[1]["env"] == "env/B"  # a '|' would break the table
    assert rows[0]["when"] == "2026-01-02 03:04:05"


def test_line_breaks_in_a_label_keep_the_record_one_row_per_step(tmp_path: Path) -> None:
    path = tmp_path / "record.md"
    row = record.step_row(_step("a\nb\r\nc|d\x00", 1, 5, 100), "env\n2")
    record.append_record(path, [row, row])
    rows = record.read_record(path.read_text())
    assert len(rows) == 2
    assert rows[0]["config"] == "a b c/d" and rows[0]["env"] == "env 2"


def test_a_record_with_other_columns_gets_a_new_table_below(tmp_path: Path) -> None:
    path = tmp_path / "record.md"
    path.write_text("notes\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    row = record.step_row(_step("", 2, 5, 1), "env")
    record.append_record(path, [row])
    text = path.read_text()
    assert text.startswith("notes\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n| when |")
    assert record.read_record(text) == [row]


# The record's header before the run, verdict and why columns (docs/tuning.md's tables).
OLD_HEADER = (
    "| when | config | load | sent | ok | errors | missed | req/s | tok/s | p50 ms | p95 ms "
    "| p99 ms | max ms | ttft p50 ms | tpot p50 ms | batch | preprocess ms | queue ms | "
    "batch_wait ms | compute ms | postprocess ms | p99 led by | sm occ | clock | pcie MB/s | "
    "env |"
)
OLD_ROW = (
    "| 2026-12-01 02:44:53 | max-queue-delay-ms=0.1 | c=1 | 481 | 481 | 0 | 0 | 120.1 | 0.0 "
    "| 7.50 | 15.47 | 31.96 | 51.89 |  |  | 1.00 | 0.23 (4%) | 0.04 (1%) | 2.75 (47%) | "
    "0.83 (14%) | 2.06 (35%) | batch_wait 54% | 0.01 | 0.45 | 518.3 | vm 2cpu py3.11 "
    "gpuscope 0.1.0 |"
)


def test_an_older_record_stays_readable_and_grows_a_table_with_the_new_columns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "record.md"
    separator = "|" + "|".join("---" for _ in OLD_HEADER.strip("| ").split(" | ")) + "|"
    path.write_text(f"{record.TITLE}\n{OLD_HEADER}\n{separator}\n{OLD_ROW}\n")
    (old,) = record.read_record(path.read_text())
    assert set(old) == set(record.COLUMNS)  # every column, the new ones empty
    assert old["config"] == "max-queue-delay-ms=0.1" and old["pcie MB/s"] == "518.3"
    assert old["env"] == "vm 2cpu py3.11 gpuscope 0.1.0"
    assert old["verdict"] == old["why"] == old["run"] == ""
    new = record.step_row(_step("d=1", 1, 5, 100), "env", run="2026-12-04 07:00:00")
    record.append_record(path, [new])
    text = path.read_text()
    assert text.count("| when |") == 2  # the old table, then one with this version's columns
    assert record.read_record(text) == [old, new]


def test_the_verdict_settles_the_rows_of_its_run_only(tmp_path: Path) -> None:
    path = tmp_path / "record.md"
    earlier = [record.step_row(_step(c, 1, 5, 100), "env", run="run 1") for c in ("a", "b|x")]
    this = [record.step_row(_step(c, n, 5, 100), "env", run="run 2")
            for c in ("a", "b|x") for n in (1, 4)]  # fmt: skip
    record.append_record(path, earlier)
    record.append_record(path, this[:2])
    record.append_record(path, this[2:])
    path.chmod(0o640)
    verdicts = {"a": ("best", "under 'x': 1 req/s"), "b|x": ("lost", "p99 | 9 ms\nvs 5 ms")}
    assert record.settle_verdict(path, "run 2", verdicts) == 4
    rows = record.read_record(path.read_text())
    assert rows[:2] == earlier  # another run's rows are left alone
    assert [(r["config"], r["load"], r["verdict"]) for r in rows[2:]] == [
        ("a", "c=1", "best"), ("a", "c=4", "best"), ("b/x", "c=1", "lost"), ("b/x", "c=4", "lost")
    ]  # fmt: skip
    assert rows[2]["why"] == "under 'x': 1 req/s"
    assert rows[4]["why"] == "p99 / 9 ms vs 5 ms"  # still one cell of one row
    assert path.read_text().startswith(record.TITLE) and path.stat().st_mode & 0o777 == 0o640
    assert record.settle_verdict(path, "run 3", verdicts) == 0
    assert record.settle_verdict(tmp_path / "absent.md", "run 2", verdicts) == 0


def test_the_records_rows_of_every_run_are_steps_to_plot() -> None:
    old_separator = "|" + "|".join("---" for _ in OLD_HEADER.strip("| ").split(" | ")) + "|"
    earlier = f"{OLD_HEADER}\n{old_separator}\n{OLD_ROW}\n\n"
    rows = [
        record.step_row(_step("d=1", n, 10 * n, 100, queue=n, compute=3), "env", run=run)
        for run in ("run 1", "run 2") for n in (1, 4)
    ]  # fmt: skip
    rows.append(record.step_row(not_started(Load("concurrency", 1), "d=2", "why", []), "env"))
    at_rate = dataclasses.replace(_step("d=3", 2, 5, 1), load=Load("rate", 2))
    rows.insert(0, record.step_row(at_rate, "env"))  # the last row's mode is the plot's
    text = earlier + record.markdown_rows(rows, header=True)
    steps = record.plotted_steps(record.read_record(text))
    # the old table's row and both runs' rows, one label per configuration and run; not
    # the row that measured nothing, nor the other load mode
    assert [(s.config, s.load.label) for s in steps] == [
        ("max-queue-delay-ms=0.1 @earlier", "c=1"),
        ("d=1 @run 1", "c=1"), ("d=1 @run 1", "c=4"),
        ("d=1 @run 2", "c=1"), ("d=1 @run 2", "c=4"),
    ]  # fmt: skip
    assert steps[0].latency_ms == {"p50": 7.5, "p95": 15.47, "p99": 31.96, "max": 51.89}
    assert steps[0].server is not None and steps[0].server.phase_mean_ms["batch_wait"] == 2.75
    assert steps[2].server is not None and steps[2].server.phase_mean_ms == {
        "queue": 4.0, "compute": 3.0
    }  # fmt: skip
    # one run only: the configuration as it is
    single = record.plotted_steps(record.read_record(record.markdown_rows(rows[1:3], True)))
    assert [s.config for s in single] == ["d=1", "d=1"]
    assert record.plotted_steps([]) == []


def _drawn(
    steps: list[StepResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: str
) -> Any:
    """The figure ``plot_results`` drew (kept from its close) and the PNG it wrote."""
    pytest.importorskip("matplotlib")  # the plot extra (part of dev): skipped only without it
    import matplotlib.pyplot as plt

    from gpuscope.loadgen.plot import plot_results

    figures: list[Any] = []
    real_close = plt.close

    def close(figure: Any) -> None:
        figures.append(figure)
        real_close(figure)

    monkeypatch.setattr(plt, "close", close)
    plot_results(steps, tmp_path / "plot.png", **kw)
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (figure,) = figures
    return figure


def test_the_phase_axis_names_whose_view_it_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [_step("d=1", 1, 5, 100, queue=1, compute=3), _step("d=2", 1, 9, 90, queue=2)]
    labels = {}
    for view in ("exporter", "triton", "record"):
        labels[view] = _drawn(steps, tmp_path, monkeypatch, view=view).axes[1].get_ylabel()
    assert labels == {
        "exporter": "mean ms per request (gpuscope exporter, from spans)",
        "triton": "mean ms per request (Triton's nv_inference counters)",
        "record": "mean ms per request (server side, each run's view)",
    }


def test_the_plot_of_a_record_draws_each_configuration_of_each_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        record.step_row(_step(f"d={d}", n, 10 * n + d, 100, queue=n), "env", run=run)
        for run in ("run 1", "run 2") for d in (1, 2) for n in (1, 4)
    ]  # fmt: skip
    steps = record.plotted_steps(record.read_record(record.markdown_rows(rows, header=True)))
    figure = _drawn(steps, tmp_path, monkeypatch, view="record")
    latency, phases = figure.axes
    assert [line.get_label() for line in latency.get_lines()] == [
        "d=1 @run 1 p99", "d=2 @run 1 p99", "d=1 @run 2 p99", "d=2 @run 2 p99"
    ]  # fmt: skip
    assert [list(line.get_ydata()) for line in latency.get_lines()][3] == [12.0, 42.0]
    assert len(phases.patches) == 8  # one queue bar per step of every run


def test_csv_and_json_carry_every_step() -> None:
    steps = [_step("c", 1, 5, 100, queue=1, compute=3), _step("c", 4, 9, 200)]
    rows = [record.step_row(s, "env") for s in steps]
    csv_lines = record.csv_text(rows).splitlines()
    assert csv_lines[0].split(",")[:4] == ["when", "config", "load", "sent"]
    assert len(csv_lines) == 3
    parsed = json.loads(record.json_text(steps, "env"))
    assert [s["throughput_rps"] for s in parsed["steps"]] == [100, 200]
    assert parsed["steps"][0]["server"]["phase_mean_ms"] == {"queue": 1, "compute": 3}


# --- workload and flags -------------------------------------------------------------------


def test_the_request_stream_is_repeatable_and_follows_the_mix() -> None:
    mix = parse_mix(["embeddings=1", "chat-stream=3"])
    prompt, output = Lengths.parse("p", "uniform:2:6"), Lengths.parse("o", "8")

    def take(seed: int) -> list[object]:
        stream = synthetic_requests(mix, prompt, output, seed)
        return [next(stream) for _ in range(400)]

    first = take(7)
    assert first == take(7) and first != take(8)
    labels = [spec.label for spec in first]  # type: ignore[attr-defined]
    assert set(labels) == {"embeddings", "chat-stream"}
    assert 0.65 < labels.count("chat-stream") / len(labels) < 0.85
    chat = next(s for s in first if s.label == "chat-stream")  # type: ignore[attr-defined]
    body = chat.json_body("m")  # type: ignore[attr-defined]
    assert body["max_tokens"] == 8 and body["stream"] is True and body["model"] == "m"
    assert 2 <= len(body["messages"][0]["content"].split()) <= 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "at least 1"),
        ("uniform:9:2", "LO <= HI"),
        ("gauss:1:2", "expected N"),
        ("x", "cannot"),
    ],
)
def test_bad_length_distributions_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=f"--output-tokens: .*{message}"):
        Lengths.parse("--output-tokens", text)


def test_bad_mixes_are_refused() -> None:
    for items, message in ((["images=1"], "unknown kind"), (["chat=x"], "not a number"),
                           (["chat=0"], "positive weight")):  # fmt: skip
        with pytest.raises(WorkloadError, match=message):
            parse_mix(items)


def test_a_request_file_is_read_in_order_and_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(
        '{"endpoint": "chat", "stream": true, "messages": [{"role": "user", "content": "hi"}]}\n'
        "\n"
        '{"endpoint": "embeddings", "input": "x", "model": "ignored"}\n'
    )
    specs = read_request_file(path)
    assert [s.label for s in specs] == ["chat-stream", "embeddings"]
    assert specs[1].json_body("m") == {"model": "m", "input": "x"}
    path.write_text('{"endpoint": "chat"}\n{"endpoint": "images"}\n')
    with pytest.raises(WorkloadError, match=r"requests.jsonl:2: 'endpoint' must be one of"):
        read_request_file(path)
    path.write_text('{"endpoint": "embeddings", "stream": true}\n')
    with pytest.raises(WorkloadError, match=":1: 'stream'"):
        read_request_file(path)


def test_loadgen_flags_have_environment_twins_and_are_checked() -> None:
    options = flags.parse(
        LoadgenOptions, [], {"GPUSCOPE_LOADGEN_RATE": "5,50", "GPUSCOPE_LOADGEN_SEED": "3"}
    )
    assert options.loads() == (Load("rate", 5), Load("rate", 50)) and options.seed == 3
    assert flags.parse(LoadgenOptions, ["--concurrency", "2,8"], {}).loads()[1] == Load(
        "concurrency", 8
    )
    assert LoadgenOptions().loads()[0] == Load("concurrency", 1)  # default ladder
    for argv in (
        ["--concurrency", "1", "--rate", "5"],
        ["--concurrency", "0"],
        ["--rate", "fast"],
        ["--arrival", "bursty"],
        ["--url", "localhost:8000"],
        ["--mix", "images=1"],
    ):
        with pytest.raises(SystemExit):
            flags.parse(LoadgenOptions, argv, {})


@pytest.mark.parametrize("flag", ["--record", "--json", "--csv", "--plot"])
def test_an_output_that_cannot_be_written_is_refused_before_any_load(
    flag: str, tmp_path: Path
) -> None:
    for path in (tmp_path / "missing" / "out", tmp_path):  # no such folder; a folder
        with pytest.raises(SystemExit):
            flags.parse(LoadgenOptions, [flag, str(path)], {})
    assert flags.parse(
        LoadgenOptions, [flag, str(tmp_path / "out")], {}
    )  # a new file in a folder is fine


# --- the progress line ----------------------------------------------------------------------


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_rewrites_one_line_on_a_terminal_and_prints_plain_lines_otherwise() -> None:
    started = time.monotonic()
    live = Live(0, 2, Load("concurrency", 4), started, [_outcome(10.0), _outcome(1, "timeout")])
    terminal = _Stream(tty=True)
    Progress(terminal)(live)
    Progress(terminal).step_done(_step("", 4, 9, 100))
    assert terminal.getvalue().startswith("\r\033[Kstep 1/2 c=4: ")
    assert "1 ok, 1 errors, 0 missed, p99 10.0 ms" in terminal.getvalue()
    assert "\r\033[Kdone c=4: 10 ok, 0 errors, 0 missed, 100.0 req/s, p99 9.0 ms\n" in (
        terminal.getvalue()
    )
    plain = _Stream(tty=False)
    progress = Progress(plain)
    progress(live)  # a step that just began: nothing yet
    live.started_s = started - 60
    progress(live)
    progress(live)  # within five seconds of the last line: nothing
    assert plain.getvalue().count("\n") == 1 and "\r" not in plain.getvalue()


def test_a_step_with_errors_or_missed_sends_never_wins_at_a_rate() -> None:
    """The P99 is the successes': a value answering every second request 500 had the
    better P99 and was named best at the rate (found against a fake server)."""

    def at(config: str, p99: float, **changes: object) -> StepResult:
        step = _step(config, 1, p99, 20)
        return StepResult(**{**step.__dict__, "load": Load("rate", 20), **changes})

    sweep = {
        "healthy": [at("healthy", 35.5)],
        "failing": [at("failing", 23.3, errors={"status 500": 30})],
        "dropping": [at("dropping", 20.0, missed=47)],
    }
    verdict = choose(Objective.parse("min p99 at rate 20"), sweep)
    assert verdict.best == "healthy"
    assert verdict.by_config["failing"] == (
        "lost",
        "its step at rate 20/s had errors or missed sends; at 20/s p99 23.3 ms vs 35.5 ms",
    )
    throughput = choose(Objective.parse("max throughput with p99 <= 50 ms"), sweep)
    assert throughput.best == "healthy"
