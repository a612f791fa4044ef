"""Inference latency: traffic, end-to-end and per-phase latency, streaming, batching."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.builders.prometheus import Dataquery

from dashboards import contract, serving
from dashboards.contract import series
from dashboards.engines import (
    DURATION_HISTOGRAM,
    PHASE_HISTOGRAM,
    STAGE_HISTOGRAM,
    TPOT_HISTOGRAM,
    TTFT_HISTOGRAM,
    WORKER_MAX_BATCH_SIZE,
    WORKER_MAX_QUEUE_DELAY,
    phases_note,
)
from dashboards.panels import (
    FULL,
    HALF,
    RATE,
    REQUEST_CHAIN,
    SOURCE,
    THIRD,
    Size,
    heatmap_panel,
    new_dashboard,
    quantile,
    query,
    ratio,
    row,
    selector,
    text_panel,
    timeseries,
)
from dashboards.recorded import rate as recorded_rate
from gpuscope.exporter import definitions as exporter_rows
from gpuscope.exporter.definitions import MetricDef

UID = "gpuscope-inference-latency"
QUANTILES = (0.5, 0.95, 0.99)

# Request histograms carry route; phase, token-timing and batch histograms do not.
REQUEST_VARIABLES = [variable.name for variable in REQUEST_CHAIN]
PHASE_VARIABLES = [name for name in REQUEST_VARIABLES if name != contract.ROUTE]
REQUEST = selector(*REQUEST_VARIABLES)
PHASE = selector(*PHASE_VARIABLES)
TOKENS = selector("job", "instance", contract.SERVICE, contract.MODEL)
# The recording rules' per-source series: no job, instance or route.
PER_SOURCE = selector("source", contract.SERVICE, contract.MODEL, contract.GPU_INDEX)
VLLM_BUCKETS_NOTE = (
    " vLLM's request-time buckets start at 0.3 s (TTFT's at 1 ms): its means are exact, "
    "its quantiles under a second coarse."
)


def rate(metric: str, sel: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{sel}[{RATE}]))"


def quantile_targets(histogram: MetricDef, sel: str) -> list[Dataquery]:
    return [
        query(
            quantile(q, rate(series(histogram, "bucket"), sel, "le")),
            f"P{round(q * 100)}",
            exemplar=True,
        )
        for q in QUANTILES
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
        "engine's queue, KV cache and preemptions (from the worker's or vLLM's /metrics), "
        "and the same latencies per source of request timings (gpuscope's spans, vLLM's "
        "own /metrics).",
        REQUEST_CHAIN,
        (SOURCE,),
    )
    count = series(exporter_rows.REQUEST_DURATION, "count")
    board.with_panel(text_panel("Phases by engine", phases_note(), Size(24, 5)))
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
            "P50, P95 and P99 of the request duration, from arrival to the last body chunk. "
            "Exemplars link to the trace of a request in that bucket.",
            quantile_targets(exporter_rows.REQUEST_DURATION, REQUEST),
            "s",
            FULL,
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
            FULL,
        )
    )
    board.with_row(row("Streaming (gpuscope spans)"))
    board.with_panel(
        timeseries(
            "Time to first token",
            "P50, P95 and P99 from arrival to the first streamed chunk (streaming requests).",
            quantile_targets(exporter_rows.TIME_TO_FIRST_TOKEN, PHASE),
            "s",
        )
    )
    board.with_panel(
        timeseries(
            "Time per output token",
            "P50, P95 and P99 of the time per generated token after the first one.",
            quantile_targets(exporter_rows.TIME_PER_OUTPUT_TOKEN, PHASE),
            "s",
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
        )
    )
    board.with_panel(batch_wait_panel())
    serving.add_row(board)
    add_source_rows(board)
    return board


def _mean(histogram: str, key: str) -> str:
    total = f"sum by ({key}) ({recorded_rate(histogram, 'sum')}{PER_SOURCE})"
    return ratio(total, f"sum by ({key}) ({recorded_rate(histogram, 'count')}{PER_SOURCE})")


def _quantile(q: float, histogram: str, key: str = "") -> str:
    by = f"{key}, le" if key else "le"
    return quantile(q, f"sum by ({by}) ({recorded_rate(histogram, 'bucket')}{PER_SOURCE})")


def _quantiles(histogram: str) -> list[Dataquery]:
    return [query(_quantile(q, histogram), f"P{round(q * 100)}") for q in QUANTILES]


def add_source_rows(board: Dashboard) -> None:
    """One row per source of request timings (the recording rules' series): the same
    latencies as above, for gpuscope's spans and for an engine's own /metrics alike."""
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
        )
    )
    board.with_panel(
        timeseries(
            "Compute: prefill and decode",
            "Mean seconds in each part of compute, where the engine reports them (vLLM: "
            "prefill, then decode); stacked, they add up to the mean compute time. Empty "
            "for engines that report compute whole (the reference worker).",
            [query(_mean(STAGE_HISTOGRAM, contract.STAGE), "{{stage}}")],
            "s",
            HALF,
            stacked=True,
        )
    )
    board.with_panel(
        timeseries(
            "P99 per phase and compute stage",
            "P99 of each phase and of each part of compute, not stacked: quantiles do not "
            "add up." + VLLM_BUCKETS_NOTE,
            [
                query(_quantile(0.99, PHASE_HISTOGRAM, contract.PHASE), "{{phase}}"),
                query(_quantile(0.99, STAGE_HISTOGRAM, contract.STAGE), "compute: {{stage}}"),
            ],
            "s",
            HALF,
        )
    )
    board.with_panel(
        timeseries(
            "End-to-end latency",
            "P50, P95 and P99 of the model requests' duration from this source (vLLM: from "
            "its arrival in the engine's API server to the last token)." + VLLM_BUCKETS_NOTE,
            _quantiles(DURATION_HISTOGRAM),
            "s",
            HALF,
        )
    )
    board.with_panel(
        timeseries(
            "Request rate",
            "Model requests finished per second, from this source.",
            [query(f"sum ({recorded_rate(DURATION_HISTOGRAM, 'count')}{PER_SOURCE})", "req/s")],
            "reqps",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "Time to first token",
            "P50, P95 and P99 from arrival to the first token, from this source.",
            _quantiles(TTFT_HISTOGRAM),
            "s",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "Time per output token",
            "P50, P95 and P99 of each request's time per generated token after the first, "
            "from this source.",
            _quantiles(TPOT_HISTOGRAM),
            "s",
            THIRD,
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
    )
