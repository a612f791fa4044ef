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
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pynvml as real
import pytest

HOPPER, AMPERE = 9, 7


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
    xid_events_supported: bool = True
    # (pid, used bytes; None: NVML_VALUE_NOT_AVAILABLE) as the process lists return them
    compute_processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig_mode: int = real.NVML_DEVICE_MIG_DISABLE
    lost: bool = False
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML_ERROR_*


_COPIED_PREFIXES = (
    "NVML_",
    "NVMLError",
    "NVMLLibraryMismatchError",
    "nvmlClocksEventReason",
    "nvmlEventType",
    "c_nvml",
)


class FakeNvml:
    """Stands in for the ``pynvml`` module: pass it as ``NvmlSource(nvml=...)``."""

    def __init__(self, gpus: list[FakeGpu], *, driver_version: str = "550.54.15") -> None:
        for name in dir(real):
            if name.startswith(_COPIED_PREFIXES):
                setattr(self, name, getattr(real, name))
        self.gpus = gpus
        self.driver_version = driver_version
        self.driver_error: int | None = None  # every call fails with this, init included
        self.refcount = 0
        self.calls: dict[str, int] = {}
        self._handles = [
            ctypes.cast(ctypes.c_void_p(0x1000 + 16 * i), real.c_nvmlDevice_t) for i in range(64)
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
            raise real.NVMLError(self.driver_error)
        if self.refcount == 0:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self._gpu(handle)
        if gpu.lost:
            self._lose_registrations(self.gpus.index(gpu))
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.errors:
            raise real.NVMLError(gpu.errors[function])
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
        raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)

    def _device(self, function: str, handle: Any) -> FakeGpu:
        gpu = self._enter(function, handle)
        assert gpu is not None
        return gpu

    # --- the pynvml surface -------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        self._maybe_hang("nvmlInit")
        if self.driver_error is not None:
            raise real.NVMLError(self.driver_error)
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
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._enter("nvmlDeviceGetHandleByUUID")
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == wanted:
                if gpu.lost:
                    raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
                return self._handles[index]
        raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = real.nvmlPciInfo_t()
        info.busId = self._device("nvmlDeviceGetPciInfo", handle).bus_id.encode()
        return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetNumaNodeId", handle).numa_node

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        return self._device("nvmlDeviceGetArchitecture", device).architecture

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        return gpu.sm_mhz if type == real.NVML_CLOCK_SM else gpu.mem_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._device("nvmlDeviceGetMaxClockInfo", handle)
        return gpu.sm_max_mhz if type == real.NVML_CLOCK_SM else gpu.mem_max_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        return real.c_nvmlUtilization_t(gpu=gpu.utilization_percent, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        free = gpu.memory_total - gpu.memory_used
        return real.c_nvmlMemory_t(total=gpu.memory_total, free=free, used=gpu.memory_used)

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

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[int]) -> Any:
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        values = (real.c_nvmlFieldValue_t * len(fieldIds))()
        counters = {
            real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: gpu.pcie_tx_bytes,
            real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: gpu.pcie_rx_bytes,
        }
        for slot, field_id in enumerate(fieldIds):
            values[slot].fieldId = field_id
            if field_id in counters and gpu.pcie_field_return is not None:
                values[slot].nvmlReturn = gpu.pcie_field_return
            elif field_id in counters and gpu.pcie_fields_supported:
                values[slot].valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[slot].value.ullVal = counters[field_id]
                values[slot].nvmlReturn = real.NVML_SUCCESS
            else:
                values[slot].nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu = self._device("nvmlDeviceGetPcieThroughput", device)
        tx, rx = gpu.pcie_throughput_kib_s
        return tx if counter == real.NVML_PCIE_UTIL_TX_BYTES else rx

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        gpu = self._device("nvmlGpmQueryDeviceSupport", device)
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported and gpu.architecture >= HOPPER)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(64)
        sample = ctypes.cast(buffer, real.c_nvmlGpmSample_t)
        self._gpm_buffers[ctypes.addressof(buffer)] = buffer
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        address = ctypes.cast(gpmSample, ctypes.c_void_p).value
        if self._gpm_buffers.pop(address or 0, None) is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_samples.pop(address or 0, None)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu = self._device("nvmlGpmSampleGet", device)
        address = ctypes.cast(gpmSample, ctypes.c_void_p).value or 0
        if address not in self._gpm_buffers:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_sequence += 1
        self._gpm_samples[address] = (self.gpus.index(gpu), self._gpm_sequence)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        first = self._gpm_samples.get(ctypes.cast(metricsGet.sample1, ctypes.c_void_p).value or 0)
        second = self._gpm_samples.get(ctypes.cast(metricsGet.sample2, ctypes.c_void_p).value or 0)
        if (
            metricsGet.version != real.NVML_GPM_METRICS_GET_VERSION
            or first is None
            or second is None
            or first[0] != second[0]
            or second[1] <= first[1]
        ):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[first[0]]
        if gpu.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        for slot in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[slot]
            percent = gpu.gpm_percent.get(metric.metricId)
            metric.nvmlReturn = (
                real.NVML_SUCCESS if percent is not None else real.NVML_ERROR_NOT_SUPPORTED
            )
            metric.value = percent or 0.0
        return metricsGet

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._device("nvmlDeviceGetMigMode", device)
        if gpu.architecture < AMPERE:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def _processes(self, function: str, handle: Any, graphics: bool) -> list[Any]:
        gpu = self._device(function, handle)
        base = function.removesuffix("_v2").removesuffix("_v3")
        if base in gpu.errors:
            raise real.NVMLError(gpu.errors[base])
        if function in self.missing_functions:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if gpu.mig_mode == real.NVML_DEVICE_MIG_ENABLE and not self.privileged:
            raise real.NVMLError(real.NVML_ERROR_NO_PERMISSION)
        not_available = real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        listed = []
        for pid, used in gpu.graphics_processes if graphics else gpu.compute_processes:
            info = real.c_nvmlProcessInfo_v3_t(
                pid=pid,
                usedGpuMemory=not_available if used is None else used,
                gpuInstanceId=real.NVML_VALUE_NOT_AVAILABLE_uint.value,
                computeInstanceId=real.NVML_VALUE_NOT_AVAILABLE_uint.value,
            )
            entry = real.nvmlStructToFriendlyObject(info)
            if entry.usedGpuMemory == not_available:  # as pynvml does (WDDM, some vGPUs)
                entry.usedGpuMemory = None
            listed.append(entry)
        return listed

    def _unversioned(self, function: str, handle: Any, graphics: bool) -> list[Any]:
        # pynvml's unversioned name calls _v3 and turns FunctionNotFound into this
        try:
            return self._processes(function + "_v3", handle, graphics)
        except real.NVMLError_FunctionNotFound:
            raise real.NVMLLibraryMismatchError(f"{function}: use a versioned function") from None

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
            raise real.NVMLError(self.event_set_error)
        with self._event_cond:
            self._next_set += 16
            address = self._next_set
            self._sets[address], self._queues[address] = set(), deque()
        return ctypes.cast(ctypes.c_void_p(address), real.c_nvmlEventSet_t)

    def _set_address(self, eventSet: Any) -> int:
        address = ctypes.cast(eventSet, ctypes.c_void_p).value or 0
        if address not in self._sets:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return address

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._device("nvmlDeviceRegisterEvents", handle)
        if not gpu.xid_events_supported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if gpu.mig_mode == real.NVML_DEVICE_MIG_ENABLE and not self.privileged:
            raise real.NVMLError(real.NVML_ERROR_NO_PERMISSION)
        with self._event_cond:
            self._sets[self._set_address(eventSet)].add(self.gpus.index(gpu))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        # pynvml's nvmlEventSetWait calls the C nvmlEventSetWait_v2
        if self.wait_v2_missing:
            self.calls["nvmlEventSetWait"] = self.calls.get("nvmlEventSetWait", 0) + 1
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
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
                raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
            if not self._event_cond.wait_for(lambda: bool(queue), timeout=timeoutms / 1000):
                raise real.NVMLError(real.NVML_ERROR_TIMEOUT)
            item = queue.popleft()
        if isinstance(item, int):
            raise real.NVMLError(item)
        gpu, xid = item
        data = real.c_nvmlEventData_t()
        data.device = self._handles[gpu]
        data.eventType = real.nvmlEventTypeXidCriticalError
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
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)

        def c_wait(eventSet: Any, data: Any, timeoutms: Any) -> int:
            self.calls["nvmlEventSetWait_v1"] = self.calls.get("nvmlEventSetWait_v1", 0) + 1
            try:
                got = self._wait(eventSet, timeoutms.value)
            except real.NVMLError as exc:
                return int(exc.value)
            target = data.contents
            target.device, target.eventType = got.device, got.eventType
            target.eventData = got.eventData
            return int(real.NVML_SUCCESS)

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
