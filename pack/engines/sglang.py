"""SGLang's own ``/metrics``: its row of ``ENGINES``."""

from __future__ import annotations

from pack.contract import phase
from pack.engines.base import (
    DURATION_HISTOGRAM,
    END_TO_END,
    PHASE_HISTOGRAM,
    PHASE_TIMES,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
    TPOT_HISTOGRAM,
    TTFT_HISTOGRAM,
    Capability,
    Engine,
    EngineTiming,
    Exposition,
    Release,
    histogram_samples,
)

SGLANG = "sglang"

# SGLang: python/sglang/srt/observability/metrics_collector.py (prometheus_client, so
# counters end in _total and bounds are written like 1.0). The tokenizer's histograms
# (TTFT, time per output token, end to end) and request counter carry model_name and
# engine_type (and is_streaming); the scheduler's queue time and gauges carry
# model_name, engine_type, tp_rank, pp_rank and moe_ep_rank (dp_rank under data
# parallelism, priority under priority scheduling), reported by the first rank of each
# attention tensor-parallel group.
SGLANG_RELEASE = Release(
    "SGLang",
    "0.5.23",
    "sgl-project/sglang",
    "release 0.5.23 (the PyPI wheel sglang==0.5.23)",
    ("python/sglang/srt/observability/metrics_collector.py",),
)
_SGLANG_TOKENIZER = ("model_name", "engine_type")
_SGLANG_SCHEDULER = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
_SGLANG_OPTIONAL = ("dp_rank", "priority")
SGLANG_QUEUE = "sglang:queue_time_seconds"  # waiting queue to the first forward
SGLANG_E2E = "sglang:e2e_request_latency_seconds"
SGLANG_TTFT = "sglang:time_to_first_token_seconds"
# (finished − first token) ÷ (completion tokens − 1): gpuscope's own definition
SGLANG_TPOT = "sglang:request_time_per_output_token_seconds"
SGLANG_REQUESTS = "sglang:num_requests_total"
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_WAITING = "sglang:num_queue_reqs"
SGLANG_TOKEN_USAGE = "sglang:token_usage"  # KV-cache pool tokens in use, 0-1
_SGLANG_QUEUE_BOUNDS = (
    "0.0", "0.001", "0.005", "0.01", "0.05", "0.1", "0.2", "0.5", "1.0", "2.0", "3.0",
    "4.0", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0", "60.0", "70.0", "80.0",
    "90.0", "100.0", "200.0", "300.0", "400.0", "500.0", "600.0", "700.0", "800.0",
    "900.0", "1000.0", "1200.0", "1400.0", "1600.0", "1800.0", "2000.0", "2500.0",
    "3000.0",
)  # fmt: skip
_SGLANG_E2E_BOUNDS = (
    "0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0", "8.0", "10.0", "20.0",
    "40.0", "60.0", "80.0", "100.0", "200.0", "400.0", "600.0", "1200.0", "1800.0",
    "2400.0",
)  # fmt: skip
_SGLANG_TTFT_BOUNDS = _SGLANG_E2E_BOUNDS[:18]  # 0.1 to 400
_SGLANG_TPOT_BOUNDS = (
    "0.002", "0.004", "0.006", "0.008", "0.01", "0.015", "0.02", "0.025", "0.03", "0.035",
    "0.04", "0.06", "0.08", "0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0",
    "8.0",
)  # fmt: skip
_STREAMING = (*_SGLANG_TOKENIZER, "is_streaming")

SGLANG_ENGINE = Engine(
    source=SGLANG,
    name="SGLang",
    prefix="sglang:",
    # no failures counted (aborts are mostly clients going away)
    reports=frozenset({PHASE_TIMES, END_TO_END, TIME_TO_FIRST_TOKEN, TIME_PER_OUTPUT_TOKEN}),
    release=SGLANG_RELEASE,
    job_selector='job="sglang"',
    model_label="model_name",
    exposition={
        **histogram_samples(SGLANG_QUEUE, _SGLANG_SCHEDULER, _SGLANG_QUEUE_BOUNDS),
        **histogram_samples(SGLANG_E2E, _STREAMING, _SGLANG_E2E_BOUNDS),
        **histogram_samples(SGLANG_TTFT, _STREAMING, _SGLANG_TTFT_BOUNDS),
        **histogram_samples(SGLANG_TPOT, _STREAMING, _SGLANG_TPOT_BOUNDS),
        SGLANG_REQUESTS: Exposition("counter", _STREAMING),
        **{
            gauge: Exposition("gauge", _SGLANG_SCHEDULER, _SGLANG_OPTIONAL)
            for gauge in (SGLANG_RUNNING, SGLANG_WAITING, SGLANG_TOKEN_USAGE)
        },
    },
    timings=(
        # SGLang's queue histogram is the only phase it measures per request; its bounds
        # are not mapped: with no buckets for the rest of the request, queue would be
        # the whole of the phases' P99 sum
        EngineTiming(
            PHASE_HISTOGRAM, phase("queue"), (SGLANG_QUEUE + "_sum",), SGLANG_QUEUE + "_count"
        ),
        # everything after the queue, end to end minus queue (means only): SGLang has no
        # per-request inference time; this includes tokenising and detokenising
        EngineTiming(
            PHASE_HISTOGRAM,
            phase("compute"),
            (SGLANG_E2E + "_sum",),
            SGLANG_E2E + "_count",
            minus_sums=(SGLANG_QUEUE + "_sum",),
        ),
        EngineTiming(
            DURATION_HISTOGRAM,
            "",
            (SGLANG_E2E + "_sum",),
            SGLANG_E2E + "_count",
            bucket=SGLANG_E2E + "_bucket",
            bounds=_SGLANG_E2E_BOUNDS,
        ),
        EngineTiming(
            TTFT_HISTOGRAM,
            "",
            (SGLANG_TTFT + "_sum",),
            SGLANG_TTFT + "_count",
            bucket=SGLANG_TTFT + "_bucket",
            bounds=_SGLANG_TTFT_BOUNDS,
        ),
        EngineTiming(
            TPOT_HISTOGRAM,
            "",
            (SGLANG_TPOT + "_sum",),
            SGLANG_TPOT + "_count",
            bucket=SGLANG_TPOT + "_bucket",
            bounds=_SGLANG_TPOT_BOUNDS,
        ),
    ),
    requests=(SGLANG_REQUESTS,),
    errors=("", ""),
    running=SGLANG_RUNNING,
    waiting=SGLANG_WAITING,
    kv_usage=SGLANG_TOKEN_USAGE,
    capability=Capability(
        phases=(phase("queue"), phase("compute")),
        stages=(),
        ttft="yes",
        tpot="yes",
        batch_size="",
        kv_cache="sglang:token_usage",
        gpu_join="by pod (with dcgm-exporter: the one GPU the pod holds), else per host",
        quantiles="request duration, TTFT and TPOT; phases means only",
    ),
)
