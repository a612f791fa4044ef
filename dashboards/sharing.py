"""The "Sharing and topology" row, on the GPU board and on "Where did the time go": who
shares each GPU (processes, their SM and memory use, MPS, the compute mode, contention,
MIG instances), where each process runs against the GPU's NUMA node, NVLink traffic
beside PCIe, and whether the SM clock is steady (locked) or swings.

The row is built over a ``Scope``: the GPU board selects GPUs by its job, instance and
GPU variables; the verdict board keeps the GPUs of its hosts (the rules' GPU-to-host
map), so the row sits under the verdicts it explains."""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards.panels import (
    HALF,
    QUARTER,
    RATE,
    THIRD,
    query,
    row,
    selector,
    stat_panel,
    table_panel,
    timeseries,
)
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract.rows import MetricDef
from pack.contract import COMPUTE_MODE, GPU_INDEX, LOCALITY, MIG_LABELS, UUID, series

PER_GPU = f"instance, {GPU_INDEX}"
LEGEND = "{{instance}} GPU {{gpu}}"
PER_PROCESS = f"{PER_GPU}, pid"
PROCESS_LEGEND = "{{instance}} GPU {{gpu}} pid {{pid}}"


@dataclass(frozen=True)
class Scope:
    """Which GPUs a board's row shows: ``gpu``, the selector of their series, and
    ``keep``, an ``and on (...)`` clause after it (or after a rate of it) that keeps
    only the board's GPUs; empty where the selector does."""

    title: str
    gpu: str
    keep: str = ""

    def of(self, row_: MetricDef, extra: str = "") -> str:
        return self._kept(f"{series(row_)}{self.gpu}{extra}")

    def rate(self, row_: MetricDef) -> str:
        return self._kept(f"rate({series(row_)}{self.gpu}[{RATE}])")

    def _kept(self, expr: str) -> str:
        return f"{expr}\n{self.keep}" if self.keep else expr


GPU_BOARD = Scope("Sharing and topology", selector("job", "instance", GPU_INDEX))


def _max(scope: Scope, row_: MetricDef, by: str = PER_GPU) -> str:
    return f"max by ({by}) ({scope.of(row_)})"


def sharing_row(board: Dashboard, scope: Scope = GPU_BOARD) -> None:
    board.with_row(row(scope.title))
    board.with_panel(
        timeseries(
            "Processes, MPS clients and contention",
            "Compute processes on each GPU (a MIG instance is a GPU of its own), those "
            "that reach it through MPS, and 1 while several time-slice it without MPS "
            "(GpuscopeGpuContended fires when that holds under compute-bound requests).",
            [
                query(_max(scope, gpu_rows.COMPUTE_PROCESSES), f"{LEGEND} processes"),
                query(_max(scope, gpu_rows.MPS_PROCESSES), f"{LEGEND} MPS clients"),
                query(_max(scope, gpu_rows.CONTENDED), f"{LEGEND} contended"),
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
            [query(_max(scope, gpu_rows.PROCESS_SM_UTILIZATION, PER_PROCESS), PROCESS_LEGEND)],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    board.with_panel(
        timeseries(
            "Memory per process",
            "Device memory each process holds.",
            [query(_max(scope, gpu_rows.PROCESS_MEMORY_USED, PER_PROCESS), PROCESS_LEGEND)],
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
                query(f"sum by ({PER_GPU}) ({scope.rate(row_)})", legend)
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
            "locked clock (nvidia-smi -lgc), more for one that swings "
            "(GpuscopeGpuClockUnlocked fires when it swings under compute-bound requests).",
            [query(f"sum by ({PER_GPU}) ({scope.rate(gpu_rows.SM_CLOCK_CHANGES)})", LEGEND)],
            "ops",
            HALF,
        )
    )
    board.with_panel(
        timeseries(
            "SM clock and its target",
            "The SM clock and the applications clock target NVML reports (nvidia-smi -ac; "
            "absent where the driver deprecates it, R590 on Hopper and Ada). A MIG "
            "instance's clock is its parent GPU's.",
            [
                query(_max(scope, gpu_rows.SM_CLOCK), f"{LEGEND} clock"),
                query(_max(scope, gpu_rows.SM_CLOCK_TARGET), f"{LEGEND} target"),
            ],
            "hertz",
            HALF,
        )
    )
    board.with_panel(
        table_panel(
            "Compute mode",
            "Each GPU's compute mode: default (any number of processes time-slice it), "
            "exclusive_process (one process, or one MPS server) or prohibited.",
            [
                query(
                    f"max by ({PER_GPU}, {COMPUTE_MODE}) ({scope.of(gpu_rows.COMPUTE_MODE)} == 1)",
                    f"{LEGEND} {{{{mode}}}}",
                )
            ],
            {"Value": "on"},
            QUARTER,
        )
    )
    board.with_panel(
        stat_panel(
            "NVLinks",
            "NVLinks of each GPU (NVML's link count); none: PCIe only, or MIG mode.",
            [query(_max(scope, gpu_rows.NVLINK_LINKS), LEGEND)],
            "short",
            QUARTER,
            graph=False,
        )
    )
    board.with_panel(
        table_panel(
            "MIG instances",
            "Each MIG instance served as a GPU of its own: its parent GPU, profile and GPU "
            "and compute instance ids. Its clocks, power, PCIe and GPM are the parent's.",
            [
                query(
                    f"max by ({PER_GPU}, {UUID}, {', '.join(MIG_LABELS)}) "
                    f"({scope.of(gpu_rows.MIG_INFO)})",
                    f"{LEGEND} {{{{profile}}}}",
                )
            ],
            {"Value": "on"},
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
                    f"max by ({PER_PROCESS}, {LOCALITY}) "
                    f"({scope.of(gpu_rows.PROCESS_NUMA_LOCALITY)})",
                    f"{PROCESS_LEGEND} {{{{locality}}}}",
                ).instant()
            ],
            {"Value": "on"},
            HALF,
        )
    )
