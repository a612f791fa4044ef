"""How long a /metrics scrape holds the exporter's event loop, and what a series costs.

Run it as a script (see exporter_bench.py for why)::

    nice .venv/bin/python benchmarks/exporter_scrape_stall.py [--series 20000] [--rounds 5]

The exporter runs in this process with ``--max-series`` = ``--series``, filled to the
cap in every request family: ``--series`` spans, each of its own model, with all five
phases, TTFT, TPOT and token counts (so duration, TTFT and TPOT hold ``--series``
label sets each, phases and tokens reach the cap too). Then, per round:

- before: the exposition rendered on the event loop, as the handler did before it
  moved rendering to a thread; the loop stall is the render time.
- after: ``GET /metrics`` by ``curl`` (another process, so that reading the answer
  costs this loop nothing); the stall is the longest gap seen by a task that wakes
  every millisecond while the scrape runs.

Both in text and OpenMetrics (exemplars). Also: scrape size and traced memory
(``tracemalloc``) per 1,000 series.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gpuscope import spans as contract
from gpuscope.contract.http import METRICS_PATH
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.source import GpuSourceKind
from gpuscope.exporter.http.render import render_chunks
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.service import start_exporter
from gpuscope.exporter.state import STATE

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
T0 = 1_700_000_000_000_000_000


def requests_with_distinct_models(count: int, per_request: int = 500) -> list[Any]:
    """``count`` server spans, model ``m{i}`` each, in requests of ``per_request``."""
    requests = []
    for first in range(0, count, per_request):
        request = ExportTraceServiceRequest()
        scope_spans = request.resource_spans.add().scope_spans.add()
        # gpuscope's own scope: spans of any other go to the one-series stock family
        scope_spans.scope.name = contract.INSTRUMENTATION_NAME
        spans = scope_spans.spans
        for i in range(first, min(count, first + per_request)):
            span = Span(
                trace_id=(i + 1).to_bytes(16, "big"),
                span_id=(i + 1).to_bytes(8, "big"),
                name="POST /v1/chat/completions",
                kind=Span.SPAN_KIND_SERVER,
                start_time_unix_nano=T0,
                end_time_unix_nano=T0 + 50_000_000,
            )
            values: dict[str, AnyValue] = {
                contract.HTTP_ROUTE: AnyValue(string_value="/v1/chat/completions"),
                contract.HTTP_RESPONSE_STATUS_CODE: AnyValue(int_value=200),
                contract.GEN_AI_REQUEST_MODEL: AnyValue(string_value=f"m{i}"),
                contract.GPU_UUID: AnyValue(string_value="GPU-0"),
                contract.GEN_AI_USAGE_INPUT_TOKENS: AnyValue(int_value=100),
                contract.GEN_AI_USAGE_OUTPUT_TOKENS: AnyValue(int_value=20),
                contract.TIME_TO_FIRST_TOKEN: AnyValue(double_value=0.02),
                contract.TIME_PER_OUTPUT_TOKEN: AnyValue(double_value=0.01),
            } | {key: AnyValue(double_value=0.005) for key in contract.PHASE_DURATION.values()}
            span.attributes.extend(KeyValue(key=k, value=v) for k, v in values.items())
            spans.append(span)
        requests.append(request)
    return requests


def series_count(aggregator: SpanAggregator) -> int:
    return sum(len(family) for family in aggregator.histograms) + len(aggregator.tokens)


async def longest_stall(action: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(longest event-loop gap in s, wall time in s) while ``action`` runs."""
    done = asyncio.Event()
    longest = 0.0

    async def ticker() -> None:
        nonlocal longest
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            longest = max(longest, time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await action()
    wall = time.perf_counter() - started
    done.set()
    await task
    return longest, wall


def _summary(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:8.1f} ms  "
        f"(min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f})"
    )


async def run(series: int, rounds: int) -> None:
    config = ExporterConfig(listen="127.0.0.1:0", gpu_source=GpuSourceKind.NONE, max_series=series)
    tracemalloc.start()
    exporter = await start_exporter(config)
    state = exporter.app[STATE]
    baseline = tracemalloc.get_traced_memory()[0]
    for request in requests_with_distinct_models(series):
        state.aggregator.ingest(request)
    traced = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    total = series_count(state.aggregator)
    print(f"series in request families: {total} (--max-series {series})")
    print(f"traced memory: {traced / 2**20:.1f} MiB, {traced / total * 1000 / 1024:.0f} KiB")
    print("  per 1,000 series (includes the request objects' share, freed after ingest)")
    try:
        for accept in ("text/plain", OPENMETRICS):
            await report_format(exporter.url, state, accept, total, rounds)
    finally:
        await exporter.stop()


async def report_format(
    url: str,
    state: object,
    accept: str,
    total: int,
    rounds: int,
) -> None:
    exporter_state = state  # the app's ExporterState
    size = 0

    async def scrape() -> None:
        nonlocal size
        curl = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}",
            "-H", f"Accept: {accept}", url + METRICS_PATH,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        output, _ = await curl.communicate()
        size = int(output)

    async def render_on_loop() -> None:
        chunks, _ = render_chunks(
            exporter_state.registry,  # type: ignore[attr-defined]
            exporter_state.aggregator.histograms,  # type: ignore[attr-defined]
            accept,
        )
        b"".join(chunks)

    async def idle() -> None:
        await asyncio.sleep(0.5)

    idle_stall, before_stall, after_stall, after_wall = [], [], [], []
    for _ in range(rounds):  # interleaved
        stall, _ = await longest_stall(idle)
        idle_stall.append(stall)
        stall, _ = await longest_stall(render_on_loop)
        before_stall.append(stall)
        stall, wall = await longest_stall(scrape)
        after_stall.append(stall)
        after_wall.append(wall)
    name = "OpenMetrics" if accept == OPENMETRICS else "text"
    print(f"\n{name}: scrape of {size / 2**20:.1f} MiB, {size / total * 1000 / 1024:.0f} KiB")
    print("  per 1,000 series")
    print(f"  loop stall, idle 0.5 s (noise floor):    {_summary(idle_stall)}")
    print(f"  loop stall, render on the loop (before): {_summary(before_stall)}")
    print(f"  loop stall, GET /metrics (after):        {_summary(after_stall)}")
    print(f"  GET /metrics wall time (after):          {_summary(after_wall)}")
    ratio = statistics.median(before_stall) / max(statistics.median(after_stall), 1e-6)
    print(f"  stall ratio before/after: {ratio:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.series, args.rounds))


if __name__ == "__main__":
    main()
