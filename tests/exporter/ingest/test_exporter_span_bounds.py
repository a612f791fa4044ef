"""What one sender's spans can do to everyone's series, and the bounds that hold it
(issue 26, items 4 and 5): a token count of 2^63-1, a span of 584 years, numbers that
contradict each other, a span sent twice, and invented model names filling the series."""

from __future__ import annotations

from test_exporter_aggregator import registry_of

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
