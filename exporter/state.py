"""``ExporterState``: what the request handlers, the middlewares and the reload task share.

One per app, reached from a request through ``request.app[STATE]``. It holds the parts
built at start-up (aggregator, ingest thread, GPU poller, authenticator, connection
guard) and the two flags of the exporter's life (started, stopping); it does no work of
its own beyond keeping the aggregator's GPU index map in step with the poller.
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
from gpuscope.exporter.http.security import Authenticator
from gpuscope.exporter.http.threads import ThreadPool
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
    authenticator: Authenticator
    gpu_source: GpuSource | None
    limits: otlp.Limits
    guard: ConnectionGuard
    password_checks: ThreadPool
    ingest: Ingest
    # Set when the shutdown timeout has passed: bodies still uploading get a 503.
    drain_expired: asyncio.Event = field(default_factory=asyncio.Event)
    render_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    forwarder: OtlpForwarder | None = None
    poller: GpuPoller | None = None
    started: bool = False
    stopping: bool = False
    _devices: object = field(default=None, repr=False)

    def refresh_gpu_devices(self) -> None:
        """Keep the aggregator's uuid -> index map in step with the poller's device list."""
        if self.poller is None:
            return
        devices = self.poller.devices()
        if devices is not self._devices:
            self._devices = devices
            self.aggregator.set_gpu_devices(devices)


STATE = web.AppKey("gpuscope_exporter_state", ExporterState)
