"""setup_tracing(): spans reach a real OTLP/HTTP endpoint on loopback as protobuf."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuscope.middleware import GpuscopeMiddleware, current_timeline, setup_tracing, stats
from gpuscope.middleware.export import OtlpHttpExporter
from gpuscope.middleware.tracing import DEFAULT_ENDPOINT, resolve_endpoint
from gpuscope.middleware.types import Receive, Scope, Send
from support.middleware_asgi import call, http_scope

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


class OtlpSink(ThreadingHTTPServer):
    """A minimal OTLP/HTTP traces endpoint that keeps what it receives."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.requests: list[tuple[str, ExportTraceServiceRequest]] = []
        self.received = threading.Event()
        # statuses to answer with, in order, before answering 200 (with Retry-After: 0)
        self.failures: list[int] = []
        self.reply = ExportTraceServiceResponse()
        self.attempts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _OtlpHandler(BaseHTTPRequestHandler):
    server: OtlpSink

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.attempts += 1
        if self.server.failures:
            self.send_response(self.server.failures.pop(0))
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"busy")
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        self.server.requests.append((self.headers["Content-Type"], request))
        self.server.received.set()
        reply = self.server.reply.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def otlp_sink() -> Iterator[OtlpSink]:
    sink = OtlpSink()
    # shutdown() waits for the loop's next look at its flag: every 50 ms, not the
    # default 0.5 s that each test's teardown spent
    thread = threading.Thread(target=sink.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield sink
    sink.shutdown()
    sink.server_close()


async def marked_app(scope: Scope, receive: Receive, send: Send) -> None:
    timeline = current_timeline()
    assert timeline is not None
    timeline.enqueued()
    timeline.admitted()
    timeline.dispatched()
    timeline.computed()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_spans_reach_a_real_otlp_endpoint_as_protobuf(otlp_sink: OtlpSink) -> None:
    provider = setup_tracing(otlp_sink.url, "embedding-svc", set_global=False)
    app = GpuscopeMiddleware(marked_app, tracer_provider=provider, phase_spans=True)
    await call(app, http_scope("/v1/embeddings", "POST"))
    assert provider.force_flush(10_000)
    assert otlp_sink.received.wait(10)
    provider.shutdown()

    content_type, request = otlp_sink.requests[0]
    assert content_type == "application/x-protobuf"
    (resource_spans,) = request.resource_spans
    resource = {kv.key: kv.value for kv in resource_spans.resource.attributes}
    assert resource["service.name"].string_value == "embedding-svc"
    assert resource["process.pid"].int_value > 0
    assert resource["service.instance.id"].string_value
    spans = [span for scope in resource_spans.scope_spans for span in scope.spans]
    names = sorted(span.name for span in spans)
    assert names == ["POST", "gpuscope.batch_wait", "gpuscope.compute", "gpuscope.queue"]
    server = next(span for span in spans if span.name == "POST")
    keys = {kv.key for kv in server.attributes}
    assert {"gpuscope.queue.duration", "gpuscope.compute.duration"} <= keys


async def test_an_unreachable_endpoint_costs_spans_never_requests(otlp_sink: OtlpSink) -> None:
    url = otlp_sink.url
    otlp_sink.shutdown()
    otlp_sink.server_close()  # nothing listens there any more
    stats.reset()
    provider = setup_tracing(url, "svc", timeout_s=0.5, set_global=False)
    app = GpuscopeMiddleware(marked_app, tracer_provider=provider, phase_spans=True)
    sent = await call(app, http_scope())
    assert sent[1]["body"] == b"ok"
    provider.force_flush(5_000)
    provider.shutdown()
    assert stats.snapshot().get("spans_export_failed", 0) == 4


def finished_spans(count: int) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for i in range(count):
        provider.get_tracer("t").start_span(f"span-{i}").end()
    return list(exporter.get_finished_spans())


def test_retryable_answers_are_retried_until_accepted(otlp_sink: OtlpSink) -> None:
    otlp_sink.failures = [503, 429]
    exporter = OtlpHttpExporter(otlp_sink.url, timeout_s=5, compression="gzip")
    assert exporter.export(finished_spans(3)) is SpanExportResult.SUCCESS
    assert otlp_sink.attempts == 3
    _, request = otlp_sink.requests[0]
    assert [s.name for s in request.resource_spans[0].scope_spans[0].spans] == [
        "span-0",
        "span-1",
        "span-2",
    ]
    exporter.shutdown()


def test_spans_the_receiver_rejects_are_counted(otlp_sink: OtlpSink) -> None:
    stats.reset()
    otlp_sink.reply.partial_success.rejected_spans = 2
    otlp_sink.reply.partial_success.error_message = "2 spans had a negative duration"
    exporter = OtlpHttpExporter(otlp_sink.url, timeout_s=5)
    assert exporter.export(finished_spans(3)) is SpanExportResult.SUCCESS
    assert otlp_sink.attempts == 1  # a partial success is not retried
    assert stats.snapshot()["spans_rejected_by_receiver"] == 2
    exporter.shutdown()


def test_a_rejected_batch_is_not_retried(otlp_sink: OtlpSink) -> None:
    otlp_sink.failures = [400]
    exporter = OtlpHttpExporter(otlp_sink.url, timeout_s=5)
    assert exporter.export(finished_spans(1)) is SpanExportResult.FAILURE
    assert otlp_sink.attempts == 1
    with pytest.raises(ValueError, match="compression"):
        OtlpHttpExporter(otlp_sink.url, compression="zstd")


def test_endpoint_resolution_follows_the_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert resolve_endpoint() == DEFAULT_ENDPOINT == "http://127.0.0.1:9420/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert resolve_endpoint() == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4318/custom")
    assert resolve_endpoint() == "http://tempo:4318/custom"
    assert resolve_endpoint("http://explicit/v1/traces") == "http://explicit/v1/traces"


def test_importing_the_middleware_pulls_in_no_sdk_aiohttp_nvml_or_prometheus_client() -> None:
    code = (
        "import sys, gpuscope.middleware; from gpuscope.middleware import stats; "
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'aiohttp',"
        " 'pynvml', 'opentelemetry.exporter', 'prometheus_client', 'requests', 'urllib3'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert result.stdout.strip() == "[]"
