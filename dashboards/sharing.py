"""The GPU board's "Sharing and topology" row: who shares each GPU (processes, their SM
and memory use, MPS, contention), where each process runs against the GPU's NUMA node,
NVLink traffic beside PCIe, and whether the SM clock is steady (locked) or swings."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards.panels import HALF, RATE, THIRD, query, row, selector, table_panel, timeseries
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract.rows import MetricDef
from pack.contract import GPU_INDEX, series

GPU = selector("job", "instance", GPU_INDEX)
PER_GPU = f"instance, {GPU_INDEX}"
LEGEND = "{{instance}} GPU {{gpu}}"
PER_PROCESS = f"{PER_GPU}, pid"
PROCESS_LEGEND = "{{instance}} GPU {{gpu}} pid {{pid}}"


def _max(row_: MetricDef, by: str = PER_GPU) -> str:
    return f"max by ({by}) ({series(row_)}{GPU})"


def sharing_row(board: Dashboard) -> None:
    board.with_row(row("Sharing and topology"))
    board.with_panel(
        timeseries(
            "Processes, MPS clients and contention",
            "Compute processes on each GPU (a MIG instance is a GPU of its own), those "
            "that reach it through MPS, and 1 while several time-slice it without MPS "
            "(GpuscopeGpuContended).",
            [
                query(_max(gpu_rows.COMPUTE_PROCESSES), f"{LEGEND} processes"),
                query(_max(gpu_rows.MPS_PROCESSES), f"{LEGEND} MPS clients"),
                query(_max(gpu_rows.CONTENDED), f"{LEGEND} contended"),
            ],
            "short",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "SM use per process",
            "Fraction of time each process's kernels ran (NVML per-process utilisation); "
            "pid __overflow__ sums the processes past --max-series.",
            [query(_max(gpu_rows.PROCESS_SM_UTILIZATION, PER_PROCESS), PROCESS_LEGEND)],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    board.with_panel(
        timeseries(
            "Memory per process",
            "Device memory each process holds.",
            [query(_max(gpu_rows.PROCESS_MEMORY_USED, PER_PROCESS), PROCESS_LEGEND)],
            "bytes",
            THIRD,
            stacked=True,
        )
    )
    board.with_panel(
        timeseries(
            "NVLink beside PCIe",
            "Bytes per second over all NVLinks (a tensor-parallel group's all-reduce) and "
            "over PCIe (host copies); no NVLink series: no NVLink, or MIG mode.",
            [
                query(f"sum by ({PER_GPU}) (rate({series(row_)}{GPU}[{RATE}]))", legend)
                for row_, legend in (
                    (gpu_rows.NVLINK_TRANSMIT, f"{LEGEND} NVLink tx"),
                    (gpu_rows.NVLINK_RECEIVE, f"{LEGEND} NVLink rx"),
                    (gpu_rows.PCIE_TRANSMIT, f"{LEGEND} PCIe tx"),
                    (gpu_rows.PCIE_RECEIVE, f"{LEGEND} PCIe rx"),
                )
            ],
            "Bps",
            HALF,
        )
    )
    board.with_panel(
        timeseries(
            "SM clock changes",
            "How often per second the SM clock changed between polls: 0 under load for a "
            "locked clock (nvidia-smi -lgc), more for one that swings.",
            [
                query(
                    f"sum by ({PER_GPU}) (rate({series(gpu_rows.SM_CLOCK_CHANGES)}{GPU}[{RATE}]))",
                    LEGEND,
                )
            ],
            "ops",
            HALF,
        )
    )
    board.with_panel(
        table_panel(
            "NUMA locality per process",
            "Where each process on a GPU may run against the GPU's NUMA side: local, split "
            "(unbound) or remote; gpuscope doctor prints the numactl line that fixes it.",
            [
                query(
                    f"max by ({PER_PROCESS}, locality) "
                    f"({series(gpu_rows.PROCESS_NUMA_LOCALITY)}{GPU})",
                    f"{PROCESS_LEGEND} {{{{locality}}}}",
                ).instant()
            ],
            {"Value": "on"},
        )
    )
