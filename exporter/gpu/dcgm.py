"""The DCGM GPU source, through the Python bindings that ship with the DCGM OS package.

There is no PyPI package: the bindings (``pydcgm``, ``dcgm_structs``) are found at
run time in the package's install directory. Fields are keyed by numeric id, never
by name: DCGM 4.6 renamed the profiling fields, the ids stayed. The narrow surface
used here (``DcgmHandle``, ``GetSystem().discovery``, ``GetGroupWithGpuIds``,
``DcgmFieldGroup``, ``samples.WatchFields`` / ``GetLatest``) is tested through a fake
only; docs/gpu.md lists what remains unverified on a real host engine.

DCGM's Python API has no plain per-GPU process list, so ``processes()`` (the process
join) asks NVML for it where pynvml is installed, and otherwise says not supported.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscope.exporter.gpu.clock_reasons import decode_clock_event_reasons
from gpuscope.exporter.gpu.nvml.processes import NvmlProcessSession
from gpuscope.exporter.gpu.nvml.source import load_pynvml
from gpuscope.exporter.gpu.processes import ProcessListing
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, GpuSourceKind

BINDING_DIRS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
)
MIB = 2**20

# field id -> (``field`` of its row in gpu.definitions, scale to base units)
SCALAR_FIELDS: dict[int, tuple[str, float]] = {
    100: ("sm_clock_hz", 1e6),  # DCGM_FI_DEV_SM_CLOCK, MHz
    101: ("memory_clock_hz", 1e6),  # DCGM_FI_DEV_MEM_CLOCK
    113: ("sm_clock_max_hz", 1e6),  # DCGM_FI_DEV_MAX_SM_CLOCK
    114: ("memory_clock_max_hz", 1e6),  # DCGM_FI_DEV_MAX_MEM_CLOCK
    150: ("temperature_celsius", 1.0),  # DCGM_FI_DEV_GPU_TEMP
    155: ("power_watts", 1.0),  # DCGM_FI_DEV_POWER_USAGE, W
    156: ("energy_joules_total", 1e-3),  # DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ
    164: ("power_limit_watts", 1.0),  # DCGM_FI_DEV_ENFORCED_POWER_LIMIT, W
    203: ("utilization_ratio", 0.01),  # DCGM_FI_DEV_GPU_UTIL, %
    237: ("pcie_link_generation", 1.0),  # DCGM_FI_DEV_PCIE_LINK_GEN
    238: ("pcie_link_width", 1.0),  # DCGM_FI_DEV_PCIE_LINK_WIDTH
    250: ("memory_total_bytes", MIB),  # DCGM_FI_DEV_FB_TOTAL, MiB
    252: ("memory_used_bytes", MIB),  # DCGM_FI_DEV_FB_USED, MiB
    1002: ("sm_active_ratio", 1.0),  # DCGM_FI_PROF_SM_ACTIVE, 0-1
    1003: ("sm_occupancy_ratio", 1.0),  # DCGM_FI_PROF_SM_OCCUPANCY
    1004: ("tensor_active_ratio", 1.0),  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    1005: ("dram_active_ratio", 1.0),  # DCGM_FI_PROF_DRAM_ACTIVE
}
CLOCK_EVENT_REASONS_FIELD = 112
XID_FIELD = 230  # the last XID seen: counted here by its timestamp changing
ECC_FIELDS = {
    310: "volatile_corrected",
    311: "volatile_uncorrected",
    312: "aggregate_corrected",
    313: "aggregate_uncorrected",
}
PCIE_RATE_FIELDS = {1009: 0, 1010: 1}  # DCGM_FI_PROF_PCIE_TX/RX_BYTES, bytes per second
FIELD_IDS = (*SCALAR_FIELDS, CLOCK_EVENT_REASONS_FIELD, XID_FIELD, *ECC_FIELDS, *PCIE_RATE_FIELDS)


class DcgmUnavailable(RuntimeError):
    """No bindings, no host engine, or DCGM refused the watch."""


@dataclass(frozen=True)
class DcgmBindings:
    pydcgm: Any
    dcgm_structs: Any


def load_dcgm_bindings() -> DcgmBindings:
    """Import the bindings from the DCGM package's install directory (or sys.path)."""
    for directory in BINDING_DIRS:
        if os.path.isdir(directory) and directory not in sys.path:
            sys.path.append(directory)
    try:
        return DcgmBindings(
            importlib.import_module("pydcgm"), importlib.import_module("dcgm_structs")
        )
    except ImportError as exc:
        raise DcgmUnavailable(
            f"DCGM Python bindings not found (looked in {', '.join(BINDING_DIRS)}): {exc}"
        ) from exc


@dataclass
class _GpuTotals:
    pcie: list[float]
    rate_at: float | None = None
    xids: dict[int, int] | None = None
    xid_ts: int | None = None


class DcgmSource:
    name: str = GpuSourceKind.DCGM

    def __init__(
        self,
        bindings: DcgmBindings | None = None,
        *,
        host: str = "127.0.0.1",
        update_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        load_nvml: Callable[[], Any] = load_pynvml,
    ) -> None:
        b = load_dcgm_bindings() if bindings is None else bindings
        self._clock = clock
        name = f"gpuscope_{os.getpid()}"
        try:
            self._handle = b.pydcgm.DcgmHandle(
                ipAddress=host, opMode=b.dcgm_structs.DCGM_OPERATION_MODE_AUTO
            )
            system = self._handle.GetSystem()
            gpu_ids = list(system.discovery.GetAllSupportedGpuIds())
            self._devices = tuple(
                self._device(gpu_id, system.discovery.GetGpuAttributes(gpu_id))
                for gpu_id in gpu_ids
            )
            self._group = system.GetGroupWithGpuIds(name, gpu_ids)
            self._fields = b.pydcgm.DcgmFieldGroup(self._handle, name, list(FIELD_IDS))
            self._group.samples.WatchFields(self._fields, int(update_interval_s * 1e6), 3600.0, 0)
        except b.dcgm_structs.DCGMError as exc:
            raise DcgmUnavailable(f"DCGM host engine at {host}: {exc}") from exc
        self._totals = {d.index: _GpuTotals(pcie=[0.0, 0.0]) for d in self._devices}
        # opened at the first listing, so that a DCGM source costs no NVML until then
        self._processes = NvmlProcessSession([d.uuid for d in self._devices], load_nvml)

    @staticmethod
    def _device(gpu_id: int, attributes: Any) -> GpuDevice:
        ids = attributes.identifiers
        return GpuDevice(
            index=gpu_id,  # DCGM's gpuId; equals the NVML index unless GPUs are hidden from DCGM
            uuid=str(ids.uuid),
            name=str(ids.deviceName),
            pci_bus_id=str(ids.pciBusId),
            driver_version=str(ids.driverVersion),
        )

    def devices(self) -> Sequence[GpuDevice]:
        return self._devices

    def sample(self) -> Sequence[GpuReading]:
        latest = self._group.samples.GetLatest(self._fields).values
        now = self._clock()
        return [self._reading(d, latest.get(d.index, {}), now) for d in self._devices]

    def processes(self) -> ProcessListing:
        """Each GPU's processes through NVML (``ListsProcesses``; poller thread)."""
        return self._processes.listing()

    def close(self) -> None:
        """The handle disconnects when garbage-collected (pydcgm's own design)."""
        self._processes.close()

    def _reading(self, device: GpuDevice, fields: Any, now: float) -> GpuReading:
        values = {fid: v[-1] for fid, v in fields.items() if v and not v[-1].isBlank}
        if not values:  # nothing but blanks: DCGM lost the GPU
            return GpuReading(index=device.index, uuid=device.uuid, up=False)
        reading: dict[str, float] = {}
        for field_id, (name, scale) in SCALAR_FIELDS.items():
            if field_id in values:
                number = float(values[field_id].value) * scale
                reading[name] = int(number) if name.startswith("pcie_link") else number
        reasons = None
        if CLOCK_EVENT_REASONS_FIELD in values:
            reasons = decode_clock_event_reasons(int(values[CLOCK_EVENT_REASONS_FIELD].value))
        ecc = {kind: int(values[f].value) for f, kind in ECC_FIELDS.items() if f in values}
        totals = self._totals[device.index]
        self._integrate_pcie(totals, values, now, reading)
        return GpuReading(
            index=device.index,
            uuid=device.uuid,
            values=reading,
            clock_event_reasons=reasons,
            ecc_errors_total=ecc or None,
            xid_errors_total=self._count_xid(totals, values.get(XID_FIELD)),
        )

    @staticmethod
    def _integrate_pcie(
        totals: _GpuTotals, values: dict[int, Any], now: float, out: dict[str, float]
    ) -> None:
        if not all(f in values for f in PCIE_RATE_FIELDS):
            return
        elapsed = 0.0 if totals.rate_at is None else max(0.0, now - totals.rate_at)
        totals.rate_at = now
        for field_id, slot in PCIE_RATE_FIELDS.items():
            totals.pcie[slot] += float(values[field_id].value) * elapsed
        out["pcie_transmit_bytes_total"], out["pcie_receive_bytes_total"] = totals.pcie

    @staticmethod
    def _count_xid(totals: _GpuTotals, value: Any) -> dict[int, int]:
        if totals.xids is None:  # the first value seen predates us: a baseline, not an error
            totals.xids = {}
            totals.xid_ts = None if value is None else int(value.ts)
            return {}
        if value is not None and int(value.ts) != totals.xid_ts and int(value.value) > 0:
            totals.xid_ts = int(value.ts)
            totals.xids[int(value.value)] = totals.xids.get(int(value.value), 0) + 1
        return dict(totals.xids)
