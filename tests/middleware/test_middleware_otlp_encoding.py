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

from gpuscope.middleware import stats
from gpuscope.middleware.otlp_encoding import (
    _CACHE_LIMIT,
    _CACHED_KEY_LENGTH,
    _encoded_attributes,
    _encoded_keys,
    _float_prefixes,
    encode_export_request,
)

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


def _spans_from(
    attributes: dict[str, object], *, name: str = "s", resource: Resource | None = None
) -> list[ReadableSpan]:
    """One span (with an event and a link carrying ``attributes`` too) from the real SDK."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource or Resource.create({"service.name": "embed"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gpuscope")
    span = tracer.start_span(name, links=[Link(REMOTE_PARENT, attributes)])  # type: ignore[arg-type]
    span.set_attributes(attributes)  # type: ignore[arg-type]
    span.add_event("e", attributes)  # type: ignore[arg-type]
    span.end()
    provider.shutdown()
    return list(exporter.get_finished_spans())


def test_an_unencodable_attribute_is_left_out_alone_and_counted() -> None:
    """A lone surrogate (valid JSON ``"\\ud800"`` quoted in an exception message) or an
    int outside int64 cannot be written: the SDK's encoder leaves that attribute out
    and keeps the rest; so must this one, not fail the export of the whole batch."""
    stats.reset()
    attributes = {
        "before": "kept",
        "exception.message": "unknown model \ud800",
        "big": 2**64,
        "small": -(2**63) - 1,
        "in_a_list": [1, 2**63],
        "edge": 2**63 - 1,
        "after": 7,
    }
    spans = _spans_from(attributes)
    ours = encode_export_request(spans)
    assert ours == encode_spans(spans).SerializeToString(deterministic=True)
    span = ExportTraceServiceRequest.FromString(ours).resource_spans[0].scope_spans[0].spans[0]
    assert [kv.key for kv in span.attributes] == ["before", "edge", "after"]
    assert [kv.key for kv in span.events[0].attributes] == ["before", "edge", "after"]
    assert [kv.key for kv in span.links[0].attributes] == ["before", "edge", "after"]
    assert stats.snapshot()["span_attribute_unencodable"] == 3 * 4


def test_a_lone_surrogate_in_a_name_is_replaced_not_fatal() -> None:
    """The SDK's encoder fails every span of the export on a span name it cannot write
    (a status message, an event name); this encoder writes U+FFFD for the surrogate."""
    spans = _spans_from({"a": 1}, name="GET /v1/\udcff")
    request = ExportTraceServiceRequest.FromString(encode_export_request(spans))
    assert request.resource_spans[0].scope_spans[0].spans[0].name == "GET /v1/\ufffd"


def test_resources_that_differ_only_in_schema_url_stay_apart() -> None:
    spans = [
        *_spans_from({"a": 1}, resource=Resource({"service.name": "x"}, "https://s/1")),
        *_spans_from({"a": 1}, resource=Resource({"service.name": "x"}, "https://s/2")),
    ]
    assert encode_export_request(spans) == encode_spans(spans).SerializeToString(deterministic=True)


def test_empty_names_and_zero_times_are_left_out_as_protobuf_does() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("gpuscope").start_span("", start_time=0)
    span.add_event("", timestamp=0)
    span.end(end_time=0)
    spans = list(exporter.get_finished_spans())
    assert encode_export_request(spans) == encode_spans(spans).SerializeToString(deterministic=True)


def test_the_caches_keep_no_long_or_unbounded_entries() -> None:
    """Attribute keys chosen by an app (ids in keys, long keys) must not pile up."""
    for number in range(_CACHE_LIMIT + 10):
        long_key = f"{number}-" + "k" * 10_000
        encode_export_request(_spans_from({long_key: 1.5, f"id.{number}": number}))
    for cache in (_encoded_keys, _encoded_attributes, _float_prefixes):
        assert len(cache) <= _CACHE_LIMIT
    assert all(len(key) <= _CACHED_KEY_LENGTH for key in _encoded_keys)
    assert all(len(key) <= _CACHED_KEY_LENGTH for _, key, _, _ in _encoded_attributes)
    assert all(len(key) <= _CACHED_KEY_LENGTH for _, key in _float_prefixes)
