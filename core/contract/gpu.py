"""The exporter's GPU rows, one ``MetricDef`` each (see ``rows``).

A row with a ``field`` is a plain per-GPU metric: the ``GpuReading`` attribute of that
name, absent where it is None; ``GpuCollector`` fills the named others.
"""

from __future__ import annotations

import uuid
from typing import Final

from gpuscope.contract import labels as L
from gpuscope.contract.rows import COUNTER, GAUGE, PREFIX, MetricDef

# Every GPU-side family but the collector's starts with this.
GPU_PREFIX: Final = PREFIX + "gpu"
GPU_LABELS: Final = (L.GPU, L.UUID)

INFO = MetricDef(
    "gpuscope_gpu_info",
    GAUGE,
    "Descriptive labels of each GPU; join on gpu and uuid.",
    (*GPU_LABELS, L.NAME, L.PCI_BUS_ID, L.NUMA_NODE, L.DRIVER_VERSION),
)
MIG_INFO = MetricDef(
    "gpuscope_gpu_mig_info",
    GAUGE,
    "1 for each MIG instance served as a GPU of its own (gpu is <parent index>:<MIG device "
    "index>, uuid its MIG- UUID): its parent GPU, profile and GPU/compute instance ids. "
    "Memory and processes are the instance's; clocks, power, temperature, PCIe, GPM and "
    "XIDs are the parent's series, joined on parent_uuid.",
    (
        *GPU_LABELS,
        L.PARENT_GPU,
        L.PARENT_UUID,
        L.PROFILE,
        L.GPU_INSTANCE_ID,
        L.COMPUTE_INSTANCE_ID,
    ),
)
UP = MetricDef(
    "gpuscope_gpu_up",
    GAUGE,
    "1 if the GPU could be read in the last poll, else 0.",
    GPU_LABELS,
)
DOWN_REASON = MetricDef(
    "gpuscope_gpu_down_reason",
    GAUGE,
    "1 with the reason a GPU reads gpuscope_gpu_up 0 (lost, reset_required, "
    "insufficient_power, poll_overdue, released, ...); absent while it is up.",
    (*GPU_LABELS, L.REASON),
)
SAMPLE_AGE = MetricDef(
    "gpuscope_gpu_sample_age_seconds",
    GAUGE,
    "Seconds since the GPU readings served were taken (since the poller started, "
    "before the first); grows while a poll is stuck.",
)
CLOCK_EVENT_ACTIVE = MetricDef(
    "gpuscope_gpu_clock_event_active",
    GAUGE,
    "1 while the clock event reason holds clocks down (or idle), else 0.",
    (*GPU_LABELS, L.REASON),
)
# CLOCK_EVENT_ACTIVE's reasons (its ``reason`` label values), each with its bit of the
# mask NVML's ``nvmlDeviceGetCurrentClocksEventReasons`` and DCGM's
# ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` share (nvml.h ``nvmlClocksEventReason*``, in its
# order): the exporter decodes the mask by it, the dcgm-exporter rules too.
CLOCK_EVENT_REASON_BITS: Final[tuple[tuple[str, int], ...]] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
XID_EVENTS = MetricDef(
    "gpuscope_gpu_xid_events",
    COUNTER,
    "XID errors of any code seen since the exporter started (0 until the first).",
    GPU_LABELS,
)
XID_ERRORS = MetricDef(
    "gpuscope_gpu_xid_errors",
    COUNTER,
    "XID errors seen since the exporter started, by XID code.",
    (*GPU_LABELS, L.XID),
)
ECC_ERRORS = MetricDef(
    "gpuscope_gpu_ecc_errors",
    COUNTER,
    "ECC errors as counted by the driver.",
    (*GPU_LABELS, L.ECC_TYPE),
)
PROCESS_JOIN_STATUS = MetricDef(
    "gpuscope_gpu_process_join_status",
    GAUGE,
    "1 for the state of the join of span pids to the GPUs their processes hold "
    "(ok, pending, no_permission, not_supported, other_pid_namespace, untrusted_listing), "
    "0 for the others.",
    (L.STATUS,),
)
PROCESS_JOIN_PROCESSES = MetricDef(
    "gpuscope_gpu_process_join_processes",
    GAUGE,
    "Processes on the GPUs at the last listing that the exporter can join spans to.",
)
SM_CLOCK_CHANGES = MetricDef(
    "gpuscope_gpu_sm_clock_changes",
    COUNTER,
    "Polls whose SM clock differed from the previous poll's: a locked clock (nvidia-smi "
    "-lgc) does not change; rate() of it is how often an unlocked one swings.",
    GPU_LABELS,
)
COMPUTE_MODE = MetricDef(
    "gpuscope_gpu_compute_mode",
    GAUGE,
    "1 for the GPU's compute mode (default: any number of processes time-slice it; "
    "exclusive_process: one process, or one MPS server; prohibited), 0 for the others.",
    (*GPU_LABELS, L.MODE),
)
COMPUTE_PROCESSES = MetricDef(
    "gpuscope_gpu_compute_processes",
    GAUGE,
    "Processes holding a compute context on the GPU at the last process listing.",
    GPU_LABELS,
)
MPS_PROCESSES = MetricDef(
    "gpuscope_gpu_mps_processes",
    GAUGE,
    "Processes using the GPU through an MPS server (nvmlDeviceGetMPSComputeRunningProcesses); "
    "0: MPS not in use.",
    GPU_LABELS,
)
CONTENDED = MetricDef(
    "gpuscope_gpu_contended",
    GAUGE,
    "1 while more than one process time-slices the GPU: several compute processes, none "
    "through MPS, in the default compute mode (a MIG instance counts as its own GPU).",
    GPU_LABELS,
)
PROCESS_MEMORY_USED = MetricDef(
    "gpuscope_gpu_process_memory_used_bytes",
    GAUGE,
    "Device memory of each process on the GPU (pid __overflow__: the processes past the "
    "series cap, summed).",
    (*GPU_LABELS, L.PID),
)
PROCESS_SM_UTILIZATION = MetricDef(
    "gpuscope_gpu_process_sm_utilization_ratio",
    GAUGE,
    "Fraction of time a kernel of each process ran on the GPU since the last poll "
    "(nvmlDeviceGetProcessUtilization; pid __overflow__ as for the memory).",
    (*GPU_LABELS, L.PID),
)
PROCESS_NUMA_LOCALITY = MetricDef(
    "gpuscope_gpu_process_numa_locality",
    GAUGE,
    "1 with where each process on the GPU may run against the GPU's NUMA side: local (only "
    "the GPU's CPUs and memory nodes), split (unbound: some of them), remote (none of its "
    "CPUs or nodes); from /proc/<pid>/status and NVML's CPU and memory affinity. gpuscope "
    "doctor prints the numactl line that makes it local.",
    (*GPU_LABELS, L.PID, L.LOCALITY),
)
COLLECTOR_SUCCESS = MetricDef(
    "gpuscope_collector_success",
    GAUGE,
    "1 if the collector's last run succeeded, else 0.",
    (L.COLLECTOR,),
)
COLLECTOR_DURATION = MetricDef(
    "gpuscope_collector_duration_seconds",
    GAUGE,
    "How long the collector's last run took.",
    (L.COLLECTOR,),
)

SM_CLOCK = MetricDef(
    "gpuscope_gpu_sm_clock_hertz",
    GAUGE,
    "SM clock.",
    GPU_LABELS,
    field="sm_clock_hz",
)
SM_CLOCK_TARGET = MetricDef(
    "gpuscope_gpu_sm_clock_target_hertz",
    GAUGE,
    "The SM application clock target (nvmlDeviceGetClock, NVML_CLOCK_ID_APP_CLOCK_TARGET): "
    "where nvidia-smi -ac set one; absent where the driver answers deprecated (R590 on "
    "Hopper) or not supported. With no target, clock locking shows as no changes below.",
    GPU_LABELS,
    field="sm_clock_target_hz",
)
SM_CLOCK_MAX = MetricDef(
    "gpuscope_gpu_sm_clock_max_hertz",
    GAUGE,
    "Maximum SM clock.",
    GPU_LABELS,
    field="sm_clock_max_hz",
)
MEMORY_CLOCK = MetricDef(
    "gpuscope_gpu_memory_clock_hertz",
    GAUGE,
    "Memory clock.",
    GPU_LABELS,
    field="memory_clock_hz",
)
MEMORY_CLOCK_MAX = MetricDef(
    "gpuscope_gpu_memory_clock_max_hertz",
    GAUGE,
    "Maximum memory clock.",
    GPU_LABELS,
    field="memory_clock_max_hz",
)
UTILIZATION = MetricDef(
    "gpuscope_gpu_utilization_ratio",
    GAUGE,
    "Fraction of time a kernel ran (NVML utilization; coarse, see sm_active).",
    GPU_LABELS,
    field="utilization_ratio",
)
SM_OCCUPANCY = MetricDef(
    "gpuscope_gpu_sm_occupancy_ratio",
    GAUGE,
    "Resident warps over the SMs' warp capacity (GPM).",
    GPU_LABELS,
    field="sm_occupancy_ratio",
)
SM_ACTIVE = MetricDef(
    "gpuscope_gpu_sm_active_ratio",
    GAUGE,
    "Fraction of SMs busy (GPM).",
    GPU_LABELS,
    field="sm_active_ratio",
)
TENSOR_ACTIVE = MetricDef(
    "gpuscope_gpu_tensor_active_ratio",
    GAUGE,
    "Fraction of time tensor cores were busy (GPM).",
    GPU_LABELS,
    field="tensor_active_ratio",
)
DRAM_ACTIVE = MetricDef(
    "gpuscope_gpu_dram_active_ratio",
    GAUGE,
    "DRAM bandwidth used over its maximum (GPM).",
    GPU_LABELS,
    field="dram_active_ratio",
)
PCIE_LINK_GENERATION = MetricDef(
    "gpuscope_gpu_pcie_link_generation",
    GAUGE,
    "Current PCIe link generation.",
    GPU_LABELS,
    field="pcie_link_generation",
)
PCIE_LINK_WIDTH = MetricDef(
    "gpuscope_gpu_pcie_link_width",
    GAUGE,
    "Current PCIe link width (lanes).",
    GPU_LABELS,
    field="pcie_link_width",
)
MEMORY_USED = MetricDef(
    "gpuscope_gpu_memory_used_bytes",
    GAUGE,
    "Device memory allocated by processes (NVML memory v2: the driver's reserved memory "
    "is apart; with v1 drivers it is counted here, see gpuscope doctor).",
    GPU_LABELS,
    field="memory_used_bytes",
)
MEMORY_RESERVED = MetricDef(
    "gpuscope_gpu_memory_reserved_bytes",
    GAUGE,
    "Device memory the driver reserves for itself (NVML memory v2; absent with v1).",
    GPU_LABELS,
    field="memory_reserved_bytes",
)
MEMORY_TOTAL = MetricDef(
    "gpuscope_gpu_memory_total_bytes",
    GAUGE,
    "Device memory in total.",
    GPU_LABELS,
    field="memory_total_bytes",
)
POWER = MetricDef(
    "gpuscope_gpu_power_watts",
    GAUGE,
    "Power draw.",
    GPU_LABELS,
    field="power_watts",
)
POWER_LIMIT = MetricDef(
    "gpuscope_gpu_power_limit_watts",
    GAUGE,
    "Enforced power limit.",
    GPU_LABELS,
    field="power_limit_watts",
)
TEMPERATURE = MetricDef(
    "gpuscope_gpu_temperature_celsius",
    GAUGE,
    "GPU core temperature.",
    GPU_LABELS,
    field="temperature_celsius",
)
PCIE_TRANSMIT = MetricDef(
    "gpuscope_gpu_pcie_transmit_bytes",
    COUNTER,
    "Bytes sent by the GPU over PCIe: NVML's byte counter (driver R555+), else GPM's PCIe "
    "rate integrated (Hopper+), else 20 ms samples of nvmlDeviceGetPcieThroughput "
    "integrated (an estimate); gpuscope doctor says which.",
    GPU_LABELS,
    field="pcie_transmit_bytes_total",
)
PCIE_RECEIVE = MetricDef(
    "gpuscope_gpu_pcie_receive_bytes",
    COUNTER,
    "Bytes received by the GPU over PCIe; obtained as the transmit counter is.",
    GPU_LABELS,
    field="pcie_receive_bytes_total",
)
NVLINK_LINKS = MetricDef(
    "gpuscope_gpu_nvlink_links",
    GAUGE,
    "NVLinks of the GPU (field NVML_FI_DEV_NVLINK_LINK_COUNT); absent without NVLink.",
    GPU_LABELS,
    field="nvlink_links",
)
NVLINK_TRANSMIT = MetricDef(
    "gpuscope_gpu_nvlink_transmit_bytes",
    COUNTER,
    "Data bytes the GPU sent over all its NVLinks (field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "
    "KiB, all links); beside the PCIe counters: peer traffic of a tensor-parallel group.",
    GPU_LABELS,
    field="nvlink_transmit_bytes_total",
)
NVLINK_RECEIVE = MetricDef(
    "gpuscope_gpu_nvlink_receive_bytes",
    COUNTER,
    "Data bytes the GPU received over all its NVLinks (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX).",
    GPU_LABELS,
    field="nvlink_receive_bytes_total",
)
ENERGY = MetricDef(
    "gpuscope_gpu_energy_joules",
    COUNTER,
    "Energy consumed by the GPU.",
    GPU_LABELS,
    field="energy_joules_total",
)

# The plain per-GPU rows: one sample per GPU, the reading's value of the row's ``field``.
PER_GPU: Final[tuple[MetricDef, ...]] = (
    SM_CLOCK,
    SM_CLOCK_TARGET,
    SM_CLOCK_MAX,
    MEMORY_CLOCK,
    MEMORY_CLOCK_MAX,
    UTILIZATION,
    SM_OCCUPANCY,
    SM_ACTIVE,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    PCIE_LINK_GENERATION,
    PCIE_LINK_WIDTH,
    MEMORY_USED,
    MEMORY_RESERVED,
    MEMORY_TOTAL,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    PCIE_TRANSMIT,
    PCIE_RECEIVE,
    NVLINK_LINKS,
    NVLINK_TRANSMIT,
    NVLINK_RECEIVE,
    ENERGY,
)

GPU_METRICS: Final[tuple[MetricDef, ...]] = (
    INFO,
    MIG_INFO,
    UP,
    DOWN_REASON,
    SAMPLE_AGE,
    *PER_GPU,
    CLOCK_EVENT_ACTIVE,
    XID_EVENTS,
    XID_ERRORS,
    ECC_ERRORS,
    PROCESS_JOIN_STATUS,
    PROCESS_JOIN_PROCESSES,
    SM_CLOCK_CHANGES,
    COMPUTE_MODE,
    COMPUTE_PROCESSES,
    MPS_PROCESSES,
    CONTENDED,
    PROCESS_MEMORY_USED,
    PROCESS_SM_UTILIZATION,
    PROCESS_NUMA_LOCALITY,
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
)


# The simulated GPU source's UUIDs (its ``uuid`` label values), which a worker beside a
# simulated exporter names as its GPU (the demo, the Kubernetes demo component).
_SIMULATED_UUID_NAMESPACE: Final = uuid.UUID("0b6f7c3e-4d1a-5b8e-9c2f-6a7d8e9f0a1b")


def simulated_uuid(index: int) -> str:
    """The UUID of simulated GPU ``index``: the same on every run, shaped like NVML's."""
    return f"GPU-{uuid.uuid5(_SIMULATED_UUID_NAMESPACE, f'gpuscope-simulated-{index}')}"
