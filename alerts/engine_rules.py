"""Recording rules over each engine's own ``/metrics``, from its row.

Each engine (``pack/engines/``: ``ENGINES``, with the release its names were
read from) is scraped by Prometheus as a job of its own (its selector:
``Settings.engine_jobs``). These rules write the numbers of every row of ``ROW_RULED``
(Triton, TGI, SGLang, TensorRT-LLM, and any row added) into the series the boards, the
verdict and the alerts already read, with the engine as the ``source`` label, as
``recording.py`` does for vLLM's row beside the spans':

- ``timing_rules``: the per-second rates of each request histogram's ``_sum``,
  ``_count`` (and ``_bucket``, where the engine has buckets), per source, service,
  model and host. They go at the head of ``recording.py``'s bottleneck group
  (``with_engine_timings``), because the means, shares and the verdict of that group
  read them: rules of one group run in order at each evaluation, so the verdict judges
  this evaluation's numbers (from a group of its own they would lag by up to an
  interval).
- ``engine_groups``: requests per second, the error and SLO ratios, and each scrape
  target's running and waiting requests, KV-cache usage and mean batch size, in a file
  of their own (``alerts/rules/engines.yml``).

A timing an engine does not measure has no rule, so its series stay absent, never 0.
The engines' series name no GPU index. Like vLLM's, where the scrape target carries
its pod (``namespace`` / ``pod``, a Kubernetes target) and that pod holds exactly one GPU
dcgm-exporter names, the requests take that GPU's ``host``, ``gpu`` and ``uuid``
(``pod_join.by_pod``) and meet its conditions; otherwise they are joined to the GPUs of
their host (``uuid`` and ``gpu`` empty).
"""

from __future__ import annotations

from typing import Any

from alerts.pod_join import by_pod
from alerts.promql import copy_label, indent, record_rule, with_host
from alerts.recording import error_ratio, le_matcher, slo_ratio
from pack.contract import ENDPOINT, MODEL, SERVICE
from pack.engines import (
    HISTOGRAM_KEY,
    ROW_RULED,
    TGI_BATCH_SIZE,
    TGI_ENGINE,
    TRITON_ENGINE,
    TRITON_EXECUTED_FAILURES,
    TRITON_EXECUTIONS,
    TRITON_FAILURE,
    TRITON_INFERENCES,
    Engine,
    EngineTiming,
)
from pack.recorded import (
    BATCH_SIZE_MEAN,
    ERRORS_RATIO,
    KV_USAGE,
    REQUESTS_RATE,
    RUNNING,
    WAITING,
    rate_record,
    slo_errors_ratio,
)
from pack.settings import GPU, SERVICE_MODEL, Settings, Slo, seconds_of

# The recording group whose verdict reads the engines' timings.
BOTTLENECK_GROUP = "gpuscope-bottleneck"


def _sum(settings: Settings, engine: Engine, expr: str, by: str, agg: str = "sum") -> str:
    """``agg by (by)`` (``sum`` unless told) of ``expr`` over the engine's series with
    gpuscope's label names: service from the scrape's ``job``, model from the engine's
    model label (TGI names none: a ``model`` target label set in the scrape config is
    kept), host from ``instance`` when ``by`` keeps it, with the ``host``, ``gpu`` and
    ``uuid`` of the one GPU the target's pod holds where it has one (``by_pod``, as for
    vLLM's). Model versions, ranks and the like add up."""
    if "host" in by:
        expr = with_host(settings, expr)
    if engine.model_label and engine.model_label != MODEL:
        expr = copy_label(expr, MODEL, engine.model_label)
    expr = copy_label(expr, SERVICE, "job")
    if "host" in by:
        expr = by_pod(expr)
        by = by.replace("host", f"host, {GPU}", 1)
    return f"{agg} by ({by}) (\n  {indent(expr)}\n)"


def _rate(sample: str, selector: str, window: str) -> str:
    return f"rate({sample}{selector}[{window}])"


def _either(first: str, operator: str, second: str) -> str:
    """``first`` and ``second`` joined by ``operator``, ``second`` read as 0 where it
    has no series."""
    fallback = f"{indent(indent(second))}\n    or\n    {indent(indent(first))} * 0"
    return f"(\n  {indent(first)}\n  {operator}\n  (\n    {fallback}\n  )\n)"


def _plus(first: str, second: str) -> str:
    """``first`` + ``second``; where ``second`` has no series (a counter an engine
    creates at its first increment), ``first`` itself."""
    return _either(first, "+", second)


def _gauge(settings: Settings, engine: Engine, spec: str) -> str:
    """The engine's gauge ``spec`` (a name, or a name with its matcher as
    ``name{label="value"}``) selected on the engine's job."""
    name, _, matcher = spec.partition("{")
    return name + settings.engine_sel(engine, matcher.removesuffix("}"))


# --- request timings ------------------------------------------------------------------


def _timing_rules(settings: Settings, engine: Engine, timing: EngineTiming) -> list[dict[str, Any]]:
    w, sel = settings.window, settings.engine_sel(engine)
    key = HISTOGRAM_KEY.get(timing.gpuscope)
    labels = {"source": engine.source, **({key: timing.key_value} if key else {})}
    by = f"{SERVICE_MODEL}, host"

    def total(samples: tuple[str, ...]) -> str:
        parts = [_sum(settings, engine, _rate(s, sel, w), by) for s in samples]
        return "\n+\n".join(parts)

    seconds = total(timing.sums)
    if timing.minus_sums:
        seconds = f"(\n  {indent(seconds)}\n)\n-\n{total(timing.minus_sums)}"
    if timing.per_second != 1:
        # a counter in µs (ms) grows by 1e6 (1e3) a second of time spent
        seconds = f"(\n  {indent(seconds)}\n)\n/ {timing.per_second:g}"
    count = _sum(settings, engine, _rate(timing.count, sel, w), by)
    rules = [
        record_rule(rate_record(timing.gpuscope, "sum") + w, seconds, **labels),
        record_rule(rate_record(timing.gpuscope, "count") + w, count, **labels),
    ]
    if timing.bucket:
        rules.append(
            record_rule(
                rate_record(timing.gpuscope, "bucket") + w,
                _buckets(settings, engine, timing),
                **labels,
            )
        )
    return rules


def _buckets(settings: Settings, engine: Engine, timing: EngineTiming) -> str:
    """The bucket rates with ``le`` in seconds. Bounds already in seconds keep their
    ``le``; others (Triton's ms) are read one by one, each written either way (``500``
    as the engine writes it, ``500.0`` as Prometheus 3 stores it) and added up before
    the bound in seconds is set, so only the bounds the engine is known to use are read."""
    w, by = settings.window, f"{SERVICE_MODEL}, host"
    if timing.per_second == 1:
        return _sum(
            settings, engine, _rate(timing.bucket, settings.engine_sel(engine), w), by + ", le"
        )
    converted = [
        *(
            (le_matcher(bound), f"{seconds:g}")
            for bound, seconds in zip(timing.bounds, timing.seconds, strict=True)
        ),
        ('le="+Inf"', "+Inf"),
    ]
    return "\nor\n".join(
        "label_replace(\n  "
        + indent(
            _sum(
                settings, engine, _rate(timing.bucket, settings.engine_sel(engine, matcher), w), by
            )
        )
        + f',\n  "le", "{seconds}", "", ""\n)'
        for matcher, seconds in converted
    )


def timing_rules(settings: Settings) -> list[dict[str, Any]]:
    """Every engine's request timings as the rates of gpuscope's request histograms."""
    return [
        rule
        for engine in ROW_RULED
        for timing in engine.timings
        for rule in _timing_rules(settings, engine, timing)
    ]


def with_engine_timings(groups: list[dict[str, Any]], settings: Settings) -> list[dict[str, Any]]:
    """``recording.py``'s groups with the engines' timings at the head of the
    bottleneck group, before the means and the verdict that read them."""
    names = [group["name"] for group in groups]
    if BOTTLENECK_GROUP not in names:
        raise LookupError(f"no recording group {BOTTLENECK_GROUP!r} in {names}")
    return [
        {**group, "rules": [*timing_rules(settings), *group["rules"]]}
        if group["name"] == BOTTLENECK_GROUP
        else group
        for group in groups
    ]


# --- requests, errors, objectives ---------------------------------------------------


def _finished(settings: Settings, engine: Engine, window: str) -> str:
    first, *others = (
        _sum(settings, engine, _rate(counter, settings.engine_sel(engine), window), SERVICE_MODEL)
        for counter in engine.requests
    )
    for other in others:
        first = _plus(first, other)
    return first


def request_rules(settings: Settings) -> list[dict[str, Any]]:
    w = settings.window
    rules = []
    for engine in ROW_RULED:
        source = {"source": engine.source}
        rules.append(record_rule(REQUESTS_RATE + w, _finished(settings, engine, w), **source))
        counter, matcher = engine.errors
        if not counter:
            continue  # the engine counts no failed requests: no ratio, not 0
        for window in sorted({*settings.slo_windows(), w}, key=seconds_of):
            failed = _sum(
                settings,
                engine,
                _rate(counter, settings.engine_sel(engine, matcher), window),
                SERVICE_MODEL,
            )
            finished = _finished(settings, engine, window)
            # no failure series at all is a ratio of 0; no request, no ratio (not NaN)
            ratio = error_ratio(failed, finished)
            rules.append(record_rule(ERRORS_RATIO + window, ratio, **source))
    for slo in (settings.latency_slo, settings.ttft_slo):
        rules += _slo_rules(settings, slo)
    return rules


def _slo_rules(settings: Settings, slo: Slo) -> list[dict[str, Any]]:
    """The share of requests over the objective's bound, from an engine histogram with
    that bound among its buckets (a bound between two buckets cannot be counted: no
    ratio rather than a wrong one)."""
    rules = []
    for engine in ROW_RULED:
        for timing in engine.timings_for(slo.histogram):
            bounds = dict(zip(timing.seconds, timing.bounds, strict=True))
            native = bounds.get(float(slo.le))
            if native is None:
                continue
            for window in settings.slo_windows():
                # the bound written either way (Prometheus 3 stores 500 as 500.0)
                good = _sum(
                    settings,
                    engine,
                    _rate(timing.bucket, settings.engine_sel(engine, le_matcher(native)), window),
                    SERVICE_MODEL,
                )
                total = _sum(
                    settings,
                    engine,
                    _rate(timing.count, settings.engine_sel(engine), window),
                    SERVICE_MODEL,
                )
                rules.append(
                    record_rule(
                        slo_errors_ratio(slo) + window,
                        slo_ratio(good, total),
                        source=engine.source,
                    )
                )
    return rules


# --- the engine's state per scrape target ---------------------------------------------

INSTANCE = "job, instance"


def state_rules(settings: Settings) -> list[dict[str, Any]]:
    w = settings.window
    rules = []
    for engine in ROW_RULED:
        # labelled with the engine: the worker's and vLLM's rules record the same names
        # unlabelled, and two rules of one name and labels are duplicates to promtool
        source = {"source": engine.source}
        endpoint = f'"{ENDPOINT}", "{engine.endpoint}", "", ""'
        for record, gauge in ((WAITING, engine.waiting), (RUNNING, engine.running)):
            if gauge:
                series = _gauge(settings, engine, gauge)
                expr = f"sum by ({INSTANCE}) (avg_over_time({series}[{w}]))"
                rules.append(
                    record_rule(record + w, f"label_replace(\n  {expr},\n  {endpoint}\n)", **source)
                )
        if engine.kv_usage:
            # the fullest rank's pool
            gauge = _gauge(settings, engine, engine.kv_usage)
            expr = f"max by ({INSTANCE}) (avg_over_time({gauge}[{w}]))"
            rules.append(record_rule(KV_USAGE + w, expr, **source))
    by = f"{SERVICE_MODEL}, host"
    triton, tgi = TRITON_ENGINE, TGI_ENGINE
    inferences = _sum(
        settings, triton, _rate(TRITON_INFERENCES, settings.engine_sel(triton), w), by
    )
    executions = _sum(
        settings, triton, _rate(TRITON_EXECUTIONS, settings.engine_sel(triton), w), by
    )
    # A failed execution adds to the executions and not to the inferences: each request
    # the backend failed is counted back as one inference, exact where every failed
    # request carried one (a request with a batch dimension of n would count n)
    failed = _sum(
        settings,
        triton,
        _rate(TRITON_FAILURE, settings.engine_sel(triton, TRITON_EXECUTED_FAILURES), w),
        by,
    )
    inferences = _plus(inferences, failed)
    # TGI's gauge is the running batch, set to 0 when it ends: its mean while one runs
    running_batch = f"avg_over_time(({TGI_BATCH_SIZE}{settings.engine_sel(tgi)} > 0)[{w}:])"
    rules += [
        # inferences (a request's batch dimension, 1 for most LLM requests) per execution,
        # failed ones included
        record_rule(
            BATCH_SIZE_MEAN + w,
            f"{inferences}\n/\n(\n  {indent(executions)}\n  > 0\n)",
            source=triton.source,
        ),
        record_rule(
            BATCH_SIZE_MEAN + w,
            _sum(settings, tgi, running_batch, by, agg="avg"),
            source=tgi.source,
        ),
    ]
    return rules


def engine_groups(settings: Settings) -> list[dict[str, Any]]:
    """The groups of ``alerts/rules/engines.yml``."""
    groups = {
        "gpuscope-engine-requests": request_rules(settings),
        "gpuscope-engine-state": state_rules(settings),
    }
    return [
        {"name": name, "interval": settings.interval, "rules": rules}
        for name, rules in groups.items()
    ]


def releases_comment() -> str:
    """Comment lines for the rule files: the release each engine's names were read from."""
    names = [f"{engine.name}'s" for engine in ROW_RULED]
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    lines = [f"# {listed} series as their own source defines them:"]
    for engine in ROW_RULED:
        for release in (engine.release, *engine.also):
            lines.append(
                f"#   {engine.source}: {release} ({release.repository}, {release.ref}:"
                f" {', '.join(release.files)})"
            )
    return "\n".join(lines) + "\n"
