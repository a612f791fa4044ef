"""Finished SDK spans -> OTLP ``ExportTraceServiceRequest`` protobuf bytes, by hand.

The SDK's encoder builds one protobuf object per attribute value, key-value pair and
span, then serialises the tree: for a server span with twenty attributes that is the
largest single cost of tracing a request. This module writes the wire format
directly (https://protobuf.dev/programming-guides/encoding/), with resources, scopes
and attribute keys cached, and whole attributes for the short strings, ints and bools
that repeat from request to request (a float attribute, a phase duration, reuses
everything but its eight value bytes). It produces the same message as the
SDK's ``encode_spans`` (``tests/middleware/test_middleware_otlp_encoding.py`` parses
both and compares), for the field numbers of opentelemetry-proto's trace.proto,
common.proto and resource.proto.

What the SDK's encoder cannot write it handles as the SDK does where that loses one
value, and better where the SDK loses the whole batch: an attribute it cannot encode (a
lone surrogate in a string, an int outside int64) is left out alone, as the SDK leaves
it out, and counted (``span_attribute_unencodable`` in ``stats``); a lone surrogate in a
span or event name, a status message or a scope name, on which the SDK's encoder fails
every span of the export, is written as U+FFFD instead. The caches hold at most
``_CACHE_LIMIT`` entries each, only for keys and values of bounded length, and start
again when full, so unique values cannot pile up.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from gpuscope.middleware import stats

_SMALL_VARINTS = [bytes([n]) for n in range(128)]
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_UINT64_MASK = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_CACHE_LIMIT = 4096
_CACHED_KEY_LENGTH = 256  # a longer attribute key is encoded every time, not kept
_CACHED_STRING_LENGTH = 128  # so is a longer string value (a user agent)

# SpanFlags: the parent's is_remote is known (0x100) / the parent is remote (0x200).
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return tag + _varint(len(payload)) + payload


def _text(text: str) -> bytes:
    """UTF-8 for a name or message; a lone surrogate (unencodable) becomes U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text).encode()


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message body; raises for what OTLP cannot carry (as protobuf
    does for the SDK's encoder)."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8"))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"{value} does not fit OTLP's int64")
        return b"\x18" + _varint(value & _UINT64_MASK)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if value is None:
        return b""
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        pairs = b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items())
        return _field(b"\x32", pairs)
    raise TypeError(f"cannot encode attribute value of type {type(value).__name__}")


_encoded_keys: dict[str, bytes] = {}


def _key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message body."""
    encoded = _encoded_keys.get(key)
    if encoded is None:
        encoded = _field(b"\x0a", key.encode("utf-8"))
        if len(key) <= _CACHED_KEY_LENGTH:
            if len(_encoded_keys) >= _CACHE_LIMIT:
                _encoded_keys.clear()
            _encoded_keys[key] = encoded
    return encoded + _field(b"\x12", _any_value(value))


# Whole encoded attributes (tag, length, ``KeyValue``) by (tag, key, type, value), for
# the short strings, ints and bools that repeat from span to span (method, route,
# status, model, addresses); the type is part of the key because ``1 == True == 1.0``.
_encoded_attributes: dict[tuple[bytes, str, type, object], bytes] = {}
# For a float only the value changes: everything before its eight bytes, by (tag, key).
_float_prefixes: dict[tuple[bytes, str], bytes] = {}


def _attribute(tag: bytes, key: str, value: Any) -> bytes:
    """One attribute field: ``tag``, length and ``KeyValue``; the common cases cached."""
    kind = type(value)
    if type(key) is not str or len(key) > _CACHED_KEY_LENGTH:
        return _field(tag, _key_value(key, value))
    if kind is float:
        prefix = _float_prefixes.get((tag, key))
        if prefix is None:
            encoded_key = _field(b"\x0a", key.encode("utf-8"))
            # KeyValue: the key, then field 2 (AnyValue, 9 bytes: 0x21 and a double)
            prefix = tag + _varint(len(encoded_key) + 11) + encoded_key + b"\x12\x09\x21"
            if len(_float_prefixes) >= _CACHE_LIMIT:
                _float_prefixes.clear()
            _float_prefixes[(tag, key)] = prefix
        return prefix + _DOUBLE.pack(value)
    if kind is int or kind is bool or (kind is str and len(value) <= _CACHED_STRING_LENGTH):
        pair = (tag, key, kind, value)
        encoded = _encoded_attributes.get(pair)
        if encoded is None:
            encoded = _field(tag, _key_value(key, value))
            if len(_encoded_attributes) >= _CACHE_LIMIT:
                _encoded_attributes.clear()  # unique values (batch ids) must not pile up
            _encoded_attributes[pair] = encoded
        return encoded
    return _field(tag, _key_value(key, value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    try:
        return b"".join([_attribute(tag, k, v) for k, v in attributes.items()])
    except Exception:
        return _each_attribute(tag, attributes)


def _each_attribute(tag: bytes, attributes: Mapping[str, Any]) -> bytes:
    """The attributes one by one, leaving out (and counting) each that cannot be
    encoded, as the SDK's encoder leaves it out: one value must not cost the export."""
    parts = []
    for key, value in attributes.items():
        try:
            parts.append(_attribute(tag, key, value))
        except Exception as exc:
            stats.record_failure("span_attribute_unencodable", exc)
    return b"".join(parts)


def _flags(context: SpanContext | None) -> int:
    return (
        _HAS_IS_REMOTE | _IS_REMOTE if context is not None and context.is_remote else _HAS_IS_REMOTE
    )


def _trace_state(context: SpanContext) -> bytes:
    state = context.trace_state
    if not state:
        return b""
    return _field(b"\x1a", _text(",".join(f"{k}={v}" for k, v in state.items())))


def _count(tag: bytes, value: int) -> bytes:
    return tag + _varint(value) if value else b""


def _name(tag: bytes, name: str) -> bytes:
    """A string field, left out when empty (proto3 writes no default)."""
    return _field(tag, _text(name)) if name else b""


def _time(tag: bytes, nanoseconds: int | None) -> bytes:
    """A fixed64 time field, left out when zero or unset (proto3 writes no default)."""
    return tag + _FIXED64.pack(nanoseconds) if nanoseconds else b""


def encode_span(span: ReadableSpan) -> bytes:
    """A ``Span`` message body."""
    context = span.context
    assert context is not None
    parent = span.parent
    status = span.status
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
        _trace_state(context),
        b"\x22\x08" + parent.span_id.to_bytes(8, "big") if parent is not None else b"",
        _name(b"\x2a", span.name),
        b"\x30" + _SMALL_VARINTS[span.kind.value + 1],
        _time(b"\x39", span.start_time),
        _time(b"\x41", span.end_time),
        _attributes(b"\x4a", span.attributes),
        _count(b"\x50", span.dropped_attributes),
    ]
    for event in span.events:
        body = (
            _time(b"\x09", event.timestamp)
            + _name(b"\x12", event.name)
            + _attributes(b"\x1a", event.attributes)
            + _count(b"\x20", event.dropped_attributes)
        )
        parts.append(_field(b"\x5a", body))
    parts.append(_count(b"\x60", span.dropped_events))
    for link in span.links:
        body = (
            b"\x0a\x10"
            + link.context.trace_id.to_bytes(16, "big")
            + b"\x12\x08"
            + link.context.span_id.to_bytes(8, "big")
            + _attributes(b"\x22", link.attributes)
            + _count(b"\x28", link.dropped_attributes)
            + b"\x35"
            + _FIXED32.pack(_flags(link.context))
        )
        parts.append(_field(b"\x6a", body))
    parts.append(_count(b"\x70", span.dropped_links))
    message = _text(status.description) if status.description else b""
    code = status.status_code.value
    status_body = (_field(b"\x12", message) if message else b"") + (
        b"\x18" + _SMALL_VARINTS[code] if code else b""
    )
    parts.append(_field(b"\x7a", status_body))
    parts.append(b"\x85\x01" + _FIXED32.pack(_flags(parent)))
    return b"".join(parts)


_encoded_headers: dict[tuple[int, int], tuple[object, object, bytes, bytes]] = {}


def _resource_and_scope(span: ReadableSpan) -> tuple[bytes, bytes]:
    """Encoded ``Resource`` and ``InstrumentationScope`` bodies, cached by identity."""
    resource, scope = span.resource, span.instrumentation_scope
    key = (id(resource), id(scope))
    cached = _encoded_headers.get(key)
    if cached is not None and cached[0] is resource and cached[1] is scope:
        return cached[2], cached[3]
    encoded_resource = _attributes(b"\x0a", resource.attributes)
    encoded_scope = b""
    if scope is not None:
        encoded_scope = (
            _name(b"\x0a", scope.name)
            + _name(b"\x12", scope.version or "")
            + _attributes(b"\x1a", scope.attributes)
        )
    if len(_encoded_headers) >= _CACHE_LIMIT:
        _encoded_headers.clear()
    _encoded_headers[key] = (resource, scope, encoded_resource, encoded_scope)
    return encoded_resource, encoded_scope


def encode_export_request(spans: Sequence[ReadableSpan]) -> bytes:
    """Serialise spans as an ``ExportTraceServiceRequest``, grouped by resource (its
    attributes and schema URL) and scope."""
    groups: dict[tuple[bytes, str], dict[tuple[bytes, str | None], list[bytes]]] = {}
    for span in spans:
        resource, scope = _resource_and_scope(span)
        scope_schema = span.instrumentation_scope.schema_url if span.instrumentation_scope else None
        groups.setdefault((resource, span.resource.schema_url), {}).setdefault(
            (scope, scope_schema), []
        ).append(encode_span(span))
    out = []
    for (resource, resource_schema), scopes in groups.items():
        scope_spans = b"".join(
            _field(
                b"\x12",
                _field(b"\x0a", scope)
                + b"".join(_field(b"\x12", s) for s in encoded)
                + _name(b"\x1a", schema or ""),
            )
            for (scope, schema), encoded in scopes.items()
        )
        body = _field(b"\x0a", resource) + scope_spans + _name(b"\x1a", resource_schema or "")
        out.append(_field(b"\x0a", body))
    return b"".join(out)
