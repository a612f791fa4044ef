"""The names of the recorded series: what the rules (``alerts``) record and the boards
(``dashboards``) read, written once for both.

Request timings seen through more than one path (gpuscope's spans, vLLM's own
``/metrics``, another engine's) are only comparable per source, so the boards read
them from the recording rules, which label each series with its ``source``
(``pack/engines/``) and its ``host``. Names of windowed series leave out the
window, which the rules append from the one table (``pack/settings.py``); ``rate``
and ``WINDOW`` give the boards the same. Change the window there, then ``make pack``.
"""

from __future__ import annotations

from gpuscope.contract import gpu as gpu_rows
from pack.contract import (
    WORKER_KV_USAGE,
    WORKER_RUNNING,
    WORKER_WAITING,
    phase,
)
from pack.engines import (
    PHASE_HISTOGRAM,
)
from pack.settings import Settings, Slo

WINDOW = Settings().window


def rate_record(hist: str, suffix: str) -> str:
    """The recorded per-second rate of ``hist``'s ``sum``, ``count`` or ``bucket`` per
    source, service, model, host and GPU (and phase or stage), without its window."""
    return f"service_model_gpu:{hist}_{suffix}:rate"


def rate(histogram: str, suffix: str) -> str:
    """``rate_record`` at the rules' window: the series a board reads."""
    return rate_record(histogram, suffix) + WINDOW


# The series the source-aware variables list their values from: every source has it.
SOURCE_SERIES = rate(PHASE_HISTOGRAM, "count")

# Requests finished per second by why they ended (``reason``: stop, length, abort,
# error, ...), per source, service, model and host: vLLM's finished_reason. gpuscope's
# spans carry no finish reason as a metric label, so only engines that count them
# feed it.
FINISHED_RATE = "service_model_gpu:gpuscope_requests_finished:rate"

# Per source, service and model (each name ends with its window): requests per second,
# the share that failed, the share that missed an objective.
REQUESTS_RATE = "service_model:gpuscope_requests:rate"
ERRORS_RATIO = "service_model:gpuscope_request_errors:ratio_rate"


def slo_errors_ratio(slo: Slo) -> str:
    return f"service_model:gpuscope_{slo.name}_slo_errors:ratio_rate"


# Per source, service, model and host: the mean batch size (requests, or Triton's
# inferences, per model execution), a series of its own: gpuscope's spans keep theirs
# in the exporter's gpuscope_batch_size histogram.
BATCH_SIZE_MEAN = "service_model_gpu:gpuscope_batch_size:mean"

# 1 per GPU, labelled with its host as well (the boards' GPU-to-host map).
GPU_HOST = f"instance_host_gpu:{gpu_rows.INFO.name}:max"

# The verdict: which cause explains a service's latency, per source, service, model,
# host and GPU; its causes in precedence order after "none".
COMPUTE, BATCH_WAIT, QUEUE = phase("compute"), phase("batch_wait"), phase("queue")
VERDICT_CAUSES = ("none", COMPUTE, BATCH_WAIT, QUEUE, "underfed", "pcie", "throttled")
VERDICT = "service_model_gpu:gpuscope_bottleneck:verdict"

# Per-instance series of the serving engine's own /metrics (the worker's
# gpuscope_worker_*, or an engine's, mapped onto the same names).
KV_USAGE = f"instance:{WORKER_KV_USAGE}:avg"
WAITING = f"instance_endpoint:{WORKER_WAITING}:avg"
RUNNING = f"instance_endpoint:{WORKER_RUNNING}:avg"
