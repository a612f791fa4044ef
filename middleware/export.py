"""Span exporters for ``setup_tracing()`` (SDK side).

``OtlpHttpExporter`` posts OTLP/HTTP protobuf like the SDK's exporter, but encodes
with ``otlp_encoding`` (several times cheaper per span), over the standard library's
HTTP client (no third-party HTTP library at run time), and retries the way the OTLP
specification asks: on 429, 502, 503, 504 and connection errors, with exponential
backoff (honouring ``Retry-After``), until its timeout. Once its process shuts down,
retries end sooner: the span pipeline calls ``retry_until`` with the end of a short
window (``span_pipeline.SHUTDOWN_RETRY_S``), after which a failed attempt is final and
a backoff under way ends. Before, a worker whose exporter had gone with it (a SIGKILLed
``gpuscope demo``) backed off 0.25 + 0.5 + 1 + 2 + 4 s on one batch and lingered 8 s.
Spans the receiver rejects in a ``partial_success`` are counted
(``spans_rejected_by_receiver``), not retried. Each accepted answer also says whether
the receiver keeps phase child spans (``keeps_phase_spans``: a gpuscope exporter's
``Gpuscope-Phase-Spans`` header; without one, a trace backend), which the phase spans'
``auto`` mode follows (``phase_spans``).
``CountingExporter`` counts what was delivered and what was not in ``stats``, and
never lets an exception out.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gpuscope import __version__
from gpuscope import spans as contract
from gpuscope.middleware import stats
from gpuscope.middleware.otlp_encoding import encode_export_request

logger = logging.getLogger("gpuscope.middleware.export")

RETRYABLE_STATUS = frozenset((429, 502, 503, 504))
# An OTLP response is a small protobuf; never read more than this of any answer.
MAX_RESPONSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class _Answer:
    """What came back from one POST: the status, three headers and the (capped) body."""

    status: int
    content_type: str
    retry_after: str | None
    body: bytes
    phase_spans: str | None = None


class OtlpHttpExporter(SpanExporter):
    """OTLP/HTTP protobuf exporter with a fast encoder and spec-conformant retries."""

    def __init__(
        self,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        compression: str | None = None,
    ) -> None:
        if compression not in (None, "none", "gzip"):
            raise ValueError(f"compression must be 'gzip' or 'none', got {compression!r}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.gzip = compression == "gzip"
        self._headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"gpuscope/{__version__}",
            **({"Content-Encoding": "gzip"} if self.gzip else {}),
            **(headers or {}),
        }
        # ``_closing`` and ``_retries_end`` change under ``_retry_rules``, which also
        # wakes a backoff under way so that it re-reads them.
        self._retry_rules = threading.Condition()
        self._closing = False
        self._retries_end = math.inf  # monotonic time after which nothing is retried
        self._failing = False
        # Whether the receiver keeps phase child spans; None until it has accepted a request.
        self.keeps_phase_spans: bool | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closing:
            return SpanExportResult.FAILURE
        body = encode_export_request(spans)
        if self.gzip:
            body = gzip.compress(body, compresslevel=1)
        deadline = time.monotonic() + self.timeout_s
        backoff = 0.25
        while True:
            remaining = deadline - time.monotonic()
            retry_after: float | None = None
            try:
                answer = self._post(body, max(remaining, 0.01))
            except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
                problem, retryable = f"{type(exc).__name__}: {exc}", True
            else:
                if 200 <= answer.status < 300:
                    self._recovered()
                    self.keeps_phase_spans = answer.phase_spans != contract.PHASE_SPANS_DROPPED
                    self._note_partial_success(answer)
                    return SpanExportResult.SUCCESS
                text = answer.body[:200].decode("utf-8", "replace")
                problem = f"HTTP {answer.status}: {text}"
                retryable = answer.status in RETRYABLE_STATUS
                retry_after = _retry_after(answer.retry_after)
            wait = backoff if retry_after is None else retry_after
            if not retryable or not self._waited_to_retry(wait, deadline):
                self._failed(len(spans), problem)
                return SpanExportResult.FAILURE
            backoff = min(backoff * 2, 5.0)

    def _waited_to_retry(self, wait: float, deadline: float) -> bool:
        """Sleep ``wait`` s before a retry; False at once (no retry) if the retry would
        come after ``deadline`` or the retry window, or when shutdown comes meanwhile."""
        retry_at = time.monotonic() + wait
        with self._retry_rules:
            while True:
                if self._closing or retry_at >= min(deadline, self._retries_end):
                    return False
                left = retry_at - time.monotonic()
                if left <= 0:
                    return True
                self._retry_rules.wait(left)

    def retry_until(self, end: float) -> None:
        """Retry nothing after the monotonic time ``end`` (the process is shutting down);
        a backoff that would end later stops now."""
        with self._retry_rules:
            self._retries_end = min(self._retries_end, end)
            self._retry_rules.notify_all()

    def _post(self, body: bytes, timeout_s: float) -> _Answer:
        """One POST; an HTTP error status is an answer, not an exception."""
        request = urllib.request.Request(
            self.endpoint, data=body, headers=self._headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return _Answer(
                    response.status,
                    response.headers.get("Content-Type", ""),
                    response.headers.get("Retry-After"),
                    response.read(MAX_RESPONSE_BYTES),
                    response.headers.get(contract.PHASE_SPANS_HEADER),
                )
        except urllib.error.HTTPError as error:
            with error:
                return _Answer(
                    error.code,
                    error.headers.get("Content-Type", ""),
                    error.headers.get("Retry-After"),
                    error.read(MAX_RESPONSE_BYTES),
                )

    def _note_partial_success(self, answer: _Answer) -> None:
        """Count spans the receiver accepted the request for but rejected (not retried)."""
        if not answer.body or "protobuf" not in answer.content_type:
            return
        try:
            partial = ExportTraceServiceResponse.FromString(answer.body).partial_success
        except DecodeError:
            logger.debug("unreadable OTLP response from %s", self.endpoint)
            return
        if partial.rejected_spans:
            stats.count(stats.SPANS_REJECTED_BY_RECEIVER, partial.rejected_spans)
            logger.debug(
                "%s rejected %d spans: %s",
                self.endpoint,
                partial.rejected_spans,
                partial.error_message,
            )

    def _failed(self, count: int, problem: str) -> None:
        # One warning when delivery starts failing, not one per batch.
        log = logger.debug if self._failing else logger.warning
        log("could not export %d spans to %s (%s)", count, self.endpoint, problem)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            logger.info("exporting spans to %s again", self.endpoint)
            self._failing = False

    def shutdown(self) -> None:
        with self._retry_rules:
            self._closing = True
            self._retry_rules.notify_all()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is buffered here; the span processor holds the queue


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


@runtime_checkable
class RetryingExporter(Protocol):
    """An exporter whose retries can be cut short at shutdown."""

    def retry_until(self, end: float) -> None: ...


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
        ok = result is SpanExportResult.SUCCESS
        stats.count(stats.SPANS_EXPORTED if ok else stats.SPANS_EXPORT_FAILED, len(spans))
        return result

    def retry_until(self, end: float) -> None:
        if isinstance(self.inner, RetryingExporter):
            self.inner.retry_until(end)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
