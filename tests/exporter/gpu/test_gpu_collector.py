"""Readings to /metrics: the poller's snapshot, the collector, promtool, and a real scrape."""

from __future__ import annotations

import subprocess
import threading
import urllib.request
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from gpuscope.contract.gpu import PER_GPU
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.scenario import parse_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource, simulated_uuid
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading
from support.binaries import require_binary
from support.gpu_fake_nvml import FakeNvml

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


class ManualClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def registry_for(poller: GpuPoller) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    return registry


def labels(index: int) -> dict[str, str]:
    return {"gpu": str(index), "uuid": simulated_uuid(index)}


def test_every_gpu_family_is_served_and_promtool_accepts_it() -> None:
    promtool = require_binary("promtool")
    clock = ManualClock()
    source = SimulatedSource(
        2, parse_scenario({"events": [{"at": 0, "gpu": 1, "fault": "xid", "xid": 79}]}), clock=clock
    )
    poller = GpuPoller(source, 1.0)
    poller.poll_once()
    clock.now += 1
    poller.poll_once()
    registry = registry_for(poller)
    text = generate_latest(registry).decode()
    for row in PER_GPU:
        assert f"\n{row.sample_name}{{" in text, row.name
    assert registry.get_sample_value("gpuscope_gpu_up", labels(0)) == 1.0
    assert (
        registry.get_sample_value(
            "gpuscope_gpu_info",
            {
                **labels(1),
                "name": "Simulated H100 80GB HBM3",
                "pci_bus_id": "00000000:19:00.0",
                "numa_node": "1",
                "driver_version": "simulated",
            },
        )
        == 1.0
    )
    assert (
        registry.get_sample_value("gpuscope_gpu_xid_errors_total", {**labels(1), "xid": "79"})
        == 1.0
    )
    assert (
        registry.get_sample_value(
            "gpuscope_gpu_clock_event_active", {**labels(0), "reason": "gpu_idle"}
        )
        == 1.0
    )
    assert (
        registry.get_sample_value(
            "gpuscope_gpu_ecc_errors_total", {**labels(0), "type": "volatile_corrected"}
        )
        == 0.0
    )
    assert (
        registry.get_sample_value("gpuscope_collector_success", {"collector": "simulated"}) == 1.0
    )
    assert (
        registry.get_sample_value("gpuscope_collector_duration_seconds", {"collector": "simulated"})
        is not None
    )
    assert (
        "name=" not in text.split("gpuscope_gpu_up{")[1].split("\n")[0]
    )  # descriptive labels on info only
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_xid_and_ecc_totals_exist_at_zero_before_the_first_error() -> None:
    """A counter born at its first error hides that error from increase(); these are not."""
    clock = ManualClock()
    scenario = parse_scenario(
        {"events": [{"at": 5, "gpu": 1, "fault": "xid", "xid": 48, "count": 2}]}
    )
    poller = GpuPoller(SimulatedSource(2, scenario, clock=clock), 1.0)
    poller.poll_once()
    registry = registry_for(poller)
    for index in (0, 1):
        assert registry.get_sample_value("gpuscope_gpu_xid_events_total", labels(index)) == 0.0
        for kind in ("volatile_corrected", "volatile_uncorrected"):
            ecc = {**labels(index), "type": kind}
            assert registry.get_sample_value("gpuscope_gpu_ecc_errors_total", ecc) == 0.0
    xid_48 = {**labels(1), "xid": "48"}
    assert registry.get_sample_value("gpuscope_gpu_xid_errors_total", xid_48) is None
    clock.now += 6
    poller.poll_once()
    assert registry.get_sample_value("gpuscope_gpu_xid_events_total", labels(1)) == 2.0
    assert registry.get_sample_value("gpuscope_gpu_xid_events_total", labels(0)) == 0.0
    assert registry.get_sample_value("gpuscope_gpu_xid_errors_total", xid_48) == 2.0


def test_lost_gpu_keeps_only_up_and_info_and_unsupported_metrics_are_absent() -> None:
    clock = ManualClock()
    scenario = parse_scenario(
        {
            "events": [
                {"at": 0, "duration": 10, "gpu": 0, "fault": "fall_off_bus"},
                {"at": 0, "gpu": 1, "fault": "not_supported", "fields": ["sm_occupancy_ratio"]},
            ]
        }
    )
    poller = GpuPoller(SimulatedSource(2, scenario, clock=clock), 1.0)
    poller.poll_once()
    registry = registry_for(poller)
    text = generate_latest(registry).decode()
    lost_series = [line for line in text.splitlines() if f'uuid="{simulated_uuid(0)}"' in line]
    assert sorted(line.split("{")[0] for line in lost_series) == [
        "gpuscope_gpu_down_reason",
        "gpuscope_gpu_info",
        "gpuscope_gpu_up",
    ]
    reason = {"gpu": "0", "uuid": simulated_uuid(0), "reason": "lost"}
    assert registry.get_sample_value("gpuscope_gpu_down_reason", reason) == 1.0
    assert registry.get_sample_value("gpuscope_gpu_up", labels(0)) == 0.0
    assert registry.get_sample_value("gpuscope_gpu_sm_occupancy_ratio", labels(1)) is None
    assert registry.get_sample_value("gpuscope_gpu_sm_active_ratio", labels(1)) is not None
    clock.now += 11  # back on the bus: its series return without a restart
    poller.poll_once()
    assert registry.get_sample_value("gpuscope_gpu_up", labels(0)) == 1.0
    assert registry.get_sample_value("gpuscope_gpu_power_watts", labels(0)) is not None


def test_nvml_readings_take_the_same_path_with_the_xid_collector(fake_nvml: FakeNvml) -> None:
    source = NvmlSource(fake_nvml, xid_wait_ms=50)
    poller = GpuPoller(source, 1.0)
    poller.poll_once()
    registry = registry_for(poller)
    uuid = fake_nvml.gpus[0].uuid
    assert (
        registry.get_sample_value("gpuscope_gpu_sm_clock_hertz", {"gpu": "0", "uuid": uuid})
        == 1980e6
    )
    assert (
        registry.get_sample_value(
            "gpuscope_gpu_pcie_receive_bytes_total", {"gpu": "0", "uuid": uuid}
        )
        == 5000
    )
    for collector in ("nvml", "nvml_xid_events"):
        assert (
            registry.get_sample_value("gpuscope_collector_success", {"collector": collector}) == 1.0
        )
    poller.stop()
    assert fake_nvml.refcount == 0


class FailingSource:
    name = "broken"

    def __init__(self) -> None:
        self.fail = False

    def devices(self) -> Sequence[GpuDevice]:
        return [GpuDevice(0, "GPU-x", "x", "0:0:0.0")]

    def sample(self) -> Sequence[GpuReading]:
        if self.fail:
            raise RuntimeError("driver went away")
        return [GpuReading(0, "GPU-x", values={"power_watts": 100.0})]

    def close(self) -> None:
        pass


def test_a_failing_source_is_counted_and_its_gpus_reported_down() -> None:
    source = FailingSource()
    poller = GpuPoller(source, 1.0)
    registry = registry_for(poller)
    poller.poll_once()
    assert (
        registry.get_sample_value("gpuscope_gpu_power_watts", {"gpu": "0", "uuid": "GPU-x"})
        == 100.0
    )
    source.fail = True
    poller.poll_once()
    assert registry.get_sample_value("gpuscope_collector_success", {"collector": "broken"}) == 0.0
    assert registry.get_sample_value("gpuscope_gpu_up", {"gpu": "0", "uuid": "GPU-x"}) == 0.0
    assert (
        registry.get_sample_value("gpuscope_gpu_power_watts", {"gpu": "0", "uuid": "GPU-x"}) is None
    )


class BlockingSource:
    """Eight GPUs whose sampling blocks until released, like a hung NVML call."""

    name = "blocking"

    def __init__(self) -> None:
        self.inner = SimulatedSource(8)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.rounds = 0

    def devices(self) -> Sequence[GpuDevice]:
        return self.inner.devices()

    def sample(self) -> Sequence[GpuReading]:
        self.rounds += 1
        if self.rounds > 1:
            self.entered.set()
            self.release.wait(30)
        return self.inner.sample()

    def close(self) -> None:
        self.release.set()


@pytest.fixture
def blocking_poller() -> Iterator[tuple[GpuPoller, BlockingSource]]:
    source = BlockingSource()
    poller = GpuPoller(source, 0.01)
    poller.start()
    yield poller, source
    source.release.set()
    poller.stop()


def test_scrapes_never_wait_on_sampling_8_gpus(
    blocking_poller: tuple[GpuPoller, BlockingSource],
) -> None:
    poller, source = blocking_poller
    assert poller.wait_for_round(1, timeout_s=10)
    assert source.entered.wait(10)  # the second round is now stuck inside sample()
    registry = registry_for(poller)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        port = server.server_address[1]
        for _ in range(5):  # each scrape answers from the cache while sampling hangs
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                body = response.read().decode()
            assert body.count("gpuscope_gpu_up{") == 8
        assert not source.release.is_set() and poller.snapshot().round == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_poller_thread_polls_at_its_interval_and_stops() -> None:
    poller = GpuPoller(SimulatedSource(1), 0.01)
    poller.start()
    assert poller.wait_for_round(3, timeout_s=10)
    poller.stop()
    rounds = poller.snapshot().round
    assert not poller.wait_for_round(rounds + 1, timeout_s=0.05)  # nothing polls after stop
    with pytest.raises(ValueError, match="positive"):
        GpuPoller(SimulatedSource(1), 0)
