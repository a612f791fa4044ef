"""Hostile OTLP export requests for fuzzing the decode + aggregation path.

Every case comes from a ``random.Random``: the property-based test draws one from
Hypothesis (``st.randoms()``), ``benchmarks/otlp_fuzz.py`` seeds one and runs 100,000+.
A case starts as a valid request in the span contract (with some attributes of the
wrong type or out of range), then is sent as is or mutated: protobuf bytes flipped,
cut or spliced; JSON values swapped for tokens that break parsers (5,000-digit
integers, 1e400, NaN, lone surrogates, deep nesting, wrong types); gzip cut short.

``check_case`` runs one case through the exporter's decoding (``otlp.decompress``,
``ingest.decode_within_limits``: the span and attribute caps, then ``otlp``'s decoders)
and ``SpanAggregator.ingest`` and returns what happened; anything it raises is a defect.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import random
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gpuscope import spans as contract
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.aggregator import SPAN_REJECT_REASONS, SpanAggregator
from gpuscope.exporter.ingest.pipeline import decode_within_limits
from support.exporter_fixtures import loopback_config

# Caps small enough that the random requests (0-12 spans, up to ~90 attributes) pass
# them now and then: the span scan and the attribute count are fuzzed too. An exporter
# fed these cases is configured alike (``capped_config``).
LIMITS = otlp.Limits(
    max_body_bytes=8 << 20,
    max_decompressed_bytes=8 << 20,
    max_spans=8,
    max_attributes=60,
    # never reached by these cases, so protobuf and JSON of one request fare alike
    max_json_values=100_000,
)


def capped_config() -> ExporterConfig:
    """A loopback exporter's configuration that applies ``LIMITS``."""
    return loopback_config(
        max_body_bytes=LIMITS.max_body_bytes,
        max_decompressed_bytes=LIMITS.max_decompressed_bytes,
        max_spans_per_request=LIMITS.max_spans,
        max_attributes_per_request=LIMITS.max_attributes,
        max_json_values_per_request=LIMITS.max_json_values,
    )


_STRING_KEYS = (
    contract.HTTP_ROUTE,
    contract.GEN_AI_REQUEST_MODEL,
    contract.GPU_UUID,
    contract.SERVICE_NAME,
)
_INT_KEYS = (
    contract.HTTP_RESPONSE_STATUS_CODE,
    contract.GEN_AI_USAGE_INPUT_TOKENS,
    contract.GEN_AI_USAGE_OUTPUT_TOKENS,
    contract.BATCH_SIZE,
    contract.BATCH_MAX_SIZE,
)
_DOUBLE_KEYS = (
    *contract.PHASE_DURATION.values(),
    contract.TIME_TO_FIRST_TOKEN,
    contract.TIME_PER_OUTPUT_TOKEN,
)
# Durations at the edges: non-finite, negative, the largest floats (two of 1.7e308 made
# a _sum +Inf once), the accepted bound of a day and just past it, the tiniest.
_ODD_DOUBLES = (
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    -1.0,
    1e308,
    1.7e308,
    contract.MAX_DURATION_S,
    contract.MAX_DURATION_S + 0.5,
    2.0**53,
    5e-324,
)
_ODD_INTS = (0, -1, 2**63 - 1, -(2**63), 99, 600)
_ODD_STRINGS = ("", "x" * 300, "tab\there", "new\nline", "é" * 40, "\u2028", "/v1/{id}")

# JSON tokens, written into the text raw: most of them JSON itself cannot round-trip.
HOSTILE_JSON_TOKENS = (
    "9" * 5000,
    "-" + "9" * 4400,
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    '"\\ud800"',
    '"\\udfff tail"',
    "[" * 300 + "]" * 300,
    '{"a":' * 100 + "1" + "}" * 100,
    "18446744073709551616",
    "-9223372036854775809",
    "1.5",
    "null",
    "true",
    '""',
    "{}",
    "[]",
    '"zz-not-hex"',
    '"AAAA"',
)
_HOSTILE_KEYS = ('"\\ud800"', '"\\udc80x"', '""', '"kind"', '"spans"')


@dataclass(frozen=True)
class Case:
    body: bytes
    media: str
    encoding: str | None
    kind: str  # how it was made, for reports
    # What an unmutated request holds, so that the caps' verdict can be checked exactly:
    # (spans, resource and scope groups, span and resource attributes).
    counts: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class Outcome:
    """``rejected_reason`` when the whole request was refused, else span counts."""

    rejected_reason: str | None = None
    status: int = 200
    received: int = 0
    aggregated: int = 0
    spans_rejected: int = 0


def random_request(rng: random.Random) -> Any:
    request = ExportTraceServiceRequest()
    for _ in range(rng.randint(1, 3)):
        resource_spans = request.resource_spans.add()
        resource_spans.resource.attributes.append(
            _kv("service.name", _any_value(rng, "string_value"))
        )
        scope_spans = resource_spans.scope_spans.add()
        if rng.random() < 0.8:  # gpuscope's own spans: phases, TTFT, TPOT, batches
            scope_spans.scope.name = contract.INSTRUMENTATION_NAME
        for _ in range(rng.randint(0, 4)):
            scope_spans.spans.append(_random_span(rng))
    return request


def _random_span(rng: random.Random) -> Any:
    span = Span(
        trace_id=rng.randbytes(16 if rng.random() < 0.95 else rng.choice((15, 0))),
        span_id=rng.randbytes(8 if rng.random() < 0.95 else 9),
        name=rng.choice(("POST /v1/completions", contract.BATCH_SPAN_NAME, "gpuscope.queue")),
    )
    # an unknown enum value (7) is legal on the wire and must be skipped, not fail
    kinds: tuple[Any, ...] = (Span.SPAN_KIND_SERVER, Span.SPAN_KIND_INTERNAL, 7)
    span.kind = rng.choice(kinds)
    start = 1_700_000_000_000_000_000 if rng.random() < 0.95 else rng.choice((0, 2**64 - 1))
    span.start_time_unix_nano = start
    span.end_time_unix_nano = min(2**64 - 1, start + rng.choice((0, 1, 10**7, 10**12)))
    if rng.random() < 0.03:
        span.end_time_unix_nano = max(0, start - 1)
    for key in rng.sample((*_STRING_KEYS, *_INT_KEYS, *_DOUBLE_KEYS), rng.randint(0, 12)):
        expected = (
            "string_value" if key in _STRING_KEYS else "int_value" if key in _INT_KEYS else None
        )
        kind = expected or "double_value"
        if rng.random() < 0.02:  # the wrong type now and then
            kind = rng.choice(("string_value", "int_value", "double_value", "bool_value"))
        span.attributes.append(_kv(key, _any_value(rng, kind)))
    return span


def _kv(key: str, value: Any) -> Any:
    return KeyValue(key=key, value=value)


def _any_value(rng: random.Random, kind: str) -> Any:
    odd = rng.random() < 0.05
    if kind == "string_value":
        text = rng.choice(_ODD_STRINGS) if odd else rng.choice(("m1", "/v1/chat", "GPU-a"))
        return AnyValue(string_value=text)
    if kind == "int_value":
        return AnyValue(int_value=rng.choice(_ODD_INTS) if odd else rng.randint(1, 600))
    if kind == "double_value":
        return AnyValue(double_value=rng.choice(_ODD_DOUBLES) if odd else rng.random())
    return AnyValue(bool_value=rng.random() < 0.5)


def bulk_request(rng: random.Random) -> Any:
    """A request around the span cap: just under, at or over it, or far over; of empty
    spans, spans in the contract, or empty resource groups; over one to three groups."""
    cap = LIMITS.max_spans
    count = rng.choice((cap - 1, cap, cap + 1, 2 * cap, rng.randint(0, 4 * cap)))
    request = ExportTraceServiceRequest()
    shape = rng.randrange(3)
    if shape == 2:  # the spans' worth of empty resource groups, no span at all
        for _ in range(count):
            request.resource_spans.add()
        return request
    scopes = [request.resource_spans.add().scope_spans.add() for _ in range(rng.randint(1, 3))]
    for number in range(count):
        scopes[number % len(scopes)].spans.append(Span() if shape == 0 else _random_span(rng))
    return request


def counts_of(request: Any) -> tuple[int, int, int]:
    """(spans, resource and scope groups, span and resource attributes) of ``request``."""
    spans = groups = attributes = 0
    for resource_spans in request.resource_spans:
        groups += 1 + len(resource_spans.scope_spans)
        attributes += len(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            spans += len(scope_spans.spans)
            attributes += sum(len(span.attributes) for span in scope_spans.spans)
    return spans, groups, attributes


def random_case(rng: random.Random) -> Case:
    """One request, valid or mutated, as protobuf or JSON, sometimes gzipped; one in ten
    a valid request around the span cap (``bulk_request``)."""
    if rng.random() < 0.1:
        request = bulk_request(rng)
        body, media = (
            (request.SerializeToString(), otlp.PROTOBUF)
            if rng.random() < 0.5
            else (json_text(request).encode(), otlp.JSON)
        )
        encoding = None
        if rng.random() < 0.3:
            body, encoding = gzip.compress(body, compresslevel=1), "gzip"
        return Case(body, media, encoding, f"bulk-{media.rsplit('/', 1)[1]}", counts_of(request))
    request = random_request(rng)
    roll = rng.random()
    if roll < 0.3:
        case = Case(mutate_bytes(rng, request.SerializeToString()), otlp.PROTOBUF, None, "pb")
    elif roll < 0.4:
        case = Case(request.SerializeToString(), otlp.PROTOBUF, None, "pb-valid")
    elif roll < 0.75:
        case = Case(_hostile_json(rng, request), otlp.JSON, None, "json-tokens")
    elif roll < 0.85:
        text = json_text(request).encode()
        case = Case(mutate_bytes(rng, text), otlp.JSON, None, "json-bytes")
    else:
        case = Case(json_text(request).encode(), otlp.JSON, None, "json-valid")
    if rng.random() < 0.1:
        packed = gzip.compress(case.body, compresslevel=1)
        if rng.random() < 0.3:
            packed = packed[: rng.randint(0, len(packed))]
        case = Case(packed, case.media, "gzip", case.kind + "+gzip")
    return case


def json_text(request: Any) -> str:
    """OTLP/JSON as SDKs write it: camelCase keys, hex ids."""
    document = json_format.MessageToDict(request)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId"):
                    if key in span:
                        span[key] = _b64_to_hex(span[key])
    return json.dumps(document)


def _b64_to_hex(text: str) -> str:
    return base64.b64decode(text).hex()


def _hostile_json(rng: random.Random, request: Any) -> bytes:
    """The request's JSON with some values (and maybe a key) swapped for hostile tokens."""
    document = json.loads(json_text(request))
    slots = list(_slots(document))
    raw: dict[str, str] = {}
    for number in range(rng.randint(1, 3)):
        if not slots:
            break
        container, key = rng.choice(slots)
        if isinstance(container, dict) and key not in container:
            continue  # renamed by an earlier swap
        marker = f"@@RAW{number}@@"
        raw[json.dumps(marker)] = rng.choice(HOSTILE_JSON_TOKENS)
        if isinstance(container, dict) and rng.random() < 0.2:
            container[marker] = container.pop(key)
            raw[json.dumps(marker)] = rng.choice(_HOSTILE_KEYS)
        else:
            container[key] = marker
    text = json.dumps(document)
    for marker, token in raw.items():
        text = text.replace(marker, token)
    return text.encode("utf-8", "surrogatepass")


def _slots(node: Any) -> Any:
    """Every (container, key or index) in a JSON document."""
    if isinstance(node, dict):
        for key, value in list(node.items()):
            yield node, key
            yield from _slots(value)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield node, index
            yield from _slots(value)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        operation = rng.randrange(5)
        position = rng.randint(0, len(buffer))
        if operation == 0 and buffer:  # flip a byte
            index = min(position, len(buffer) - 1)
            buffer[index] ^= 1 << rng.randrange(8)
        elif operation == 1:  # insert noise
            buffer[position:position] = rng.randbytes(rng.randint(1, 8))
        elif operation == 2:  # delete a run
            del buffer[position : position + rng.randint(1, 16)]
        elif operation == 3:  # cut short
            del buffer[position:]
        else:  # repeat a slice
            buffer[position:position] = buffer[position : position + rng.randint(1, 64)]
    return bytes(buffer)


def check_case(aggregator: SpanAggregator, case: Case) -> Outcome:
    """Decode and aggregate ``case``; asserts the invariants that hold for any input,
    and for a case whose counts are known, that the caps refused it exactly when they
    had to (spans and groups first, then attributes)."""
    try:
        data = otlp.decompress(case.body, case.encoding, LIMITS)
        request = decode_within_limits(data, case.media, LIMITS)
    except otlp.OtlpError as exc:
        refused = Outcome(rejected_reason=exc.reason, status=exc.status)
    else:
        outcome = _aggregate(aggregator, request)
        assert case.counts is None or _over_caps(case.counts) is None, (case.counts, outcome)
        return outcome
    assert refused.rejected_reason in otlp.REQUEST_REJECT_REASONS, refused
    assert 400 <= refused.status < 500, refused
    if case.counts is not None:
        assert refused.rejected_reason == _over_caps(case.counts), (case.counts, refused)
    return refused


def _over_caps(counts: tuple[int, int, int]) -> str | None:
    spans, groups, attributes = counts
    if spans > LIMITS.max_spans or groups > LIMITS.max_spans:
        return otlp.TOO_MANY_SPANS
    return otlp.TOO_MANY_ATTRIBUTES if attributes > LIMITS.max_attributes else None


def check_sums(aggregator: SpanAggregator) -> None:
    """Every histogram's ``_sum`` is finite, and a duration family's (phases, TTFT,
    TPOT) is at most a day per observation, whatever the spans said."""
    bounded = {aggregator.phase.name, aggregator.ttft.name, aggregator.tpot.name}
    for family in aggregator.histograms:
        for labels, series in family.items():
            counts, total, _, _ = series.read()
            assert math.isfinite(total), (family.name, labels, total)
            if family.name in bounded:
                assert total <= sum(counts) * contract.MAX_DURATION_S, (family.name, labels)


def _aggregate(aggregator: SpanAggregator, request: Any) -> Outcome:
    spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    result = aggregator.ingest(request)
    assert result.received == spans
    assert set(result.rejected) <= set(SPAN_REJECT_REASONS), result.rejected
    assert result.aggregated + result.rejected_total <= result.received
    return Outcome(
        received=result.received,
        aggregated=result.aggregated,
        spans_rejected=result.rejected_total,
    )
