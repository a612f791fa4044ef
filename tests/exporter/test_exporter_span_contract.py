"""Each consumed span attribute, end to end: the real middleware and BatchRecorder,
``setup_tracing()`` exporting OTLP to a real exporter on 127.0.0.1, then ``/metrics``.

Requests are driven in-process with hand-written ASGI messages, so that failure
paths (client disconnect, app exception, unsampled parent) are exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.samples import Sample

from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.middleware import (
    BatchRecorder,
    GpuscopeMiddleware,
    RequestTimeline,
    current_timeline,
    setup_tracing,
)
from gpuscope.middleware.types import Message, Receive, Scope, Send
from support.exporter_fixtures import FakeGpuSource, loopback_config, samples, scrape, value
from support.middleware_asgi import call, http_scope

UUID = "GPU-bbbb"  # index 1 of FakeGpuSource


@pytest.fixture
async def gpu_exporter() -> AsyncIterator[RunningExporter]:
    running = await start_exporter(loopback_config(gpu_interval_s=0.05), gpu_source=FakeGpuSource())
    try:
        yield running
    finally:
        await running.stop()


def tracing_to(exporter: RunningExporter) -> TracerProvider:
    return setup_tracing(
        exporter.url + "/v1/traces",
        service_name="resource-service",
        schedule_delay_ms=20,
        set_global=False,
    )


async def flush_and_scrape(
    provider: TracerProvider, exporter: RunningExporter, session: aiohttp.ClientSession
) -> list[Sample]:
    assert await asyncio.to_thread(provider.force_flush, 10_000)
    await asyncio.to_thread(provider.shutdown)
    return samples(await scrape(session, exporter))


def no_rejects(scraped: list[Sample]) -> None:
    rejected = {s.labels["reason"]: s.value for s in scraped if s.name.endswith("rejected_total")}
    assert not any(rejected.values()), rejected


async def test_service_name_gpu_join_streaming_and_tokens_reach_metrics(
    gpu_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    provider = tracing_to(gpu_exporter)
    recorder = BatchRecorder(max_size=8, model="lm", gpu_uuid=UUID, tracer_provider=provider)
    timelines: list[RequestTimeline] = []

    async def streaming_app(scope: Scope, receive: Receive, send: Send) -> None:
        timeline = current_timeline()
        assert timeline is not None
        timelines.append(timeline)
        timeline.set_operation("text_completion")
        timeline.set_tokens(input_tokens=7)
        timeline.enqueued()
        batch = recorder.batch()
        batch.admit(timeline)
        with batch.compute(trigger="timeout"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for chunk in range(5):
            if chunk == 0:
                timeline.first_token()
            timeline.add_output_tokens(1)
            await send({"type": "http.response.body", "body": b"t", "more_body": True})
            await asyncio.sleep(0.001)
        await send({"type": "http.response.body", "body": b""})

    app = GpuscopeMiddleware(streaming_app, tracer_provider=provider, service_name="svc-a")
    await call(app, http_scope("/v1/completions", "POST"))
    scraped = await flush_and_scrape(provider, gpu_exporter, exporter_http)

    no_rejects(scraped)
    labels = {"service": "svc-a", "model": "lm", "uuid": UUID, "gpu": "1"}
    assert value(scraped, "gpuscope_request_duration_seconds_count", {**labels, "code": "200"}) == 1
    operation = {**labels, "operation": "text_completion"}  # gen_ai.operation.name
    assert value(scraped, "gpuscope_request_duration_seconds_count", operation) == 1
    assert value(scraped, "gpuscope_time_to_first_token_seconds_count", operation) == 1
    (timeline,) = timelines
    ttft, tpot = timeline.streaming_seconds()
    assert ttft is not None and tpot is not None
    assert value(scraped, "gpuscope_time_to_first_token_seconds_sum", labels) == ttft
    assert value(scraped, "gpuscope_time_per_output_token_seconds_sum", labels) == tpot
    tokens = {"service": "svc-a", "model": "lm"}
    assert value(scraped, "gpuscope_tokens_total", {**tokens, "direction": "input"}) == 7
    assert value(scraped, "gpuscope_tokens_total", {**tokens, "direction": "output"}) == 5
    # The batch the request rode in is labelled with the same service as the request,
    # so that batch sizes and request latencies of one service can be put side by side.
    assert value(scraped, "gpuscope_batch_size_count", labels) == 1
    assert value(scraped, "gpuscope_batch_size_sum", labels) == 1


async def test_failure_paths_and_unsampled_parents_are_counted_with_their_codes(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    provider = tracing_to(running_exporter)

    async def disconnecting_receive() -> Message:
        return {"type": "http.disconnect"}

    async def client_goes_away(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await receive()  # the client left; the app stops streaming

    async def raises(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("model crashed")

    async def ok(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def ignore(message: Message) -> None:
        pass

    wrap: dict[str, Any] = {"tracer_provider": provider}
    await GpuscopeMiddleware(client_goes_away, **wrap)(
        http_scope("/stream"), disconnecting_receive, ignore
    )
    with pytest.raises(RuntimeError):
        await call(GpuscopeMiddleware(raises, **wrap), http_scope("/crash"))
    unsampled = [(b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")]
    await call(GpuscopeMiddleware(ok, **wrap), http_scope("/ok", headers=unsampled))
    scraped = await flush_and_scrape(provider, running_exporter, exporter_http)

    no_rejects(scraped)
    counts = {
        s.labels["code"]: s.value
        for s in scraped
        if s.name == "gpuscope_request_duration_seconds_count"
    }
    assert counts == {"499": 1, "500": 1, "200": 1}
    assert value(scraped, "gpuscope_spans_received_total") == 3
