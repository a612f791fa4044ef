"""``create_app``: the composition root, where the exporter's parts are built and wired.

The aggregator, the ingest thread, the GPU poller, the forwarder and the connection
guard are made here and handed to the HTTP side (``http.app.web_app``), which only
serves them: nothing in ``http/`` builds a part, and nothing in ``ingest/`` or
``state`` knows of HTTP. The GPU source is polled by its own thread (``GpuPoller``),
which hands the aggregator the device list whenever it changes; a scrape only reads
the poller's last snapshot. ``service`` runs the app.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence

from aiohttp import web
from prometheus_client.registry import CollectorRegistry

from gpuscope.connections import ConnectionGuard, ConnectionLimits
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.poller import STOP_JOIN_S, GpuPoller
from gpuscope.exporter.gpu.processes import ProcessGpuMap
from gpuscope.exporter.gpu.source import ComputeObserver, GpuSource
from gpuscope.exporter.http import connections
from gpuscope.exporter.http.app import web_app
from gpuscope.exporter.http.auth import AuthState
from gpuscope.exporter.http.security import Authenticator, WebConfig
from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.ingest.forward import OtlpForwarder
from gpuscope.exporter.ingest.memory import IngestMemory
from gpuscope.exporter.ingest.pipeline import Ingest
from gpuscope.exporter.self_metrics import ExporterCollector, SelfMetrics
from gpuscope.exporter.state import STATE, ExporterState


def create_app(
    config: ExporterConfig,
    *,
    gpu_source: GpuSource | None = None,
    compute_observers: Sequence[ComputeObserver] = (),
    web_config: WebConfig | None = None,
    bearer_token: str | None = None,
) -> web.Application:
    """Build the app; the GPU poller and forwarder start with it and stop on cleanup.

    ``gpu_source`` is owned by the app from here on (the poller closes it);
    ``compute_observers`` hear of every batch span ingested (the simulated source, when
    it is the source). TLS in ``web_config`` is applied by the listener, not here.
    """
    web_config = web_config or WebConfig()
    metrics = SelfMetrics()
    # pid -> GPUs its process tree holds, kept up to date by the GPU poller (if any), so
    # that spans naming only their process (vLLM's) are joined to their GPU.
    processes = ProcessGpuMap(require_auth=config.process_join_needs_auth)
    aggregator = SpanAggregator(
        max_series=config.max_series,
        max_models_per_service=config.max_models_per_service,
        max_label_length=config.max_label_length,
        compute_observers=compute_observers,
        uuids_for_pid=processes.uuids_for_claim,
    )
    limits = otlp.Limits(
        config.max_body_bytes,
        config.max_decompressed_bytes,
        config.max_spans_per_request,
        config.max_attributes_per_request,
        config.max_json_values_per_request,
    )
    registry = CollectorRegistry()
    forwarding = config.forward_otlp is not None
    in_use = "none" if gpu_source is None else gpu_source.name
    registry.register(
        ExporterCollector(
            aggregator,
            metrics,
            forwarding=forwarding,
            gpu_source=(str(config.gpu_source), str(in_use)),
        )
    )
    state = ExporterState(
        config=config,
        aggregator=aggregator,
        metrics=metrics,
        registry=registry,
        gpu_source=gpu_source,
        limits=limits,
        guard=ConnectionGuard(
            ConnectionLimits(
                config.max_connections,
                config.header_timeout_s,
                config.idle_timeout_s,
                config.write_timeout_s,
            ),
            logger=connections.log,
        ),
        ingest=Ingest(
            aggregator,
            limits,
            memory=IngestMemory(config.max_ingest_bytes),
            decode_cpu_s=config.max_decode_cpu_s,
        ),
    )
    app = web_app(state, AuthState(Authenticator(web_config.basic_auth_users, bearer_token)))
    app.cleanup_ctx.append(functools.partial(_gpu_poller, processes=processes))
    app.cleanup_ctx.append(_forwarder)
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _gpu_poller(app: web.Application, processes: ProcessGpuMap) -> AsyncIterator[None]:
    state = app[STATE]
    if state.gpu_source is None:
        yield
        return
    poller = GpuPoller(
        state.gpu_source,
        state.config.gpu_interval_s,
        processes=processes,
        deadline_s=state.config.gpu_poll_deadline_s,
        # the aggregator's uuid -> index map follows the source's device list, pushed
        # from the poller's thread when it changes (the map is replaced whole)
        on_devices=state.aggregator.set_gpu_devices,
    )
    collector = GpuCollector(poller, max_process_series=state.config.max_series)
    poller.start()
    state.registry.register(collector)
    state.poller = poller
    try:
        yield
    finally:
        state.registry.unregister(collector)
        # joins the thread (bounded: a call hung in the driver is left behind) and closes
        # the source, within half the shutdown timeout
        join_s = min(STOP_JOIN_S, state.config.shutdown_timeout_s / 2)
        await asyncio.to_thread(poller.stop, join_s)


async def _forwarder(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    url = state.config.forward_otlp
    if url is None:
        yield
        return
    forwarder = OtlpForwarder(
        url,
        queue_size=state.config.forward_queue,
        queue_bytes=state.config.forward_queue_bytes,
        timeout_s=state.config.forward_timeout_s,
        metrics=state.metrics,
    )
    await forwarder.start()
    state.forwarder = forwarder
    try:
        yield
    finally:
        await forwarder.stop(state.config.shutdown_timeout_s)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.started = True
    yield
    state.stopping = True
    state.ingest.close()
