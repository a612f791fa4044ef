"""The checks of ``scripts/gpu-check``, as pure functions over scraped ``/metrics`` text.

The script drives a real GPU (matmuls, host<->device copies of known size) and
scrapes the exporter between phases; everything it decides is decided here, so
it is tested on canned scrapes where no GPU exists.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuscope import flags
from gpuscope.contract.gpu import (
    CLOCK_EVENT_ACTIVE,
    COMPUTE_MODE,
    ECC_ERRORS,
    MEMORY_USED,
    PCIE_RECEIVE,
    PCIE_TRANSMIT,
    PER_GPU,
    POWER,
    SM_CLOCK,
    SM_CLOCK_MAX,
    SM_OCCUPANCY,
)
from gpuscope.exporter.gpu.definitions import METRIC_GROUPS

# GpuReading field -> the metric name it is served under
FIELD_METRICS: dict[str, str] = {row.field: row.sample_name for row in PER_GPU} | {
    "clock_event_reasons": CLOCK_EVENT_ACTIVE.sample_name,
    "ecc_errors_total": ECC_ERRORS.sample_name,
    "compute_mode": COMPUTE_MODE.sample_name,
}


@dataclass(frozen=True)
class GpuCheckConfig(
    flags.Settings,
    prog="scripts/gpu-check",
    description="Check gpuscope's NVML metrics against a real GPU under known load.",
    env_prefix="GPUSCOPE_GPU_CHECK_",
):
    output: Path = flags.option(help="where to write the observations (JSON)")
    gpu: int = flags.option(0, help="NVML index of the GPU to load", check=flags.at_least(0))
    copy_bytes: int = flags.option(
        2 * 2**30, help="bytes of each host<->device copy", check=flags.at_least(2**20)
    )
    load_duration_s: float = flags.option(
        15.0,
        help="how long the matmul load runs",
        check=flags.at_least(2.0),
        deprecated=("--load-seconds",),
    )
    pcie_tolerance: float = flags.option(
        0.15,
        help="how much more than the copies the PCIe counters may count (never less): "
        "they count bytes on the link, packet headers included (+7.9 %% received, "
        "+9.4 %% sent for 1-2 GiB copies on an H200 with driver 580.159.04)",
        unit="ratio",
        check=flags.at_least(0.0),
    )
    gpu_interval_s: float = flags.option(
        0.5,
        help="the exporter's --gpu-interval-s during the check",
        check=flags.at_least(0.1),
        deprecated=("--gpu-interval",),
    )


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str


Samples = dict[str, float]  # metric name -> value, for one GPU (first series of each name)


def gpu_samples(text: str, gpu: int) -> Samples:
    """The values of one GPU's series in a scrape (labelled variants: first one wins)."""
    values: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("gpu") == str(gpu):
                values.setdefault(sample.name, sample.value)
    return values


def check_clock_power_memory(
    idle: Samples, loaded: Samples, allocated_bytes: int
) -> list[CheckResult]:
    results = []
    sm_max = loaded.get(SM_CLOCK_MAX.name, 0.0)
    sm = loaded.get(SM_CLOCK.name, 0.0)
    sm_idle = idle.get(SM_CLOCK.name, 0.0)
    results.append(
        CheckResult(
            "sm_clock_under_load",
            sm_max > 0 and sm >= 0.5 * sm_max,
            f"{sm / 1e6:.0f} MHz loaded, {sm_idle / 1e6:.0f} MHz idle, max {sm_max / 1e6:.0f} MHz",
        )
    )
    idle_w, load_w = (
        idle.get(POWER.name, 0.0),
        loaded.get(POWER.name, 0.0),
    )
    results.append(
        CheckResult(
            "power_rises_under_load",
            load_w > 1.2 * idle_w > 0,
            f"{idle_w:.0f} W idle -> {load_w:.0f} W loaded",
        )
    )
    grown = loaded.get(MEMORY_USED.name, 0.0) - idle.get(MEMORY_USED.name, 0.0)
    results.append(
        CheckResult(
            "memory_used_grows",
            grown >= 0.9 * allocated_bytes,
            f"+{grown / 2**30:.2f} GiB for {allocated_bytes / 2**30:.2f} GiB allocated",
        )
    )
    idle_occ = idle.get(SM_OCCUPANCY.name)
    load_occ = loaded.get(SM_OCCUPANCY.name)
    occupancy_ok = load_occ is not None and load_occ > 0.05 and load_occ > (idle_occ or 0.0)
    results.append(
        CheckResult(
            "gpm_occupancy_rises",
            occupancy_ok,
            f"SM occupancy {idle_occ} idle -> {load_occ} loaded",
        )
    )
    return results


PCIE_METRICS = {
    "receive": PCIE_RECEIVE.sample_name,  # host -> device copies
    "transmit": PCIE_TRANSMIT.sample_name,  # device -> host copies
}


def check_pcie(
    direction: str, before: Samples, after: Samples, copied_bytes: int, tolerance: float
) -> CheckResult:
    """The bytes counted in ``direction`` across one copy window are the copy's size, plus
    at most ``tolerance`` of it: the counters count the link's bytes, headers included,
    so they exceed the payload (by 8-10 % on a real H200), and may never fall short."""
    metric = PCIE_METRICS[direction]
    name = f"pcie_{direction}_bytes"
    if metric not in before or metric not in after:
        return CheckResult(name, False, f"{metric} is absent")
    moved = after[metric] - before[metric]
    error = moved / copied_bytes - 1.0
    return CheckResult(
        name,
        0.0 <= error <= tolerance,
        f"{moved:.0f} bytes counted for {copied_bytes} copied "
        f"({error:+.1%}, allowed 0 to +{tolerance:.0%})",
    )


def check_doctor(doctor: Mapping[str, Any], scrape: Samples, gpu: int) -> CheckResult:
    """The doctor says supported exactly for the metric groups the exporter serves."""
    entry = next((g for g in doctor.get("gpus", []) if g.get("index") == gpu), None)
    if entry is None:
        return CheckResult("doctor_truthful", False, f"doctor lists no GPU {gpu}")
    wrong = []
    for group, fields in METRIC_GROUPS.items():
        if group in ("xid_errors", "process_utilization"):
            continue  # their series appear only once an XID happened, a process ran
        served = any(FIELD_METRICS[f] in scrape for f in fields)
        claimed = bool(entry["metrics"].get(group, {}).get("supported"))
        if served != claimed:
            wrong.append(
                f"{group}: doctor says {'yes' if claimed else 'no'}, "
                f"/metrics {'has' if served else 'lacks'} it"
            )
    return CheckResult(
        "doctor_truthful", not wrong, "; ".join(wrong) or "every metric group agrees"
    )


def check_process_join(doctor: Mapping[str, Any], gpu: int, pid: int) -> CheckResult:
    """The doctor, run while ``pid`` holds GPU ``gpu``, joins that pid to that GPU."""
    join = doctor.get("process_join") or {}
    entry = next((g for g in join.get("gpus", {}).values() if g.get("index") == gpu), None)
    listed = entry is not None and pid in entry.get("pids", [])
    status = join.get("status")
    detail = f"status {status}: {join.get('why')}"
    if entry is not None:
        detail += f"; GPU {gpu} lists {entry.get('pids')} ({entry.get('why') or 'listed'})"
    return CheckResult("process_join_lists_the_loader", status == "ok" and listed, detail)


# Entry points whose presence differs between driver branches (docs/gpu.md's table)
OPTIONAL_ENTRY_POINTS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlEventSetWait_v2",
    "nvmlGpmMetricsGet",
)
PCIE_BYTE_FIELDS = (197, 198)  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES (nvml.h)


def driver_facts(nvml: Any, gpu: int) -> dict[str, Any]:
    """What this driver and pynvml give, read through ``nvml`` (pynvml, initialised):
    versions, which optional entry points the library exports, whether the PCIe byte
    fields answer, and memory used as v1 (reserved counted as used) against v2."""

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def exported(name: str) -> bool:
        try:
            nvml._nvmlGetFunctionPointer(name)  # pynvml's own lookup; the only way to ask
        except nvml.NVMLError:
            return False
        return True

    handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
    facts: dict[str, Any] = {
        "driver_version": text(nvml.nvmlSystemGetDriverVersion()),
        "nvml_version": text(nvml.nvmlSystemGetNVMLVersion()),
        "pynvml_version": getattr(nvml, "__version__", None),
        "entry_points": {name: exported(name) for name in OPTIONAL_ENTRY_POINTS},
        "pcie_byte_fields": [
            entry.nvmlReturn == 0
            for entry in nvml.nvmlDeviceGetFieldValues(handle, list(PCIE_BYTE_FIELDS))
        ],
    }
    v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
    facts["memory_v1_used_bytes"] = int(v1.used)
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except nvml.NVMLError as exc:
            facts["memory_v2"] = f"refused: {exc}"
        else:
            facts["memory_v2_used_bytes"] = int(v2.used)
            facts["memory_v2_reserved_bytes"] = int(v2.reserved)
    return facts


# The NVML calls the exporter and the doctor make, with the arguments they pass (by the
# name of the pynvml constant, so the list reads like the code it mirrors).
NVML_CALLS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("name", "nvmlDeviceGetName", ()),
    ("uuid", "nvmlDeviceGetUUID", ()),
    ("architecture", "nvmlDeviceGetArchitecture", ()),
    ("memory_v1", "nvmlDeviceGetMemoryInfo", ()),
    ("utilization", "nvmlDeviceGetUtilizationRates", ()),
    ("sm_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",)),
    ("memory_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",)),
    ("sm_clock_max", "nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_SM",)),
    ("memory_clock_max", "nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_MEM",)),
    ("sm_clock_target", "nvmlDeviceGetClock", ("NVML_CLOCK_SM", "NVML_CLOCK_ID_APP_CLOCK_TARGET")),
    ("power_mw", "nvmlDeviceGetPowerUsage", ()),
    ("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit", ()),
    ("energy_mj", "nvmlDeviceGetTotalEnergyConsumption", ()),
    ("temperature", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",)),
    ("pcie_tx_kib_s", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_TX_BYTES",)),
    ("pcie_rx_kib_s", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_RX_BYTES",)),
    ("pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration", ()),
    ("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", ()),
    ("clock_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    (
        "ecc_uncorrected_volatile",
        "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    ),
    ("compute_mode", "nvmlDeviceGetComputeMode", ()),
    ("mig_mode", "nvmlDeviceGetMigMode", ()),
    ("max_mig_devices", "nvmlDeviceGetMaxMigDeviceCount", ()),
    ("numa_node", "nvmlDeviceGetNumaNodeId", ()),
    ("compute_processes", "nvmlDeviceGetComputeRunningProcesses", ()),
    ("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses", ()),
    ("mps_processes", "nvmlDeviceGetMPSComputeRunningProcesses", ()),
    ("gpm_support", "nvmlGpmQueryDeviceSupport", ()),
)


def _plain(value: Any, depth: int = 0) -> Any:
    """A pynvml answer (ctypes structs, arrays, bytes, wrapper objects) as JSON values."""
    if depth > 4:
        return repr(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, ctypes.Array | list | tuple):
        return [_plain(item, depth + 1) for item in list(value)[:16]]
    if isinstance(value, ctypes.Structure | ctypes.Union):
        return {field[0]: _plain(getattr(value, field[0]), depth + 1) for field in value._fields_}
    if hasattr(value, "__dict__"):
        return {key: _plain(item, depth + 1) for key, item in vars(value).items()}
    return repr(value)


def nvml_calls(nvml: Any, gpu: int, *, repeat: int = 5) -> dict[str, dict[str, Any]]:
    """Each call of ``NVML_CALLS`` on GPU ``gpu`` through ``nvml`` (pynvml, initialised):
    its answer or its NVML error code, and the median and the slowest of ``repeat``
    timings in ms. On a lent GPU this records what the driver says; on the C fake the
    same run records what the fake says, and the two side by side show where the fake
    is wrong."""
    handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
    answers: dict[str, dict[str, Any]] = {}
    for label, function, constants in NVML_CALLS:
        call = getattr(nvml, function, None)
        if call is None or not all(hasattr(nvml, name) for name in constants):
            answers[label] = {"absent_from_pynvml": True}
            continue
        args = [getattr(nvml, name) for name in constants]
        timings: list[float] = []
        answer: dict[str, Any] = {}
        for _ in range(repeat):
            start = time.perf_counter()
            try:
                answer = {"value": _plain(call(handle, *args))}
            except nvml.NVMLError as exc:
                answer = {"error": exc.value}  # NVML_ERROR_* (nvml.h)
            timings.append(time.perf_counter() - start)
        answer["median_ms"] = round(statistics.median(timings) * 1000, 4)
        answer["max_ms"] = round(max(timings) * 1000, 4)
        answers[label] = answer
    return answers
