"""The GPU poller when the source fails outside ``sample()``: counted, never a dead thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading

GPU = {"gpu": "0", "uuid": "GPU-x"}


class EnumerationFails:
    """Samples fine, but listing its devices (or its helpers' health) may fail mid-run."""

    name = "flaky"

    def __init__(self) -> None:
        self.fail_devices = False
        self.fail_health = False
        self.samples = 0
        self.sampled = threading.Condition()

    def devices(self) -> Sequence[GpuDevice]:
        if self.fail_devices:
            raise RuntimeError("device list went away")
        return [GpuDevice(0, "GPU-x", "x", "0:0:0.0")]

    def sample(self) -> Sequence[GpuReading]:
        with self.sampled:
            self.samples += 1
            self.sampled.notify_all()
        return [GpuReading(0, "GPU-x", values={"power_watts": 100.0})]

    def collector_health(self) -> Sequence[CollectorRun]:
        if self.fail_health:
            raise RuntimeError("helper thread state unreadable")
        return []

    def close(self) -> None:
        pass


def registry_for(poller: GpuPoller) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    return registry


def test_a_failing_device_list_is_a_failed_round_not_a_crash() -> None:
    source = EnumerationFails()
    poller = GpuPoller(source, 1.0)
    registry = registry_for(poller)
    poller.poll_once()
    assert registry.get_sample_value("gpuscope_gpu_power_watts", GPU) == 100.0
    source.fail_devices = True
    poller.poll_once()
    assert registry.get_sample_value("gpuscope_collector_success", {"collector": "flaky"}) == 0.0
    assert registry.get_sample_value("gpuscope_gpu_up", GPU) == 0.0
    assert registry.get_sample_value("gpuscope_gpu_power_watts", GPU) is None  # never stale
    source.fail_devices = False
    poller.poll_once()
    assert registry.get_sample_value("gpuscope_gpu_power_watts", GPU) == 100.0


def test_a_failing_health_report_is_a_failed_round_not_a_crash() -> None:
    source = EnumerationFails()
    poller = GpuPoller(source, 1.0)
    registry = registry_for(poller)
    source.fail_health = True
    poller.poll_once()
    assert registry.get_sample_value("gpuscope_collector_success", {"collector": "flaky"}) == 0.0
    assert registry.get_sample_value("gpuscope_gpu_up", GPU) == 0.0


def test_the_poller_thread_outlives_a_failing_round() -> None:
    source = EnumerationFails()
    poller = GpuPoller(source, 0.01)
    source.fail_devices = True
    poller.start()
    try:
        with source.sampled:  # the thread keeps sampling after the failed rounds
            assert source.sampled.wait_for(lambda: source.samples >= 3, timeout=10)
        assert poller.wait_for_round(3, timeout_s=10)
    finally:
        poller.stop()
