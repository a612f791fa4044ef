"""The exporter's rows: the request side (fed from spans) and the exporter's own metrics.

``EXPORTER_METRICS`` below, each table in the order a scrape shows it; the GPU side's
rows are ``gpuscope.contract.gpu``. docs/exporter.md and docs/gpu.md list the same
families, and a test checks both against a golden list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gpuscope.contract import labels as L
from gpuscope.contract.rows import (
    BATCH_SIZE_BUCKETS,
    COUNTER,
    GAUGE,
    HISTOGRAM,
    LATENCY_BUCKETS,
    MetricDef,
)

# The pod of a request that names no GPU (``labels.OMIT_EMPTY``: absent when empty).
_POD = (L.NAMESPACE, L.POD)
_GPU = (L.SERVICE, L.MODEL, L.UUID, L.GPU, *_POD)
# The GenAI conventions key request metrics on gen_ai.operation.name too.
_OPERATION = (L.SERVICE, L.MODEL, L.OPERATION, L.UUID, L.GPU, *_POD)
# The spanmetrics connector's labels, plus the response status (see ``stock_spans``).
STOCK_SPAN_LABELS: Final = (
    L.SERVICE_NAME,
    L.SPAN_NAME,
    L.SPAN_KIND,
    L.STATUS_CODE,
    L.HTTP_STATUS_CODE,
    L.RPC_GRPC_STATUS_CODE,
)

REQUEST_DURATION = MetricDef(
    "gpuscope_request_duration_seconds",
    HISTOGRAM,
    "Request duration from arrival to the last body chunk, from server spans.",
    (L.SERVICE, L.MODEL, L.OPERATION, L.ROUTE, L.CODE, L.UUID, L.GPU, *_POD),
    LATENCY_BUCKETS,
)
REQUEST_PHASE = MetricDef(
    "gpuscope_request_phase_seconds",
    HISTOGRAM,
    "Time each request spent in each phase (preprocess, queue, batch_wait, ...).",
    (L.PHASE, *_GPU),
    LATENCY_BUCKETS,
)
REQUEST_COMPUTE_STAGE = MetricDef(
    "gpuscope_request_compute_stage_seconds",
    HISTOGRAM,
    "Time each request spent in each part of compute an engine reports (prefill, decode).",
    (L.STAGE, *_GPU),
    LATENCY_BUCKETS,
)
TIME_TO_FIRST_TOKEN = MetricDef(
    "gpuscope_time_to_first_token_seconds",
    HISTOGRAM,
    "Time from arrival to the first streamed chunk.",
    _OPERATION,
    LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = MetricDef(
    "gpuscope_time_per_output_token_seconds",
    HISTOGRAM,
    "Time per output token after the first one.",
    _OPERATION,
    LATENCY_BUCKETS,
)
BATCH_SIZE = MetricDef(
    "gpuscope_batch_size",
    HISTOGRAM,
    "Requests per batch execution, from gpuscope.batch spans.",
    _GPU,
    BATCH_SIZE_BUCKETS,
)
TOKENS = MetricDef(
    "gpuscope_tokens",
    COUNTER,
    "Tokens processed, by direction (input, output).",
    (L.DIRECTION, L.SERVICE, L.MODEL, L.OPERATION),
)
SPAN_CALLS = MetricDef(
    "gpuscope_span_calls",
    COUNTER,
    "SERVER spans from other instrumentation (not gpuscope's), spanmetrics-style.",
    STOCK_SPAN_LABELS,
)
SPAN_DURATION = MetricDef(
    "gpuscope_span_duration_seconds",
    HISTOGRAM,
    "Duration of SERVER spans from other instrumentation, spanmetrics-style.",
    STOCK_SPAN_LABELS,
    LATENCY_BUCKETS,
)
SERIES_OVERFLOW = MetricDef(
    "gpuscope_series_overflow",
    COUNTER,
    "Observations sent to a metric's overflow series, by reason: max_series (it hit "
    "--max-series) or max_models_per_service (its service hit --max-models-per-service).",
    (L.METRIC, L.REASON),
)
BUILD_INFO = MetricDef(
    "gpuscope_build_info", GAUGE, "gpuscope build; the value is always 1.", (L.VERSION,)
)
GPU_SOURCE = MetricDef(
    "gpuscope_gpu_source_info",
    GAUGE,
    "The GPU source in use (source: nvml, simulated or none) and the --gpu-source "
    "asked for (requested); the value is always 1.",
    (L.REQUESTED, L.SOURCE),
)
SPANS_RECEIVED = MetricDef(
    "gpuscope_spans_received", COUNTER, "Spans in decoded OTLP export requests."
)
SPANS_REJECTED = MetricDef(
    "gpuscope_spans_rejected",
    COUNTER,
    "Spans not aggregated because they broke the span contract, by reason.",
    (L.REASON,),
)
OTLP_REQUESTS_REJECTED = MetricDef(
    "gpuscope_otlp_requests_rejected",
    COUNTER,
    "OTLP export requests refused as a whole (nothing decoded), by reason.",
    (L.REASON,),
)
FORWARD_SPANS_SENT = MetricDef(
    "gpuscope_forward_spans_sent",
    COUNTER,
    "Spans forwarded to --forward-otlp and accepted there.",
)
FORWARD_SPANS_DROPPED = MetricDef(
    "gpuscope_forward_spans_dropped",
    COUNTER,
    "Spans not forwarded to --forward-otlp, by reason.",
    (L.REASON,),
)
WEB_CONFIG_RELOADS = MetricDef(
    "gpuscope_web_config_reloads",
    COUNTER,
    "Re-reads of --web-config-file and --bearer-token-file (on change or SIGHUP), by "
    "result (refused: the previous configuration stays).",
    (L.RESULT,),
)
HTTP_CONNECTIONS = MetricDef(
    "gpuscope_http_connections",
    GAUGE,
    "Client connections open now, by state (busy: a request is being handled).",
    (L.STATE,),
)
HTTP_CONNECTIONS_MAX = MetricDef(
    "gpuscope_http_connections_max",
    GAUGE,
    "Cap on open client connections (--max-connections, fitted to the fd limit).",
)
HTTP_CONNECTIONS_CLOSED = MetricDef(
    "gpuscope_http_connections_closed",
    COUNTER,
    "Client connections closed by the exporter, by reason.",
    (L.REASON,),
)

# The tables, grouped by what fills them and each in the order a scrape shows it:
# ``ExporterCollector`` yields the span counters and the self metrics, then
# ``connections.ConnectionCollector`` the connection families, then the GPU families
# (``gpu.GPU_METRICS``) and last the span histograms, which ``render`` writes.

# Fed from spans by ``SpanAggregator``: one capped family per row.
SPAN_COUNTERS: Final[Sequence[MetricDef]] = (TOKENS, SPAN_CALLS)
SPAN_HISTOGRAMS: Final[Sequence[MetricDef]] = (
    REQUEST_DURATION,
    REQUEST_PHASE,
    REQUEST_COMPUTE_STAGE,
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    BATCH_SIZE,
    SPAN_DURATION,
)
# What the exporter counts of itself (``metrics.SelfMetrics``); the forwarding rows only
# with --forward-otlp.
SELF_METRICS: Final[Sequence[MetricDef]] = (
    SERIES_OVERFLOW,
    BUILD_INFO,
    GPU_SOURCE,
    SPANS_RECEIVED,
    SPANS_REJECTED,
    OTLP_REQUESTS_REJECTED,
    FORWARD_SPANS_SENT,
    FORWARD_SPANS_DROPPED,
    WEB_CONFIG_RELOADS,
)
CONNECTION_METRICS: Final[Sequence[MetricDef]] = (
    HTTP_CONNECTIONS,
    HTTP_CONNECTIONS_MAX,
    HTTP_CONNECTIONS_CLOSED,
)
# Every family of the request side and of the exporter itself, in scrape order (with
# the GPU families between the connection families and the histograms).
EXPORTER_METRICS: Final[Sequence[MetricDef]] = (
    *SPAN_COUNTERS,
    *SELF_METRICS,
    *CONNECTION_METRICS,
    *SPAN_HISTOGRAMS,
)
