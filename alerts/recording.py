"""Recording rules, named ``level:metric:operation``.

A level of ``gpu`` keeps the ``gpu`` and ``uuid`` labels (the UUID is unique across
hosts, so it is the join key between request metrics and GPU metrics); ``host_gpu``
adds ``host``, the exporter's ``instance`` without its port. ``service_model_gpu``
keeps ``source``, ``service``, ``model``, ``host``, ``gpu`` and ``uuid``;
``service_model`` keeps ``source``, ``service`` and ``model``.

``source`` says which path the numbers came through (``pack/engines/``):
``spans`` from gpuscope's exporter, ``vllm`` from vLLM's own ``/metrics`` mapped onto
the same names. Every statistic is computed within one source, so requests seen
through both paths are never added up. vLLM's ``/metrics`` names no GPU: its series
take the GPU their scrape target's pod holds (``pod_join``: dcgm-exporter's holder
``pod`` / ``namespace``); so do the exporter's series that name none, through the
pod their spans came from (``spans_by_pod``). Requests that still name no GPU (a pod
holding several GPUs or none dcgm-exporter names, a target or spans without a pod)
meet the GPU conditions of their ``host`` instead of their GPU's (``gpu_rules.py``
records the GPU side and its conditions).

The serving engine's series (``gpuscope_worker_*``, the worker's own ``/metrics``, or
vLLM's, each scraped as a job of its own) are recorded per ``instance`` (keeping
``job`` and ``instance``) and, for its configuration, per ``model`` (joined from
``gpuscope_worker_info``).
"""

from __future__ import annotations

from typing import Any

from alerts.gpu_rules import gpu_conditions, gpu_rules, host_conditions
from alerts.pod_join import by_pod, mig_conditions, spans_by_pod
from alerts.promql import INSTANCE, copy_label, indent, record_rule, with_host
from gpuscope.contract.labels import UUID
from pack.contract import (
    CODE,
    ENDPOINT,
    MODEL,
    PHASE,
    SERVICE,
    WORKER_INFO,
    WORKER_KV_USAGE,
    WORKER_MAX_QUEUE_DELAY,
    WORKER_PREEMPTIONS,
    WORKER_RUNNING,
    WORKER_WAITING,
    phase,
)

# The table of sources and of vLLM's series is the dashboards' (pack/engines/), which
# the boards' notes use too.
from pack.engines import (
    DURATION_HISTOGRAM,
    HISTOGRAM_KEY,
    PHASE_HISTOGRAM,
    REQUEST_HISTOGRAMS,
    SPANS,
    STAGE_HISTOGRAM,
    TOKEN_HISTOGRAMS,
    VLLM,
    VLLM_ERROR_REASON,
    VLLM_FINISHED,
    VLLM_KV_USAGE,
    VLLM_PREEMPTIONS,
    VLLM_RUNNING,
    VLLM_WAITING,
    vllm_histograms_for,
)
from pack.recorded import (
    BATCH_WAIT,
    COMPUTE,
    ERRORS_RATIO,
    FINISHED_RATE,
    KV_USAGE,
    QUEUE,
    REQUESTS_RATE,
    RUNNING,
    VERDICT,
    VERDICT_CAUSES,
    WAITING,
    rate_record,
    slo_errors_ratio,
)
from pack.settings import (
    GPU,
    HOST_GPU,
    REQUEST,
    SERVICE_MODEL,
    SMG,
    Settings,
    Slo,
    seconds_of,
)

# --- sources ------------------------------------------------------------------------


def _vllm(settings: Settings, expr: str, by: str) -> str:
    """``sum by (by)`` of ``expr`` over vLLM's series with gpuscope's label names: model
    from ``model_name``, service from the scrape's ``job``; vLLM's ``engine`` ranks are
    added up. When ``by`` keeps the host, also ``host`` from ``instance``, and the
    ``host``, ``gpu`` and ``uuid`` of the one GPU the target's pod holds (``pod_join``)."""
    if "host" in by:
        expr = with_host(settings, expr)
    relabelled = copy_label(copy_label(expr, MODEL, "model_name"), SERVICE, "job")
    if "host" in by:
        relabelled = by_pod(relabelled)
        by = by.replace("host", f"host, {GPU}", 1)
    return f"sum by ({by}) (\n  {indent(relabelled)}\n)"


# --- recording rules ----------------------------------------------------------------


def stat_record(hist: str, statistic: str) -> str:
    """The recorded ``statistic`` of ``hist`` (``mean``, ``p99_``, ``share_mean``,
    ``share_p99_``) at the same level, without its window."""
    return f"service_model_gpu:{hist}:{statistic}"


PHASE_SHARE_MEAN = stat_record(PHASE_HISTOGRAM, "share_mean")
PHASE_P99 = stat_record(PHASE_HISTOGRAM, "p99_")


def histogram_rate_rules(settings: Settings, hist: str) -> list[dict[str, Any]]:
    """Per source, service, model, host and GPU: the rates of ``hist``'s sum, count and
    buckets, from the exporter (``source="spans"``) and from the vLLM histograms that
    stand for it (``source="vllm"``, phase or stage set by the rule)."""
    w, key = settings.window, HISTOGRAM_KEY.get(hist)
    # the duration of model requests only, as vLLM counts them (not /v1/models, /health)
    request = settings.slo_selector if hist == DURATION_HISTOGRAM else ""
    # those the exporter's process join gave no GPU, and the others (``spans_by_pod``)
    unnamed_sel, named_sel = (
        settings.sel(", ".join(m for m in (request, f'{UUID}{op}""') if m)) for op in ("=", "!=")
    )
    rules = []
    for suffix in ("sum", "count", "bucket"):
        record = rate_record(hist, suffix) + w
        le = ", le" if suffix == "bucket" else ""
        by = REQUEST + (f", {key}" if key else "") + le
        unnamed, named = (
            with_host(settings, f"rate({hist}_{suffix}{sel}[{w}])")
            for sel in (unnamed_sel, named_sel)
        )
        spans = spans_by_pod(unnamed, named)
        rules.append(record_rule(record, f"sum by ({by}) (\n  {indent(spans)}\n)", source=SPANS))
        for native in vllm_histograms_for(hist):
            labels = {"source": VLLM, **({key: native.key_value} if key else {})}
            rate = f"rate({native.native}_{suffix}{settings.engine_sel(VLLM)}[{w}])"
            expr = _vllm(settings, rate, f"{SERVICE_MODEL}, host{le}")
            rules.append(record_rule(record, expr, **labels))
    return rules


def histogram_stat_rules(settings: Settings, hist: str, *, shares: bool) -> list[dict[str, Any]]:
    """Mean and P99 per source, service, model, host, GPU and phase (or stage); for the
    phases, also each one's share of the mean and its P99 against the request's P99."""
    w = settings.window
    mean, p99 = stat_record(hist, "mean") + w, stat_record(hist, "p99_") + w
    total, count = rate_record(hist, "sum") + w, rate_record(hist, "count") + w
    rules = [
        # "> 0": an idle series has no mean (and no share or verdict), not a NaN one
        record_rule(mean, f"{total}\n/\n({count} > 0)"),
        # ">= 0": an idle histogram's quantile is NaN (0/0); latencies are never
        # negative, so this keeps every real P99 and drops only the NaN
        record_rule(p99, f"histogram_quantile(0.99, {rate_record(hist, 'bucket')}{w})\n>= 0"),
    ]
    if not shares:
        return rules
    request_p99 = stat_record(DURATION_HISTOGRAM, "p99_") + w
    return [
        *rules,
        # Phases add up to the request, so each mean's share of their sum is its
        # share of the mean latency (per source: never one source's phases over
        # another's).
        record_rule(
            stat_record(hist, "share_mean") + w,
            f"{mean}\n/ on ({SMG}) group_left ()\nsum by ({SMG}) ({mean})",
        ),
        # Each phase's P99 over the requests' own end-to-end P99 (same source,
        # service, model, host and GPU): a phase near 1 is where the slowest requests
        # spend their time. Not over the sum of the per-phase P99s: the slowest
        # requests differ per phase, so that sum is longer than any request took and
        # its shares describe no request. A phase is part of its request, so its P99
        # is at most the request's (up to the buckets' interpolation); the ratios need
        # not add up to 1.
        record_rule(
            stat_record(hist, "share_p99_") + w,
            f"{p99}\n/ on ({SMG}) group_left ()\n({request_p99} > 0)",
        ),
    ]


def phase_rules(settings: Settings) -> list[dict[str, Any]]:
    return [
        *(rule for hist in REQUEST_HISTOGRAMS for rule in histogram_rate_rules(settings, hist)),
        # the requests' own P99, before the phases' share of it reads it
        *histogram_stat_rules(settings, DURATION_HISTOGRAM, shares=False),
        *histogram_stat_rules(settings, PHASE_HISTOGRAM, shares=True),
        # the parts of compute: never shares of the phases' sum (they are in compute)
        *histogram_stat_rules(settings, STAGE_HISTOGRAM, shares=False),
    ]


def engine_histogram_rules(settings: Settings, hist: str) -> list[dict[str, Any]]:
    """The rates of ``hist``'s sum, count and buckets from the engines that report it
    (``vllm``; gpuscope's exporter does not serve it), at the same level as the
    request histograms', without a GPU (the engines name none)."""
    w, rules = settings.window, []
    for native in vllm_histograms_for(hist):
        for suffix in ("sum", "count", "bucket"):
            le = ", le" if suffix == "bucket" else ""
            rate = f"rate({native.native}_{suffix}{settings.engine_sel(VLLM)}[{w}])"
            expr = _vllm(settings, rate, f"{SERVICE_MODEL}, host{le}")
            rules.append(record_rule(rate_record(hist, suffix) + w, expr, source=VLLM))
    return rules


def finished_rules(settings: Settings) -> list[dict[str, Any]]:
    w = settings.window
    rate = f"rate({VLLM_FINISHED}{settings.engine_sel(VLLM)}[{w}])"
    reason = copy_label(rate, "reason", "finished_reason")
    expr = _vllm(settings, reason, f"{SERVICE_MODEL}, host, reason")
    return [record_rule(FINISHED_RATE + w, expr, source=VLLM)]


def request_rules(settings: Settings) -> list[dict[str, Any]]:
    w, hist = settings.window, DURATION_HISTOGRAM
    count = f"{hist}_count{settings.sel(settings.slo_selector)}"
    errors = hist + "_count" + settings.sel(f'{settings.slo_selector}, {CODE}=~"5.."')
    finished = f"{VLLM_FINISHED}{settings.engine_sel(VLLM)}"
    failed = f"{VLLM_FINISHED}{settings.engine_sel(VLLM, VLLM_ERROR_REASON)}"
    rules = [
        record_rule(f"{REQUESTS_RATE}{w}", _sum_rate(count, w), source=SPANS),
        record_rule(
            f"{REQUESTS_RATE}{w}",
            _vllm(settings, f"rate({finished}[{w}])", SERVICE_MODEL),
            source=VLLM,
        ),
    ]
    # the SLO windows, and ``window`` for GpuscopeErrorRatioHigh when it is none of them
    for window in sorted({*settings.slo_windows(), w}, key=seconds_of):
        record = f"{ERRORS_RATIO}{window}"
        # "or ... * 0": no 5xx series at all is a ratio of 0, not no data
        spans = error_ratio(_sum_rate(errors, window), _sum_rate(count, window))
        rules.append(record_rule(record, spans, source=SPANS))
        # vLLM: requests the engine finished with an error, of all it finished
        vllm_failed = _vllm(settings, f"rate({failed}[{window}])", SERVICE_MODEL)
        vllm_finished = _vllm(settings, f"rate({finished}[{window}])", SERVICE_MODEL)
        rules.append(record_rule(record, error_ratio(vllm_failed, vllm_finished), source=VLLM))
    return rules


def error_ratio(errors: str, total: str) -> str:
    # "> 0": a window without requests has no ratio (absent), not a NaN one (0/0)
    return f"(\n  {indent(errors)}\n  or\n  {indent(total)} * 0\n)\n/\n({total} > 0)"


def slo_rules(settings: Settings, slo: Slo) -> list[dict[str, Any]]:
    total = f"{slo.histogram}_count{settings.sel(settings.slo_selector)}"
    le = le_matcher(slo.le)
    good = f"{slo.histogram}_bucket{settings.sel(settings.slo_selector + ', ' + le)}"
    rules = []
    for window in settings.slo_windows():
        record = f"{slo_errors_ratio(slo)}{window}"
        spans = slo_ratio(_sum_rate(good, window), _sum_rate(total, window))
        rules.append(record_rule(record, spans, source=SPANS))
        # vLLM's histogram, where the objective's bound is one of its buckets (a bound
        # between two buckets cannot be counted; no ratio rather than a wrong one)
        for native in vllm_histograms_for(slo.histogram):
            if float(slo.le) not in {float(bound) for bound in native.buckets}:
                continue
            vllm_good = _vllm(
                settings,
                f"rate({native.native}_bucket{settings.engine_sel(VLLM, le)}[{window}])",
                SERVICE_MODEL,
            )
            vllm_total = _vllm(
                settings,
                f"rate({native.native}_count{settings.engine_sel(VLLM)}[{window}])",
                SERVICE_MODEL,
            )
            rules.append(record_rule(record, slo_ratio(vllm_good, vllm_total), source=VLLM))
    return rules


def slo_ratio(good: str, total: str) -> str:
    # "> 0": no requests in the window is no ratio (absent), not NaN
    return f"1 - (\n  {indent(good)}\n  /\n  ({indent(total)} > 0)\n)"


def le_pattern(le: str) -> str:
    """The regex of bucket bound ``le`` written either way, ``1.0`` or ``1`` (``500.0`` or
    ``500``): exporters write whole bounds with or without ``.0``, and Prometheus 3
    stores a classic histogram's ``le="500"`` as ``le="500.0"``."""
    whole = le.removesuffix(".0")
    if whole.isdigit():
        return f"{whole}(\\\\.0)?"
    return le.replace(".", "\\\\.")


def le_matcher(le: str) -> str:
    """The matcher of bucket bound ``le`` in either form (``le_pattern``)."""
    return f'le=~"{le_pattern(le)}"'


def _sum_rate(selector: str, window: str) -> str:
    return f"sum by ({SERVICE_MODEL}) (rate({selector}[{window}]))"


def on_request_gpu(settings: Settings, cause: str) -> str:
    """The request series (one per source, service, model, host and GPU; any phase
    share) whose GPU meets condition ``cause``: joined on the GPU's UUID, or, where the
    requests name no GPU (``uuid`` empty), on their host."""
    base = f"max by ({SMG}) ({PHASE_SHARE_MEAN}{settings.window})"
    # The GPU's series carry the host of the exporter that reads it, the requests'
    # the host of the exporter (or engine) that counted them: one exporter per host
    # reads its GPUs and receives its spans, so a GPU index or UUID that repeats on
    # another host never meets these requests.
    # (and dcgm-exporter's MIG instances, each as the join by pod names it)
    conditions = gpu_conditions(settings)
    mig = mig_conditions(settings, conditions)[cause]
    gpu = with_host(settings, f"{conditions[cause]}\nor\n{mig}")
    host = host_conditions(settings)[cause]
    return (
        f"{base}\n  and on ({HOST_GPU}) ({indent(indent(gpu))})\nor\n"
        f"{base}\n  and on ({HOST_GPU}) ({indent(indent(host))})"
    )


# Verdict precedence: a hardware limit explains everything above it, so it wins; then
# an underfed GPU (a feeding problem shows as queueing); then the dominant phase.


def phase_is(name: str) -> str:
    """The selector of phase ``name``'s series."""
    return f'{{{PHASE}="{phase(name)}"}}'


def verdict_rules(settings: Settings) -> list[dict[str, Any]]:
    """One verdict per source, service, model, host and GPU: each source's phase shares
    against the GPU conditions of the GPU the requests ran on (or of their host)."""
    w = settings.window
    share = f"{PHASE_SHARE_MEAN}{w}"
    base = f"max by ({SMG}) ({share})"
    conditions = {
        "none": "",
        **{
            dominant: f"and on ({SMG}) {share}{phase_is(dominant)} > {settings.dominant_share:g}"
            for dominant in (COMPUTE, BATCH_WAIT, QUEUE)
        },
        "underfed": (
            f"and on ({SMG}) {share}{phase_is(QUEUE)} > {settings.underfed_queue_share:g}\n"
            f"and on ({SMG}) (\n  {indent(on_request_gpu(settings, 'underfed'))}\n)"
        ),
        "pcie": f"and on ({SMG}) (\n  {indent(on_request_gpu(settings, 'pcie'))}\n)",
        "throttled": f"and on ({SMG}) (\n  {indent(on_request_gpu(settings, 'throttled'))}\n)",
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
        record_rule(rank, candidates),
        # the highest-precedence cause wins; value 1
        record_rule(VERDICT, f"topk by ({SMG}) (1, {rank}) * 0 + 1"),
    ]


# Per-instance series of the serving engine's own /metrics (the worker's
# gpuscope_worker_*, or vLLM's, mapped onto the same names), and the configured batching
# window per model. A scrape target is one engine, so these never mix sources.
PREEMPTIONS = f"instance:{WORKER_PREEMPTIONS.removesuffix('_total')}:rate"
QUEUE_DELAY = f"model:{WORKER_MAX_QUEUE_DELAY}:max"
# vLLM schedules generation only: every request it runs or keeps waiting holds (or
# needs) KV-cache blocks, the worker's "completions" endpoint.
VLLM_ENDPOINT = "completions"


def worker_rules(settings: Settings) -> list[dict[str, Any]]:
    """The engine's state per scrape target: the worker's series, or vLLM's (one rule
    each, ``or``: a target is one engine or the other)."""
    w, sel, vllm = settings.window, settings.worker_sel(), settings.engine_sel(VLLM)
    completions = f'"{ENDPOINT}", "{VLLM_ENDPOINT}", "", ""'
    return [
        # vLLM's usage is 0-1 too; the largest of its engines' (data-parallel ranks)
        record_rule(
            f"{KV_USAGE}{w}",
            f"max by ({INSTANCE}) (avg_over_time({WORKER_KV_USAGE}{sel}[{w}]))"
            f"\nor\nmax by ({INSTANCE}) (avg_over_time({VLLM_KV_USAGE}{vllm}[{w}]))",
        ),
        record_rule(
            f"{PREEMPTIONS}{w}",
            f"sum by ({INSTANCE}) (rate({WORKER_PREEMPTIONS}{sel}[{w}]))"
            f"\nor\nsum by ({INSTANCE}) (rate({VLLM_PREEMPTIONS}{vllm}[{w}]))",
        ),
        # requests queued, or preempted and waiting to resume, per endpoint
        *(
            record_rule(
                f"{record}{w}",
                f"sum by ({INSTANCE}, {ENDPOINT}) (avg_over_time({worker}{sel}[{w}]))\nor\n"
                f"label_replace(\n  sum by ({INSTANCE}) (avg_over_time({native}{vllm}[{w}])),\n"
                f"  {completions}\n)",
            )
            for record, worker, native in (
                (WAITING, WORKER_WAITING, VLLM_WAITING),
                (RUNNING, WORKER_RUNNING, VLLM_RUNNING),
            )
        ),
        # the largest configured window among the workers serving a model
        record_rule(
            QUEUE_DELAY,
            f"max by ({MODEL}) (\n  {WORKER_MAX_QUEUE_DELAY}{sel}\n"
            f"  * on ({INSTANCE}) group_left ({MODEL})\n  {WORKER_INFO}{sel}\n)",
        ),
    ]


def recording_groups(settings: Settings) -> list[dict[str, Any]]:
    # Rules of one group run in order at each evaluation, groups side by side: the
    # verdict comes after the shares and the GPU conditions it reads, in their group,
    # so that it judges this evaluation's numbers (in a group of its own it lagged them).
    groups = {
        "gpuscope-bottleneck": [
            *phase_rules(settings),
            *request_rules(settings),
            *(rule for hist in TOKEN_HISTOGRAMS for rule in engine_histogram_rules(settings, hist)),
            *finished_rules(settings),
            *slo_rules(settings, settings.latency_slo),
            *slo_rules(settings, settings.ttft_slo),
            *gpu_rules(settings),
            *verdict_rules(settings),
        ],
        "gpuscope-worker": worker_rules(settings),
    }
    return [
        {"name": name, "interval": settings.interval, "rules": rules}
        for name, rules in groups.items()
    ]
