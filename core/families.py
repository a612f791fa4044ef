"""prometheus_client families built from the contract's rows, for the code that serves
them: the exporter's and the worker's scrape-time collectors.

Needs prometheus_client (the exporter's and the worker's extras), so nothing of the
middleware imports it. ``ConnectionCollector`` serves a ``gpuscope.connections`` guard's
counts under the rows it is given: the exporter's (``contract.exporter``) or the
worker's (``contract.worker``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuscope.connections import ConnectionGuard
from gpuscope.contract.rows import MetricDef, MetricType


def family(row: MetricDef) -> CounterMetricFamily | GaugeMetricFamily:
    """An empty family of ``row``, a counter or gauge, for one scrape (histograms are
    the hot path's, ``gpuscope.exporter.ingest.series``)."""
    labels = list(row.labels)
    if row.type is MetricType.COUNTER:
        return CounterMetricFamily(row.name, row.help, labels=labels)
    assert row.type is MetricType.GAUGE, row.name
    return GaugeMetricFamily(row.name, row.help, labels=labels)


def one_value(row: MetricDef, value: float) -> Metric:
    """The family of ``row`` with its one unlabelled sample."""
    metric = family(row)
    metric.add_metric([], value)
    return metric


class ConnectionCollector(Collector):
    """The guard's open connections (by state: busy, waiting), its cap, and its closes by
    reason, under ``rows``: (open by state, cap, closed by reason)."""

    def __init__(self, guard: ConnectionGuard, rows: Sequence[MetricDef]) -> None:
        self.guard = guard
        self.open_now, self.cap, self.closed = rows

    def collect(self) -> Iterator[Metric]:
        guard = self.guard
        open_now = family(self.open_now)
        open_now.add_metric(["busy"], guard.busy)
        open_now.add_metric(["waiting"], len(guard) - guard.busy)
        yield open_now
        yield one_value(self.cap, guard.max_connections)
        closed = family(self.closed)
        for reason, count in sorted(guard.closed_by_reason.items()):
            closed.add_metric([reason], count)
        yield closed
