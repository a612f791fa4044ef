"""The serving engine's own state: the worker's ``/metrics`` (``gpuscope_worker_*``), or
vLLM's (``vllm:*``).

These series come from scraping the inference server itself, not the exporter, so
they carry only that scrape's ``job`` and ``instance`` (plus ``endpoint`` on the
worker's request gauges). The worker's queries join ``gpuscope_worker_info`` on (job,
instance) to pick up its ``model`` label, which the ``$model`` variable then filters;
vLLM's series carry the model as ``model_name``. The exporter's ``$job`` and
``$instance`` do not apply to another scrape job.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards.engines import (
    VLLM_KV_USAGE,
    VLLM_PREEMPTIONS,
    VLLM_RUNNING,
    VLLM_WAITING,
    WORKER_BATCH_ITERATIONS,
    WORKER_INFO,
    WORKER_KV_BLOCKS,
    WORKER_KV_BLOCKS_USED,
    WORKER_KV_USAGE,
    WORKER_PREEMPTIONS,
    WORKER_REQUESTS,
    WORKER_RUNNING,
    WORKER_WAITING,
)
from dashboards.panels import RATE, THIRD, query, row, timeseries

WORKER_MODEL = f'{WORKER_INFO}{{model=~"$model"}}'
VLLM_MODEL = '{model_name=~"$model"}'


def vllm_per_instance(expr: str, aggregation: str = "sum") -> str:
    """vLLM's ``expr`` per server, its data-parallel engines added up (or their max)."""
    return f"{aggregation} by (instance) ({expr})"


def for_model(metric: str) -> str:
    """``metric`` of the workers serving ``$model``, labelled with their model."""
    return f"{metric}\n* on (job, instance) group_left (model)\n{WORKER_MODEL}"


def per_instance(metric: str, by: str = "instance") -> str:
    return f"sum by ({by}) (\n{for_model(metric)}\n)"


def configured(metric: str) -> str:
    """The largest configured value across the workers serving ``$model``."""
    return f"max (\n{for_model(metric)}\n)"


def add_row(board: Dashboard) -> None:
    """The "Serving engine" row: queue, KV cache, preemptions, iterations, outcomes."""
    board.with_row(row("Serving engine (worker or vLLM /metrics)"))
    board.with_panel(
        timeseries(
            "Requests running and waiting",
            "Requests in the batch on the device, and requests waiting for one (queued or "
            "preempted), per worker and endpoint, or per vLLM server. Waiting that grows "
            "while running stays at the batch size (vLLM: --max-num-seqs) means the server "
            "is at capacity.",
            [
                query(
                    per_instance(WORKER_RUNNING, "instance, endpoint"),
                    "running {{endpoint}} {{instance}}",
                ),
                query(
                    per_instance(WORKER_WAITING, "instance, endpoint"),
                    "waiting {{endpoint}} {{instance}}",
                ),
                query(vllm_per_instance(VLLM_RUNNING + VLLM_MODEL), "running vLLM {{instance}}"),
                query(vllm_per_instance(VLLM_WAITING + VLLM_MODEL), "waiting vLLM {{instance}}"),
            ],
            "short",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "KV-cache usage",
            "Share of the paged KV cache's blocks held by sequences (vLLM: the fullest of "
            "its engines). Near 100 %, new sequences wait for blocks and running ones get "
            "preempted.",
            [
                query(per_instance(WORKER_KV_USAGE), "{{instance}}"),
                query(vllm_per_instance(VLLM_KV_USAGE + VLLM_MODEL, "max"), "vLLM {{instance}}"),
            ],
            "percentunit",
            THIRD,
            max_value=1,
        )
    )
    board.with_panel(
        timeseries(
            "KV-cache blocks",
            "Blocks held by sequences against the pool's size, per worker (vLLM gives its usage "
            "only: see KV-cache usage).",
            [
                query(per_instance(WORKER_KV_BLOCKS_USED), "used {{instance}}"),
                query(per_instance(WORKER_KV_BLOCKS), "total {{instance}}"),
            ],
            "short",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "Preemptions",
            "Running sequences evicted per second because the KV cache ran out; each is "
            "recomputed later, so its tokens are paid for twice.",
            [
                query(per_instance(f"rate({WORKER_PREEMPTIONS}[{RATE}])"), "{{instance}}"),
                query(
                    vllm_per_instance(f"rate({VLLM_PREEMPTIONS}{VLLM_MODEL}[{RATE}])"),
                    "vLLM {{instance}}",
                ),
            ],
            "ops",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "Batch iterations",
            "Model calls per second: one per batch (embeddings), one per decoding step "
            "(generation).",
            [
                query(
                    per_instance(
                        f"rate({WORKER_BATCH_ITERATIONS}[{RATE}])",
                        "instance, endpoint",
                    ),
                    "{{endpoint}} {{instance}}",
                )
            ],
            "ops",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "Scheduler outcomes",
            "Requests the worker's scheduler finished per second, by endpoint and outcome "
            "(completed, rejected_queue_full, timed_out, cancelled, failed).",
            [
                query(
                    per_instance(f"rate({WORKER_REQUESTS}[{RATE}])", "endpoint, outcome"),
                    "{{endpoint}} {{outcome}}",
                )
            ],
            "reqps",
            THIRD,
            stacked=True,
        )
    )
