"""Alerting rules: ``Gpuscope*`` names, a severity, a static summary, a templated
description with the values that fired, and a ``runbook_url`` into ``alerts/runbook.md``.
"""

from __future__ import annotations

from typing import Any

from alerts.alert_rule import alert
from alerts.gpu_rules import INSTANCE_GPU, MEMORY_USED_RATIO, PCIE_UTILIZATION, gpu_conditions
from alerts.promql import INSTANCE, indent, with_host
from alerts.recording import (
    PHASE_P99,
    PHASE_SHARE_MEAN,
    PREEMPTIONS,
    QUEUE_DELAY,
    on_request_gpu,
    phase_is,
)
from alerts.sharing import sharing_alerts
from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract import gpu as gpu_rows
from pack.contract import (
    ECC_TYPE,
    MODEL,
    OVERFLOWED_METRIC,
    REASON,
    REQUESTED,
    WORKER_REQUESTS,
    series,
)
from pack.engines import ENGINES, ROW_RULED
from pack.recorded import (
    BATCH_WAIT,
    ERRORS_RATIO,
    KV_USAGE,
    QUEUE,
    WAITING,
    slo_errors_ratio,
)
from pack.settings import SMG, THROTTLE_REASONS, Settings, Slo

# Where a request alert is about: its service and model, the GPU (or, for requests
# that name none, the host) and the source the numbers came through.
WHERE = (
    "{{ $labels.service }}/{{ $labels.model }} on "
    "{{ with $labels.gpu }}GPU {{ . }}{{ else }}host {{ $labels.host }}{{ end }} "
    "({{ $labels.source }})"
)
SERVICE_MODEL = "{{ $labels.service }}/{{ $labels.model }} ({{ $labels.source }})"


def request_alerts(settings: Settings) -> list[dict[str, Any]]:
    w = settings.window
    share, p99 = PHASE_SHARE_MEAN + w, PHASE_P99 + w
    where = WHERE
    return [
        alert(
            settings,
            "GpuscopeQueueTimeDominating",
            f"{share}{phase_is(QUEUE)} > {settings.dominant_share:g}",
            settings.for_(settings.for_phase),
            "warning",
            "Requests spend most of their time waiting in the queue.",
            f"Queue time is {{{{ $value | humanizePercentage }}}} of the mean request time of "
            f"{where}: more requests arrive than the server admits.",
        ),
        alert(
            settings,
            "GpuscopeBatchWaitAboveWindow",
            batch_wait_expr(settings, p99 + phase_is(BATCH_WAIT)),
            settings.for_(settings.for_phase),
            "warning",
            "Batch wait exceeds the batcher's configured window.",
            f"P99 batch wait of {where} is {{{{ $value | humanizeDuration }}}}, over "
            f"{settings.batch_wait_tolerance:g}x the {_window_text(settings)} window "
            f"plus {settings.batch_wait_slack_seconds * 1000:g}ms.",
        ),
        alert(
            settings,
            "GpuscopeGpuUnderfed",
            f"{share}{phase_is(QUEUE)} > {settings.underfed_queue_share:g}\n"
            f"and on ({SMG}) (\n  {indent(on_request_gpu(settings, 'underfed'))}\n)",
            settings.for_(settings.for_phase),
            "warning",
            "Requests queue while the GPU's SMs are underused.",
            f"Queue time is {{{{ $value | humanizePercentage }}}} of the mean request time of "
            f"{where} while the SM occupancy of {{{{ if $labels.uuid }}}}that GPU"
            f"{{{{ else }}}}every GPU of the host{{{{ end }}}} stays under "
            f"{settings.underfed_occupancy:.0%}: the batcher does not feed the GPU.",
        ),
        alert(
            settings,
            "GpuscopeErrorRatioHigh",
            f"{ERRORS_RATIO}{w} > {settings.error_ratio:g}",
            settings.for_(settings.for_error_ratio),
            "critical",
            "Many model requests fail with a server error.",
            "{{ $value | humanizePercentage }} of the requests of "
            + SERVICE_MODEL
            + " failed (5xx; for vLLM's /metrics, finished with an error) over the last "
            + w
            + ".",
        ),
    ]


def batch_wait_expr(settings: Settings, p99: str) -> str:
    """Over the tolerance times the window the model's workers export (when above
    zero), else times the table's window; plus the slack in both cases."""
    configured = f"({QUEUE_DELAY} > 0)"
    tolerance, slack = settings.batch_wait_tolerance, settings.batch_wait_slack_seconds
    # rounded: 0.005 * 2 + 0.02 is 0.030000000000000002 in binary floating point
    table = round(settings.batch_wait_window_seconds * tolerance + slack, 9)
    return (
        f"(\n  {p99}\n  > on ({MODEL}) group_left ()\n"
        f"  {tolerance:g} * {configured} + {slack:g}\n)\nor\n"
        f"(\n  {p99} > {table:g}\n"
        f"  unless on ({MODEL})\n  {configured}\n)"
    )


def _window_text(settings: Settings) -> str:
    """The window in the alert's text: the exported one, else the table's."""
    lookup = f'printf "{QUEUE_DELAY}{{{MODEL}=%q}} > 0" $labels.{MODEL} | query'
    return (
        f"{{{{ with {lookup} }}}}{{{{ . | first | value | humanizeDuration }}}}"
        f"{{{{ else }}}}{settings.batch_wait_window_seconds * 1000:g}ms{{{{ end }}}}"
    )


def slo_alerts(settings: Settings, slo: Slo) -> list[dict[str, Any]]:
    ratio = slo_errors_ratio(slo)
    budget = 1 - slo.objective
    name = "Gpuscope" + {"latency": "Latency", "ttft": "TimeToFirstToken"}[slo.name]
    alerts = []
    for kind, burns, severity, for_ in (
        ("Fast", settings.page_burns, "critical", settings.for_slo_page),
        ("Slow", settings.ticket_burns, "warning", settings.for_slo_ticket),
    ):
        expr = "\nor\n".join(
            f"(\n  {ratio}{long} > {rate:g} * {budget:.6g}\n  and\n"
            f"  {ratio}{short} > {rate:g} * {budget:.6g}\n)"
            for long, short, rate in burns
        )
        windows = ", ".join(f"{long}/{short} at {rate:g}x" for long, short, rate in burns)
        alerts.append(
            alert(
                settings,
                f"{name}SLOBudgetBurn{kind}",
                expr,
                settings.for_(for_),
                severity,
                f"{slo.title} burns its error budget {'fast' if kind == 'Fast' else 'steadily'}.",
                f"{{{{ $value | humanizePercentage }}}} of the requests of "
                f"{SERVICE_MODEL} took longer than "
                f"{slo.le} s (objective: {slo.objective:.3g} within {slo.le} s; "
                f"burn-rate windows {windows}).",
            )
        )
    return alerts


def gpu_alerts(settings: Settings) -> list[dict[str, Any]]:
    w, inc = settings.window, settings.increase_window
    gpu = gpu_conditions(settings)
    throttling = settings.gpu_sel(f'{REASON}=~"{"|".join(THROTTLE_REASONS)}"')
    uncorrected = settings.gpu_sel(f'{ECC_TYPE}="volatile_uncorrected"')
    on_gpu = "GPU {{ $labels.gpu }} ({{ $labels.uuid }})"
    return [
        alert(
            settings,
            "GpuscopeGpuClockThrottled",
            f"{series(gpu_rows.CLOCK_EVENT_ACTIVE)}{throttling} == 1\n"
            f"and on ({INSTANCE_GPU}) (\n  {indent(gpu['throttled'])}\n)",
            settings.for_(settings.for_gpu_hardware),
            "warning",
            "A GPU under load runs with its SM clock held down.",
            f"{on_gpu} is held down by {{{{ $labels.reason }}}} while busy: its SM clock "
            f"averaged under {settings.throttle_clock_ratio:.0%} of its maximum over {w}.",
        ),
        alert(
            settings,
            "GpuscopeGpuPcieSaturated",
            f"{PCIE_UTILIZATION}{w} > {settings.pcie_utilization:g}",
            settings.for_(settings.for_gpu_hardware),
            "warning",
            "A GPU's PCIe link runs near its capacity.",
            f"{on_gpu} {{{{ $labels.direction }}}}s at {{{{ $value | humanizePercentage }}}} "
            "of its PCIe link's capacity: host-device transfers limit throughput.",
        ),
        alert(
            settings,
            "GpuscopeGpuMemoryNearlyFull",
            f"{MEMORY_USED_RATIO} > {settings.memory_used_ratio:g}",
            settings.for_(settings.for_gpu_hardware),
            "warning",
            "A GPU's memory is nearly full.",
            f"{on_gpu} uses {{{{ $value | humanizePercentage }}}} of its memory.",
        ),
        alert(
            settings,
            "GpuscopeGpuXidErrors",
            f"increase({series(gpu_rows.XID_EVENTS)}{settings.gpu_sel()}[{inc}]) > 0",
            settings.for_("0m"),
            "warning",
            "A GPU reported XID errors.",
            # No count: increase() extrapolates to the window's edges, so one XID can
            # read as 1.5; the counters themselves are exact.
            f"{on_gpu} reported XID errors within {inc}; "
            f"{series(gpu_rows.XID_ERRORS)} counts them by code.",
        ),
        alert(
            settings,
            "GpuscopeGpuEccUncorrectedErrors",
            f"increase({series(gpu_rows.ECC_ERRORS)}{uncorrected}[{inc}]) > 0",
            settings.for_("0m"),
            "critical",
            "A GPU reported uncorrectable ECC errors.",
            f"{on_gpu} reported uncorrectable ECC errors within {inc}; "
            f"{series(gpu_rows.ECC_ERRORS)} counts them.",
        ),
        alert(
            settings,
            "GpuscopeGpuLost",
            f"{series(gpu_rows.UP)}{settings.gpu_sel()} == 0",
            settings.for_(settings.for_gpu_lost),
            "critical",
            "A GPU cannot be read any more.",
            f"{on_gpu} on {{{{ $labels.instance }}}} stopped answering (lost, fallen off "
            "the bus or the driver failed); its other series are gone.",
        ),
        alert(
            settings,
            "GpuscopeGpuCollectorFailing",
            # the share of failed runs, not the last one: one success between failures
            # would restart ``for:`` and a collector failing most runs would never alert
            f"1 - avg_over_time({series(gpu_rows.COLLECTOR_SUCCESS)}{settings.sel()}[{w}]) > 0.5",
            settings.for_(settings.for_gpu_hardware),
            "warning",
            "A GPU metrics collector keeps failing.",
            "Collector {{ $labels.collector }} on {{ $labels.instance }} failed "
            f"{{{{ $value | humanizePercentage }}}} of its runs over {w}: GPU metrics are "
            "stale or missing.",
        ),
    ]


def gpu_source_alerts(settings: Settings) -> list[dict[str, Any]]:
    """An exporter that serves no GPU although its --gpu-source asked for one (anything
    but ``none``): ``auto`` that found no driver, or a source that found no GPU. The
    expectation is the exporter's own flag, served on ``gpuscope_gpu_source_info``, so
    the rule needs nothing per site; a host without GPUs says ``--gpu-source none``."""
    source = series(exporter_rows.GPU_SOURCE) + settings.sel(f'{REQUESTED}!="none"')
    return [
        alert(
            settings,
            "GpuscopeGpuSourceMissing",
            f"{source}\nunless on (job, instance)\n{series(gpu_rows.INFO)}{settings.sel()}",
            settings.for_(settings.for_gpu_source),
            "warning",
            "An exporter that should read GPUs serves none.",
            "{{ $labels.instance }} runs with --gpu-source {{ $labels.requested }} but serves "
            "no GPU (source in use: {{ $labels.source }}): no GPU metric or GPU alert "
            "exists for its host.",
        ),
    ]


def requests_arriving(settings: Settings) -> str:
    """Per host, > 0 where requests arrived within ``window`` by the servers' own
    counters: the reference worker's and each engine's of the engine table
    (what they count whether or not their tracing works). The window is shorter than
    ``spans_idle_window``, so that when the load stops, its requests leave their window
    before its spans leave theirs: the spans of the last requests reach the exporter,
    and its scrape, after the server's scrape has counted those requests."""
    idle = settings.window
    counters = [
        WORKER_REQUESTS + settings.worker_sel(),
        *(
            counter + settings.engine_sel(engine)
            for engine in ENGINES
            for counter in engine.requests
        ),
    ]
    per_host = (
        f"sum by (host) (\n  {indent(with_host(settings, f'increase({c}[{idle}])'))}\n) > 0"
        for c in counters
    )
    return "\nor\n".join(per_host)


def spans_not_arriving(settings: Settings) -> str:
    """No span reached an exporter within ``spans_idle_window`` while requests are known to
    arrive (within ``window``): by the servers' own counters on its host, or on a host
    without an exporter of its own (compose's services each have their own host name;
    one exporter takes the spans of them all), where it received spans before (so that
    an exporter kept only for its GPUs beside an untraced engine stays quiet); or at the
    exporter itself as OTLP export requests it refused (a wrong token, a full budget).
    Without either, no spans is no traffic: an idle model alerts nobody."""
    idle, sel = settings.spans_idle_window, settings.sel()
    received = series(exporter_rows.SPANS_RECEIVED) + sel
    refused = f"increase({series(exporter_rows.OTLP_REQUESTS_REJECTED)}{sel}[{settings.window}])"
    arriving = indent(indent(requests_arriving(settings)))
    same_host = (
        f"(\n  {indent(with_host(settings, f'{received} > 0'))}\n  and on (host)\n"
        f"  (\n    {arriving}\n  )\n)"
    )
    exporter_hosts = indent(indent(with_host(settings, received)))
    no_exporter = (
        f"(\n  {received} > 0\n  and on ()\n"
        f"  (\n    (\n      {indent(arriving)}\n    )\n    unless on (host)\n"
        f"    {exporter_hosts}\n  )\n)"
    )
    known = f"{same_host}\nor\n{no_exporter}\nor\nsum by (job, instance) ({refused}) > 0"
    return f"rate({received}[{idle}]) == 0\nand on (job, instance)\n(\n  {indent(known)}\n)"


def exporter_alerts(settings: Settings) -> list[dict[str, Any]]:
    w, inc, idle = settings.window, settings.increase_window, settings.spans_idle_window
    sel, down_for = settings.sel(), settings.for_(settings.for_exporter)
    on = "{{ $labels.instance }}"
    return [
        alert(
            settings,
            "GpuscopeSpansNotArriving",
            spans_not_arriving(settings),
            settings.for_(settings.for_exporter_signals),
            "warning",
            "Requests arrive but the exporter receives no spans.",
            f"{on} received no span in the last {idle} while requests arrived in the last "
            f"{w} (counted by the servers on its host or on a host without an exporter, or "
            "OTLP exports it refused): the application's tracing or its path to the "
            "exporter is broken.",
        ),
        alert(
            settings,
            "GpuscopeSpansRejected",
            f"sum by (job, instance, {REASON}) "
            f"(rate({series(exporter_rows.SPANS_REJECTED)}{settings.sel()}[{w}])) > 0",
            settings.for_(settings.for_exporter_signals),
            "warning",
            "The exporter rejects spans that break the span contract.",
            f"{on} rejects {{{{ $value | humanize }}}} spans/s for {{{{ $labels.reason }}}}.",
        ),
        alert(
            settings,
            "GpuscopeSeriesOverflow",
            f"sum by (job, instance, {OVERFLOWED_METRIC}) "
            f"(increase({series(exporter_rows.SERIES_OVERFLOW)}{settings.sel()}[{inc}])) > 0",
            settings.for_(settings.for_exporter_signals),
            "warning",
            "A request metric hit the exporter's series limit.",
            f"{on} sent {{{{ $value | humanize }}}} observations of {{{{ $labels.metric }}}} "
            f"to its overflow series in {inc}: raise --max-series or find the label "
            "that explodes.",
        ),
        alert(
            settings,
            "GpuscopeForwardingDropping",
            f"sum by (job, instance, {REASON}) "
            f"(increase({series(exporter_rows.FORWARD_SPANS_DROPPED)}{settings.sel()}[{inc}])) > 0",
            settings.for_(settings.for_exporter_signals),
            "warning",
            "The exporter drops spans it should forward.",
            f"{on} dropped {{{{ $value | humanize }}}} spans in {inc} "
            "({{ $labels.reason }}) instead of forwarding them to --forward-otlp.",
        ),
        alert(
            settings,
            "GpuscopeExporterDown",
            f"up{settings.sel()} == 0",
            settings.for_(settings.for_exporter),
            "critical",
            "Prometheus cannot scrape a gpuscope exporter.",
            f"{on} of job {{{{ $labels.job }}}} has been down for {down_for}.",
        ),
        # up == 0 needs a target: without one (a renamed job, empty service discovery)
        # every other alert of the pack is silent too
        alert(
            settings,
            "GpuscopeExporterAbsent",
            f"absent(up{settings.sel()})",
            settings.for_(settings.for_exporter),
            "critical",
            "Prometheus has no gpuscope exporter to scrape.",
            # absent() labels its series with the selector's equality matchers only
            f"{{{{ with $labels.job }}}}Job {{{{ . }}}}{{{{ else }}}}up{sel}{{{{ end }}}} "
            "has no target: no request, GPU or exporter alert of gpuscope can fire.",
        ),
    ]


def worker_alerts(settings: Settings) -> list[dict[str, Any]]:
    w, full_ratio = settings.window, settings.kv_cache_full_ratio
    full, waiting = f"{full_ratio:g}", settings.kv_cache_waiting_requests
    down_for = settings.for_(settings.for_worker)
    on = "{{ $labels.instance }}"
    return [
        alert(
            settings,
            "GpuscopeKvCacheExhausted",
            f"{KV_USAGE}{w} > {full}\nand on ({INSTANCE})\n{PREEMPTIONS}{w} > 0",
            settings.for_(settings.for_kv_cache),
            "warning",
            "The KV cache is full and running sequences are preempted.",
            f"The KV cache of {on} averaged {{{{ $value | humanizePercentage }}}} of its "
            f"blocks over {w} while running sequences were preempted: their tokens are "
            "computed again and latency grows.",
        ),
        alert(
            settings,
            "GpuscopeRequestsWaitingOnKvCache",
            f"{WAITING}{w}{{{settings.kv_cache_endpoints}}} >= {waiting:g}\n"
            f"and on ({INSTANCE})\n"
            f"{KV_USAGE}{w} > {full}",
            settings.for_(settings.for_kv_cache_capacity),
            "warning",
            "Requests wait for a full KV cache: the server is out of capacity.",
            f"{{{{ $value | humanize }}}} {{{{ $labels.endpoint }}}} requests waited on average "
            f"on {on} over {w} while its KV cache stayed over {full_ratio:.0%} full.",
        ),
        alert(
            settings,
            "GpuscopeWorkerMetricsDown",
            # the worker's, and the engines' whose state stands for the worker's (vLLM's)
            "\nor\n".join(
                f"up{selector} == 0"
                for selector in (
                    settings.worker_sel(),
                    *(settings.engine_sel(e) for e in ENGINES if e.beside_spans),
                )
            ),
            settings.for_(settings.for_worker),
            "warning",
            "Prometheus cannot scrape an inference server's own metrics.",
            f"{on} of job {{{{ $labels.job }}}} has been down for {down_for}: "
            "the serving-engine panels and the KV-cache alerts see nothing from it.",
        ),
    ]


def engine_alerts(settings: Settings) -> list[dict[str, Any]]:
    """An engine's own ``/metrics`` gone (one expression per job of ``ROW_RULED``; vLLM's
    is the worker's alert): a target Prometheus cannot scrape, or a job whose targets
    all went away although it had one within ``engine_seen_window``. A job never scraped
    there is an engine this site does not run: no alert."""
    seen = settings.engine_seen_window
    parts = []
    for engine in ROW_RULED:
        up = f"up{settings.engine_sel(engine)}"
        parts.append(
            f"{up} == 0\nor\n(\n  absent({up})\n"
            f"  and on ()\n  count(max_over_time({up}[{seen}]))\n)"
        )
    return [
        alert(
            settings,
            "GpuscopeEngineMetricsDown",
            "\nor\n".join(parts),
            settings.for_(settings.for_worker),
            "warning",
            "Prometheus cannot scrape a serving engine's own metrics.",
            "{{ with $labels.instance }}{{ . }} of job {{ $labels.job }} cannot be scraped"
            "{{ else }}Job {{ $labels.job }} has no target left{{ end }}: that engine's "
            "requests, errors and verdict read as no traffic.",
        ),
    ]


def alerting_groups(settings: Settings) -> list[dict[str, Any]]:
    groups = {
        "gpuscope-request-alerts": [
            *request_alerts(settings),
            *slo_alerts(settings, settings.latency_slo),
            *slo_alerts(settings, settings.ttft_slo),
        ],
        "gpuscope-gpu-alerts": [*gpu_alerts(settings), *gpu_source_alerts(settings)],
        "gpuscope-sharing-alerts": sharing_alerts(settings),
        "gpuscope-exporter-alerts": exporter_alerts(settings),
        "gpuscope-worker-alerts": [*worker_alerts(settings), *engine_alerts(settings)],
    }
    return [
        {"name": name, "interval": settings.interval, "rules": rules}
        for name, rules in groups.items()
    ]
