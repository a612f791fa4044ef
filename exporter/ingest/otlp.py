"""OTLP/HTTP wire format: request bodies in, ``ExportTraceServiceResponse`` out.

Pure functions, no I/O: the aiohttp handler passes bytes and headers in and gets a
decoded request or an ``OtlpError`` naming the HTTP status and the reason label of
``gpuscope_otlp_requests_rejected_total``. Decompression is bounded: a gzip bomb
stops at ``max_decompressed_bytes + 1`` bytes of output, never at memory's end.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import code_pb2  # type: ignore[import-untyped]
from google.rpc.status_pb2 import Status  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"

# Reasons for ``gpuscope_otlp_requests_rejected_total{reason}`` (whole requests).
UNAUTHORIZED = "unauthorized"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
UNSUPPORTED_ENCODING = "unsupported_encoding"
BODY_TOO_LARGE = "body_too_large"
DECOMPRESSED_TOO_LARGE = "decompressed_too_large"
INVALID_GZIP = "invalid_gzip"
INVALID_PROTOBUF = "invalid_protobuf"
INVALID_JSON = "invalid_json"
SHUTTING_DOWN = "shutting_down"
INCOMPLETE_BODY = "incomplete_body"
BODY_TIMEOUT = "body_timeout"
SHED_AT_CAP = "shed_at_cap"
AUTH_BUSY = "auth_busy"
TOO_MANY_SPANS = "too_many_spans"
TOO_MANY_ATTRIBUTES = "too_many_attributes"
TOO_MANY_JSON_VALUES = "too_many_json_values"
REQUEST_REJECT_REASONS = (
    UNAUTHORIZED,
    UNSUPPORTED_MEDIA_TYPE,
    UNSUPPORTED_ENCODING,
    BODY_TOO_LARGE,
    DECOMPRESSED_TOO_LARGE,
    INVALID_GZIP,
    INVALID_PROTOBUF,
    INVALID_JSON,
    SHUTTING_DOWN,
    INCOMPLETE_BODY,
    BODY_TIMEOUT,
    SHED_AT_CAP,
    AUTH_BUSY,
    TOO_MANY_SPANS,
    TOO_MANY_ATTRIBUTES,
    TOO_MANY_JSON_VALUES,
)

# Protobuf decodes messages nested 100 deep (its JSON mapping stops there too); in
# OTLP/JSON an AnyValue array costs 3 JSON levels for 2 messages and a kvlist 4 for 3,
# under an envelope of about 10: at most about 160 JSON levels for what protobuf takes.
# (At 64, nesting protobuf accepted from 13 levels of kvlists up was refused in JSON.)
MAX_JSON_DEPTH: Final = 160

# google.rpc.Code of the Status body of error responses, by HTTP status.
_RPC_CODE_FOR_HTTP = {
    401: code_pb2.UNAUTHENTICATED,
    408: code_pb2.DEADLINE_EXCEEDED,
    413: code_pb2.RESOURCE_EXHAUSTED,
    503: code_pb2.UNAVAILABLE,
}


class OtlpError(Exception):
    """A request that cannot be decoded: HTTP ``status``, metric ``reason``, message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_decompressed_bytes: int
    max_spans: int = 100_000
    max_attributes: int = 1_000_000
    max_json_values: int = 1_000_000


def media_type(content_type: str | None) -> str:
    """``application/x-protobuf`` or ``application/json``; anything else is a 415."""
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if base in (PROTOBUF, JSON):
        return base
    raise OtlpError(
        415,
        UNSUPPORTED_MEDIA_TYPE,
        f"Content-Type {content_type!r} is not supported; send {PROTOBUF} or {JSON}",
    )


def decompress(body: bytes, content_encoding: str | None, limits: Limits) -> bytes:
    """Undo ``Content-Encoding: gzip`` (or pass identity through), bounded by the limits."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding != "gzip":
        raise OtlpError(
            415, UNSUPPORTED_ENCODING, f"Content-Encoding {content_encoding!r}: only gzip"
        )
    limit = limits.max_decompressed_bytes
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OtlpError(400, INVALID_GZIP, f"gzip body does not decompress: {exc}") from exc
    if len(data) > limit or inflater.unconsumed_tail:
        raise OtlpError(
            413, DECOMPRESSED_TOO_LARGE, f"gzip body inflates past the limit of {limit} bytes"
        )
    if not inflater.eof:
        raise OtlpError(400, INVALID_GZIP, "gzip body is truncated")
    return data


def decode_request(data: bytes, media: str) -> Any:
    """An ``ExportTraceServiceRequest`` from protobuf or OTLP/JSON bytes."""
    if media == PROTOBUF:
        return decode_protobuf(data)
    return json_to_request(load_json(data))


def decode_protobuf(data: bytes) -> Any:
    """An ``ExportTraceServiceRequest`` from protobuf bytes."""
    try:
        return ExportTraceServiceRequest.FromString(data)
    except DecodeError as exc:
        raise OtlpError(400, INVALID_PROTOBUF, f"body is not an OTLP protobuf: {exc}") from exc


def json_to_request(document: dict[str, Any]) -> Any:
    """An ``ExportTraceServiceRequest`` from a document ``load_json`` checked."""
    try:
        _hex_ids_to_base64(document)
        request = ExportTraceServiceRequest()
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (
        json_format.ParseError,
        ValueError,  # out-of-range numbers, strings protobuf refuses
        OverflowError,
        TypeError,
        AttributeError,
        RecursionError,
    ) as exc:
        raise OtlpError(400, INVALID_JSON, f"body is not OTLP/JSON: {exc}") from exc
    return request


def load_json(data: bytes, max_values: int | None = None) -> dict[str, Any]:
    """The JSON object, checked so that protobuf's JSON mapping only sees what it can take:
    finite numbers, strings that are valid UTF-8 (no lone surrogates), bounded nesting,
    and at most ``max_values`` values in all (objects, arrays, strings, numbers...).

    The mapping costs about 7 µs a value, in Python: 7 million empty arrays in a 20 MB
    body took 74 s of it, at a GiB of memory. Objects and arrays, the costly values, are
    counted in the bytes before they are parsed (an opening ``{`` or ``[`` inside a
    string counts too, which only ever over-counts), every value in the parsed document
    before the mapping."""
    if max_values is not None and data.count(b"{") + data.count(b"[") > max_values:
        raise _too_many_values(max_values)
    try:
        document = json.loads(data, parse_float=_finite_float, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError,
        # integers past Python's 4,300-digit conversion limit, NaN/Infinity, deep nesting
        raise OtlpError(400, INVALID_JSON, f"body is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise OtlpError(400, INVALID_JSON, "OTLP/JSON body must be an object")
    _check_json_values(document, max_values)
    return document


def _too_many_values(max_values: int) -> OtlpError:
    return OtlpError(
        413, TOO_MANY_JSON_VALUES, f"the OTLP/JSON body holds more than {max_values} values"
    )


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def _check_json_values(document: dict[str, Any], max_values: int | None) -> None:
    """Depth, strings and the number of values, walked without recursion; a container is
    counted before its items are, so the walk stops before it has gone past the cap."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    values, cap = 1, max_values if max_values is not None else math.inf
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise OtlpError(400, INVALID_JSON, f"JSON nested deeper than {MAX_JSON_DEPTH}")
        if isinstance(value, dict | list):
            values += len(value)
            if values > cap:
                raise _too_many_values(int(cap))
        if isinstance(value, dict):
            for key, item in value.items():
                _check_string(key)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            _check_string(value)


def _check_string(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise OtlpError(400, INVALID_JSON, "JSON string holds a lone surrogate") from None


def _hex_ids_to_base64(document: dict[str, Any]) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping expects base64 bytes.

    An id that is not hex becomes empty, so that span is rejected alone (``invalid_id``)
    while the rest of the request still counts.
    """
    for resource_spans in _items(document, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
            for span in _items(scope_spans, "spans"):
                _convert_ids(span, ("traceId", "trace_id", "spanId", "span_id"))
                _convert_ids(span, ("parentSpanId", "parent_span_id"))
                for link in _items(span, "links"):
                    _convert_ids(link, ("traceId", "trace_id", "spanId", "span_id"))


def json_field(container: dict[str, Any], *names: str) -> Any:
    """The value protobuf's JSON mapping takes for the field spelled ``names`` (its
    camelCase and snake_case names): of those present, the last in the object, as
    ``ParseDict`` sets each in turn. Taking the first let ``{"resourceSpans": [],
    "resource_spans": [...]}`` past the span caps, which read the empty one."""
    present = [name for name in names if name in container]
    if len(present) < 2:
        return container.get(present[0]) if present else None
    found = None
    for key, value in container.items():  # both names: the order of the object decides
        if key in names:
            found = value
    return found


def _items(container: Any, *keys: str) -> list[Any]:
    if not isinstance(container, dict):
        raise TypeError(f"expected an object, got {type(container).__name__}")
    value = json_field(container, *keys)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{keys[0]} must be an array")
    return value


def _convert_ids(message: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(message, dict):
        raise TypeError(f"expected an object, got {type(message).__name__}")
    for key in keys:
        value = message.get(key)
        if isinstance(value, str):
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                raw = b""
            message[key] = base64.b64encode(raw).decode("ascii")


def encode_response(media: str, rejected_spans: int, error_message: str) -> bytes:
    """The success body; ``partial_success`` only when something was rejected."""
    response = ExportTraceServiceResponse()
    if rejected_spans or error_message:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=rejected_spans, error_message=error_message)
        )
    if media == JSON:
        return json_format.MessageToJson(response, indent=None).encode()
    data: bytes = response.SerializeToString()
    return data


def encode_status(media: str, http_status: int, message: str) -> bytes:
    """A ``google.rpc.Status`` body for a 4xx, as the OTLP/HTTP spec asks."""
    status = Status(code=_RPC_CODE_FOR_HTTP.get(http_status, code_pb2.INVALID_ARGUMENT))
    status.message = message
    if media == JSON:
        text: str = json_format.MessageToJson(status, indent=None)
        return text.encode()
    data: bytes = status.SerializeToString()
    return data
