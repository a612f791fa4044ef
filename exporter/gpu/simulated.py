"""A simulated GPU source: N H100-like GPUs with plausible dynamics and scheduled faults.

It exists for the demo and the alert tests where no GPU exists, and produces the
same ``GpuReading`` objects as NVML, so everything from readings to ``/metrics`` is
the code NVML goes through. Activity comes from two places: the compute spans the
exporter reports (``observe_compute``, so bigger batches make a busier GPU) and
``load`` events of the scenario. Its running processes (``processes()``, for the
process join) are the pids of the scenario's ``process`` events. Like NVML's, it
reports the health of its XID helper (``collector_health``), which a scenario can
make fail. The clock is injected: tests drive time by hand.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuscope.contract.gpu import simulated_uuid as simulated_uuid  # re-exported
from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.clock_reasons import (
    decode_clock_event_reasons,
    encode_clock_event_reasons,
)
from gpuscope.exporter.gpu.processes import ProcessListing
from gpuscope.exporter.gpu.scenario import ECC_TYPES, Scenario, ScenarioEvent
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, GpuSourceKind, ProcessUse

# H100 SXM-like constants
SM_CLOCK_MAX_HZ = 1980e6
SM_CLOCK_IDLE_HZ = 345e6
MEMORY_CLOCK_HZ = 2619e6
POWER_IDLE_W = 72.0
POWER_LIMIT_W = 700.0
MEMORY_TOTAL_BYTES = 80 * 2**30
MEMORY_IDLE_BYTES = 0.5 * 2**30
MEMORY_RESERVED_BYTES = 0.5 * 2**30  # the driver's own, as NVML memory v2 reports it apart
PCIE_GEN5_X16_BYTES_PER_S = 63e9  # usable per direction
PCIE_IDLE_BYTES_PER_S = 2e6
# host->device bytes per request of a batch, device->host bytes per request
RX_BYTES_PER_REQUEST = 4 * 2**20
TX_BYTES_PER_REQUEST = 1 * 2**20
ACTIVITY_WINDOW_S = 5.0  # busy fraction is measured over this trailing window
THERMAL_TIME_CONSTANT_S = 30.0
# The helper that counts XIDs, as NVML's event thread is ``nvml_xid_events``.
XID_COLLECTOR = "simulated_xid_events"
# XIDs that report an uncorrectable ECC error, which the driver also counts in the
# volatile uncorrected ECC counter: 48 (double-bit ECC error), 94 and 95 (contained
# and uncontained ECC errors, Ampere and later).
ECC_XIDS = frozenset({48, 94, 95})


class SimulatedCollectorError(RuntimeError):
    """The scenario makes the source fail this poll (``collector_error``)."""


@dataclass
class _GpuState:
    # (start, end, batch fill 0-1), dated by arrival at the exporter
    busy: deque[tuple[float, float, float]] = field(default_factory=deque)
    pcie_tx: float = 0.0
    pcie_rx: float = 0.0
    energy_j: float = 0.0
    temperature_c: float = 32.0
    xids: dict[int, int] = field(default_factory=dict)
    ecc: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ECC_TYPES, 0))


class SimulatedSource:
    """``GpuSource`` and ``ComputeObserver`` for ``count`` simulated GPUs."""

    name: str = GpuSourceKind.SIMULATED

    def __init__(
        self,
        count: int,
        scenario: Scenario | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if count < 1:
            raise ValueError(f"simulated GPU count must be at least 1, got {count}")
        self._scenario = scenario or Scenario()
        if self._scenario.highest_gpu() >= count:
            raise ValueError(
                f"the scenario names GPU {self._scenario.highest_gpu()} "
                f"but only {count} simulated GPUs exist"
            )
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._last: float | None = None
        self._first = True
        self._devices = tuple(
            GpuDevice(
                index=i,
                uuid=simulated_uuid(i),
                name="Simulated H100 80GB HBM3",
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                numa_node=i * 2 // count,
                driver_version="simulated",
            )
            for i in range(count)
        )
        self._index_by_uuid = {d.uuid: d.index for d in self._devices}
        self._states = [_GpuState() for _ in range(count)]

    def devices(self) -> Sequence[GpuDevice]:
        return self._devices

    def observe_compute(self, uuid: str, seconds: float, batch_size: int, max_size: int) -> None:
        """One batch ran on ``uuid`` for ``seconds``; spans for other GPUs are ignored."""
        index = self._index_by_uuid.get(uuid)
        if index is None or seconds < 0 or batch_size < 1:
            return
        fill = min(1.0, batch_size / max_size) if max_size > 0 else 1.0
        with self._lock:
            state = self._states[index]
            arrived = self._clock()  # spans arrive after export batching: date by arrival
            state.busy.append((arrived - seconds, arrived, fill))
            state.pcie_rx += batch_size * RX_BYTES_PER_REQUEST
            state.pcie_tx += batch_size * TX_BYTES_PER_REQUEST

    def sample(self) -> Sequence[GpuReading]:
        with self._lock:
            now = self._clock()
            if self._failing("sample", now - self._started):
                # nothing advances: the next good poll counts the XIDs of the gap
                raise SimulatedCollectorError("simulated GPU read failed (scenario)")
            self._first = self._last is None
            previous = now if self._last is None else self._last
            self._last = now
            t_prev, t = previous - self._started, now - self._started
            return [
                self._sample_one(d.index, now, t_prev, t, max(0.0, now - previous))
                for d in self._devices
            ]

    def processes(self) -> ProcessListing:
        """The pids the scenario's ``process`` events list on each GPU now; a GPU off
        the bus lists nothing, as NVML cannot ask it."""
        t = self._clock() - self._started
        pids = {}
        for device in self._devices:
            events = [e for e in self._scenario.events if e.applies(device.index, t)]
            if any(e.fault == "fall_off_bus" for e in events):
                continue
            pids[device.uuid] = tuple(sorted({e.pid for e in events if e.fault == "process"}))
        return ProcessListing(pids)

    def collector_health(self) -> Sequence[CollectorRun]:
        """The XID helper's last run (``ReportsCollectorHealth``), as NVML's event thread
        reports its own: failed while a ``collector_error`` of ``xid_events`` lasts."""
        t = self._clock() - self._started
        return [CollectorRun(XID_COLLECTOR, not self._failing("xid_events", t), 0.0)]

    def close(self) -> None:
        """Nothing to release."""

    def _failing(self, collector: str, t: float) -> bool:
        return any(
            e.fault == "collector_error" and e.collector == collector and e.applies(0, t)
            for e in self._scenario.events
        )

    def _sample_one(self, index: int, now: float, t_prev: float, t: float, dt: float) -> GpuReading:
        state = self._states[index]
        events = [e for e in self._scenario.events if e.applies(index, t)]
        self._count_errors(index, state, t_prev, t, first=self._first)
        if any(e.fault == "fall_off_bus" for e in events):
            return GpuReading(index=index, uuid=self._devices[index].uuid, up=False)
        busy, fill = self._activity(state, now)
        for event in events:
            if event.fault == "load":
                busy, fill = max(busy, event.level), max(fill, event.level)
        reading = self._physics(index, state, events, busy, fill, dt)
        hidden = set().union(*(e.fields for e in events if e.fault == "not_supported"))
        return reading if not hidden else _without(reading, hidden)

    def _physics(
        self,
        index: int,
        state: _GpuState,
        events: list[ScenarioEvent],
        busy: float,
        fill: float,
        dt: float,
    ) -> GpuReading:
        throttles = [e for e in events if e.fault == "clock_throttle"]
        reasons = {e.reason for e in throttles}
        clock_fraction = min((e.factor for e in throttles), default=1.0)
        if busy < 0.05 and not throttles:
            reasons.add("gpu_idle")
            sm_clock = SM_CLOCK_IDLE_HZ
        else:
            sm_clock = SM_CLOCK_MAX_HZ * clock_fraction
        power = POWER_IDLE_W + (POWER_LIMIT_W - POWER_IDLE_W) * busy * clock_fraction**2
        if "sw_power_cap" in reasons:
            power = POWER_LIMIT_W * 0.99
        state.energy_j += power * dt
        target = 32.0 + 45.0 * busy
        if reasons & {"hw_thermal_slowdown", "sw_thermal_slowdown"}:
            target = 91.0
        state.temperature_c += (target - state.temperature_c) * (
            1.0 - math.exp(-dt / THERMAL_TIME_CONSTANT_S)
        )
        self._advance_pcie(state, events, dt)
        values = {
            "sm_clock_hz": sm_clock,
            "sm_clock_max_hz": SM_CLOCK_MAX_HZ,
            "sm_clock_target_hz": SM_CLOCK_MAX_HZ,  # an H100's default applications clock
            "memory_clock_hz": MEMORY_CLOCK_HZ,
            "memory_clock_max_hz": MEMORY_CLOCK_HZ,
            "utilization_ratio": busy,
            "sm_occupancy_ratio": busy * (0.25 + 0.6 * fill) * clock_fraction,
            "sm_active_ratio": busy * 0.92,
            "tensor_active_ratio": busy * 0.55,
            "dram_active_ratio": busy * 0.4,
            "pcie_transmit_bytes_total": state.pcie_tx,
            "pcie_receive_bytes_total": state.pcie_rx,
            "pcie_link_generation": 5,
            "pcie_link_width": 16,
            # an H100 SXM's 18 NVLinks; no simulated GPU talks to a peer, so they idle
            "nvlink_links": 18,
            "nvlink_transmit_bytes_total": 0.0,
            "nvlink_receive_bytes_total": 0.0,
            "memory_used_bytes": max(
                MEMORY_IDLE_BYTES + 40 * 2**30 * fill * (busy > 0),
                max((e.level for e in events if e.fault == "memory_used"), default=0.0)
                * MEMORY_TOTAL_BYTES,
            ),
            "memory_reserved_bytes": MEMORY_RESERVED_BYTES,
            "memory_total_bytes": MEMORY_TOTAL_BYTES,
            "power_watts": power,
            "power_limit_watts": POWER_LIMIT_W,
            "energy_joules_total": state.energy_j,
            "temperature_celsius": round(state.temperature_c, 1),
        }
        # the scenario's processes share the GPU's work and memory evenly, in the
        # default compute mode without MPS, as NVML would list them
        pids = sorted({e.pid for e in events if e.fault == "process"})
        share = 1.0 / len(pids) if pids else 0.0
        tenants = {
            pid: ProcessUse(values["memory_used_bytes"] * share, busy * share) for pid in pids
        }
        return GpuReading(
            index=index,
            uuid=self._devices[index].uuid,
            values=values,
            clock_event_reasons=decode_clock_event_reasons(encode_clock_event_reasons(reasons)),
            xid_errors_total=dict(state.xids),
            ecc_errors_total=dict(state.ecc),
            compute_mode="default",
            tenants=tenants,
            mps_processes=0,
            process_sm={pid: use.sm_utilization_ratio or 0.0 for pid, use in tenants.items()},
        )

    @staticmethod
    def _activity(state: _GpuState, now: float) -> tuple[float, float]:
        """Busy fraction over the trailing window, and the busy-time-weighted batch fill."""
        window_start = now - ACTIVITY_WINDOW_S
        while state.busy and state.busy[0][1] <= window_start:
            state.busy.popleft()
        busy_s = weighted = 0.0
        for start, end, fill in state.busy:
            overlap = max(0.0, min(end, now) - max(start, window_start))
            busy_s += overlap
            weighted += overlap * fill
        if busy_s == 0.0:
            return 0.0, 0.0
        return min(1.0, busy_s / ACTIVITY_WINDOW_S), weighted / busy_s

    @staticmethod
    def _advance_pcie(state: _GpuState, events: list[ScenarioEvent], dt: float) -> None:
        saturated = {e.direction for e in events if e.fault == "pcie_saturation"}
        rx_rate = tx_rate = PCIE_IDLE_BYTES_PER_S
        if saturated & {"rx", "both"}:
            rx_rate = PCIE_GEN5_X16_BYTES_PER_S * 0.97
        if saturated & {"tx", "both"}:
            tx_rate = PCIE_GEN5_X16_BYTES_PER_S * 0.97
        state.pcie_rx += rx_rate * dt
        state.pcie_tx += tx_rate * dt

    def _count_errors(
        self, index: int, state: _GpuState, t_prev: float, t: float, *, first: bool
    ) -> None:
        """Add the XIDs and ECC errors of events dated since the last poll."""
        for event in self._scenario.events:
            if event.fault not in ("xid", "ecc") or (event.gpu is not None and event.gpu != index):
                continue
            if not ((first or t_prev < event.at_s) and event.at_s <= t):
                continue
            if event.fault == "ecc":
                state.ecc[event.type] += event.count
                continue
            state.xids[event.xid] = state.xids.get(event.xid, 0) + event.count
            if event.xid in ECC_XIDS:
                state.ecc["volatile_uncorrected"] += event.count


def _without(reading: GpuReading, hidden: set[str]) -> GpuReading:
    """``reading`` without the metrics a scenario declares NotSupported."""
    return dataclasses.replace(
        reading,
        values={name: value for name, value in reading.values.items() if name not in hidden},
        clock_event_reasons=None
        if "clock_event_reasons" in hidden
        else reading.clock_event_reasons,
        ecc_errors_total=None if "ecc_errors_total" in hidden else reading.ecc_errors_total,
    )
