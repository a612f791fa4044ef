"""The recorded series the boards read, named as ``alerts/build.py`` writes them.

Request timings seen through more than one path (gpuscope's spans, vLLM's own
``/metrics``) are only comparable per source, so the boards read them from the
recording rules, which label each series with its ``source`` (``dashboards/engines.py``)
and its ``host``. Their names carry the rules' window, taken here from the one table
the rules are built from (``alerts/settings.py``): change it there, then run both
``make rules`` and ``make dashboards``.
"""

from __future__ import annotations

from alerts.settings import Settings
from dashboards.engines import PHASE_HISTOGRAM

WINDOW = Settings().window
VERDICT = "service_model_gpu:gpuscope_bottleneck:verdict"
# 1 per GPU, labelled with its host: GPU panels filtered by the rules' host
GPU_HOST = "host_gpu:gpuscope_gpu_info:max"


def rate(histogram: str, suffix: str) -> str:
    """The recorded per-second rate of ``histogram``'s ``sum``, ``count`` or ``bucket``,
    per source, service, model, host and GPU."""
    return f"service_model_gpu:{histogram}_{suffix}:rate{WINDOW}"


# The series the source-aware variables list their values from: every source has it.
SOURCE_SERIES = rate(PHASE_HISTOGRAM, "count")
