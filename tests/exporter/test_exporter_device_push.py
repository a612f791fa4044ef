"""The GPU poller hands the aggregator the device list when it changes; no request
handler asks for it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from gpuscope import spans as contract
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.source import GpuDevice
from gpuscope.exporter.service import start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import (
    FakeGpuSource,
    SpanFactory,
    encode,
    loopback_config,
    samples,
    scrape,
    value,
)


class GrowingSource(FakeGpuSource):
    """The fake's first GPU only, until ``grow()``: a GPU that comes back (or a MIG
    device made) while the exporter runs."""

    def __init__(self) -> None:
        super().__init__()
        self.listed: Sequence[GpuDevice] = super().devices()[:1]

    def devices(self) -> Sequence[GpuDevice]:
        return self.listed

    def grow(self) -> None:
        self.listed = FakeGpuSource.devices(self)


async def test_a_new_gpu_reaches_the_aggregator_from_the_poller(
    exporter_http: aiohttp.ClientSession,
) -> None:
    source = GrowingSource()
    exporter = await start_exporter(loopback_config(gpu_interval_s=0.05), gpu_source=source)
    try:
        state = exporter.app[STATE]
        poller = state.poller
        assert poller is not None
        assert await asyncio.to_thread(poller.wait_for_round, 1, 10.0)
        source.grow()
        done = poller.snapshot().round
        assert await asyncio.to_thread(poller.wait_for_round, done + 2, 10.0)
        # Straight into the aggregator, as the ingest thread would: no POST, so no
        # handler had a chance to refresh the device list.
        server = SpanFactory().server(0.01, attrs={contract.GPU_UUID: "GPU-bbbb"})
        state.aggregator.ingest(encode([server]))
        scraped = samples(await scrape(exporter_http, exporter))
        joined = {"uuid": "GPU-bbbb", "gpu": "1"}
        assert value(scraped, "gpuscope_request_duration_seconds_count", joined) == 1
    finally:
        await exporter.stop()


def test_the_poller_tells_of_the_list_at_start_and_on_each_change_only() -> None:
    source = GrowingSource()
    told: list[list[str]] = []
    poller = GpuPoller(source, 3600.0, on_devices=lambda d: told.append([g.uuid for g in d]))
    poller.start()
    try:
        assert poller.wait_for_round(1, 10.0)
        poller.poll_once()  # same list: not told again
        source.grow()
        poller.poll_once()
        poller.poll_once()
    finally:
        poller.stop()
    assert told == [["GPU-aaaa"], ["GPU-aaaa", "GPU-bbbb"]]
