"""A simulated fault scenario, driven through the real exporter to ``/metrics``.

The scenario's clock is moved by hand; the exporter's own poller samples the source,
and each check waits for a polling round that began after the move.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.samples import Sample

from gpuscope.exporter.gpu.scenario import load_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource, simulated_uuid
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import loopback_config, samples, scrape, value

FAULTS = Path(__file__).parents[3] / "exporter" / "gpu" / "scenarios" / "faults.yaml"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def scenario_exporter() -> AsyncIterator[tuple[RunningExporter, Clock]]:
    clock = Clock()
    source = SimulatedSource(2, load_scenario(FAULTS), clock=clock)
    running = await start_exporter(
        loopback_config(gpu_interval_s=0.02), gpu_source=source, compute_observers=[source]
    )
    try:
        yield running, clock
    finally:
        await running.stop()


async def scrape_at(
    exporter: RunningExporter, clock: Clock, session: aiohttp.ClientSession, at_s: float
) -> list[Sample]:
    """Move the scenario to ``at_s`` seconds, wait for a fresh poll, scrape."""
    poller = exporter.app[STATE].poller
    assert poller is not None
    clock.now = 1_000_000.0 + at_s
    assert poller.wait_for_round(poller.snapshot().round + 2, timeout_s=10)
    return samples(await scrape(session, exporter))


async def test_faults_reach_metrics_and_a_lost_gpu_comes_back(
    scenario_exporter: tuple[RunningExporter, Clock], exporter_http: aiohttp.ClientSession
) -> None:
    exporter, clock = scenario_exporter
    gpu0 = {"gpu": "0", "uuid": simulated_uuid(0)}
    gpu1 = {"gpu": "1", "uuid": simulated_uuid(1)}

    start = await scrape_at(exporter, clock, exporter_http, 1)
    assert value(start, "gpuscope_gpu_up", gpu1) == 1
    assert value(start, "gpuscope_gpu_sm_occupancy_ratio", gpu0) is not None
    # NotSupported on GPU 1: absent, not zero
    assert value(start, "gpuscope_gpu_sm_occupancy_ratio", gpu1) is None
    thermal = gpu0 | {"reason": "hw_thermal_slowdown"}
    assert value(start, "gpuscope_gpu_clock_event_active", thermal) == 0
    full_clock = value(start, "gpuscope_gpu_sm_clock_hertz", gpu0)

    throttled = await scrape_at(exporter, clock, exporter_http, 45)
    assert value(throttled, "gpuscope_gpu_clock_event_active", thermal) == 1
    slow_clock = value(throttled, "gpuscope_gpu_sm_clock_hertz", gpu0)
    assert full_clock is not None and slow_clock is not None
    assert slow_clock < full_clock

    xids = await scrape_at(exporter, clock, exporter_http, 125)
    xid48 = gpu1 | {"xid": "48"}
    assert value(xids, "gpuscope_gpu_xid_errors_total", xid48) == 3

    lost = await scrape_at(exporter, clock, exporter_http, 160)
    assert value(lost, "gpuscope_gpu_up", gpu1) == 0
    gpu1_series = {s.name for s in lost if s.labels.get("uuid") == simulated_uuid(1)}
    assert gpu1_series == {"gpuscope_gpu_up", "gpuscope_gpu_down_reason", "gpuscope_gpu_info"}
    assert value(lost, "gpuscope_gpu_up", gpu0) == 1
    assert value(lost, "gpuscope_gpu_power_watts", gpu0) is not None

    back = await scrape_at(exporter, clock, exporter_http, 215)
    assert value(back, "gpuscope_gpu_up", gpu1) == 1
    assert value(back, "gpuscope_gpu_power_watts", gpu1) is not None
    # the XID counter survived the GPU's absence: a counter, never reset
    assert value(back, "gpuscope_gpu_xid_errors_total", xid48) == 3
