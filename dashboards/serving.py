"""The serving engine's own state: the worker's ``/metrics`` (``gpuscope_worker_*``), or
vLLM's (``vllm:*``).

These series come from scraping the inference server itself, not the exporter, so
they carry only that scrape's ``job`` and ``instance`` (plus ``endpoint`` on the
worker's request gauges), which the board's ``$job`` and ``$instance`` (listed from
the exporter's and every engine's series) filter. The worker's queries join
``gpuscope_worker_info`` on (job, instance) to pick up its ``model`` label, which the
``$model`` variable then filters; vLLM's series carry the model as ``model_name``.
Triton's, TGI's and SGLang's state comes from the recording rules (``source`` names
the engine), per scrape target.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards.panels import RATE, THIRD, query, row, selector, timeseries
from pack.contract import (
    ENDPOINT,
    MODEL,
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
from pack.engines import (
    VLLM_KV_USAGE,
    VLLM_PREEMPTIONS,
    VLLM_RUNNING,
    VLLM_WAITING,
)
from pack.recorded import KV_USAGE, RUNNING, WAITING, WINDOW
from pack.settings import SOURCE

# Every series of the row is one scrape target's: filtered by the board's $job, $instance.
TARGET = selector("job", "instance")
WORKER_MODEL = WORKER_INFO + selector("job", "instance", extra=[f'{MODEL}=~"$model"'])
VLLM_MODEL = selector("job", "instance", extra=['model_name=~"$model"'])
# The engines' state the rules record per scrape target, labelled with the engine (the
# worker's and vLLM's records of the same names carry no source).
ENGINE_STATE = selector("job", "instance", extra=[f'{SOURCE}!=""'])


def vllm_per_instance(expr: str, aggregation: str = "sum") -> str:
    """vLLM's ``expr`` per server, its data-parallel engines added up (or their max)."""
    return f"{aggregation} by (instance) ({expr})"


def for_model(metric: str) -> str:
    """``metric`` of the workers serving ``$model``, labelled with their model."""
    return f"{metric}\n* on (job, instance) group_left ({MODEL})\n{WORKER_MODEL}"


def engine_state(record: str, by: str, aggregation: str = "sum") -> str:
    """A per-target state the rules record for every engine with such a gauge."""
    return f"{aggregation} by ({by}) ({record}{WINDOW}{ENGINE_STATE})"


def engine_queue() -> str:
    """The engines' running and waiting requests in one query, told apart by ``state``
    (an engine may record either: Triton and TGI count only those waiting)."""
    return "\nor\n".join(
        f"label_replace(\n{engine_state(record, f'{SOURCE}, instance, {ENDPOINT}')},\n"
        f'"state", "{state}", "", ""\n)'
        for record, state in ((RUNNING, "running"), (WAITING, "waiting"))
    )


def per_instance(metric: str, by: str = "instance") -> str:
    return f"sum by ({by}) (\n{for_model(metric)}\n)"


def configured(metric: str) -> str:
    """The largest configured value across the workers serving ``$model``."""
    return f"max (\n{for_model(metric + TARGET)}\n)"


def add_row(board: Dashboard) -> None:
    """The "Serving engine" row: queue, KV cache, preemptions, iterations, outcomes."""
    board.with_row(row("Serving engine (the worker's, vLLM's or an engine's /metrics)"))
    board.with_panel(
        timeseries(
            "Requests running and waiting",
            "Requests in the batch on the device, and requests waiting for one (queued or "
            "preempted), per worker and endpoint, per vLLM server, or per scrape target of an "
            "engine the rules map (Triton's pending requests, TGI's queue, SGLang's running "
            "and queued requests). Waiting that grows "
            "while running stays at the batch size (vLLM: --max-num-seqs) means the server "
            "is at capacity.",
            [
                query(
                    per_instance(WORKER_RUNNING + TARGET, "instance, endpoint"),
                    "running {{endpoint}} {{instance}}",
                ),
                query(
                    per_instance(WORKER_WAITING + TARGET, "instance, endpoint"),
                    "waiting {{endpoint}} {{instance}}",
                ),
                query(vllm_per_instance(VLLM_RUNNING + VLLM_MODEL), "running vLLM {{instance}}"),
                query(vllm_per_instance(VLLM_WAITING + VLLM_MODEL), "waiting vLLM {{instance}}"),
                query(engine_queue(), "{{state}} {{source}} {{instance}}"),
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
                query(per_instance(WORKER_KV_USAGE + TARGET), "{{instance}}"),
                # vLLM's, or an engine's (SGLang's) the rules record labelled with it
                query(
                    f"label_replace(\n{vllm_per_instance(VLLM_KV_USAGE + VLLM_MODEL, 'max')},\n"
                    f'"{SOURCE}", "vLLM", "", ""\n)\nor\n'
                    + engine_state(KV_USAGE, f"{SOURCE}, instance", "max"),
                    "{{source}} {{instance}}",
                ),
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
                query(per_instance(WORKER_KV_BLOCKS_USED + TARGET), "used {{instance}}"),
                query(per_instance(WORKER_KV_BLOCKS + TARGET), "total {{instance}}"),
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
                query(per_instance(f"rate({WORKER_PREEMPTIONS}{TARGET}[{RATE}])"), "{{instance}}"),
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
                        f"rate({WORKER_BATCH_ITERATIONS}{TARGET}[{RATE}])",
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
                    per_instance(f"rate({WORKER_REQUESTS}{TARGET}[{RATE}])", "endpoint, outcome"),
                    "{{endpoint}} {{outcome}}",
                )
            ],
            "reqps",
            THIRD,
            stacked=True,
        )
    )
