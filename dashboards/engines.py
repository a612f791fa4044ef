"""Where request timings come from, and how vLLM's own ``/metrics`` map onto gpuscope's.

One table for the recording rules (``alerts/recording.py`` imports it, as it does
``pcie.py``) and for what the boards say about each engine. A *source* is one path
the numbers take into Prometheus; the recording rules label every request-side
series with its source, so the same requests seen through two paths are never added
together:

- ``spans``: gpuscope's exporter, from spans (the middleware, the reference worker, or
  vLLM's ``llm_request`` span through the middleware bridge);
- ``vllm``: vLLM's own ``/metrics``, scraped by Prometheus; no gpuscope in the
  request path.

vLLM's series carry ``model_name`` and ``engine`` (its data-parallel rank); the rules
sum the engines, take ``model`` from ``model_name``, ``service`` from the scrape's
``job`` and ``host`` from its ``instance``. Bucket bounds are those of vLLM 0.32.0
(``tests/fixtures/vllm-0.32.0/metrics.txt``, which a test compares with this table).
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.contract import COMPUTE_STAGES, PHASE, PHASES, STAGE, phase, stage
from gpuscope.exporter import definitions as exporter_rows

SPANS = "spans"
VLLM = "vllm"
SOURCES = (SPANS, VLLM)

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

# The reference worker's own /metrics (``gpuscope.worker.metrics``, which has no table of
# rows; a test checks every name here against what the worker serves).
WORKER_INFO = "gpuscope_worker_info"
WORKER_RUNNING = "gpuscope_worker_requests_running"
WORKER_WAITING = "gpuscope_worker_requests_waiting"
WORKER_REQUESTS = "gpuscope_worker_requests_total"
WORKER_BATCH_ITERATIONS = "gpuscope_worker_batch_iterations_total"
WORKER_KV_USAGE = "gpuscope_worker_kv_cache_usage_ratio"
WORKER_KV_BLOCKS_USED = "gpuscope_worker_kv_cache_blocks_used"
WORKER_KV_BLOCKS = "gpuscope_worker_kv_cache_blocks"
WORKER_PREEMPTIONS = "gpuscope_worker_preemptions_total"
WORKER_MAX_BATCH_SIZE = "gpuscope_worker_max_batch_size"
WORKER_MAX_QUEUE_DELAY = "gpuscope_worker_max_queue_delay_seconds"

# vLLM's engine state, mapped onto the worker's recorded series.
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"  # 0-1, like gpuscope_worker_kv_cache_usage_ratio
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
# Requests the engine finished, by finished_reason (stop, length, abort, error, ...).
VLLM_FINISHED = "vllm:request_success_total"
VLLM_ERROR_REASON = 'finished_reason="error"'

# What each engine reports of gpuscope's phases, for the boards' notes.
ENGINE_PHASES = {
    "reference worker (spans)": PHASES,
    "vLLM (spans or /metrics)": (phase("queue"), phase("compute")),
}
ENGINE_STAGES = {
    "reference worker (spans)": (),
    "vLLM (spans or /metrics)": COMPUTE_STAGES,
}


def vllm_histograms_for(gpuscope: str) -> tuple[EngineHistogram, ...]:
    return tuple(h for h in (*VLLM_HISTOGRAMS, *VLLM_TOKEN_HISTOGRAMS) if h.gpuscope == gpuscope)


# What each source can report, one row per source: the boards read it so that a panel
# over something a source lacks says "not reported by this engine" instead of drawing
# nothing, and a new source adds a row here. ``REPORTS`` holds what every engine behind
# the source gives; ``SOMETIMES`` what only some do (spans: the reference worker
# reports compute whole, vLLM's span splits it into prefill and decode).
PHASE_TIMES = "phase times"
COMPUTE_SPLIT = "prefill and decode"
BATCHING = "batch size and batch wait"
END_TO_END = "end-to-end latency"
TIME_TO_FIRST_TOKEN = "time to first token"
TIME_PER_OUTPUT_TOKEN = "time per output token"
PROMPT_LENGTH = "prompt length"
GENERATION_LENGTH = "generation length"
FINISH_REASONS = "finish reasons"
ERRORS = "server errors"
CAPABILITIES = (
    PHASE_TIMES,
    COMPUTE_SPLIT,
    BATCHING,
    END_TO_END,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    PROMPT_LENGTH,
    GENERATION_LENGTH,
    FINISH_REASONS,
    ERRORS,
)
_COMMON = frozenset({PHASE_TIMES, END_TO_END, TIME_TO_FIRST_TOKEN, TIME_PER_OUTPUT_TOKEN, ERRORS})


@dataclass(frozen=True)
class SourceCapabilities:
    reports: frozenset[str]
    sometimes: frozenset[str] = frozenset()


SOURCE_CAPABILITIES = {
    # no per-request token histograms and no finish reasons: spans give token counts
    # (gpuscope_tokens_total) and no finish reason as a metric label
    # (the reference worker batches and reports compute whole; vLLM's span splits
    # compute and has no batch of its own)
    SPANS: SourceCapabilities(_COMMON, frozenset({COMPUTE_SPLIT, BATCHING})),
    # no batch wait or batch size: continuous batching admits into the running batch
    VLLM: SourceCapabilities(
        _COMMON | {COMPUTE_SPLIT, PROMPT_LENGTH, GENERATION_LENGTH, FINISH_REASONS}
    ),
}
NO_TRAFFIC = "No traffic"


def reported_by(capability: str, source: str) -> bool:
    """Whether every engine behind ``source`` reports ``capability``."""
    if capability not in CAPABILITIES:
        raise LookupError(f"the boards name capability {capability!r}, not in {CAPABILITIES}")
    return capability in SOURCE_CAPABILITIES[source].reports


def not_reported(capability: str, sources: tuple[str, ...] = SOURCES) -> str:
    """What a panel over ``capability`` says when it has no data: "No traffic" where
    every one of ``sources`` reports it, else that this engine may not report it,
    naming the sources that do not (or not always)."""
    lacking = [source for source in sources if not reported_by(capability, source)]
    if not lacking:
        return NO_TRAFFIC
    return f"Not reported by this engine ({', '.join(lacking)}), or no traffic"


def capabilities_note() -> str:
    """Markdown: what each source reports, from the table."""
    lines = []
    for source, row in SOURCE_CAPABILITIES.items():
        sometimes = [c for c in CAPABILITIES if c in row.sometimes]
        lacking = [c for c in CAPABILITIES if c not in row.reports | row.sometimes]
        lines.append(
            f"- `{source}`: {', '.join(c for c in CAPABILITIES if c in row.reports)}"
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
        "the reference worker, or vLLM's `llm_request` span) or `vllm` (vLLM's own "
        "`/metrics`, no gpuscope in the request path). Panels over the recording rules "
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
        "Requests that name no GPU (vLLM's `/metrics` never does) are judged against "
        "every GPU of their host (GPU `all`).",
    ]
    return "\n".join(lines)
