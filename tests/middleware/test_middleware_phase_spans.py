"""Phase child spans: off by default, on when asked (argument, ``GPUSCOPE_PHASE_SPANS``,
the worker's ``--phase-spans``), and on by themselves where the spans reach a trace
backend: a receiver that is not a gpuscope exporter, or one that forwards."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from gpuscope import spans
from gpuscope.exporter.service import start_exporter
from gpuscope.middleware import GpuscopeMiddleware, PhaseSpans, current_timeline, setup_tracing
from gpuscope.middleware.phase_spans import PhaseSpanEmitter
from gpuscope.middleware.types import Receive, Scope, Send
from gpuscope.worker.config import WorkerConfig
from support.exporter_fixtures import loopback_config
from support.middleware_asgi import call, http_scope
from support.span_recorder import SpanRecorder

CHILDREN = {"gpuscope.queue", "gpuscope.batch_wait", "gpuscope.compute"}


async def marked_app(scope: Scope, receive: Receive, send: Send) -> None:
    timeline = current_timeline()
    assert timeline is not None
    timeline.enqueued()
    timeline.admitted()
    timeline.dispatched()
    timeline.computed()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def child_names(app: GpuscopeMiddleware, recorder: SpanRecorder) -> set[str]:
    await call(app, http_scope("/", "POST"))
    (server,) = recorder.server_spans()
    assert spans.PHASE_DURATION["compute"] in (server.attributes or {})  # the exporter's input
    return {span.name for span in recorder.children_of(server)}


async def test_off_by_default(span_recorder: SpanRecorder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSCOPE_PHASE_SPANS", raising=False)
    app = GpuscopeMiddleware(marked_app, tracer_provider=span_recorder.provider)
    assert await child_names(app, span_recorder) == set()


@pytest.mark.parametrize("asked", [True, PhaseSpans.ON])
async def test_on_when_asked(span_recorder: SpanRecorder, asked: bool | PhaseSpans) -> None:
    app = GpuscopeMiddleware(marked_app, tracer_provider=span_recorder.provider, phase_spans=asked)
    assert await child_names(app, span_recorder) == CHILDREN


@pytest.mark.parametrize(
    ("value", "expected"), [("on", CHILDREN), ("off", set()), ("bogus", set())]
)
async def test_the_environment_twin(
    span_recorder: SpanRecorder, monkeypatch: pytest.MonkeyPatch, value: str, expected: set[str]
) -> None:
    monkeypatch.setenv("GPUSCOPE_PHASE_SPANS", value)
    app = GpuscopeMiddleware(marked_app, tracer_provider=span_recorder.provider)
    assert await child_names(app, span_recorder) == expected


def test_the_worker_flag_shares_the_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuscope import flags

    assert flags.parse(WorkerConfig, ["--phase-spans", "on"]).phase_spans is PhaseSpans.ON
    monkeypatch.setenv("GPUSCOPE_PHASE_SPANS", "off")
    assert flags.parse(WorkerConfig, []).phase_spans is PhaseSpans.OFF


def test_unsampled_parents_get_no_children() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gpuscope")
    server = tracer.start_span("GET")
    PhaseSpanEmitter(tracer, provider, PhaseSpans.ON).emit(server, [("gpuscope.queue", 1, 2)])
    assert exporter.get_finished_spans() == ()


class Backend(ThreadingHTTPServer):
    """An OTLP/HTTP receiver that is not a gpuscope exporter (a collector, Tempo)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _BackendHandler)
        self.names: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _BackendHandler(BaseHTTPRequestHandler):
    server: Backend

    def do_POST(self) -> None:
        request = ExportTraceServiceRequest.FromString(
            self.rfile.read(int(self.headers["Content-Length"]))
        )
        self.server.names += [
            span.name
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def backend() -> Iterator[Backend]:
    server = Backend()
    # shutdown() waits for the loop's next look at its flag: every 50 ms, not 0.5 s
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


async def exported_names(endpoint: str, requests: int) -> list[list[str]]:
    """The span names of ``requests`` requests sent one after another, each exported
    (and answered) before the next, through ``setup_tracing``'s own exporter."""
    provider = setup_tracing(endpoint, "svc", set_global=False, schedule_delay_ms=10)
    recorder = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(recorder))
    app = GpuscopeMiddleware(marked_app, tracer_provider=provider)
    names = []
    try:
        for _ in range(requests):
            recorder.clear()
            await call(app, http_scope("/", "POST"))
            assert await asyncio.to_thread(provider.force_flush, 10_000)
            names.append(sorted(span.name for span in recorder.get_finished_spans()))
    finally:
        await asyncio.to_thread(provider.shutdown)
    return names


async def test_auto_turns_on_once_a_trace_backend_has_answered(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the first answer the receiver is unknown: off, as by default."""
    monkeypatch.delenv("GPUSCOPE_PHASE_SPANS", raising=False)
    first, second = await exported_names(backend.url, 2)
    assert first == ["POST"]
    assert second == sorted(["POST", *CHILDREN])
    assert set(backend.names) == {"POST", *CHILDREN}


@pytest.mark.parametrize("forwarding", [False, True])
async def test_auto_follows_what_the_exporter_says(
    monkeypatch: pytest.MonkeyPatch, forwarding: bool
) -> None:
    """A gpuscope exporter drops the children unless it forwards to a trace backend
    (here an address nothing listens on: forwarding fails, and is counted, but it is on)."""
    monkeypatch.delenv("GPUSCOPE_PHASE_SPANS", raising=False)
    forward = {"forward_otlp": "http://127.0.0.1:9/v1/traces"} if forwarding else {}
    exporter = await start_exporter(loopback_config(**forward))
    try:
        names = await exported_names(exporter.url + "/v1/traces", 3)
    finally:
        await exporter.stop()
    later = sorted(["POST", *CHILDREN]) if forwarding else ["POST"]
    assert names == [["POST"], later, later]
