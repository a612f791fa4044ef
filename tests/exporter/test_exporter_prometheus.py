"""The real Prometheus tools against a real exporter: promtool lint and a live scrape."""

from __future__ import annotations

import asyncio
import time
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuscope import spans as contract
from gpuscope.exporter.service import RunningExporter, start_exporter
from support.binaries import require_binary
from support.exporter_fixtures import (
    FakeGpuSource,
    SpanFactory,
    encode,
    loopback_config,
    post_spans,
    scrape,
)
from support.prometheus_server import run_prometheus

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


@pytest.fixture
async def busy_exporter() -> AsyncIterator[RunningExporter]:
    """An exporter with a fake GPU and spans in every request metric."""
    exporter = await start_exporter(
        loopback_config(gpu_interval_s=0.05), gpu_source=FakeGpuSource()
    )
    spans = SpanFactory()
    batch = []
    for i in range(10):
        batch.append(
            spans.server(
                0.05,
                start_ns=time.time_ns(),  # exemplars carry the span's time: keep it recent
                phases={"queue": 0.0002, "batch_wait": 0.001, "compute": 0.03},
                route="/v1/completions" if i % 2 else "/v1/embeddings",
                attrs={
                    contract.TIME_TO_FIRST_TOKEN: 0.02,
                    contract.TIME_PER_OUTPUT_TOKEN: 0.003,
                    contract.GEN_AI_USAGE_INPUT_TOKENS: 10,
                    contract.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
                },
            )
        )
    batch.append(spans.batch(8))
    async with aiohttp.ClientSession() as session:
        status, _ = await post_spans(session, exporter, encode(batch).SerializeToString())
        assert status == 200
    try:
        yield exporter
    finally:
        await exporter.stop()


async def test_metrics_text_passes_promtool(busy_exporter: RunningExporter) -> None:
    promtool = require_binary("promtool")
    async with aiohttp.ClientSession() as session:
        text = await scrape(session, busy_exporter)
    assert "gpuscope_request_phase_seconds_bucket" in text
    assert "gpuscope_gpu_up" in text
    checked = await asyncio.create_subprocess_exec(
        promtool, "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    output, _ = await asyncio.wait_for(checked.communicate(text.encode()), 30)
    assert checked.returncode == 0, output.decode()
    assert output == b""  # no lint warnings either


async def _query(session: aiohttp.ClientSession, base: str, path: str, **params: str) -> Any:
    async with session.get(base + path, params=params) as response:
        body = await response.json()
        assert body["status"] == "success", body
        return body["data"]


async def _eventually(session: aiohttp.ClientSession, base: str, path: str, **params: str) -> Any:
    """Poll Prometheus (another process: nothing to wait on but its API) until data appears."""
    deadline = time.monotonic() + 30
    while True:
        data = await _query(session, base, path, **params)
        found = data["result"] if isinstance(data, dict) else data
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.2)


async def test_prometheus_scrapes_phases_and_stores_exemplars(
    busy_exporter: RunningExporter, tmp_path: Path
) -> None:
    async with (
        run_prometheus([f"127.0.0.1:{busy_exporter.port}"], tmp_path, "1s") as base,
        aiohttp.ClientSession() as session,
    ):
        buckets = "sum by (le, phase) (gpuscope_request_phase_seconds_bucket)"
        query = f"histogram_quantile(0.5, {buckets})"
        result = await _eventually(session, base, "/api/v1/query", query=query)
        by_phase = {r["metric"]["phase"]: float(r["value"][1]) for r in result}
        # Linear interpolation inside the bucket that holds every observation.
        assert by_phase["queue"] == pytest.approx(0.0001 + (0.00025 - 0.0001) / 2)
        assert by_phase["compute"] == pytest.approx(0.025 + (0.05 - 0.025) / 2)
        now = time.time()
        exemplars = await _eventually(
            session,
            base,
            "/api/v1/query_exemplars",
            query="gpuscope_request_duration_seconds_bucket",
            start=str(now - 600),
            end=str(now + 60),
        )
        labels = exemplars[0]["exemplars"][0]["labels"]
        assert len(labels["trace_id"]) == 32
        assert len(labels["span_id"]) == 16
        up = await _eventually(session, base, "/api/v1/query", query="gpuscope_gpu_up")
        assert {r["metric"]["gpu"] for r in up} == {"0", "1"}
