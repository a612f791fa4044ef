"""Scrape the exporter around a load step (aiohttp), and wait until it has caught up.

The worker exports its spans in batches, so after a step the exporter counts that
step's requests a little later: ``settle`` scrapes until the request count has grown by
what the client saw answered (or a deadline passes) before the step's view is taken.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from gpuscope.loadgen.server_view import ServerStep, Snapshot, parse_snapshot, step_view

GAUGE_INTERVAL_S = 1.0


class ExporterProbe:
    def __init__(self, session: aiohttp.ClientSession, exporter_url: str) -> None:
        self._session = session
        self._url = exporter_url.rstrip("/") + "/metrics"
        self._during: list[Snapshot] = []

    async def snapshot(self) -> Snapshot:
        try:
            async with self._session.get(self._url) as response:
                if response.status != 200:
                    raise RuntimeError(f"{self._url} answered {response.status}")
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise RuntimeError(f"cannot read {self._url}: {exc or type(exc).__name__}") from None
        return parse_snapshot(text, time.monotonic())

    async def sample_gauges(self) -> None:
        """Scrape every second until cancelled; the gauges of a step are their mean."""
        self._during = []
        while True:
            await asyncio.sleep(GAUGE_INTERVAL_S)
            try:
                self._during.append(await self.snapshot())
            except RuntimeError:
                continue  # one missed sample only thins the mean

    async def settle(self, before: Snapshot, answered: int, timeout_s: float = 10.0) -> Snapshot:
        """The first scrape that counts ``answered`` more requests than ``before``."""
        deadline = time.monotonic() + timeout_s
        while True:
            after = await self.snapshot()
            if after.requests - before.requests >= answered or time.monotonic() > deadline:
                return after
            await asyncio.sleep(0.2)  # spans arrive in the worker's export batches

    def view(self, before: Snapshot, after: Snapshot) -> ServerStep:
        return step_view(before, after, self._during)
