"""Recording rules, named ``level:metric:operation``.

A level of ``gpu`` keeps the ``gpu`` and ``uuid`` labels (the UUID is unique across
hosts, so it is the join key between request metrics and GPU metrics);
``service_model_gpu`` keeps ``service``, ``model``, ``gpu`` and ``uuid``. The serving
engine's series (``gpuscope_worker_*``, the worker's own ``/metrics``, scraped as a job
of its own) are recorded per ``instance`` (keeping ``job`` and ``instance``) and, for its
configuration, per ``model`` (joined from ``gpuscope_worker_info``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from settings import GPU, SMG, THROTTLE_REASONS, Settings, Slo, seconds_of

# The PCIe per-lane table is the dashboards' (dashboards/pcie.py), so that the panels
# and the rules agree on every generation's capacity.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboards"))
from pcie import LINK_GENERATIONS, lane_bytes_per_second


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
    for window in sorted({*s.slo_windows(), w}, key=seconds_of):
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
        "throttled": f"and on ({GPU}) ({indent(gpu['throttled'])})",
    }
    candidates = "\nor\n".join(
        f"label_replace(\n  ({base} * 0 + {rank})"
        + (f"\n  {indent(conditions[cause])}" if conditions[cause] else "")
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


def indent(text: str) -> str:
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
