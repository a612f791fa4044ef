"""gpuscope next to other OpenTelemetry instrumentation: one request, one count, one trace.

Each case builds a real FastAPI app with gpuscope and another instrumentation in a
given order (FastAPI's built-in telemetry, opentelemetry-instrumentation-fastapi,
the contrib ASGI middleware inside or outside gpuscope), sends requests that carry a
caller's ``traceparent``, ``tracestate`` and ``baggage`` (or none), exports every
span through ``setup_tracing()`` to a real gpuscope exporter, and checks what the
exporter counted, how the spans form traces, and what the handler saw.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import httpx
import pytest
from fastapi import FastAPI
from opentelemetry import baggage, trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.middleware import GpuscopeMiddleware, current_timeline, setup_tracing
from gpuscope.middleware.span_pipeline import BoundedTracerProvider
from support.exporter_fixtures import loopback_config, samples, scrape

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REQUESTS = 3
EXCLUDED = "/healthz"
ASGIApp = Callable[..., object]


@dataclass
class Seen:
    """What the handler observed in its context, one entry per request."""

    baggage: list[object] = field(default_factory=list)
    tracestate: list[str | None] = field(default_factory=list)


def fastapi_app(provider: BoundedTracerProvider, seen: Seen, *, builtin: bool) -> FastAPI:
    app = FastAPI(telemetry={"tracer_provider": provider, "tracing": builtin, "metrics": False})

    @app.post("/v1/embeddings")
    async def embeddings() -> dict[str, bool]:
        timeline = current_timeline()
        assert timeline is not None
        timeline.set_model("m")
        timeline.set_operation("embeddings")
        seen.baggage.append(baggage.get_baggage("user"))
        seen.tracestate.append(trace.get_current_span().get_span_context().trace_state.get("shop"))
        return {"ok": True}

    @app.get(EXCLUDED)
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


def gpuscope_inside(app: FastAPI, provider: BoundedTracerProvider) -> FastAPI:
    app.add_middleware(
        GpuscopeMiddleware,
        tracer_provider=provider,
        excluded_paths=[EXCLUDED],
    )
    return app


def gpuscope_outside(app: object, provider: BoundedTracerProvider) -> GpuscopeMiddleware:
    return GpuscopeMiddleware(app, tracer_provider=provider, excluded_paths=[EXCLUDED])  # type: ignore[arg-type]


def builtin_outside(provider: BoundedTracerProvider, seen: Seen) -> object:
    return gpuscope_inside(fastapi_app(provider, seen, builtin=True), provider)


def builtin_inside(provider: BoundedTracerProvider, seen: Seen) -> object:
    return gpuscope_outside(fastapi_app(provider, seen, builtin=True), provider)


def instrumentor_outside(provider: BoundedTracerProvider, seen: Seen) -> object:
    app = gpuscope_inside(fastapi_app(provider, seen, builtin=True), provider)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    return app


def asgi_outside(provider: BoundedTracerProvider, seen: Seen) -> object:
    inner = gpuscope_outside(fastapi_app(provider, seen, builtin=False), provider)
    return OpenTelemetryMiddleware(inner, tracer_provider=provider)


def asgi_inside(provider: BoundedTracerProvider, seen: Seen) -> object:
    app = fastapi_app(provider, seen, builtin=False)
    instrumented = OpenTelemetryMiddleware(app, tracer_provider=provider)
    return gpuscope_outside(instrumented, provider)


def gpuscope_alone(provider: BoundedTracerProvider, seen: Seen) -> object:
    return gpuscope_inside(fastapi_app(provider, seen, builtin=False), provider)


COMBINATIONS = {
    "fastapi-builtin-outside": builtin_outside,
    "fastapi-builtin-inside": builtin_inside,
    "fastapi-instrumentor-outside": instrumentor_outside,
    "contrib-asgi-outside": asgi_outside,
    "contrib-asgi-inside": asgi_inside,
    "gpuscope-alone": gpuscope_alone,
}


@pytest.fixture
async def exporter() -> AsyncIterator[RunningExporter]:
    running = await start_exporter(loopback_config())
    try:
        yield running
    finally:
        await running.stop()


def caller_headers(trace_id: str) -> dict[str, str]:
    return {
        "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
        "tracestate": "shop=checkout",
        "baggage": "user=alice",
    }


async def send(app: object, headers: list[dict[str, str]]) -> None:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        for h in headers:
            response = await client.post("/v1/embeddings", json={}, headers=h)
            assert response.status_code == 200, response.text
            # The excluded path in a trace of its own.
            own = caller_headers(secrets.token_hex(16)) if h else {}
            assert (await client.get(EXCLUDED, headers=own)).status_code == 200


def gpuscope_servers(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [
        s
        for s in spans
        if s.kind is SpanKind.SERVER
        and s.instrumentation_scope is not None
        and s.instrumentation_scope.name == "gpuscope"
    ]


@pytest.mark.parametrize("combination", list(COMBINATIONS))
@pytest.mark.parametrize("with_caller", [True, False], ids=["caller-traceparent", "no-caller"])
async def test_each_request_is_counted_once_in_one_trace(
    exporter: RunningExporter, combination: str, with_caller: bool
) -> None:
    provider = setup_tracing(exporter.url + "/v1/traces", "shop", set_global=False)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    seen = Seen()
    app = COMBINATIONS[combination](provider, seen)
    trace_ids = [secrets.token_hex(16) for _ in range(REQUESTS)]
    await send(app, [caller_headers(t) if with_caller else {} for t in trace_ids])
    assert await asyncio.to_thread(provider.force_flush, 10_000)
    async with aiohttp.ClientSession() as session:
        scraped = samples(await scrape(session, exporter))
    await asyncio.to_thread(provider.shutdown, 5.0)

    # Counted once per request, with its model, and never for the excluded path.
    counts = [s for s in scraped if s.name == "gpuscope_request_duration_seconds_count"]
    assert [(s.labels["route"], s.labels["model"], s.value) for s in counts] == [
        ("/v1/embeddings", "m", REQUESTS)
    ]
    spans = list(memory.get_finished_spans())
    ours = gpuscope_servers(spans)
    assert len(ours) == REQUESTS
    # One trace per request: the caller's when it sent one.
    embedding_traces = {s.context.trace_id for s in ours if s.context is not None}
    assert len(embedding_traces) == REQUESTS
    if with_caller:
        assert embedding_traces == {int(t, 16) for t in trace_ids}
    every_instrumentation = {
        s.context.trace_id for s in spans if s.context is not None and "/v1/embeddings" in s.name
    }
    assert every_instrumentation == embedding_traces, "another instrumentation split the trace"
    for trace_id in embedding_traces:
        members = [s for s in spans if s.context is not None and s.context.trace_id == trace_id]
        ids = {s.context.span_id for s in members if s.context is not None}
        roots = [s for s in members if s.parent is None or s.parent.span_id not in ids]
        assert len(roots) == 1, f"{combination}: {[(s.name, s.parent) for s in roots]}"
    # The whole context reached the handler.
    if with_caller:
        assert seen.baggage == ["alice"] * REQUESTS
        assert seen.tracestate == ["checkout"] * REQUESTS
    else:
        assert seen.baggage == [None] * REQUESTS
    # What the other instrumentation traced is counted apart, never as a gpuscope request.
    other_servers = [s for s in spans if s.kind is SpanKind.SERVER and s not in ours]
    # Per request pair (embeddings, /healthz). Inside gpuscope the contrib middleware
    # sees an active span and goes INTERNAL, except on the path gpuscope excludes.
    other_per_pair = {"contrib-asgi-inside": 1, "gpuscope-alone": 0}.get(combination, 2)
    assert len(other_servers) == other_per_pair * REQUESTS
    stock_calls = [s for s in scraped if s.name == "gpuscope_span_calls_total"]
    assert sum(s.value for s in stock_calls) == len(other_servers)
    assert all(s.labels["http_status_code"] == "200" for s in stock_calls)


GLOBAL_SETUP_APP = """
import asyncio, sys
import httpx
from fastapi import FastAPI
from gpuscope.middleware import GpuscopeMiddleware, current_timeline, setup_tracing

provider = setup_tracing(sys.argv[1], "shop")  # the global provider: FastAPI traces too
app = FastAPI()
app.add_middleware(GpuscopeMiddleware, excluded_paths=["/healthz", "/metrics"])

@app.get("/v1/models")
async def models() -> dict:
    current_timeline().set_model("m")
    return {"data": []}

@app.get("/healthz")
async def healthz() -> dict:
    return {}

@app.get("/metrics")
async def metrics() -> dict:
    return {}

async def main() -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        for path in ("/v1/models", "/v1/models", "/healthz", "/metrics"):
            assert (await client.get(path)).status_code == 200

asyncio.run(main())
provider.shutdown()
"""


async def test_the_documented_setup_with_a_global_provider_counts_each_request_once(
    exporter: RunningExporter,
) -> None:
    """setup_tracing() + app.add_middleware(...), as the README shows, in a fresh process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", GLOBAL_SETUP_APP, exporter.url + "/v1/traces",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    async with aiohttp.ClientSession() as session:
        scraped = samples(await scrape(session, exporter))
    counts = [s for s in scraped if s.name == "gpuscope_request_duration_seconds_count"]
    assert [(s.labels["route"], s.labels["model"], s.value) for s in counts] == [
        ("/v1/models", "m", 2)
    ]
    # FastAPI's own SERVER spans, all four of them, are counted apart.
    calls = [s for s in scraped if s.name == "gpuscope_span_calls_total"]
    assert sum(s.value for s in calls) == 4
