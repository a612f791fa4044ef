"""Where did the time go: per GPU, the phase shares on one time axis with what the GPU did.

One row per GPU (the row repeats over ``$gpu``): the bottleneck verdict of the
recording rules, phase shares of the mean and of P99, SM occupancy, the SM clock
as a share of its maximum, and PCIe traffic as a share of link capacity.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.common import BigValueTextMode
from panels import (
    RATE,
    REQUEST_CHAIN,
    THIRD,
    Size,
    new_dashboard,
    query,
    row,
    selector,
    stat_panel,
    state_timeline,
    timeseries,
)
from pcie import capacity_expr

UID = "gpuscope-where-did-the-time-go"
# Written by the bottleneck rules in alerts/: 1 for the cause that holds now.
VERDICT = "service_model_gpu:gpuscope_bottleneck:verdict"
CAUSES = ("queue", "batch_wait", "compute", "underfed", "throttled", "pcie", "none")
PHASE = selector("job", "instance", "service", "model", "gpu")
GPU = selector("job", "instance", "gpu")
# Recording rules aggregate job and instance away; they keep service, model, gpu, uuid.
RULE = selector("service", "model", "gpu")


def _verdict() -> str:
    return f"max by (service, model, gpu, cause) ({VERDICT}{RULE} == 1)"


def _phase_share(statistic: str) -> str:
    if statistic == "mean":
        per_phase = f"sum by (phase) (rate(gpuscope_request_phase_seconds_sum{PHASE}[{RATE}]))"
    else:
        per_phase = (
            "histogram_quantile(0.99, sum by (phase, le) "
            f"(rate(gpuscope_request_phase_seconds_bucket{PHASE}[{RATE}])))"
        )
    return f"{per_phase}\n/ ignoring (phase) group_left\nsum({per_phase})"


def build() -> Dashboard:
    board = new_dashboard(
        UID,
        "gpuscope / Where did the time go",
        "Per GPU: which phase dominates, next to what the GPU was doing, and the bottleneck "
        "the recording rules name (queue, batch_wait, compute, underfed, throttled, pcie).",
        REQUEST_CHAIN,
    )
    board.with_row(row("GPU $gpu", repeat="gpu"))
    board.with_panel(
        stat_panel(
            "Bottleneck now",
            "The cause the bottleneck rules name for this GPU: " + ", ".join(CAUSES) + ".",
            [query(_verdict(), "{{service}} / {{model}}: {{cause}}")],
            "none",
            Size(6, 8),
            text_mode=BigValueTextMode.NAME,
        )
    )
    board.with_panel(
        state_timeline(
            "Bottleneck over time",
            "When each cause held, per service and model.",
            [query(_verdict(), "{{service}} / {{model}}: {{cause}}")],
            Size(18, 8),
        )
    )
    for statistic, title in (("mean", "Phase share of mean time"), ("p99", "Phase share of P99")):
        board.with_panel(
            timeseries(
                title,
                "Each phase's part of the request time on this GPU; stacked to 100 %.",
                [query(_phase_share(statistic), "{{phase}}")],
                "percentunit",
                Size(12, 8),
                stacked=True,
                max_value=1,
            )
        )
    board.with_panel(
        timeseries(
            "SM occupancy",
            "Resident warps over capacity; low while requests queue means an underfed GPU.",
            [
                query(
                    f"max by (instance, gpu) (gpuscope_gpu_sm_occupancy_ratio{GPU})",
                    "{{instance}} occupancy",
                )
            ],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    board.with_panel(
        timeseries(
            "SM clock against its maximum",
            "SM clock over its maximum; far under 100 % under load, with a thermal or power "
            "reason active, means throttling.",
            [
                query(
                    f"max by (instance, gpu) (gpuscope_gpu_sm_clock_hertz{GPU}\n/\n"
                    f"gpuscope_gpu_sm_clock_max_hertz{GPU})",
                    "{{instance}} SM clock",
                )
            ],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    capacity = capacity_expr(GPU)
    board.with_panel(
        timeseries(
            "PCIe against link capacity",
            "Bytes per second each way over what the current link carries per direction.",
            [
                query(
                    "max by (instance, gpu) "
                    f"(rate(gpuscope_gpu_pcie_{metric}_bytes_total{GPU}[{RATE}])"
                    f"\n/\n{capacity})",
                    "{{instance}} " + name,
                )
                for metric, name in (("transmit", "TX"), ("receive", "RX"))
            ],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    return board
