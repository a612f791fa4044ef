"""Recording rules over gpuscope's GPU series (or dcgm-exporter's, recorded under the
same names by ``dcgm_rules.py``): per GPU, per host, and the conditions the verdict
(``recording.py``) and the alerts (``alerting.py``) test on them: throttled, PCIe
saturated, underfed.
"""

from __future__ import annotations

from typing import Any

from alerts.promql import INSTANCE, indent, record_rule, with_host
from gpuscope.contract import gpu as gpu_rows
from pack.contract import DIRECTION, REASON, series

# The PCIe per-lane table is the dashboards' (pack/pcie.py), so that the panels
# and the rules agree on every generation's capacity.
from pack.pcie import LINK_GENERATIONS, lane_bytes_per_second
from pack.recorded import GPU_HOST
from pack.settings import GPU, HOST_GPU, THROTTLE_REASONS, Settings

# Per-GPU series the conditions, the alerts and the verdict read; those with a window
# in their name end with it. Each keeps the exporter's job and instance next to the
# GPU's index and UUID (``instance_gpu``): GPU indexes repeat on every host, and so do
# UUIDs where hosts run the simulated GPUs, so no rule adds up or averages GPUs of two
# scrape targets, and a page says which host it is about.
INSTANCE_GPU = f"{INSTANCE}, {GPU}"
OCCUPANCY_AVG = f"instance_gpu:{gpu_rows.SM_OCCUPANCY.name}:avg"
UTILIZATION_AVG = f"instance_gpu:{gpu_rows.UTILIZATION.name}:avg"
SM_CLOCK_RATIO = "instance_gpu:gpuscope_gpu_sm_clock:ratio"
SM_CLOCK_RATIO_AVG = "instance_gpu:gpuscope_gpu_sm_clock:ratio_avg"
THROTTLE_ACTIVE = "instance_gpu:gpuscope_gpu_clock_throttle_reasons:active"
PCIE_CAPACITY = "instance_gpu:gpuscope_gpu_pcie_link:capacity_bytes_per_second"
PCIE_UTILIZATION = "instance_gpu_direction:gpuscope_gpu_pcie_bytes:utilization_rate"
MEMORY_USED_RATIO = "instance_gpu:gpuscope_gpu_memory_used:ratio"
HOST_OCCUPANCY = f"host:{gpu_rows.SM_OCCUPANCY.name}:max_avg"


def gpu_rules(settings: Settings) -> list[dict[str, Any]]:
    w = settings.window
    occupancy, utilization = series(gpu_rows.SM_OCCUPANCY), series(gpu_rows.UTILIZATION)
    capacity = "\n    + ".join(
        f"({series(gpu_rows.PCIE_LINK_GENERATION)}{settings.gpu_sel()} == bool {gen})"
        f" * {lane_bytes_per_second(gen):.6g}"
        for gen in sorted(LINK_GENERATIONS)
    )
    throttling = settings.gpu_sel(f'{REASON}=~"{"|".join(THROTTLE_REASONS)}"')
    pcie = {"receive": gpu_rows.PCIE_RECEIVE, "transmit": gpu_rows.PCIE_TRANSMIT}
    info = series(gpu_rows.INFO) + settings.gpu_sel()
    return [
        record_rule(
            f"{OCCUPANCY_AVG}{w}",
            f"avg by ({INSTANCE_GPU}) (avg_over_time({occupancy}{settings.gpu_sel()}[{w}]))",
        ),
        record_rule(
            f"{UTILIZATION_AVG}{w}",
            f"avg by ({INSTANCE_GPU}) (avg_over_time({utilization}{settings.gpu_sel()}[{w}]))",
        ),
        record_rule(
            SM_CLOCK_RATIO,
            f"avg by ({INSTANCE_GPU}) ({series(gpu_rows.SM_CLOCK)}{settings.gpu_sel()})\n/\n"
            f"avg by ({INSTANCE_GPU}) ({series(gpu_rows.SM_CLOCK_MAX)}{settings.gpu_sel()})",
        ),
        record_rule(
            f"{SM_CLOCK_RATIO_AVG}{w}",
            f"avg_over_time({SM_CLOCK_RATIO}[{w}])",
        ),
        # 1 per GPU while a thermal or power reason holds its clocks down
        record_rule(
            THROTTLE_ACTIVE,
            f"max by ({INSTANCE_GPU}) ({series(gpu_rows.CLOCK_EVENT_ACTIVE)}{throttling})",
        ),
        # "> 0": a generation outside the table (or a width of 0) has no known capacity;
        # dividing by 0 would give +Inf, a saturated link, under any traffic
        record_rule(
            PCIE_CAPACITY,
            f"max by ({INSTANCE_GPU}) (\n  {series(gpu_rows.PCIE_LINK_WIDTH)}{settings.gpu_sel()}\n"
            f"  * on ({INSTANCE_GPU}) (\n    {capacity}\n  )\n)\n> 0",
        ),
        record_rule(
            f"{PCIE_UTILIZATION}{w}",
            " or ".join(
                f"label_replace(\n"
                f"  sum by ({INSTANCE_GPU}) (rate({series(row)}{settings.gpu_sel()}[{w}]))\n"
                f"  / on ({INSTANCE_GPU}) {PCIE_CAPACITY},\n"
                f'  "{DIRECTION}", "{direction}", "", ""\n)'
                for direction, row in pcie.items()
            ),
        ),
        record_rule(
            MEMORY_USED_RATIO,
            f"max by ({INSTANCE_GPU}) ({series(gpu_rows.MEMORY_USED)}{settings.gpu_sel()})\n/\n"
            f"max by ({INSTANCE_GPU}) ({series(gpu_rows.MEMORY_TOTAL)}{settings.gpu_sel()})",
        ),
        # Each GPU's host (the exporter's instance without the port), for the boards'
        # GPU panels of a host; and the best-fed GPU of each host, for requests that
        # name no GPU.
        record_rule(
            GPU_HOST,
            f"max by ({INSTANCE}, {HOST_GPU}) (\n  {indent(with_host(settings, info))}\n)",
        ),
        record_rule(
            f"{HOST_OCCUPANCY}{w}",
            _max_by_host(
                with_host(settings, f"avg_over_time({occupancy}{settings.gpu_sel()}[{w}])")
            ),
        ),
    ]


def _max_by_host(expr: str) -> str:
    return f"max by (host) (\n  {indent(expr)}\n)"


def gpu_conditions(settings: Settings) -> dict[str, str]:
    """Per-GPU conditions (labels job, instance, gpu, uuid) shared by the verdict and
    the alerts."""
    w = settings.window
    return {
        "throttled": (
            f"{SM_CLOCK_RATIO_AVG}{w} < {settings.throttle_clock_ratio:g}\n"
            f"and on ({INSTANCE_GPU}) {UTILIZATION_AVG}{w} > "
            f"{settings.throttle_min_utilization:g}\n"
            f"and on ({INSTANCE_GPU}) {THROTTLE_ACTIVE} == 1"
        ),
        "pcie": (
            f"max by ({INSTANCE_GPU}) ({PCIE_UTILIZATION}{w}) > {settings.pcie_utilization:g}"
        ),
        "underfed": f"{OCCUPANCY_AVG}{w} < {settings.underfed_occupancy:g}",
    }


def host_conditions(settings: Settings) -> dict[str, str]:
    """The same conditions per host (label host), for requests that name no GPU: a host
    is throttled or saturates PCIe when one of its GPUs does (a request may run on any
    of them, and a tensor-parallel group runs at its slowest GPU's pace); it is
    underfed only when every one of its GPUs is."""
    gpu = gpu_conditions(settings)
    return {
        **{cause: _max_by_host(with_host(settings, gpu[cause])) for cause in ("throttled", "pcie")},
        "underfed": f"{HOST_OCCUPANCY}{settings.window} < {settings.underfed_occupancy:g}",
    }
