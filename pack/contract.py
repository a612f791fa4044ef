"""What the boards and the rules read of gpuscope: metric names, label names, phases.

No metric name or phase is written in the builders as a string. Metric names are
those of the rows the exporter serves from (``gpuscope.exporter.definitions`` and
``gpuscope.exporter.gpu.definitions``, which the builders import as ``exporter_rows`` and
``gpu_rows``), written into PromQL by ``series``; phases and compute stages are
``gpuscope.spans``'. So a renamed metric or a new phase changes the generated boards
and rules (and the tests that compare them with the committed files fail until
``make rules dashboards``).

The label names the builders group and select by are declared once, each with the rows
that must carry it; a row that loses one fails the build with a ``LookupError`` naming
the row, and so does a phase the builders name that the span contract no longer has.
"""

from __future__ import annotations

from gpuscope import spans
from gpuscope.exporter import definitions as exporter_rows
from gpuscope.exporter.definitions import MetricDef, MetricType
from gpuscope.exporter.gpu import definitions as gpu_rows

PHASES = spans.PHASES
COMPUTE_STAGES = spans.COMPUTE_STAGES


def series(row: MetricDef, suffix: str = "") -> str:
    """The name of ``row``'s samples in PromQL: a counter's ``_total``, or a histogram's
    ``bucket``, ``sum`` or ``count`` (``suffix``)."""
    if row.type is MetricType.HISTOGRAM:
        if suffix not in ("bucket", "sum", "count"):
            raise ValueError(f"{row.name} is a histogram: bucket, sum or count, not {suffix!r}")
        return f"{row.name}_{suffix}"
    if suffix:
        raise ValueError(f"{row.name} is a {row.type}: its samples have no {suffix!r}")
    return row.sample_name


def phase(name: str) -> str:
    """``name``, a phase of the span contract that the builders name."""
    if name not in PHASES:
        raise LookupError(f"the boards and rules name phase {name!r}, not in {PHASES}")
    return name


def stage(name: str) -> str:
    """``name``, a compute stage of the span contract that the builders name."""
    if name not in COMPUTE_STAGES:
        raise LookupError(f"the boards and rules name stage {name!r}, not in {COMPUTE_STAGES}")
    return name


def label(name: str, *rows: MetricDef) -> str:
    """``name``, a label the builders select or group ``rows`` by."""
    missing = [row.name for row in rows if name not in row.labels]
    if missing:
        raise LookupError(f"the boards and rules read label {name!r} of {missing}, which lack it")
    return name


# Request histograms keyed by service, model and GPU (all but the stock spans').
_REQUEST = (
    exporter_rows.REQUEST_DURATION,
    exporter_rows.REQUEST_PHASE,
    exporter_rows.REQUEST_COMPUTE_STAGE,
    exporter_rows.TIME_TO_FIRST_TOKEN,
    exporter_rows.TIME_PER_OUTPUT_TOKEN,
    exporter_rows.BATCH_SIZE,
)
# Every GPU family but the process join's and the collector's: one series per GPU.
_PER_GPU = (
    gpu_rows.INFO,
    gpu_rows.UP,
    *gpu_rows.PER_GPU,
    gpu_rows.CLOCK_EVENT_ACTIVE,
    gpu_rows.XID_EVENTS,
    gpu_rows.XID_ERRORS,
    gpu_rows.ECC_ERRORS,
)

SERVICE = label("service", *_REQUEST, exporter_rows.TOKENS)
MODEL = label("model", *_REQUEST, exporter_rows.TOKENS)
ROUTE = label("route", exporter_rows.REQUEST_DURATION)
CODE = label("code", exporter_rows.REQUEST_DURATION)
DIRECTION = label("direction", exporter_rows.TOKENS)
PHASE = label("phase", exporter_rows.REQUEST_PHASE)
STAGE = label("stage", exporter_rows.REQUEST_COMPUTE_STAGE)
# The NVML index and the UUID of a GPU: the UUID is the join of requests and GPUs.
GPU_INDEX = label("gpu", *_REQUEST, *_PER_GPU)
UUID = label("uuid", *_REQUEST, *_PER_GPU)
REASON = label(
    "reason",
    gpu_rows.CLOCK_EVENT_ACTIVE,
    exporter_rows.SPANS_REJECTED,
    exporter_rows.OTLP_REQUESTS_REJECTED,
    exporter_rows.FORWARD_SPANS_DROPPED,
    exporter_rows.HTTP_CONNECTIONS_CLOSED,
)
CONNECTION_STATE = label("state", exporter_rows.HTTP_CONNECTIONS)
XID = label("xid", gpu_rows.XID_ERRORS)
ECC_TYPE = label("type", gpu_rows.ECC_ERRORS)
COLLECTOR = label("collector", gpu_rows.COLLECTOR_SUCCESS, gpu_rows.COLLECTOR_DURATION)
OVERFLOWED_METRIC = label("metric", exporter_rows.SERIES_OVERFLOW)
VERSION = label("version", exporter_rows.BUILD_INFO)
