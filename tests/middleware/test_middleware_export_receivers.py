"""The span exporter against receivers that misbehave: raw sockets on 127.0.0.1 answer
what a broken or hostile OTLP endpoint would, and every span must still be counted once,
in time, with nothing sent where it was not meant to go."""

from __future__ import annotations

import base64
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuscope.middleware import stats
from gpuscope.middleware.export import CountingExporter, OtlpHttpExporter, _retry_after
from gpuscope.middleware.span_pipeline import CountingBatchSpanProcessor

Answer = Callable[[socket.socket, bytes], None]


class Receiver:
    """Accepts connections; for each, reads the request head and body, then ``answer``s."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/v1/traces"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection: socket.socket) -> None:
        with connection:
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length:
                    body += connection.recv(65536)
                self.requests.append(head)
                self.answer(connection, body)
            except OSError:
                return


@contextmanager
def receiver(answer: Answer) -> Iterator[Receiver]:
    endpoint = Receiver(answer)
    try:
        yield endpoint
    finally:
        endpoint.server.close()


def spans(count: int) -> list[ReadableSpan]:
    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    tracer = provider.get_tracer("test")
    for _ in range(count):
        tracer.start_span("s").end()
    return list(kept.get_finished_spans())


def status(code: str, headers: str = "", body: bytes = b"") -> Answer:
    def answer(connection: socket.socket, _: bytes) -> None:
        connection.sendall(
            f"HTTP/1.1 {code}\r\nContent-Length: {len(body)}\r\n{headers}"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    return answer


@pytest.fixture(autouse=True)
def fresh_counts() -> None:
    stats.reset()


def test_a_redirect_is_a_failure_not_followed_and_names_where_it_points(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """urllib followed a 302 with a GET without the spans, sent the configured headers
    to the other host and took its 200 for delivery."""
    with receiver(status("200 OK")) as elsewhere:
        moved = status("302 Found", f"Location: {elsewhere.url}\r\n")
        with receiver(moved) as endpoint, caplog.at_level(logging.WARNING):
            exporter = CountingExporter(
                OtlpHttpExporter(endpoint.url, headers={"Authorization": "Bearer secret"})
            )
            assert exporter.export(spans(10)) is SpanExportResult.FAILURE
    assert elsewhere.requests == []
    assert stats.snapshot()["spans_export_failed"] == 10
    assert stats.snapshot()["spans_exported"] == 0
    assert f"set the endpoint to {elsewhere.url}" in caplog.text


def test_an_answer_trickled_a_byte_at_a_time_is_cut_at_the_timeout() -> None:
    """The timeout bounded each read: one byte every 0.2 s held the export for hours."""

    def trickle(connection: socket.socket, _: bytes) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + b"X-Slow: y\r\n" * 1000:
            connection.sendall(bytes([byte]))
            time.sleep(0.2)

    with receiver(trickle) as endpoint:
        exporter = CountingExporter(OtlpHttpExporter(endpoint.url, timeout_s=1.0))
        started = time.monotonic()
        assert exporter.export(spans(5)) is SpanExportResult.FAILURE
        took = time.monotonic() - started
    assert took < 10, took  # about 1 s; unbounded before
    assert stats.snapshot()["spans_export_failed"] == 5


def test_shutdown_cuts_the_export_on_the_wire_and_counts_its_batch() -> None:
    """A receiver that never answers: when shutdown returns, every span is in a counter
    (before, the batch on the wire was in none, and counted later only if the process
    lived long enough)."""

    def never_answers(connection: socket.socket, body: bytes) -> None:
        time.sleep(30)  # timed: holds the connection open, unanswered, past the test

    with receiver(never_answers) as endpoint:
        pipeline = CountingBatchSpanProcessor(
            CountingExporter(OtlpHttpExporter(endpoint.url, timeout_s=20.0)),
            schedule_delay_s=0.01,
        )
        for span in spans(100):
            pipeline.on_end(span)
        while not endpoint.requests:
            time.sleep(0.01)
        started = time.monotonic()
        pipeline.shutdown(timeout_s=0.5)
        took = time.monotonic() - started
        counts = stats.snapshot()
    assert counts["spans_export_failed"] + counts["spans_dropped_shutdown"] == 100
    assert pipeline.idle()
    assert took < 5, took


def test_retry_after_raises_the_backoff_never_lowers_it() -> None:
    """``Retry-After: 0`` made thousands of POSTs a second; the backoff is the floor."""
    with receiver(status("503 Service Unavailable", "Retry-After: 0\r\n")) as endpoint:
        exporter = CountingExporter(OtlpHttpExporter(endpoint.url, timeout_s=2.0))
        assert exporter.export(spans(3)) is SpanExportResult.FAILURE
    assert 2 <= len(endpoint.requests) <= 6  # 0.25, 0.5, 1 s of backoff in 2 s
    assert stats.snapshot()["spans_export_failed"] == 3


def test_retry_after_as_seconds_or_a_date_and_nothing_else() -> None:
    assert _retry_after("3") == 3.0
    assert _retry_after(None) is None
    for unusable in ("-5", "nan", "inf", "soon"):
        assert _retry_after(unusable) is None, unusable
    in_a_while = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    seconds = _retry_after(in_a_while)
    assert seconds is not None and 55 < seconds <= 61


def test_credentials_in_the_endpoint_become_basic_auth_and_stay_out_of_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with receiver(status("503 Service Unavailable")) as endpoint:
        url = endpoint.url.replace("http://", "http://user:s%40cret@")
        with caplog.at_level(logging.DEBUG):
            CountingExporter(OtlpHttpExporter(url, timeout_s=0.3)).export(spans(1))
    expected = base64.b64encode(b"user:s@cret").decode()
    assert f"Authorization: Basic {expected}".encode() in endpoint.requests[0]
    assert "cret" not in caplog.text and endpoint.url in caplog.text


def test_partial_success_counts_at_most_the_spans_sent() -> None:
    for rejected, counted in ((-7, 0), (1_000_000, 10), (4, 4)):
        stats.reset()
        response = ExportTraceServiceResponse()
        response.partial_success.rejected_spans = rejected
        answer = status(
            "200 OK", "Content-Type: application/x-protobuf\r\n", response.SerializeToString()
        )
        with receiver(answer) as endpoint:
            CountingExporter(OtlpHttpExporter(endpoint.url)).export(spans(10))
        assert stats.snapshot()["spans_rejected_by_receiver"] == counted, rejected


@pytest.mark.parametrize(
    "endpoint", ["localhost:4318/v1/traces", "file:///etc/hostname", "ftp://host/v1/traces"]
)
def test_an_endpoint_that_is_no_http_url_is_refused_at_setup(endpoint: str) -> None:
    with pytest.raises(ValueError, match="must be an http:// or https:// URL"):
        OtlpHttpExporter(endpoint)
