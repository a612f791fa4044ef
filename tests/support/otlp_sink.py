"""An OTLP/HTTP receiver that keeps every span it is sent, decoded, with its resource:
what the exporter's ``--forward-otlp`` passed on, for tests that check traces end to end
(the live Ray Serve check)."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: its resource's and its own attributes decoded."""

    resource: dict[str, Any]
    scope: str
    name: str
    kind: int  # OTLP's SpanKind: 2 is SERVER, 1 INTERNAL
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace_id, span_id), hex


@dataclass
class OtlpSink:
    """An ASGI app receiving OTLP/HTTP protobuf exports (gzip or not)."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    # the export requests as they came, for tests that keep or replay them whole
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if dict(scope["headers"]).get(b"content-encoding") == b"gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = [
            ReceivedSpan(
                resource=_attributes(resource_spans.resource.attributes),
                scope=scope_spans.scope.name,
                name=span.name,
                kind=span.kind,
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                start_ns=span.start_time_unix_nano,
                end_ns=span.end_time_unix_nano,
                attributes=_attributes(span.attributes),
                links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
            )
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self._lock:
            self.spans.extend(received)
            self.requests.append(request)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/x-protobuf")],
            }
        )
        await send(
            {"type": "http.response.body", "body": ExportTraceServiceResponse().SerializeToString()}
        )

    def of_service(self, service: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.resource.get("service.name") == service]
