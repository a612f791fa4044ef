"""Every PromQL query in docs/queries.md, against real Prometheus, exporter and middleware.

Requests go through GpuscopeMiddleware and BatchRecorder, their spans through
setup_tracing()'s OTLP exporter to the gpuscope exporter, whose simulated GPU runs
the fault scenario at a moment when GPU 0's clocks are thermally throttled.
Prometheus scrapes it twice a second; each documented query must answer with data.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gpuscope.exporter.gpu.scenario import load_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource, simulated_uuid
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.middleware import (
    BatchRecorder,
    GpuscopeMiddleware,
    RequestTimeline,
    current_timeline,
    setup_tracing,
    stats,
)
from gpuscope.middleware.types import ASGIApp
from support.exporter_fixtures import loopback_config
from support.prometheus_server import (
    instant_query,
    run_prometheus,
    scrapes_done,
    wait_for_scrapes,
)

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).parents[2]
QUERIES = re.findall(r"```promql\n(.*?)```", (REPO / "docs" / "queries.md").read_text(), re.S)
BATCH = 4
STREAMED_TOKENS = 4


def test_the_page_has_queries() -> None:
    assert len(QUERIES) >= 10


def batching_app(recorder: BatchRecorder) -> Starlette:
    """Requests wait for BATCH - 1 others, then run as one batch (a tiny dynamic batcher)."""
    forming: list[tuple[RequestTimeline, asyncio.Future[None]]] = []

    async def embed(request: Request) -> JSONResponse:
        timeline = current_timeline()
        assert timeline is not None
        timeline.set_model("mlp")
        timeline.set_tokens(input_tokens=12, output_tokens=3)
        timeline.enqueued()
        done = asyncio.get_running_loop().create_future()
        forming.append((timeline, done))
        if len(forming) == BATCH:
            batch = recorder.batch()
            for member, _ in forming:
                batch.admit(member)
            with batch.compute(trigger="full"):
                await asyncio.sleep(0.002)  # timed: the batch's compute
            for _, waiter in forming:
                waiter.set_result(None)
            forming.clear()
        await done
        return JSONResponse({"ok": True})

    async def complete(request: Request) -> StreamingResponse:
        timeline = current_timeline()
        assert timeline is not None
        timeline.set_model("mlp")
        timeline.set_operation("text_completion")
        timeline.set_tokens(input_tokens=5, output_tokens=STREAMED_TOKENS)

        async def tokens() -> AsyncIterator[bytes]:
            for i in range(STREAMED_TOKENS):
                await asyncio.sleep(0.001)
                if i == 0:
                    timeline.first_token()
                yield b"data: {}\n\n"

        return StreamingResponse(tokens(), media_type="text/event-stream")

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"data": []})

    return Starlette(
        routes=[
            Route("/v1/embeddings", embed, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def fed_exporter() -> AsyncIterator[RunningExporter]:
    faults = load_scenario(REPO / "exporter" / "gpu" / "scenarios" / "faults.yaml")
    clock = Clock(0.0)
    source = SimulatedSource(2, faults, clock=clock)
    clock.now = 45.0  # GPU 0 is thermally throttled from 30 s to 90 s
    exporter = await start_exporter(
        loopback_config(gpu_interval_s=0.1), gpu_source=source, compute_observers=[source]
    )
    try:
        yield exporter
    finally:
        await exporter.stop()


async def send_wave(app: ASGIApp, count: int) -> None:
    """``count`` embeddings (batched), streamed completions, model listings and 404s."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        responses = await asyncio.gather(
            *(client.post("/v1/embeddings", json={}) for _ in range(count)),
            *(client.post("/v1/completions", json={}) for _ in range(2)),
            *(client.get("/v1/models") for _ in range(2)),
        )
        assert all(r.status_code == 200 for r in responses)
        assert (await client.get("/no/such/route")).status_code == 404


def check_meaning(query: str, result: list[dict[str, Any]]) -> None:
    """What some queries must leave out, beyond answering with data."""
    labels = [sample["metric"] for sample in result]
    if "histogram_quantile(0.99, sum by (model, route" in query:
        assert {m["route"] for m in labels} == {"/v1/embeddings", "/v1/completions"}, labels
    if "gpuscope_gpu_clock_event_active" in query:
        assert all(m["reason"] != "gpu_idle" for m in labels), labels
    if query.startswith("sum by (reason)"):
        assert all("reason" in m for m in labels), f"a series without a reason: {labels}"
    if "gpuscope_span_calls_total" in query:
        assert {m["http_status_code"] for m in labels} == {"200", "404"}, labels


async def test_every_documented_query_answers_with_data(
    fed_exporter: RunningExporter, tmp_path: Path
) -> None:
    stats.reset()
    provider = setup_tracing(fed_exporter.url + "/v1/traces", "docs-worker", set_global=False)
    recorder = BatchRecorder(
        max_size=BATCH, model="mlp", gpu_uuid=simulated_uuid(0), tracer_provider=provider
    )
    # Next to another instrumentation, as in many real services: its spans are
    # counted apart (gpuscope_span_*), never as gpuscope requests.
    app = OpenTelemetryMiddleware(
        GpuscopeMiddleware(batching_app(recorder), tracer_provider=provider),
        tracer_provider=provider,
    )
    await send_wave(app, 4 * BATCH)
    # The exporter runs on this event loop: flush from a thread, or the flush would
    # block the very loop that has to answer it.
    assert await asyncio.to_thread(provider.force_flush, 10_000)
    async with (
        run_prometheus([f"127.0.0.1:{fed_exporter.port}"], tmp_path) as prometheus,
        aiohttp.ClientSession() as session,
    ):
        # rate() needs the counters to move between two scrapes: a second wave after
        # the first scrape, then wait for the scrape after it.
        await wait_for_scrapes(session, prometheus, 1)
        await send_wave(app, 4 * BATCH)
        assert await asyncio.to_thread(provider.force_flush, 10_000)
        await wait_for_scrapes(session, prometheus, await scrapes_done(session, prometheus) + 2)
        for query in QUERIES:
            result = await instant_query(session, prometheus, query)
            assert result, f"no data for:\n{query}"
            values = [float(sample["value"][1]) for sample in result]
            assert not any(math.isnan(v) for v in values), f"NaN from:\n{query}\n{result}"
            check_meaning(query, result)
    await asyncio.to_thread(provider.shutdown)
    assert stats.snapshot().get("spans_export_failed", 0) == 0
