"""What the boards and the rules read of gpuscope: metric names, label names, phases.

No metric name, label name or phase is written in the builders as a string. Metric
names are those of the rows of gpuscope's contract, the leaf modules the exporter and the
worker serve from (``gpuscope.contract.exporter`` and ``gpuscope.contract.gpu``, which the
builders import as ``exporter_rows`` and ``gpu_rows``, and ``gpuscope.contract.worker``),
written into PromQL by ``series``; label names are ``gpuscope.contract.labels``'; phases
and compute stages are ``gpuscope.spans``'. So a renamed metric or a new phase changes
the generated boards and rules (and the tests that compare them with the committed files
fail until ``make pack``).

The label names the builders group and select by are declared once, each with the rows
that must carry it; a row that loses one fails the build with a ``LookupError`` naming
the row, and so does a phase the builders name that the span contract no longer has.
"""

from __future__ import annotations

from gpuscope import spans
from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract import labels as L
from gpuscope.contract import worker as worker_rows
from gpuscope.contract.rows import MetricDef, MetricType

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

SERVICE = label(L.SERVICE, *_REQUEST, exporter_rows.TOKENS)
MODEL = label(L.MODEL, *_REQUEST, exporter_rows.TOKENS)
ROUTE = label(L.ROUTE, exporter_rows.REQUEST_DURATION)
CODE = label(L.CODE, exporter_rows.REQUEST_DURATION)
DIRECTION = label(L.DIRECTION, exporter_rows.TOKENS)
PHASE = label(L.PHASE, exporter_rows.REQUEST_PHASE)
STAGE = label(L.STAGE, exporter_rows.REQUEST_COMPUTE_STAGE)
# The NVML index and the UUID of a GPU: the UUID is the join of requests and GPUs.
GPU_INDEX = label(L.GPU, *_REQUEST, *_PER_GPU)
UUID = label(L.UUID, *_REQUEST, *_PER_GPU)
REASON = label(
    L.REASON,
    gpu_rows.CLOCK_EVENT_ACTIVE,
    exporter_rows.SPANS_REJECTED,
    exporter_rows.OTLP_REQUESTS_REJECTED,
    exporter_rows.FORWARD_SPANS_DROPPED,
    exporter_rows.HTTP_CONNECTIONS_CLOSED,
)
CONNECTION_STATE = label(L.STATE, exporter_rows.HTTP_CONNECTIONS)
XID = label(L.XID, gpu_rows.XID_ERRORS)
ECC_TYPE = label(L.ECC_TYPE, gpu_rows.ECC_ERRORS)
COLLECTOR = label(L.COLLECTOR, gpu_rows.COLLECTOR_SUCCESS, gpu_rows.COLLECTOR_DURATION)
OVERFLOWED_METRIC = label(L.METRIC, exporter_rows.SERIES_OVERFLOW)
VERSION = label(L.VERSION, exporter_rows.BUILD_INFO)
# The stock spans' (spanmetrics-style) labels.
SERVICE_NAME = label(L.SERVICE_NAME, exporter_rows.SPAN_CALLS, exporter_rows.SPAN_DURATION)
SPAN_NAME = label(L.SPAN_NAME, exporter_rows.SPAN_CALLS, exporter_rows.SPAN_DURATION)
STATUS_CODE = label(L.STATUS_CODE, exporter_rows.SPAN_CALLS, exporter_rows.SPAN_DURATION)
# Which GPU source the exporter was asked for (``none`` when it runs without GPUs).
REQUESTED = label(L.REQUESTED, exporter_rows.GPU_SOURCE)
# A GPU's identity, its MIG parent, its compute mode, and its processes' NUMA side.
GPU_NAME = label(L.NAME, gpu_rows.INFO)
PCI_BUS_ID = label(L.PCI_BUS_ID, gpu_rows.INFO)
NUMA_NODE = label(L.NUMA_NODE, gpu_rows.INFO)
DRIVER_VERSION = label(L.DRIVER_VERSION, gpu_rows.INFO)
PARENT_UUID = label(L.PARENT_UUID, gpu_rows.MIG_INFO)
MIG_LABELS = tuple(
    label(name, gpu_rows.MIG_INFO)
    for name in (L.PARENT_GPU, L.PARENT_UUID, L.PROFILE, L.GPU_INSTANCE_ID, L.COMPUTE_INSTANCE_ID)
)
COMPUTE_MODE = label(L.MODE, gpu_rows.COMPUTE_MODE)
LOCALITY = label(L.LOCALITY, gpu_rows.PROCESS_NUMA_LOCALITY)
JOIN_STATUS = label(L.STATUS, gpu_rows.PROCESS_JOIN_STATUS)
# The reference worker's endpoint (completions, embeddings), on its request-state rows;
# the rules write it onto the engines' records of the same state.
ENDPOINT = label(L.ENDPOINT, *worker_rows.REQUEST_STATE)

# The reference worker's own /metrics (``gpuscope.contract.worker``): the sample names
# the boards and rules read (``pack/engines/vllm.py`` maps vLLM's engine state onto them).
WORKER_INFO = series(worker_rows.INFO)
WORKER_RUNNING = series(worker_rows.REQUESTS_RUNNING)
WORKER_WAITING = series(worker_rows.REQUESTS_WAITING)
WORKER_REQUESTS = series(worker_rows.REQUESTS)
WORKER_BATCH_ITERATIONS = series(worker_rows.BATCH_ITERATIONS)
WORKER_KV_USAGE = series(worker_rows.KV_CACHE_USAGE)
WORKER_KV_BLOCKS_USED = series(worker_rows.KV_CACHE_BLOCKS_USED)
WORKER_KV_BLOCKS = series(worker_rows.KV_CACHE_BLOCKS)
WORKER_PREEMPTIONS = series(worker_rows.PREEMPTIONS)
WORKER_MAX_BATCH_SIZE = series(worker_rows.MAX_BATCH_SIZE)
WORKER_MAX_QUEUE_DELAY = series(worker_rows.MAX_QUEUE_DELAY)
