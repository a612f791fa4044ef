"""The demo end to end: real exporter and worker processes, real load, real metrics."""

from __future__ import annotations

import re

import pytest

from gpuscope.loadgen.demo import DemoOptions, free_port, parse_args, run_demo
from gpuscope.loadgen.report import summarize_metrics
from gpuscope.middleware.attributes import PHASES


def test_the_demo_shows_where_the_time_went(capsys: pytest.CaptureFixture[str]) -> None:
    options = DemoOptions(
        duration_s=2.0,
        concurrency=4,
        batching="dynamic",
        exporter_port=free_port(),
        worker_port=free_port(),
        exit=True,
    )
    result, report = run_demo(options)
    assert result.completed > 0
    assert set(result.statuses) == {"200"}
    assert {"embeddings", "completions (stream)"} <= set(result.latencies_s)
    # every phase of the worker's requests reached the exporter's histograms
    for phase in PHASES:
        assert re.search(rf"^  {phase} +\d+\.\d+ ms", report, re.MULTILINE), phase
    assert "mean batch size" in report
    assert "gpuscope_gpu_sm_occupancy_ratio" in report
    assert "exporter: http://127.0.0.1:" in capsys.readouterr().out


def test_demo_arguments_are_checked() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--duration-s", "0"], {})
    with pytest.raises(SystemExit):
        parse_args([], {"GPUSCOPE_DEMO_BATCHING": "sometimes"})
    options = parse_args(["--exporter-port", "0", "--worker-port", "0", "--exit"], {})
    assert options.exporter_port > 0
    assert not options.keep_running


def test_summaries_sum_phases_across_label_sets() -> None:
    text = "\n".join(
        [
            "# TYPE gpuscope_request_phase_seconds histogram",
            'gpuscope_request_phase_seconds_sum{phase="queue",model="a"} 3.0',
            'gpuscope_request_phase_seconds_count{phase="queue",model="a"} 2',
            'gpuscope_request_phase_seconds_sum{phase="queue",model="b"} 1.0',
            'gpuscope_request_phase_seconds_count{phase="queue",model="b"} 2',
            "# TYPE gpuscope_request_duration_seconds histogram",
            'gpuscope_request_duration_seconds_count{model="a"} 2',
            'gpuscope_request_duration_seconds_count{model="b"} 2',
            "",
        ]
    )
    summary = summarize_metrics(text)
    assert summary.requests == 4
    assert summary.phase_mean_s == {"queue": 1.0}
    assert summary.batch_size_mean is None
