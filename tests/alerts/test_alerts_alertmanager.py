"""alerts/alertmanager.yml: amtool's checks and routes, and inhibitions in a real Alertmanager."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.binaries import require_binary
from support.prometheus_server import run_alertmanager

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

CONFIG = Path(__file__).parents[2] / "alerts" / "alertmanager.yml"


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("amtool"), *args], capture_output=True, text=True, check=False
    )


def test_amtool_accepts_the_config() -> None:
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=GpuscopeGpuLost", "severity=critical", "uuid=GPU-1"], "page"),
        (["alertname=GpuscopeLatencySLOBudgetBurnFast", "severity=critical"], "page"),
        (["alertname=GpuscopeLatencySLOBudgetBurnSlow", "severity=warning"], "ticket"),
        (["alertname=GpuscopeGpuXidErrors", "severity=warning"], "ticket"),
        (["alertname=Something", "severity=info"], "ticket"),
        (["alertname=NoSeverity"], "ticket"),
    ],
)
def test_routes_by_severity(labels: list[str], receiver: str) -> None:
    result = amtool(
        "config", "routes", "test", f"--config.file={CONFIG}",
        f"--verify.receivers={receiver}", *labels,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def _alert(name: str, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, "severity": "warning", **labels}}


async def _states(session: aiohttp.ClientSession, base: str) -> dict[tuple[str, str], bool]:
    """(alertname, uuid or instance) -> whether Alertmanager lists it as inhibited."""
    async with session.get(base + "/api/v2/alerts") as response:
        listed = await response.json()
    return {
        (a["labels"]["alertname"], a["labels"].get("uuid") or a["labels"]["instance"]): bool(
            a["status"]["inhibitedBy"]
        )
        for a in listed
    }


# what each sent alert's inhibition must be: only the explained ones are silenced
EXPECTED = {
    ("GpuscopeGpuLost", "GPU-1"): False,
    ("GpuscopeGpuXidErrors", "GPU-1"): True,
    ("GpuscopeGpuXidErrors", "GPU-2"): False,
    ("GpuscopeExporterDown", "a:9420"): False,
    ("GpuscopeSpansNotArriving", "a:9420"): True,
    ("GpuscopeSpansNotArriving", "b:9420"): False,
    # the GPU alerts of the exporter that is down, not of another one
    ("GpuscopeGpuMemoryNearlyFull", "GPU-3"): True,
    ("GpuscopeGpuPcieSaturated", "GPU-3"): True,
    ("GpuscopeGpuMemoryNearlyFull", "GPU-4"): False,
}


async def test_lost_gpu_and_exporter_down_inhibit_what_they_explain(tmp_path: Path) -> None:
    sent = [
        _alert("GpuscopeGpuLost", uuid="GPU-1", severity="critical"),
        _alert("GpuscopeGpuXidErrors", uuid="GPU-1"),
        _alert("GpuscopeGpuXidErrors", uuid="GPU-2"),
        _alert("GpuscopeExporterDown", job="gpuscope", instance="a:9420"),
        _alert("GpuscopeSpansNotArriving", job="gpuscope", instance="a:9420"),
        _alert("GpuscopeSpansNotArriving", job="gpuscope", instance="b:9420"),
        _alert("GpuscopeGpuMemoryNearlyFull", job="gpuscope", instance="a:9420", uuid="GPU-3"),
        _alert("GpuscopeGpuPcieSaturated", job="gpuscope", instance="a:9420", uuid="GPU-3"),
        _alert("GpuscopeGpuMemoryNearlyFull", job="gpuscope", instance="b:9420", uuid="GPU-4"),
    ]
    async with run_alertmanager(CONFIG, tmp_path) as base, aiohttp.ClientSession() as session:
        async with session.post(base + "/api/v2/alerts", json=sent) as response:
            assert response.status == 200, await response.text()
        # inhibitions apply once the source alerts reach the inhibitor: poll for them
        deadline = time.monotonic() + 20
        while (states := await _states(session, base)) != EXPECTED:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert states == EXPECTED


async def _source_states(
    session: aiohttp.ClientSession, base: str
) -> dict[tuple[str, str, str], bool]:
    """(alertname, source, host) -> whether Alertmanager lists it as inhibited."""
    async with session.get(base + "/api/v2/alerts") as response:
        listed = await response.json()
    return {
        (a["labels"]["alertname"], a["labels"]["source"], a["labels"].get("host", "")): bool(
            a["status"]["inhibitedBy"]
        )
        for a in listed
    }


# vLLM's /metrics alert is silenced only by the spans' alert of the same name, model
# and host
SOURCE_EXPECTED = {
    ("GpuscopeQueueTimeDominating", "spans", "gpu-host-1"): False,
    ("GpuscopeQueueTimeDominating", "vllm", "gpu-host-1"): True,
    ("GpuscopeQueueTimeDominating", "vllm", "gpu-host-2"): False,
    ("GpuscopeGpuUnderfed", "vllm", "gpu-host-1"): False,
    ("GpuscopeErrorRatioHigh", "spans", ""): False,
    ("GpuscopeErrorRatioHigh", "vllm", ""): True,
}


async def test_the_spans_alert_stands_for_vllms_metrics_alert(tmp_path: Path) -> None:
    queue, where = "GpuscopeQueueTimeDominating", {"model": "tiny", "phase": "queue"}
    sent = [
        _alert(queue, source="spans", service="vllm-spans", host="gpu-host-1", **where),
        _alert(queue, source="vllm", service="vllm", host="gpu-host-1", **where),
        _alert(queue, source="vllm", service="vllm", host="gpu-host-2", **where),
        _alert("GpuscopeGpuUnderfed", source="vllm", service="vllm", host="gpu-host-1", **where),
        _alert("GpuscopeErrorRatioHigh", source="spans", service="s", model="tiny"),
        _alert("GpuscopeErrorRatioHigh", source="vllm", service="vllm", model="tiny"),
    ]
    async with run_alertmanager(CONFIG, tmp_path) as base, aiohttp.ClientSession() as session:
        async with session.post(base + "/api/v2/alerts", json=sent) as response:
            assert response.status == 200, await response.text()
        deadline = time.monotonic() + 20
        while (states := await _source_states(session, base)) != SOURCE_EXPECTED:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert states == SOURCE_EXPECTED
