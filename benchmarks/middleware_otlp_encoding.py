"""Encoding cost per span: gpuscope's OTLP encoder against the SDK's ``encode_spans``.

The spans are what the middleware emits for one batched request: a server span with
its phase, model, token and batch attributes, its three phase spans, and a batch
span with eight links.

    .venv/bin/python benchmarks/middleware_otlp_encoding.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import AttributeValue

from gpuscope.middleware.otlp_encoding import encode_export_request


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


def per_span_us(encode: Callable[[], object], spans: int, repeat: int = 50) -> float:
    start = time.perf_counter_ns()
    for _ in range(repeat):
        encode()
    return (time.perf_counter_ns() - start) / repeat / spans / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    spans = request_spans() * 100
    encoders: dict[str, Callable[[], object]] = {
        "sdk encode_spans": lambda: encode_spans(spans).SerializePartialToString(),
        "gpuscope otlp_encoding": lambda: encode_export_request(spans),
    }
    samples: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(args.rounds):
        for name, encode in encoders.items():
            samples[name].append(per_span_us(encode, len(spans)))
    print(f"µs per span, {len(spans)} spans per request, median (min–max) of {args.rounds} rounds")
    for name, values in samples.items():
        print(f"{name:24} {statistics.median(values):6.2f} ({min(values):.2f}–{max(values):.2f})")
    ratio = statistics.median(samples["sdk encode_spans"]) / statistics.median(
        samples["gpuscope otlp_encoding"]
    )
    print(f"speed-up: {ratio:.2f}x")


if __name__ == "__main__":
    main()
