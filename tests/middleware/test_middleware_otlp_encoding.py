"""The hand-written OTLP encoder produces the same message as the SDK's encoder."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from gpuscope.middleware.otlp_encoding import encode_export_request

REMOTE_PARENT = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C,
    0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
)


def make_spans() -> list[ReadableSpan]:
    spans_out: list[ReadableSpan] = []
    for service in ("embed", "generate"):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(
            resource=Resource.create({"service.name": service, "process.pid": 42})
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("gpuscope", "0.1.0", schema_url="https://example/schema")
        other = provider.get_tracer("app")
        server = tracer.start_span(
            "POST /v1/completions",
            context=trace.set_span_in_context(trace.NonRecordingSpan(REMOTE_PARENT)),
            kind=SpanKind.SERVER,
            start_time=1_700_000_000_000_000_000,
            attributes={
                "http.response.status_code": 200,
                "gpuscope.queue.duration": 0.00123,
                "negative": -5,
                "huge": 2**63 - 1,
                "flag": True,
                "off": False,
                "unicode": "données ✓",
                "empty": "",
                "zero": 0,
                "floats": [0.5, -1.25],
                "names": ["a", "b"],
                "ints": [1, -2, 3],
                "bools": [True, False],
            },
        )
        server.add_event("retry", {"attempt": 2}, timestamp=1_700_000_000_000_000_500)
        server.set_status(Status(StatusCode.ERROR, "model exploded"))
        server.end(end_time=1_700_000_000_500_000_000)
        batch = other.start_span(
            "gpuscope.batch",
            links=[Link(server.get_span_context(), {"member": 1}), Link(REMOTE_PARENT)],
        )
        batch.set_status(Status(StatusCode.OK))
        batch.end()
        child = tracer.start_span("gpuscope.queue", trace.set_span_in_context(server))
        child.end()
        spans_out.extend(exporter.get_finished_spans())
        provider.shutdown()
    return spans_out


def test_same_message_as_the_sdk_encoder() -> None:
    spans = make_spans()
    ours = ExportTraceServiceRequest.FromString(encode_export_request(spans))
    sdk = ExportTraceServiceRequest.FromString(encode_spans(spans).SerializeToString())
    assert len(ours.resource_spans) == 2
    assert ours == sdk


def test_no_spans_is_an_empty_request() -> None:
    assert encode_export_request([]) == b""
    assert ExportTraceServiceRequest.FromString(b"") == ExportTraceServiceRequest()


def test_cached_attributes_are_encoded_as_the_sdk_encodes_them() -> None:
    """The encoder keeps whole encoded attributes for repeating values: a value equal to
    another of a different type (``1``, ``True``, ``1.0``) must not reuse its bytes, nor
    must the same pair under another field (a span's attribute, an event's, a link's),
    and unique values past the cache's size (batch ids) must still encode right."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "embed"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gpuscope")
    long_key = "k" * 130  # a KeyValue over 127 bytes: a two-byte length
    for value in (1, True, 1.0, "1", 0, False, 0.0, -0.0, float("inf"), "x" * 300):
        span = tracer.start_span("s", attributes={"v": value, long_key: value})
        span.add_event("e", {"v": value})
        span.end()
        linked = tracer.start_span("b", links=[Link(span.get_span_context(), {"v": value})])
        linked.end()
    for number in range(5000):
        tracer.start_span("u", attributes={"gpuscope.batch.id": f"b-{number}", "n": number}).end()
    spans = list(exporter.get_finished_spans())
    provider.shutdown()
    for _ in range(2):  # the second time from the cache
        ours = encode_export_request(spans)
        assert ours == encode_spans(spans).SerializeToString(deterministic=True)
