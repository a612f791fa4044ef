"""The NVML source against a fake of the pynvml surface, through every branch."""

from __future__ import annotations

import inspect

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.nvml.events import COLLECTOR, XidCounts, XidEventWatcher
from gpuscope.exporter.gpu.nvml.source import Backoff, NvmlSource, NvmlUnavailable
from gpuscope.exporter.gpu.poller import GpuPoller
from support.gpu_fake_nvml import AMPERE, FakeNvml, fake_gpu


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def open_source(fake: FakeNvml, clock: ManualClock | None = None) -> NvmlSource:
    return NvmlSource(fake, clock=clock or ManualClock(), xid_wait_ms=50)


def test_fake_matches_the_real_pynvml_surface() -> None:
    for name, method in inspect.getmembers(FakeNvml, inspect.isfunction):
        if not name.startswith("nvml"):
            continue
        real = getattr(pynvml, name)
        fake_params = list(inspect.signature(method).parameters)[1:]
        assert fake_params == list(inspect.signature(real).parameters), name


def test_reads_every_metric_in_base_units(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[0].clock_reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    fake_nvml.gpus[0].ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)] = 3
    source = open_source(fake_nvml)
    reading = source.sample()[0]
    assert reading.up
    assert reading.values.get("sm_clock_hz") == 1980e6
    assert reading.values.get("memory_clock_max_hz") == 2619e6
    assert reading.clock_event_reasons is not None
    assert reading.clock_event_reasons["sw_power_cap"] is True
    assert reading.clock_event_reasons["gpu_idle"] is False
    assert reading.values.get("utilization_ratio") == pytest.approx(0.4)
    assert reading.values.get("power_watts") == 350.0
    assert reading.values.get("power_limit_watts") == 700.0
    assert reading.values.get("energy_joules_total") == 1000.0
    assert reading.values.get("temperature_celsius") == 55.0
    assert reading.values.get("memory_used_bytes") == 10 * 2**30  # v2: reserved apart
    assert reading.values.get("memory_reserved_bytes") == 512 * 2**20
    assert (
        reading.values.get("pcie_transmit_bytes_total"),
        reading.values.get("pcie_receive_bytes_total"),
    ) == (1000, 5000)
    assert (reading.values.get("pcie_link_generation"), reading.values.get("pcie_link_width")) == (
        5,
        16,
    )
    assert reading.ecc_errors_total is not None
    assert reading.ecc_errors_total["volatile_corrected"] == 3
    assert fake_nvml.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0  # fields suffice
    assert [d.uuid for d in source.devices()] == [g.uuid for g in fake_nvml.gpus]
    assert source.devices()[1].pci_bus_id == "00000000:19:00.0"
    source.close()
    assert fake_nvml.refcount == 0


def test_gpm_needs_two_samples_at_least_100ms_apart(fake_nvml: FakeNvml) -> None:
    clock = ManualClock()
    source = open_source(fake_nvml, clock)
    assert source.sample()[0].values.get("sm_occupancy_ratio") is None  # one sample is not a rate
    clock.now += 0.05
    assert source.sample()[0].values.get("sm_occupancy_ratio") is None
    assert fake_nvml.calls["nvmlGpmSampleGet"] == 2  # the early poll took no sample
    clock.now += 0.1
    reading = source.sample()[0]
    assert reading.values.get("sm_occupancy_ratio") == pytest.approx(0.30)
    assert reading.values.get("sm_active_ratio") == pytest.approx(0.80)
    assert reading.values.get("tensor_active_ratio") == pytest.approx(0.50)
    assert reading.values.get("dram_active_ratio") == pytest.approx(0.25)
    source.close()
    assert fake_nvml.calls["nvmlGpmSampleFree"] == 4  # both buffers of both GPUs


def test_gpm_metric_the_device_lacks_is_absent(fake_nvml: FakeNvml) -> None:
    del fake_nvml.gpus[0].gpm_percent[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL]
    clock = ManualClock()
    source = open_source(fake_nvml, clock)
    source.sample()
    clock.now += 1
    reading = source.sample()[0]
    assert reading.values.get("tensor_active_ratio") is None
    assert reading.values.get("sm_occupancy_ratio") == pytest.approx(0.30)
    source.close()


def test_pre_hopper_gpu_has_no_gpm_and_says_why() -> None:
    fake = FakeNvml([fake_gpu(0, architecture=AMPERE, name="NVIDIA A100-SXM4-80GB")])
    clock = ManualClock()
    source = open_source(fake, clock)
    source.sample()
    clock.now += 1
    assert source.sample()[0].values.get("sm_occupancy_ratio") is None
    assert "Ampere" in source.unsupported_metrics()[0]["gpm"]
    assert fake.calls.get("nvmlGpmSampleAlloc", 0) == 0
    source.close()


@pytest.mark.parametrize(
    ("function", "error", "group", "field", "words"),
    [
        (
            "nvmlDeviceGetPowerUsage",
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            "power",
            "power_watts",
            "not supported by",
        ),
        (
            "nvmlDeviceGetEnforcedPowerLimit",
            pynvml.NVML_ERROR_NO_PERMISSION,
            "power_limit",
            "power_limit_watts",
            "no permission",
        ),
        (
            "nvmlDeviceGetTotalEnergyConsumption",
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            "energy",
            "energy_joules_total",
            "newer driver",
        ),
        (
            "nvmlDeviceGetTotalEccErrors",
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            "ecc_errors",
            "ecc_errors_total",
            "550.54.15",
        ),
    ],
)
def test_unsupported_metric_is_absent_explained_and_not_asked_again(
    fake_nvml: FakeNvml, function: str, error: int, group: str, field: str, words: str
) -> None:
    fake_nvml.gpus[1].errors[function] = error
    source = open_source(fake_nvml)
    for _ in range(3):
        first, second = source.sample()
        assert not second.has(field)
        assert first.has(field)  # the other GPU still has it
    assert words in source.unsupported_metrics()[1][group]
    assert group not in source.unsupported_metrics()[0]
    calls_per_read = 4 if group == "ecc_errors" else 1  # volatile/aggregate x (un)corrected
    assert fake_nvml.calls[function] == 3 * calls_per_read + 1  # GPU 1 was asked once
    source.close()


def test_transient_error_leaves_the_metric_absent_for_one_round_only(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[0].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    source = open_source(fake_nvml)
    assert source.sample()[0].values.get("temperature_celsius") is None
    del fake_nvml.gpus[0].errors["nvmlDeviceGetTemperature"]
    assert source.sample()[0].values.get("temperature_celsius") == 55.0
    assert "temperature" not in source.unsupported_metrics()[0]
    source.close()


def test_lost_gpu_goes_down_alone_and_comes_back_without_restart(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    assert [r.up for r in source.sample()] == [True, True]
    fake_nvml.gpus[1].lost = True
    first, second = source.sample()
    assert first.up and first.values.get("power_watts") == 350.0
    assert not second.up and second.values.get("power_watts") is None
    assert not source.sample()[1].up  # still gone: its handle cannot be had
    fake_nvml.gpus[1].lost = False
    back = source.sample()[1]
    assert back.up and back.values.get("power_watts") == 350.0
    source.close()


def test_driver_error_reinitialises_with_backoff(fake_nvml: FakeNvml) -> None:
    clock = ManualClock()
    source = NvmlSource(fake_nvml, clock=clock, backoff=Backoff(1.0, 4.0), xid_wait_ms=50)
    source.sample()
    fake_nvml.driver_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        source.sample()
    inits = fake_nvml.calls["nvmlInit"]
    clock.now += 0.5
    with pytest.raises(NvmlUnavailable, match=r"next retry in 0\.5 s"):
        source.sample()
    assert fake_nvml.calls["nvmlInit"] == inits  # too early: no attempt
    clock.now += 0.5
    with pytest.raises(NvmlUnavailable, match="nvmlInit failed"):
        source.sample()  # retried, still broken; next delay doubles to 2 s
    clock.now += 1.5
    with pytest.raises(NvmlUnavailable, match="next retry"):
        source.sample()
    fake_nvml.driver_error = None
    clock.now += 0.5
    assert [r.up for r in source.sample()] == [True, True]
    assert fake_nvml.calls["nvmlInit"] == inits + 2
    assert len(source.devices()) == 2
    source.close()
    # only the shutdown attempted while the driver was gone could not release its init
    assert fake_nvml.refcount == 1


def test_nvml_that_cannot_start_is_unavailable() -> None:
    fake = FakeNvml([fake_gpu(0)])
    fake.driver_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        NvmlSource(fake)


def test_xid_errors_are_counted_per_gpu_and_xid(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    assert fake_nvml.wait_events_handled()  # idle waits time out: that is success
    assert source.collector_health()[0].success
    for gpu, xid in ((1, 79), (1, 79), (1, 48), (0, 13)):
        fake_nvml.emit_xid(gpu, xid)
    assert fake_nvml.wait_events_handled()
    first, second = source.sample()
    assert first.xid_errors_total == {13: 1}
    assert second.xid_errors_total == {79: 2, 48: 1}
    source.close()


def test_failed_event_wait_is_a_collector_failure_and_waiting_goes_on(fake_nvml: FakeNvml) -> None:
    fake_nvml.refcount = 1  # as after nvmlInit; the watcher is driven by hand, without its thread
    handles = {
        g.uuid: fake_nvml.nvmlDeviceGetHandleByIndex(i) for i, g in enumerate(fake_nvml.gpus)
    }
    counts = XidCounts()
    watcher = XidEventWatcher(fake_nvml, handles, counts, wait_ms=10)
    assert fake_nvml.event_sets() == 2  # one set per GPU
    assert watcher.wait_round()  # Timeout: idle, and healthy
    assert watcher.health() == CollectorRun(COLLECTOR, True, 0.0)
    fake_nvml.emit_wait_error(pynvml.NVML_ERROR_UNKNOWN)
    assert not watcher.wait_round()
    health = watcher.health()
    assert health is not None and not health.success
    fake_nvml.emit_xid(1, 31)
    assert watcher.wait_round()
    health = watcher.health()
    assert health is not None and health.success
    assert counts.of(fake_nvml.gpus[1].uuid) == {31: 1}
    watcher.stop()  # never started: frees the event sets only
    assert fake_nvml.calls["nvmlEventSetFree"] == 2 and fake_nvml.event_sets() == 0


def test_gpu_without_xid_events_is_explained() -> None:
    fake = FakeNvml([fake_gpu(0, xid_events_supported=False), fake_gpu(1)])
    source = open_source(fake)
    assert "XID" in source.unsupported_metrics()[0]["xid_errors"]
    assert "xid_errors" not in source.unsupported_metrics()[1]
    source.close()


def test_xid_totals_are_absent_on_a_gpu_whose_events_cannot_be_watched() -> None:
    fake = FakeNvml([fake_gpu(0, xid_events_supported=False), fake_gpu(1)])
    poller = GpuPoller(open_source(fake), 1.0)
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    readings = poller.poll_once().readings
    assert [r.xid_supported for r in readings] == [False, True]
    text = generate_latest(registry).decode()
    poller.stop()
    xid_lines = [line for line in text.splitlines() if line.startswith("gpuscope_gpu_xid_")]
    # GPU 1 reads 0 from the first scrape on; GPU 0 has no XID series at all
    uuids = [gpu.uuid for gpu in fake.gpus]
    assert xid_lines == [f'gpuscope_gpu_xid_events_total{{gpu="1",uuid="{uuids[1]}"}} 0.0']
    assert f'gpuscope_gpu_up{{gpu="0",uuid="{uuids[0]}"}} 1.0' in text


def test_gpu_lost_at_start_up_is_skipped_and_the_others_report() -> None:
    fake = FakeNvml([fake_gpu(0, lost=True), fake_gpu(1)])
    source = open_source(fake)
    assert [d.index for d in source.devices()] == [1]
    assert [r.up for r in source.sample()] == [True]
    source.close()


def test_gpu_that_fails_again_while_recovering_stays_down(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    fake_nvml.gpus[0].lost = True
    assert not source.sample()[0].up
    fake_nvml.gpus[0].lost = False
    fake_nvml.gpus[0].errors["nvmlGpmQueryDeviceSupport"] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert [r.up for r in source.sample()] == [False, True]
    del fake_nvml.gpus[0].errors["nvmlGpmQueryDeviceSupport"]
    assert [r.up for r in source.sample()] == [True, True]
    source.close()


def test_a_transient_error_in_the_pcie_fields_does_not_switch_to_estimates(
    fake_nvml: FakeNvml,
) -> None:
    source = open_source(fake_nvml)
    assert source.sample()[0].values.get("pcie_transmit_bytes_total") == 1000
    fake_nvml.gpus[0].pcie_field_return = pynvml.NVML_ERROR_UNKNOWN
    glitch = source.sample()[0]
    assert (
        glitch.up and glitch.values.get("pcie_transmit_bytes_total") is None
    )  # absent this round only
    fake_nvml.gpus[0].pcie_field_return = None
    fake_nvml.gpus[0].pcie_tx_bytes = 3000
    back = source.sample()[0]
    assert (
        back.values.get("pcie_transmit_bytes_total"),
        back.values.get("pcie_receive_bytes_total"),
    ) == (3000, 5000)
    assert fake_nvml.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0
    assert "pcie_bytes" not in source.notes()[0]
    source.close()


def test_pcie_fields_a_gpu_answers_not_supported_for_fall_back_to_gpm() -> None:
    fake = FakeNvml([fake_gpu(0, pcie_field_return=pynvml.NVML_ERROR_NOT_SUPPORTED)])
    source = open_source(fake)
    source.sample()
    assert "GPM's PCIe rates" in source.notes()[0]["pcie_bytes"]
    source.close()


def test_a_lost_gpu_in_the_pcie_fields_is_a_lost_gpu(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    fake_nvml.gpus[1].pcie_field_return = pynvml.NVML_ERROR_GPU_IS_LOST
    first, second = source.sample()
    assert first.up and not second.up
    source.close()


def test_xid_events_are_watched_again_after_a_lost_gpu_comes_back(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    assert fake_nvml.wait_events_handled()
    fake_nvml.gpus[1].lost = True
    assert not source.sample()[1].up  # its registration is gone with it
    fake_nvml.gpus[1].lost = False
    assert source.sample()[1].up
    fake_nvml.emit_xid(1, 79)
    assert fake_nvml.wait_events_handled()
    assert fake_nvml.xids_undelivered == 0  # registered again with the new handle
    assert source.sample()[1].xid_errors_total == {79: 1}
    source.close()


def test_xid_watching_starts_when_a_gpu_that_refused_it_comes_back() -> None:
    fake = FakeNvml([fake_gpu(0, errors={"nvmlDeviceRegisterEvents": pynvml.NVML_ERROR_UNKNOWN})])
    source = open_source(fake)
    assert source.collector_health() == []  # nothing to watch
    assert "XID" in source.unsupported_metrics()[0]["xid_errors"]
    fake.gpus[0].errors.clear()
    fake.gpus[0].lost = True
    assert not source.sample()[0].up
    fake.gpus[0].lost = False
    assert source.sample()[0].up
    fake.emit_xid(0, 48)
    assert fake.wait_events_handled()
    assert source.sample()[0].xid_errors_total == {48: 1}
    assert "xid_errors" not in source.unsupported_metrics()[0]
    source.close()


def test_pcie_fields_counting_modulo_2_32_become_totals_that_only_grow() -> None:
    """A real H200 on driver 580.159.04 gave its PCIe byte fields modulo 2^32: a 2 GiB
    copy read as -1.98e9 bytes, and a Prometheus counter that went down each time. The
    readings are now distances modulo 2^32 from the previous one, added up."""
    from gpuscope.exporter.gpu.nvml.pcie import FIELD_MODULUS, PcieByteCounter

    counter = PcieByteCounter(nvml=None, handle=None)
    readings = [(4.0e9, 1.0e9), (4.2e9, 3.0e9), (0.5e9, 4.1e9), (2.0e9, 0.2e9)]
    totals = [counter._unwrapped(tx, rx) for tx, rx in readings]
    assert totals[0] == (4.0e9, 1.0e9)
    assert totals[1] == (4.2e9, 3.0e9)
    assert totals[2] == (4.2e9 + 0.5e9 + FIELD_MODULUS - 4.2e9, 4.1e9)
    assert totals[3] == (totals[2][0] + 1.5e9, 4.1e9 + 0.2e9 + FIELD_MODULUS - 4.1e9)
    assert totals == sorted(totals, key=lambda pair: pair[0])
    assert [rx for _, rx in totals] == sorted(rx for _, rx in totals)
