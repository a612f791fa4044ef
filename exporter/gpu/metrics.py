"""The GPU side's metric families, one ``MetricDef`` row each (see ``definitions``).

A row with a ``field`` is a plain per-GPU metric: the ``GpuReading`` attribute of that
name, absent where it is None; ``GpuCollector`` fills the named others.
"""

from __future__ import annotations

from typing import Final

from gpuscope.exporter.definitions import MetricDef, MetricType

GAUGE, COUNTER = MetricType.GAUGE, MetricType.COUNTER
GPU_LABELS: Final = ("gpu", "uuid")

INFO = MetricDef(
    "gpuscope_gpu_info",
    GAUGE,
    "Descriptive labels of each GPU; join on gpu and uuid.",
    (*GPU_LABELS, "name", "pci_bus_id", "numa_node", "driver_version"),
)
UP = MetricDef(
    "gpuscope_gpu_up",
    GAUGE,
    "1 if the GPU could be read in the last poll, else 0.",
    GPU_LABELS,
)
CLOCK_EVENT_ACTIVE = MetricDef(
    "gpuscope_gpu_clock_event_active",
    GAUGE,
    "1 while the clock event reason holds clocks down (or idle), else 0.",
    (*GPU_LABELS, "reason"),
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
    (*GPU_LABELS, "xid"),
)
ECC_ERRORS = MetricDef(
    "gpuscope_gpu_ecc_errors",
    COUNTER,
    "ECC errors as counted by the driver.",
    (*GPU_LABELS, "type"),
)
PROCESS_JOIN_STATUS = MetricDef(
    "gpuscope_gpu_process_join_status",
    GAUGE,
    "1 for the state of the join of span pids to the GPUs their processes hold "
    "(ok, pending, no_permission, not_supported, other_pid_namespace), 0 for the others.",
    ("status",),
)
PROCESS_JOIN_PROCESSES = MetricDef(
    "gpuscope_gpu_process_join_processes",
    GAUGE,
    "Processes on the GPUs at the last listing that the exporter can join spans to.",
)
COLLECTOR_SUCCESS = MetricDef(
    "gpuscope_collector_success",
    GAUGE,
    "1 if the collector's last run succeeded, else 0.",
    ("collector",),
)
COLLECTOR_DURATION = MetricDef(
    "gpuscope_collector_duration_seconds",
    GAUGE,
    "How long the collector's last run took.",
    ("collector",),
)

# The plain per-GPU rows: one sample per GPU from one ``GpuReading`` attribute.
PER_GPU: Final[tuple[MetricDef, ...]] = (
    MetricDef(
        "gpuscope_gpu_sm_clock_hertz",
        GAUGE,
        "SM clock.",
        GPU_LABELS,
        field="sm_clock_hz",
    ),
    MetricDef(
        "gpuscope_gpu_sm_clock_max_hertz",
        GAUGE,
        "Maximum SM clock.",
        GPU_LABELS,
        field="sm_clock_max_hz",
    ),
    MetricDef(
        "gpuscope_gpu_memory_clock_hertz",
        GAUGE,
        "Memory clock.",
        GPU_LABELS,
        field="memory_clock_hz",
    ),
    MetricDef(
        "gpuscope_gpu_memory_clock_max_hertz",
        GAUGE,
        "Maximum memory clock.",
        GPU_LABELS,
        field="memory_clock_max_hz",
    ),
    MetricDef(
        "gpuscope_gpu_utilization_ratio",
        GAUGE,
        "Fraction of time a kernel ran (NVML utilization; coarse, see sm_active).",
        GPU_LABELS,
        field="utilization_ratio",
    ),
    MetricDef(
        "gpuscope_gpu_sm_occupancy_ratio",
        GAUGE,
        "Resident warps over the SMs' warp capacity (GPM/DCGM).",
        GPU_LABELS,
        field="sm_occupancy_ratio",
    ),
    MetricDef(
        "gpuscope_gpu_sm_active_ratio",
        GAUGE,
        "Fraction of SMs busy (GPM/DCGM).",
        GPU_LABELS,
        field="sm_active_ratio",
    ),
    MetricDef(
        "gpuscope_gpu_tensor_active_ratio",
        GAUGE,
        "Fraction of time tensor cores were busy (GPM/DCGM).",
        GPU_LABELS,
        field="tensor_active_ratio",
    ),
    MetricDef(
        "gpuscope_gpu_dram_active_ratio",
        GAUGE,
        "DRAM bandwidth used over its maximum (GPM/DCGM).",
        GPU_LABELS,
        field="dram_active_ratio",
    ),
    MetricDef(
        "gpuscope_gpu_pcie_link_generation",
        GAUGE,
        "Current PCIe link generation.",
        GPU_LABELS,
        field="pcie_link_generation",
    ),
    MetricDef(
        "gpuscope_gpu_pcie_link_width",
        GAUGE,
        "Current PCIe link width (lanes).",
        GPU_LABELS,
        field="pcie_link_width",
    ),
    MetricDef(
        "gpuscope_gpu_memory_used_bytes",
        GAUGE,
        "Device memory in use.",
        GPU_LABELS,
        field="memory_used_bytes",
    ),
    MetricDef(
        "gpuscope_gpu_memory_total_bytes",
        GAUGE,
        "Device memory in total.",
        GPU_LABELS,
        field="memory_total_bytes",
    ),
    MetricDef(
        "gpuscope_gpu_power_watts",
        GAUGE,
        "Power draw.",
        GPU_LABELS,
        field="power_watts",
    ),
    MetricDef(
        "gpuscope_gpu_power_limit_watts",
        GAUGE,
        "Enforced power limit.",
        GPU_LABELS,
        field="power_limit_watts",
    ),
    MetricDef(
        "gpuscope_gpu_temperature_celsius",
        GAUGE,
        "GPU core temperature.",
        GPU_LABELS,
        field="temperature_celsius",
    ),
    MetricDef(
        "gpuscope_gpu_pcie_transmit_bytes",
        COUNTER,
        "Bytes sent by the GPU over PCIe.",
        GPU_LABELS,
        field="pcie_transmit_bytes_total",
    ),
    MetricDef(
        "gpuscope_gpu_pcie_receive_bytes",
        COUNTER,
        "Bytes received by the GPU over PCIe.",
        GPU_LABELS,
        field="pcie_receive_bytes_total",
    ),
    MetricDef(
        "gpuscope_gpu_energy_joules",
        COUNTER,
        "Energy consumed by the GPU.",
        GPU_LABELS,
        field="energy_joules_total",
    ),
)

GPU_METRICS: Final[tuple[MetricDef, ...]] = (
    INFO,
    UP,
    *PER_GPU,
    CLOCK_EVENT_ACTIVE,
    XID_EVENTS,
    XID_ERRORS,
    ECC_ERRORS,
    PROCESS_JOIN_STATUS,
    PROCESS_JOIN_PROCESSES,
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
)
