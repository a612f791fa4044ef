"""CPU cost per request of GpuscopeMiddleware against the bare app and OpenTelemetry's
ASGI middleware, measured in one run, in-process (no sockets).

Every configuration uses the same SDK ``TracerProvider`` set-up: a ``BatchSpanProcessor``
feeding either a discarding exporter or one that encodes spans to OTLP protobuf and
drops the bytes, with the encoder each side ships: the SDK's ``encode_spans`` (used by
``OTLPSpanExporter``) for OpenTelemetry's middleware, gpuscope's ``otlp_encoding``
(used by ``setup_tracing()``) for gpuscope. CPU time is ``process_time``, so
the processor's export thread is included. Requests arrive in groups of
``BATCH_SIZE``; under gpuscope the app marks every phase and the group runs as one
batch through ``BatchRecorder``, so each request carries its share of a batch span.

    .venv/bin/python benchmarks/middleware_overhead.py [--requests 3000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from gpuscope.middleware import (
    BatchRecorder,
    GpuscopeMiddleware,
    RequestTimeline,
    current_timeline,
)
from gpuscope.middleware.otlp_encoding import encode_export_request
from gpuscope.middleware.types import ASGIApp, Message, Receive, Scope, Send


class DiscardExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class SdkEncodeExporter(SpanExporter):
    """Encodes like the SDK's OTLP/HTTP exporter, then drops the bytes."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_spans(spans).SerializePartialToString()
        return SpanExportResult.SUCCESS


class GpuscopeEncodeExporter(SpanExporter):
    """Encodes like gpuscope's ``OtlpHttpExporter``, then drops the bytes."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_export_request(spans)
        return SpanExportResult.SUCCESS


BATCH_SIZE = 8


def make_app(chunks: int, recorder: BatchRecorder | None) -> ASGIApp:
    body = b"x" * 64
    forming: list[tuple[RequestTimeline, asyncio.Future[None]]] = []

    async def run_in_batch(timeline: RequestTimeline, recorder: BatchRecorder) -> None:
        timeline.enqueued()
        done = asyncio.get_running_loop().create_future()
        forming.append((timeline, done))
        if len(forming) == BATCH_SIZE:
            batch = recorder.batch()
            for member, _ in forming:
                batch.admit(member)
            with batch.compute(trigger="full"):
                pass
            for _, waiter in forming:
                waiter.set_result(None)
            forming.clear()
        await done

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        timeline = current_timeline()
        if timeline is not None and recorder is not None:
            await run_in_batch(timeline, recorder)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(chunks):
            await send({"type": "http.response.body", "body": body, "more_body": i < chunks - 1})

    return app


SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.4"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/embeddings",
    "raw_path": b"/v1/embeddings",
    "root_path": "",
    "query_string": b"",
    "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8000),
}


async def drive(app: ASGIApp, requests: int) -> float:
    """CPU microseconds per request over ``requests`` sequential requests."""

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        pass

    start = time.process_time_ns()
    for _ in range(requests // BATCH_SIZE):
        await asyncio.gather(*(app(dict(SCOPE), receive, send) for _ in range(BATCH_SIZE)))
    return (time.process_time_ns() - start) / requests / 1000


Config = Callable[[TracerProvider | None], ASGIApp]


def configurations(chunks: int) -> dict[str, tuple[Config, bool]]:
    """name -> (build the app for a provider, needs a provider)."""

    def bare(provider: TracerProvider | None) -> ASGIApp:
        return make_app(chunks, None)

    def gpuscope(provider: TracerProvider | None) -> ASGIApp:
        recorder = BatchRecorder(max_size=BATCH_SIZE, model="mlp", tracer_provider=provider)
        return GpuscopeMiddleware(make_app(chunks, recorder), tracer_provider=provider)

    def otel_asgi(provider: TracerProvider | None) -> ASGIApp:
        app: ASGIApp = OpenTelemetryMiddleware(make_app(chunks, None), tracer_provider=provider)
        return app

    return {"bare": (bare, False), "gpuscope": (gpuscope, True), "otel-asgi": (otel_asgi, True)}


def measure(name: str, chunks: int, encode: bool, requests: int) -> float:
    build, traced = configurations(chunks)[name]
    provider: TracerProvider | None = None
    processor: BatchSpanProcessor | None = None
    if traced:
        provider = TracerProvider()
        exporter: SpanExporter = DiscardExporter()
        if encode:
            exporter = GpuscopeEncodeExporter() if name == "gpuscope" else SdkEncodeExporter()
        processor = BatchSpanProcessor(exporter, max_queue_size=65536)
        provider.add_span_processor(processor)
    app = build(provider)
    asyncio.run(drive(app, 25 * BATCH_SIZE))  # warm-up
    result = asyncio.run(drive_and_flush(app, requests, provider))
    if provider is not None:
        provider.shutdown()
    return result


async def drive_and_flush(app: ASGIApp, requests: int, provider: TracerProvider | None) -> float:
    start = time.process_time_ns()
    await drive(app, requests)
    if provider is not None:
        provider.force_flush()  # the export work belongs to these requests
    return (time.process_time_ns() - start) / requests / 1000


def summarize(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return f"{statistics.median(samples):7.1f} (IQR {q[0]:.1f}–{q[2]:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cases = [
        (name, chunks, encode)
        for encode in (False, True)
        for chunks in (1, 32)
        for name in ("bare", "gpuscope", "otel-asgi")
        if not (name == "bare" and encode)
    ]
    samples: dict[tuple[str, int, bool], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):  # interleave cases so machine noise hits all alike
        for case in cases:
            samples[case].append(measure(*case, requests=args.requests))
    print(f"CPU µs per request, median (IQR) of {args.rounds} rounds x {args.requests} requests")
    print(f"{'configuration':34} {'µs/request':>24} {'overhead µs':>12}")
    for case in cases:
        name, chunks, encode = case
        bare = statistics.median(samples[("bare", chunks, False)])
        overhead = statistics.median(samples[case]) - bare
        label = f"{name}, {chunks} chunk(s){', OTLP-encoded' if encode else ''}"
        print(f"{label:34} {summarize(samples[case]):>24} {overhead:12.1f}")
    for encode in (False, True):

        def over(name: str, chunks: int, encode: bool = encode) -> float:
            bare = statistics.median(samples[("bare", chunks, False)])
            return statistics.median(samples[(name, chunks, encode)]) - bare

        suffix = "OTLP-encoded" if encode else "discarded"
        ratio = over("gpuscope", 1) / over("otel-asgi", 1)
        stream = over("gpuscope", 32) / over("gpuscope", 1)
        print(f"[{suffix}] gpuscope/otel-asgi overhead ratio (1 chunk): {ratio:.2f}")
        print(f"[{suffix}] gpuscope overhead 32 chunks / 1 chunk: {stream:.2f}")


if __name__ == "__main__":
    main()
