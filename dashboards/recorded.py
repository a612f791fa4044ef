"""The recorded series the boards read, named by the rules that record them (``alerts``).

Request timings seen through more than one path (gpuscope's spans, vLLM's own
``/metrics``) are only comparable per source, so the boards read them from the
recording rules, which label each series with its ``source`` (``dashboards/engines.py``)
and its ``host``. Their names carry the rules' window, taken here from the one table
the rules are built from (``alerts/settings.py``): change it there, then run both
``make rules`` and ``make dashboards``.
"""

from __future__ import annotations

from alerts.recording import GPU_HOST, VERDICT, rate_record
from alerts.settings import Settings
from dashboards.engines import PHASE_HISTOGRAM

__all__ = ["GPU_HOST", "SOURCE_SERIES", "VERDICT", "WINDOW", "rate"]

WINDOW = Settings().window


def rate(histogram: str, suffix: str) -> str:
    """The recorded per-second rate of ``histogram``'s ``sum``, ``count`` or ``bucket``,
    per source, service, model, host and GPU."""
    return rate_record(histogram, suffix) + WINDOW


# The series the source-aware variables list their values from: every source has it.
SOURCE_SERIES = rate(PHASE_HISTOGRAM, "count")
