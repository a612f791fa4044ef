"""SERVER spans from other instrumentation, as spanmetrics-shaped call and duration metrics.

gpuscope's request metrics count only gpuscope's own spans, so a request that several
instrumentations trace is counted once. SERVER spans of every other instrumentation
scope (the stock ASGI / FastAPI / gRPC instrumentation, FastAPI's built-in telemetry)
go into a separate family with the shape of the OpenTelemetry Collector's spanmetrics
connector: ``gpuscope_span_calls_total`` and ``gpuscope_span_duration_seconds`` by
``service_name``, ``span_name``, ``span_kind``, ``status_code``, plus the response
status as ``http_status_code`` (read from the stable ``http.response.status_code`` or
the older ``http.status_code``) and ``rpc_grpc_status_code``. A status that is absent
leaves its label empty; one that cannot be read rejects the span, so no series
merges different statuses under an empty label.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gpuscope.contract import exporter as rows
from gpuscope.contract import labels as L
from gpuscope.contract.rows import label_order
from gpuscope.exporter.ingest.series import CounterFamily, HistogramFamily, SpanRef

HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_STATUS_CODE_OLD: Final = "http.status_code"  # HTTP semantic conventions before 1.23
RPC_GRPC_STATUS_CODE: Final = "rpc.grpc.status_code"
SPAN_KIND_SERVER: Final = "SPAN_KIND_SERVER"
# opentelemetry.proto.trace.v1.Status.StatusCode, as spanmetrics names them.
# The order ``observe`` writes the label values in.
_WRITTEN: Final = (
    L.SERVICE_NAME,
    L.SPAN_NAME,
    L.SPAN_KIND,
    L.STATUS_CODE,
    L.HTTP_STATUS_CODE,
    L.RPC_GRPC_STATUS_CODE,
)
STATUS_CODES: Final = ("STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR")
_WANTED: Final = {HTTP_RESPONSE_STATUS_CODE: 0, HTTP_STATUS_CODE_OLD: 1, RPC_GRPC_STATUS_CODE: 2}


class StatusUnreadable(ValueError):
    """A status attribute whose value is neither an integer nor a string of digits."""


class StockSpanMetrics:
    """Call counts and durations of non-gpuscope SERVER spans, capped like the rest."""

    def __init__(self, calls: CounterFamily, duration: HistogramFamily) -> None:
        self.calls = calls  # of the SPAN_CALLS row
        self.duration = duration  # of the SPAN_DURATION row
        # The two rows share their labels: one key, in their order, serves both.
        assert rows.SPAN_CALLS.labels == rows.SPAN_DURATION.labels
        self._key = label_order(rows.SPAN_CALLS, _WRITTEN)

    def observe(
        self, span: Any, service: str, ref: SpanRef, label: Callable[[str | None, str], str]
    ) -> None:
        """Count one SERVER span; ``label`` validates a label value (may raise)."""
        http_new, http_old, grpc = _status_attributes(span.attributes)
        http_status = http_new if http_new is not None else http_old
        code = span.status.code
        labels = self._key(
            (
                service,
                label(span.name, "span name"),
                SPAN_KIND_SERVER,
                STATUS_CODES[code] if 0 <= code < len(STATUS_CODES) else STATUS_CODES[0],
                "" if http_status is None else str(http_status),
                "" if grpc is None else str(grpc),
            )
        )
        seconds = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
        self.calls.inc(labels, 1)
        self.duration.observe(labels, seconds, ref)


def _status_attributes(attributes: Any) -> list[int | None]:
    found: list[int | None] = [None, None, None]
    for kv in attributes:
        slot = _WANTED.get(kv.key)
        if slot is not None:
            found[slot] = _status_value(kv.key, kv.value)
    return found


def _status_value(key: str, value: Any) -> int:
    which = value.WhichOneof("value")
    if which == "int_value":
        number: int = value.int_value
    elif which == "string_value" and _is_short_number(value.string_value):
        number = int(value.string_value)  # some instrumentations send the code as text
    else:
        raise StatusUnreadable(f"{key} must be an integer, got {which or 'no value'}")
    if not 0 <= number <= 999:
        raise StatusUnreadable(f"{key} is {number}, not a status code")
    return number


def _is_short_number(text: str) -> bool:
    return 0 < len(text) <= 3 and text.isascii() and text.isdigit()
