"""The worker's ``/metrics``: the collector on its own, and a real server scraped under load."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.worker.backends import numpy_models
from gpuscope.worker.config import BatchingMode
from gpuscope.worker.kv_cache import KvStats
from gpuscope.worker.metrics import WorkerCollector
from gpuscope.worker.scheduler import BatchPolicy, Counters
from support.worker_servers import SMALL, Gate, GatedGenerator, serve_worker

MODEL = SMALL.model_name


class FakeScheduler:
    def __init__(self, queued: int, running: int, counters: Counters) -> None:
        self.queued = queued
        self.running = running
        self.counters = counters


def test_worker_collector_reads_live_values_at_every_scrape() -> None:
    embeddings = FakeScheduler(3, 2, Counters(completed=5, batches=4))
    kv = KvStats(
        blocks_used=30,
        blocks_total=120,
        preemptions_total=2,
        iterations_total=77,
        running=6,
        waiting=9,
    )
    telemetry = {"spans_exported": 40, "spans_dropped": 1}
    registry = CollectorRegistry()
    registry.register(
        WorkerCollector(
            {"embeddings": embeddings, "completions": FakeScheduler(0, 0, Counters())},
            BatchPolicy(
                BatchingMode.DYNAMIC, max_batch_size=16, max_queue_delay_s=0.005, max_queue=256
            ),
            model_name="m",
            kv_stats=("completions", lambda: kv),
            telemetry=lambda: telemetry,
        )
    )

    def value(name: str, labels: Mapping[str, str] | None = None) -> float | None:
        return registry.get_sample_value(name, dict(labels or {}))

    assert value("gpuscope_worker_requests_waiting", {"endpoint": "embeddings"}) == 3
    assert value("gpuscope_worker_requests_running", {"endpoint": "embeddings"}) == 2
    assert value("gpuscope_worker_requests_running", {"endpoint": "completions"}) == 6
    assert value("gpuscope_worker_requests_waiting", {"endpoint": "completions"}) == 9
    assert value("gpuscope_worker_batch_iterations_total", {"endpoint": "embeddings"}) == 4
    assert value("gpuscope_worker_batch_iterations_total", {"endpoint": "completions"}) == 77
    outcome = {"endpoint": "embeddings", "outcome": "completed"}
    assert value("gpuscope_worker_requests_total", outcome) == 5
    assert value("gpuscope_worker_kv_cache_blocks_used") == 30
    assert value("gpuscope_worker_kv_cache_blocks") == 120
    assert value("gpuscope_worker_kv_cache_usage_ratio") == 0.25
    assert value("gpuscope_worker_preemptions_total") == 2
    assert value("gpuscope_worker_max_queue_delay_seconds") == 0.005
    assert value("gpuscope_worker_max_batch_size") == 16
    assert value("gpuscope_worker_info", {"model": "m", "batching": "dynamic"}) == 1
    assert value("gpuscope_worker_telemetry_events_total", {"kind": "spans_dropped"}) == 1
    embeddings.queued = 0
    telemetry["spans_dropped"] = 7  # a counter that appears later is exposed too
    telemetry["spans_export_failed"] = 2
    assert value("gpuscope_worker_requests_waiting", {"endpoint": "embeddings"}) == 0
    assert value("gpuscope_worker_telemetry_events_total", {"kind": "spans_dropped"}) == 7
    assert value("gpuscope_worker_telemetry_events_total", {"kind": "spans_export_failed"}) == 2


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _gauge(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return samples[(name, (("endpoint", "completions"),))]


async def test_worker_metrics_parse_and_gauges_move_under_load() -> None:
    gate = Gate()
    _, generator = numpy_models(SMALL)
    body = {"model": MODEL, "prompt": "x" * 40, "max_tokens": 40}
    with serve_worker(
        generator=GatedGenerator(generator, gate),
        batching="continuous",
        max_batch_size=2,
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            idle = _samples((await client.get("/metrics")).text)
            gate.close()
            tasks = [
                asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(5)
            ]
            for _ in range(2000):  # each check is a real scrape
                busy = _samples((await client.get("/metrics")).text)
                running = _gauge(busy, "gpuscope_worker_requests_running")
                if running + _gauge(busy, "gpuscope_worker_requests_waiting") == 5:
                    break
            open_metrics = await client.get(
                "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
            )
            # a malformed version was a 500 with a logged traceback (prometheus_client raises)
            odd = await client.get(
                "/metrics", headers={"accept": "application/openmetrics-text; version=abc"}
            )
            gate.open()
            answers = await asyncio.gather(*tasks)
            after = _samples((await client.get("/metrics")).text)
    assert [a.status_code for a in answers] == [200] * 5
    assert odd.status_code == 200 and odd.headers["content-type"].startswith("text/plain")
    assert odd.headers["vary"] == "Accept, Accept-Encoding"
    assert _gauge(idle, "gpuscope_worker_requests_running") == 0
    # The device is held by the first iteration: one or two sequences run, the rest wait.
    assert 1 <= _gauge(busy, "gpuscope_worker_requests_running") <= 2
    assert _gauge(busy, "gpuscope_worker_requests_waiting") >= 3
    used = ("gpuscope_worker_kv_cache_blocks_used", ())
    assert idle[used] == 0 and busy[used] > 0 and after[used] == 0
    assert busy[("gpuscope_worker_kv_cache_blocks", ())] == SMALL.kv_cache_blocks
    assert 0 < busy[("gpuscope_worker_kv_cache_usage_ratio", ())] <= 1
    iterations = "gpuscope_worker_batch_iterations_total"
    assert _gauge(after, iterations) > _gauge(busy, iterations) > _gauge(idle, iterations)
    completed = (
        "gpuscope_worker_requests_total",
        (("endpoint", "completions"), ("outcome", "completed")),
    )
    assert after[completed] == 5
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name for f in parse_openmetrics(open_metrics.text)}  # type: ignore[no-untyped-call]
    assert {"gpuscope_worker_requests_running", "gpuscope_worker_preemptions"} <= families
