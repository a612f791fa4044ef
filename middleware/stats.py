"""Process-wide counters of what gpuscope's telemetry did and what it got wrong.

Telemetry must never break the application, so failures inside gpuscope are
swallowed; they are counted here (and logged once per kind) so that they can be
seen. ``snapshot()`` is cheap and thread-safe enough for a health endpoint; the
keys in ``STABLE_KEYS`` are always present (at 0 until something happens).

Any application can serve these counters on its Prometheus endpoint::

    from gpuscope.middleware import stats
    stats.register(registry)   # or stats.register() for prometheus_client's default

Each key ``k`` becomes the counter ``gpuscope_middleware_<k>_total``. prometheus_client
is imported only when ``register`` or ``Collector.collect`` runs, so importing the
middleware stays light.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from gpuscope.contract.rows import MIDDLEWARE_PREFIX

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

logger = logging.getLogger("gpuscope.middleware")

# Each finished span that setup_tracing()'s pipeline received ends in exactly one of
# these four: delivered, failed to deliver, or dropped before an export was tried.
SPANS_EXPORTED: Final = "spans_exported"
SPANS_EXPORT_FAILED: Final = "spans_export_failed"
SPANS_DROPPED_QUEUE_FULL: Final = "spans_dropped_queue_full"
SPANS_DROPPED_SHUTDOWN: Final = "spans_dropped_shutdown"
# Delivered, but refused by the receiver in a partial_success (part of spans_exported).
SPANS_REJECTED_BY_RECEIVER: Final = "spans_rejected_by_receiver"
# Requests the application's own sampler left out of the phase histograms.
REQUESTS_SAMPLED_OUT: Final = "requests_sampled_out"
STABLE_KEYS: Final = (
    SPANS_EXPORTED,
    SPANS_EXPORT_FAILED,
    SPANS_DROPPED_QUEUE_FULL,
    SPANS_DROPPED_SHUTDOWN,
    SPANS_REJECTED_BY_RECEIVER,
    REQUESTS_SAMPLED_OUT,
)
METRIC_PREFIX: Final = MIDDLEWARE_PREFIX

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_logged: set[str] = set()


def count(kind: str, n: int = 1) -> None:
    """Add ``n`` to the counter ``kind`` (e.g. ``marks_out_of_order``)."""
    with _lock:
        _counts[kind] += n


def record_failure(kind: str, exc: BaseException) -> None:
    """Count a swallowed exception; log its first occurrence with a traceback."""
    with _lock:
        _counts[kind] += 1
        first = kind not in _logged
        _logged.add(kind)
    if first:
        logger.warning("gpuscope telemetry error (%s), counted and ignored", kind, exc_info=exc)
    else:
        logger.debug("gpuscope telemetry error (%s): %r", kind, exc)


def snapshot() -> dict[str, int]:
    """A copy of every counter, with every ``STABLE_KEYS`` entry present."""
    with _lock:
        return {key: 0 for key in STABLE_KEYS} | dict(_counts)


def reset() -> None:
    """Zero every counter (tests)."""
    with _lock:
        _counts.clear()
        _logged.clear()


class Collector:
    """A prometheus_client collector of ``snapshot()``: one counter per key."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily

        for key, value in sorted(snapshot().items()):
            yield CounterMetricFamily(
                METRIC_PREFIX + key,
                f"gpuscope middleware: {key.replace('_', ' ')}.",
                value=value,
            )


def register(registry: CollectorRegistry | None = None) -> Collector:
    """Serve the counters from ``registry`` (default: prometheus_client's global one)."""
    from prometheus_client import REGISTRY

    collector = Collector()
    (registry if registry is not None else REGISTRY).register(collector)
    return collector
