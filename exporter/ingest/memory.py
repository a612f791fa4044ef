"""``IngestMemory``: the bytes that export requests may hold at once, read or waiting.

Before, a body waiting for the ingest thread had no budget: three slow requests held the
thread while 200 clients each posted 8 MiB, and the exporter reached 1,920 MiB, twice
the DaemonSet's 956 Mi. Now every body takes its share of ``--max-ingest-bytes`` before
it is read (its declared length, or ``--max-body-bytes`` when it declares none), cut to
its real size once read, and the ingest thread takes the decompressed size too (the most
it can be, ``--max-decompressed-bytes``, before inflating; the real size after) until
the request is decoded. A request that does not fit is answered 429 with
``Retry-After`` (``ingest_memory_full``), which the OpenTelemetry SDK retries; the
decoder's own memory (one request at a time) is outside this budget, and the manifests'
limit counts it separately (``docs/reliability.md``).

Shared by the event loop and the ingest thread, hence the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from gpuscope.exporter.ingest import otlp

# ``gpuscope_otlp_requests_rejected_total{reason}``: the budget was full (429).
INGEST_MEMORY_FULL = "ingest_memory_full"


class Holding:
    """One request's share of the budget; ``resize`` to what it really holds."""

    def __init__(self, memory: IngestMemory, size: int) -> None:
        self._memory = memory
        self.size = size

    def resize(self, size: int) -> None:
        """Take or give back the difference; an ``OtlpError`` 429 if more does not fit."""
        self._memory.take(size - self.size)
        self.size = size


class IngestMemory:
    """At most ``limit`` bytes taken at once, across every request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes taken now
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        """Take ``size`` bytes (give back when negative); 429 ``OtlpError`` past the limit."""
        with self._lock:
            if size > 0 and self.held + size > self.limit:
                raise otlp.OtlpError(
                    429,
                    INGEST_MEMORY_FULL,
                    f"export requests already hold {self.held} of {self.limit} bytes; retry",
                )
            self.held += size

    @contextmanager
    def holding(self, size: int) -> Iterator[Holding]:
        """``size`` bytes taken for the ``with`` block, all given back at its end."""
        self.take(size)
        share = Holding(self, size)
        try:
            yield share
        finally:
            self.take(-share.size)
