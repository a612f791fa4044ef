"""GPU: activity, clocks and why they are held down, PCIe, memory, power, errors, collector."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.builders.prometheus import Dataquery

from dashboards.panels import (
    GPU_CHAIN,
    HALF,
    QUARTER,
    RATE,
    THIRD,
    new_dashboard,
    query,
    row,
    selector,
    stat_panel,
    state_timeline,
    timeseries,
)
from dashboards.pcie import capacity_expr

UID = "gpuscope-gpu"
GPU = selector("job", "instance", "gpu")
EXPORTER = selector("job", "instance")
LEGEND = "{{instance}} GPU {{gpu}}"


def per_gpu(metric: str, legend: str = LEGEND) -> list[Dataquery]:
    # by instance too: GPU indexes repeat on every host, and "All" spans hosts
    return [query(f"max by (instance, gpu) ({metric}{GPU})", legend)]


def build() -> Dashboard:
    board = new_dashboard(
        UID,
        "gpuscope / GPU",
        "Per-GPU counters from the exporter's GPU source (NVML, DCGM or simulated): is the "
        "GPU busy, throttled, limited by PCIe, short of memory or failing?",
        GPU_CHAIN,
    )
    _health(board)
    _activity(board)
    _clocks(board)
    _pcie(board)
    _memory_power(board)
    _errors(board)
    return board


def _health(board: Dashboard) -> None:
    board.with_row(row("Health"))
    board.with_panel(
        stat_panel(
            "GPU up",
            "1 if the GPU could be read in the last poll; 0 for a lost GPU (XID 79, fallen "
            "off the bus).",
            per_gpu("gpuscope_gpu_up"),
            "bool_yes_no",
        )
    )
    board.with_panel(
        stat_panel(
            "Collector success",
            "1 if the GPU collector's last run succeeded.",
            [
                query(
                    f"min by (instance, collector) (gpuscope_collector_success{EXPORTER})",
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
            "during a scrape).",
            [
                query(
                    f"max by (instance, collector) (gpuscope_collector_duration_seconds{EXPORTER})",
                    "{{instance}} {{collector}}",
                )
            ],
            "s",
            HALF,
        )
    )


def _activity(board: Dashboard) -> None:
    board.with_row(row("Activity"))
    board.with_panel(
        timeseries(
            "SM occupancy",
            "Resident warps over the SMs' warp capacity (GPM/DCGM). Under ~70 % while "
            "requests queue means the batcher is not feeding the GPU.",
            per_gpu("gpuscope_gpu_sm_occupancy_ratio"),
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    board.with_panel(
        timeseries(
            "SM, tensor and DRAM activity",
            "Fraction of SMs busy, of time tensor cores were busy, and of peak DRAM bandwidth "
            "used (GPM/DCGM).",
            [
                query(
                    f"max by (instance, gpu) (gpuscope_gpu_{name}_active_ratio{GPU})",
                    f"{LEGEND} {name}",
                )
                for name in ("sm", "tensor", "dram")
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
            per_gpu("gpuscope_gpu_utilization_ratio"),
            "percentunit",
            THIRD,
            max_value=1,
        )
    )


def _clocks(board: Dashboard) -> None:
    board.with_row(row("Clocks"))
    for name, title in (("sm", "SM clock"), ("memory", "Memory clock")):
        board.with_panel(
            timeseries(
                f"{title} against its maximum",
                f"Current {title.lower()} and the maximum it could run at.",
                [
                    *per_gpu(f"gpuscope_gpu_{name}_clock_hertz", "{{instance}} GPU {{gpu}}"),
                    *per_gpu(
                        f"gpuscope_gpu_{name}_clock_max_hertz", "{{instance}} GPU {{gpu}} max"
                    ),
                ],
                "hertz",
                THIRD,
            )
        )
    board.with_panel(
        state_timeline(
            "Clock event reasons",
            "Reasons that hold the clocks down while active: thermal or power reasons under "
            "load mean the hardware is throttling; gpu_idle is harmless.",
            [
                query(
                    f"max by (instance, gpu, reason) (gpuscope_gpu_clock_event_active{GPU})",
                    "{{instance}} GPU {{gpu}} {{reason}}",
                )
            ],
            THIRD,
        )
    )


def _pcie(board: Dashboard) -> None:
    board.with_row(row("PCIe"))
    for direction, metric in (("TX", "transmit"), ("RX", "receive")):
        board.with_panel(
            timeseries(
                f"PCIe {direction} against link capacity",
                f"Bytes per second the GPU {metric}s over PCIe, and what its current link "
                "(generation x width, after line coding) can carry per direction.",
                [
                    query(_pcie_rate(metric), "{{instance}} GPU {{gpu}}"),
                    query(
                        f"max by (instance, gpu) ({capacity_expr(GPU)})",
                        "{{instance}} GPU {{gpu}} capacity",
                    ),
                ],
                "Bps",
            )
        )


def _pcie_rate(metric: str) -> str:
    return f"sum by (instance, gpu) (rate(gpuscope_gpu_pcie_{metric}_bytes_total{GPU}[{RATE}]))"


def _memory_power(board: Dashboard) -> None:
    board.with_row(row("Memory, power, temperature"))
    board.with_panel(
        timeseries(
            "Memory used against total",
            "Device memory in use and in total.",
            [
                *per_gpu("gpuscope_gpu_memory_used_bytes", "{{instance}} GPU {{gpu}} used"),
                *per_gpu("gpuscope_gpu_memory_total_bytes", "{{instance}} GPU {{gpu}} total"),
            ],
            "bytes",
            QUARTER,
        )
    )
    board.with_panel(
        timeseries(
            "Power against limit",
            "Power draw and the enforced power limit.",
            [
                *per_gpu("gpuscope_gpu_power_watts", "{{instance}} GPU {{gpu}}"),
                *per_gpu("gpuscope_gpu_power_limit_watts", "{{instance}} GPU {{gpu}} limit"),
            ],
            "watt",
            QUARTER,
        )
    )
    board.with_panel(
        timeseries(
            "Temperature",
            "GPU core temperature.",
            per_gpu("gpuscope_gpu_temperature_celsius"),
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
                    "sum by (instance, gpu) "
                    f"(increase(gpuscope_gpu_energy_joules_total{GPU}[$__range]))",
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
            "XID errors per poll interval: all codes per GPU, and by code (48: double-bit "
            "ECC, 79: fallen off the bus, ...).",
            [
                query(
                    "sum by (instance, gpu) "
                    f"(increase(gpuscope_gpu_xid_events_total{GPU}[{RATE}]))",
                    "{{instance}} GPU {{gpu}} all codes",
                ),
                query(
                    "sum by (instance, gpu, xid) "
                    f"(increase(gpuscope_gpu_xid_errors_total{GPU}[{RATE}]))",
                    "{{instance}} GPU {{gpu}} XID {{xid}}",
                ),
            ],
            "short",
        )
    )
    board.with_panel(
        timeseries(
            "ECC errors",
            "ECC errors counted by the driver, by type; any uncorrected error needs action.",
            [
                query(
                    "sum by (instance, gpu, type) "
                    f"(increase(gpuscope_gpu_ecc_errors_total{GPU}[{RATE}]))",
                    "{{instance}} GPU {{gpu}} {{type}}",
                )
            ],
            "short",
        )
    )
