"""GPU: activity, clocks and why they are held down, PCIe, memory, power, errors, collector."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.builders.prometheus import Dataquery

from dashboards.panels import (
    FULL,
    GPU_CHAIN,
    HALF,
    QUARTER,
    RATE,
    THIRD,
    Size,
    gauge_panel,
    new_dashboard,
    query,
    row,
    selector,
    stat_panel,
    state_timeline,
    table_panel,
    thresholds,
    timeseries,
)
from dashboards.sharing import sharing_row
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract.rows import MetricDef
from pack.contract import (
    COLLECTOR,
    DRIVER_VERSION,
    ECC_TYPE,
    GPU_INDEX,
    GPU_NAME,
    JOIN_STATUS,
    NUMA_NODE,
    PCI_BUS_ID,
    REASON,
    UUID,
    XID,
    series,
)
from pack.pcie import capacity_expr

UID = "gpuscope-gpu"
GPU = selector("job", "instance", GPU_INDEX)
EXPORTER = selector("job", "instance")
LEGEND = "{{instance}} GPU {{gpu}}"
# by instance too: GPU indexes repeat on every host, and "All" spans hosts
PER_GPU = f"instance, {GPU_INDEX}"
# dcgm-exporter (through the rules of alerts/rules/dcgm-exporter.yml) repeats a GPU's
# series on every pod sharing it and on every MIG instance (``GPU_I_ID``); gpuscope's
# exporter serves one series per GPU, without that label. So no panel adds series up
# as they come: the GPU's own fields (clocks, power, temperature, its link) are taken
# once per GPU with ``max``, an instance's own (activity, memory, PCIe traffic) once per
# instance, and added up per GPU where the panel is per GPU.
MIG_INSTANCE = "GPU_I_ID"
PER_INSTANCE = f"{PER_GPU}, {MIG_INSTANCE}"
INSTANCE_LEGEND = f"{LEGEND} {{{{{MIG_INSTANCE}}}}}"
# One GPU of the fleet: the target, its index and its UUID.
ONE_GPU = f"job, {PER_GPU}, {UUID}"
# What a panel over a field that dcgm-exporter's default counters leave out says: the
# counters-file line (docs/gpu.md, "The counters file") that brings it.
DCGM_COUNTERS = "docs/gpu.md, The counters file"


def needs_counters(*fields: str, subject: str = "this panel") -> str:
    """The description's sentence for fields outside dcgm-exporter's default counters."""
    lines = " and ".join(f"`{field}`" for field in fields)
    plural = "s" if len(fields) > 1 else ""
    return (
        f" With dcgm-exporter, {subject} needs the counters-file line{plural} {lines} "
        f"({DCGM_COUNTERS})."
    )


def no_counters(*fields: str) -> str:
    """The no-data text of such a panel."""
    return f"No data (dcgm-exporter: add {', '.join(fields)} to its counters file)"


# How far back an XID counter's previous value is looked for (across a gap in its series)
XID_LOOKBACK = "1h"


def new_events(row: MetricDef, by: str) -> str:
    """The events counter ``row`` counted within each step of the graph, as a whole
    number: the counter's rise since its last value before the step (not ``increase()``,
    which extrapolates to fractions and misses a series' first value). A series that
    appears (a code's first XID: the exporter serves a code from its first event on)
    or restarts (the exporter did) counts its whole value: ``or`` on the counter."""
    counter = f"{series(row)}{GPU}"
    previous = f"last_over_time({counter}[{XID_LOOKBACK}] offset $__interval)"
    # max, not sum: dcgm-exporter's XID series repeat per MIG instance of the GPU
    return f"max by ({by}) (\n  ({counter} - {previous}) >= 0\n  or\n  {counter}\n)"


def per_gpu(row: MetricDef, legend: str = LEGEND) -> list[Dataquery]:
    """A field of the whole GPU, once per GPU."""
    return [query(f"max by ({PER_GPU}) ({series(row)}{GPU})", legend)]


def per_instance(row: MetricDef, legend: str = INSTANCE_LEGEND) -> list[Dataquery]:
    """A field of each MIG instance (of the GPU where it is not in MIG mode)."""
    return [query(f"max by ({PER_INSTANCE}) ({series(row)}{GPU})", legend)]


def instances_added(row: MetricDef, legend: str = LEGEND) -> list[Dataquery]:
    """A field of each MIG instance, added up per GPU (its memory)."""
    return [
        query(f"sum by ({PER_GPU}) (\n  max by ({PER_INSTANCE}) ({series(row)}{GPU})\n)", legend)
    ]


def fleet(aggregation: str, row: MetricDef) -> str:
    """``aggregation`` over the selected GPUs of the GPU-wide ``row``, each GPU once."""
    return f"{aggregation} (max by ({ONE_GPU}) ({series(row)}{GPU}))"


def build() -> Dashboard:
    board = new_dashboard(
        UID,
        "gpuscope / GPU",
        "Per-GPU counters from the exporter's GPU source (NVML or simulated): is the "
        "GPU busy, throttled, limited by PCIe, short of memory or failing?",
        GPU_CHAIN,
    )
    _fleet(board)
    _health(board)
    _activity(board)
    _clocks(board)
    _pcie(board)
    _memory_power(board)
    _errors(board)
    sharing_row(board)  # dashboards/sharing.py
    return board


def _fleet(board: Dashboard) -> None:
    """The selected GPUs as one fleet, as dcgm-exporter's board opens: how many answer,
    how hot they run on average, what they draw in total and against their limits."""
    board.with_row(row("Fleet"))
    size = Size(6, 6)
    board.with_panel(
        stat_panel(
            "GPUs up",
            "GPUs that answered their last poll, of those the exporters know.",
            [
                query(fleet("sum", gpu_rows.UP), "up"),
                query(fleet("count", gpu_rows.UP), "known"),
            ],
            "none",
            size,
            graph=False,
        )
    )
    board.with_panel(
        gauge_panel(
            "Average temperature",
            "Mean core temperature of the selected GPUs. Data-centre GPUs start slowing "
            "their clocks in the mid-80s °C (see Clock event reasons).",
            [query(fleet("avg", gpu_rows.TEMPERATURE), "average")],
            "celsius",
            thresholds("green", (75, "orange"), (85, "red")),
            size,
            low=0,
            high=100,
        )
    )
    board.with_panel(
        stat_panel(
            "Total power",
            "Power the selected GPUs draw together, and their enforced limits added up."
            + needs_counters("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
            [
                query(fleet("sum", gpu_rows.POWER), "drawn"),
                query(fleet("sum", gpu_rows.POWER_LIMIT), "limit"),
            ],
            "watt",
            size,
        )
    )
    board.with_panel(
        gauge_panel(
            "Power against limit",
            "Total power over the total enforced limit; near 100 % the GPUs cap their "
            "clocks to stay under it (sw_power_cap)."
            + needs_counters("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
            [
                query(
                    f"{fleet('sum', gpu_rows.POWER)}\n/\n"
                    f"({fleet('sum', gpu_rows.POWER_LIMIT)} > 0)",
                    "of limit",
                )
            ],
            "percentunit",
            thresholds("green", (0.8, "orange"), (0.95, "red")),
            size,
            low=0,
            high=1,
        )
    )
    info = series(gpu_rows.INFO)
    board.with_panel(
        table_panel(
            "GPUs",
            f"Each GPU's model, driver, PCI bus and NUMA node ({gpu_rows.INFO.name}), with its "
            "PCIe link's current generation and width.",
            [
                query(
                    f"max by ({PER_GPU}, {UUID}, {GPU_NAME}, {DRIVER_VERSION}, {PCI_BUS_ID}, "
                    f"{NUMA_NODE}) "
                    f"({info}{GPU})",
                    LEGEND,
                ),
                query(
                    f"max by ({PER_GPU}, {UUID}) ({series(gpu_rows.PCIE_LINK_GENERATION)}{GPU})",
                    LEGEND,
                ),
                query(
                    f"max by ({PER_GPU}, {UUID}) ({series(gpu_rows.PCIE_LINK_WIDTH)}{GPU})", LEGEND
                ),
            ],
            {"Value #B": "PCIe generation", "Value #C": "PCIe lanes"},
            Size(FULL.width, 6),
        )
    )


def _health(board: Dashboard) -> None:
    board.with_row(row("Health"))
    board.with_panel(
        stat_panel(
            "GPU up",
            "1 if the GPU could be read in the last poll; 0 for a lost GPU (XID 79, fallen "
            "off the bus).",
            per_gpu(gpu_rows.UP),
            "bool_yes_no",
        )
    )
    board.with_panel(
        stat_panel(
            "Collector success",
            "1 if the GPU collector's last run succeeded (gpuscope's exporter only: "
            "dcgm-exporter serves no collector health).",
            [
                query(
                    f"min by (instance, {COLLECTOR}) "
                    f"({series(gpu_rows.COLLECTOR_SUCCESS)}{EXPORTER})",
                    "{{instance}} {{collector}}",
                )
            ],
            "bool_yes_no",
        )
    )
    board.with_panel(
        timeseries(
            "Collector duration",
            "How long the GPU collector's last run took (it runs in the background, never "
            "during a scrape; gpuscope's exporter only).",
            [
                query(
                    f"max by (instance, {COLLECTOR}) "
                    f"({series(gpu_rows.COLLECTOR_DURATION)}{EXPORTER})",
                    "{{instance}} {{collector}}",
                )
            ],
            "s",
            HALF,
        )
    )
    board.with_panel(
        timeseries(
            "Readings age",
            "Seconds since the GPU readings served were taken: about the poll interval, "
            "growing while a poll is stuck (gpuscope's exporter only).",
            [
                query(
                    f"max by (instance) ({series(gpu_rows.SAMPLE_AGE)}{EXPORTER})",
                    "{{instance}}",
                )
            ],
            "s",
            HALF,
        )
    )
    board.with_panel(
        table_panel(
            "Why a GPU is down",
            "The reason of each GPU that reads up 0 (lost, reset_required, poll_overdue, "
            "released, ...); empty while every GPU answers (gpuscope's exporter only).",
            [
                query(
                    f"max by ({PER_GPU}, {UUID}, {REASON}) "
                    f"({series(gpu_rows.DOWN_REASON)}{GPU} == 1)",
                    f"{LEGEND} {{{{reason}}}}",
                )
            ],
            {"Value": "down"},
            QUARTER,
        )
    )
    board.with_panel(
        stat_panel(
            "Process join",
            "The state of the join of span pids to the GPUs their processes hold (ok, "
            "pending, no_permission, other_pid_namespace, ...; gpuscope doctor says why) "
            "and the processes on the GPUs it can join spans to (gpuscope's exporter only).",
            [
                query(
                    f"max by (instance, {JOIN_STATUS}) "
                    f"({series(gpu_rows.PROCESS_JOIN_STATUS)}{EXPORTER} == 1)",
                    "{{instance}} {{status}}",
                ),
                query(
                    f"max by (instance) ({series(gpu_rows.PROCESS_JOIN_PROCESSES)}{EXPORTER})",
                    "{{instance}} processes",
                ),
            ],
            "short",
            graph=False,
        )
    )


def _activity(board: Dashboard) -> None:
    board.with_row(row("Activity"))
    board.with_panel(
        timeseries(
            "SM occupancy",
            "Resident warps over the SMs' warp capacity (GPM). Under ~70 % while "
            "requests queue means the batcher is not feeding the GPU. Per MIG instance "
            "where the GPU is in MIG mode." + needs_counters("DCGM_FI_PROF_SM_OCCUPANCY"),
            per_instance(gpu_rows.SM_OCCUPANCY),
            "percentunit",
            THIRD,
            max_value=1,
            no_value=no_counters("DCGM_FI_PROF_SM_OCCUPANCY"),
        )
    )
    board.with_panel(
        timeseries(
            "SM, tensor and DRAM activity",
            "Fraction of SMs busy, of time tensor cores were busy, and of peak DRAM bandwidth "
            "used (GPM), per MIG instance where the GPU is in MIG mode."
            + needs_counters("DCGM_FI_PROF_SM_ACTIVE"),
            [
                query(
                    f"max by ({PER_INSTANCE}) ({series(gauge)}{GPU})",
                    f"{INSTANCE_LEGEND} {name}",
                )
                for name, gauge in (
                    ("sm", gpu_rows.SM_ACTIVE),
                    ("tensor", gpu_rows.TENSOR_ACTIVE),
                    ("dram", gpu_rows.DRAM_ACTIVE),
                )
            ],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    board.with_panel(
        timeseries(
            "Utilization",
            "Fraction of time any kernel ran (NVML's coarse utilization; see SM activity).",
            per_instance(gpu_rows.UTILIZATION),
            "percentunit",
            THIRD,
            max_value=1,
        )
    )


def _clocks(board: Dashboard) -> None:
    board.with_row(row("Clocks"))
    for title, clock, most, field in (
        ("SM clock", gpu_rows.SM_CLOCK, gpu_rows.SM_CLOCK_MAX, "DCGM_FI_DEV_MAX_SM_CLOCK"),
        (
            "Memory clock",
            gpu_rows.MEMORY_CLOCK,
            gpu_rows.MEMORY_CLOCK_MAX,
            "DCGM_FI_DEV_MAX_MEM_CLOCK",
        ),
    ):
        board.with_panel(
            timeseries(
                f"{title} against its maximum",
                f"Current {title.lower()} and the maximum it could run at."
                + needs_counters(field, subject="the maximum"),
                [
                    *per_gpu(clock, "{{instance}} GPU {{gpu}}"),
                    *per_gpu(most, "{{instance}} GPU {{gpu}} max"),
                ],
                "hertz",
                THIRD,
            )
        )
    board.with_panel(
        state_timeline(
            "Clock event reasons",
            "Reasons that hold the clocks down while active: thermal or power reasons under "
            "load mean the hardware is throttling; gpu_idle is harmless."
            + needs_counters("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
            [
                query(
                    f"max by ({PER_GPU}, {REASON}) ({series(gpu_rows.CLOCK_EVENT_ACTIVE)}{GPU})",
                    "{{instance}} GPU {{gpu}} {{reason}}",
                )
            ],
            THIRD,
            no_value=no_counters("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        )
    )


def _pcie(board: Dashboard) -> None:
    board.with_row(row("PCIe"))
    for direction, verb, counter in (
        ("TX", "transmit", gpu_rows.PCIE_TRANSMIT),
        ("RX", "receive", gpu_rows.PCIE_RECEIVE),
    ):
        board.with_panel(
            timeseries(
                f"PCIe {direction} against link capacity",
                f"Bytes per second the GPU {verb}s over PCIe, and what its current link "
                "(generation x width, after line coding) can carry per direction, the "
                "instances of a MIG GPU added up."
                + needs_counters(
                    "DCGM_FI_DEV_PCIE_LINK_GEN",
                    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
                    subject="the capacity",
                ),
                [
                    query(
                        f"sum by ({PER_GPU}) (\n  max by ({PER_INSTANCE}) "
                        f"(rate({series(counter)}{GPU}[{RATE}]))\n)",
                        "{{instance}} GPU {{gpu}}",
                    ),
                    query(
                        f"max by ({PER_GPU}) ({capacity_expr(GPU)})",
                        "{{instance}} GPU {{gpu}} capacity",
                    ),
                ],
                "Bps",
            )
        )


def _memory_power(board: Dashboard) -> None:
    board.with_row(row("Memory, power, temperature"))
    board.with_panel(
        timeseries(
            "Memory used against total",
            "Device memory allocated by processes, the driver's reserved memory (NVML memory "
            "v2; absent on drivers that give v1 only, whose used includes it) and the total; "
            "a MIG GPU's instances added up.",
            [
                *instances_added(gpu_rows.MEMORY_USED, "{{instance}} GPU {{gpu}} used"),
                *instances_added(gpu_rows.MEMORY_RESERVED, "{{instance}} GPU {{gpu}} reserved"),
                *instances_added(gpu_rows.MEMORY_TOTAL, "{{instance}} GPU {{gpu}} total"),
            ],
            "bytes",
            QUARTER,
        )
    )
    board.with_panel(
        timeseries(
            "Power against limit",
            "Power draw and the enforced power limit."
            + needs_counters("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
            [
                *per_gpu(gpu_rows.POWER, "{{instance}} GPU {{gpu}}"),
                *per_gpu(gpu_rows.POWER_LIMIT, "{{instance}} GPU {{gpu}} limit"),
            ],
            "watt",
            QUARTER,
        )
    )
    board.with_panel(
        timeseries(
            "Temperature",
            "GPU core temperature.",
            per_gpu(gpu_rows.TEMPERATURE),
            "celsius",
            QUARTER,
        )
    )
    board.with_panel(
        stat_panel(
            "Energy over the time range",
            "Energy the GPU consumed over the dashboard's time range.",
            [
                query(
                    f"max by ({PER_GPU}) (increase({series(gpu_rows.ENERGY)}{GPU}[$__range]))",
                    LEGEND,
                )
            ],
            "joule",
        )
    )


def _errors(board: Dashboard) -> None:
    board.with_row(row("Errors"))
    board.with_panel(
        timeseries(
            "XID errors",
            "XID errors in each interval of the graph, counted exactly: all codes per GPU, "
            "and by code (48: double-bit ECC, 79: fallen off the bus, ...). A code's "
            "first XID shows at once, with its code; XIDs while the GPU's series were "
            f"absent (up to {XID_LOOKBACK}) show when they return.",
            [
                query(
                    new_events(gpu_rows.XID_EVENTS, PER_GPU), "{{instance}} GPU {{gpu}} all codes"
                ),
                query(
                    new_events(gpu_rows.XID_ERRORS, f"{PER_GPU}, {XID}"),
                    "{{instance}} GPU {{gpu}} XID {{xid}}",
                ),
            ],
            "short",
            decimals=0,
        )
    )
    board.with_panel(
        timeseries(
            "ECC errors",
            "ECC errors counted by the driver, by type; any uncorrected error needs action."
            + needs_counters("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
            [
                query(
                    f"max by ({PER_GPU}, {ECC_TYPE}) "
                    f"(increase({series(gpu_rows.ECC_ERRORS)}{GPU}[{RATE}]))",
                    "{{instance}} GPU {{gpu}} {{type}}",
                )
            ],
            "short",
        )
    )
