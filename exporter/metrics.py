"""The exporter's own families on a scrape: request counters and self-monitoring.

``ExporterCollector`` builds fresh prometheus_client families on every scrape from the
rows of ``definitions`` and plain counters that the event loop updates. The request
histograms are not among them: ``render`` writes those itself, much faster. The GPU
families and ``gpuscope_collector_*`` come from ``gpuscope.exporter.gpu.collector``,
the connection families from ``connections.ConnectionCollector``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuscope import __version__
from gpuscope.exporter import definitions as defs
from gpuscope.exporter.aggregator import SPAN_REJECT_REASONS, SpanAggregator
from gpuscope.exporter.definitions import MetricDef
from gpuscope.exporter.otlp import REQUEST_REJECT_REASONS
from gpuscope.exporter.series import CounterFamily

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
    """Yields the request-side counters of ``aggregator``, overflow counts and the self
    metrics (the forwarding ones only with ``forwarding``)."""

    def __init__(
        self, aggregator: SpanAggregator, self_metrics: SelfMetrics, *, forwarding: bool = False
    ) -> None:
        self.aggregator = aggregator
        self.self_metrics = self_metrics
        self.forwarding = forwarding

    def collect(self) -> Iterator[Metric]:
        aggregator = self.aggregator
        counters = ((defs.TOKENS, aggregator.tokens), (defs.SPAN_CALLS, aggregator.stock.calls))
        yield from (_counter(definition, counter) for definition, counter in counters)
        overflow = defs.SERIES_OVERFLOW.family()
        for histogram in aggregator.histograms:
            overflow.add_metric([histogram.name], histogram.overflowed)
        for _, counter in counters:
            overflow.add_metric([counter.name + "_total"], counter.overflowed)
        yield overflow
        yield from self._self_families()

    def _self_families(self) -> Iterator[Metric]:
        own = self.self_metrics
        info = defs.BUILD_INFO.family()
        info.add_metric([__version__], 1.0)
        yield info
        yield defs.SPANS_RECEIVED.one_value(own.spans_received)
        yield _by_reason(defs.SPANS_REJECTED, own.spans_rejected.items())
        yield _by_reason(defs.OTLP_REQUESTS_REJECTED, own.requests_rejected.items())
        if self.forwarding:
            yield defs.FORWARD_SPANS_SENT.one_value(own.forward_spans_sent)
            yield _by_reason(defs.FORWARD_SPANS_DROPPED, own.forward_spans_dropped.items())


def _counter(definition: MetricDef, counter: CounterFamily) -> Metric:
    family = definition.family()
    for labels, value in counter.items():
        family.add_metric(labels, value)
    return family


def _by_reason(definition: MetricDef, counts: Iterable[tuple[str, int]]) -> Metric:
    family = definition.family()
    for reason, count in sorted(counts):
        family.add_metric([reason], count)
    return family
