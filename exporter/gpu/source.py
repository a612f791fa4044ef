"""The narrow interface every GPU source implements, and the readings it returns.

A source (NVML, DCGM, simulated) lists its devices and takes one sample of all of
them at a time. A reading holds ``None`` for every metric the device cannot give
(NotSupported, NoPermission): such a metric is absent from ``/metrics``, never 0.
Units are base units: hertz, bytes, watts, joules, ratios in 0-1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class GpuSourceKind(StrEnum):
    """The values of ``--gpu-source``: a backend, ``auto`` (DCGM, else NVML, else none) or none."""

    AUTO = "auto"
    NVML = "nvml"
    DCGM = "dcgm"
    SIMULATED = "simulated"
    NONE = "none"


@dataclass(frozen=True)
class GpuDevice:
    """What identifies a GPU; descriptive fields end up on ``gpuscope_gpu_info`` only."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    numa_node: int | None = None
    driver_version: str | None = None


@dataclass(frozen=True)
class GpuReading:
    """One device's readings at one instant. ``up=False``: the GPU is lost."""

    index: int
    uuid: str
    up: bool = True
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    memory_clock_hz: float | None = None
    memory_clock_max_hz: float | None = None
    # reason (e.g. "sw_power_cap", "hw_thermal_slowdown", "gpu_idle") -> active now
    clock_event_reasons: Mapping[str, bool] | None = None
    utilization_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    sm_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    # monotonic counters since an arbitrary origin (driver load, source start)
    pcie_transmit_bytes_total: float | None = None
    pcie_receive_bytes_total: float | None = None
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules_total: float | None = None
    temperature_celsius: float | None = None
    # xid -> errors seen since the source started; type ("volatile_corrected", ...) -> count
    xid_errors_total: Mapping[int, int] = field(default_factory=dict)
    # False where the source cannot watch this GPU's XIDs (NVML refused the event
    # registration): its XID totals are then absent, not 0.
    xid_supported: bool = True
    ecc_errors_total: Mapping[str, int] | None = None


class GpuSource(Protocol):
    """A backend that can enumerate GPUs and sample them.

    ``sample()`` is called from one background thread at the poll interval, never
    from a scrape. It must not raise for a single failing GPU (that GPU's reading
    gets ``up=False``); an exception from it means the whole source failed this
    round and is counted as a collector failure.
    """

    name: str  # "nvml", "dcgm", "simulated": the ``collector`` label

    def devices(self) -> Sequence[GpuDevice]: ...

    def sample(self) -> Sequence[GpuReading]: ...

    def close(self) -> None: ...


class ComputeObserver(Protocol):
    """Told of every batch span the exporter ingests. The simulated source is one, so
    that simulated occupancy follows the real workload (bigger batches, busier GPU).
    """

    def observe_compute(self, uuid: str, seconds: float, batch_size: int, max_size: int) -> None:
        """A batch of ``batch_size`` (of at most ``max_size``) ran ``seconds`` on ``uuid``."""
