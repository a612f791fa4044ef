"""CPU cost per request of GpuscopeMiddleware against the bare app, OpenTelemetry's
ASGI middleware (default, and server span only) and starlette-exporter, measured in
one run, in-process (no sockets).

gpuscope runs with its phase child spans off (the default) and on. Encoded, it runs
with its own OTLP encoder and with the SDK's, which says whether the hand-written
encoder still earns its keep now that a request has one span and a share of a batch
span instead of four spans. starlette-exporter makes no spans: it observes Prometheus
metrics in the process (``group_paths=False, filter_unhandled_paths=False`` so that the
raw ASGI app's path is counted), the usual alternative to tracing for RED metrics.

Each tool runs on the provider it ships with: OpenTelemetry's middleware on the SDK's
``TracerProvider`` with a ``BatchSpanProcessor``, gpuscope on ``setup_tracing()``'s
``BoundedTracerProvider`` with its ``CountingBatchSpanProcessor``. The processor feeds
either a discarding exporter or one that encodes spans to OTLP protobuf and drops the
bytes, with the encoder each side ships: the SDK's ``encode_spans`` (used by
``OTLPSpanExporter``) for OpenTelemetry's middleware, gpuscope's ``otlp_encoding`` for
gpuscope (``gpuscope-sdk-encoder`` swaps in the SDK's). CPU time is ``process_time``, so
the processor's export thread is included. Requests arrive in groups of
``BATCH_SIZE`` and the app serves each group as one batch (every request waits until
its batch is full) in every configuration, the bare app's included; under gpuscope the
app also marks every phase and records the batch through ``BatchRecorder``, so each
request carries its share of a batch span.

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
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from starlette_exporter import PrometheusMiddleware

from gpuscope.middleware import (
    BatchRecorder,
    GpuscopeMiddleware,
    RequestTimeline,
    current_timeline,
)
from gpuscope.middleware.otlp_encoding import encode_export_request
from gpuscope.middleware.span_pipeline import BoundedTracerProvider, CountingBatchSpanProcessor
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
    """An app that serves requests in batches of ``BATCH_SIZE``, whichever middleware
    wraps it: each request waits on a future until its batch is full. Only with a
    ``recorder`` (under gpuscope) does it mark the phases and record the batch, so the
    waiting, an application's own cost, is in every configuration's baseline alike."""
    body = b"x" * 64
    forming: list[tuple[RequestTimeline | None, asyncio.Future[None]]] = []

    async def run_in_batch(timeline: RequestTimeline | None) -> None:
        if timeline is not None:
            timeline.enqueued()
        done = asyncio.get_running_loop().create_future()
        forming.append((timeline, done))
        if len(forming) == BATCH_SIZE:
            if recorder is not None:
                batch = recorder.batch()
                for member, _ in forming:
                    if member is not None:
                        batch.admit(member)
                with batch.compute(trigger="full"):
                    pass
            for _, waiter in forming:
                waiter.set_result(None)
            forming.clear()
        await done

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await run_in_batch(current_timeline() if recorder is not None else None)
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

    def gpuscope(children: bool) -> Config:
        def build(provider: TracerProvider | None) -> ASGIApp:
            recorder = BatchRecorder(max_size=BATCH_SIZE, model="mlp", tracer_provider=provider)
            app = make_app(chunks, recorder)
            return GpuscopeMiddleware(app, tracer_provider=provider, phase_spans=children)

        return build

    def otel_asgi(provider: TracerProvider | None) -> ASGIApp:
        app: ASGIApp = OpenTelemetryMiddleware(make_app(chunks, None), tracer_provider=provider)
        return app

    def otel_server_span(provider: TracerProvider | None) -> ASGIApp:
        app: ASGIApp = OpenTelemetryMiddleware(
            make_app(chunks, None), tracer_provider=provider, exclude_spans=["receive", "send"]
        )
        return app

    def starlette_exporter(provider: TracerProvider | None) -> ASGIApp:
        app: ASGIApp = PrometheusMiddleware(
            make_app(chunks, None), group_paths=False, filter_unhandled_paths=False
        )
        return app

    return {
        "bare": (bare, False),
        "gpuscope": (gpuscope(False), True),
        "gpuscope-children": (gpuscope(True), True),
        "gpuscope-sdk-encoder": (gpuscope(False), True),
        "otel-asgi-server": (otel_server_span, True),
        "otel-asgi": (otel_asgi, True),
        "starlette-exporter": (starlette_exporter, False),
    }


def measure(name: str, chunks: int, encode: bool, requests: int) -> float:
    build, traced = configurations(chunks)[name]
    provider: TracerProvider | None = None
    if traced:
        exporter: SpanExporter = DiscardExporter()
        if encode:
            own = name in ("gpuscope", "gpuscope-children")
            exporter = GpuscopeEncodeExporter() if own else SdkEncodeExporter()
        if name.startswith("gpuscope"):
            # as setup_tracing() ships it: gpuscope's pipeline and provider
            provider = BoundedTracerProvider(
                CountingBatchSpanProcessor(exporter, max_queue_size=65536),
                resource=Resource.create({}),
                sampler=ALWAYS_ON,
                shutdown_timeout_s=30.0,
            )
        else:
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
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


def summarize(samples: list[float], digits: int = 1) -> str:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    d = digits
    return f"{statistics.median(samples):7.{d}f} (IQR {q[0]:.{d}f}–{q[2]:.{d}f})"


def round_ratios(
    samples: dict[tuple[str, int, bool], list[float]], name: str, peer: str, encode: bool
) -> list[float]:
    """The overhead ratio within each round (one chunk). The cases of a round run
    minutes apart at most, so a machine that is slower for a while slows both sides
    of its ratio alike; the spread of these says how far the ratio of medians is from
    a chance reading."""
    bare = samples[("bare", 1, False)]
    ours = samples[(name, 1, encode)]
    theirs = samples[(peer, 1, encode)]
    return [(o - b) / (t - b) for o, t, b in zip(ours, theirs, bare, strict=True)]


SPANS = ("gpuscope", "gpuscope-children", "otel-asgi-server", "otel-asgi")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cases = [
        *((name, 1, False) for name in ("bare", *SPANS, "starlette-exporter")),
        *((name, 32, False) for name in ("bare", "gpuscope", "otel-asgi-server", "otel-asgi")),
        *((name, 1, True) for name in (*SPANS, "gpuscope-sdk-encoder")),
    ]
    samples: dict[tuple[str, int, bool], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):  # interleave cases so machine noise hits all alike
        for case in cases:
            samples[case].append(measure(*case, requests=args.requests))
    print(f"CPU µs per request, median (IQR) of {args.rounds} rounds x {args.requests} requests")
    print(f"{'configuration':40} {'µs/request':>24} {'overhead µs':>12}")
    for case in cases:
        name, chunks, encode = case
        label = f"{name}, {chunks} chunk(s){', OTLP-encoded' if encode else ''}"
        print(f"{label:40} {summarize(samples[case]):>24} {over(samples, *case):12.1f}")
    for encode in (False, True):
        suffix = "OTLP-encoded" if encode else "discarded"
        for name, peer in (
            ("gpuscope", "otel-asgi-server"),
            ("gpuscope", "otel-asgi"),
            ("gpuscope-children", "otel-asgi-server"),
        ):
            ratio = over(samples, name, 1, encode) / over(samples, peer, 1, encode)
            rounds = summarize(round_ratios(samples, name, peer, encode), digits=2)
            print(
                f"[{suffix}] {name}/{peer} overhead ratio (1 chunk): {ratio:.2f}"
                f"; per round {rounds.strip()}"
            )
    ratio = over(samples, "gpuscope", 1, False) / over(samples, "starlette-exporter", 1, False)
    print(f"[discarded] gpuscope/starlette-exporter overhead ratio (1 chunk): {ratio:.2f}")
    stream = over(samples, "gpuscope", 32, False) / over(samples, "gpuscope", 1, False)
    print(f"[discarded] gpuscope overhead 32 chunks / 1 chunk: {stream:.2f}")
    hand = over(samples, "gpuscope", 1, True) / over(samples, "gpuscope-sdk-encoder", 1, True)
    print(f"[OTLP-encoded] gpuscope overhead, own encoder / SDK encoder: {hand:.2f}")


def over(
    samples: dict[tuple[str, int, bool], list[float]], name: str, chunks: int, encode: bool
) -> float:
    """Median µs per request over the bare app's median with as many chunks."""
    bare = statistics.median(samples[("bare", chunks, False)])
    return statistics.median(samples[(name, chunks, encode)]) - bare


if __name__ == "__main__":
    main()
