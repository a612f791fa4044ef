"""``ExporterState``: the parts the exporter is made of, shared by its HTTP side.

One per app, reached from a request through ``request.app[STATE]``. The composition
root (``gpuscope.exporter.app``) builds it: the aggregator, the ingest thread, the GPU
poller, the forwarder, the connection guard and the two flags of the exporter's life
(started, stopping). It does no work of its own. What belongs to HTTP alone (the
credentials checked and the pool that checks passwords) is kept by ``http.auth``, so
that this module, like ``ingest/``, knows nothing of the transport.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client.registry import CollectorRegistry

from gpuscope.connections import ConnectionGuard
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.source import GpuSource
from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.ingest.forward import OtlpForwarder
from gpuscope.exporter.ingest.pipeline import Ingest
from gpuscope.exporter.self_metrics import SelfMetrics


@dataclass
class ExporterState:
    """What the handlers share; one per app."""

    config: ExporterConfig
    aggregator: SpanAggregator
    metrics: SelfMetrics
    registry: CollectorRegistry
    gpu_source: GpuSource | None
    limits: otlp.Limits
    guard: ConnectionGuard
    ingest: Ingest
    # Set when the shutdown timeout has passed: bodies still uploading get a 503.
    drain_expired: asyncio.Event = field(default_factory=asyncio.Event)
    render_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    forwarder: OtlpForwarder | None = None
    poller: GpuPoller | None = None
    started: bool = False
    stopping: bool = False


STATE = web.AppKey("gpuscope_exporter_state", ExporterState)
