"""What the NVML source does where a driver branch or a pynvml release lacks the best
call: memory v1, the clock reasons' older name, GPM's NaN, PCIe bytes without the
R555 fields, and process lists pynvml misreads. Each gap is said by ``gpuscope doctor``."""

from __future__ import annotations

import math
import threading
import time
import types
from pathlib import Path

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from gpuscope.exporter.doctor import diagnose
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.nvml import pcie
from gpuscope.exporter.gpu.nvml.processes import DeviceProcessLister, read_pid_max
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.processes import ProcessGpuMap, ProcessJoin
from support.gpu_fake_nvml import AMPERE, FakeNvml, fake_gpu

GIB, MIB = 2**30, 2**20


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def open_source(fake: FakeNvml, clock: ManualClock | None = None) -> NvmlSource:
    return NvmlSource(fake, clock=clock or ManualClock(), xid_wait_ms=50)


# --- memory: v2 with reserved apart, v1 where the driver lacks v2 ----------------------


def test_memory_used_excludes_the_reserved_memory_served_apart() -> None:
    fake = FakeNvml([fake_gpu(0, memory_used=0, memory_reserved=GIB // 2)])  # an idle H100
    source = open_source(fake)
    values = source.sample()[0].values
    assert values["memory_used_bytes"] == 0.0  # v1 would say 0.5 GiB
    assert values["memory_reserved_bytes"] == GIB / 2
    assert values["memory_total_bytes"] == 80 * GIB
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert "nvmlDeviceGetMemoryInfo" not in fake.calls
    source.close()


def test_a_driver_without_memory_v2_falls_back_to_v1_and_the_doctor_says_so() -> None:
    fake = FakeNvml([fake_gpu(0, memory_used=GIB, memory_reserved=GIB // 2)])
    fake.missing_functions.add("nvmlDeviceGetMemoryInfo_v2")
    source = open_source(fake)
    values = source.sample()[0].values
    assert values["memory_used_bytes"] == 1.5 * GIB  # v1: reserved counted as used
    assert "memory_reserved_bytes" not in values
    source.sample()
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # not asked again
    metrics = diagnose(open_source(fake))["gpus"][0]["metrics"]
    assert metrics["memory"]["supported"] is True
    assert "used includes the driver's reserved memory" in metrics["memory"]["note"]
    assert metrics["memory_reserved"]["supported"] is False
    assert "nvmlDeviceGetMemoryInfo_v2" in metrics["memory_reserved"]["why"]
    source.close()


# --- clock event reasons: the older name before R535 ----------------------------------


def test_a_driver_before_r535_gives_clock_reasons_through_the_throttle_name() -> None:
    fake = FakeNvml([fake_gpu(0, clock_reasons=pynvml.nvmlClocksEventReasonSwPowerCap)])
    fake.missing_functions.add("nvmlDeviceGetCurrentClocksEventReasons")
    source = open_source(fake)
    reasons = source.sample()[0].clock_event_reasons
    assert reasons is not None and reasons["sw_power_cap"] and not reasons["gpu_idle"]
    source.sample()
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in source.notes()[0]["clock_event_reasons"]
    source.close()


def test_a_pynvml_without_the_events_name_uses_the_throttle_name() -> None:
    old = types.ModuleType("pynvml_without_clock_events")
    old.__dict__.update(vars(pynvml))
    del old.nvmlDeviceGetCurrentClocksEventReasons
    fake = FakeNvml([fake_gpu(0, clock_reasons=pynvml.nvmlClocksEventReasonGpuIdle)], pynvml=old)
    source = open_source(fake)
    reasons = source.sample()[0].clock_event_reasons
    assert reasons is not None and reasons["gpu_idle"]
    assert "nvmlDeviceGetCurrentClocksEventReasons" not in fake.calls
    source.close()


# --- GPM: NaN left out, not 0 ---------------------------------------------------------


def test_gpm_nan_is_left_out_not_zero_and_named_by_the_doctor() -> None:
    gpu = fake_gpu(0)
    gpu.gpm_percent[pynvml.NVML_GPM_METRIC_SM_OCCUPANCY] = math.nan
    fake = FakeNvml([gpu])
    clock = ManualClock()
    source = open_source(fake, clock)
    source.sample()
    clock.now += 1.0
    values = source.sample()[0].values
    assert "sm_occupancy_ratio" not in values
    assert values["sm_active_ratio"] == pytest.approx(0.8)
    assert "NaN for sm_occupancy_ratio" in source.notes()[0]["gpm"]
    report = diagnose(NvmlSource(fake, xid_wait_ms=50))  # real time between its samples
    assert "NaN for sm_occupancy_ratio" in report["gpus"][0]["metrics"]["gpm"]["note"]
    source.close()


# --- PCIe bytes without the R555 byte-count fields ------------------------------------


def test_hopper_without_the_pcie_fields_integrates_gpm_pcie_rates() -> None:
    fake = FakeNvml([fake_gpu(0, pcie_fields_supported=False, gpm_pcie_mib_s=(100.0, 400.0))])
    clock = ManualClock()
    source = open_source(fake, clock)
    first = source.sample()[0].values  # fields found missing; GPM asked from now on
    assert "pcie_transmit_bytes_total" not in first  # absent until an interval, never 0
    for _ in range(3):
        clock.now += 2.0
        values = source.sample()[0].values
    # GPM counts between its samples: all three intervals of 2 s after the first poll
    assert values["pcie_transmit_bytes_total"] == pytest.approx(100 * MIB * 6.0)
    assert values["pcie_receive_bytes_total"] == pytest.approx(400 * MIB * 6.0)
    assert fake.calls.get("nvmlDeviceGetPcieThroughput", 0) == 0
    # the PCIe fields once (missing: GPM from then on), NVLink's at each of the 4 polls
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1 + 4
    assert "GPM's PCIe rates" in source.notes()[0]["pcie_bytes"]
    source.close()


def test_gpm_without_pcie_rates_falls_back_to_the_sampling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pcie, "SAMPLE_PERIOD_S", 0.01)
    fake = FakeNvml([fake_gpu(0, pcie_fields_supported=False, gpm_pcie_mib_s=None)])
    clock = ManualClock()
    source = open_source(fake, clock)
    for _ in range(3):
        clock.now += 1.0
        source.sample()
    assert "estimated" in source.notes()[0]["pcie_bytes"]
    source.close()


def test_without_fields_or_gpm_the_throughput_calls_leave_the_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An Ampere GPU on R535: the 20 ms throughput calls run on a thread of their own;
    a poll of four GPUs does not wait for them (inline it would take 4 x 2 x 20 ms)."""
    monkeypatch.setattr(pcie, "SAMPLE_PERIOD_S", 0.01)
    gpus = [
        fake_gpu(
            i, architecture=AMPERE, pcie_fields_supported=False, pcie_throughput_kib_s=(100, 400)
        )
        for i in range(4)
    ]
    fake = FakeNvml(gpus)
    fake.throughput_delay_s = 0.02
    source = open_source(fake)
    source.sample()  # finds the fields missing, starts the samplers
    deadline = time.monotonic() + 5.0
    while fake.calls.get("nvmlDeviceGetPcieThroughput", 0) < 4 * 2 * 3:
        assert time.monotonic() < deadline, "the samplers did not sample"
        time.sleep(0.01)
    started = time.perf_counter()
    readings = source.sample()
    took = time.perf_counter() - started
    assert took < 0.08, f"the poll waited on the throughput calls: {took * 1000:.0f} ms"
    assert threading.get_ident() not in fake.throughput_threads
    tx = readings[0].values["pcie_transmit_bytes_total"]
    rx = readings[0].values["pcie_receive_bytes_total"]
    assert 0 < tx < rx  # 100 and 400 KiB/s integrated over the thread's own intervals
    assert "a rate over 20 ms" in source.notes()[0]["pcie_bytes"]
    threads = [t for t in threading.enumerate() if t.name == "gpuscope-pcie-throughput"]
    assert len(threads) == 4
    source.close()
    assert not any(t.is_alive() for t in threads)  # closed with the source


def test_the_sampling_thread_integrates_each_sample_and_reports_a_lost_gpu() -> None:
    fake = FakeNvml([fake_gpu(0, architecture=AMPERE, pcie_throughput_kib_s=(10, 20))])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    clock = ManualClock()
    sampler = pcie.PcieThroughputSampler(fake, handle, clock=clock)
    assert sampler.read() is None  # nothing sampled: absent, not 0
    sampler.sample_once()
    assert sampler.read() == (0.0, 0.0)
    clock.now += 0.5
    sampler.sample_once()
    assert sampler.read() == (10 * 1024 * 0.5, 20 * 1024 * 0.5)
    fake.gpus[0].lost = True
    assert sampler.sample_once() is True  # a lost GPU is the reader's to handle
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sampler.read()
    fake.gpus[0].lost = False
    fake.gpus[0].errors["nvmlDeviceGetPcieThroughput"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert sampler.sample_once() is False  # the thread ends: the GPU cannot give it


# --- process lists pynvml misreads ----------------------------------------------------


def fake_proc(tmp_path: Path, pids: list[int]) -> Path:
    root = tmp_path / "proc"
    for pid in pids:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} (python3) S 1 {pid} 1 0\n")
    return root


def test_a_record_size_mismatch_is_not_trusted_and_says_why(tmp_path: Path) -> None:
    """The driver writes 32-byte records and pynvml reads 24: the first pid is right,
    the others are 0 and 4294967295; today's join called that "ok, 2 listed but gone"."""
    fake = FakeNvml([fake_gpu(0, compute_processes=[(301, GIB), (302, GIB), (303, GIB)])])
    fake.driver_record_bytes = 32
    source = open_source(fake)
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    pids = {int(p.pid) for p in fake.nvmlDeviceGetComputeRunningProcesses(handle)}
    assert pids == {301, 0, 4294967295}  # what pynvml itself returns on such a driver
    join = ProcessGpuMap(proc_root=fake_proc(tmp_path, [301, 302, 303]), own_pid=1)
    join.refresh(source)
    state = join.state()
    assert state.status is ProcessJoin.UNTRUSTED_LISTING
    assert "impossible pids (0, 4294967295" in state.why and "nvidia-ml-py" in state.why
    assert join.uuids_for_pid(301) == ()
    poller = GpuPoller(source, 1.0, processes=join)
    poller.poll_once()
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    status = {"status": ProcessJoin.UNTRUSTED_LISTING.value}
    assert registry.get_sample_value("gpuscope_gpu_process_join_status", status) == 1.0
    poller.stop()


def test_matching_records_are_trusted(tmp_path: Path) -> None:
    fake = FakeNvml([fake_gpu(0, compute_processes=[(301, GIB), (302, GIB)])])
    fake.driver_record_bytes = 24  # as pynvml 13 reads them
    source = open_source(fake)
    join = ProcessGpuMap(proc_root=fake_proc(tmp_path, [301, 302]), own_pid=1)
    join.refresh(source)
    assert join.state().status is ProcessJoin.OK
    assert join.uuids_for_pid(302) == (fake.gpus[0].uuid,)
    source.close()


def test_a_pid_above_pid_max_is_impossible(tmp_path: Path) -> None:
    fake = FakeNvml([fake_gpu(0, compute_processes=[(301, GIB), (40_000, GIB)])])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    lister = DeviceProcessLister(fake, handle, device="GPU 0", driver="535.183.01", pid_max=32768)
    assert lister.pids() is None
    assert lister.untrusted is not None and "40000" in lister.untrusted.why
    fake.gpus[0].compute_processes = [(301, GIB)]
    assert lister.pids() == (301,)  # each listing judged alone
    assert lister.untrusted is None
    pid_max = tmp_path / "pid_max"
    pid_max.write_text("4194304\n")
    assert read_pid_max(pid_max) == 4194304
    assert read_pid_max(tmp_path / "absent") == 4194304  # PID_MAX_LIMIT
