"""Triton Inference Server's own ``/metrics`` (with the TensorRT-LLM backend's families
where it serves one): its row of ``ENGINES``.
"""

from __future__ import annotations

from pack.contract import phase
from pack.engines.base import (
    DURATION_HISTOGRAM,
    END_TO_END,
    ERRORS,
    PHASE_HISTOGRAM,
    PHASE_TIMES,
    TIME_TO_FIRST_TOKEN,
    TTFT_HISTOGRAM,
    Capability,
    Engine,
    EngineTiming,
    Exposition,
    Release,
    histogram_samples,
)

TRITON = "triton"

# Triton Inference Server: src/metrics.cc registers the families (counters without a
# _total suffix, durations in microseconds), src/metric_model_reporter.cc gives every
# per-model series the labels model and version (plus gpu_uuid for a model instance on
# a GPU, namespace where model namespacing is on) and creates the latency counters by
# default, the first-response histogram with --metrics-config histogram_latencies=true
# and the summaries with summary_latencies=true; src/infer_stats.cc adds each request's
# durations to the counters when it succeeds (nv_inference_count by the request's batch
# size, nv_inference_exec_count once per model execution).
TRITON_RELEASE = Release(
    "Triton Inference Server",
    "26.05",
    "triton-inference-server/core",
    "release branch r26.05, commit e6fcb0c78e072672beab614384fd4f763c302134",
    (
        "src/metrics.cc",
        "src/metric_model_reporter.cc",
        "src/metric_model_reporter.h",
        "src/infer_stats.cc",
        "src/constants.h",
    ),
)
_TRITON_LABELS = ("model", "version")
_TRITON_OPTIONAL = ("gpu_uuid", "namespace")
TRITON_SUCCESS = "nv_inference_request_success"
TRITON_FAILURE = "nv_inference_request_failure"  # label reason
# + the request's batch size, per successful request (none for a cache hit)
TRITON_INFERENCES = "nv_inference_count"
# + 1 per model execution, failed or not (the backend reports each batch it ran)
TRITON_EXECUTIONS = "nv_inference_exec_count"
# requests that failed in a model execution: the backend reported them failed
# (src/infer_request.cc ReportStatistics); REJECTED and CANCELED ones never ran, and
# OTHER is mostly a pre-execution check (src/backend_model_instance.cc)
TRITON_EXECUTED_FAILURES = 'reason="BACKEND"'
TRITON_REQUEST_US = "nv_inference_request_duration_us"
TRITON_QUEUE_US = "nv_inference_queue_duration_us"
TRITON_COMPUTE_US = (
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
TRITON_PENDING = "nv_inference_pending_request_count"
TRITON_CACHE_HITS = "nv_cache_num_hits_per_model"  # only with the response cache on
TRITON_FIRST_RESPONSE_MS = "nv_inference_first_response_histogram_ms"  # optional
TRITON_SUMMARIES_US = (  # optional; quantiles over prometheus-cpp's sliding window
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)
# the default bounds of the first-response histogram, in ms (metric_model_reporter.h;
# a model's config may set others, which these rules cannot convert)
_TRITON_FIRST_RESPONSE_BOUNDS = ("100", "500", "2000", "5000")
# reasons of failure that are the server's (CANCELED is the client's)
TRITON_ERROR_REASONS = 'reason=~"REJECTED|BACKEND|OTHER"'

# The TensorRT-LLM backend of Triton (inflight_batcher_llm): per request it reports
# Triton's statistics like any backend (model_instance_state.cc reportBaseMetrics:
# TRITONBACKEND_ModelInstanceReportStatistics and a batch of 1 per request), so Triton's
# counters above hold its requests, queue and compute; it adds families of its own
# (custom_metrics_reporter.cc), gauges set from the executor's iteration statistics every
# stats_check_period_ms, each series labelled model, version and one label of its
# family's, and no gpu_uuid. The same tritonserver /metrics serves both: one source.
TRTLLM_BACKEND_RELEASE = Release(
    "TensorRT-LLM backend for Triton",
    "v0.19.0",
    "triton-inference-server/tensorrtllm_backend",
    "tag v0.19.0, commit c1e19638304d287f554f738c1411746555ed348c",
    (
        "inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc",
        "inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.h",
        "inflight_batcher_llm/src/model_instance_state.cc",
    ),
)
# request_type: active (the executor's active requests), max, scheduled (this
# iteration's batch), context (prefill requests in it), waiting (active - scheduled)
TRTLLM_BACKEND_REQUESTS = "nv_trt_llm_request_metrics"
# kv_cache_block_type: max, free, used, tokens_per, reused, fraction (used / max, 0-1)
TRTLLM_BACKEND_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
# inflight_batcher_specific_metric: total_context_tokens, generation_requests,
# micro_batch_id, paused_requests
TRTLLM_BACKEND_IFB = "nv_trt_llm_inflight_batcher_metrics"
# per request, its tokens (response_metric_type total_input_tokens, total_output_tokens)
TRTLLM_BACKEND_INPUT_TOKENS = "nv_llm_input_token_len"
TRTLLM_BACKEND_OUTPUT_TOKENS = "nv_llm_output_token_len"
# written by prometheus-cpp like Triton's own bounds (10.0 as 10)
_TRTLLM_BACKEND_TOKEN_BOUNDS = ("10", "50", "100", "500", "1000")
TRTLLM_BACKEND_RUNNING = TRTLLM_BACKEND_REQUESTS + '{request_type="scheduled"}'
TRTLLM_BACKEND_KV_USAGE = TRTLLM_BACKEND_KV_BLOCKS + '{kv_cache_block_type="fraction"}'

_triton_counter = Exposition("counter", _TRITON_LABELS, _TRITON_OPTIONAL)
TRITON_ENGINE = Engine(
    source=TRITON,
    name="Triton",
    prefix="nv_",
    # Triton serves any model through its ``infer`` endpoint
    endpoint="infer",
    # counters: phase and end-to-end means; TTFT only where the first-response
    # histogram is on (histogram_latencies=true); a mean batch size of its own series,
    # but no batch wait (its dynamic batcher's delay is inside queue)
    reports=frozenset({PHASE_TIMES, END_TO_END, ERRORS}),
    sometimes=frozenset({TIME_TO_FIRST_TOKEN}),
    release=TRITON_RELEASE,
    job_selector='job="triton"',
    model_label="model",
    exposition={
        **{
            name: _triton_counter
            for name in (
                TRITON_SUCCESS,
                TRITON_INFERENCES,
                TRITON_EXECUTIONS,
                TRITON_REQUEST_US,
                TRITON_QUEUE_US,
                *TRITON_COMPUTE_US,
                TRITON_CACHE_HITS,
            )
        },
        TRITON_FAILURE: Exposition("counter", (*_TRITON_LABELS, "reason"), _TRITON_OPTIONAL),
        TRITON_PENDING: Exposition("gauge", _TRITON_LABELS, _TRITON_OPTIONAL),
        TRITON_FIRST_RESPONSE_MS + "_bucket": Exposition(
            "histogram", (*_TRITON_LABELS, "le"), _TRITON_OPTIONAL, _TRITON_FIRST_RESPONSE_BOUNDS
        ),
        TRITON_FIRST_RESPONSE_MS + "_sum": _triton_counter,
        TRITON_FIRST_RESPONSE_MS + "_count": _triton_counter,
        **{
            name: Exposition("summary", (*_TRITON_LABELS, "quantile"), _TRITON_OPTIONAL)
            for name in TRITON_SUMMARIES_US
        },
        TRTLLM_BACKEND_REQUESTS: Exposition("gauge", (*_TRITON_LABELS, "request_type")),
        TRTLLM_BACKEND_KV_BLOCKS: Exposition("gauge", (*_TRITON_LABELS, "kv_cache_block_type")),
        TRTLLM_BACKEND_IFB: Exposition(
            "gauge", (*_TRITON_LABELS, "inflight_batcher_specific_metric")
        ),
        **{
            sample: shape
            for native in (TRTLLM_BACKEND_INPUT_TOKENS, TRTLLM_BACKEND_OUTPUT_TOKENS)
            for sample, shape in histogram_samples(
                native, (*_TRITON_LABELS, "response_metric_type"), _TRTLLM_BACKEND_TOKEN_BOUNDS
            ).items()
        },
    },
    timings=(
        # queue and request durations include requests answered from the response
        # cache, as nv_inference_request_success counts them
        EngineTiming(PHASE_HISTOGRAM, phase("queue"), (TRITON_QUEUE_US,), TRITON_SUCCESS, 1e6),
        # compute = input + infer + output, per successful request like queue: a
        # response-cache hit has none (only the misses add to these counters), so with
        # the cache on compute's mean is the misses' compute times their share, and the
        # phases add up to each request's time (src/infer_stats.cc: UpdateSuccessCacheHit
        # adds queue and request duration, no compute)
        EngineTiming(PHASE_HISTOGRAM, phase("compute"), TRITON_COMPUTE_US, TRITON_SUCCESS, 1e6),
        EngineTiming(DURATION_HISTOGRAM, "", (TRITON_REQUEST_US,), TRITON_SUCCESS, 1e6),
        # from the request's start to its first response (the first token of a
        # decoupled model); only with histogram_latencies=true
        EngineTiming(
            TTFT_HISTOGRAM,
            "",
            (TRITON_FIRST_RESPONSE_MS + "_sum",),
            TRITON_FIRST_RESPONSE_MS + "_count",
            1e3,
            bucket=TRITON_FIRST_RESPONSE_MS + "_bucket",
            bounds=_TRITON_FIRST_RESPONSE_BOUNDS,
        ),
    ),
    requests=(TRITON_SUCCESS, TRITON_FAILURE),
    errors=(TRITON_FAILURE, TRITON_ERROR_REASONS),
    # only a TensorRT-LLM model has these: the requests in the executor's batch, and the
    # fullest of its KV-cache pools
    running=TRTLLM_BACKEND_RUNNING,
    waiting=TRITON_PENDING,
    kv_usage=TRTLLM_BACKEND_KV_USAGE,
    capability=Capability(
        phases=(phase("queue"), phase("compute")),
        stages=(),
        ttft="first response, with --metrics-config histogram_latencies=true",
        tpot="",
        batch_size="mean: (nv_inference_count + failed executed requests) "
        "/ nv_inference_exec_count",
        kv_cache="TensorRT-LLM backend only: nv_trt_llm_kv_cache_block_metrics",
        gpu_join="by pod (with dcgm-exporter: the one GPU the pod holds), else per host",
        quantiles="means only from the counters; TTFT quantiles from the optional "
        "histogram; the optional summaries give per-phase quantiles of Triton's own "
        "(not mapped: compute's P99 is not the sum of its parts' P99s)",
    ),
    also=(TRTLLM_BACKEND_RELEASE,),
)
