"""A fake of the ``pynvml`` module surface that gpuscope uses, for machines without a GPU.

Everything that is not hardware is the real thing: the constants, the ``NVMLError``
classes (``NVMLError_NotSupported`` ...), the ctypes structs (``c_nvmlFieldValue_t``,
``c_nvmlGpmMetricsGet_t``, ``c_nvmlEventData_t``) and the device handles (real
``c_nvmlDevice_t`` pointers) come from the installed ``pynvml``. Only the functions
are fake, with the real names and parameters (a test checks that), raising the
errors real NVML raises: Uninitialized before ``nvmlInit``, GpuIsLost from a lost
GPU, Timeout from an idle event set, InvalidArgument for misused GPM samples,
NoPermission for the process list of a MIG GPU without root, FunctionNotFound (and,
from the unversioned name, pynvml's ``NVMLLibraryMismatchError``) for a process-list
version the driver lacks. Process lists come as pynvml returns them: ``pid`` and
``usedGpuMemory`` (None where NVML has no value) of a ``c_nvmlProcessInfo_v3_t``.

Event sets are separate objects, as in NVML: an XID goes to every set its GPU is
registered in, and a set in which a GPU that fell off the bus was registered answers
GPU_IS_LOST to every later wait. Faults: ``hang`` (a named call blocks until released),
``event_set_error`` (nvmlEventSetCreate fails), ``wait_v2_missing`` (a driver without
the C ``nvmlEventSetWait_v2``: pynvml's wrapper raises FunctionNotFound and the C
``nvmlEventSetWait`` is there through ``_nvmlGetFunctionPointer``), a MIG GPU that
refuses XID registration to a non-root user (NoPermission), and per-GPU ``errors``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml as real
import pytest

HOPPER, AMPERE = 9, 7
GPM_PCIE_TX, GPM_PCIE_RX = 20, 21  # nvml.h NVML_GPM_METRIC_PCIE_TX_PER_SEC / RX (MiB/s)


class _DriverRecord24(ctypes.Structure):
    """nvmlProcessInfo_v2_t as a driver writes it (nvml.h)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _DriverRecord32(ctypes.Structure):
    """The record with ``usedGpuCcProtectedMemory`` that some drivers write for _v3."""

    _fields_ = [*_DriverRecord24._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


_DRIVER_RECORDS: dict[int, type[ctypes.Structure]] = {24: _DriverRecord24, 32: _DriverRecord32}


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:18:00.0"
    numa_node: int = 0
    architecture: int = HOPPER
    sm_mhz: int = 1980
    sm_max_mhz: int = 1980
    mem_mhz: int = 2619
    mem_max_mhz: int = 2619
    clock_reasons: int = 0
    utilization_percent: int = 40
    memory_used: int = 10 * 2**30
    memory_total: int = 80 * 2**30
    memory_reserved: int = 512 * 2**20  # the driver's own, beside what processes allocated
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    energy_mj: int = 1_000_000
    temperature_c: int = 55
    pcie_tx_bytes: int = 1_000
    pcie_rx_bytes: int = 5_000
    pcie_fields_supported: bool = True
    pcie_field_return: int | None = None  # an NVML_ERROR_* in each field entry's nvmlReturn
    pcie_throughput_kib_s: tuple[int, int] = (100, 400)  # (tx, rx)
    link_generation: int = 5
    link_width: int = 16
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter) -> n
    gpm_supported: bool = True
    # NVML_GPM_METRIC_* id -> percent; a missing id answers NotSupported for that metric
    gpm_percent: dict[int, float] = field(
        default_factory=lambda: {
            real.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0,
            real.NVML_GPM_METRIC_SM_UTIL: 80.0,
            real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 50.0,
            real.NVML_GPM_METRIC_DRAM_BW_UTIL: 25.0,
        }
    )
    # GPM's PCIe rates (tx, rx) in MiB/s; None: GPM answers NotSupported for them
    gpm_pcie_mib_s: tuple[float, float] | None = (100.0, 400.0)
    xid_events_supported: bool = True
    # (pid, used bytes; None: NVML_VALUE_NOT_AVAILABLE) as the process lists return them
    compute_processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig_mode: int = real.NVML_DEVICE_MIG_DISABLE
    compute_mode: int = real.NVML_COMPUTEMODE_DEFAULT
    nvlink_links: int = 18  # an H100 SXM's; 0: no NVLink (fields 91, 138/139 NotSupported)
    nvlink_kib: tuple[int, int] = (0, 0)  # fields 138/139: data sent, received (KiB)
    lost: bool = False
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML_ERROR_*


_COPIED_PREFIXES = (
    "NVML_",
    "NVMLError",
    "NVMLLibraryMismatchError",
    "nvmlClocksEventReason",
    "nvmlEventType",
    "nvmlMemory_v",
    "c_nvml",
)


class FakeNvml:
    """Stands in for the ``pynvml`` module: pass it as ``NvmlSource(nvml=...)``."""

    def __init__(
        self, gpus: list[FakeGpu], *, driver_version: str = "550.54.15", pynvml: Any = real
    ) -> None:
        # ``pynvml``: the module whose constants, errors and structs the fake hands out
        # (another release than the installed one: ``tests/exporter/gpu/test_gpu_pynvml_floor.py``);
        # a function that release lacks is absent here too.
        self._pynvml = pynvml
        self._absent = {
            name
            for name in dir(type(self))
            if name.startswith("nvml") and not hasattr(pynvml, name)
        }
        for name in dir(pynvml):
            if name.startswith(_COPIED_PREFIXES):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.driver_version = driver_version
        self.driver_error: int | None = None  # every call fails with this, init included
        self.refcount = 0
        self.calls: dict[str, int] = {}
        self._handles = [
            ctypes.cast(ctypes.c_void_p(0x1000 + 16 * i), self._pynvml.c_nvmlDevice_t)
            for i in range(64)
        ]
        self._gpm_buffers: dict[int, Any] = {}
        self._gpm_samples: dict[int, tuple[int, int]] = {}  # address -> (gpu index, sequence)
        self._gpm_sequence = 0
        self._sets: dict[int, set[int]] = {}  # event set address -> registered GPUs
        self._queues: dict[int, deque[tuple[int, int] | int]] = {}  # (gpu, xid) or an error
        self._broken: set[int] = set()  # sets that held a GPU that fell off the bus
        self._next_set = 0x9000
        self._event_cond = threading.Condition()
        self.event_set_error: int | None = None  # nvmlEventSetCreate answers this
        self.wait_v2_missing = False
        # function -> calls that pass before the next ones block until ``unhang()``
        self.hang_in: dict[str, int] = {}
        self.hanging = threading.Event()  # set while a call is blocked
        self._unhung = threading.Event()
        self.waits_started = 0
        self.xids_undelivered = 0
        self.privileged = False  # MIG GPUs list their processes to root only
        self.missing_functions: set[str] = set()  # an older driver: FunctionNotFound
        # bytes per process record the driver writes (None: as many as pynvml reads);
        # 32 under a pynvml that reads 24 is the stride mismatch of some releases
        self.driver_record_bytes: int | None = None
        self.throughput_threads: set[int] = set()  # threads that called GetPcieThroughput
        self.throughput_delay_s = 0.0  # how long nvmlDeviceGetPcieThroughput blocks

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "_absent"):
            raise AttributeError(f"this pynvml has no {name}")
        return object.__getattribute__(self, name)

    # --- test controls ----------------------------------------------------------

    def emit_xid(self, gpu: int, xid: int) -> None:
        """An XID on ``gpu``: queued in every set it is registered in (none: undelivered)."""
        with self._event_cond:
            queues = [self._queues[a] for a, gpus in self._sets.items() if gpu in gpus]
            for queue in queues:
                queue.append((gpu, xid))
            self.xids_undelivered += not queues
            self._event_cond.notify_all()

    def emit_wait_error(self, code: int) -> None:
        """The next wait on every set answers ``code``."""
        with self._event_cond:
            for queue in self._queues.values():
                queue.append(code)
            self._event_cond.notify_all()

    def wait_events_handled(self, timeout_s: float = 5.0) -> bool:
        """True once every emitted event was taken (or its set broke) and the watcher came
        back for more."""
        with self._event_cond:
            start = self.waits_started
            return self._event_cond.wait_for(
                lambda: self._pending() == 0 and self.waits_started > start, timeout=timeout_s
            )

    def _pending(self) -> int:
        return sum(len(q) for a, q in self._queues.items() if a not in self._broken)

    def unhang(self) -> None:
        """Let every hung call return (and later ones pass)."""
        self.hang_in.clear()
        self._unhung.set()

    def _maybe_hang(self, function: str) -> None:
        passes = self.hang_in.get(function)
        if passes is not None and self.calls.get(function, 0) > passes:
            self.hanging.set()
            self._unhung.wait()

    def event_sets(self) -> int:
        """Event sets created and not freed."""
        with self._event_cond:
            return len(self._sets)

    # --- helpers ------------------------------------------------------------------

    def _enter(self, function: str, handle: Any = None) -> FakeGpu | None:
        self.calls[function] = self.calls.get(function, 0) + 1
        self._maybe_hang(function)
        if self.driver_error is not None:
            raise self._pynvml.NVMLError(self.driver_error)
        if self.refcount == 0:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_UNINITIALIZED)
        if function in self.missing_functions:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if handle is None:
            return None
        gpu = self._gpu(handle)
        if gpu.lost:
            self._lose_registrations(self.gpus.index(gpu))
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.errors:
            raise self._pynvml.NVMLError(gpu.errors[function])
        return gpu

    def _lose_registrations(self, gpu: int) -> None:
        """A GPU that fell off the bus takes its registrations with it, and breaks every
        set it was in: each later wait on such a set answers GPU_IS_LOST."""
        with self._event_cond:
            for address, gpus in self._sets.items():
                if gpu in gpus:
                    gpus.discard(gpu)
                    self._broken.add(address)
            self._event_cond.notify_all()

    def _gpu(self, handle: Any) -> FakeGpu:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        for index, known in enumerate(self._handles[: len(self.gpus)]):
            if ctypes.cast(known, ctypes.c_void_p).value == address:
                return self.gpus[index]
        raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _device(self, function: str, handle: Any) -> FakeGpu:
        gpu = self._enter(function, handle)
        assert gpu is not None
        return gpu

    # --- the pynvml surface -------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        self._maybe_hang("nvmlInit")
        if self.driver_error is not None:
            raise self._pynvml.NVMLError(self.driver_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._enter("nvmlDeviceGetHandleByUUID")
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == wanted:
                if gpu.lost:
                    raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_GPU_IS_LOST)
                return self._handles[index]
        raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = self._pynvml.nvmlPciInfo_t()
        info.busId = self._device("nvmlDeviceGetPciInfo", handle).bus_id.encode()
        return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetNumaNodeId", handle).numa_node

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        return self._device("nvmlDeviceGetArchitecture", device).architecture

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        return gpu.sm_mhz if type == self._pynvml.NVML_CLOCK_SM else gpu.mem_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._device("nvmlDeviceGetMaxClockInfo", handle)
        return gpu.sm_max_mhz if type == self._pynvml.NVML_CLOCK_SM else gpu.mem_max_mhz

    def nvmlDeviceGetClock(self, handle: Any, type: int, id: int) -> int:
        # the application clock target: the default, the maximum (nvidia-smi -ac unset)
        gpu = self._device("nvmlDeviceGetClock", handle)
        return gpu.sm_max_mhz if type == self._pynvml.NVML_CLOCK_SM else gpu.mem_max_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        # the name before R535, same bits; later drivers keep it
        return self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        return self._pynvml.c_nvmlUtilization_t(gpu=gpu.utilization_percent, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        # pynvml calls the C symbol nvmlDeviceGetMemoryInfo_v2 when a version is given
        name = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        gpu = self._device(name, handle)
        m = self._pynvml
        if version:
            if version != m.nvmlMemory_v2:
                raise m.NVMLError(m.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            free = gpu.memory_total - gpu.memory_reserved - gpu.memory_used
            return m.c_nvmlMemory_v2_t(
                version=version,
                total=gpu.memory_total,
                reserved=gpu.memory_reserved,
                free=free,
                used=gpu.memory_used,
            )
        used = gpu.memory_used + gpu.memory_reserved  # v1 counts the reserved memory as used
        return m.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._device("nvmlDeviceGetTemperature", handle).temperature_c

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkGeneration", handle).link_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkWidth", handle).link_width

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        return self._device("nvmlDeviceGetTotalEccErrors", handle).ecc.get(
            (errorType, counterType), 0
        )

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int | tuple[int, int]]) -> Any:
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        values = (self._pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        # nvml.h NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES (older pynvml lacks the names)
        counters = {197: gpu.pcie_tx_bytes, 198: gpu.pcie_rx_bytes}
        # NVML_FI_DEV_NVLINK_LINK_COUNT, _THROUGHPUT_DATA_TX / _RX (all links)
        nvlink = {91: gpu.nvlink_links, 138: gpu.nvlink_kib[0], 139: gpu.nvlink_kib[1]}
        for slot, wanted in enumerate(fieldIds):
            # pynvml takes an id or an (id, scopeId) pair
            field_id, scope = wanted if isinstance(wanted, tuple) else (wanted, 0)
            values[slot].fieldId = field_id
            values[slot].scopeId = scope
            if field_id in counters and gpu.pcie_field_return is not None:
                values[slot].nvmlReturn = gpu.pcie_field_return
            elif field_id in counters and gpu.pcie_fields_supported:
                values[slot].valueType = self._pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[slot].value.ullVal = counters[field_id]
                values[slot].nvmlReturn = self._pynvml.NVML_SUCCESS
            elif field_id in nvlink and gpu.nvlink_links:
                values[slot].valueType = self._pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[slot].value.ullVal = nvlink[field_id]
                values[slot].nvmlReturn = self._pynvml.NVML_SUCCESS
            else:
                values[slot].nvmlReturn = self._pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu = self._device("nvmlDeviceGetPcieThroughput", device)
        self.throughput_threads.add(threading.get_ident())
        time.sleep(self.throughput_delay_s)  # timed: the driver samples for 20 ms per call
        tx, rx = gpu.pcie_throughput_kib_s
        return tx if counter == self._pynvml.NVML_PCIE_UTIL_TX_BYTES else rx

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        gpu = self._device("nvmlGpmQueryDeviceSupport", device)
        support = self._pynvml.c_nvmlGpmSupport_t()
        support.version = self._pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported and gpu.architecture >= HOPPER)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(64)
        sample = ctypes.cast(buffer, self._pynvml.c_nvmlGpmSample_t)
        self._gpm_buffers[ctypes.addressof(buffer)] = buffer
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        address = ctypes.cast(gpmSample, ctypes.c_void_p).value
        if self._gpm_buffers.pop(address or 0, None) is None:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_samples.pop(address or 0, None)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu = self._device("nvmlGpmSampleGet", device)
        address = ctypes.cast(gpmSample, ctypes.c_void_p).value or 0
        if address not in self._gpm_buffers:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_sequence += 1
        self._gpm_samples[address] = (self.gpus.index(gpu), self._gpm_sequence)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        first = self._gpm_samples.get(ctypes.cast(metricsGet.sample1, ctypes.c_void_p).value or 0)
        second = self._gpm_samples.get(ctypes.cast(metricsGet.sample2, ctypes.c_void_p).value or 0)
        if (
            metricsGet.version != self._pynvml.NVML_GPM_METRICS_GET_VERSION
            or first is None
            or second is None
            or first[0] != second[0]
            or second[1] <= first[1]
        ):
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[first[0]]
        if gpu.lost:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_GPU_IS_LOST)
        for slot in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[slot]
            value = gpu.gpm_percent.get(metric.metricId)
            if metric.metricId in (GPM_PCIE_TX, GPM_PCIE_RX) and gpu.gpm_pcie_mib_s is not None:
                value = gpu.gpm_pcie_mib_s[metric.metricId - GPM_PCIE_TX]
            metric.nvmlReturn = (
                self._pynvml.NVML_SUCCESS
                if value is not None
                else self._pynvml.NVML_ERROR_NOT_SUPPORTED
            )
            metric.value = 0.0 if value is None else value
        return metricsGet

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._device("nvmlDeviceGetMigMode", device)
        if gpu.architecture < AMPERE:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetComputeMode", handle).compute_mode

    # per-process samples are the C fake's: here no process ever ran a kernel, for which
    # nvml.h answers NotFound
    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        gpu = self._device("nvmlDeviceGetProcessUtilization", handle)
        if gpu.mig_mode == self._pynvml.NVML_DEVICE_MIG_ENABLE:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_FOUND)

    # MIG instances are the C fake's (tests/support/cnvml): a GPU in MIG mode here has
    # none created, as after ``nvidia-smi -mig 1`` alone
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._device("nvmlDeviceGetMaxMigDeviceCount", device)
        return 7 if gpu.mig_mode == self._pynvml.NVML_DEVICE_MIG_ENABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        self._device("nvmlDeviceGetMigDeviceHandleByIndex", device)
        raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_FOUND)

    def _processes(self, function: str, handle: Any, graphics: bool) -> list[Any]:
        gpu = self._device(function, handle)
        base = function.removesuffix("_v2").removesuffix("_v3")
        if base in gpu.errors:
            raise self._pynvml.NVMLError(gpu.errors[base])
        if gpu.mig_mode == self._pynvml.NVML_DEVICE_MIG_ENABLE and not self.privileged:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NO_PERMISSION)
        m = self._pynvml
        not_available = m.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        # the record pynvml reads: _v3_t (24 bytes) where it has one, else the floor's
        # c_nvmlProcessInfo_t (32 bytes: it adds usedGpuCcProtectedMemory)
        record = getattr(m, "c_nvmlProcessInfo_v3_t", None) or m.c_nvmlProcessInfo_t
        processes = gpu.graphics_processes if graphics else gpu.compute_processes
        written = _DRIVER_RECORDS[self.driver_record_bytes or ctypes.sizeof(record)]
        driver = (written * max(1, len(processes)))()
        for slot, (pid, used) in enumerate(processes):
            driver[slot].pid = pid
            driver[slot].usedGpuMemory = not_available if used is None else used
            driver[slot].gpuInstanceId = m.NVML_VALUE_NOT_AVAILABLE_uint.value
            driver[slot].computeInstanceId = m.NVML_VALUE_NOT_AVAILABLE_uint.value
        # pynvml reads the driver's buffer with its own record size, as ctypes does
        read = (record * len(processes)).from_buffer(driver) if processes else []
        listed = []
        for info in read:
            entry = m.nvmlStructToFriendlyObject(info)
            if entry.usedGpuMemory == not_available:  # as pynvml does (WDDM, some vGPUs)
                entry.usedGpuMemory = None
            listed.append(entry)
        return listed

    def _unversioned(self, function: str, handle: Any, graphics: bool) -> list[Any]:
        # pynvml's unversioned name calls _v3 and turns FunctionNotFound into this
        mismatch = getattr(self._pynvml, "NVMLLibraryMismatchError", None)
        try:
            return self._processes(function + "_v3", handle, graphics)
        except self._pynvml.NVMLError_FunctionNotFound:
            if mismatch is None:  # before 12.550 the unversioned name raised NVML's error
                raise
            raise mismatch(f"{function}: use a versioned function") from None

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle, False)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, False)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._unversioned("nvmlDeviceGetComputeRunningProcesses", handle, False)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, True)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, True)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        return self._unversioned("nvmlDeviceGetGraphicsRunningProcesses", handle, True)

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        if self.event_set_error is not None:
            raise self._pynvml.NVMLError(self.event_set_error)
        with self._event_cond:
            self._next_set += 16
            address = self._next_set
            self._sets[address], self._queues[address] = set(), deque()
        return ctypes.cast(ctypes.c_void_p(address), self._pynvml.c_nvmlEventSet_t)

    def _set_address(self, eventSet: Any) -> int:
        address = ctypes.cast(eventSet, ctypes.c_void_p).value or 0
        if address not in self._sets:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return address

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._device("nvmlDeviceRegisterEvents", handle)
        if not gpu.xid_events_supported:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.mig_mode == self._pynvml.NVML_DEVICE_MIG_ENABLE and not self.privileged:
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_NO_PERMISSION)
        with self._event_cond:
            self._sets[self._set_address(eventSet)].add(self.gpus.index(gpu))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        # pynvml's nvmlEventSetWait calls the C nvmlEventSetWait_v2
        if self.wait_v2_missing:
            self.calls["nvmlEventSetWait"] = self.calls.get("nvmlEventSetWait", 0) + 1
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._enter("nvmlEventSetWait")
        return self._wait(eventSet, timeoutms)

    def _wait(self, eventSet: Any, timeoutms: int) -> Any:
        with self._event_cond:
            address = self._set_address(eventSet)
            for gpu in list(self._sets[address]):
                if self.gpus[gpu].lost:
                    self._lose_registrations(gpu)
            self.waits_started += 1
            self._event_cond.notify_all()
            queue = self._queues[address]
            if address in self._broken:
                raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_GPU_IS_LOST)
            if not self._event_cond.wait_for(lambda: bool(queue), timeout=timeoutms / 1000):
                raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_TIMEOUT)
            item = queue.popleft()
        if isinstance(item, int):
            raise self._pynvml.NVMLError(item)
        gpu, xid = item
        data = self._pynvml.c_nvmlEventData_t()
        data.device = self._handles[gpu]
        data.eventType = self._pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        with self._event_cond:
            address = self._set_address(eventSet)
            del self._sets[address], self._queues[address]
            self._broken.discard(address)

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """pynvml's private lookup, for the C ``nvmlEventSetWait`` only (the v1 wait)."""
        if name != "nvmlEventSetWait":
            raise self._pynvml.NVMLError(self._pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def c_wait(eventSet: Any, data: Any, timeoutms: Any) -> int:
            self.calls["nvmlEventSetWait_v1"] = self.calls.get("nvmlEventSetWait_v1", 0) + 1
            try:
                got = self._wait(eventSet, timeoutms.value)
            except self._pynvml.NVMLError as exc:
                return int(exc.value)
            target = data.contents
            target.device, target.eventType = got.device, got.eventType
            target.eventData = got.eventData
            return int(self._pynvml.NVML_SUCCESS)

        return c_wait


def fake_gpu(index: int, **overrides: Any) -> FakeGpu:
    options: dict[str, Any] = {
        "uuid": f"GPU-00000000-0000-4000-8000-{index:012d}",
        "bus_id": f"00000000:{0x18 + index:02X}:00.0",
    }
    return FakeGpu(**(options | overrides))


@pytest.fixture
def fake_nvml() -> FakeNvml:
    """Two Hopper GPUs with every metric supported."""
    return FakeNvml([fake_gpu(0), fake_gpu(1)])
