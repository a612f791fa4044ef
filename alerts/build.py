"""Generate gpuscope's Prometheus recording and alerting rules from one table.

Every threshold, selector, window and ``for:`` duration lives in ``Settings``; the
rule files under ``alerts/rules/`` are generated from it and committed::

    python alerts/build.py                         # rewrite alerts/rules/*.yml
    python alerts/build.py --out /tmp/r --interval 1s --for 2s   # a fast variant

Recording rules are named ``level:metric:operation``. A level of ``gpu`` keeps the
``gpu`` and ``uuid`` labels (the UUID is unique across hosts, so it is the join key
between request metrics and GPU metrics); ``service_model_gpu`` keeps ``service``,
``model``, ``gpu`` and ``uuid``. The serving engine's series (``gpuscope_worker_*``,
the worker's own ``/metrics``, scraped as a job of its own) are recorded per
``instance`` (keeping ``job`` and ``instance``) and, for its configuration, per
``model`` (joined from ``gpuscope_worker_info``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
# The PCIe per-lane table is the dashboards' (dashboards/pcie.py), so that the panels
# and the rules agree on every generation's capacity.
sys.path.insert(0, str(HERE.parent / "dashboards"))
from pcie import LINK_GENERATIONS, lane_bytes_per_second  # noqa: E402

SMG = "service, model, gpu, uuid"  # the labels of service_model_gpu:* series
GPU = "gpu, uuid"
# Clock event reasons that mean the hardware holds clocks down (not idle, not a setting).
THROTTLE_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sw_power_cap",
)


@dataclass(frozen=True)
class Slo:
    """A latency objective over a histogram: ``objective`` of requests within ``le``."""

    name: str  # recording-rule and alert name part
    title: str  # for summaries
    histogram: str
    le: str  # a bucket boundary of the histogram, as Prometheus labels it
    objective: float


@dataclass(frozen=True)
class Settings:
    """The one table: everything a user may tune, each written once."""

    job_selector: str = 'job="gpuscope"'
    # the inference server's own /metrics (gpuscope_worker_*), scraped as its own job
    worker_job_selector: str = 'job="gpuscope-worker"'
    # where alerts/runbook.md is served; each alert links to its section
    runbook: str = "https://github.com/gpuscope/gpuscope/blob/main/alerts/runbook.md"
    # requests an SLO counts: model calls, not /v1/models or health checks
    slo_selector: str = 'model!=""'
    interval: str = "30s"  # rule group evaluation interval
    window: str = "5m"  # window of rates and averages outside the SLOs
    for_override: str | None = None  # tests: every alert's ``for`` set to this
    # phase shares of the mean request time
    dominant_share: float = 0.5  # a phase above this share dominates latency
    underfed_queue_share: float = 0.25  # requests are queueing
    underfed_occupancy: float = 0.7  # SM occupancy under this while queueing: underfed
    # batch wait: the batcher's configured window and how far over it P99 may go
    # (the window is read from gpuscope_worker_max_queue_delay_seconds where a worker of
    # that model exports it; this value holds for the others)
    batch_wait_window_seconds: float = 0.005
    batch_wait_tolerance: float = 2.0
    # KV cache: usage (averaged over ``window``) counted as full, and the requests that
    # may wait on average while it is full before that is a capacity problem. A
    # recompute preemption frees a whole sequence's blocks, and the head of the queue
    # waits until its blocks fit, so a cache that keeps running out averages 80-90 %
    # (measured on the reference worker), not 100 %.
    kv_cache_full_ratio: float = 0.8
    # the requests that hold KV-cache blocks (generation; embeddings hold none)
    kv_cache_endpoints: str = 'endpoint="completions"'
    kv_cache_waiting_requests: float = 1.0
    # throttling: SM clock under this fraction of its maximum while utilisation is high
    throttle_clock_ratio: float = 0.8
    throttle_min_utilization: float = 0.5
    pcie_utilization: float = 0.9  # of the link's capacity, either direction
    memory_used_ratio: float = 0.95
    error_ratio: float = 0.05  # 5xx share of model requests
    latency_slo: Slo = Slo(
        "latency",
        "Request latency",
        "gpuscope_request_duration_seconds",
        "1.0",
        0.99,
    )
    ttft_slo: Slo = Slo(
        "ttft",
        "Time to first token",
        "gpuscope_time_to_first_token_seconds",
        "0.5",
        0.99,
    )
    # multi-window multi-burn-rate (SRE workbook): (long, short, burn rate)
    page_burns: tuple[tuple[str, str, float], ...] = (("1h", "5m", 14.4), ("6h", "30m", 6.0))
    ticket_burns: tuple[tuple[str, str, float], ...] = (("1d", "2h", 3.0), ("3d", "6h", 1.0))
    # ``for:`` durations
    for_phase: str = "15m"
    for_slo_page: str = "2m"
    for_slo_ticket: str = "15m"
    for_error_ratio: str = "5m"
    for_gpu_hardware: str = "5m"
    for_gpu_lost: str = "1m"
    for_exporter: str = "5m"
    for_exporter_signals: str = "10m"
    for_kv_cache: str = "10m"
    for_kv_cache_capacity: str = "15m"
    for_worker: str = "5m"
    increase_window: str = "10m"  # XID, ECC, overflow and drop counts
    spans_idle_window: str = "10m"

    def sel(self, extra: str = "") -> str:
        """A label selector with the job and ``extra`` matchers."""
        return "{" + ", ".join(m for m in (self.job_selector, extra) if m) + "}"

    def worker_sel(self) -> str:
        """The selector of the worker's own metrics."""
        return "{" + self.worker_job_selector + "}"

    def for_(self, duration: str) -> str:
        return self.for_override if self.for_override is not None else duration

    def slo_windows(self) -> list[str]:
        burns = (*self.page_burns, *self.ticket_burns)
        return sorted({w for long, short, _ in burns for w in (long, short)}, key=_seconds)


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]


def _rule(record: str, expr: str, **labels: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": record, "expr": expr}
    if labels:
        rule["labels"] = labels
    return rule


# --- recording rules ----------------------------------------------------------------


def phase_rules(s: Settings) -> list[dict[str, Any]]:
    w, hist = s.window, "gpuscope_request_phase_seconds"
    level = f"service_model_gpu:{hist}"
    by = f"{SMG}, phase"
    return [
        _rule(f"{level}_sum:rate{w}", f"sum by ({by}) (rate({hist}_sum{s.sel()}[{w}]))"),
        _rule(f"{level}_count:rate{w}", f"sum by ({by}) (rate({hist}_count{s.sel()}[{w}]))"),
        _rule(f"{level}_bucket:rate{w}", f"sum by ({by}, le) (rate({hist}_bucket{s.sel()}[{w}]))"),
        # "> 0": an idle series has no mean (and no share or verdict), not a NaN one
        _rule(f"{level}:mean{w}", f"{level}_sum:rate{w}\n/\n({level}_count:rate{w} > 0)"),
        _rule(f"{level}:p99_{w}", f"histogram_quantile(0.99, {level}_bucket:rate{w})"),
        # Phases add up to the request, so each mean's share of their sum is its
        # share of the mean latency.
        _rule(
            f"{level}:share_mean{w}",
            f"{level}:mean{w}\n/ on ({SMG}) group_left ()\nsum by ({SMG}) ({level}:mean{w})",
        ),
        # Per-phase P99s do not add up to the request's P99 (the slowest requests
        # differ per phase); their sum is an upper bound, so this is each phase's
        # share of the tail.
        _rule(
            f"{level}:share_p99_{w}",
            f"{level}:p99_{w}\n/ on ({SMG}) group_left ()\nsum by ({SMG}) ({level}:p99_{w})",
        ),
    ]


def request_rules(s: Settings) -> list[dict[str, Any]]:
    w, hist = s.window, "gpuscope_request_duration_seconds"
    count = f"{hist}_count{s.sel(s.slo_selector)}"
    errors = hist + "_count" + s.sel(s.slo_selector + ', code=~"5.."')
    rules = [_rule(f"service_model:gpuscope_requests:rate{w}", _sum_rate(count, w))]
    # the SLO windows, and ``window`` for GpuscopeErrorRatioHigh when it is none of them
    for window in sorted({*s.slo_windows(), w}, key=_seconds):
        # "or ... * 0": no 5xx series at all is a ratio of 0, not no data
        rules.append(
            _rule(
                f"service_model:gpuscope_request_errors:ratio_rate{window}",
                f"(\n  {_sum_rate(errors, window)}\n  or\n  {_sum_rate(count, window)} * 0\n)\n"
                f"/\n{_sum_rate(count, window)}",
            )
        )
    return rules


def slo_rules(s: Settings, slo: Slo) -> list[dict[str, Any]]:
    total = f"{slo.histogram}_count{s.sel(s.slo_selector)}"
    le = f'le=~"{_le_pattern(slo.le)}"'
    good = f"{slo.histogram}_bucket{s.sel(s.slo_selector + ', ' + le)}"
    return [
        _rule(
            f"service_model:gpuscope_{slo.name}_slo_errors:ratio_rate{window}",
            f"1 - (\n  {_sum_rate(good, window)}\n  /\n  {_sum_rate(total, window)}\n)",
        )
        for window in s.slo_windows()
    ]


def _le_pattern(le: str) -> str:
    """``1.0`` and ``1`` both: exporters and Prometheus versions write bounds differently."""
    whole = le.removesuffix(".0")
    return f"{whole}(\\\\.0)?" if whole != le else le.replace(".", "\\\\.")


def _sum_rate(selector: str, window: str) -> str:
    return f"sum by (service, model) (rate({selector}[{window}]))"


def gpu_rules(s: Settings) -> list[dict[str, Any]]:
    w = s.window
    capacity = "\n    + ".join(
        f"(gpuscope_gpu_pcie_link_generation{s.sel()} == bool {gen})"
        f" * {lane_bytes_per_second(gen):.6g}"
        for gen in sorted(LINK_GENERATIONS)
    )
    throttling = s.sel(f'reason=~"{"|".join(THROTTLE_REASONS)}"')
    return [
        _rule(
            f"gpu:gpuscope_gpu_sm_occupancy_ratio:avg{w}",
            f"avg by ({GPU}) (avg_over_time(gpuscope_gpu_sm_occupancy_ratio{s.sel()}[{w}]))",
        ),
        _rule(
            f"gpu:gpuscope_gpu_utilization_ratio:avg{w}",
            f"avg by ({GPU}) (avg_over_time(gpuscope_gpu_utilization_ratio{s.sel()}[{w}]))",
        ),
        _rule(
            "gpu:gpuscope_gpu_sm_clock:ratio",
            f"avg by ({GPU}) (gpuscope_gpu_sm_clock_hertz{s.sel()})\n/\n"
            f"avg by ({GPU}) (gpuscope_gpu_sm_clock_max_hertz{s.sel()})",
        ),
        _rule(
            f"gpu:gpuscope_gpu_sm_clock:ratio_avg{w}",
            f"avg_over_time(gpu:gpuscope_gpu_sm_clock:ratio[{w}])",
        ),
        # 1 per GPU while a thermal or power reason holds its clocks down
        _rule(
            "gpu:gpuscope_gpu_clock_throttle_reasons:active",
            f"max by ({GPU}) (gpuscope_gpu_clock_event_active{throttling})",
        ),
        # "> 0": a generation outside the table (or a width of 0) has no known capacity;
        # dividing by 0 would give +Inf, a saturated link, under any traffic
        _rule(
            "gpu:gpuscope_gpu_pcie_link:capacity_bytes_per_second",
            f"max by ({GPU}) (\n  gpuscope_gpu_pcie_link_width{s.sel()}\n"
            f"  * on (job, instance, gpu, uuid) (\n    {capacity}\n  )\n)\n> 0",
        ),
        _rule(
            f"gpu_direction:gpuscope_gpu_pcie_bytes:utilization_rate{w}",
            " or ".join(
                f"label_replace(\n"
                f"  sum by ({GPU}) (rate(gpuscope_gpu_pcie_{d}_bytes_total{s.sel()}[{w}]))\n"
                f"  / on ({GPU}) gpu:gpuscope_gpu_pcie_link:capacity_bytes_per_second,\n"
                f'  "direction", "{d}", "", ""\n)'
                for d in ("receive", "transmit")
            ),
        ),
        _rule(
            "gpu:gpuscope_gpu_memory_used:ratio",
            f"max by ({GPU}) (gpuscope_gpu_memory_used_bytes{s.sel()})\n/\n"
            f"max by ({GPU}) (gpuscope_gpu_memory_total_bytes{s.sel()})",
        ),
    ]


def gpu_conditions(s: Settings) -> dict[str, str]:
    """Per-GPU conditions (labels gpu, uuid) shared by the verdict and the alerts."""
    w = s.window
    return {
        "throttled": (
            f"gpu:gpuscope_gpu_sm_clock:ratio_avg{w} < {s.throttle_clock_ratio:g}\n"
            f"and on ({GPU}) gpu:gpuscope_gpu_utilization_ratio:avg{w} > "
            f"{s.throttle_min_utilization:g}\n"
            f"and on ({GPU}) gpu:gpuscope_gpu_clock_throttle_reasons:active == 1"
        ),
        "pcie": (
            f"max by ({GPU}) (gpu_direction:gpuscope_gpu_pcie_bytes:utilization_rate{w}) > "
            f"{s.pcie_utilization:g}"
        ),
    }


# Verdict precedence: a hardware limit explains everything above it, so it wins; then
# an underfed GPU (a feeding problem shows as queueing); then the dominant phase.
VERDICT_CAUSES = ("none", "compute", "batch_wait", "queue", "underfed", "pcie", "throttled")


def verdict_rules(s: Settings) -> list[dict[str, Any]]:
    w = s.window
    share = f"service_model_gpu:gpuscope_request_phase_seconds:share_mean{w}"
    base = f"max by ({SMG}) ({share})"
    gpu = gpu_conditions(s)
    conditions = {
        "none": "",
        "compute": f'and on ({SMG}) {share}{{phase="compute"}} > {s.dominant_share:g}',
        "batch_wait": f'and on ({SMG}) {share}{{phase="batch_wait"}} > {s.dominant_share:g}',
        "queue": f'and on ({SMG}) {share}{{phase="queue"}} > {s.dominant_share:g}',
        "underfed": (
            f'and on ({SMG}) {share}{{phase="queue"}} > {s.underfed_queue_share:g}\n'
            f"  and on ({GPU}) gpu:gpuscope_gpu_sm_occupancy_ratio:avg{w} < "
            f"{s.underfed_occupancy:g}"
        ),
        "pcie": f"and on ({GPU}) ({gpu['pcie']})",
        "throttled": f"and on ({GPU}) ({_indent(gpu['throttled'])})",
    }
    candidates = "\nor\n".join(
        f"label_replace(\n  ({base} * 0 + {rank})"
        + (f"\n  {_indent(conditions[cause])}" if conditions[cause] else "")
        + f',\n  "cause", "{cause}", "", ""\n)'
        for rank, cause in enumerate(VERDICT_CAUSES)
    )
    rank = "service_model_gpu:gpuscope_bottleneck:rank"
    return [
        # one series per candidate cause, valued by precedence
        _rule(rank, candidates),
        # the highest-precedence cause wins; value 1
        _rule(
            "service_model_gpu:gpuscope_bottleneck:verdict",
            f"topk by ({SMG}) (1, {rank}) * 0 + 1",
        ),
    ]


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


# Per-instance series of the worker's /metrics, and the configured batching window per model.
INSTANCE = "job, instance"
KV_USAGE = "instance:gpuscope_worker_kv_cache_usage_ratio:avg"
PREEMPTIONS = "instance:gpuscope_worker_preemptions:rate"
WAITING = "instance_endpoint:gpuscope_worker_requests_waiting:avg"
QUEUE_DELAY = "model:gpuscope_worker_max_queue_delay_seconds:max"


def worker_rules(s: Settings) -> list[dict[str, Any]]:
    w, sel = s.window, s.worker_sel()
    return [
        _rule(
            f"{KV_USAGE}{w}",
            f"max by ({INSTANCE}) (avg_over_time(gpuscope_worker_kv_cache_usage_ratio{sel}[{w}]))",
        ),
        _rule(
            f"{PREEMPTIONS}{w}",
            f"sum by ({INSTANCE}) (rate(gpuscope_worker_preemptions_total{sel}[{w}]))",
        ),
        # requests queued, or preempted and waiting to resume, per endpoint
        _rule(
            f"{WAITING}{w}",
            f"sum by ({INSTANCE}, endpoint) "
            f"(avg_over_time(gpuscope_worker_requests_waiting{sel}[{w}]))",
        ),
        # the largest configured window among the workers serving a model
        _rule(
            QUEUE_DELAY,
            f"max by (model) (\n  gpuscope_worker_max_queue_delay_seconds{sel}\n"
            f"  * on ({INSTANCE}) group_left (model)\n  gpuscope_worker_info{sel}\n)",
        ),
    ]


def recording_groups(s: Settings) -> list[dict[str, Any]]:
    slo_rules_all = [*slo_rules(s, s.latency_slo), *slo_rules(s, s.ttft_slo)]
    return [
        {"name": "gpuscope-requests", "interval": s.interval, "rules": [
            *phase_rules(s), *request_rules(s), *slo_rules_all,
        ]},
        {"name": "gpuscope-gpus", "interval": s.interval, "rules": gpu_rules(s)},
        {"name": "gpuscope-bottleneck", "interval": s.interval, "rules": verdict_rules(s)},
        {"name": "gpuscope-worker", "interval": s.interval, "rules": worker_rules(s)},
    ]  # fmt: skip


# --- alerting rules ------------------------------------------------------------------


def _alert(
    s: Settings,
    name: str,
    expr: str,
    for_: str,
    severity: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
    assert summary.endswith("."), name
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{s.runbook}#{name.lower()}",
        },
    }


def request_alerts(s: Settings) -> list[dict[str, Any]]:
    w = s.window
    share = f"service_model_gpu:gpuscope_request_phase_seconds:share_mean{w}"
    p99 = f"service_model_gpu:gpuscope_request_phase_seconds:p99_{w}"
    where = "{{ $labels.service }}/{{ $labels.model }} on GPU {{ $labels.gpu }}"
    return [
        _alert(
            s,
            "GpuscopeQueueTimeDominating",
            f'{share}{{phase="queue"}} > {s.dominant_share:g}',
            s.for_(s.for_phase),
            "warning",
            "Requests spend most of their time waiting in the queue.",
            f"Queue time is {{{{ $value | humanizePercentage }}}} of the mean request time of "
            f"{where}: more requests arrive than the server admits.",
        ),
        _alert(
            s,
            "GpuscopeBatchWaitAboveWindow",
            batch_wait_expr(s, f'{p99}{{phase="batch_wait"}}'),
            s.for_(s.for_phase),
            "warning",
            "Batch wait exceeds the batcher's configured window.",
            f"P99 batch wait of {where} is {{{{ $value | humanizeDuration }}}}, over "
            f"{s.batch_wait_tolerance:g}x the {_window_text(s)} window.",
        ),
        _alert(
            s,
            "GpuscopeGpuUnderfed",
            f'{share}{{phase="queue"}} > {s.underfed_queue_share:g}\n'
            f"and on ({GPU}) gpu:gpuscope_gpu_sm_occupancy_ratio:avg{w} < "
            f"{s.underfed_occupancy:g}",
            s.for_(s.for_phase),
            "warning",
            "Requests queue while the GPU's SMs are underused.",
            f"Queue time is {{{{ $value | humanizePercentage }}}} of the mean request time of "
            f"{where} while its SM occupancy stays under {s.underfed_occupancy:.0%}: "
            "the batcher does not feed the GPU.",
        ),
        _alert(
            s,
            "GpuscopeErrorRatioHigh",
            f"service_model:gpuscope_request_errors:ratio_rate{w} > {s.error_ratio:g}",
            s.for_(s.for_error_ratio),
            "critical",
            "Many model requests fail with a server error.",
            "{{ $value | humanizePercentage }} of the requests of {{ $labels.service }}/"
            "{{ $labels.model }} answered 5xx over the last " + w + ".",
        ),
    ]


def batch_wait_expr(s: Settings, p99: str) -> str:
    """Over the tolerance times the window the model's workers export (when above
    zero), else times the table's window."""
    configured = f"({QUEUE_DELAY} > 0)"
    return (
        f"(\n  {p99}\n  > on (model) group_left ()\n"
        f"  {s.batch_wait_tolerance:g} * {configured}\n)\nor\n"
        f"(\n  {p99} > {s.batch_wait_window_seconds * s.batch_wait_tolerance:g}\n"
        f"  unless on (model)\n  {configured}\n)"
    )


def _window_text(s: Settings) -> str:
    """The window in the alert's text: the exported one, else the table's."""
    lookup = f'printf "{QUEUE_DELAY}{{model=%q}} > 0" $labels.model | query'
    return (
        f"{{{{ with {lookup} }}}}{{{{ . | first | value | humanizeDuration }}}}"
        f"{{{{ else }}}}{s.batch_wait_window_seconds * 1000:g}ms{{{{ end }}}}"
    )


def slo_alerts(s: Settings, slo: Slo) -> list[dict[str, Any]]:
    ratio = f"service_model:gpuscope_{slo.name}_slo_errors:ratio_rate"
    budget = 1 - slo.objective
    name = "Gpuscope" + {"latency": "Latency", "ttft": "TimeToFirstToken"}[slo.name]
    alerts = []
    for kind, burns, severity, for_ in (
        ("Fast", s.page_burns, "critical", s.for_slo_page),
        ("Slow", s.ticket_burns, "warning", s.for_slo_ticket),
    ):
        expr = "\nor\n".join(
            f"(\n  {ratio}{long} > {rate:g} * {budget:.6g}\n  and\n"
            f"  {ratio}{short} > {rate:g} * {budget:.6g}\n)"
            for long, short, rate in burns
        )
        windows = ", ".join(f"{long}/{short} at {rate:g}x" for long, short, rate in burns)
        alerts.append(
            _alert(
                s,
                f"{name}SLOBudgetBurn{kind}",
                expr,
                s.for_(for_),
                severity,
                f"{slo.title} burns its error budget {'fast' if kind == 'Fast' else 'steadily'}.",
                f"{{{{ $value | humanizePercentage }}}} of the requests of "
                f"{{{{ $labels.service }}}}/{{{{ $labels.model }}}} took longer than "
                f"{slo.le} s (objective: {slo.objective:.3g} within {slo.le} s; "
                f"burn-rate windows {windows}).",
            )
        )
    return alerts


def gpu_alerts(s: Settings) -> list[dict[str, Any]]:
    w, inc = s.window, s.increase_window
    gpu = gpu_conditions(s)
    throttling = s.sel(f'reason=~"{"|".join(THROTTLE_REASONS)}"')
    uncorrected = s.sel('type="volatile_uncorrected"')
    on_gpu = "GPU {{ $labels.gpu }} ({{ $labels.uuid }})"
    return [
        _alert(
            s,
            "GpuscopeGpuClockThrottled",
            f"gpuscope_gpu_clock_event_active{throttling} == 1\n"
            f"and on ({GPU}) (\n  {_indent(gpu['throttled'])}\n)",
            s.for_(s.for_gpu_hardware),
            "warning",
            "A GPU under load runs with its SM clock held down.",
            f"{on_gpu} is held down by {{{{ $labels.reason }}}} while busy: its SM clock "
            f"averaged under {s.throttle_clock_ratio:.0%} of its maximum over {w}.",
        ),
        _alert(
            s,
            "GpuscopeGpuPcieSaturated",
            f"gpu_direction:gpuscope_gpu_pcie_bytes:utilization_rate{w} > {s.pcie_utilization:g}",
            s.for_(s.for_gpu_hardware),
            "warning",
            "A GPU's PCIe link runs near its capacity.",
            f"{on_gpu} {{{{ $labels.direction }}}}s at {{{{ $value | humanizePercentage }}}} "
            "of its PCIe link's capacity: host-device transfers limit throughput.",
        ),
        _alert(
            s,
            "GpuscopeGpuMemoryNearlyFull",
            f"gpu:gpuscope_gpu_memory_used:ratio > {s.memory_used_ratio:g}",
            s.for_(s.for_gpu_hardware),
            "warning",
            "A GPU's memory is nearly full.",
            f"{on_gpu} uses {{{{ $value | humanizePercentage }}}} of its memory.",
        ),
        _alert(
            s,
            "GpuscopeGpuXidErrors",
            f"increase(gpuscope_gpu_xid_events_total{s.sel()}[{inc}]) > 0",
            s.for_("0m"),
            "warning",
            "A GPU reported XID errors.",
            f"{on_gpu} reported {{{{ $value | humanize }}}} XID errors in {inc}; "
            "gpuscope_gpu_xid_errors_total names the codes.",
        ),
        _alert(
            s,
            "GpuscopeGpuEccUncorrectedErrors",
            f"increase(gpuscope_gpu_ecc_errors_total{uncorrected}[{inc}]) > 0",
            s.for_("0m"),
            "critical",
            "A GPU reported uncorrectable ECC errors.",
            f"{on_gpu} reported {{{{ $value | humanize }}}} uncorrectable ECC errors in {inc}.",
        ),
        _alert(
            s,
            "GpuscopeGpuLost",
            f"gpuscope_gpu_up{s.sel()} == 0",
            s.for_(s.for_gpu_lost),
            "critical",
            "A GPU cannot be read any more.",
            f"{on_gpu} on {{{{ $labels.instance }}}} stopped answering (lost, fallen off "
            "the bus or the driver failed); its other series are gone.",
        ),
        _alert(
            s,
            "GpuscopeGpuCollectorFailing",
            # the share of failed runs, not the last one: one success between failures
            # would restart ``for:`` and a collector failing most runs would never alert
            f"1 - avg_over_time(gpuscope_collector_success{s.sel()}[{w}]) > 0.5",
            s.for_(s.for_gpu_hardware),
            "warning",
            "A GPU metrics collector keeps failing.",
            "Collector {{ $labels.collector }} on {{ $labels.instance }} failed "
            f"{{{{ $value | humanizePercentage }}}} of its runs over {w}: GPU metrics are "
            "stale or missing.",
        ),
    ]


def exporter_alerts(s: Settings) -> list[dict[str, Any]]:
    inc, idle = s.increase_window, s.spans_idle_window
    received = f"gpuscope_spans_received_total{s.sel()}"
    on = "{{ $labels.instance }}"
    return [
        _alert(
            s,
            "GpuscopeSpansNotArriving",
            f"rate({received}[{idle}]) == 0\nand\n{received} > 0",
            s.for_(s.for_exporter_signals),
            "warning",
            "The exporter stopped receiving spans.",
            f"{on} received spans earlier but none in the last {idle}: "
            "the application's tracing or its path to the exporter is broken.",
        ),
        _alert(
            s,
            "GpuscopeSpansRejected",
            f"sum by (job, instance, reason) (rate(gpuscope_spans_rejected_total{s.sel()}"
            f"[{s.window}])) > 0",
            s.for_(s.for_exporter_signals),
            "warning",
            "The exporter rejects spans that break the span contract.",
            f"{on} rejects {{{{ $value | humanize }}}} spans/s for {{{{ $labels.reason }}}}.",
        ),
        _alert(
            s,
            "GpuscopeSeriesOverflow",
            f"sum by (job, instance, metric) (increase(gpuscope_series_overflow_total{s.sel()}"
            f"[{inc}])) > 0",
            s.for_(s.for_exporter_signals),
            "warning",
            "A request metric hit the exporter's series limit.",
            f"{on} sent {{{{ $value | humanize }}}} observations of {{{{ $labels.metric }}}} "
            f"to its overflow series in {inc}: raise --max-series or find the label "
            "that explodes.",
        ),
        _alert(
            s,
            "GpuscopeForwardingDropping",
            f"sum by (job, instance, reason) (increase(gpuscope_forward_spans_dropped_total"
            f"{s.sel()}[{inc}])) > 0",
            s.for_(s.for_exporter_signals),
            "warning",
            "The exporter drops spans it should forward.",
            f"{on} dropped {{{{ $value | humanize }}}} spans in {inc} "
            "({{ $labels.reason }}) instead of forwarding them to --forward-otlp.",
        ),
        _alert(
            s,
            "GpuscopeExporterDown",
            f"up{s.sel()} == 0",
            s.for_(s.for_exporter),
            "critical",
            "Prometheus cannot scrape a gpuscope exporter.",
            f"{on} of job {{{{ $labels.job }}}} has been down for {s.for_(s.for_exporter)}.",
        ),
        # up == 0 needs a target: without one (a renamed job, empty service discovery)
        # every other alert of the pack is silent too
        _alert(
            s,
            "GpuscopeExporterAbsent",
            f"absent(up{s.sel()})",
            s.for_(s.for_exporter),
            "critical",
            "Prometheus has no gpuscope exporter to scrape.",
            # absent() labels its series with the selector's equality matchers only
            f"{{{{ with $labels.job }}}}Job {{{{ . }}}}{{{{ else }}}}up{s.sel()}{{{{ end }}}} "
            "has no target: no request, GPU or exporter alert of gpuscope can fire.",
        ),
    ]


def worker_alerts(s: Settings) -> list[dict[str, Any]]:
    w, full = s.window, f"{s.kv_cache_full_ratio:g}"
    on = "{{ $labels.instance }}"
    return [
        _alert(
            s,
            "GpuscopeKvCacheExhausted",
            f"{KV_USAGE}{w} > {full}\nand on ({INSTANCE})\n{PREEMPTIONS}{w} > 0",
            s.for_(s.for_kv_cache),
            "warning",
            "The KV cache is full and running sequences are preempted.",
            f"The KV cache of {on} averaged {{{{ $value | humanizePercentage }}}} of its "
            f"blocks over {w} while running sequences were preempted: their tokens are "
            "computed again and latency grows.",
        ),
        _alert(
            s,
            "GpuscopeRequestsWaitingOnKvCache",
            f"{WAITING}{w}{{{s.kv_cache_endpoints}}} >= {s.kv_cache_waiting_requests:g}\n"
            f"and on ({INSTANCE})\n"
            f"{KV_USAGE}{w} > {full}",
            s.for_(s.for_kv_cache_capacity),
            "warning",
            "Requests wait for a full KV cache: the server is out of capacity.",
            f"{{{{ $value | humanize }}}} {{{{ $labels.endpoint }}}} requests waited on average "
            f"on {on} over {w} while its KV cache stayed over {s.kv_cache_full_ratio:.0%} full.",
        ),
        _alert(
            s,
            "GpuscopeWorkerMetricsDown",
            f"up{s.worker_sel()} == 0",
            s.for_(s.for_worker),
            "warning",
            "Prometheus cannot scrape an inference server's own metrics.",
            f"{on} of job {{{{ $labels.job }}}} has been down for {s.for_(s.for_worker)}: "
            "the serving-engine panels and the KV-cache alerts see nothing from it.",
        ),
    ]


def alerting_groups(s: Settings) -> list[dict[str, Any]]:
    return [
        {"name": "gpuscope-request-alerts", "interval": s.interval, "rules": [
            *request_alerts(s), *slo_alerts(s, s.latency_slo), *slo_alerts(s, s.ttft_slo),
        ]},
        {"name": "gpuscope-gpu-alerts", "interval": s.interval, "rules": gpu_alerts(s)},
        {"name": "gpuscope-exporter-alerts", "interval": s.interval,
         "rules": exporter_alerts(s)},
        {"name": "gpuscope-worker-alerts", "interval": s.interval, "rules": worker_alerts(s)},
    ]  # fmt: skip


# --- output --------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    pass


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)

HEADER = "# Generated by alerts/build.py from its Settings table; do not edit by hand.\n"


def render(groups: list[dict[str, Any]]) -> str:
    body = yaml.dump({"groups": groups}, Dumper=_Dumper, sort_keys=False, width=4096)
    return HEADER + body


def build(settings: Settings, out: Path) -> list[Path]:
    """Write the rule files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        out / "recording.yml": recording_groups(settings),
        out / "alerting.yml": alerting_groups(settings),
    }
    for path, groups in files.items():
        path.write_text(render(groups), encoding="utf-8")
    return list(files)


def alert_names(settings: Settings | None = None) -> list[str]:
    groups = alerting_groups(settings or Settings())
    return [rule["alert"] for group in groups for rule in group["rules"]]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "rules", help="output folder")
    parser.add_argument("--interval", help="rule evaluation interval (e.g. 1s)")
    parser.add_argument("--for", dest="for_override", help="every alert's for: (e.g. 2s)")
    parser.add_argument("--window", help="window of rates and averages (e.g. 10s)")
    parser.add_argument("--job-selector", help='e.g. job="gpuscope"')
    parser.add_argument("--worker-job-selector", help='e.g. job="gpuscope-worker"')
    parser.add_argument("--runbook", help="URL of runbook.md that alerts link to")
    args = parser.parse_args(argv)
    overrides = {
        k: v
        for k, v in vars(args).items()
        if k
        in {"interval", "for_override", "window", "job_selector", "worker_job_selector", "runbook"}
        and v is not None
    }
    for path in build(dataclasses.replace(Settings(), **overrides), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
