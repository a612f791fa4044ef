"""Alerting rules: ``Gpuscope*`` names, a severity, a static summary, a templated
description with the values that fired, and a ``runbook_url`` into ``alerts/runbook.md``.
"""

from __future__ import annotations

from typing import Any

from alerts.recording import (
    INSTANCE,
    KV_USAGE,
    PREEMPTIONS,
    QUEUE_DELAY,
    WAITING,
    gpu_conditions,
    indent,
    on_request_gpu,
)
from alerts.settings import GPU, SMG, THROTTLE_REASONS, Settings, Slo

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
    share = f"service_model_gpu:gpuscope_request_phase_seconds:share_mean{w}"
    p99 = f"service_model_gpu:gpuscope_request_phase_seconds:p99_{w}"
    where = WHERE
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
            f"service_model:gpuscope_request_errors:ratio_rate{w} > {s.error_ratio:g}",
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
                f"{SERVICE_MODEL} took longer than "
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
