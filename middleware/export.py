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
(``spans_rejected_by_receiver``, at most the batch), not retried. Each accepted answer
also says whether the receiver keeps phase child spans (``keeps_phase_spans``: a
gpuscope exporter's ``Gpuscope-Phase-Spans`` header; without one, a trace backend),
which the phase spans' ``auto`` mode follows (``phase_spans``).
``CountingExporter`` counts what was delivered and what was not in ``stats``, and
never lets an exception out.

Against a receiver that misbehaves: a redirect is not followed (urllib turned the POST
into a GET without its body, sent the configured headers to the other host and took
its 200 for delivery); it is a failure whose warning names the new location. An attempt
has a deadline of its own, not only one per read (a receiver trickling a byte just
under each read's timeout held the one export thread for hours): at the deadline, or
when the pipeline shuts down, the connection is cut (``socket.shutdown``). A
``Retry-After`` raises the backoff, never lowers it (``0`` made a busy loop of
thousands of POSTs a second), and may be an HTTP date. Credentials in the endpoint URL
(``https://user:pass@host/...``), which urllib cannot use, become Basic authentication
and never reach a log. A certificate that fails verification is not retried.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import gzip
import http.client
import logging
import math
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit, urlunsplit

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
        self.endpoint, credentials = _without_credentials(endpoint)
        self.timeout_s = timeout_s
        self.gzip = compression == "gzip"
        self._headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"gpuscope/{__version__}",
            **({"Content-Encoding": "gzip"} if self.gzip else {}),
            **({"Authorization": credentials} if credentials else {}),
            **(headers or {}),
        }
        self._ssl_context = ssl.create_default_context()
        self._attempt: _Attempt | None = None  # the POST on the wire, to cut
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
                problem, retryable = f"{type(exc).__name__}: {exc}", not _certificate_failed(exc)
            else:
                if 200 <= answer.status < 300:
                    self._recovered()
                    said = (answer.phase_spans or "").strip().lower()
                    self.keeps_phase_spans = said != contract.PHASE_SPANS_DROPPED
                    self._note_partial_success(answer, len(spans))
                    return SpanExportResult.SUCCESS
                text = answer.body[:200].decode("utf-8", "replace")
                problem = f"HTTP {answer.status}: {text}"
                if 300 <= answer.status < 400:
                    problem = f"HTTP {answer.status}, not followed: set the endpoint to {text}"
                retryable = answer.status in RETRYABLE_STATUS
                retry_after = _retry_after(answer.retry_after)
            # The receiver's Retry-After may ask for a longer wait, never a shorter one.
            wait = backoff if retry_after is None else max(backoff, retry_after)
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
        """One POST within ``timeout_s`` in all; an HTTP error status (a redirect
        included) is an answer, not an exception."""
        request = urllib.request.Request(
            self.endpoint, data=body, headers=self._headers, method="POST"
        )
        attempt = _Attempt()
        opener = urllib.request.build_opener(
            _NoRedirects(), _WatchedHttp(attempt), _WatchedHttps(attempt, self._ssl_context)
        )
        self._attempt = attempt
        deadline = threading.Timer(timeout_s, attempt.cut)
        deadline.daemon = True
        deadline.start()
        try:
            if self._closing:  # shutdown came between the check in export() and here
                attempt.cut()
            with opener.open(request, timeout=timeout_s) as response:
                return _Answer(
                    response.status,
                    response.headers.get("Content-Type", ""),
                    response.headers.get("Retry-After"),
                    response.read(MAX_RESPONSE_BYTES),
                    response.headers.get(contract.PHASE_SPANS_HEADER),
                )
        except urllib.error.HTTPError as error:
            with error:
                location = error.headers.get("Location", "")
                return _Answer(
                    error.code,
                    error.headers.get("Content-Type", ""),
                    error.headers.get("Retry-After"),
                    location.encode()
                    if 300 <= error.code < 400
                    else error.read(MAX_RESPONSE_BYTES),
                )
        finally:
            deadline.cancel()
            self._attempt = None

    def _note_partial_success(self, answer: _Answer, sent: int) -> None:
        """Count spans the receiver accepted the request for but rejected (not retried),
        at most the ``sent`` spans of the request."""
        if not answer.body or "protobuf" not in answer.content_type:
            return
        try:
            partial = ExportTraceServiceResponse.FromString(answer.body).partial_success
        except DecodeError:
            logger.debug("unreadable OTLP response from %s", self.endpoint)
            return
        rejected = min(max(partial.rejected_spans, 0), sent)
        if rejected:
            stats.count(stats.SPANS_REJECTED_BY_RECEIVER, rejected)
            logger.debug(
                "%s rejected %d spans: %s",
                self.endpoint,
                rejected,
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
        """Stop retrying and cut the POST on the wire, if any: its batch then fails at
        once (and is counted) instead of outliving the process's shutdown."""
        with self._retry_rules:
            self._closing = True
            self._retry_rules.notify_all()
        attempt = self._attempt
        if attempt is not None:
            attempt.cut()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is buffered here; the span processor holds the queue


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` (seconds or an HTTP date); None when it
    says nothing usable (absent, negative, not a number)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _without_credentials(endpoint: str) -> tuple[str, str | None]:
    """``endpoint`` without the ``user:password@`` urllib cannot use, and the Basic
    ``Authorization`` value they stand for. Only http and https endpoints are taken."""
    parts = urlsplit(endpoint)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"the OTLP endpoint must be an http:// or https:// URL, got {_shown(endpoint)!r}"
        )
    if parts.username is None and parts.password is None:
        return endpoint, None
    host = parts.netloc.rpartition("@")[2]
    user_pass = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    basic = "Basic " + base64.b64encode(user_pass.encode()).decode("ascii")
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), basic


def _shown(endpoint: str) -> str:
    """``endpoint`` fit for a log line: any ``user:password@`` replaced."""
    scheme, separator, rest = endpoint.partition("://")
    authority, slash, path = rest.partition("/")
    if separator and "@" in authority:
        return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"
    return endpoint


def _certificate_failed(exc: BaseException) -> bool:
    """A certificate that does not verify does not start verifying in a retry."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, ssl.SSLCertVerificationError)


class _Attempt:
    """One POST's socket, so that its deadline or a shutdown can cut it.

    urllib's timeout bounds each read, not the attempt. Shutting the socket down
    (``SHUT_RDWR``) wakes the read under way, which then fails. The socket object is
    kept, not its descriptor number: once really closed it refuses the call, so a cut
    that comes late never reaches another connection. (A TLS handshake is not cut: the
    socket is known once it is connected.)
    """

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.cut_off = False

    def connected(self, sock: socket.socket | None) -> None:
        if self.cut_off:
            raise TimeoutError("the export attempt was cut off")
        self.sock = sock
        if self.cut_off:  # cut while this was being recorded
            self.cut()

    def cut(self) -> None:
        self.cut_off = True
        if self.sock is not None:
            with contextlib.suppress(OSError):  # closed already
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)


class _WatchedHTTPConnection(http.client.HTTPConnection):
    """A connection that tells its attempt which socket it connected."""

    def __init__(self, *args: Any, attempt: _Attempt, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempt = attempt

    def connect(self) -> None:
        super().connect()  # for HTTPS, the TLS handshake included
        self.attempt.connected(self.sock)


class _WatchedHTTPSConnection(_WatchedHTTPConnection, http.client.HTTPSConnection):
    pass


class _WatchedHttp(urllib.request.HTTPHandler):
    def __init__(self, attempt: _Attempt) -> None:
        super().__init__()
        self.attempt = attempt

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_WatchedHTTPConnection, attempt=self.attempt), req)


class _WatchedHttps(urllib.request.HTTPSHandler):
    def __init__(self, attempt: _Attempt, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.attempt = attempt
        self.ssl_context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = partial(_WatchedHTTPSConnection, attempt=self.attempt)
        return self.do_open(connection, req, context=self.ssl_context)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it came: urllib would follow a 301-303 with a GET
    without the spans, sending the configured headers to wherever it points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


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
