"""Reads one GPU through NVML into a ``GpuReading``.

Metrics come in groups (one NVML call or a few); a group the device does not give
(NotSupported, NoPermission, FunctionNotFound) is remembered with the reason and
not asked again, so it stays absent and ``gpuscope doctor`` can say why. GpuIsLost
and driver errors propagate as ``GpuLostError`` / ``NvmlDriverError``.

Where a driver or pynvml release lacks the preferred call, an older one stands in and
``notes`` (or, for what is then missing, ``unsupported``) says so:

* memory: ``nvmlDeviceGetMemoryInfo_v2`` (pynvml's ``version=nvmlMemory_v2``, R510+)
  gives used and reserved apart; v1 counts the driver's reserved memory (about 0.5 GiB
  on an idle H100) as used, so with v1 ``memory_reserved`` is absent.
* clock event reasons: ``nvmlDeviceGetCurrentClocksEventReasons`` (R535+), else
  ``nvmlDeviceGetCurrentClocksThrottleReasons``, its older name with the same bits.
* PCIe bytes: see ``pcie``.
* a MIG instance's GPM: ``nvmlGpmMigSampleGet`` on the parent's handle with its GPU
  instance id; without it (pynvml or driver), or where the parent has no GPM, absent
  with the reason (the parent's series hold it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from gpuscope.exporter.gpu.clock_reasons import decode_clock_event_reasons
from gpuscope.exporter.gpu.numa import locality, read_allowed
from gpuscope.exporter.gpu.nvml.errors import (
    GpuLostError,
    NvmlDriverError,
    NvmlErrorKind,
    classify,
    unsupported_reason,
)
from gpuscope.exporter.gpu.nvml.gpm import GpmSampler, gpm_supported
from gpuscope.exporter.gpu.nvml.nvlink import read_nvlink
from gpuscope.exporter.gpu.nvml.pcie import PcieByteCounter
from gpuscope.exporter.gpu.nvml.processes import DeviceProcessLister
from gpuscope.exporter.gpu.processes import PROC
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, ProcessUse

MHZ = 1e6

# nvmlComputeMode_t (nvml.h): NVML_COMPUTEMODE_DEFAULT 0, EXCLUSIVE_THREAD 1 (deprecated),
# PROHIBITED 2, EXCLUSIVE_PROCESS 3
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
}

Reader = Callable[[Any, Any], dict[str, Any]]


def _ecc(nvml: Any, h: Any) -> dict[str, Any]:
    counts = {}
    for scope, counter in (
        ("volatile", nvml.NVML_VOLATILE_ECC),
        ("aggregate", nvml.NVML_AGGREGATE_ECC),
    ):
        for kind, error in (
            ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            counts[f"{scope}_{kind}"] = int(nvml.nvmlDeviceGetTotalEccErrors(h, error, counter))
    return {"ecc_errors_total": counts}


CLOCK_EVENTS = "nvmlDeviceGetCurrentClocksEventReasons"
CLOCK_THROTTLE = "nvmlDeviceGetCurrentClocksThrottleReasons"  # before R535; same bits
MIG_GPM = "nvmlGpmMigSampleGet"  # a GPU instance's GPM sample, on the parent's handle


# group -> reader(nvml, handle); units converted to base units here
READERS: dict[str, Reader] = {
    "sm_clock": lambda n, h: {"sm_clock_hz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) * MHZ},
    "sm_clock_target": lambda n, h: {
        "sm_clock_target_hz": n.nvmlDeviceGetClock(
            h, n.NVML_CLOCK_SM, getattr(n, "NVML_CLOCK_ID_APP_CLOCK_TARGET", 1)
        )
        * MHZ
    },
    "sm_clock_max": lambda n, h: {
        "sm_clock_max_hz": n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM) * MHZ
    },
    "memory_clock": lambda n, h: {
        "memory_clock_hz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM) * MHZ
    },
    "memory_clock_max": lambda n, h: {
        "memory_clock_max_hz": n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM) * MHZ
    },
    "utilization": lambda n, h: {
        "utilization_ratio": n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
    },
    "power": lambda n, h: {"power_watts": n.nvmlDeviceGetPowerUsage(h) / 1000.0},
    "power_limit": lambda n, h: {
        "power_limit_watts": n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
    },
    "energy": lambda n, h: {
        "energy_joules_total": n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
    },
    "temperature": lambda n, h: {
        "temperature_celsius": float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
    },
    "pcie_link_generation": lambda n, h: {
        "pcie_link_generation": int(n.nvmlDeviceGetCurrPcieLinkGeneration(h))
    },
    "pcie_link_width": lambda n, h: {"pcie_link_width": int(n.nvmlDeviceGetCurrPcieLinkWidth(h))},
    "ecc_errors": _ecc,
    "nvlink": read_nvlink,
}


def _merge(values: dict[str, Any], reader: Reader, nvml: Any, handle: Any) -> None:
    values.update(reader(nvml, handle))


class NvmlDeviceReader:
    """One GPU's handle and what is known about its support; not thread-safe (poller only)."""

    def __init__(
        self, nvml: Any, device: GpuDevice, handle: Any, *, parent: NvmlDeviceReader | None = None
    ) -> None:
        self._nvml = nvml
        self.device = device
        self.handle = handle
        self.unsupported: dict[str, str] = {}  # metric group -> why it is absent
        self.notes: dict[str, str] = {}  # metric group -> how it is obtained, when unusual
        self._parent_uuid = None if parent is None else parent.device.uuid
        self._gpm_note: str | None = None  # how GPM is read, when not the device's own
        if parent is None:
            self.architecture = self._architecture()
            self._gpm = self._open_gpm()
        else:
            # a MIG instance: the PCIe link is its parent's; GPM is its GPU instance's
            # where the driver samples one (nvmlGpmMigSampleGet), else the parent's
            self.architecture = parent.architecture
            self.unsupported["pcie_bytes"] = (
                f"a MIG instance: the parent GPU's series ({parent.device.uuid}) hold it"
            )
            self._gpm = self._open_mig_gpm(parent)
        self._pcie = PcieByteCounter(nvml, handle, self._gpm if parent is None else None)
        self._utilization_seen = 0  # µs timestamp of the last per-process sample read
        self._placed_listing: object = None  # the listing _locality was read for
        self._locality: dict[int, str] = {}  # pid -> numa.Locality of that listing
        for group, function in (
            ("compute_mode", "nvmlDeviceGetComputeMode"),
            ("process_utilization", "nvmlDeviceGetProcessUtilization"),
            ("sm_clock_target", "nvmlDeviceGetClock"),
        ):
            if not hasattr(nvml, function):
                self.unsupported[group] = f"this pynvml has no {function}"
        self._memory_v2 = hasattr(nvml, "nvmlMemory_v2")
        if not self._memory_v2:
            self._v1_memory("this pynvml has no nvmlMemory_v2 (nvidia-ml-py too old)")
        self._clock_reasons = [
            name for name in (CLOCK_EVENTS, CLOCK_THROTTLE) if hasattr(nvml, name)
        ]
        # for the process join; asks NVML nothing until the first listing
        self.processes = DeviceProcessLister(
            nvml,
            handle,
            device=f"GPU {device.label} ({device.name}, {self.architecture})",
            driver=device.driver_version or "unknown",
        )

    def read(self, now: float, xids: Mapping[int, int], xid_supported: bool) -> GpuReading:
        values: dict[str, Any] = {}
        for group, reader in READERS.items():
            if group not in self.unsupported:
                self._attempt(
                    group, functools.partial(_merge, values, reader, self._nvml, self.handle)
                )
        if "memory" not in self.unsupported:
            self._attempt("memory", lambda: values.update(self._memory()))
        if "clock_event_reasons" not in self.unsupported:
            self._attempt("clock_event_reasons", lambda: values.update(self._clock_events()))
        gpm = self._gpm
        if gpm is not None and "gpm" not in self.unsupported:  # before PCIe: it may feed it
            self._attempt("gpm", lambda: values.update(self._gpm_values(gpm, now)))
        if "pcie_bytes" not in self.unsupported:
            self._attempt("pcie_bytes", lambda: values.update(self._pcie_values()))
        if "compute_mode" not in self.unsupported:
            self._attempt("compute_mode", lambda: values.update(self._compute_mode()))
        sm: dict[int, float] | None = None
        if "process_utilization" not in self.unsupported:
            self._attempt("process_utilization", lambda: values.update(sm=self._process_sm()))
            sm = values.pop("sm", None)
        return GpuReading(
            index=self.device.index,
            uuid=self.device.uuid,
            mig_device=None if self.device.mig is None else self.device.mig.device_index,
            clock_event_reasons=values.pop("clock_event_reasons", None),
            ecc_errors_total=values.pop("ecc_errors_total", None),
            values=values,
            xid_errors_total=dict(xids),
            xid_supported=xid_supported,
            compute_mode=values.pop("compute_mode", None),
            tenants=self._tenants(sm),
            process_sm=sm,
            mps_processes=self.processes.mps,
        )

    def _compute_mode(self) -> dict[str, str]:
        code = int(self._nvml.nvmlDeviceGetComputeMode(self.handle))
        return {"compute_mode": COMPUTE_MODES.get(code, f"mode_{code}")}

    def _process_sm(self) -> dict[int, float]:
        """pid -> SM utilisation since the last call, of the processes NVML sampled."""
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(self.handle, self._utilization_seen)
        except nvml.NVMLError as exc:
            if isinstance(exc, getattr(nvml, "NVMLError_NotFound", ())):
                return {}  # nvml.h: no sample since the last: no process ran a kernel
            raise
        latest: dict[int, tuple[int, float]] = {}
        for sample in samples:
            stamp = int(sample.timeStamp)
            self._utilization_seen = max(self._utilization_seen, stamp)
            if int(sample.pid) not in latest or stamp >= latest[int(sample.pid)][0]:
                latest[int(sample.pid)] = (stamp, int(sample.smUtil) / 100.0)
        return {pid: ratio for pid, (_, ratio) in latest.items()}

    def _tenants(self, sm: Mapping[int, float] | None) -> dict[int, ProcessUse] | None:
        """The processes on the GPU at the last listing, with this poll's SM use and their
        NUMA locality; None before the first listing unless NVML's utilisation answered."""
        memory = self.processes.memory
        if memory is None and sm is None:
            return None
        if memory is not self._placed_listing:  # a new listing: read /proc once for it
            self._placed_listing = memory
            self._locality = self._localities(memory or {})
        pids = set(memory or {}) | set(sm or {})
        return {
            pid: ProcessUse(
                memory_used_bytes=(memory or {}).get(pid),
                sm_utilization_ratio=None if sm is None else sm.get(pid, 0.0),
                numa_locality=self._locality.get(pid),
            )
            for pid in sorted(pids)
        }

    def _localities(self, pids: Mapping[int, object]) -> dict[int, str]:
        affinity = self.device.affinity
        if affinity is None:
            return {}
        found = {}
        for pid in pids:
            allowed = read_allowed(PROC, pid)
            where = None if allowed is None else locality(allowed, affinity)
            if where is not None:
                found[pid] = where.value
        return found

    def close(self) -> None:
        self._pcie.close()
        if self._gpm is not None:
            self._gpm.close()

    def _memory(self) -> dict[str, float]:
        nvml, h = self._nvml, self.handle
        if self._memory_v2:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
            except nvml.NVMLError as exc:
                mismatch = getattr(nvml, "NVMLError_ArgumentVersionMismatch", ())
                if classify(nvml, exc) is not NvmlErrorKind.UNSUPPORTED and not isinstance(
                    exc, mismatch
                ):
                    raise
                self._v1_memory(f"nvmlDeviceGetMemoryInfo_v2 answers {exc}")
            else:
                return {
                    "memory_used_bytes": float(info.used),
                    "memory_reserved_bytes": float(info.reserved),
                    "memory_total_bytes": float(info.total),
                }
        info = nvml.nvmlDeviceGetMemoryInfo(h)
        return {"memory_used_bytes": float(info.used), "memory_total_bytes": float(info.total)}

    def _v1_memory(self, why: str) -> None:
        self._memory_v2 = False
        driver = self.device.driver_version or "unknown"
        self.unsupported["memory_reserved"] = (
            f"driver {driver}: {why}; memory v1 gives no reserved figure (v2 needs R510+)"
        )
        self.notes["memory"] = (
            "memory v1 (nvmlDeviceGetMemoryInfo): used includes the driver's reserved memory"
        )

    def _clock_events(self) -> dict[str, Any]:
        nvml = self._nvml
        while self._clock_reasons:
            try:
                mask = int(getattr(nvml, self._clock_reasons[0])(self.handle))
            except nvml.NVMLError as exc:
                missing = getattr(nvml, "NVMLError_FunctionNotFound", ())
                if not isinstance(exc, missing) or len(self._clock_reasons) == 1:
                    raise
                self._clock_reasons.pop(0)  # a driver before R535: the older name
                continue
            if self._clock_reasons[0] == CLOCK_THROTTLE:
                self.notes["clock_event_reasons"] = (
                    f"through {CLOCK_THROTTLE} (the name before R535, same bits)"
                )
            return {"clock_event_reasons": decode_clock_event_reasons(mask)}
        self.unsupported["clock_event_reasons"] = (
            f"this pynvml has neither {CLOCK_EVENTS} nor {CLOCK_THROTTLE}"
        )
        return {}

    def _gpm_values(self, gpm: GpmSampler, now: float) -> dict[str, float]:
        values = gpm.read(now)
        notes = [] if self._gpm_note is None else [self._gpm_note]
        if gpm.nan:
            notes.append(f"GPM answered NaN for {', '.join(sorted(gpm.nan))}: left out")
        if notes:
            self.notes["gpm"] = "; ".join(notes)
        else:
            self.notes.pop("gpm", None)
        return values

    def _pcie_values(self) -> dict[str, float]:
        counters = self._pcie.read(gpm_usable="gpm" not in self.unsupported)
        note = self._pcie.note
        if note is not None:
            self.notes["pcie_bytes"] = note
        if counters is None:
            return {}
        tx, rx = counters
        return {"pcie_transmit_bytes_total": tx, "pcie_receive_bytes_total": rx}

    def _attempt(self, group: str, action: Callable[[], object]) -> None:
        try:
            action()
        except self._nvml.NVMLError as exc:
            self._handle_error(group, exc)

    def _handle_error(self, group: str, exc: BaseException) -> None:
        kind = classify(self._nvml, exc)
        if kind is NvmlErrorKind.UNSUPPORTED:
            self.unsupported[group] = unsupported_reason(
                self._nvml,
                exc,
                device=f"{self.device.name} ({self.architecture})",
                driver=self.device.driver_version or "unknown",
            )
            if group == "gpm" and self._parent_uuid is not None:
                self.unsupported[group] += f" ({MIG_GPM}); {self._parents(self._parent_uuid)}"
                self.notes.pop("gpm", None)
        elif kind is NvmlErrorKind.GPU_LOST:
            raise GpuLostError(f"GPU {self.device.label} ({self.device.uuid}) is lost") from exc
        elif kind is NvmlErrorKind.DRIVER:
            raise NvmlDriverError(f"NVML failed reading GPU {self.device.label}: {exc}") from exc
        # any other error is transient: the group is absent this round only

    def _architecture(self) -> str:
        try:
            code = int(self._nvml.nvmlDeviceGetArchitecture(self.handle))
        except self._nvml.NVMLError:
            return "unknown architecture"
        return ARCHITECTURES.get(code, f"architecture {code}")

    @property
    def has_gpm(self) -> bool:
        """Whether this GPU's GPM samples are read (a MIG instance's parent is asked)."""
        return self._gpm is not None

    @staticmethod
    def _parents(uuid: str) -> str:
        return f"the parent GPU's series ({uuid}) hold it"

    def _open_mig_gpm(self, parent: NvmlDeviceReader) -> GpmSampler | None:
        """A MIG instance's GPM: its GPU instance's samples on the parent's handle, where
        the parent has GPM, pynvml has the call and NVML gave the GPU instance id."""
        nvml = self._nvml
        mig = self.device.mig
        gpu_instance = None if mig is None else mig.gpu_instance_id
        parents = self._parents(parent.device.uuid)
        if not parent.has_gpm:
            why = parent.unsupported.get("gpm", "the parent GPU has no GPM")
            self.unsupported["gpm"] = f"the parent GPU has no GPM ({why})"
            return None
        if not hasattr(nvml, MIG_GPM):
            self.unsupported["gpm"] = f"this pynvml has no {MIG_GPM}; {parents}"
            return None
        if gpu_instance is None:
            self.unsupported["gpm"] = f"NVML gave no GPU instance id for it; {parents}"
            return None
        try:
            sampler = GpmSampler(nvml, parent.handle, gpu_instance_id=gpu_instance)
        except nvml.NVMLError as exc:
            self._handle_error("gpm", exc)
            return None
        self._gpm_note = (
            f"GPU instance {gpu_instance}'s counters ({MIG_GPM}), the same for every "
            "compute instance in it"
        )
        return sampler

    def _open_gpm(self) -> GpmSampler | None:
        nvml = self._nvml
        try:
            supported = gpm_supported(nvml, self.handle)
            sampler = GpmSampler(nvml, self.handle) if supported else None
        except nvml.NVMLError as exc:
            self._handle_error("gpm", exc)
            return None
        if sampler is None:
            self.unsupported["gpm"] = (
                f"GPM (SM occupancy, SM/tensor/DRAM activity) needs Hopper or newer without "
                f"MIG; this GPU is {self.architecture}"
            )
        return sampler
