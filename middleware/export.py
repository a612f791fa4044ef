"""A span exporter wrapper that counts what it could not deliver (SDK side)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gpuscope.middleware import stats


class CountingExporter(SpanExporter):
    """Counts exported and failed spans in ``stats``; never lets an exception out."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:
            stats.record_failure("span_export", exc)
            result = SpanExportResult.FAILURE
        stats.count(
            "spans_exported" if result is SpanExportResult.SUCCESS else "spans_export_failed",
            len(spans),
        )
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
