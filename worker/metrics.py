"""The worker's own ``/metrics``: scheduler state read live at every scrape.

``WorkerCollector`` builds fresh metric families on each ``collect()``, from the
schedulers it is given, so a scrape always shows the queue and the running batch as
they are now. The KV-cache series come from a generation scheduler that offers
``kv_stats()`` (an object with ``blocks_used``, ``blocks_total`` and ``preemptions``);
they are absent for one that does not. The middleware's own counters
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
    def __init__(
        self,
        schedulers: Mapping[str, SchedulerView],
        policy: BatchPolicy,
        *,
        model_name: str,
        telemetry: Callable[[], Mapping[str, int]] = stats.snapshot,
    ) -> None:
        self._schedulers = dict(schedulers)
        self._policy = policy
        self._model_name = model_name
        self._telemetry = telemetry

    def collect(self) -> Iterator[Any]:
        yield from self._configuration()
        yield from self._requests()
        yield from self._kv_cache()
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

    def _requests(self) -> Iterator[Any]:
        labels = ["endpoint"]
        running = GaugeMetricFamily(
            PREFIX + "requests_running", "Requests in the batch on the device.", labels=labels
        )
        waiting = GaugeMetricFamily(
            PREFIX + "requests_waiting", "Requests queued for a batch.", labels=labels
        )
        batches = CounterMetricFamily(
            PREFIX + "batches",
            "Model calls: batches run (iterations under continuous batching).",
            labels=labels,
        )
        outcomes = CounterMetricFamily(
            PREFIX + "requests",
            "Requests by outcome: completed, rejected_queue_full, timed_out, cancelled, failed.",
            labels=["endpoint", "outcome"],
        )
        for endpoint, scheduler in self._schedulers.items():
            running.add_metric([endpoint], scheduler.running)
            waiting.add_metric([endpoint], scheduler.queued)
            counts = scheduler.counters.as_dict()
            batches.add_metric([endpoint], counts.pop("batches"))
            for outcome, value in counts.items():
                outcomes.add_metric([endpoint, outcome], value)
        yield from (running, waiting, batches, outcomes)

    def _kv_cache(self) -> Iterator[Any]:
        for scheduler in self._schedulers.values():
            kv_stats = getattr(scheduler, "kv_stats", None)
            if kv_stats is None:
                continue
            kv = kv_stats()
            used, total = kv.blocks_used, kv.blocks_total
            yield GaugeMetricFamily(
                PREFIX + "kv_cache_blocks_used", "KV-cache blocks held by sequences.", value=used
            )
            yield GaugeMetricFamily(
                PREFIX + "kv_cache_blocks_total", "KV-cache blocks in the pool.", value=total
            )
            yield GaugeMetricFamily(
                PREFIX + "kv_cache_usage_ratio",
                "Share of the KV-cache pool in use (0-1).",
                value=used / total if total else 0.0,
            )
            yield CounterMetricFamily(
                PREFIX + "preemptions",
                "Sequences preempted (recomputed later) because the KV cache ran out.",
                value=kv.preemptions,
            )


def metrics_endpoint(
    registry: CollectorRegistry,
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """A handler serving ``registry`` as text or OpenMetrics, as the Accept header asks."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), headers={"content-type": content_type})

    return metrics
