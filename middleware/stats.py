"""Process-wide counters of what gpuscope's telemetry itself got wrong.

Telemetry must never break the application, so failures inside gpuscope are
swallowed; they are counted here (and logged once per kind) so that they can be
seen. ``snapshot()`` is cheap and thread-safe enough for a health endpoint.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

logger = logging.getLogger("gpuscope.middleware")

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
    """A copy of every counter."""
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Zero every counter (tests)."""
    with _lock:
        _counts.clear()
        _logged.clear()
