"""Encoding cost per span: gpuscope's OTLP encoder against the SDK's ``encode_spans``.

Two span sets. ``synthetic``: one batched request built by hand, a server span with its
phase, model, token and batch attributes, its three phase spans, and a batch span with
eight links. ``middleware``: what ``GpuscopeMiddleware`` really emits with its phase
children off (the default), taken from ``middleware_overhead.py``'s gpuscope case: a
server span with fifteen attributes per request and a batch span per eight requests.

    .venv/bin/python benchmarks/middleware_otlp_encoding.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence

from middleware_overhead import configurations, drive
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import AttributeValue

from gpuscope.middleware.otlp_encoding import encode_export_request
from gpuscope.middleware.span_pipeline import BoundedTracerProvider, CountingBatchSpanProcessor


def request_spans() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "embedder"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gpuscope", "0.1.0")
    attributes: dict[str, AttributeValue] = {
        "http.request.method": "POST",
        "url.path": "/v1/embeddings",
        "url.scheme": "http",
        "http.route": "/v1/embeddings",
        "http.response.status_code": 200,
        "gen_ai.request.model": "mlp",
        "gen_ai.operation.name": "embeddings",
        "gen_ai.usage.input_tokens": 128,
        "gpuscope.batch.id": "1f2e-a1b2c3-42",
        "gpuscope.batch.size": 8,
        "gpuscope.gpu.uuid": "GPU-5f1c7a8e-0000-4000-8000-000000000000",
    }
    for phase in ("preprocess", "queue", "compute"):
        attributes[f"gpuscope.{phase}.duration"] = 0.001
    server = tracer.start_span("POST /v1/embeddings", kind=SpanKind.SERVER, attributes=attributes)
    parent = trace.set_span_in_context(server)
    for name in ("gpuscope.queue", "gpuscope.batch_wait", "gpuscope.compute"):
        tracer.start_span(name, parent).end()
    server.end()
    links = [Link(server.get_span_context())] * 8
    tracer.start_span("gpuscope.batch", links=links, attributes={"gpuscope.batch.size": 8}).end()
    return list(exporter.get_finished_spans())


class KeepExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def middleware_spans(requests: int) -> list[ReadableSpan]:
    """What the gpuscope case of ``middleware_overhead.py`` emits for ``requests``."""
    exporter = KeepExporter()
    provider = BoundedTracerProvider(
        CountingBatchSpanProcessor(exporter, max_queue_size=65536),
        resource=Resource.create({"service.name": "embedder"}),
        sampler=ALWAYS_ON,
        shutdown_timeout_s=30.0,
    )
    build, _ = configurations(1)["gpuscope"]
    asyncio.run(drive(build(provider), requests))
    provider.shutdown()
    return exporter.spans


def per_span_us(encode: Callable[[], object], spans: int, repeat: int = 50) -> float:
    start = time.perf_counter_ns()
    for _ in range(repeat):
        encode()
    return (time.perf_counter_ns() - start) / repeat / spans / 1000


def compare(label: str, spans: list[ReadableSpan], rounds: int) -> None:
    batches = [spans[i : i + 512] for i in range(0, len(spans), 512)]  # an export's batch
    encoders: dict[str, Callable[[], object]] = {
        "sdk encode_spans": lambda: [encode_spans(b).SerializePartialToString() for b in batches],
        "gpuscope otlp_encoding": lambda: [encode_export_request(b) for b in batches],
    }
    samples: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(rounds):
        for name, encode in encoders.items():
            samples[name].append(per_span_us(encode, len(spans)))
    print(f"{label}: µs per span, {len(spans)} spans, median (min–max) of {rounds} rounds")
    for name, values in samples.items():
        spread = f"{min(values):.2f}–{max(values):.2f}"
        print(f"  {name:24} {statistics.median(values):6.2f} ({spread})")
    ratio = statistics.median(samples["sdk encode_spans"]) / statistics.median(
        samples["gpuscope otlp_encoding"]
    )
    print(f"  speed-up: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    compare("synthetic", request_spans() * 100, args.rounds)
    compare("middleware", middleware_spans(512), args.rounds)


if __name__ == "__main__":
    main()
