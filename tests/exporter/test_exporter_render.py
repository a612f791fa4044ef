"""The fast histogram renderer writes what prometheus_client would, sample by sample."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpuscope.exporter.aggregator import SpanAggregator
from gpuscope.exporter.metrics import ExporterCollector, SelfMetrics
from gpuscope.exporter.render import render_histograms
from gpuscope.exporter.series import HistogramFamily
from gpuscope.middleware import attributes as attr
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


def test_a_snapshot_renders_as_it_was_taken_while_the_original_moves_on() -> None:
    family = HistogramFamily("x_seconds", "doc", ("phase",), (1.0,), max_series=10)
    span = (b"\x01" * 16, b"\x02" * 8, 1)
    family.observe(("queue",), 0.5, span)
    snapshot = family.snapshot()
    family.observe(("queue",), 2.0, span)
    family.observe(("compute",), 0.5, span)
    text = render_histograms([snapshot], openmetrics=False)
    assert 'x_seconds_count{phase="queue"} 1\n' in text
    assert 'x_seconds_bucket{phase="queue",le="+Inf"} 1\n' in text
    assert "compute" not in text
    assert 'x_seconds_count{phase="queue"} 2\n' in render_histograms([family], openmetrics=False)
