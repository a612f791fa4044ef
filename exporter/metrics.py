"""The exporter's own metric families: request-side counters and self-monitoring.

``ExporterCollector`` builds fresh ``*MetricFamily`` objects on every scrape from
plain counters that the event loop updates; prometheus_client renders them (the
request histograms go through ``render`` instead, unless ``histograms=True``). The GPU
families and ``gpuscope_collector_*`` come from ``gpuscope.exporter.gpu.collector``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from gpuscope import __version__
from gpuscope.exporter.aggregator import SPAN_REJECT_REASONS, SpanAggregator
from gpuscope.exporter.otlp import REQUEST_REJECT_REASONS
from gpuscope.exporter.series import CounterFamily, HistogramFamily

FORWARD_DROP_REASONS = ("queue_full", "send_failed", "shutdown")


class SelfMetrics:
    """Counters of what the exporter itself did; mutated on the event loop only."""

    def __init__(self) -> None:
        self.spans_received = 0
        self.spans_rejected: Counter[str] = Counter({r: 0 for r in SPAN_REJECT_REASONS})
        self.requests_rejected: Counter[str] = Counter({r: 0 for r in REQUEST_REJECT_REASONS})
        self.forward_spans_sent = 0
        self.forward_spans_dropped: Counter[str] = Counter({r: 0 for r in FORWARD_DROP_REASONS})


class ExporterCollector(Collector):
    """Yields the request-side families of ``aggregator`` and the self metrics."""

    def __init__(
        self,
        aggregator: SpanAggregator,
        self_metrics: SelfMetrics,
        *,
        forwarding: bool = False,
        histograms: bool = True,
    ) -> None:
        self.aggregator = aggregator
        self.self_metrics = self_metrics
        self.forwarding = forwarding
        # False where ``render.render_histograms`` writes them (the /metrics handler).
        self.histograms = histograms

    def collect(self) -> Iterator[Metric]:
        aggregator = self.aggregator
        if self.histograms:
            for family in aggregator.histograms:
                yield _histogram(family)
        counters = (aggregator.tokens, aggregator.stock.calls)
        yield from (_counter(counter) for counter in counters)
        overflow = CounterMetricFamily(
            "gpuscope_series_overflow",
            "Observations sent to a metric's overflow series because it hit --max-series.",
            labels=["metric"],
        )
        for histogram in aggregator.histograms:
            overflow.add_metric([histogram.name], histogram.overflowed)
        for counter in counters:
            overflow.add_metric([counter.name + "_total"], counter.overflowed)
        yield overflow
        yield from self._self_families()

    def _self_families(self) -> Iterator[Metric]:
        own = self.self_metrics
        info = GaugeMetricFamily(
            "gpuscope_build_info", "gpuscope build; the value is always 1.", labels=["version"]
        )
        info.add_metric([__version__], 1.0)
        yield info
        yield CounterMetricFamily(
            "gpuscope_spans_received", "Spans in decoded OTLP export requests.",
            value=own.spans_received,
        )  # fmt: skip
        yield _by_reason(
            "gpuscope_spans_rejected",
            "Spans not aggregated because they broke the span contract, by reason.",
            own.spans_rejected.items(),
        )
        yield _by_reason(
            "gpuscope_otlp_requests_rejected",
            "OTLP export requests refused as a whole (nothing decoded), by reason.",
            own.requests_rejected.items(),
        )
        if self.forwarding:
            yield CounterMetricFamily(
                "gpuscope_forward_spans_sent",
                "Spans forwarded to --forward-otlp and accepted there.",
                value=own.forward_spans_sent,
            )
            yield _by_reason(
                "gpuscope_forward_spans_dropped",
                "Spans not forwarded to --forward-otlp, by reason.",
                own.forward_spans_dropped.items(),
            )


def _counter(counter: CounterFamily) -> Metric:
    family = CounterMetricFamily(counter.name, counter.documentation, labels=counter.label_names)
    for labels, value in counter.items():
        family.add_metric(labels, value)
    return family


def _by_reason(name: str, documentation: str, counts: Iterable[tuple[str, int]]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["reason"])
    for reason, count in sorted(counts):
        family.add_metric([reason], count)
    return family


def _histogram(family: HistogramFamily) -> Metric:
    metric = HistogramMetricFamily(family.name, family.documentation, labels=family.label_names)
    bounds = [repr(b) for b in family.bounds] + ["+Inf"]  # 0.0001, 1.0, ...: valid floats
    for labels, series in family.items():
        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        cumulative = 0
        for bound, count, span, value in zip(
            bounds, series.counts, series.exemplar_spans, series.exemplar_values, strict=True
        ):
            cumulative += count
            if span is None:
                buckets.append((bound, cumulative))
            else:
                trace_id, span_id, end_ns = span
                exemplar = Exemplar(
                    {"trace_id": trace_id.hex(), "span_id": span_id.hex()}, value, end_ns / 1e9
                )
                buckets.append((bound, cumulative, exemplar))
        metric.add_metric(labels, buckets, series.sum)
    return metric
