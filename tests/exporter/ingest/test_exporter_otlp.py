"""OTLP/HTTP wire format: content types, bounded gzip, protobuf and OTLP/JSON decoding."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
from dataclasses import replace
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.ingest.otlp_counts import count_protobuf_spans
from gpuscope.exporter.ingest.pipeline import decode_within_limits
from support.exporter_fixtures import SpanFactory, encode, otlp_json
from support.otlp_cases import mutate_bytes, random_request

LIMITS = otlp.Limits(max_body_bytes=1 << 20, max_decompressed_bytes=1 << 16)


def test_media_type_accepts_both_otlp_encodings_and_refuses_others() -> None:
    assert otlp.media_type("application/x-protobuf") == otlp.PROTOBUF
    assert otlp.media_type("application/json; charset=utf-8") == otlp.JSON
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.media_type("text/plain")
    assert (caught.value.status, caught.value.reason) == (415, "unsupported_media_type")


def test_gzip_round_trip_and_limits() -> None:
    data = os.urandom(1000)
    assert otlp.decompress(gzip.compress(data), "gzip", LIMITS) == data
    assert otlp.decompress(data, None, LIMITS) == data
    bomb = gzip.compress(b"\0" * (LIMITS.max_decompressed_bytes * 64))
    assert len(bomb) < 10_000
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decompress(bomb, "gzip", LIMITS)
    assert (caught.value.status, caught.value.reason) == (413, "decompressed_too_large")
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decompress(gzip.compress(data)[:-20], "gzip", LIMITS)
    assert caught.value.reason == "invalid_gzip"
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decompress(b"not gzip at all", "gzip", LIMITS)
    assert caught.value.reason == "invalid_gzip"
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decompress(data, "br", LIMITS)
    assert (caught.value.status, caught.value.reason) == (415, "unsupported_encoding")


def test_protobuf_and_json_decode_to_the_same_request() -> None:
    spans = SpanFactory()
    request = encode([spans.server(0.01, phases={"queue": 0.001}), spans.batch(2)])
    from_protobuf = otlp.decode_request(request.SerializeToString(), otlp.PROTOBUF)
    from_json = otlp.decode_request(otlp_json(request), otlp.JSON)
    assert from_protobuf == request
    assert from_json == request


def test_json_span_with_a_non_hex_id_is_rejected_alone() -> None:
    spans = SpanFactory()
    document = json.loads(otlp_json(encode([spans.server(0.01), spans.server(0.02)])))
    document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "zz-not-hex"
    request = otlp.decode_request(json.dumps(document).encode(), otlp.JSON)
    result = SpanAggregator().ingest(request)
    assert (result.aggregated, result.rejected) == (1, {"invalid_id": 1})


@pytest.mark.parametrize(
    ("body", "media", "reason"),
    [
        (b"\xff\xff\xff\xff garbage", otlp.PROTOBUF, "invalid_protobuf"),
        (b"{not json", otlp.JSON, "invalid_json"),
        (b"[1, 2]", otlp.JSON, "invalid_json"),
        (b'{"resourceSpans": 5}', otlp.JSON, "invalid_json"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "x"}]}]}]}',
         otlp.JSON, "invalid_json"),
        (b"\xc3\x28", otlp.JSON, "invalid_json"),
    ],
)  # fmt: skip
def test_undecodable_bodies_name_their_reason(body: bytes, media: str, reason: str) -> None:
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decode_request(body, media)
    assert (caught.value.status, caught.value.reason) == (400, reason)


@pytest.mark.parametrize("value", [2**64 - 1, 2**63, 2**63 - 1, 0])
def test_a_ten_byte_varint_is_read_as_protobuf_reads_it(value: int) -> None:
    """A negative int64 or enum is ten bytes on the wire; the span scan once read a
    varint field as if a byte had gone before it and refused the tenth (found by the
    property test below under a seed that mutated such a field to a scanned level)."""
    encoded = bytearray()
    rest = value
    while rest > 0x7F:
        encoded.append(rest & 0x7F | 0x80)
        rest >>= 7
    encoded.append(rest)
    unknown_varint = bytes([15 << 3 | 0]) + bytes(encoded)  # field 15: unknown, kept
    body = entry(1, unknown_varint)  # a ResourceSpans holding only that field
    assert request_counts(ExportTraceServiceRequest.FromString(body)) == (0, 1)
    assert count_protobuf_spans(body, 10**9) == (0, 1)


def test_field_number_zero_inside_a_group_is_skipped_as_protobuf_skips_it() -> None:
    """Protobuf refuses field number 0 in a message but skips it, by wire type, inside
    an unknown group; the scan answered such a body 400 (found by fuzzing)."""
    one_span = entry(1, entry(2, entry(2, b"")))  # a resource, a scope, an empty span
    for group in ("0b00000c", "0b0d000000000c", "0b03040c", "0b02000c"):
        body = bytes.fromhex(group) + one_span
        decoded = ExportTraceServiceRequest.FromString(body)
        assert count_protobuf_spans(body, 10**9) == request_counts(decoded) == (1, 2)


def test_groups_nested_deeper_than_protobuf_decodes_are_refused_at_once() -> None:
    """Protobuf decodes groups nested 100 deep and refuses 101; the scan follows them
    up to there, not through megabytes of nesting (a 20 KB gzip body of 20 MiB of
    nested groups held the ingest thread for 5 s, by the fuzzing's measurement)."""
    accepted = b"\x0b" * 100 + b"\x0c" * 100
    assert count_protobuf_spans(accepted, 10**9) == request_counts(
        ExportTraceServiceRequest.FromString(accepted)
    )
    refused = b"\x0b" * 101 + b"\x0c" * 101
    with pytest.raises(DecodeError):
        ExportTraceServiceRequest.FromString(refused)
    with pytest.raises(otlp.OtlpError) as caught:
        count_protobuf_spans(b"\x0b" * 1_000_000 + b"\x0c" * 1_000_000, 10**9)
    assert caught.value.reason == "invalid_protobuf"


def test_fields_beyond_what_the_caps_allow_are_refused() -> None:
    """A request within the caps reads at most four fields per span the cap allows
    (plus a margin); more, unknown fields protobuf would skip for free, is junk that
    costs the walk ~0.25 µs a byte, refused as soon as it passes that."""
    limit = 40
    scope = entry(1, b"\x0a\x01s") + entry(2, b"") + entry(3, b"u")  # scope, span, schema
    resource = entry(1, b"") + entry(2, scope) + entry(3, b"u")  # resource, scope, schema
    at_the_caps = entry(1, resource) * (limit // 2)  # 20 spans in 40 groups
    assert count_protobuf_spans(at_the_caps, limit) == (limit // 2, limit)
    junk = b"\x20\x00" * (4 * limit + 1024 + 1)  # field 4: unknown, a varint
    assert request_counts(ExportTraceServiceRequest.FromString(junk)) == (0, 0)
    with pytest.raises(otlp.OtlpError) as caught:
        count_protobuf_spans(junk, limit)
    assert (caught.value.status, caught.value.reason) == (413, "too_many_spans")
    in_a_group = b"\x0b" + junk + b"\x0c"
    with pytest.raises(otlp.OtlpError) as caught:
        count_protobuf_spans(in_a_group, limit)
    assert (caught.value.status, caught.value.reason) == (413, "too_many_spans")


def test_truncated_protobuf_is_refused() -> None:
    spans = SpanFactory()
    data = encode([spans.server(0.01) for _ in range(5)]).SerializeToString()
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decode_request(data[: len(data) // 2 + 3], otlp.PROTOBUF)
    assert caught.value.reason == "invalid_protobuf"


def test_response_carries_partial_success_only_when_spans_were_rejected() -> None:
    full = ExportTraceServiceResponse.FromString(otlp.encode_response(otlp.PROTOBUF, 0, ""))
    assert not full.HasField("partial_success")
    partial = ExportTraceServiceResponse.FromString(
        otlp.encode_response(otlp.PROTOBUF, 3, "rejected 3")
    )
    assert (partial.partial_success.rejected_spans, partial.partial_success.error_message) == (
        3,
        "rejected 3",
    )
    as_json = json.loads(otlp.encode_response(otlp.JSON, 2, "why"))
    assert as_json == {"partialSuccess": {"rejectedSpans": "2", "errorMessage": "why"}}


def test_error_body_is_a_google_rpc_status() -> None:
    status = Status.FromString(otlp.encode_status(otlp.PROTOBUF, 400, "bad body"))
    assert (status.code, status.message) == (3, "bad body")
    assert json.loads(otlp.encode_status(otlp.JSON, 413, "too big")) == {
        "code": 8,
        "message": "too big",
    }


def request_counts(request: Any) -> tuple[int, int]:
    spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    groups = sum(1 + len(r.scope_spans) for r in request.resource_spans)
    return spans, groups


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False))
def test_the_span_scan_counts_what_protobuf_decodes_and_refuses_nothing_it_accepts(
    rng: random.Random,
) -> None:
    """The scan walks the wire format by hand: on valid and mutated bodies (groups and
    unknown fields included), whatever protobuf decodes, the scan counts alike."""
    rng = random.Random(rng.getrandbits(64))  # one draw from Hypothesis, cheap ones after
    for _ in range(20):
        body = random_request(rng).SerializeToString()
        if rng.random() < 0.8:
            body = mutate_bytes(rng, body)
        if rng.random() < 0.1:  # an unknown field holding a group, which protobuf skips
            body += bytes([15 << 3 | 3]) + entry(1, b"x") + bytes([15 << 3 | 4])
        try:
            decoded = ExportTraceServiceRequest.FromString(body)
        except DecodeError:
            with contextlib.suppress(otlp.OtlpError):  # refusing it too is fine
                count_protobuf_spans(body, 10**9)
            continue
        assert count_protobuf_spans(body, 10**9) == request_counts(decoded)


def entry(field: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([field << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize("media", [otlp.PROTOBUF, otlp.JSON])
def test_the_caps_refuse_one_span_or_attribute_too_many(media: str) -> None:
    spans = SpanFactory()
    request = encode([spans.server(0.01) for _ in range(3)])  # 5 attributes each, +1 resource
    body = request.SerializeToString() if media == otlp.PROTOBUF else otlp_json(request)
    attributes = 3 * 5 + len(request.resource_spans[0].resource.attributes)
    exact = otlp.Limits(1 << 20, 1 << 20, max_spans=3, max_attributes=attributes)
    assert request_counts(decode_within_limits(body, media, exact))[0] == 3
    for limits, reason in (
        (replace(exact, max_spans=2), "too_many_spans"),
        (replace(exact, max_attributes=attributes - 1), "too_many_attributes"),
    ):
        with pytest.raises(otlp.OtlpError) as refused:
            decode_within_limits(body, media, limits)
        assert (refused.value.status, refused.value.reason) == (413, reason)


@pytest.mark.parametrize(
    "body",
    [
        b'{"resourceSpans": [' + b"[]," * 10 + b"[]]}",  # counted in the bytes, not parsed
        b'{"resourceSpans": [], "x": "' + b"a" * 5 + b'", "y": [1, 2, 3, 4, 5, 6, 7, 8]}',
    ],
)
def test_the_json_value_cap_refuses_past_it_before_the_mapping(body: bytes) -> None:
    with pytest.raises(otlp.OtlpError) as refused:
        otlp.load_json(body, max_values=10)
    assert (refused.value.status, refused.value.reason) == (413, "too_many_json_values")
    assert otlp.load_json(body, max_values=100)  # and under it, the document


def test_a_field_under_both_its_names_is_read_as_protobuf_reads_it() -> None:
    """Receivers accept ``resourceSpans`` and ``resource_spans``; protobuf's JSON mapping
    takes whichever comes last in the object. The caps read the first one present, so
    ``{"resourceSpans": [], "resource_spans": [50 spans]}`` passed a cap of 10."""
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331"}
    many = [{"scopeSpans": [{"spans": [span] * 50}]}]
    limits = otlp.Limits(1 << 20, 1 << 20, max_spans=10, max_attributes=10)
    for document in (
        {"resourceSpans": [], "resource_spans": many},
        {"resourceSpans": [{"scopeSpans": [], "scope_spans": many[0]["scopeSpans"]}]},
    ):
        with pytest.raises(otlp.OtlpError) as refused:
            decode_within_limits(json.dumps(document).encode(), otlp.JSON, limits)
        assert (refused.value.status, refused.value.reason) == (413, "too_many_spans")
    # the other order: protobuf keeps the empty list, and so do the caps and the ids
    document = {"resource_spans": many, "resourceSpans": []}
    request = decode_within_limits(json.dumps(document).encode(), otlp.JSON, limits)
    assert request_counts(request) == (0, 0)
    one = {"resourceSpans": [], "resource_spans": [{"scopeSpans": [{"spans": [span]}]}]}
    request = decode_within_limits(json.dumps(one).encode(), otlp.JSON, limits)
    decoded = request.resource_spans[0].scope_spans[0].spans[0]
    assert decoded.trace_id.hex() == span["traceId"]  # hex, converted under that name too


@pytest.mark.parametrize(("kind", "deepest"), [("array", 47), ("kvlist", 31)])
def test_json_takes_attribute_values_as_deep_as_protobuf_does(kind: str, deepest: int) -> None:
    """An AnyValue array nests 3 JSON levels for 2 messages, a kvlist 4 for 3: a JSON
    depth cap of 64 refused from 18 and 14 levels what protobuf decodes up to 47 and 31
    (a 400, so the whole batch was lost); now both encodings agree at every depth."""
    limits = otlp.Limits(1 << 20, 1 << 20)
    for depth in (deepest, deepest + 1):
        value = AnyValue(string_value="leaf")
        for _ in range(depth):
            outer = AnyValue()
            if kind == "array":
                outer.array_value.values.add().CopyFrom(value)
            else:
                pair = outer.kvlist_value.values.add()
                pair.key = "k"
                pair.value.CopyFrom(value)
            value = outer
        request = encode([SpanFactory().server(0.01)])
        attribute = request.resource_spans[0].scope_spans[0].spans[0].attributes.add()
        attribute.key = "nested"
        attribute.value.CopyFrom(value)
        answers = []
        bodies = [(request.SerializeToString(), otlp.PROTOBUF), (otlp_json(request), otlp.JSON)]
        for body, media in bodies:
            try:
                decode_within_limits(body, media, limits)
                answers.append("decoded")
            except otlp.OtlpError as refused:
                answers.append(f"{refused.status}")
        assert answers[0] == answers[1] == ("decoded" if depth == deepest else "400"), depth
