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
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from gpuscope.contract import labels as L
from gpuscope.contract import worker as rows
from gpuscope.contract.rows import label_values
from gpuscope.exposition import VARY, choose_format
from gpuscope.families import family, one_value
from gpuscope.middleware import stats
from gpuscope.worker.kv_cache import KvStats
from gpuscope.worker.scheduler import BatchPolicy, Counters


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
    include preempted sequences). Its families are the rows of ``gpuscope.contract.worker``."""

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
        telemetry = family(rows.TELEMETRY_EVENTS)
        for kind, value in sorted(self._telemetry().items()):
            telemetry.add_metric([kind], value)
        yield telemetry

    def _configuration(self) -> Iterator[Any]:
        info = family(rows.INFO)
        info.add_metric(
            label_values(rows.INFO, {L.MODEL: self._model_name, L.BATCHING: self._policy.mode}),
            1,
        )
        yield info
        yield one_value(rows.MAX_BATCH_SIZE, self._policy.max_batch_size)
        yield one_value(rows.MAX_QUEUE_DELAY, self._policy.max_queue_delay_s)
        yield one_value(rows.MAX_QUEUE_REQUESTS, self._policy.max_queue)

    def _requests(self, kv: tuple[str, KvStats] | None) -> Iterator[Any]:
        running = family(rows.REQUESTS_RUNNING)
        waiting = family(rows.REQUESTS_WAITING)
        iterations = family(rows.BATCH_ITERATIONS)
        outcomes = family(rows.REQUESTS)
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
                by_name = {L.ENDPOINT: endpoint, L.OUTCOME: outcome}
                outcomes.add_metric(label_values(rows.REQUESTS, by_name), value)
        yield from (running, waiting, iterations, outcomes)


def _kv_cache(kv: KvStats) -> Iterator[Any]:
    yield one_value(rows.KV_CACHE_BLOCKS_USED, kv.blocks_used)
    yield one_value(rows.KV_CACHE_BLOCKS, kv.blocks_total)
    yield one_value(rows.KV_CACHE_USAGE, kv.usage_ratio)
    yield one_value(rows.PREEMPTIONS, kv.preemptions_total)


def metrics_endpoint(
    registry: CollectorRegistry,
) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """A handler serving ``registry`` as text or OpenMetrics, as the Accept header asks."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_format(request.headers.get("accept", ""))
        headers = {"content-type": content_type, "vary": VARY}
        return Response(encoder(registry), headers=headers)

    return metrics
