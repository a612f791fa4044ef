"""The fast histogram renderer writes what prometheus_client would, sample by sample."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from gpuscope import spans as contract
from gpuscope.contract.labels import OMIT_EMPTY
from gpuscope.exporter.http.render import render_histograms
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.ingest.series import HistogramFamily, HistogramSeries
from support.exporter_fixtures import SpanFactory, encode, samples


def _aggregator() -> SpanAggregator:
    spans = SpanFactory(service='odd "svc" \\ name')
    batch = [
        spans.server(
            0.03 + 0.001 * i,  # longer than its phases and TTFT, or it is refused
            route=f"/r{i % 3}",
            phases={"queue": 0.0001 * i, "compute": 0.01},
            attrs={contract.TIME_TO_FIRST_TOKEN: 0.02} if i % 2 else {},
        )
        for i in range(12)
    ]
    batch.append(spans.batch(5))
    aggregator = SpanAggregator()
    assert aggregator.ingest(encode(batch)).aggregated == 13
    return aggregator


class _PrometheusClientHistograms(Collector):
    """The reference: the same histograms written by prometheus_client's own writers."""

    def __init__(self, families: Sequence[HistogramFamily]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            metric = HistogramMetricFamily(
                family.name, family.documentation, labels=family.label_names
            )
            bounds = [repr(b) for b in family.bounds] + ["+Inf"]
            for labels, series in family.items():
                buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
                cumulative = 0
                for bound, count, span, value in zip(
                    bounds,
                    series.counts,
                    series.exemplar_spans,
                    series.exemplar_values,
                    strict=True,
                ):
                    cumulative += count
                    if span is None:
                        buckets.append((bound, cumulative))
                        continue
                    trace_id, span_id, end_ns = span
                    ids = {"trace_id": trace_id.hex(), "span_id": span_id.hex()}
                    buckets.append((bound, cumulative, Exemplar(ids, value, end_ns / 1e9)))
                metric.add_metric(labels, buckets, series.sum)
            yield metric


@pytest.mark.parametrize("openmetrics", [False, True])
def test_fast_renderer_matches_prometheus_client(openmetrics: bool) -> None:
    aggregator = _aggregator()
    registry = CollectorRegistry()
    registry.register(_PrometheusClientHistograms(aggregator.histograms))
    writer = generate_openmetrics if openmetrics else generate_latest
    reference = samples(writer(registry).decode(), openmetrics=openmetrics)
    # prometheus_client writes every label of a family; the renderer leaves out the
    # pod's where empty (``labels.OMIT_EMPTY``), which Prometheus reads alike
    for sample in reference:
        for name in OMIT_EMPTY:
            if sample.labels.get(name) == "":
                del sample.labels[name]
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


def test_rendering_in_a_thread_while_observing_reads_every_series_consistently() -> None:
    family = HistogramFamily("x_seconds", "doc", ("route",), (0.25, 1.0), max_series=50)
    span = (b"\x01" * 16, b"\x02" * 8, 1)
    stop = threading.Event()
    renders: list[str] = []

    def render_repeatedly() -> None:
        while not stop.is_set():
            renders.append(render_histograms([family], openmetrics=False))

    renderer = threading.Thread(target=render_repeatedly)
    sys.setswitchinterval(1e-6)  # hand the GIL back and forth as often as possible
    renderer.start()
    try:
        for i in range(200_000):
            family.observe((f"/r{i % 40}",), 0.5, span)  # every value 0.5: sum = count / 2
            if len(renders) >= 30:
                break
    finally:
        stop.set()
        renderer.join()
        sys.setswitchinterval(0.005)
    assert len(renders) >= 2
    for text in renders:
        for family_seen in text_string_to_metric_families(text):
            by_series: dict[str, dict[str, float]] = {}
            for sample in family_seen.samples:
                by_series.setdefault(sample.labels["route"], {})[
                    sample.name + sample.labels.get("le", "")
                ] = sample.value
            for values in by_series.values():
                count = values["x_seconds_count"]
                assert values["x_seconds_bucket+Inf"] == count == values["x_seconds_bucket1.0"]
                assert values["x_seconds_sum"] == count / 2


def test_a_reader_never_sees_an_observation_half_written() -> None:
    series = HistogramSeries(3)
    series.version += 1  # an observation begun on the loop: the bucket is counted ...
    series.counts[0] += 1
    seen: list[tuple[list[int], float, object, object]] = []
    reader = threading.Thread(target=lambda: seen.append(series.read()))
    reader.start()
    reader.join(timeout=0.2)
    assert reader.is_alive()  # ... so the scrape waits for the rest of it
    series.sum += 0.5
    series.version += 1
    reader.join(timeout=30)
    assert seen[0][:2] == ([1, 0, 0], 0.5)


def test_help_text_is_escaped_as_each_format_asks() -> None:
    """OpenMetrics escapes ``"`` in HELP text, the Prometheus text format does not: the
    HELP line is prometheus_client's own, and both parsers read back the text."""
    documentation = 'a "quoted" \\ help\nline'
    family = HistogramFamily("gpuscope_probe_seconds", documentation, ["route"], [0.1, 1.0], 10)
    family.observe(("/x",), 0.05, (b"\x01" * 16, b"\x02" * 8, 1_700_000_000_000_000_000))

    class Reference(Collector):
        def collect(self) -> Iterator[Metric]:
            metric = HistogramMetricFamily("gpuscope_probe_seconds", documentation, labels=["r"])
            metric.add_metric(["/x"], [("0.1", 1), ("1.0", 1), ("+Inf", 1)], 0.05)
            yield metric

    registry = CollectorRegistry()
    registry.register(Reference())
    for openmetrics, writer, parse in (
        (False, generate_latest, text_string_to_metric_families),
        (True, generate_openmetrics, openmetrics_families),
    ):
        text = render_histograms([family], openmetrics=openmetrics)
        help_line = text.splitlines()[0]
        assert help_line == writer(registry).decode().splitlines()[0], openmetrics
        parsed = list(parse(text + ("# EOF\n" if openmetrics else "")))
        assert parsed[0].documentation == documentation, openmetrics
