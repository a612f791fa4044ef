"""Triton's own ``/metrics`` as a step's server-side view, on expositions a real Triton
2.51 wrote (tests/fixtures/triton-2.51/, before and after a load of known truth)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuscope.loadgen.engine_metrics import TritonSnapshotBuilder
from gpuscope.loadgen.server_view import MalformedMetrics, step_view

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "triton-2.51"


def snapshot(name: str, taken_s: float) -> object:
    builder = TritonSnapshotBuilder()
    for line in (FIXTURES / name).read_text().splitlines():
        builder.add(line)
    return builder.finish(taken_s)


def test_a_triton_step_counts_every_request_and_splits_queue_from_compute() -> None:
    truth = json.loads((FIXTURES / "truth.json").read_text())
    before, after = snapshot("metrics-0.txt", 0.0), snapshot("metrics-2.txt", 10.0)
    view = step_view(before, after)  # type: ignore[arg-type]
    # failures count among the requests: what the client sent, all three models
    assert view.requests == sum(model["requests"] for model in truth.values()) == 2400
    # inferences (successful) over executions (failed ones too), all models together
    assert view.batch_size_mean == pytest.approx((300 + 449 + 1200) / (118 + 273 + 304))
    assert set(view.phase_mean_ms) == {"queue", "compute"}
    succeeded = sum(model["succeeded"] for model in truth.values())
    # compute per success holds at least the handlers' time spread over the successes
    handler_ms = 1000 * sum(model["handler_request_s"] for model in truth.values()) / succeeded
    assert handler_ms <= view.phase_mean_ms["compute"] <= handler_ms + 50
    assert view.phase_mean_share["queue"] + view.phase_mean_share["compute"] == pytest.approx(1)
    assert view.phase_p99_share == {}  # counters, not histograms: no P99 split


def test_a_bad_line_names_itself() -> None:
    builder = TritonSnapshotBuilder()
    builder.add("# HELP nv_inference_count ...")
    with pytest.raises(MalformedMetrics, match="line 2"):
        builder.add('nv_inference_count{model="m"} -3')
