"""The SDK fast path for phase spans yields the same spans as the API path."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from gpuscope.middleware.phase_spans import PhaseSpanEmitter

CHILDREN = [("gpuscope.queue", 1_000, 2_000), ("gpuscope.compute", 2_000, 5_000)]


def emit_with(fast: bool) -> tuple[ReadableSpan, list[ReadableSpan]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gpuscope", "0.1.0")
    emitter = PhaseSpanEmitter(tracer, provider)
    if not fast:
        emitter._resolve = lambda: None  # type: ignore[method-assign]
    server = tracer.start_span("POST /x", kind=trace.SpanKind.SERVER, start_time=500)
    emitter.emit(server, CHILDREN)
    server.end(end_time=6_000)
    *children, parent = exporter.get_finished_spans()
    return parent, list(children)


def describe(span: ReadableSpan, parent: ReadableSpan) -> tuple[object, ...]:
    assert span.parent is not None
    return (
        span.name,
        span.kind,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}),
        span.context.trace_id == parent.context.trace_id,
        span.parent.span_id == parent.context.span_id,
        span.context.trace_flags,
        span.resource.attributes["service.name"],
        span.instrumentation_scope,
        span.status.status_code,
        tuple(span.events),
        tuple(span.links),
    )


def test_fast_and_api_paths_produce_equal_spans() -> None:
    fast_parent, fast = emit_with(fast=True)
    api_parent, api = emit_with(fast=False)
    assert [describe(s, fast_parent) for s in fast] == [describe(s, api_parent) for s in api]
    assert len({s.context.span_id for s in fast}) == len(fast)


def test_unsampled_parents_get_no_children() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gpuscope")
    server = tracer.start_span("GET")
    PhaseSpanEmitter(tracer, provider).emit(server, CHILDREN)
    assert exporter.get_finished_spans() == ()


def test_a_non_sdk_provider_takes_the_api_path() -> None:
    provider = trace.NoOpTracerProvider()
    tracer = provider.get_tracer("gpuscope")
    emitter = PhaseSpanEmitter(tracer, provider)
    assert emitter._resolve() is None
    emitter.emit(tracer.start_span("GET"), CHILDREN)  # must not raise
