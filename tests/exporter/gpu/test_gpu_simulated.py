"""The simulated source: dynamics from compute spans, and every scheduled fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.scenario import (
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)
from gpuscope.exporter.gpu.simulated import (
    MEMORY_TOTAL_BYTES,
    PCIE_GEN5_X16_BYTES_PER_S,
    RX_BYTES_PER_REQUEST,
    SM_CLOCK_IDLE_HZ,
    SM_CLOCK_MAX_HZ,
    XID_COLLECTOR,
    SimulatedSource,
    simulated_uuid,
)
from gpuscope.exporter.gpu.source import ComputeObserver

SCENARIOS = Path(__file__).parents[3] / "exporter" / "gpu" / "scenarios"


class ManualClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def source_with(
    events: list[dict[str, object]], count: int = 2
) -> tuple[SimulatedSource, ManualClock]:
    clock = ManualClock()
    return SimulatedSource(count, parse_scenario({"events": events}), clock=clock), clock


def test_uuids_are_deterministic_and_nvml_shaped() -> None:
    assert simulated_uuid(0) == simulated_uuid(0)
    assert simulated_uuid(0) != simulated_uuid(1)
    assert simulated_uuid(3).startswith("GPU-") and len(simulated_uuid(3)) == 40
    source = SimulatedSource(2)
    assert [d.uuid for d in source.devices()] == [simulated_uuid(0), simulated_uuid(1)]
    observer: ComputeObserver = source  # mypy checks that it is one
    assert observer is source


def test_idle_gpu_clocks_down_with_the_idle_reason() -> None:
    source, clock = source_with([])
    source.sample()
    clock.now += 1
    reading = source.sample()[0]
    assert reading.values.get("sm_clock_hz") == SM_CLOCK_IDLE_HZ
    assert reading.clock_event_reasons is not None and reading.clock_event_reasons["gpu_idle"]
    assert reading.values.get("utilization_ratio") == 0.0


def test_compute_spans_drive_occupancy_power_and_pcie() -> None:
    source, clock = source_with([])
    source.sample()
    for _ in range(10):  # 10 batches of 0.2 s within the 5 s window: 40% busy
        clock.now += 0.25
        source.observe_compute(simulated_uuid(0), 0.2, batch_size=8, max_size=8)
    source.observe_compute("GPU-someone-else", 1.0, 8, 8)  # ignored
    small, small_clock = source_with([])
    small.sample()
    for _ in range(10):
        small_clock.now += 0.25
        small.observe_compute(simulated_uuid(0), 0.2, batch_size=1, max_size=8)
    full, idle = source.sample()
    half = small.sample()[0]
    assert full.values.get("utilization_ratio") == pytest.approx(0.4)
    assert idle.values.get("utilization_ratio") == 0.0
    assert full.values["sm_clock_hz"] == SM_CLOCK_MAX_HZ
    # bigger batches, busier SMs
    assert full.values["sm_occupancy_ratio"] > half.values["sm_occupancy_ratio"] > 0
    assert full.values["power_watts"] > idle.values["power_watts"]
    assert full.values["pcie_receive_bytes_total"] >= 80 * RX_BYTES_PER_REQUEST
    assert full.values["energy_joules_total"] > 0


def test_counters_are_monotonic() -> None:
    source, clock = source_with([{"at": 0, "duration": 5, "gpu": 0, "fault": "load", "level": 0.9}])
    previous = source.sample()[0]
    for _ in range(10):
        clock.now += 1
        reading = source.sample()[0]
        for name in (
            "pcie_transmit_bytes_total",
            "pcie_receive_bytes_total",
            "energy_joules_total",
        ):
            assert reading.values[name] >= previous.values[name]
        previous = reading


def test_clock_throttle_with_reason_and_factor() -> None:
    source, clock = source_with(
        [
            {
                "at": 10,
                "duration": 5,
                "gpu": 1,
                "fault": "clock_throttle",
                "reason": "hw_thermal_slowdown",
                "factor": 0.5,
            }
        ]
    )
    source.sample()
    clock.now += 11
    healthy, throttled = source.sample()
    assert throttled.values.get("sm_clock_hz") == SM_CLOCK_MAX_HZ * 0.5
    assert throttled.clock_event_reasons is not None
    assert throttled.clock_event_reasons["hw_thermal_slowdown"]
    assert not throttled.clock_event_reasons["gpu_idle"]
    assert healthy.clock_event_reasons is not None and healthy.clock_event_reasons["gpu_idle"]
    clock.now += 5  # the episode is over
    assert source.sample()[1].clock_event_reasons == healthy.clock_event_reasons


def test_pcie_saturation_fills_the_link() -> None:
    source, clock = source_with(
        [{"at": 0, "duration": 10, "gpu": 0, "fault": "pcie_saturation", "direction": "rx"}]
    )
    before = source.sample()[0]
    clock.now += 2
    after = source.sample()[0]
    rate = (
        after.values["pcie_receive_bytes_total"] - before.values["pcie_receive_bytes_total"]
    ) / 2
    assert rate == pytest.approx(PCIE_GEN5_X16_BYTES_PER_S * 0.97)
    assert after.values["pcie_transmit_bytes_total"] < 1e8


def test_xid_burst_is_counted_once() -> None:
    source, clock = source_with([{"at": 5, "gpu": 1, "fault": "xid", "xid": 48, "count": 3}])
    source.sample()
    clock.now += 4
    assert source.sample()[1].xid_errors_total == {}
    clock.now += 2
    assert source.sample()[1].xid_errors_total == {48: 3}
    clock.now += 10
    first, second = source.sample()
    assert second.xid_errors_total == {48: 3}
    assert first.xid_errors_total == {}


@pytest.mark.parametrize(("xid", "uncorrected"), [(48, 3), (94, 3), (95, 3), (79, 0), (13, 0)])
def test_an_ecc_xid_raises_the_uncorrected_ecc_counter(xid: int, uncorrected: int) -> None:
    source, clock = source_with([{"at": 5, "gpu": 1, "fault": "xid", "xid": xid, "count": 3}])
    first, second = source.sample()
    assert second.ecc_errors_total == {"volatile_corrected": 0, "volatile_uncorrected": 0}
    clock.now += 6
    first, second = source.sample()
    assert second.xid_errors_total == {xid: 3}
    assert second.ecc_errors_total == {
        "volatile_corrected": 0,
        "volatile_uncorrected": uncorrected,
    }
    assert first.ecc_errors_total == {"volatile_corrected": 0, "volatile_uncorrected": 0}


def test_ecc_events_count_by_type_once() -> None:
    source, clock = source_with(
        [
            {"at": 5, "gpu": 0, "fault": "ecc", "type": "volatile_corrected", "count": 7},
            {"at": 8, "gpu": "all", "fault": "ecc"},
        ]
    )
    source.sample()
    clock.now += 6
    assert source.sample()[0].ecc_errors_total == {
        "volatile_corrected": 7,
        "volatile_uncorrected": 0,
    }
    clock.now += 6
    for _ in range(2):  # counted in the poll that crossed it, not again
        first, second = source.sample()
        assert first.ecc_errors_total == {"volatile_corrected": 7, "volatile_uncorrected": 1}
        assert second.ecc_errors_total == {"volatile_corrected": 0, "volatile_uncorrected": 1}
        clock.now += 1


def test_memory_used_holds_the_level_while_it_lasts() -> None:
    source, clock = source_with(
        [{"at": 5, "duration": 10, "gpu": 1, "fault": "memory_used", "level": 0.97}]
    )
    source.sample()
    clock.now += 6
    first, second = source.sample()
    assert second.values["memory_used_bytes"] == pytest.approx(0.97 * MEMORY_TOTAL_BYTES)
    assert first.values["memory_used_bytes"] < 0.1 * MEMORY_TOTAL_BYTES
    clock.now += 10
    assert source.sample()[1].values["memory_used_bytes"] < 0.1 * MEMORY_TOTAL_BYTES


def test_a_failing_xid_helper_reports_failure_and_the_gpus_stay_up() -> None:
    source, clock = source_with(
        [{"at": 5, "duration": 10, "fault": "collector_error", "collector": "xid_events"}]
    )
    assert source.collector_health() == [CollectorRun(XID_COLLECTOR, True, 0.0)]
    clock.now += 6
    assert [r.up for r in source.sample()] == [True, True]
    assert source.collector_health() == [CollectorRun(XID_COLLECTOR, False, 0.0)]
    clock.now += 10
    assert source.collector_health() == [CollectorRun(XID_COLLECTOR, True, 0.0)]


def test_a_failing_source_fails_the_poll_and_the_gap_is_counted_after() -> None:
    source, clock = source_with(
        [
            {"at": 5, "duration": 10, "fault": "collector_error"},
            {"at": 8, "gpu": 0, "fault": "xid", "xid": 31},
        ]
    )
    poller = GpuPoller(source, 1.0)
    first = poller.poll_once().runs
    assert [(run.collector, run.success) for run in first] == [
        ("simulated", True),
        (XID_COLLECTOR, True),
    ]
    clock.now += 6
    failed = poller.poll_once()
    assert not failed.runs[0].success
    assert [r.up for r in failed.readings] == [False, False]  # the poller's answer
    clock.now += 10
    recovered = poller.poll_once()
    assert recovered.runs[0].success
    assert recovered.readings[0].xid_errors_total == {31: 1}


def test_gpu_falls_off_the_bus_and_comes_back() -> None:
    source, clock = source_with([{"at": 5, "duration": 10, "gpu": 0, "fault": "fall_off_bus"}])
    source.sample()
    clock.now += 6
    lost, other = source.sample()
    assert not lost.up and lost.values.get("power_watts") is None
    assert other.up
    clock.now += 10
    assert source.sample()[0].up


def test_not_supported_fields_are_absent() -> None:
    source, _ = source_with(
        [{"gpu": 1, "fault": "not_supported", "fields": ["sm_occupancy_ratio", "power_watts"]}]
    )
    first, second = source.sample()
    assert (
        second.values.get("sm_occupancy_ratio") is None and second.values.get("power_watts") is None
    )
    assert (
        first.values.get("sm_occupancy_ratio") is not None
        and second.values.get("temperature_celsius") is not None
    )


def test_shipped_scenarios_load() -> None:
    for path in sorted(SCENARIOS.glob("*.yaml")):
        scenario = load_scenario(path)
        assert scenario.events, path
        SimulatedSource(max(2, scenario.highest_gpu() + 1), scenario)


def test_json_scenarios_load(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"events": [{"at": 1, "gpu": 0, "fault": "xid", "xid": 79}]}))
    assert load_scenario(path).events[0].xid == 79


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"events": [{"fault": "explode"}]}, "event 0: 'fault' must be one of"),
        ({"events": [{"fault": "xid"}]}, "'xid' must be a positive integer"),
        ({"events": [{"fault": "load", "level": 2}]}, "'level' must be a number in"),
        (
            {"events": [{"fault": "clock_throttle", "reason": "cosmic_rays"}]},
            "'reason' must be one of",
        ),
        (
            {"events": [{"fault": "not_supported", "fields": ["up"]}]},
            "'fields' must be a non-empty",
        ),
        ({"events": [{"fault": "fall_off_bus", "gpu": -1}]}, "'gpu' must be a GPU index"),
        ({"events": [{"fault": "fall_off_bus", "colour": "red"}]}, "unknown keys"),
        ({"events": [{"fault": "fall_off_bus", "at": -3}]}, "'at' must be a number"),
        ({"gpus": 3}, "one key, 'events'"),
        ({"events": [{"fault": "ecc", "type": "single_bit"}]}, "'type' must be one of"),
        ({"events": [{"fault": "memory_used", "level": 1.5}]}, "'level' must be a number in"),
        (
            {"events": [{"fault": "collector_error", "collector": "gpm"}]},
            "'collector' must be one of",
        ),
        (
            {"events": [{"fault": "collector_error", "gpu": 0}]},
            "applies to every GPU",
        ),
    ],
)
def test_bad_scenarios_name_the_event(data: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(data, source="x.yaml")


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("events: [\n")
    with pytest.raises(ScenarioError, match=r"broken\.yaml: not valid YAML"):
        load_scenario(broken)


def test_scenario_naming_a_missing_gpu_is_refused() -> None:
    scenario = parse_scenario({"events": [{"gpu": 4, "fault": "fall_off_bus"}]})
    with pytest.raises(ValueError, match="names GPU 4 but only 2"):
        SimulatedSource(2, scenario)
    assert Scenario().highest_gpu() == -1
