"""The reference worker's rows: its own ``/metrics`` (``gpuscope.worker.metrics``, in
the order a scrape shows them after the connection families).

The pack's boards and rules read the worker's engine state from these (``pack/engines/vllm.py``
maps vLLM's onto them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gpuscope.contract import labels as L
from gpuscope.contract.rows import COUNTER, GAUGE, PREFIX, MetricDef

WORKER_PREFIX: Final = PREFIX + "worker_"

INFO = MetricDef(
    WORKER_PREFIX + "info",
    GAUGE,
    "The worker's model and batching mode.",
    (L.MODEL, L.BATCHING),
)
MAX_BATCH_SIZE = MetricDef(
    WORKER_PREFIX + "max_batch_size",
    GAUGE,
    "Configured requests per batch (sequences per iteration under continuous).",
)
MAX_QUEUE_DELAY = MetricDef(
    WORKER_PREFIX + "max_queue_delay_seconds",
    GAUGE,
    "Configured window a forming batch waits to fill (dynamic batching).",
)
MAX_QUEUE_REQUESTS = MetricDef(
    WORKER_PREFIX + "max_queue_requests",
    GAUGE,
    "Configured queue length beyond which requests get 429.",
)
REQUESTS_RUNNING = MetricDef(
    WORKER_PREFIX + "requests_running",
    GAUGE,
    "Requests in the batch on the device.",
    (L.ENDPOINT,),
)
REQUESTS_WAITING = MetricDef(
    WORKER_PREFIX + "requests_waiting",
    GAUGE,
    "Requests waiting for a batch (queued, or preempted).",
    (L.ENDPOINT,),
)
BATCH_ITERATIONS = MetricDef(
    WORKER_PREFIX + "batch_iterations",
    COUNTER,
    "Model calls: one per batch (embeddings), one per step (generation).",
    (L.ENDPOINT,),
)
REQUESTS = MetricDef(
    WORKER_PREFIX + "requests",
    COUNTER,
    "Requests by outcome: completed, rejected_queue_full, timed_out, cancelled, failed.",
    (L.ENDPOINT, L.OUTCOME),
)
KV_CACHE_BLOCKS_USED = MetricDef(
    WORKER_PREFIX + "kv_cache_blocks_used", GAUGE, "KV-cache blocks held by sequences."
)
KV_CACHE_BLOCKS = MetricDef(
    WORKER_PREFIX + "kv_cache_blocks", GAUGE, "KV-cache blocks in the pool, used or free."
)
KV_CACHE_USAGE = MetricDef(
    WORKER_PREFIX + "kv_cache_usage_ratio",
    GAUGE,
    "Share of the KV-cache pool's blocks in use (0-1).",
)
PREEMPTIONS = MetricDef(
    WORKER_PREFIX + "preemptions",
    COUNTER,
    "Running sequences evicted (to be recomputed) because the KV cache ran out.",
)
TELEMETRY_EVENTS = MetricDef(
    WORKER_PREFIX + "telemetry_events",
    COUNTER,
    "The gpuscope middleware's own counters (spans exported, dropped, failed, …).",
    (L.KIND,),
)
HTTP_CONNECTIONS = MetricDef(
    WORKER_PREFIX + "http_connections",
    GAUGE,
    "Client connections open now, by state (busy: a request is being handled).",
    (L.STATE,),
)
HTTP_CONNECTIONS_MAX = MetricDef(
    WORKER_PREFIX + "http_connections_max",
    GAUGE,
    "Cap on open client connections (--max-connections, fitted to the fd limit).",
)
HTTP_CONNECTIONS_CLOSED = MetricDef(
    WORKER_PREFIX + "http_connections_closed",
    COUNTER,
    "Client connections closed by the worker's limits, by reason.",
    (L.REASON,),
)

CONNECTION_METRICS: Final[Sequence[MetricDef]] = (
    HTTP_CONNECTIONS,
    HTTP_CONNECTIONS_MAX,
    HTTP_CONNECTIONS_CLOSED,
)
# Read at every scrape from the schedulers' state.
CONFIGURATION: Final[Sequence[MetricDef]] = (
    INFO,
    MAX_BATCH_SIZE,
    MAX_QUEUE_DELAY,
    MAX_QUEUE_REQUESTS,
)
REQUEST_STATE: Final[Sequence[MetricDef]] = (
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    BATCH_ITERATIONS,
    REQUESTS,
)
# Only with continuous batching (the generation scheduler's KV cache).
KV_CACHE: Final[Sequence[MetricDef]] = (
    KV_CACHE_BLOCKS_USED,
    KV_CACHE_BLOCKS,
    KV_CACHE_USAGE,
    PREEMPTIONS,
)
# Every family of the worker's /metrics, in scrape order.
WORKER_METRICS: Final[Sequence[MetricDef]] = (
    *CONNECTION_METRICS,
    *CONFIGURATION,
    *REQUEST_STATE,
    *KV_CACHE,
    TELEMETRY_EVENTS,
)
