"""Alerting rules: ``Gpuscope*`` names, a severity, a static summary, a templated
description with the values that fired, and a ``runbook_url`` into ``alerts/runbook.md``.
"""

from __future__ import annotations

from typing import Any

from alerts.recording import (
    BATCH_WAIT,
    ERRORS_RATIO,
    INSTANCE,
    KV_USAGE,
    MEMORY_USED_RATIO,
    PCIE_UTILIZATION,
    PHASE_P99,
    PHASE_SHARE_MEAN,
    PREEMPTIONS,
    QUEUE,
    QUEUE_DELAY,
    WAITING,
    gpu_conditions,
    indent,
    on_request_gpu,
    phase_is,
    slo_errors_ratio,
)
from alerts.settings import GPU, SMG, THROTTLE_REASONS, Settings, Slo
from dashboards.contract import ECC_TYPE, OVERFLOWED_METRIC, REASON, series
from gpuscope.exporter import definitions as exporter_rows
from gpuscope.exporter.gpu import metrics as gpu_rows

# Where a request alert is about: its service and model, the GPU (or, for requests
# that name none, the host) and the source the numbers came through.
WHERE = (
    "{{ $labels.service }}/{{ $labels.model }} on "
    "{{ with $labels.gpu }}GPU {{ . }}{{ else }}host {{ $labels.host }}{{ end }} "
    "({{ $labels.source }})"
)
SERVICE_MODEL = "{{ $labels.service }}/{{ $labels.model }} ({{ $labels.source }})"


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
    share, p99 = PHASE_SHARE_MEAN + w, PHASE_P99 + w
    where = WHERE
    return [
        _alert(
            s,
            "GpuscopeQueueTimeDominating",
            f"{share}{phase_is(QUEUE)} > {s.dominant_share:g}",
            s.for_(s.for_phase),
            "warning",
            "Requests spend most of their time waiting in the queue.",
            f"Queue time is {{{{ $value | humanizePercentage }}}} of the mean request time of "
            f"{where}: more requests arrive than the server admits.",
        ),
        _alert(
            s,
            "GpuscopeBatchWaitAboveWindow",
            batch_wait_expr(s, p99 + phase_is(BATCH_WAIT)),
            s.for_(s.for_phase),
            "warning",
            "Batch wait exceeds the batcher's configured window.",
            f"P99 batch wait of {where} is {{{{ $value | humanizeDuration }}}}, over "
            f"{s.batch_wait_tolerance:g}x the {_window_text(s)} window.",
        ),
        _alert(
            s,
            "GpuscopeGpuUnderfed",
            f"{share}{phase_is(QUEUE)} > {s.underfed_queue_share:g}\n"
            f"and on ({SMG}) (\n  {indent(on_request_gpu(s, 'underfed'))}\n)",
            s.for_(s.for_phase),
            "warning",
            "Requests queue while the GPU's SMs are underused.",
            f"Queue time is {{{{ $value | humanizePercentage }}}} of the mean request time of "
            f"{where} while the SM occupancy of {{{{ if $labels.uuid }}}}that GPU"
            f"{{{{ else }}}}every GPU of the host{{{{ end }}}} stays under "
            f"{s.underfed_occupancy:.0%}: the batcher does not feed the GPU.",
        ),
        _alert(
            s,
            "GpuscopeErrorRatioHigh",
            f"{ERRORS_RATIO}{w} > {s.error_ratio:g}",
            s.for_(s.for_error_ratio),
            "critical",
            "Many model requests fail with a server error.",
            "{{ $value | humanizePercentage }} of the requests of "
            + SERVICE_MODEL
            + " failed (5xx; for vLLM's /metrics, finished with an error) over the last "
            + w
            + ".",
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
    ratio = slo_errors_ratio(slo)
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
                f"{SERVICE_MODEL} took longer than "
                f"{slo.le} s (objective: {slo.objective:.3g} within {slo.le} s; "
                f"burn-rate windows {windows}).",
            )
        )
    return alerts


def gpu_alerts(s: Settings) -> list[dict[str, Any]]:
    w, inc = s.window, s.increase_window
    gpu = gpu_conditions(s)
    throttling = s.sel(f'{REASON}=~"{"|".join(THROTTLE_REASONS)}"')
    uncorrected = s.sel(f'{ECC_TYPE}="volatile_uncorrected"')
    on_gpu = "GPU {{ $labels.gpu }} ({{ $labels.uuid }})"
    return [
        _alert(
            s,
            "GpuscopeGpuClockThrottled",
            f"{series(gpu_rows.CLOCK_EVENT_ACTIVE)}{throttling} == 1\n"
            f"and on ({GPU}) (\n  {indent(gpu['throttled'])}\n)",
            s.for_(s.for_gpu_hardware),
            "warning",
            "A GPU under load runs with its SM clock held down.",
            f"{on_gpu} is held down by {{{{ $labels.reason }}}} while busy: its SM clock "
            f"averaged under {s.throttle_clock_ratio:.0%} of its maximum over {w}.",
        ),
        _alert(
            s,
            "GpuscopeGpuPcieSaturated",
            f"{PCIE_UTILIZATION}{w} > {s.pcie_utilization:g}",
            s.for_(s.for_gpu_hardware),
            "warning",
            "A GPU's PCIe link runs near its capacity.",
            f"{on_gpu} {{{{ $labels.direction }}}}s at {{{{ $value | humanizePercentage }}}} "
            "of its PCIe link's capacity: host-device transfers limit throughput.",
        ),
        _alert(
            s,
            "GpuscopeGpuMemoryNearlyFull",
            f"{MEMORY_USED_RATIO} > {s.memory_used_ratio:g}",
            s.for_(s.for_gpu_hardware),
            "warning",
            "A GPU's memory is nearly full.",
            f"{on_gpu} uses {{{{ $value | humanizePercentage }}}} of its memory.",
        ),
        _alert(
            s,
            "GpuscopeGpuXidErrors",
            f"increase({series(gpu_rows.XID_EVENTS)}{s.sel()}[{inc}]) > 0",
            s.for_("0m"),
            "warning",
            "A GPU reported XID errors.",
            f"{on_gpu} reported {{{{ $value | humanize }}}} XID errors in {inc}; "
            f"{series(gpu_rows.XID_ERRORS)} names the codes.",
        ),
        _alert(
            s,
            "GpuscopeGpuEccUncorrectedErrors",
            f"increase({series(gpu_rows.ECC_ERRORS)}{uncorrected}[{inc}]) > 0",
            s.for_("0m"),
            "critical",
            "A GPU reported uncorrectable ECC errors.",
            f"{on_gpu} reported {{{{ $value | humanize }}}} uncorrectable ECC errors in {inc}.",
        ),
        _alert(
            s,
            "GpuscopeGpuLost",
            f"{series(gpu_rows.UP)}{s.sel()} == 0",
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
            f"1 - avg_over_time({series(gpu_rows.COLLECTOR_SUCCESS)}{s.sel()}[{w}]) > 0.5",
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
    received = series(exporter_rows.SPANS_RECEIVED) + s.sel()
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
            f"sum by (job, instance, {REASON}) "
            f"(rate({series(exporter_rows.SPANS_REJECTED)}{s.sel()}[{s.window}])) > 0",
            s.for_(s.for_exporter_signals),
            "warning",
            "The exporter rejects spans that break the span contract.",
            f"{on} rejects {{{{ $value | humanize }}}} spans/s for {{{{ $labels.reason }}}}.",
        ),
        _alert(
            s,
            "GpuscopeSeriesOverflow",
            f"sum by (job, instance, {OVERFLOWED_METRIC}) "
            f"(increase({series(exporter_rows.SERIES_OVERFLOW)}{s.sel()}[{inc}])) > 0",
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
            f"sum by (job, instance, {REASON}) "
            f"(increase({series(exporter_rows.FORWARD_SPANS_DROPPED)}{s.sel()}[{inc}])) > 0",
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
            f"up{s.worker_sel()} == 0\nor\nup{s.vllm_sel()} == 0",
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
