"""The whole span path: GpuscopeMiddleware + setup_tracing() -> exporter -> /metrics."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx

from gpuscope.exporter.service import RunningExporter
from gpuscope.middleware import BatchRecorder, GpuscopeMiddleware, current_timeline, setup_tracing
from gpuscope.middleware.types import Receive, Scope, Send
from support.exporter_fixtures import samples, scrape, value
from support.servers import run_uvicorn

REQUESTS = 6


async def test_middleware_spans_become_phase_histograms(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    provider = setup_tracing(
        running_exporter.url + "/v1/traces",
        service_name="e2e",
        schedule_delay_ms=50,
        set_global=False,
    )
    recorder = BatchRecorder(max_size=4, model="tiny", gpu_uuid="GPU-e2e", tracer_provider=provider)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        timeline = current_timeline()
        assert timeline is not None
        timeline.set_model("tiny")
        timeline.enqueued()
        batch = recorder.batch()
        batch.admit(timeline)
        with batch.compute(trigger="full"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    wrapped = GpuscopeMiddleware(app, tracer_provider=provider)

    def drive(base: str) -> None:
        with httpx.Client() as client:
            for _ in range(REQUESTS):
                assert client.post(base + "/v1/embeddings").status_code == 200
        assert provider.force_flush(10_000)

    try:
        with run_uvicorn(wrapped) as base:
            await asyncio.to_thread(drive, base)
    finally:
        await asyncio.to_thread(provider.shutdown)
    scraped = samples(await scrape(exporter_http, running_exporter))
    labels = {"service": "e2e", "model": "tiny", "uuid": "GPU-e2e", "gpu": ""}
    assert value(scraped, "gpuscope_request_duration_seconds_count", {**labels, "code": "200"}) == (
        REQUESTS
    )
    for phase in ("preprocess", "queue", "batch_wait", "compute", "postprocess"):
        count = value(scraped, "gpuscope_request_phase_seconds_count", {**labels, "phase": phase})
        assert count == REQUESTS, phase
    assert value(scraped, "gpuscope_batch_size_count", labels) == REQUESTS
    assert value(scraped, "gpuscope_batch_size_sum", labels) == REQUESTS  # batches of one
    # a server span per request, one batch span per batch: no phase children, which a
    # gpuscope exporter that does not forward says it drops (the phases are attributes)
    assert value(scraped, "gpuscope_spans_received_total") == REQUESTS * 2
    assert sum(s.value for s in scraped if s.name == "gpuscope_spans_rejected_total") == 0
