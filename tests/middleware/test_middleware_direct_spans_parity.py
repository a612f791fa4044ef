"""Direct spans against SDK spans, as the exporter receives them and as the app sees them.

``test_middleware_direct_spans.py`` compares the two paths' ``ReadableSpan`` objects;
this file compares the OTLP bytes that ``setup_tracing()``'s exporter would send
(decoded, ids and times aside), checks what a user's code can put on a direct span
through events and links (cleaned and bounded as the SDK does it, else one bad value
fails the encoding of its whole batch), and what the app and an engine see of the
direct server span: its context, the propagation headers, the trace it continues and
the sampling decision.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gpuscope import engine_spans
from gpuscope.middleware import BatchRecorder, GpuscopeMiddleware, current_timeline
from gpuscope.middleware.direct_spans import DirectSpan
from gpuscope.middleware.otlp_encoding import encode_export_request
from gpuscope.middleware.span_pipeline import BoundedTracerProvider, CountingBatchSpanProcessor
from gpuscope.middleware.types import Receive, Scope, Send
from support.middleware_asgi import call, http_scope
from support.vllm_fixtures import llm_request_attributes

CALLER_TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN_ID = 0xB7AD6B7169203331


def traceparent(flags: str = "01") -> bytes:
    return f"00-{CALLER_TRACE_ID:032x}-{CALLER_SPAN_ID:016x}-{flags}".encode()


class Captured(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class UsersProcessor(SpanProcessor):
    """Any processor not gpuscope's: its provider builds SDK spans from then on."""

    def __init__(self) -> None:
        self.ended: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def provider(direct: bool) -> tuple[BoundedTracerProvider, Captured]:
    exporter = Captured()
    made = BoundedTracerProvider(
        CountingBatchSpanProcessor(exporter),
        resource=Resource.create({"service.name": "parity"}),
        sampler=ALWAYS_ON,
        shutdown_timeout_s=5.0,
    )
    if not direct:
        made.add_span_processor(UsersProcessor())
    assert (made.direct_processors() is not None) is direct
    return made, exporter


def finished(made: BoundedTracerProvider, exporter: Captured) -> list[ReadableSpan]:
    made.force_flush()
    made.shutdown()
    return exporter.spans


# -- what a user's code puts on a direct span ----------------------------------------


def bounded_span(direct: bool) -> ReadableSpan:
    made, exporter = provider(direct)
    span = made.get_tracer("gpuscope").start_span(
        "bounded",
        links=[
            trace.Link(SpanContext(1, 2, False), {"bad": object(), "kept": "value"}),  # type: ignore[dict-item]
            # invalid, but the SDK keeps it for its trace state
            trace.Link(SpanContext(0, 0, False, trace_state=TraceState([("k", "v")]))),
            trace.Link(SpanContext(0, 0, False)),  # invalid and bare: dropped by both
        ],
    )
    assert isinstance(span, DirectSpan) is direct
    span.set_attributes({"a": "abcdef", "b": 1, "c": 2.5})
    span.add_event("first", {"bad": object(), "list": [1, 2], "": "no key", "long": "abcdefgh"})  # type: ignore[dict-item]
    span.add_event("second", {"mixed": [1, "two"], "x": 1, "y": 2, "z": 3})
    span.add_event("third")
    span.add_link(SpanContext(3, 4, False), {"n": None})
    span.record_exception(ValueError("bad input"), {"extra": object()})  # type: ignore[dict-item]
    span.end()
    (done,) = finished(made, exporter)
    return done


def described(span: ReadableSpan) -> dict[str, Any]:
    def bounded(attributes: Any) -> dict[str, Any]:
        values = dict(attributes or {})
        if "exception.stacktrace" in values:
            values["exception.stacktrace"] = values["exception.stacktrace"][:3]
        return values

    return {
        "attributes": list((span.attributes or {}).items()),
        "dropped_attributes": span.dropped_attributes,
        "events": [(e.name, bounded(e.attributes), e.dropped_attributes) for e in span.events],
        "dropped_events": span.dropped_events,
        "links": [
            (link.context.span_id, bounded(link.attributes), link.dropped_attributes)
            for link in span.links
        ],
        "dropped_links": span.dropped_links,
    }


def test_events_and_links_are_checked_and_bounded_as_the_sdk_does_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable, limit in (
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "2"),
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", "2"),
        ("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "3"),
        ("OTEL_SPAN_LINK_COUNT_LIMIT", "2"),
        ("OTEL_LINK_ATTRIBUTE_COUNT_LIMIT", "1"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "3"),
    ):
        monkeypatch.setenv(variable, limit)
    direct, sdk = bounded_span(direct=True), bounded_span(direct=False)
    assert described(direct) == described(sdk)
    # and the limits did bite, so the comparison above says something
    summary = described(direct)
    assert summary["dropped_attributes"] == 1
    assert summary["dropped_events"] == 2 and summary["dropped_links"] == 1


def test_a_bad_value_in_an_event_or_a_link_does_not_fail_its_batchs_encoding() -> None:
    span = bounded_span(direct=True)
    (event, *_) = span.events
    assert dict(event.attributes or {})["bad"] is None  # what the SDK stores for it
    decoded = ExportTraceServiceRequest.FromString(encode_export_request([span]))
    (encoded,) = decoded.resource_spans[0].scope_spans[0].spans
    assert encoded.name == "bounded"


# -- the same requests, as OTLP on the wire ------------------------------------------


def app_for(made: BoundedTracerProvider, children: bool) -> GpuscopeMiddleware:
    recorder = BatchRecorder(max_size=2, model="m", tracer_provider=made)
    app_tracer = made.get_tracer("the-app")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        timeline = current_timeline()
        assert timeline is not None
        with app_tracer.start_as_current_span("app.work"):
            timeline.enqueued()
            batch = recorder.batch()
            batch.admit(timeline)
            with batch.compute(trigger="full"):
                pass
        if scope["path"] == "/boom":
            raise RuntimeError("model exploded")
        status = 503 if scope["path"] == "/busy" else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    def request_hook(span: trace.Span, scope: Scope) -> None:
        span.set_attribute("hook.object", object())  # type: ignore[arg-type]
        span.set_attribute("hook.tuple", ("a", "b"))
        span.add_event("hook.event", {"bad": object(), "ok": 1.5})  # type: ignore[dict-item]

    def response_hook(span: trace.Span, timeline: Any) -> None:
        span.set_attribute("hook.done", True)
        span.set_attribute("gpuscope.phase.queue.duration", "overwritten by a hook")

    return GpuscopeMiddleware(
        app,
        tracer_provider=made,
        phase_spans=children,
        request_hook=request_hook,
        response_hook=response_hook,
    )


def wire(direct: bool, children: bool) -> ExportTraceServiceRequest:
    made, exporter = provider(direct)
    middleware = app_for(made, children)

    async def requests() -> None:
        await call(middleware, http_scope("/ok", "POST", [(b"traceparent", traceparent())]))
        await call(middleware, http_scope("/busy", "GET"))
        with pytest.raises(RuntimeError):
            await call(middleware, http_scope("/boom", "POST"))

    asyncio.run(requests())
    return ExportTraceServiceRequest.FromString(encode_export_request(finished(made, exporter)))


def normalised(request: ExportTraceServiceRequest) -> list[Any]:
    """The decoded request with ids, times and per-run values replaced by what they
    stand for: a span's parent by the parent's name, a caller's id by 'caller'."""
    message = MessageToDict(request)
    spans = [
        (resource["resource"], scope["scope"], span)
        for resource in message["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    names = {span["spanId"]: span["name"] for _, _, span in spans}
    # MessageToDict writes bytes fields in base64
    names[base64.b64encode(CALLER_SPAN_ID.to_bytes(8, "big")).decode()] = "caller"

    def value(attribute: dict[str, Any]) -> Any:
        key, held = attribute["key"], attribute["value"]
        if "doubleValue" in held:
            return key, "double"
        if key == "gpuscope.batch.id":
            return key, held["stringValue"].rsplit("-", 1)[-1]
        if key == "exception.stacktrace":
            return key, held["stringValue"].splitlines()[-1]
        return key, held

    out = []
    for resource, scope, span in spans:
        for field in ("traceId", "spanId", "startTimeUnixNano", "endTimeUnixNano"):
            span.pop(field)
        if "parentSpanId" in span:
            span["parentSpanId"] = names[span["parentSpanId"]]
        span["attributes"] = [value(a) for a in span.get("attributes", [])]
        for event in span.get("events", []):
            event.pop("timeUnixNano")
            event["attributes"] = [value(a) for a in event.get("attributes", [])]
        span["links"] = sorted(names.get(link["spanId"], "?") for link in span.get("links", []))
        out.append((resource, scope, span))
    return sorted(out, key=repr)


@pytest.mark.parametrize("children", [False, True], ids=["children-off", "children-on"])
def test_both_paths_send_the_same_otlp(children: bool) -> None:
    direct, sdk = wire(direct=True, children=children), wire(direct=False, children=children)
    assert normalised(direct) == normalised(sdk)
    spans = [span for _, _, span in normalised(direct)]
    servers = [span for span in spans if span["kind"] == "SPAN_KIND_SERVER"]
    assert len(servers) == 3
    assert sum(span["name"] == "gpuscope.queue" for span in spans) == (3 if children else 0)
    # the hook's value the SDK could not keep is no value, not an object
    assert all(("hook.object", {}) in span["attributes"] for span in servers)


# -- what the app, a caller and an engine see of the direct server span ---------------


async def test_the_app_runs_under_the_direct_server_span_and_forwards_it() -> None:
    made, exporter = provider(direct=True)
    seen: dict[str, Any] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen["current"] = trace.get_current_span()
        seen["headers"] = dict(scope["headers"])
        with made.get_tracer("the-app").start_as_current_span("app.work"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = GpuscopeMiddleware(app, tracer_provider=made)
    await call(middleware, http_scope("/", "GET", [(b"traceparent", traceparent())]))
    spans = {span.name: span for span in finished(made, exporter)}
    server, work = spans["GET"], spans["app.work"]
    assert isinstance(seen["current"], DirectSpan)
    assert server.context is not None and work.parent is not None
    assert seen["current"].get_span_context() == server.context
    assert work.parent.span_id == server.context.span_id
    assert work.context is not None and work.context.trace_id == CALLER_TRACE_ID
    forwarded = seen["headers"][b"traceparent"].decode()
    assert forwarded == f"00-{CALLER_TRACE_ID:032x}-{server.context.span_id:016x}-01"
    assert server.parent is not None and server.parent.span_id == CALLER_SPAN_ID


async def test_an_outer_active_span_parents_the_direct_server_span() -> None:
    made, exporter = provider(direct=True)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = GpuscopeMiddleware(app, tracer_provider=made)
    with made.get_tracer("outer-instrumentation").start_as_current_span("outer") as outer:
        # the caller's header loses to the span already active, as on the SDK path
        await call(middleware, http_scope("/", "GET", [(b"traceparent", traceparent())]))
    server = next(span for span in finished(made, exporter) if span.name == "GET")
    assert server.parent is not None and not server.parent.is_remote
    assert server.parent.span_id == outer.get_span_context().span_id
    assert server.context is not None
    assert server.context.trace_id == outer.get_span_context().trace_id


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sdk"])
async def test_an_unsampled_caller_is_still_traced_as_always_on_says(direct: bool) -> None:
    made, exporter = provider(direct)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    state = (b"tracestate", b"vendor=abc")
    middleware = GpuscopeMiddleware(app, tracer_provider=made)
    await call(middleware, http_scope("/", "GET", [(b"traceparent", traceparent("00")), state]))
    (server,) = finished(made, exporter)
    assert server.context is not None and server.parent is not None
    assert server.context.trace_flags == TraceFlags(TraceFlags.SAMPLED)
    assert server.context.trace_id == CALLER_TRACE_ID and server.parent.is_remote
    assert server.context.trace_state == TraceState([("vendor", "abc")])


async def test_an_engine_span_folds_into_the_direct_server_span() -> None:
    made, exporter = provider(direct=True)
    engine_attributes = llm_request_attributes()[0]

    async def vllm_like(scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        parent = TraceContextTextMapPropagator().extract(headers)
        span = made.get_tracer("vllm.tracing.otel").start_span(
            "llm_request", context=parent, kind=SpanKind.SERVER, start_time=time.time_ns()
        )
        span.set_attributes(engine_attributes)
        span.end()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = GpuscopeMiddleware(vllm_like, tracer_provider=made)
    token = otel_context.attach(otel_context.Context())  # no span active around it
    try:
        await call(middleware, http_scope("/v1/completions", "POST"))
    finally:
        otel_context.detach(token)
    # the engine bridge joined the provider and its spans stayed direct
    assert made.direct_processors() is not None
    spans = {span.name: span for span in finished(made, exporter)}
    server, engine = spans["POST"], spans["llm_request"]
    assert server.context is not None and engine.parent is not None
    assert engine.parent.span_id == server.context.span_id
    assert (engine.attributes or {})[engine_spans.COUNTED_BY_SERVER_SPAN] is True
    assert (server.attributes or {})["gpuscope.queue.duration"] == engine_attributes[
        "gen_ai.latency.time_in_queue"
    ]


async def test_a_users_processor_gets_every_span_once_it_is_added() -> None:
    made, exporter = provider(direct=True)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = GpuscopeMiddleware(app, tracer_provider=made, phase_spans=True)
    await call(middleware, http_scope("/first", "GET"))
    users = UsersProcessor()
    made.add_span_processor(users)
    await call(middleware, http_scope("/second", "GET"))
    spans = finished(made, exporter)
    paths = [str((s.attributes or {}).get("url.path")) for s in users.ended]
    assert paths == ["/second"]
    assert len(users.ended) == 1  # no phase marks: the server span has no children
    assert sorted(str((s.attributes or {}).get("url.path")) for s in spans) == ["/first", "/second"]
