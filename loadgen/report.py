"""A small closed-loop load against the worker, and the report of where the time went.

``run_load`` keeps ``concurrency`` clients busy for a while with a mix of embedding
requests and streamed completions, and measures each from the client's side.
``scrape_summary`` reads the exporter's ``/metrics`` once the spans have arrived and
sums the per-phase histograms; ``format_report`` puts both side by side.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.middleware.attributes import PHASES

PROMPTS = [
    "Why is my p99 latency high?",
    "Summarise the GPU's clock throttle reasons.",
    "Batching trades latency for throughput because",
]


@dataclass
class LoadResult:
    duration_s: float = 0.0
    latencies_s: dict[str, list[float]] = field(default_factory=dict)
    first_token_s: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def completed(self) -> int:
        return sum(len(v) for v in self.latencies_s.values())


@dataclass
class ServerSummary:
    requests: float = 0.0
    phase_mean_s: dict[str, float] = field(default_factory=dict)
    batch_size_mean: float | None = None
    gpu: dict[str, float] = field(default_factory=dict)


async def run_load(worker_url: str, duration_s: float, concurrency: int) -> LoadResult:
    result = LoadResult()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=worker_url, timeout=60, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        deadline = time.monotonic() + duration_s
        start = time.monotonic()
        await asyncio.gather(
            *(_client_loop(client, model, i, deadline, result) for i in range(concurrency))
        )
        result.duration_s = time.monotonic() - start
    return result


async def _client_loop(
    client: httpx.AsyncClient, model: str, index: int, deadline: float, result: LoadResult
) -> None:
    turn = index
    while time.monotonic() < deadline:
        turn += 1
        prompt = PROMPTS[turn % len(PROMPTS)]
        started = time.monotonic()
        if turn % 2:
            response = await client.post("/v1/embeddings", json={"model": model, "input": prompt})
            kind = "embeddings"
        else:
            kind = "completions (stream)"
            body = {"model": model, "prompt": prompt, "max_tokens": 16, "stream": True}
            first_token: float | None = None
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if first_token is None and line.startswith("data:"):
                        first_token = time.monotonic() - started
            if first_token is not None and response.status_code == 200:
                result.first_token_s.append(first_token)
        result.statuses[str(response.status_code)] += 1
        if response.status_code == 200:
            result.latencies_s.setdefault(kind, []).append(time.monotonic() - started)
        elif response.status_code == 429:
            await asyncio.sleep(0.05)  # back off as Retry-After asks, briefly


async def scrape_summary(
    exporter_url: str, expected_requests: int, timeout_s: float = 15.0
) -> ServerSummary:
    """The exporter's view, once it has counted ``expected_requests`` (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=exporter_url, timeout=10) as client:
        while True:
            summary = summarize_metrics((await client.get("/metrics")).text)
            if summary.requests >= expected_requests or time.monotonic() > deadline:
                return summary
            await asyncio.sleep(0.25)  # spans arrive in the worker's export batches


def summarize_metrics(text: str) -> ServerSummary:
    sums: defaultdict[tuple[str, str], float] = defaultdict(float)
    summary = ServerSummary()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "gpuscope_request_phase_seconds":
                if sample.name.endswith(("_sum", "_count")):
                    sums[(sample.labels.get("phase", ""), sample.name.rsplit("_", 1)[1])] += (
                        sample.value
                    )
            elif family.name == "gpuscope_request_duration_seconds":
                if sample.name.endswith("_count"):
                    summary.requests += sample.value
            elif family.name == "gpuscope_batch_size":
                if sample.name.endswith(("_sum", "_count")):
                    sums[("batch", sample.name.rsplit("_", 1)[1])] += sample.value
            elif _is_gpu0_gauge(family.name, sample.labels):
                summary.gpu[sample.name] = sample.value
    for phase in PHASES:
        if sums[(phase, "count")]:
            summary.phase_mean_s[phase] = sums[(phase, "sum")] / sums[(phase, "count")]
    if sums[("batch", "count")]:
        summary.batch_size_mean = sums[("batch", "sum")] / sums[("batch", "count")]
    return summary


def _is_gpu0_gauge(name: str, labels: dict[str, str]) -> bool:
    gauge = name.startswith("gpuscope_gpu_") and name.endswith(("_ratio", "_watts", "_hertz"))
    return gauge and labels.get("gpu") == "0" and "reason" not in labels


def _percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return "  ".join(f"p{p} {cuts[p - 1] * 1000:7.1f} ms" for p in (50, 95, 99))


def format_report(result: LoadResult, summary: ServerSummary) -> str:
    lines = [
        f"\n{result.completed} requests in {result.duration_s:.1f} s "
        f"({result.completed / max(result.duration_s, 1e-9):.1f}/s); "
        f"statuses {dict(result.statuses)}",
        "client-side latency:",
    ]
    for kind, values in sorted(result.latencies_s.items()):
        lines.append(f"  {kind:22} {_percentiles(values)}")
    if result.first_token_s:
        lines.append(f"  {'time to first token':22} {_percentiles(result.first_token_s)}")
    lines.append(
        f"where the time went (exporter, {summary.requests:.0f} requests, mean per request):"
    )
    total = sum(summary.phase_mean_s.values()) or 1.0
    for phase, seconds in summary.phase_mean_s.items():
        share = seconds / total
        lines.append(
            f"  {phase:12} {seconds * 1000:8.2f} ms  {'#' * round(share * 40):40} {share:5.1%}"
        )
    if summary.batch_size_mean is not None:
        lines.append(f"  mean batch size {summary.batch_size_mean:.1f}")
    if summary.gpu:
        lines.append("simulated GPU 0 now:")
        for name, value in sorted(summary.gpu.items()):
            lines.append(f"  {name:42} {value:.3g}")
    return "\n".join(lines)
