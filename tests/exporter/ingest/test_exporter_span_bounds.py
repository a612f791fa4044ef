"""What one sender's spans can do to everyone's series, and the bounds that hold it
(issue 26, items 4 and 5): a token count of 2^63-1, a span of 584 years, numbers that
contradict each other, a span sent twice, and invented model names filling the series."""

from __future__ import annotations

import pytest
from test_exporter_aggregator import registry_of

from gpuscope import engine_spans
from gpuscope import spans as contract
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from support.exporter_fixtures import SpanFactory, encode

OUTPUT = {"direction": "output", "service": "victim", "model": "m1"}


def test_a_huge_token_count_is_rejected_and_later_increments_still_count() -> None:
    spans = SpanFactory(service="victim")
    aggregator = SpanAggregator()
    huge = spans.server(0.01, attrs={contract.GEN_AI_USAGE_OUTPUT_TOKENS: 2**63 - 1})
    result = aggregator.ingest(encode([huge]))
    assert result.rejected == {"invalid_attribute_value": 1}
    for _ in range(3):
        aggregator.ingest(
            encode([spans.server(0.01, attrs={contract.GEN_AI_USAGE_OUTPUT_TOKENS: 5_000})])
        )
    # a counter at 2^63 would have swallowed each +5,000 (float rounding)
    assert registry_of(aggregator).get_sample_value("gpuscope_tokens_total", OUTPUT) == 15_000


def test_a_span_of_584_years_is_rejected() -> None:
    spans = SpanFactory(service="victim")
    aggregator = SpanAggregator()
    request = encode([spans.server(0.01), spans.server(0.01)])
    first = request.resource_spans[0].scope_spans[0].spans[0]
    first.end_time_unix_nano = 2**64 - 1  # the largest fixed64: 584 years after 1970
    result = aggregator.ingest(request)
    assert result.rejected == {"invalid_duration": 1}
    duration = registry_of(aggregator).get_sample_value(
        "gpuscope_request_duration_seconds_sum", {"service": "victim", "code": "200"}
    )
    assert duration is not None and duration < 1


def test_phases_longer_than_their_span_are_a_contradiction() -> None:
    spans = SpanFactory(service="victim")
    aggregator = SpanAggregator()
    result = aggregator.ingest(
        encode(
            [
                spans.server(0.01, phases={"queue": 5.0}),  # 5 s of queue in a 10 ms request
                spans.server(0.01, attrs={contract.TIME_TO_FIRST_TOKEN: 3.0}),
                spans.server(0.05, phases={"queue": 0.01, "compute": 0.03}),
            ]
        )
    )
    assert result.rejected == {"inconsistent_durations": 2}
    assert result.aggregated == 1


def test_a_span_sent_twice_counts_once() -> None:
    spans = SpanFactory(service="victim")
    aggregator = SpanAggregator()
    request = encode([spans.server(0.01)])
    assert aggregator.ingest(request).aggregated == 1
    again = aggregator.ingest(request)  # a retry of a request that was in fact counted
    assert again.rejected == {"duplicate": 1}
    count = registry_of(aggregator).get_sample_value(
        "gpuscope_request_duration_seconds_count", {"service": "victim", "code": "200"}
    )
    assert count == 1


def test_one_services_invented_models_leave_room_for_another_service() -> None:
    attacker, victim = SpanFactory(service="attacker"), SpanFactory(service="victim")
    aggregator = SpanAggregator(max_series=100, max_models_per_service=20)
    invented = [
        attacker.server(0.01, attrs={contract.GEN_AI_REQUEST_MODEL: f"made-up-{i}"})
        for i in range(300)
    ]
    aggregator.ingest(encode(invented))
    aggregator.ingest(encode([victim.server(0.01)]))
    reg = registry_of(aggregator)
    victims = reg.get_sample_value(
        "gpuscope_request_duration_seconds_count", {"service": "victim", "model": "m1"}
    )
    assert victims == 1  # its own series, not the overflow
    attackers = {
        s.labels["model"]
        for s in reg.samples
        if s.name == "gpuscope_request_duration_seconds_count"
        and s.labels.get("service") == "attacker"
    }
    assert len(attackers) <= 21  # 20 models and one fold
    folded = reg.get_sample_value(
        "gpuscope_series_overflow_total",
        {"metric": "gpuscope_request_duration_seconds", "reason": "max_models_per_service"},
    )
    assert folded == 280


def test_stages_and_the_time_per_token_are_bounded_by_the_span_too() -> None:
    """Compute's stages were checked against compute only, and only when it was sent;
    the time per output token against nothing but a day: a 1 s span brought 75,000 s of
    prefill and decode, or 5,000 s a token, into the histograms."""
    spans = SpanFactory(service="victim")
    aggregator = SpanAggregator()
    stage, tpot = contract.COMPUTE_STAGE_DURATION, contract.TIME_PER_OUTPUT_TOKEN
    result = aggregator.ingest(
        encode(
            [
                spans.server(1.0, attrs={stage["prefill"]: 5000.0, stage["decode"]: 70000.0}),
                spans.server(1.0, attrs={tpot: 5000.0}),
                spans.server(
                    1.0, attrs={stage["decode"]: 0.5, contract.TIME_PER_OUTPUT_TOKEN: 0.1}
                ),
            ]
        )
    )
    assert result.rejected == {"inconsistent_durations": 2}
    assert result.aggregated == 1


def test_a_lone_engine_stage_is_bounded_by_the_span() -> None:
    """vLLM's span checked its stages only as a pair: a lone decode of 5,000 s on a 1 s
    span was counted, and the time per output token drawn from it."""
    decode_only = {engine_spans.VLLM_DECODE: 5000.0, engine_spans.VLLM_COMPLETION_TOKENS: 3}
    with pytest.raises(engine_spans.EngineSpanInvalid, match="longer than the span"):
        engine_spans.read_engine_span(decode_only, span_seconds=1.0)
    fine = {engine_spans.VLLM_DECODE: 0.5, engine_spans.VLLM_COMPLETION_TOKENS: 3}
    assert engine_spans.read_engine_span(fine, span_seconds=1.0).time_per_output_token == 0.25


def test_labels_may_hold_any_space_but_no_control_character() -> None:
    spans = SpanFactory(service="victim")
    aggregator = SpanAggregator()
    result = aggregator.ingest(
        encode(
            [
                spans.server(0.01, route="/no\u00a0break"),  # refused as a control before
                spans.server(0.01, route="/thin\u2009space"),
                spans.server(0.01, route="/zero\u200bwidth"),  # a format character
                spans.server(0.01, route="/line\u2028break"),
            ]
        )
    )
    assert result.aggregated == 2
    assert result.rejected == {"invalid_label": 2}


def test_a_service_name_that_is_no_string_is_refused_not_emptied() -> None:
    request = encode([SpanFactory(service="victim").server(0.01)])
    for attribute in request.resource_spans[0].resource.attributes:
        if attribute.key == "service.name":
            attribute.value.int_value = 7
    result = SpanAggregator().ingest(request)
    assert result.rejected == {"wrong_attribute_type": 1}
