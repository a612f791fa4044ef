"""What a metric is: one ``MetricDef`` row (name, type, help, labels) per family.

Registration and rendering follow from the rows: the hot-path families
(``HistogramFamily``, ``CounterFamily``) are built from them, so are the
prometheus_client families of a scrape (``MetricDef.family``), and the OpenMetrics
``# UNIT`` of a family is the unit its name ends with (``unit_of``). The rows of the
request side and the exporter's own metrics are ``EXPORTER_METRICS`` below; the GPU
side's are ``gpuscope.exporter.gpu.definitions.GPU_METRICS``. docs/exporter.md and
docs/gpu.md list the same families, and a test checks both against a golden list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuscope.exporter.ingest.series import (
    BATCH_SIZE_BUCKETS,
    LATENCY_BUCKETS,
    CounterFamily,
    HistogramFamily,
    ModelCap,
)


class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# Base units that gpuscope's metric names end with; OpenMetrics' ``# UNIT`` line names
# the suffix (Prometheus refuses a unit that is not one).
UNITS: Final = ("seconds", "bytes", "joules", "hertz", "watts", "celsius", "ratio")


def unit_of(name: str) -> str:
    """The unit suffix of a metric name (``_total`` aside), or "" for none."""
    base = name.removesuffix("_total")
    return next((unit for unit in UNITS if base.endswith("_" + unit)), "")


@dataclass(frozen=True)
class MetricDef:
    """One metric family. ``name`` is without ``_total`` (counters get it on output);
    ``buckets`` only for histograms; ``field`` names the ``GpuReading`` attribute of a
    plain per-GPU metric (GPU side only)."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    field: str = ""

    @property
    def unit(self) -> str:
        return unit_of(self.name)

    @property
    def sample_name(self) -> str:
        """The name its samples carry (``_total`` for counters; histograms add suffixes)."""
        return self.name + "_total" if self.type is MetricType.COUNTER else self.name

    def family(self) -> CounterMetricFamily | GaugeMetricFamily:
        """An empty prometheus_client family of this counter or gauge, for one scrape
        (histograms are written by ``render``, from ``histogram``'s series)."""
        labels = list(self.labels)
        if self.type is MetricType.COUNTER:
            return CounterMetricFamily(self.name, self.help, labels=labels)
        assert self.type is MetricType.GAUGE, self.name
        return GaugeMetricFamily(self.name, self.help, labels=labels)

    def one_value(self, value: float) -> Metric:
        """The family with its one unlabelled sample."""
        family = self.family()
        family.add_metric([], value)
        return family

    def histogram(self, max_series: int, model_cap: ModelCap | None = None) -> HistogramFamily:
        """The capped hot-path histogram of this metric (its models capped per service by
        ``model_cap`` when it has ``service`` and ``model`` labels)."""
        assert self.type is MetricType.HISTOGRAM, self.name
        return HistogramFamily(
            self.name, self.help, self.labels, self.buckets, max_series, model_cap=model_cap
        )

    def counter(self, max_series: int, model_cap: ModelCap | None = None) -> CounterFamily:
        """The capped hot-path counter of this metric (``model_cap`` as for histograms)."""
        assert self.type is MetricType.COUNTER, self.name
        return CounterFamily(self.name, self.help, self.labels, max_series, model_cap=model_cap)


COUNTER, GAUGE, HISTOGRAM = MetricType.COUNTER, MetricType.GAUGE, MetricType.HISTOGRAM
_GPU = ("service", "model", "uuid", "gpu")
# The GenAI conventions key request metrics on gen_ai.operation.name too.
_OPERATION = ("service", "model", "operation", "uuid", "gpu")
# The spanmetrics connector's labels, plus the response status (see ``stock_spans``).
STOCK_SPAN_LABELS: Final = (
    "service_name",
    "span_name",
    "span_kind",
    "status_code",
    "http_status_code",
    "rpc_grpc_status_code",
)

REQUEST_DURATION = MetricDef(
    "gpuscope_request_duration_seconds",
    HISTOGRAM,
    "Request duration from arrival to the last body chunk, from server spans.",
    ("service", "model", "operation", "route", "code", "uuid", "gpu"),
    LATENCY_BUCKETS,
)
REQUEST_PHASE = MetricDef(
    "gpuscope_request_phase_seconds",
    HISTOGRAM,
    "Time each request spent in each phase (preprocess, queue, batch_wait, ...).",
    ("phase", *_GPU),
    LATENCY_BUCKETS,
)
REQUEST_COMPUTE_STAGE = MetricDef(
    "gpuscope_request_compute_stage_seconds",
    HISTOGRAM,
    "Time each request spent in each part of compute an engine reports (prefill, decode).",
    ("stage", *_GPU),
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
    ("direction", "service", "model", "operation"),
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
    ("metric", "reason"),
)
BUILD_INFO = MetricDef(
    "gpuscope_build_info", GAUGE, "gpuscope build; the value is always 1.", ("version",)
)
GPU_SOURCE = MetricDef(
    "gpuscope_gpu_source_info",
    GAUGE,
    "The GPU source in use (source: nvml, simulated or none) and the --gpu-source "
    "asked for (requested); the value is always 1.",
    ("requested", "source"),
)
SPANS_RECEIVED = MetricDef(
    "gpuscope_spans_received", COUNTER, "Spans in decoded OTLP export requests."
)
SPANS_REJECTED = MetricDef(
    "gpuscope_spans_rejected",
    COUNTER,
    "Spans not aggregated because they broke the span contract, by reason.",
    ("reason",),
)
OTLP_REQUESTS_REJECTED = MetricDef(
    "gpuscope_otlp_requests_rejected",
    COUNTER,
    "OTLP export requests refused as a whole (nothing decoded), by reason.",
    ("reason",),
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
    ("reason",),
)
WEB_CONFIG_RELOADS = MetricDef(
    "gpuscope_web_config_reloads",
    COUNTER,
    "Re-reads of --web-config-file and --bearer-token-file (on change or SIGHUP), by "
    "result (refused: the previous configuration stays).",
    ("result",),
)
HTTP_CONNECTIONS = MetricDef(
    "gpuscope_http_connections",
    GAUGE,
    "Client connections open now, by state (busy: a request is being handled).",
    ("state",),
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
    ("reason",),
)

# The tables, grouped by what fills them and each in the order a scrape shows it:
# ``ExporterCollector`` yields the span counters and the self metrics, then
# ``connections.ConnectionCollector`` the connection families, then the GPU families
# (``gpu.definitions.GPU_METRICS``) and last the span histograms, which ``render`` writes.

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
