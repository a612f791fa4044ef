"""Exporter benchmarks: span ingest throughput, /metrics render time, memory under load.

Run it as a script, not with ``-m`` from the repository root (there the repo's own
``gpuscope/`` folder would shadow the installed package)::

    nice .venv/bin/python benchmarks/exporter_bench.py [--only ingest|render|memory]

1. ingest: decode (``ExportTraceServiceRequest.FromString``) plus aggregation of
   512-span requests in the middleware's mix, one core, median and spread of runs;
   protobuf decode alone is measured in the same run for the ratio.
2. render: ``/metrics`` text for 8 simulated GPUs plus 200 histogram label sets,
   against ``prometheus_client.generate_latest`` of an equivalent registry built
   from prometheus_client ``Histogram`` objects, in the same run.
3. memory: resident set size while 10 million spans over 2,000 label sets go in,
   through the aggregator in this process.
4. server-memory: the same spans posted over HTTP to a real ``gpuscope exporter``
   process (8 simulated GPUs, scraped as it goes); the child's RSS is read from
   ``/proc``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import aiohttp
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, Tracer, set_span_in_context
from opentelemetry.util.types import AttributeValue
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpuscope import spans as contract
from gpuscope.contract.exporter import REQUEST_DURATION
from gpuscope.contract.http import METRICS_PATH, READYZ_PATH, TRACES_PATH
from gpuscope.contract.rows import LATENCY_BUCKETS
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.http.render import render_chunks
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.ingest.series import HistogramFamily
from gpuscope.exporter.self_metrics import ExporterCollector, SelfMetrics

# -- realistic requests: what setup_tracing() sends for the middleware and BatchRecorder.
# Per request: one SERVER span with the HTTP, GenAI and phase attributes and its three
# phase child spans; one ``gpuscope.batch`` span (with links) per ``batch_size`` requests.

MODELS = ("llama-3-8b", "mistral-7b", "qwen-2-7b", "phi-3-mini")
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


class _Collect(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def realistic_spans(
    count: int, *, gpu_uuids: tuple[str, ...] = ("GPU-0",), batch_size: int = 8, seed: int = 1
) -> list[ReadableSpan]:
    """``count`` finished SDK spans in the middleware's mix."""
    rng = random.Random(seed)
    collected = _Collect()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "bench-worker", "service.instance.id": "i-1", "host.name": "h"}
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(collected))
    tracer = provider.get_tracer("gpuscope")
    t = 1_700_000_000_000_000_000
    while len(collected.spans) < count:
        model = rng.choice(MODELS)
        uuid = rng.choice(gpu_uuids)
        members = []
        for _ in range(batch_size):
            members.append(_request(tracer, rng, t, model, uuid, batch_size))
            t += 1_000_000
        batch = tracer.start_span(
            contract.BATCH_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            start_time=t,
            links=[Link(m) for m in members],
            attributes={
                contract.BATCH_ID: f"{t:x}",
                contract.BATCH_SIZE: batch_size,
                contract.BATCH_MAX_SIZE: 32,
                contract.BATCH_TRIGGER: contract.BatchTrigger.TIMEOUT,
                contract.GPU_UUID: uuid,
                contract.GEN_AI_REQUEST_MODEL: model,
            },
        )
        batch.end(end_time=t + 20_000_000)
    provider.shutdown()
    return collected.spans[:count]


def _request(
    tracer: Tracer, rng: random.Random, t: int, model: str, uuid: str, size: int
) -> SpanContext:
    phases = {p: rng.uniform(0.0001, 0.05) for p in contract.PHASES}
    route = rng.choice(ROUTES)
    attributes: dict[str, AttributeValue] = {
        contract.HTTP_REQUEST_METHOD: "POST",
        contract.URL_PATH: route,
        contract.URL_SCHEME: "http",
        contract.HTTP_ROUTE: route,
        contract.HTTP_RESPONSE_STATUS_CODE: 200,
        contract.GEN_AI_REQUEST_MODEL: model,
        contract.GEN_AI_OPERATION_NAME: "chat",
        contract.GEN_AI_USAGE_INPUT_TOKENS: rng.randint(10, 500),
        contract.GEN_AI_USAGE_OUTPUT_TOKENS: rng.randint(1, 200),
        contract.BATCH_ID: f"{t:x}",
        contract.BATCH_SIZE: size,
        contract.GPU_UUID: uuid,
        contract.TIME_TO_FIRST_TOKEN: rng.uniform(0.01, 0.2),
        contract.TIME_PER_OUTPUT_TOKEN: rng.uniform(0.005, 0.05),
    }
    for phase, seconds in phases.items():
        attributes[contract.PHASE_DURATION[phase]] = seconds
    server = tracer.start_span(
        f"POST {route}", kind=SpanKind.SERVER, start_time=t, attributes=attributes
    )
    parent = set_span_in_context(server)
    offset = t
    for phase, name in contract.PHASE_SPANS.items():
        child = tracer.start_span(name, parent, SpanKind.INTERNAL, start_time=offset)
        offset += int(phases[phase] * 1e9)
        child.end(end_time=offset)
    server.end(end_time=t + int(sum(phases.values()) * 1e9))
    return server.get_span_context()


def encoded_batches(
    span_count: int, batch_spans: int = 512, *, gpu_uuids: tuple[str, ...] = ("GPU-0",)
) -> Iterator[bytes]:
    """``ExportTraceServiceRequest`` protobuf bodies of ``batch_spans`` spans each."""
    spans = realistic_spans(span_count, gpu_uuids=gpu_uuids)
    for start in range(0, len(spans), batch_spans):
        yield encode_spans(spans[start : start + batch_spans]).SerializeToString()


def _spread(values: Sequence[float]) -> str:
    return (
        f"median {statistics.median(values):,.0f} (min {min(values):,.0f}, max {max(values):,.0f})"
    )


def _time(function: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def bench_ingest(runs: int) -> None:
    bodies = list(encoded_batches(512 * 40))
    spans = 512 * len(bodies)
    aggregator = SpanAggregator()

    def ingest() -> None:
        for body in bodies:
            aggregator.ingest(ExportTraceServiceRequest.FromString(body))

    def decode() -> None:
        for body in bodies:
            ExportTraceServiceRequest.FromString(body)

    ingest()  # warm the label caches, as a running exporter has them
    full = [spans / t for t in _time(ingest, runs)]
    decode_only = [spans / t for t in _time(decode, runs)]
    print(f"ingest (decode + aggregate), spans/s: {_spread(full)}")
    print(f"decode only, spans/s:                 {_spread(decode_only)}")
    share = 1 - statistics.median(full) / statistics.median(decode_only)
    print(f"aggregation share of ingest time: {share:.0%}")
    print(f"request size: 512 spans, {len(bodies[0]):,} bytes")


def _equivalent_registries() -> tuple[CollectorRegistry, SpanAggregator, CollectorRegistry]:
    """The exporter's registry and aggregator, and a prometheus_client registry with the
    same 200 label sets in a ``Histogram``; the same 8 simulated GPUs in both."""
    source = SimulatedSource(8, None)
    poller = GpuPoller(source, 1.0)
    poller.poll_once()
    aggregator = SpanAggregator()
    ours = CollectorRegistry()
    ours.register(ExporterCollector(aggregator, SelfMetrics()))
    ours.register(GpuCollector(poller))
    theirs = CollectorRegistry()
    theirs.register(GpuCollector(poller))
    histogram = Histogram(
        REQUEST_DURATION.name,
        "Request duration.",
        REQUEST_DURATION.labels,
        buckets=LATENCY_BUCKETS,
        registry=theirs,
    )
    for i in range(200):
        labels = (
            "svc",
            f"model-{i % 10}",
            "chat",
            f"/r{i // 10}",
            "200",
            f"GPU-{i % 8}",
            str(i % 8),
        )
        for j in range(50):
            seconds = 0.0003 * (j + 1) * (i % 7 + 1)
            aggregator.duration.observe(labels, seconds, (b"\x01" * 16, b"\x02" * 8, 1))
            exemplar = {"trace_id": "01" * 16, "span_id": "02" * 8}
            histogram.labels(*labels).observe(seconds, exemplar)
    return ours, aggregator, theirs


def _render(
    registry: CollectorRegistry, histograms: Sequence[HistogramFamily], accept: str
) -> tuple[bytes, str]:
    """The /metrics body as the exporter serves it (uncompressed), and its content type."""
    chunks, content_type = render_chunks(registry, histograms, accept)
    return b"".join(chunks), content_type


def bench_render(runs: int) -> None:
    ours, aggregator, theirs = _equivalent_registries()
    openmetrics = "application/openmetrics-text; version=1.0.0"
    for accept, writer, label in (
        ("", generate_latest, "text"),
        (openmetrics, generate_openmetrics, "OpenMetrics"),
    ):
        render = partial(_render, ours, aggregator.histograms, accept)
        mine = [t * 1e6 for t in _time(render, runs)]
        reference = [t * 1e6 for t in _time(partial(writer, theirs), runs)]
        size, their_size = len(render()[0]), len(writer(theirs))
        print(f"{METRICS_PATH} {label}, gpuscope, µs: {_spread(mine)}; {size:,} bytes")
        print(
            f"{METRICS_PATH} {label}, prometheus_client, µs: {_spread(reference)}; "
            f"{their_size:,} bytes"
        )
        ratio = statistics.median(reference) / statistics.median(mine)
        print(f"{METRICS_PATH} {label}, prometheus_client / gpuscope (medians): {ratio:.1f}x")


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def bench_memory(total_spans: int) -> None:
    uuids = tuple(f"GPU-{i:04d}" for i in range(167))  # 4 models x 3 routes x 167 = 2,004
    bodies = list(encoded_batches(512 * 200, gpu_uuids=uuids))
    aggregator = SpanAggregator(max_series=2500)
    done = 0
    checkpoints = []
    while done < total_spans:
        for body in bodies:
            aggregator.ingest(ExportTraceServiceRequest.FromString(body))
            done += 512
        gc.collect()
        checkpoints.append((done, _rss_mib(), len(aggregator.duration)))
    step = max(1, len(checkpoints) // 5)
    for spans, rss, series in checkpoints[::step] + checkpoints[-1:]:
        print(f"after {spans:>11,} spans: RSS {rss:7.1f} MiB, duration label sets {series:,}")


def _child_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _post_all(url: str, bodies: Sequence[bytes], senders: int) -> None:
    headers = {"Content-Type": "application/x-protobuf"}
    async with aiohttp.ClientSession() as session:

        async def send(share: Sequence[bytes]) -> None:
            for body in share:
                async with session.post(url, data=body, headers=headers) as response:
                    if response.status != 200:
                        raise RuntimeError(f"exporter answered {response.status}")
                    await response.read()

        await asyncio.gather(*(send(bodies[i::senders]) for i in range(senders)))


def bench_server_memory(total_spans: int) -> None:
    uuids = tuple(f"GPU-{i:04d}" for i in range(167))
    bodies = list(encoded_batches(512 * 200, gpu_uuids=uuids))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "gpuscope", "exporter", "--listen", f"127.0.0.1:{port}"]
    command += ["--gpu-source", "simulated", "--simulated-gpus", "8", "--max-series", "2500"]
    command += ["--log-level", "warning"]
    child = subprocess.Popen(command)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):  # a child process gives no readiness event to wait on
            with contextlib.suppress(OSError):
                urllib.request.urlopen(base + READYZ_PATH, timeout=1).close()
                break
            time.sleep(0.1)
        done, passes, started = 0, 0, time.perf_counter()
        print(f"exporter pid {child.pid}: RSS {_child_rss_mib(child.pid):7.1f} MiB at start")
        while done < total_spans:
            asyncio.run(_post_all(base + TRACES_PATH, bodies, senders=2))
            done += 512 * len(bodies)
            passes += 1
            scrape = urllib.request.urlopen(base + METRICS_PATH, timeout=30).read()
            rate = done / (time.perf_counter() - started)
            if passes % 10 and done < total_spans and passes > 1:
                continue
            print(
                f"after {done:>11,} spans: RSS {_child_rss_mib(child.pid):7.1f} MiB, "
                f"/metrics {len(scrape):,} bytes, {rate:,.0f} spans/s over HTTP",
                flush=True,
            )
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--memory-spans", type=int, default=10_000_000)
    parser.add_argument("--only", choices=("ingest", "render", "memory", "server-memory"))
    args = parser.parse_args(argv)
    print(f"python {sys.version.split()[0]}")
    if args.only in (None, "ingest"):
        bench_ingest(args.runs)
    if args.only in (None, "render"):
        bench_render(args.runs * 5)
    if args.only in (None, "memory"):
        bench_memory(args.memory_spans)
    if args.only in (None, "server-memory"):
        bench_server_memory(args.memory_spans)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
