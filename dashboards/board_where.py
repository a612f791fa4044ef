"""Where did the time go: per host, the phase shares on one time axis with what its GPUs did.

Everything request-side comes from the recording rules' per-source series, so the
board works the same over gpuscope's spans and over an engine's own ``/metrics``
(vLLM's, with no gpuscope in the request path), and one source is shown at a time:
the same requests seen through both are never added up. One row per host (the row
repeats over ``$host``): the bottleneck verdict of each service, model and GPU on it,
phase shares of the mean, each phase's P99 against the end-to-end P99, the split of
compute into prefill and decode where the engine reports it, and the host's GPUs: SM
occupancy, the SM clock as a share of its maximum, and PCIe traffic as a share of link capacity.
Below the hosts, the "Sharing and topology" row of the GPU board over the selected
hosts' GPUs (``dashboards/sharing.py``): co-tenants, MPS, MIG, NUMA, NVLink and the SM
clock's swing, the conditions of the sharing alerts beside the verdicts they qualify.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.common import BigValueTextMode

from dashboards.panels import (
    RATE,
    SOURCE_CHAIN,
    THIRD,
    Size,
    new_dashboard,
    quantile,
    query,
    ratio,
    row,
    selector,
    stat_panel,
    state_timeline,
    text_panel,
    timeseries,
)
from dashboards.sharing import Scope, sharing_row
from gpuscope.contract import gpu as gpu_rows
from pack.contract import GPU_INDEX, MODEL, PHASE, SERVICE, STAGE, UUID, series
from pack.engines import (
    COMPUTE_SPLIT,
    DURATION_HISTOGRAM,
    NO_TRAFFIC,
    PHASE_HISTOGRAM,
    PHASE_QUANTILES,
    PHASE_TIMES,
    STAGE_HISTOGRAM,
    not_reported,
    phases_note,
)
from pack.pcie import capacity_expr
from pack.recorded import BATCH_WAIT, COMPUTE, GPU_HOST, QUEUE, VERDICT, rate
from pack.settings import GPU

UID = "gpuscope-where-did-the-time-go"
# Written by the bottleneck rules in alerts/: 1 for the cause that holds now.
CAUSES = (QUEUE, BATCH_WAIT, COMPUTE, "underfed", "throttled", "pcie", "none")
# The rules keep source, service, model, host, gpu and uuid.
RULE = selector("source", "host", SERVICE, MODEL, GPU_INDEX)
# GPU series of the row's host: the rules' GPU-to-host map, so the host is the one the
# verdict joined on; matched on the exporter's instance too, as GPU indexes (and the
# simulated GPUs' UUIDs) repeat on every host.
ON_HOST = f"and on (instance, {GPU}) {GPU_HOST}{selector('host', GPU_INDEX)}"
PER_GPU = f"instance, {GPU_INDEX}"
# A verdict names its GPU's UUID too: two GPUs of one index on a host (two exporters)
# are two rows.
LEGEND = "{{service}} / {{model}} GPU {{gpu}} {{uuid}}: {{cause}}"


def _verdict() -> str:
    # requests that name no GPU are judged against every GPU of their host: "GPU all";
    # by host and UUID too, so that two GPUs of one index (two exporters on a host, or
    # "All" hosts) stay two verdicts
    verdict = f'label_replace({VERDICT}{RULE} == 1, "{GPU_INDEX}", "all", "{GPU_INDEX}", "")'
    return f"max by (host, {SERVICE}, {MODEL}, {GPU_INDEX}, {UUID}, cause) (\n{verdict}\n)"


def _share(histogram: str, key: str) -> str:
    """Each phase's (or stage's) mean over the sum of their means, over the row's
    requests: the verdict's ``share_mean`` (alerts/recording.py), so that board and
    verdict read one share for one service, model and GPU. Not each phase's seconds
    over all the phases' seconds: where the phases count different requests (a span
    without a batch wait, SGLang's queue and end-to-end histograms) that share is
    another one."""
    mean = ratio(
        f"sum by ({key}) ({rate(histogram, 'sum')}{RULE})",
        f"sum by ({key}) ({rate(histogram, 'count')}{RULE})",
    )
    return ratio(f"(\n{mean}\n)", f"sum(\n{mean}\n)", f"ignoring ({key}) group_left ()")


def _p99_against_request() -> str:
    """Each phase's P99 over the requests' own P99 (never over the sum of per-phase
    P99s: a request time no request had)."""
    per_phase = quantile(0.99, f"sum by ({PHASE}, le) ({rate(PHASE_HISTOGRAM, 'bucket')}{RULE})")
    request = quantile(0.99, f"sum by (le) ({rate(DURATION_HISTOGRAM, 'bucket')}{RULE})")
    return ratio(per_phase, request, f"ignoring ({PHASE}) group_left ()")


def build() -> Dashboard:
    board = new_dashboard(
        UID,
        "gpuscope / Where did the time go",
        "Per host: which phase dominates, next to what its GPUs were doing, and the "
        "bottleneck the recording rules name (queue, batch_wait, compute, underfed, "
        "throttled, pcie), for one source of request timings at a time.",
        SOURCE_CHAIN,
    )
    board.with_panel(text_panel("Phases by engine", phases_note(), Size(24, 9)))
    board.with_row(row("Host $host ($source)", repeat="host"))
    board.with_panel(
        stat_panel(
            "Bottleneck now",
            "The cause the bottleneck rules name for each service, model and GPU on this "
            "host: " + ", ".join(CAUSES) + ". GPU all: requests that named no GPU, judged "
            "against every GPU of the host (throttled or pcie when one of them is, "
            "underfed when all are).",
            [query(_verdict(), LEGEND)],
            "none",
            Size(6, 8),
            text_mode=BigValueTextMode.NAME,
            no_value=NO_TRAFFIC,
        )
    )
    board.with_panel(
        state_timeline(
            "Bottleneck over time",
            "When each cause held, per service, model and GPU.",
            [query(_verdict(), LEGEND)],
            Size(18, 8),
            no_value=NO_TRAFFIC,
        )
    )
    board.with_panel(
        timeseries(
            "Phase share of mean time",
            "Each phase's part of the mean request time on this host: its mean over the "
            "sum of the phases' means, the share the bottleneck verdict reads; stacked to "
            "100 %. "
            "Only the phases the engine reports (see the note above): for vLLM, "
            "queue and compute.",
            [query(_share(PHASE_HISTOGRAM, PHASE), "{{phase}}")],
            "percentunit",
            THIRD,
            stacked=True,
            max_value=1,
            no_value=not_reported(PHASE_TIMES),
        )
    )
    board.with_panel(
        timeseries(
            "Phase P99 against end-to-end P99",
            "Each phase's P99 over the requests' end-to-end P99 on this host (not over "
            "the sum of the phases' P99s, which no request took): the phase near 100 % "
            "is where the slowest requests wait. Not stacked: the slowest requests differ "
            "per phase. For vLLM, its end-to-end time also holds the API server's work. An "
            "engine whose phase times are counters (Triton) or whose phases have no "
            "buckets (SGLang) gives means only.",
            [query(_p99_against_request(), "{{phase}}")],
            "percentunit",
            THIRD,
            no_value=not_reported(PHASE_QUANTILES),
        )
    )
    board.with_panel(
        timeseries(
            "Compute: prefill and decode",
            "The parts of compute where the engine reports them (vLLM: prefill, then "
            "decode), as shares of their sum, which is compute; stacked to 100 %. The "
            "reference worker reports compute whole.",
            [query(_share(STAGE_HISTOGRAM, STAGE), "{{stage}}")],
            "percentunit",
            THIRD,
            stacked=True,
            max_value=1,
            no_value=not_reported(COMPUTE_SPLIT),
        )
    )
    gpu = selector(GPU_INDEX)
    board.with_panel(
        timeseries(
            "SM occupancy",
            "Resident warps over capacity, per GPU of the host; low while requests queue "
            "means an underfed GPU.",
            [
                query(
                    f"max by ({PER_GPU}) (\n{series(gpu_rows.SM_OCCUPANCY)}{gpu}\n{ON_HOST}\n)",
                    "{{instance}} GPU {{gpu}}",
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
            "SM clock over its maximum, per GPU of the host; far under 100 % under load, "
            "with a thermal or power reason active, means throttling.",
            [
                query(
                    f"max by ({PER_GPU}) (\n{series(gpu_rows.SM_CLOCK)}{gpu}\n/\n"
                    f"{series(gpu_rows.SM_CLOCK_MAX)}{gpu}\n{ON_HOST}\n)",
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    capacity = capacity_expr(gpu)
    board.with_panel(
        timeseries(
            "PCIe against link capacity",
            "Bytes per second each way over what the current link carries per direction, "
            "per GPU of the host.",
            [
                query(
                    f"max by ({PER_GPU}) (\n"
                    f"rate({series(counter)}{gpu}[{RATE}])"
                    f"\n/\n{capacity}\n{ON_HOST}\n)",
                    "{{instance}} GPU {{gpu}} " + name,
                )
                for counter, name in ((gpu_rows.PCIE_TRANSMIT, "TX"), (gpu_rows.PCIE_RECEIVE, "RX"))
            ],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    sharing_row(board, Scope("Sharing and topology ($host)", gpu, ON_HOST))
    return board
