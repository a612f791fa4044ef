"""The rules over dcgm-exporter in a real Prometheus: the exposition of a 2-GPU node with
the default counters and two pods (tests/fixtures/dcgm-exporter-4.5.3-4.8.2/default.prom,
shaped as dcgm-exporter 4.5.3-4.8.2 writes it) served from a loopback server, scraped
as dcgm-exporter's job, with the generated rules; the gpuscope_gpu_* series they
record read back in base units, with the pod's labels."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from support.prometheus_server import instant_query, run_prometheus, wait_for_result
from support.servers import serve_exposition

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "dcgm-exporter-4.5.3-4.8.2" / "default.prom"
GPU0 = "GPU-6f1c4e0a-2b7d-4c39-9a51-0d3e8b7f2a11"
GPU1 = "GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5"
MIB = 1024 * 1024

# series -> GPU 0's value, GPU 1's value, from the fixture's fields in base units
EXPECTED: dict[str, tuple[float, float]] = {
    "gpuscope_gpu_sm_clock_hertz": (1980e6, 1410e6),
    "gpuscope_gpu_memory_clock_hertz": (2619e6, 2619e6),
    "gpuscope_gpu_utilization_ratio": (0.87, 0.12),
    "gpuscope_gpu_tensor_active_ratio": (0.4125, 0.01),
    "gpuscope_gpu_dram_active_ratio": (0.625, 0.05),
    "gpuscope_gpu_memory_used_bytes": (68635 * MIB, 635 * MIB),
    "gpuscope_gpu_memory_total_bytes": (80635 * MIB, 80635 * MIB),
    "gpuscope_gpu_power_watts": (512.345, 250.5),
    "gpuscope_gpu_temperature_celsius": (61, 47),
    "gpuscope_gpu_energy_joules_total": (123456789.012, 98765432.1),
    "gpuscope_gpu_up": (1, 1),
    "gpuscope_gpu_info": (1, 1),
}


async def test_the_rules_record_gpuscopes_gpu_series_from_a_scraped_dcgm_exporter(
    tmp_path: Path,
) -> None:
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(tmp_path / "rules")]
    await asyncio.to_thread(
        subprocess.run, [*build, "--interval", "1s"], check=True, capture_output=True
    )
    rules = sorted((tmp_path / "rules").glob("*.yml"))
    async with (
        serve_exposition(FIXTURE.read_text(encoding="utf-8")) as target,
        run_prometheus([target], tmp_path, job="dcgm-exporter", rule_files=rules) as base,
        aiohttp.ClientSession() as session,
    ):
        # the PCIe counter is rebuilt from the rate at each evaluation (every 1 s): wait
        # until it covers rate()'s 10 s window, which rate() divides by
        await wait_for_result(
            session,
            base,
            "count_over_time(gpuscope_gpu_pcie_transmit_bytes_total[1m]) > 14",
            timeout_s=60,
        )
        for name, values in EXPECTED.items():
            got = await instant_query(session, base, f'{name}{{source="dcgm-exporter"}}')
            by_uuid = {sample["metric"]["uuid"]: sample for sample in got}
            assert set(by_uuid) == {GPU0, GPU1}, name
            for uuid, want in zip((GPU0, GPU1), values, strict=True):
                labels = by_uuid[uuid]["metric"]
                assert float(by_uuid[uuid]["value"][1]) == pytest.approx(want, rel=1e-12), name
                assert labels["job"] == "dcgm-exporter" and labels["hostname"] == "gpu-node-1"
                assert "UUID" not in labels and "Hostname" not in labels, name
        # the pods' labels stay on the per-field series (the GPU's holder)
        temperature = await instant_query(session, base, "gpuscope_gpu_temperature_celsius")
        pods = {s["metric"]["uuid"]: s["metric"]["pod"] for s in temperature}
        assert pods == {GPU0: "vllm-llama-0", GPU1: "vllm-mistral-0"}
        info = await instant_query(session, base, f'gpuscope_gpu_info{{uuid="{GPU1}"}}')
        assert info[0]["metric"]["name"] == "NVIDIA H100 80GB HBM3"
        assert info[0]["metric"]["driver_version"] == "550.90.07"
        assert info[0]["metric"]["pci_bus_id"] == "00000000:3B:00.0"
        # PCIe bytes: the rate fields (2e9 and 8e9 B/s on GPU 0) integrated into counters
        for direction, rate in (("transmit", 2e9), ("receive", 8e9)):
            query = f'rate(gpuscope_gpu_pcie_{direction}_bytes_total{{uuid="{GPU0}"}}[10s])'
            got = await instant_query(session, base, query)
            assert float(got[0]["value"][1]) == pytest.approx(rate, rel=0.02), direction
        # the pack's own per-GPU rules read them through the GPU job selector
        ratio = await instant_query(
            session, base, f'instance_gpu:gpuscope_gpu_memory_used:ratio{{uuid="{GPU0}"}}'
        )
        assert float(ratio[0]["value"][1]) == pytest.approx(68635 / 80635)
        # not in the default counters: no SM occupancy (the counters file brings it)
        assert await instant_query(session, base, "gpuscope_gpu_sm_occupancy_ratio") == []
