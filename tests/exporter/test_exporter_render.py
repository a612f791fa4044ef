"""The fast histogram renderer writes what prometheus_client would, sample by sample."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpuscope import spans as attr
from gpuscope.exporter.aggregator import SpanAggregator
from gpuscope.exporter.metrics import ExporterCollector, SelfMetrics
from gpuscope.exporter.render import render_histograms
from support.exporter_fixtures import SpanFactory, encode, samples


def _aggregator() -> SpanAggregator:
    spans = SpanFactory(service='odd "svc" \\ name')
    batch = [
        spans.server(
            0.001 * (i + 1),
            route=f"/r{i % 3}",
            phases={"queue": 0.0001 * i, "compute": 0.01},
            attrs={attr.TIME_TO_FIRST_TOKEN: 0.02} if i % 2 else {},
        )
        for i in range(12)
    ]
    batch.append(spans.batch(5))
    aggregator = SpanAggregator()
    assert aggregator.ingest(encode(batch)).aggregated == 13
    return aggregator


@pytest.mark.parametrize("openmetrics", [False, True])
def test_fast_renderer_matches_prometheus_client(openmetrics: bool) -> None:
    aggregator = _aggregator()
    registry = CollectorRegistry()
    registry.register(ExporterCollector(aggregator, SelfMetrics()))
    histogram_names = {family.name for family in aggregator.histograms}
    writer = generate_openmetrics if openmetrics else generate_latest
    reference = [
        s
        for s in samples(writer(registry).decode(), openmetrics=openmetrics)
        if s.name.rsplit("_", 1)[0] in histogram_names
    ]
    text = render_histograms(aggregator.histograms, openmetrics=openmetrics)
    if openmetrics:
        text += "# EOF\n"
    ours = samples(text, openmetrics=openmetrics)
    assert len(ours) == len(reference) > 100

    def key(sample: object) -> tuple[str, tuple[tuple[str, str], ...]]:
        return sample.name, tuple(sorted(sample.labels.items()))  # type: ignore[attr-defined]

    assert sorted(ours, key=key) == sorted(reference, key=key)
    if openmetrics:
        assert sum(s.exemplar is not None for s in ours) > 10
