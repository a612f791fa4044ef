"""Inference latency: traffic, end-to-end and per-phase latency, streaming, batching."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import BigValueTextMode

from dashboards import serving
from dashboards.panels import (
    FULL,
    HALF,
    RATE,
    REQUEST_CHAIN,
    SCRAPE_CHAIN,
    THIRD,
    Size,
    heatmap_panel,
    new_dashboard,
    quantile,
    query,
    ratio,
    row,
    selector,
    stat_panel,
    text_panel,
    thresholds,
    timeseries,
)
from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract.rows import MetricDef
from pack import contract, engines
from pack.contract import (
    WORKER_MAX_BATCH_SIZE,
    WORKER_MAX_QUEUE_DELAY,
    series,
)
from pack.engines import (
    DURATION_HISTOGRAM,
    GENERATION_TOKENS_HISTOGRAM,
    NO_TRAFFIC,
    PHASE_HISTOGRAM,
    PROMPT_TOKENS_HISTOGRAM,
    SOURCES,
    SPANS,
    STAGE_HISTOGRAM,
    TPOT_HISTOGRAM,
    TTFT_HISTOGRAM,
    has_bound,
    lacking_note,
    not_reported,
    phases_note,
)
from pack.recorded import (
    BATCH_SIZE_MEAN,
    ERRORS_RATIO,
    FINISHED_RATE,
    REQUESTS_RATE,
    WINDOW,
    slo_errors_ratio,
)
from pack.recorded import rate as recorded_rate
from pack.settings import SOURCE, Settings, Slo

UID = "gpuscope-inference-latency"
# P50, P90 and P99 with the mean beside them, as engines' own boards draw them: a mean
# far above P50 means a long tail, a P99 far above P90 a few outliers.
QUANTILES = (0.5, 0.9, 0.99)
# The thresholds of the headline row: the rules' objectives and limits (pack/settings.py).
SETTINGS = Settings()

# Request histograms carry route; phase, token-timing and batch histograms do not.
REQUEST_VARIABLES = [
    "job",
    "instance",
    contract.SERVICE,
    contract.MODEL,
    contract.ROUTE,
    contract.GPU_INDEX,
]
PHASE_VARIABLES = [name for name in REQUEST_VARIABLES if name != contract.ROUTE]
REQUEST = selector(*REQUEST_VARIABLES)
PHASE = selector(*PHASE_VARIABLES)
TOKENS = selector("job", "instance", contract.SERVICE, contract.MODEL)
# The recording rules' per-source series: no job, instance or route.
PER_SOURCE = selector("source", contract.SERVICE, contract.MODEL, contract.GPU_INDEX)
# Those per service and model (requests, errors, objectives): no GPU either.
PER_MODEL = selector("source", contract.SERVICE, contract.MODEL)
VLLM_BUCKETS_NOTE = (
    " vLLM's request-time buckets start at 0.3 s (TTFT's at 1 ms): its means are exact, "
    "its quantiles under a second coarse."
)


def rate(metric: str, sel: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{sel}[{RATE}]))"


def quantile_targets(histogram: MetricDef, sel: str) -> list[Dataquery]:
    mean = ratio(rate(series(histogram, "sum"), sel), rate(series(histogram, "count"), sel))
    return [
        *(
            query(
                quantile(q, rate(series(histogram, "bucket"), sel, "le")),
                f"P{round(q * 100)}",
                exemplar=True,
            )
            for q in QUANTILES
        ),
        query(mean, "mean", exemplar=True),
    ]


def phase_p99(by: str = f"{contract.PHASE}, le") -> str:
    bucket = series(exporter_rows.REQUEST_PHASE, "bucket")
    return quantile(0.99, rate(bucket, PHASE, by))


def build() -> Dashboard:
    board = new_dashboard(
        UID,
        "gpuscope / Inference latency",
        "Where each request's milliseconds went: rate, latency quantiles, time per phase "
        f"({', '.join(contract.PHASES)}; compute split into "
        f"{' and '.join(contract.COMPUTE_STAGES)} where the engine reports them), "
        "streaming, batching, the serving "
        "engine's queue, KV cache and preemptions (from the worker's, vLLM's or an "
        "engine's own /metrics), and the same latencies per source of request timings "
        "(gpuscope's spans, or vLLM's, Triton's, TGI's, SGLang's own /metrics).",
        SCRAPE_CHAIN,
        REQUEST_CHAIN,
    )
    count = series(exporter_rows.REQUEST_DURATION, "count")
    board.with_panel(text_panel("Phases by engine", phases_note(), Size(24, 9)))
    add_headline(board)
    board.with_row(row("Traffic (gpuscope spans)"))
    board.with_panel(
        timeseries(
            "Request rate by status",
            "Requests finished per second, by HTTP status code.",
            [query(rate(count, REQUEST, contract.CODE), "{{code}}")],
            "reqps",
            THIRD,
            stacked=True,
        )
    )
    errors = rate(
        count,
        selector(*REQUEST_VARIABLES, extra=[f'{contract.CODE}=~"5.."']),
    )
    board.with_panel(
        timeseries(
            "Error ratio",
            "Share of requests answered with a 5xx status.",
            [query(ratio(f"({errors} or vector(0))", rate(count, REQUEST)), "5xx share")],
            "percentunit",
            THIRD,
            no_value=NO_TRAFFIC,
        )
    )
    board.with_panel(
        timeseries(
            "Tokens per second",
            "Input (prompt) and output (generated) tokens processed per second.",
            [
                query(
                    rate(series(exporter_rows.TOKENS), TOKENS, contract.DIRECTION),
                    "{{direction}}",
                )
            ],
            "suffix: tokens/s",
            THIRD,
        )
    )
    board.with_row(row("Latency (gpuscope spans; exemplars link to traces)"))
    board.with_panel(
        timeseries(
            "End-to-end latency",
            "P50, P90, P99 and mean of the request duration, from arrival to the last body "
            "chunk. "
            "Exemplars link to the trace of a request in that bucket.",
            quantile_targets(exporter_rows.REQUEST_DURATION, REQUEST),
            "s",
            FULL,
            no_value=NO_TRAFFIC,
        )
    )
    phase_sum = rate(series(exporter_rows.REQUEST_PHASE, "sum"), PHASE, contract.PHASE)
    phase_count = rate(series(exporter_rows.REQUEST_PHASE, "count"), PHASE, contract.PHASE)
    board.with_panel(
        timeseries(
            "Mean time per phase",
            "Mean seconds a request spent in each phase; stacked, the phases add up to "
            "the mean request duration. Only the phases the engine reports: vLLM's spans "
            "give queue and compute (no batch wait, preprocess or postprocess).",
            [query(ratio(phase_sum, phase_count), "{{phase}}", exemplar=True)],
            "s",
            HALF,
            stacked=True,
            no_value=NO_TRAFFIC,
        )
    )
    board.with_panel(
        timeseries(
            "Time per phase at the tail (P99)",
            "P99 of each phase, not stacked: quantiles do not add up, so a stack's top "
            "would read as a request P99 that no request had. The share panel below shows "
            "which phase dominates the slowest requests.",
            [query(phase_p99(), "{{phase}}", exemplar=True)],
            "s",
            HALF,
            no_value=NO_TRAFFIC,
        )
    )
    duration = series(exporter_rows.REQUEST_DURATION, "bucket")
    board.with_panel(
        timeseries(
            "Phase P99 against end-to-end P99",
            "Each phase's P99 over the request's P99 (not over the sum of the phases' "
            "P99s, which no request took): the phase near 100 % is the one the slowest "
            "requests wait in; queue points at capacity or scheduling, compute at the "
            "model or the hardware. Not stacked: the slowest requests differ per phase, "
            "so the lines need not add up to 100 %.",
            [
                query(
                    ratio(
                        phase_p99(),
                        quantile(0.99, rate(duration, PHASE, "le")),
                        f"ignoring ({contract.PHASE}) group_left ()",
                    ),
                    "{{phase}}",
                )
            ],
            "percentunit",
            HALF,
            no_value=NO_TRAFFIC,
        )
    )
    stage_sum = rate(series(exporter_rows.REQUEST_COMPUTE_STAGE, "sum"), PHASE, contract.STAGE)
    stage_count = rate(series(exporter_rows.REQUEST_COMPUTE_STAGE, "count"), PHASE, contract.STAGE)
    board.with_panel(
        timeseries(
            "Compute: prefill and decode",
            "Mean seconds in each part of compute, where the engine reports them (vLLM's "
            "span: prefill, then decode); stacked, they add up to the mean compute time. "
            "Prefill grows with prompt length, decode with the tokens generated.",
            [query(ratio(stage_sum, stage_count), "{{stage}}", exemplar=True)],
            "s",
            HALF,
            stacked=True,
            no_value=not_reported(engines.COMPUTE_SPLIT, (SPANS,)),
        )
    )
    board.with_row(row("Streaming (gpuscope spans)"))
    board.with_panel(
        timeseries(
            "Time to first token",
            "P50, P90, P99 and mean from arrival to the first streamed chunk (streaming requests).",
            quantile_targets(exporter_rows.TIME_TO_FIRST_TOKEN, PHASE),
            "s",
            no_value=NO_TRAFFIC,
        )
    )
    board.with_panel(
        timeseries(
            "Time per output token",
            "P50, P90, P99 and mean of the time per generated token after the first one.",
            quantile_targets(exporter_rows.TIME_PER_OUTPUT_TOKEN, PHASE),
            "s",
            no_value=NO_TRAFFIC,
        )
    )
    board.with_row(row("Batching (gpuscope spans; not in continuous-batching engines)"))
    batch_bucket = series(exporter_rows.BATCH_SIZE, "bucket")
    board.with_panel(
        heatmap_panel(
            "Batch size distribution",
            "Batch executions per batch-size bucket over time.",
            query(f"sum by (le) (increase({batch_bucket}{PHASE}[{RATE}]))"),
            "short",
            no_value=not_reported(engines.BATCHING, (SPANS,)),
        )
    )
    batch_sum = rate(series(exporter_rows.BATCH_SIZE, "sum"), PHASE)
    batch_count = rate(series(exporter_rows.BATCH_SIZE, "count"), PHASE)
    board.with_panel(
        timeseries(
            "Mean batch size and batch rate",
            "Mean requests per batch and batches executed per second, beside the largest "
            "batch the workers are configured for (from the worker's /metrics).",
            [
                query(ratio(batch_sum, batch_count), "mean batch size"),
                query(batch_count, "batches/s"),
                query(serving.configured(WORKER_MAX_BATCH_SIZE), "configured maximum"),
            ],
            "short",
            no_value=not_reported(engines.BATCHING, (SPANS,)),
        )
    )
    board.with_panel(batch_wait_panel())
    serving.add_row(board)
    add_source_rows(board)
    add_other_instrumentation(board)
    return board


def _quantile(q: float, histogram: str, key: str = "") -> str:
    by = f"{key}, le" if key else "le"
    return quantile(q, f"sum by ({by}) ({recorded_rate(histogram, 'bucket')}{PER_SOURCE})")


def _quantiles(histogram: str) -> list[Dataquery]:
    return [
        *(query(_quantile(q, histogram), f"P{round(q * 100)}") for q in QUANTILES),
        query(_mean(histogram), "mean"),
    ]


def _mean(histogram: str, key: str = "") -> str:
    by = f" by ({key})" if key else ""
    total = f"sum{by} ({recorded_rate(histogram, 'sum')}{PER_SOURCE})"
    return ratio(total, f"sum{by} ({recorded_rate(histogram, 'count')}{PER_SOURCE})")


def _burn(slo: Slo) -> list[Dataquery]:
    """The SLO's share of requests over its bound per window, as a multiple of the
    error budget (1 - objective): 1 spends the budget exactly over the SLO period."""
    budget = 1 - slo.objective
    return [
        query(
            f"{slo_errors_ratio(slo)}{window}{PER_MODEL}\n/ {budget:.6g}",
            f"{{{{service}}}} / {{{{model}}}} {window}",
        )
        for window in SETTINGS.slo_windows()
    ]


def _burn_panel(slo: Slo) -> timeseries_builders.Panel:
    page = sorted(rate for _, _, rate in SETTINGS.page_burns)
    # a source without a bucket at the bound can never count the requests over it
    lacking = [s for s in SOURCES if not has_bound(s, slo.histogram, float(slo.le))]
    return timeseries(
        f"{slo.title}: error budget burn",
        f"Requests over {slo.le} s (the objective: {slo.objective:.3g} within it), as a "
        "multiple of the error budget, per window of the SLO rules. Over 1 the budget "
        f"runs out before the SLO period ends; the pages fire at {' and '.join(map(str, page))} "
        "over a long and a short window together. From the recording rules, for a "
        "source whose histogram has the bound among its buckets"
        + (f" (not {', '.join(lacking)})" if lacking else "")
        + ".",
        _burn(slo),
        "suffix:×",
        HALF,
        no_value=lacking_note(lacking),
        steps=thresholds(
            "green", *((rate, "orange" if rate < page[-1] else "red") for rate in page)
        ),
    )


def add_source_rows(board: Dashboard) -> None:
    """One row per source of request timings (the recording rules' series): the same
    latencies as above, for gpuscope's spans and for an engine's own /metrics alike,
    with what only some sources report (prompt and generation lengths, finish reasons)
    and the SLOs' error budget burn. A panel over something the source does not
    report says so (the table in pack/engines/)."""
    board.with_row(row("Per source: $source (recording rules)", repeat="source"))
    board.with_panel(
        timeseries(
            "Mean time per phase",
            "Mean seconds per phase from this source, over the rules' window; stacked, "
            "they add up to the mean of what the engine reports (for vLLM, queue plus "
            "compute: its end-to-end time also holds the API server's own work)."
            + VLLM_BUCKETS_NOTE,
            [query(_mean(PHASE_HISTOGRAM, contract.PHASE), "{{phase}}")],
            "s",
            HALF,
            stacked=True,
            no_value=not_reported(engines.PHASE_TIMES),
        )
    )
    board.with_panel(
        timeseries(
            "Compute: prefill and decode",
            "Mean seconds in each part of compute, where the engine reports them (vLLM: "
            "prefill, then decode); stacked, they add up to the mean compute time. The "
            "reference worker reports compute whole.",
            [query(_mean(STAGE_HISTOGRAM, contract.STAGE), "{{stage}}")],
            "s",
            HALF,
            stacked=True,
            no_value=not_reported(engines.COMPUTE_SPLIT),
        )
    )
    board.with_panel(
        timeseries(
            "P99 per phase and compute stage",
            "P99 of each phase and of each part of compute, not stacked: quantiles do not "
            "add up. An engine whose phase times are counters (Triton) or whose phases "
            "have no buckets (SGLang) gives means only." + VLLM_BUCKETS_NOTE,
            [
                query(_quantile(0.99, PHASE_HISTOGRAM, contract.PHASE), "{{phase}}"),
                query(_quantile(0.99, STAGE_HISTOGRAM, contract.STAGE), "compute: {{stage}}"),
            ],
            "s",
            HALF,
            no_value=not_reported(engines.PHASE_QUANTILES),
        )
    )
    board.with_panel(
        timeseries(
            "End-to-end latency",
            "P50, P90, P99 and mean of the model requests' duration from this source (vLLM: "
            "from its arrival in the engine's API server to the last token)." + VLLM_BUCKETS_NOTE,
            _quantiles(DURATION_HISTOGRAM),
            "s",
            HALF,
            no_value=not_reported(engines.END_TO_END),
        )
    )
    requests = f"{REQUESTS_RATE}{WINDOW}{PER_MODEL}"
    errors = f"{ERRORS_RATIO}{WINDOW}{PER_MODEL}"
    board.with_panel(
        timeseries(
            "Request rate",
            "Model requests finished per second from this source, failed ones included "
            "(an engine's own counters of successes and of failures added up), and those "
            "that failed on the server's side (the error ratio's share of them). Per "
            "service and model, not per GPU.",
            [
                query(f"sum ({requests})", "finished"),
                query(
                    f"sum ({requests}\n"
                    f"* on ({SOURCE}, {contract.SERVICE}, {contract.MODEL})\n{errors})",
                    "failed",
                ),
            ],
            "reqps",
            THIRD,
            no_value=NO_TRAFFIC,
        )
    )
    board.with_panel(
        timeseries(
            "Error ratio",
            "Share of the finished requests that failed on the server's side, per service "
            "and model: a 5xx answer (spans), finish reason error (vLLM), an engine's "
            "own failure reasons (Triton: REJECTED, BACKEND, OTHER; TGI: generation, "
            "incomplete). Over the rules' window.",
            [
                query(
                    f"sum by ({contract.SERVICE}, {contract.MODEL}) ({errors})",
                    "{{service}} / {{model}}",
                )
            ],
            "percentunit",
            THIRD,
            no_value=not_reported(engines.ERRORS),
        )
    )
    board.with_panel(
        timeseries(
            "Mean batch size",
            "Requests per model execution, per service, model and host, from an engine's "
            "own series (Triton: inferences per execution, failed executions counted "
            "back; TGI: the running batch while one runs). gpuscope's spans give their "
            "batch sizes in the Batching row above.",
            [
                query(
                    f"sum by ({contract.SERVICE}, {contract.MODEL}, host) "
                    f"({BATCH_SIZE_MEAN}{WINDOW}{PER_SOURCE})",
                    "{{service}} / {{model}} {{host}}",
                )
            ],
            "short",
            THIRD,
            no_value=not_reported(engines.BATCH_SIZE),
        )
    )
    board.with_panel(
        timeseries(
            "Time to first token",
            "P50, P90, P99 and mean from arrival to the first token, from this source.",
            _quantiles(TTFT_HISTOGRAM),
            "s",
            HALF,
            no_value=not_reported(engines.TIME_TO_FIRST_TOKEN),
        )
    )
    board.with_panel(
        timeseries(
            "Time per output token",
            "P50, P90, P99 and mean of each request's time per generated token after the "
            "first, from this source.",
            _quantiles(TPOT_HISTOGRAM),
            "s",
            HALF,
            no_value=not_reported(engines.TIME_PER_OUTPUT_TOKEN),
        )
    )
    for title, histogram, capability, grows in (
        ("Prompt length", PROMPT_TOKENS_HISTOGRAM, engines.PROMPT_LENGTH, "prefill"),
        ("Generation length", GENERATION_TOKENS_HISTOGRAM, engines.GENERATION_LENGTH, "decode"),
    ):
        board.with_panel(
            heatmap_panel(
                title,
                f"Requests per second by their {title.lower()} in tokens (bucket bounds of "
                f"the engine's histogram), over the rules' window: longer requests mean "
                f"more {grows} time for the same request rate.",
                query(f"sum by (le) ({recorded_rate(histogram, 'bucket')}{PER_SOURCE})"),
                "short",
                THIRD,
                no_value=not_reported(capability),
            )
        )
    board.with_panel(
        timeseries(
            "Finish reasons",
            "Requests finished per second by why they ended: stop (a stop token or string), "
            "length (max_tokens reached), abort (the client went away), error. Many "
            "length endings mean long generations; aborts, clients that gave up waiting.",
            [query(f"sum by (reason) ({FINISHED_RATE}{WINDOW}{PER_SOURCE})", "{{reason}}")],
            "reqps",
            THIRD,
            stacked=True,
            no_value=not_reported(engines.FINISH_REASONS),
        )
    )
    board.with_panel(_burn_panel(SETTINGS.latency_slo))
    board.with_panel(_burn_panel(SETTINGS.ttft_slo))


def add_headline(board: Dashboard) -> None:
    """The numbers to read first, each against the limit the rules use: traffic,
    failures, the tail, the phase that holds most of the time, and whether the GPUs are
    busy. An idle window reads "No traffic", never NaN."""
    board.with_row(row("Now (gpuscope spans)"))
    count = series(exporter_rows.REQUEST_DURATION, "count")
    errors = rate(count, selector(*REQUEST_VARIABLES, extra=[f'{contract.CODE}=~"5.."']))
    duration = series(exporter_rows.REQUEST_DURATION, "bucket")
    ttft = series(exporter_rows.TIME_TO_FIRST_TOKEN, "bucket")
    phase_sum = rate(series(exporter_rows.REQUEST_PHASE, "sum"), PHASE, contract.PHASE)
    occupancy = series(gpu_rows.SM_OCCUPANCY) + selector("job", "instance", contract.GPU_INDEX)
    size = Size(4, 4)
    latency, first_token = SETTINGS.latency_slo, SETTINGS.ttft_slo
    for title, description, target, unit, steps in (
        (
            "Requests",
            "Requests finished per second.",
            query(rate(count, REQUEST), "req/s"),
            "reqps",
            thresholds("blue"),
        ),
        (
            "Server errors",
            "Share of requests answered 5xx; red from the ratio GpuscopeErrorRatioHigh fires at.",
            query(ratio(f"({errors} or vector(0))", rate(count, REQUEST)), "5xx"),
            "percentunit",
            thresholds(
                "green", (SETTINGS.error_ratio / 5, "orange"), (SETTINGS.error_ratio, "red")
            ),
        ),
        (
            "P99 latency",
            f"End-to-end P99; red from the latency objective's bound ({latency.le} s).",
            query(quantile(0.99, rate(duration, REQUEST, "le")), "P99", exemplar=True),
            "s",
            thresholds("green", (float(latency.le) / 2, "orange"), (float(latency.le), "red")),
        ),
        (
            "P99 time to first token",
            f"P99 from arrival to the first streamed chunk; red from the TTFT objective's "
            f"bound ({first_token.le} s).",
            query(quantile(0.99, rate(ttft, PHASE, "le")), "P99", exemplar=True),
            "s",
            thresholds(
                "green", (float(first_token.le) / 2, "orange"), (float(first_token.le), "red")
            ),
        ),
        (
            "Where the time goes",
            "The phase with the largest share of the mean request time, and that share; "
            "orange from the share at which the verdict calls a phase dominant.",
            query(
                "topk(1,\n"
                + ratio(
                    phase_sum, f"sum({phase_sum})", f"ignoring ({contract.PHASE}) group_left ()"
                )
                + "\n)",
                "{{phase}}",
            ),
            "percentunit",
            thresholds("green", (SETTINGS.dominant_share, "orange")),
        ),
        (
            "SM occupancy",
            "Mean SM occupancy of the selected GPUs; red under the occupancy the verdict "
            "calls underfed (while requests queue).",
            query(f"avg ({occupancy})", "SM occupancy"),
            "percentunit",
            thresholds("red", (SETTINGS.underfed_occupancy, "green")),
        ),
    ):
        board.with_panel(
            stat_panel(
                title,
                description,
                [target],
                unit,
                size,
                steps=steps,
                no_value=NO_TRAFFIC,
                text_mode=BigValueTextMode.VALUE_AND_NAME
                if title == "Where the time goes"
                else BigValueTextMode.VALUE,
            )
        )


def add_other_instrumentation(board: Dashboard) -> None:
    """SERVER spans of other instrumentation (not gpuscope's), spanmetrics-shaped: other
    services' requests beside the model servers'."""
    board.with_row(row("Other instrumentation (SERVER spans of other scopes)"))
    exporter = selector("job", "instance")
    calls = series(exporter_rows.SPAN_CALLS)
    bucket = series(exporter_rows.SPAN_DURATION, "bucket")
    by = f"{contract.SERVICE_NAME}, {contract.SPAN_NAME}"
    board.with_panel(
        timeseries(
            "Calls by status",
            "SERVER spans per second from instrumentation other than gpuscope's (the stock "
            "ASGI, FastAPI or gRPC instrumentation), by service, span and status code.",
            [
                query(
                    f"sum by ({by}, {contract.STATUS_CODE}) (rate({calls}{exporter}[{RATE}]))",
                    "{{service_name}} {{span_name}} {{status_code}}",
                )
            ],
            "reqps",
            HALF,
            stacked=True,
            no_value=NO_TRAFFIC,
        )
    )
    board.with_panel(
        timeseries(
            "Duration",
            "P50, P90 and P99 of those spans' duration, per service and span name.",
            [
                query(
                    quantile(q, f"sum by ({by}, le) (rate({bucket}{exporter}[{RATE}]))"),
                    f"{{{{service_name}}}} {{{{span_name}}}} P{round(q * 100)}",
                )
                for q in QUANTILES
            ],
            "s",
            HALF,
            no_value=NO_TRAFFIC,
        )
    )


def batch_wait_panel() -> timeseries_builders.Panel:
    """Measured batch wait against the window the batcher is configured to wait."""
    wait = selector(*PHASE_VARIABLES, extra=[f'{contract.PHASE}="{contract.phase("batch_wait")}"'])
    bucket = series(exporter_rows.REQUEST_PHASE, "bucket")
    return timeseries(
        "Batch wait against the configured window",
        "P50 and P99 of the time a request waited for its batch to fill, beside the "
        "max_queue_delay the workers are configured with (from the worker's /metrics). "
        "P99 well over the window: the batcher or the event loop is late, not the traffic.",
        [
            *(
                query(
                    quantile(q, rate(bucket, wait, "le")),
                    f"P{round(q * 100)}",
                    exemplar=True,
                )
                for q in (0.5, 0.99)
            ),
            query(serving.configured(WORKER_MAX_QUEUE_DELAY), "configured window"),
        ],
        "s",
        FULL,
        no_value=not_reported(engines.BATCHING, (SPANS,)),
    )
