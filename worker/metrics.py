"""The worker's own ``/metrics``: scheduler state read live at every scrape.

``WorkerCollector`` builds fresh metric families on each ``collect()``, from the
schedulers it is given, so a scrape always shows the queue and the running batch as
they are now; the generation scheduler's ``kv_stats()`` gives the KV-cache series,
its running and waiting sequences and its iterations. The middleware's own counters
(``gpuscope.middleware.stats``: spans exported, dropped, failed exports, …) are
exposed generically, one ``kind`` label per counter.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from gpuscope.middleware import stats
from gpuscope.worker.kv_cache import KvStats
from gpuscope.worker.scheduler import BatchPolicy, Counters

PREFIX = "gpuscope_worker_"


class SchedulerView(Protocol):
    """What the collector reads from a scheduler."""

    @property
    def queued(self) -> int: ...

    @property
    def running(self) -> int: ...

    counters: Counters


class WorkerCollector(Collector):
    """``schedulers`` by endpoint name; ``kv_stats`` reads the generation scheduler's
    cache and batch (its running/waiting counts replace that endpoint's, since they
    include preempted sequences)."""

    def __init__(
        self,
        schedulers: Mapping[str, SchedulerView],
        policy: BatchPolicy,
        *,
        model_name: str,
        kv_stats: tuple[str, Callable[[], KvStats]] | None = None,
        telemetry: Callable[[], Mapping[str, int]] = stats.snapshot,
    ) -> None:
        self._schedulers = dict(schedulers)
        self._policy = policy
        self._model_name = model_name
        self._kv_stats = kv_stats
        self._telemetry = telemetry

    def collect(self) -> Iterator[Any]:
        kv = None if self._kv_stats is None else (self._kv_stats[0], self._kv_stats[1]())
        yield from self._configuration()
        yield from self._requests(kv)
        if kv is not None:
            yield from _kv_cache(kv[1])
        telemetry = CounterMetricFamily(
            PREFIX + "telemetry_events",
            "The gpuscope middleware's own counters (spans exported, dropped, failed, …).",
            labels=["kind"],
        )
        for kind, value in sorted(self._telemetry().items()):
            telemetry.add_metric([kind], value)
        yield telemetry

    def _configuration(self) -> Iterator[Any]:
        info = GaugeMetricFamily(
            PREFIX + "info", "The worker's model and batching mode.", labels=["model", "batching"]
        )
        info.add_metric([self._model_name, self._policy.mode], 1)
        yield info
        yield GaugeMetricFamily(
            PREFIX + "max_batch_size",
            "Configured requests per batch (sequences per iteration under continuous).",
            value=self._policy.max_batch_size,
        )
        yield GaugeMetricFamily(
            PREFIX + "max_queue_delay_seconds",
            "Configured window a forming batch waits to fill (dynamic batching).",
            value=self._policy.max_queue_delay_s,
        )
        yield GaugeMetricFamily(
            PREFIX + "max_queue_requests",
            "Configured queue length beyond which requests get 429.",
            value=self._policy.max_queue,
        )

    def _requests(self, kv: tuple[str, KvStats] | None) -> Iterator[Any]:
        labels = ["endpoint"]
        running = GaugeMetricFamily(
            PREFIX + "requests_running", "Requests in the batch on the device.", labels=labels
        )
        waiting = GaugeMetricFamily(
            PREFIX + "requests_waiting",
            "Requests waiting for a batch (queued, or preempted).",
            labels=labels,
        )
        iterations = CounterMetricFamily(
            PREFIX + "batch_iterations",
            "Model calls: one per batch (embeddings), one per step (generation).",
            labels=labels,
        )
        outcomes = CounterMetricFamily(
            PREFIX + "requests",
            "Requests by outcome: completed, rejected_queue_full, timed_out, cancelled, failed.",
            labels=["endpoint", "outcome"],
        )
        for endpoint, scheduler in self._schedulers.items():
            counts = scheduler.counters.as_dict()
            calls = counts.pop("batches")
            if kv is not None and kv[0] == endpoint:
                stats_now = kv[1]
                running.add_metric([endpoint], stats_now.running)
                waiting.add_metric([endpoint], stats_now.waiting)
                iterations.add_metric([endpoint], stats_now.iterations_total)
            else:
                running.add_metric([endpoint], scheduler.running)
                waiting.add_metric([endpoint], scheduler.queued)
                iterations.add_metric([endpoint], calls)
            for outcome, value in counts.items():
                outcomes.add_metric([endpoint, outcome], value)
        yield from (running, waiting, iterations, outcomes)


def _kv_cache(kv: KvStats) -> Iterator[Any]:
    yield GaugeMetricFamily(
        PREFIX + "kv_cache_blocks_used", "KV-cache blocks held by sequences.", value=kv.blocks_used
    )
    yield GaugeMetricFamily(
        PREFIX + "kv_cache_blocks",
        "KV-cache blocks in the pool, used or free.",
        value=kv.blocks_total,
    )
    yield GaugeMetricFamily(
        PREFIX + "kv_cache_usage_ratio",
        "Share of the KV-cache pool's blocks in use (0-1).",
        value=kv.usage_ratio,
    )
    yield CounterMetricFamily(
        PREFIX + "preemptions",
        "Running sequences evicted (to be recomputed) because the KV cache ran out.",
        value=kv.preemptions_total,
    )


def metrics_endpoint(
    registry: CollectorRegistry,
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """A handler serving ``registry`` as text or OpenMetrics, as the Accept header asks."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), headers={"content-type": content_type})

    return metrics
