"""gpuscope's direct spans (``direct_spans``) against the SDK's own spans.

The same requests run through the middleware twice on a ``BoundedTracerProvider``:
once as it ships (every processor takes direct spans, so the ``gpuscope`` tracer builds
them itself) and once with a plain processor added, which sends every span through the
SDK's ``Span``. What the exporter receives must be the same span for span, apart from
ids and times, and both must encode to the same OTLP message.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, TraceIdRatioBased

from gpuscope.middleware import BatchRecorder, GpuscopeMiddleware, current_timeline
from gpuscope.middleware.direct_spans import DirectSpan
from gpuscope.middleware.otlp_encoding import encode_export_request
from gpuscope.middleware.span_pipeline import BoundedTracerProvider, CountingBatchSpanProcessor
from gpuscope.middleware.types import Receive, Scope, Send
from support.middleware_asgi import call, http_scope

TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Captured(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class PlainProcessor(SpanProcessor):
    """A user's processor: it may need SDK spans, so the provider stops going direct."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def provider_with(exporter: Captured, sampler: Any = ALWAYS_ON) -> BoundedTracerProvider:
    return BoundedTracerProvider(
        CountingBatchSpanProcessor(exporter),
        resource=Resource.create({"service.name": "direct-test"}),
        sampler=sampler,
        shutdown_timeout_s=5.0,
    )


def app_for(provider: TracerProvider) -> GpuscopeMiddleware:
    recorder = BatchRecorder(max_size=2, model="m", tracer_provider=provider)
    app_tracer = provider.get_tracer("the-app")

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
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    def request_hook(span: trace.Span, scope: Scope) -> None:
        span.set_attribute("hook.list", [1, 2, 3])
        # values the API's types allow or not, cleaned by the SDK's own rules either way
        span.set_attribute("hook.mixed", [1, "two"])
        span.set_attribute("hook.none", None)
        span.set_attribute("hook.object", object())  # type: ignore[arg-type]
        span.set_attribute("", "empty key")  # dropped
        span.set_attribute("hook.text", "kept")

    return GpuscopeMiddleware(
        app, tracer_provider=provider, phase_spans=True, request_hook=request_hook
    )


def server_span(spans: Sequence[ReadableSpan], path: str) -> ReadableSpan:
    return next(
        s
        for s in spans
        if s.kind is trace.SpanKind.SERVER and (s.attributes or {}).get("url.path") == path
    )


def run_requests(provider: BoundedTracerProvider, exporter: Captured) -> list[ReadableSpan]:
    middleware = app_for(provider)

    async def requests() -> None:
        await call(middleware, http_scope("/ok", "POST", [(b"traceparent", TRACEPARENT)]))
        with pytest.raises(RuntimeError):
            await call(middleware, http_scope("/boom", "POST"))

    asyncio.run(requests())
    provider.force_flush()
    provider.shutdown()
    return exporter.spans


def normalised(spans: Sequence[ReadableSpan]) -> list[dict[str, Any]]:
    """Each span without its ids and times: names stand in for parents and links."""
    by_id = {span.context.span_id: span.name for span in spans if span.context is not None}

    def value(key: str, item: Any) -> Any:
        if key == "gpuscope.batch.id":  # a random prefix per recorder
            return item.rsplit("-", 1)[-1]
        if key == "exception.stacktrace":
            return item.splitlines()[-1]
        return type(item).__name__ if isinstance(item, float) else item

    out = []
    for span in spans:
        parent = span.parent
        out.append(
            {
                "name": span.name,
                "kind": span.kind,
                "parent": None
                if parent is None
                else by_id.get(parent.span_id, f"remote {parent.span_id:x}"),
                "remote_parent": None if parent is None else parent.is_remote,
                # a list: the order is compared too (the wire keeps it)
                "attributes": [(k, value(k, v)) for k, v in (span.attributes or {}).items()],
                "status": (span.status.status_code, span.status.description),
                "events": [
                    (e.name, {k: value(k, v) for k, v in (e.attributes or {}).items()})
                    for e in span.events
                ],
                "links": sorted(by_id.get(link.context.span_id, "?") for link in span.links),
                "resource": dict(span.resource.attributes),
                "scope": (span.instrumentation_scope.name, span.instrumentation_scope.version)
                if span.instrumentation_scope
                else None,
            }
        )
    return sorted(out, key=lambda s: (s["name"], str(s["parent"]), str(s["attributes"])))


@pytest.fixture
def both() -> tuple[list[ReadableSpan], list[ReadableSpan], PlainProcessor]:
    direct_exporter, sdk_exporter = Captured(), Captured()
    direct = provider_with(direct_exporter)
    sdk = provider_with(sdk_exporter)
    plain = PlainProcessor()
    sdk.add_span_processor(plain)
    assert direct.direct_processors() is not None and sdk.direct_processors() is None
    return run_requests(direct, direct_exporter), run_requests(sdk, sdk_exporter), plain


def test_direct_spans_are_what_the_sdk_would_have_exported(
    both: tuple[list[ReadableSpan], list[ReadableSpan], PlainProcessor],
) -> None:
    direct, sdk, _ = both
    names = sorted(span.name for span in direct)
    # two server spans, two batch spans, three phase children each, and the app's spans
    assert names.count("POST") == 2  # no route template under a raw ASGI app
    assert names.count("gpuscope.batch") == 2 and names.count("app.work") == 2
    assert normalised(direct) == normalised(sdk)


def test_the_gpuscope_spans_were_direct_and_the_apps_were_not(
    both: tuple[list[ReadableSpan], list[ReadableSpan], PlainProcessor],
) -> None:
    direct, _, plain = both
    scopes = {span.name: span.instrumentation_scope for span in direct}
    assert scopes["app.work"] is not None and scopes["app.work"].name == "the-app"
    # the user's processor saw every span of its provider start and end, as SDK spans
    assert all(isinstance(span, SdkSpan) for span in plain.started)
    assert len(plain.ended) == len(direct)


def test_a_hooks_invalid_values_are_cleaned_as_the_sdk_cleans_them(
    both: tuple[list[ReadableSpan], list[ReadableSpan], PlainProcessor],
) -> None:
    direct, _, _ = both
    server = server_span(direct, "/ok")
    attributes = dict(server.attributes or {})
    assert attributes["hook.list"] == (1, 2, 3)
    assert attributes["hook.text"] == "kept"
    assert "" not in attributes
    # what the SDK's cleaning gives for values it cannot keep, as the SDK stores it
    assert attributes["hook.none"] is None and attributes["hook.object"] is None


def test_the_server_span_continues_the_callers_trace_and_parents_the_apps_spans(
    both: tuple[list[ReadableSpan], list[ReadableSpan], PlainProcessor],
) -> None:
    direct, _, _ = both
    server = server_span(direct, "/ok")
    assert server.parent is not None and server.parent.is_remote
    assert server.context is not None
    assert server.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    work = [s for s in direct if s.name == "app.work" and s.parent is not None]
    assert any(s.parent.span_id == server.context.span_id for s in work if s.parent)


def test_direct_spans_encode_as_the_sdk_encodes_them(
    both: tuple[list[ReadableSpan], list[ReadableSpan], PlainProcessor],
) -> None:
    direct, _, _ = both
    ours = ExportTraceServiceRequest.FromString(encode_export_request(direct))
    theirs = encode_spans(direct)
    assert MessageToDict(ours) == MessageToDict(theirs)


def test_an_error_is_recorded_as_the_sdk_records_it(
    both: tuple[list[ReadableSpan], list[ReadableSpan], PlainProcessor],
) -> None:
    direct, _, _ = both
    boom = server_span(direct, "/boom")
    assert boom.status.status_code is trace.StatusCode.ERROR
    (event,) = boom.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "RuntimeError"


def test_a_sampler_other_than_always_on_keeps_the_sdk_path() -> None:
    exporter = Captured()
    provider = provider_with(exporter, sampler=TraceIdRatioBased(0.0))
    span = provider.get_tracer("gpuscope").start_span("never")
    assert not isinstance(span, DirectSpan) and not span.is_recording()
    span.end()
    provider.shutdown()
    assert exporter.spans == []


def test_a_processor_added_later_switches_new_spans_to_the_sdk() -> None:
    exporter = Captured()
    provider = provider_with(exporter)
    tracer = provider.get_tracer("gpuscope", "1")
    before = tracer.start_span("before")
    assert isinstance(before, DirectSpan)
    plain = PlainProcessor()
    provider.add_span_processor(plain)
    after = tracer.start_span("after")
    assert not isinstance(after, DirectSpan)
    before.end()
    after.end()
    provider.force_flush()
    provider.shutdown()
    assert sorted(s.name for s in exporter.spans) == ["after", "before"]
    assert [s.name for s in plain.ended] == ["after"]  # it never saw "before" start


def test_the_sdks_attribute_limits_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    results = []
    for direct in (True, False):
        exporter = Captured()
        provider = provider_with(exporter)
        if not direct:
            provider.add_span_processor(PlainProcessor())
        span = provider.get_tracer("gpuscope").start_span("limited")
        assert isinstance(span, DirectSpan) is direct
        span.set_attributes({"a": "abcdefgh", "b": 1, "c": ["long-text", "x"], "d": 2.5})
        span.set_attribute("e", True)
        span.end()
        provider.force_flush()
        provider.shutdown()
        (finished,) = exporter.spans
        results.append(dict(finished.attributes or {}))
    assert results[0] == results[1] == {"c": ("long", "x"), "d": 2.5, "e": True}


def test_keys_that_are_no_string_are_taken_as_the_sdk_takes_them() -> None:
    """A hook or the app's own code may pass a key that is not a non-empty str (an
    int, an enum): whatever the installed API does with it (converts it with str() or
    drops it) and what it counts as dropped, a direct span does too. Only the place
    of a converted key among the others may differ (it is set after them)."""

    class Colour(enum.Enum):
        RED = 1

    results = []
    for direct in (True, False):
        exporter = Captured()
        provider = provider_with(exporter)
        if not direct:
            provider.add_span_processor(PlainProcessor())
        tracer = provider.get_tracer("gpuscope")
        attributes: Any = {5: "five", Colour.RED: "red", "": "empty", "ok": 1}
        started = tracer.start_span("at start", attributes=attributes)
        started.end()
        later = tracer.start_span("later")
        later.set_attributes(attributes)
        later.set_attribute(7, "seven")  # type: ignore[arg-type]
        later.set_attribute("", "empty")
        later.end()
        provider.force_flush()
        provider.shutdown()
        results.append([(dict(s.attributes or {}), s.dropped_attributes) for s in exporter.spans])
    assert results[0] == results[1]


def test_a_direct_span_ignores_calls_after_its_end() -> None:
    exporter = Captured()
    provider = provider_with(exporter)
    span = provider.get_tracer("gpuscope").start_span("once")
    span.end()
    span.set_attribute("late", 1)
    span.set_status(trace.StatusCode.ERROR)
    span.end()
    provider.force_flush()
    provider.shutdown()
    (finished,) = exporter.spans
    assert "late" not in (finished.attributes or {})
    assert finished.status.status_code is trace.StatusCode.UNSET
