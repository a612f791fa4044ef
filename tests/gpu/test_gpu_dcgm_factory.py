"""The DCGM source through a fake of its bindings, and choosing a source by flag."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from gpuscope.exporter.gpu.dcgm import FIELD_IDS, DcgmSource, DcgmUnavailable, load_dcgm_bindings
from gpuscope.exporter.gpu.factory import GpuSourceUnavailable, open_gpu_source
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.gpu.source import GpuSourceKind
from support.gpu_fake_dcgm import FakeDcgmHost, FakeValue


class ManualClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def busy_gpu() -> dict[int, FakeValue]:
    return {
        100: FakeValue(1755),
        113: FakeValue(1980),
        112: FakeValue(0x4),  # sw_power_cap
        155: FakeValue(612.5),
        156: FakeValue(2_000_000),
        203: FakeValue(97),
        237: FakeValue(5),
        238: FakeValue(16),
        250: FakeValue(81559),
        252: FakeValue(40000),
        1002: FakeValue(0.91),
        1003: FakeValue(0.42),
        1004: FakeValue(0.0, isBlank=True),  # not supported: blank
        1009: FakeValue(1e9),
        1010: FakeValue(4e9),
        230: FakeValue(0, ts=5),
        310: FakeValue(2),
    }


def test_dcgm_fields_by_id_become_readings_in_base_units() -> None:
    host = FakeDcgmHost(gpus={0: busy_gpu()})
    clock = ManualClock()
    source = DcgmSource(host.bindings(), clock=clock)
    assert set(host.watched) == set(FIELD_IDS) and {1002, 1003, 1004, 1005, 1009, 1010} <= set(
        host.watched
    )
    assert source.devices()[0].uuid == "GPU-dcgm-0"
    source.sample()
    clock.now += 2
    reading = source.sample()[0]
    assert reading.values.get("sm_clock_hz") == 1755e6
    assert reading.clock_event_reasons is not None and reading.clock_event_reasons["sw_power_cap"]
    assert reading.values.get("energy_joules_total") == 2000.0
    assert reading.values.get("utilization_ratio") == pytest.approx(0.97)
    assert reading.values.get("memory_used_bytes") == 40000 * 2**20
    assert reading.values.get("sm_occupancy_ratio") == 0.42
    assert reading.values.get("tensor_active_ratio") is None
    assert reading.values.get("pcie_receive_bytes_total") == pytest.approx(8e9)  # 4 GB/s for 2 s
    assert reading.values.get("pcie_link_width") == 16
    assert reading.ecc_errors_total == {"volatile_corrected": 2}


def test_dcgm_counts_each_new_xid_and_not_the_one_before_start() -> None:
    host = FakeDcgmHost(gpus={0: busy_gpu()})
    host.gpus[0][230] = FakeValue(31, ts=5)  # seen before gpuscope started
    source = DcgmSource(host.bindings(), clock=ManualClock())
    assert source.sample()[0].xid_errors_total == {}
    host.gpus[0][230] = FakeValue(79, ts=9)
    assert source.sample()[0].xid_errors_total == {79: 1}
    assert source.sample()[0].xid_errors_total == {79: 1}  # same timestamp: same error


def test_dcgm_gpu_with_only_blanks_is_down() -> None:
    host = FakeDcgmHost(gpus={0: busy_gpu(), 1: {100: FakeValue(0, isBlank=True)}})
    readings = DcgmSource(host.bindings(), clock=ManualClock()).sample()
    assert [r.up for r in readings] == [True, False]


def test_unreachable_host_engine_is_unavailable() -> None:
    host = FakeDcgmHost(gpus={0: busy_gpu()}, reachable=False)
    with pytest.raises(DcgmUnavailable, match=r"host engine at 127\.0\.0\.1"):
        DcgmSource(host.bindings())


def test_missing_bindings_say_where_they_were_looked_for() -> None:
    with pytest.raises(DcgmUnavailable, match="datacenter-gpu-manager-4"):
        load_dcgm_bindings()


def test_factory_kinds() -> None:
    assert open_gpu_source(GpuSourceKind.NONE, scenario=None, simulated_count=1) is None
    source = open_gpu_source(GpuSourceKind.SIMULATED, scenario=None, simulated_count=3)
    assert isinstance(source, SimulatedSource) and len(source.devices()) == 3
    # no DCGM, no NVML driver on this machine: auto settles for request metrics only
    assert open_gpu_source(GpuSourceKind.AUTO, scenario=None, simulated_count=1) is None


@pytest.mark.parametrize(
    ("kind", "count", "error", "message"),
    [
        (cast(GpuSourceKind, "cuda"), 1, ValueError, "--gpu-source must be one of"),
        (GpuSourceKind.NVML, 1, GpuSourceUnavailable, "--gpu-source nvml: nvmlInit failed"),
        (
            GpuSourceKind.DCGM,
            1,
            GpuSourceUnavailable,
            "--gpu-source dcgm: DCGM Python bindings not found",
        ),
    ],
)
def test_factory_errors_name_the_flag(
    kind: GpuSourceKind, count: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        open_gpu_source(kind, scenario=None, simulated_count=count)


def test_factory_scenario_errors_name_the_flag(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("events: [{at: 0, gpu: 5, fault: fall_off_bus}]\n")
    with pytest.raises(ValueError, match=r"--gpu-scenario .*names GPU 5"):
        open_gpu_source(GpuSourceKind.SIMULATED, scenario=scenario, simulated_count=2)
    with pytest.raises(ValueError, match="--gpu-scenario applies to --gpu-source simulated"):
        open_gpu_source(GpuSourceKind.NVML, scenario=scenario, simulated_count=2)
