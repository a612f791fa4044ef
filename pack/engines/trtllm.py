"""TensorRT-LLM's ``trtllm-serve`` and its own ``/prometheus/metrics``: its row of
``ENGINES``. (TensorRT-LLM served by Triton's backend is Triton's row: ``triton.py``.)
"""

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
from pack.engines.vllm import VLLM_REQUEST_BUCKETS, VLLM_TPOT_BUCKETS, VLLM_TTFT_BUCKETS

TRTLLM = "trtllm"

# TensorRT-LLM's trtllm-serve: tensorrt_llm/metrics/collector.py (prometheus_client, so
# counters end in _total and bounds are written like 1.0), created by
# tensorrt_llm/serve/openai_server.py only when the LLM API options set
# return_perf_metrics: true, with the labels model_name and engine_type both
# "undefined", and served on /prometheus/metrics (its /metrics is JSON iteration
# statistics) from prometheus_client's multiprocess directory, so gauges carry pid.
# Per request: the success counter (label finished_reason) and the histograms, each
# observed only when its value is not 0; per iteration (enable_iter_perf_stats): the KV
# cache gauges. The families mapped here are the same (names, labels, bounds) in both
# versions of the collector read, an older one and this; the newer adds others (prefill,
# decode and inference times, running and waiting gauges, an error counter), not mapped.
# No release's collector.py could be read (1.2.1 is commit 376f7e1b, the 1.3.0rc11 and rc12
# pre-releases 4e69c14f and 61cef212: none reachable); by every account the releases up
# to 1.2.1 serve these families without the trtllm_ prefix and have no KV-cache gauge
# (docs/engines/tensorrt-llm.md says how that was established and what main changed).
TRTLLM_RELEASE = Release(
    "TensorRT-LLM trtllm-serve",
    "main at 050f80de",
    "NVIDIA/TensorRT-LLM",
    "main, collector.py at commit 050f80def8df236e326949c8bd9dee10fd896a83, "
    "openai_server.py at commit 00057725d9a6591f033e44f31c219e2426827bb7",
    ("tensorrt_llm/metrics/collector.py", "tensorrt_llm/serve/openai_server.py"),
)
_TRTLLM_LABELS = ("model_name", "engine_type")
TRTLLM_SUCCESS = "trtllm_request_success_total"  # label finished_reason
TRTLLM_E2E = "trtllm_e2e_request_latency_seconds"
TRTLLM_TTFT = "trtllm_time_to_first_token_seconds"
TRTLLM_TPOT = "trtllm_time_per_output_token_seconds"
TRTLLM_QUEUE = "trtllm_request_queue_time_seconds"  # arrival to first scheduled
TRTLLM_KV_USAGE = "trtllm_kv_cache_utilization"  # used / max blocks, 0-1
TRTLLM_KV_HIT_RATE = "trtllm_kv_cache_hit_rate"
# vLLM's bounds (the collector is adapted from vLLM's)
_TRTLLM_E2E_BOUNDS = VLLM_REQUEST_BUCKETS
_TRTLLM_TTFT_BOUNDS = VLLM_TTFT_BUCKETS
_TRTLLM_TPOT_BOUNDS = VLLM_TPOT_BUCKETS


def _trtllm_histogram(
    native: str, gpuscope: str, bounds: tuple[str, ...], key_value: str = ""
) -> EngineTiming:
    return EngineTiming(
        gpuscope,
        key_value,
        (native + "_sum",),
        native + "_count",
        bucket=native + "_bucket",
        bounds=bounds,
    )


TRTLLM_ENGINE = Engine(
    source=TRTLLM,
    name="TensorRT-LLM",
    prefix="trtllm_",
    # finish reasons are a label of the success counter, which the rules add up; the
    # collector's error counter is not in every release (not mapped)
    reports=frozenset({PHASE_TIMES, END_TO_END, TIME_TO_FIRST_TOKEN, TIME_PER_OUTPUT_TOKEN}),
    release=TRTLLM_RELEASE,
    job_selector='job="trtllm"',
    # model_name is "undefined" on every series: the model is a label of the scrape
    model_label="",
    exposition={
        **histogram_samples(TRTLLM_E2E, _TRTLLM_LABELS, _TRTLLM_E2E_BOUNDS),
        **histogram_samples(TRTLLM_TTFT, _TRTLLM_LABELS, _TRTLLM_TTFT_BOUNDS),
        **histogram_samples(TRTLLM_TPOT, _TRTLLM_LABELS, _TRTLLM_TPOT_BOUNDS),
        **histogram_samples(TRTLLM_QUEUE, _TRTLLM_LABELS, VLLM_REQUEST_BUCKETS),
        TRTLLM_SUCCESS: Exposition("counter", (*_TRTLLM_LABELS, "finished_reason")),
        **{
            gauge: Exposition("gauge", (*_TRTLLM_LABELS, "pid"))
            for gauge in (TRTLLM_KV_USAGE, TRTLLM_KV_HIT_RATE)
        },
    },
    timings=(
        # queue's buckets start at 0.3 s and nothing else of the request has phase
        # buckets: means only, as SGLang's
        EngineTiming(
            PHASE_HISTOGRAM, phase("queue"), (TRTLLM_QUEUE + "_sum",), TRTLLM_QUEUE + "_count"
        ),
        # everything after the queue (means): end to end minus queue
        EngineTiming(
            PHASE_HISTOGRAM,
            phase("compute"),
            (TRTLLM_E2E + "_sum",),
            TRTLLM_E2E + "_count",
            minus_sums=(TRTLLM_QUEUE + "_sum",),
        ),
        _trtllm_histogram(TRTLLM_E2E, DURATION_HISTOGRAM, _TRTLLM_E2E_BOUNDS),
        _trtllm_histogram(TRTLLM_TTFT, TTFT_HISTOGRAM, _TRTLLM_TTFT_BOUNDS),
        _trtllm_histogram(TRTLLM_TPOT, TPOT_HISTOGRAM, _TRTLLM_TPOT_BOUNDS),
    ),
    requests=(TRTLLM_SUCCESS,),
    errors=("", ""),
    running="",
    waiting="",
    kv_usage=TRTLLM_KV_USAGE,
    capability=Capability(
        phases=(phase("queue"), phase("compute")),
        stages=(),
        ttft="yes",
        tpot="yes",
        batch_size="",
        kv_cache="trtllm_kv_cache_utilization",
        gpu_join="by pod (with dcgm-exporter: the one GPU the pod holds), else per host",
        quantiles="request duration, TTFT and TPOT (vLLM's buckets); phases means only",
    ),
    page="tensorrt-llm.md",
)
