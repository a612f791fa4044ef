"""Triton's own ``/metrics`` as a step's server-side view, on expositions a real Triton
2.51 wrote (tests/fixtures/triton-2.51/, before and after a load of known truth), and
vLLM's, in the shape vLLM 0.32.0 writes it (its scrapes from a real sweep are replayed in
tests/loadgen/test_tune_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuscope.loadgen.engine_metrics import (
    TritonSnapshotBuilder,
    VllmSnapshotBuilder,
    agreement,
    vllm_stages,
)
from gpuscope.loadgen.server_view import MalformedMetrics, ServerStep, Snapshot, step_view

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


def vllm_exposition(requests: int, queue_s: float, prefill_s: float, decode_s: float) -> str:
    """vLLM 0.32.0's request histograms as its /metrics writes them, for one model on two
    engines (each holding half), with the families the view must pass over."""
    families = {
        "vllm:e2e_request_latency_seconds": queue_s + prefill_s + decode_s,
        "vllm:request_queue_time_seconds": queue_s,
        "vllm:request_inference_time_seconds": prefill_s + decode_s,
        "vllm:request_prefill_time_seconds": prefill_s,
        "vllm:request_decode_time_seconds": decode_s,
    }
    lines = [
        "# HELP python_gc_objects_collected_total Objects collected during gc",
        'python_gc_objects_collected_total{generation="0"} 3344.0',
        'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 9',
    ]
    for name, total in families.items():
        lines += [f"# HELP {name} x", f"# TYPE {name} histogram"]
        for engine in ("0", "1"):
            labels = f'engine="{engine}",model_name="tiny"'
            lines += [
                f'{name}_bucket{{{labels},le="0.3"}} 0.0',
                f'{name}_bucket{{{labels},le="+Inf"}} {requests / 2}',
                f"{name}_count{{{labels}}} {requests / 2}",
                f"{name}_sum{{{labels}}} {total / 2}",
                f"{name}_created{{{labels}}} 1.76e9",
            ]
    return "\n".join(lines) + "\n"


def test_a_vllm_step_is_the_delta_of_its_queue_and_inference_histograms() -> None:
    before = vllm_exposition(4, queue_s=2.0, prefill_s=0.4, decode_s=1.6)
    after = vllm_exposition(14, queue_s=12.0, prefill_s=1.4, decode_s=5.6)
    view = step_view(vllm_snapshot(before, 0.0), vllm_snapshot(after, 5.0))
    # only the 10 requests between the scrapes, summed over both engines
    assert view.requests == 10
    assert view.phase_mean_ms == pytest.approx({"queue": 1000.0, "compute": 500.0})
    assert view.phase_p99_share == pytest.approx({"queue": 1.0, "compute": 1.0})
    # compute is vLLM's inference time: its prefill and decode together
    stages = {n: h.count for n, h in vllm_stages(after.splitlines()).items()}
    assert set(stages.values()) == {14}
    histograms = vllm_stages(after.splitlines())
    assert histograms["vllm:request_inference_time_seconds"].sum == pytest.approx(
        histograms["vllm:request_prefill_time_seconds"].sum
        + histograms["vllm:request_decode_time_seconds"].sum
    )


def test_a_vllm_bucket_without_a_bound_names_its_line() -> None:
    builder = VllmSnapshotBuilder()
    builder.add("# TYPE vllm:request_queue_time_seconds histogram")
    with pytest.raises(MalformedMetrics, match=r"line 2: .* without a numeric 'le'"):
        builder.add('vllm:request_queue_time_seconds_bucket{le="soon"} 1')


def test_a_vllm_mean_batch_is_generated_tokens_per_engine_step_over_every_engine() -> None:
    def scrape(tokens: float, steps: float) -> Snapshot:
        builder = VllmSnapshotBuilder()
        for engine in ("0", "1"):  # summed over engines, as the histograms are
            builder.add(f'vllm:generation_tokens_total{{engine="{engine}"}} {tokens}')
            builder.add(f'vllm:iteration_tokens_total_count{{engine="{engine}"}} {steps}')
            builder.add(f'vllm:generation_tokens_created{{engine="{engine}"}} 1.7e9')
        return builder.finish(0.0)

    # 2 x 300 tokens over 2 x 100 steps: three sequences a step
    assert step_view(scrape(100, 50), scrape(400, 150)).batch_size_mean == pytest.approx(3.0)
    assert step_view(scrape(100, 50), scrape(100, 50)).batch_size_mean is None  # no step
    builder = VllmSnapshotBuilder()
    with pytest.raises(MalformedMetrics, match=r"line 1: vllm:generation_tokens_total is -1"):
        builder.add("vllm:generation_tokens_total -1")


def test_agreement_is_each_shared_phase_against_the_engine() -> None:
    def step(means: dict[str, float]) -> ServerStep:
        return ServerStep(10, means, {}, {}, None, None, None, None)

    compared = agreement(step({"queue": 105.0, "compute": 50.0, "batch_wait": 3.0}),
                         step({"queue": 100.0, "compute": 50.0}))  # fmt: skip
    assert compared == {"queue": (105.0, 100.0, pytest.approx(0.05)), "compute": (50.0, 50.0, 0.0)}


def vllm_snapshot(text: str, taken_s: float) -> Snapshot:
    builder = VllmSnapshotBuilder()
    for line in text.splitlines():
        builder.add(line)
    return builder.finish(taken_s)
