"""How many spans and attributes an OTLP export request holds, known before it costs much.

Decoding is where a small request becomes large: protobuf allocates each message at
once, about 90 bytes for a 2-byte empty span (a 64 KB gzip body of 62.9 MiB of empty
spans took 5.7 GiB), and aggregation then walks every span on Python's side (a
3 KB gzip body of a million empty OTLP/JSON spans held the exporter for 10-37 s). So
the spans are counted before the request is decoded:

- protobuf: the wire format is walked three levels deep (resource spans, scope spans,
  spans) without decoding anything, stopping as soon as the cap is passed. An entry
  takes at least 2 bytes, so a body of at most twice the cap cannot pass it and is not
  walked at all: the OpenTelemetry SDK's requests (512 spans, ~140 KB) never are.
- OTLP/JSON: the lists of the parsed document are counted before protobuf's JSON
  mapping (pure Python, ~10 µs a field) turns them into messages.

Attributes (of spans and resources, the ones aggregation reads) are counted after the
protobuf decode, only when the body is large enough to hold more than the cap, and in
the JSON document before its mapping. The counting functions raise ``OtlpError`` 413
with the reason of ``gpuscope_otlp_requests_rejected_total``.
"""

from __future__ import annotations

from typing import Any, Final

from gpuscope.exporter.ingest.otlp import (
    INVALID_PROTOBUF,
    TOO_MANY_ATTRIBUTES,
    TOO_MANY_SPANS,
    OtlpError,
    json_field,
)

# The fields walked: ExportTraceServiceRequest.resource_spans, ResourceSpans.scope_spans,
# ScopeSpans.spans; all length-delimited (wire type 2).
_RESOURCE_SPANS, _SCOPE_SPANS, _SPANS = 1, 2, 2
_MIN_ENTRY_BYTES: Final = 2  # tag and length of an empty message
# Fields the walk may read per span the cap allows: a request within the caps has at most
# ``limit`` spans and ``limit`` resource and scope groups, and beside each group's list
# two fields of its own (the resource or scope, the schema URL). More is junk that costs
# ~0.25 µs a byte to walk (20 MiB of tiny unknown fields: 2-4 s of the ingest thread,
# from a 20 KB gzip body), so past it the request is refused before it is walked whole.
_FIELDS_PER_SPAN: Final = 4
_SPARE_FIELDS: Final = 1024  # unknown fields a newer sender may add at each level
# Protobuf refuses messages and groups nested deeper than this (its recursion limit).
_MAX_DEPTH: Final = 100


class _Walk:
    """How many more fields the walk of one request may read."""

    __slots__ = ("fields_left",)

    def __init__(self, limit: int) -> None:
        self.fields_left = _FIELDS_PER_SPAN * limit + _SPARE_FIELDS

    def spend(self, fields: int) -> None:
        self.fields_left -= fields
        if self.fields_left < 0:
            raise OtlpError(
                413,
                TOO_MANY_SPANS,
                "the request holds more fields where its spans are listed than its spans"
                " and groups can need; send fewer",
            )


def check_protobuf_spans(data: bytes, max_spans: int) -> None:
    """413 if ``data`` holds more than ``max_spans`` spans, or more resource and scope
    groups together than that; 400 if its first three levels are not protobuf."""
    if len(data) > _MIN_ENTRY_BYTES * max_spans:  # else too small to hold more
        _check_spans(*count_protobuf_spans(data, max_spans), max_spans)


def count_protobuf_spans(data: bytes, limit: int) -> tuple[int, int]:
    """``(spans, resource and scope groups)`` in ``data``, counted up to just past
    ``limit``; 400 if its first three levels are not protobuf."""
    spans = groups = 0
    walk = _Walk(limit)
    for resource_start, resource_end in _entries(data, 0, len(data), _RESOURCE_SPANS, limit, walk):
        groups += 1
        for scope_start, scope_end in _entries(
            data, resource_start, resource_end, _SCOPE_SPANS, limit, walk
        ):
            groups += 1
            spans += len(_entries(data, scope_start, scope_end, _SPANS, limit - spans, walk))
            if spans > limit or groups > limit:
                return spans, groups
    return spans, groups


def check_parsed_attributes(request: Any, size: int, max_attributes: int) -> None:
    """413 if the decoded ``request`` (``size`` bytes of protobuf) holds more than
    ``max_attributes`` span and resource attributes."""
    if size <= _MIN_ENTRY_BYTES * max_attributes:
        return  # too small to hold more
    attributes = 0
    for resource_spans in request.resource_spans:
        attributes += len(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes += len(span.attributes)
            _check_attributes(attributes, max_attributes)
    _check_attributes(attributes, max_attributes)


def check_json_counts(document: dict[str, Any], max_spans: int, max_attributes: int) -> None:
    """The caps on an OTLP/JSON document (either key spelling), spans first as for
    protobuf; values of the wrong type count as nothing here and are refused by the
    JSON mapping after."""
    spans = groups = 0
    scopes = []
    for resource_spans in _json_list(document, "resourceSpans", "resource_spans"):
        groups += 1
        for scope_spans in _json_list(resource_spans, "scopeSpans", "scope_spans"):
            groups += 1
            span_list = _json_list(scope_spans, "spans")
            spans += len(span_list)
            _check_spans(spans, groups, max_spans)
            scopes.append(span_list)
    _check_spans(spans, groups, max_spans)
    attributes = 0
    for resource_spans in _json_list(document, "resourceSpans", "resource_spans"):
        resource = _json_dict(resource_spans, "resource")
        attributes += len(_json_list(resource, "attributes"))
    for span_list in scopes:
        for span in span_list:
            attributes += len(_json_list(span, "attributes"))
        _check_attributes(attributes, max_attributes)
    _check_attributes(attributes, max_attributes)


def _check_spans(spans: int, groups: int, max_spans: int) -> None:
    if spans > max_spans:
        raise OtlpError(
            413, TOO_MANY_SPANS, f"the request holds more than {max_spans} spans; send fewer"
        )
    if groups > max_spans:
        raise OtlpError(
            413,
            TOO_MANY_SPANS,
            f"the request holds more than {max_spans} resource and scope groups",
        )


def _check_attributes(attributes: int, max_attributes: int) -> None:
    if attributes > max_attributes:
        raise OtlpError(
            413,
            TOO_MANY_ATTRIBUTES,
            f"the request holds more than {max_attributes} span and resource attributes",
        )


def _json_list(container: Any, *keys: str) -> list[Any]:
    value = json_field(container, *keys) if isinstance(container, dict) else None
    return value if isinstance(value, list) else []


def _json_dict(container: Any, key: str) -> Any:
    return json_field(container, key) if isinstance(container, dict) else None


def _entries(
    data: bytes, pos: int, end: int, field: int, limit: int, walk: _Walk
) -> list[tuple[int, int]]:
    """``(start, end)`` of each length-delimited ``field`` in ``data[pos:end]``, the
    other fields skipped by wire type; stops once more than ``limit`` are found. Every
    field read is spent from ``walk``.

    Written for speed: a 512-span request takes ~0.25 µs a span, against ~3 µs to
    decode and aggregate it."""
    found: list[tuple[int, int]] = []
    wanted = field << 3 | 2
    read = 0
    while pos < end:
        read += 1
        if read & 0xFFF == 0:  # every 4,096 fields: cheap enough for the loop
            walk.spend(0x1000)
        tag = data[pos]
        pos += 1
        if tag & 0x80:
            tag, pos = _varint(data, pos, end, tag)
        if tag < 8:
            raise _malformed("field number 0")
        kind = tag & 7
        if kind == 2:
            if pos >= end:
                raise _malformed("truncated length")
            size = data[pos]
            pos += 1
            if size & 0x80:
                size, pos = _varint(data, pos, end, size)
            stop = pos + size
            if stop > end:
                raise _malformed("length past the end of its message")
            if tag == wanted:
                found.append((pos, stop))
                if len(found) > limit:
                    walk.spend(read & 0xFFF)
                    return found
            pos = stop
        elif kind == 0:  # up to ten bytes: a negative int64 or enum takes all ten
            _, pos = _read_varint(data, pos, end)
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        elif kind == 3:  # a group (deprecated): protobuf keeps it as an unknown field
            pos = _skip_group(data, pos, end, tag >> 3, walk)
        else:
            raise _malformed(f"wire type {kind}")
    if pos > end:
        raise _malformed("fixed-size field past the end of its message")
    walk.spend(read & 0xFFF)
    return found


def _skip_group(data: bytes, pos: int, end: int, field: int, walk: _Walk) -> int:
    """The position after the group of ``field`` whose content starts at ``pos``
    (nested groups followed without recursion, no deeper than protobuf decodes them).
    Inside a group protobuf skips fields by wire type alone, field number 0 included."""
    closing = [field << 3 | 4]
    read = 0
    while pos < end:
        read += 1
        if read & 0xFFF == 0:
            walk.spend(0x1000)
        tag, pos = _read_varint(data, pos, end)
        kind = tag & 7
        if tag == closing[-1]:
            closing.pop()
            if not closing:
                walk.spend(read & 0xFFF)
                return pos
        elif kind in (4, 6, 7):
            raise _malformed("bad tag in a group")
        elif kind == 0:
            pos = _read_varint(data, pos, end)[1]
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        elif kind == 2:
            size, pos = _read_varint(data, pos, end)
            pos += size
        else:
            closing.append((tag >> 3) << 3 | 4)
            if len(closing) > _MAX_DEPTH:
                raise _malformed(f"groups nested deeper than {_MAX_DEPTH}")
    raise _malformed("unterminated group")


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        raise _malformed("truncated varint")
    first = data[pos]
    return _varint(data, pos + 1, end, first) if first & 0x80 else (first, pos + 1)


def _varint(data: bytes, pos: int, end: int, first: int) -> tuple[int, int]:
    """The varint whose first byte (continuation bit set) was ``first``; ``pos`` is
    just after that byte."""
    value, shift = first & 0x7F, 7
    while True:
        if pos >= end or shift > 63:
            raise _malformed("truncated or over-long varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _malformed(what: str) -> OtlpError:
    return OtlpError(400, INVALID_PROTOBUF, f"body is not an OTLP protobuf: {what}")
