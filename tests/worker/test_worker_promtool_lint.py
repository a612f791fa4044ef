"""``promtool check metrics`` on what the worker and the exporter really serve.

promtool lints the Prometheus text format (names, suffixes, units, help): a gauge
named ``_total``, a counter without it or a unit in the wrong place fails here,
where a newcomer's scrape of the live /metrics would first meet it.
"""

from __future__ import annotations

import subprocess

import httpx
import pytest

from gpuscope.exporter.gpu.scenario import parse_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.service import start_exporter
from support.binaries import require_binary
from support.exporter_fixtures import loopback_config
from support.worker_servers import serve_worker

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


def lint(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_workers_metrics_pass_promtool() -> None:
    with serve_worker(batching="continuous") as url, httpx.Client(base_url=url) as client:
        text = client.get("/metrics", timeout=30).text
    assert "gpuscope_worker_kv_cache_blocks " in text
    result = lint(text)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_the_exporters_metrics_pass_promtool() -> None:
    scenario = parse_scenario({"events": [{"at": 0, "gpu": 0, "fault": "xid", "xid": 79}]})
    exporter = await start_exporter(
        loopback_config(gpu_interval_s=0.05), gpu_source=SimulatedSource(1, scenario)
    )
    try:
        async with httpx.AsyncClient(base_url=exporter.url, timeout=30) as client:
            text = ""
            for _ in range(200):  # until the first GPU poll is in (bounded: 10 s)
                text = (await client.get("/metrics")).text
                if "gpuscope_gpu_up{" in text:
                    break
    finally:
        await exporter.stop()
    assert "gpuscope_gpu_up{" in text
    result = lint(text)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("bad", ["# TYPE x_total gauge\nx_total 1\n", "# TYPE y counter\ny 1\n"])
def test_promtool_does_flag_what_this_guards_against(bad: str) -> None:
    assert lint(bad).returncode != 0
