"""The exporter's own families on a scrape: request counters and self-monitoring.

``ExporterCollector`` builds fresh prometheus_client families on every scrape from the
rows of ``gpuscope.contract.exporter`` and plain counters that the event loop updates. The request
histograms are not among them: ``render`` writes those itself, much faster. The GPU
families and ``gpuscope_collector_*`` come from ``gpuscope.exporter.gpu.collector``,
the connection families from ``gpuscope.families.ConnectionCollector``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuscope import __version__
from gpuscope.contract import exporter as defs
from gpuscope.contract.rows import MetricDef
from gpuscope.exporter.ingest.aggregator import SPAN_REJECT_REASONS, SpanAggregator
from gpuscope.exporter.ingest.forward import FORWARD_DROP_REASONS
from gpuscope.exporter.ingest.otlp import REQUEST_REJECT_REASONS
from gpuscope.exporter.ingest.pipeline import INGEST_REJECT_REASONS
from gpuscope.exporter.ingest.series import CounterFamily, HistogramFamily
from gpuscope.families import family as new_family

# ``gpuscope_web_config_reloads_total{result}``: re-reads of the credential files.
RELOAD_APPLIED, RELOAD_REFUSED = "applied", "refused"


class SelfMetrics:
    """Counters of what the exporter itself did; mutated on the event loop only."""

    def __init__(self) -> None:
        self.spans_received = 0
        self.spans_rejected: Counter[str] = Counter({r: 0 for r in SPAN_REJECT_REASONS})
        self.requests_rejected: Counter[str] = Counter(
            {r: 0 for r in (*REQUEST_REJECT_REASONS, *INGEST_REJECT_REASONS)}
        )
        self.forward_spans_sent = 0
        self.forward_spans_dropped: Counter[str] = Counter({r: 0 for r in FORWARD_DROP_REASONS})
        self.web_config_reloads: Counter[str] = Counter({RELOAD_APPLIED: 0, RELOAD_REFUSED: 0})


class ExporterCollector(Collector):
    """Yields the span counters of ``aggregator`` and the self metrics, one family per
    row of ``definitions.SPAN_COUNTERS`` and ``SELF_METRICS`` in their order (the
    forwarding rows only with ``forwarding``). ``gpu_source`` is the (requested, in
    use) pair of ``gpuscope_gpu_source_info``: served here rather than by the GPU
    collector, because without a GPU source there is no GPU collector to say so."""

    def __init__(
        self,
        aggregator: SpanAggregator,
        self_metrics: SelfMetrics,
        *,
        forwarding: bool = False,
        gpu_source: tuple[str, str] = ("none", "none"),
    ) -> None:
        self.aggregator = aggregator
        self.self_metrics = self_metrics
        self.forwarding = forwarding
        self.gpu_source = gpu_source

    def collect(self) -> Iterator[Metric]:
        samples = self._samples()
        for row in (*defs.SPAN_COUNTERS, *defs.SELF_METRICS):
            if row in samples:
                family = new_family(row)
                for labels, value in samples[row]:
                    family.add_metric(labels, value)
                yield family

    def _samples(self) -> dict[MetricDef, Iterable[tuple[Sequence[str], float]]]:
        """Each row's samples now: (label values, value)."""
        aggregator, own = self.aggregator, self.self_metrics
        families: list[HistogramFamily | CounterFamily] = [
            *aggregator.histograms,
            *aggregator.counters.values(),
        ]
        samples: dict[MetricDef, Iterable[tuple[Sequence[str], float]]] = {
            **{row: counter.items() for row, counter in aggregator.counters.items()},
            defs.SERIES_OVERFLOW: _overflow_samples(families),
            defs.BUILD_INFO: [([__version__], 1.0)],
            defs.GPU_SOURCE: [(self.gpu_source, 1.0)],
            defs.SPANS_RECEIVED: [([], own.spans_received)],
            defs.SPANS_REJECTED: _by_reason(own.spans_rejected),
            defs.OTLP_REQUESTS_REJECTED: _by_reason(own.requests_rejected),
            defs.WEB_CONFIG_RELOADS: _by_reason(own.web_config_reloads),
        }
        if self.forwarding:
            samples[defs.FORWARD_SPANS_SENT] = [([], own.forward_spans_sent)]
            samples[defs.FORWARD_SPANS_DROPPED] = _by_reason(own.forward_spans_dropped)
        return samples


def _sample_name(family: HistogramFamily | CounterFamily) -> str:
    """The name a family's samples carry (the ``metric`` label of the overflow count)."""
    return family.name + "_total" if isinstance(family, CounterFamily) else family.name


# Reasons of ``gpuscope_series_overflow_total{reason}``.
MAX_SERIES = "max_series"
MAX_MODELS_PER_SERVICE = "max_models_per_service"


def _overflow_samples(
    families: Sequence[HistogramFamily | CounterFamily],
) -> list[tuple[Sequence[str], float]]:
    """Each family's ``max_series`` overflow, and its model folds where it has a model cap."""
    samples: list[tuple[Sequence[str], float]] = []
    for family in families:
        name = _sample_name(family)
        samples.append(([name, MAX_SERIES], family.overflowed))
        folded = family.models_folded
        if folded is not None:
            samples.append(([name, MAX_MODELS_PER_SERVICE], folded))
    return samples


def _by_reason(counts: Counter[str]) -> list[tuple[Sequence[str], float]]:
    return [([reason], count) for reason, count in sorted(counts.items())]
