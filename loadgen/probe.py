"""Scrape the exporter around a load step (aiohttp), and wait until it has caught up.

The worker exports its spans in batches, so after a step the exporter counts that
step's requests a little later: ``settle`` scrapes until the request count has grown by
what the client saw answered (or a deadline passes) before the step's view is taken.

A scrape is read a line at a time, at most ``max_bytes`` in all and within
``SCRAPE_TIMEOUT_S`` including the parse; one that fails, is too large or is not the
text format raises ``ProbeFailed``, which costs the step its exporter view, never the
run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import aiohttp

from gpuscope.contract.http import METRICS_PATH
from gpuscope.loadgen.bounded import MIB, TooLarge, check_declared, lines
from gpuscope.loadgen.engine_metrics import Builder
from gpuscope.loadgen.server_view import (
    MalformedMetrics,
    ServerStep,
    Snapshot,
    SnapshotBuilder,
    step_view,
    went_down,
)

GAUGE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S: Final = 10.0
MAX_METRICS_LINE_BYTES: Final = 1 * MIB
DEFAULT_MAX_METRICS_BYTES: Final = 64 * MIB


class ProbeFailed(RuntimeError):
    """A scrape of the exporter that gave no snapshot, and why."""


class ExporterProbe:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        exporter_url: str,
        max_bytes: int = DEFAULT_MAX_METRICS_BYTES,
        builder: type[Builder] = SnapshotBuilder,
        *,
        keep_text: bool = False,
    ) -> None:
        self._session = session
        self._builder = builder  # whose exposition: the exporter's, or an engine's own
        self._url = exporter_url.rstrip("/") + METRICS_PATH
        self._max_bytes = max_bytes
        self._during: list[Snapshot] = []
        self._keep_text = keep_text
        self.last_text = ""  # the last good scrape's text, when kept (to show the evidence)

    async def snapshot(self) -> Snapshot:
        url = self._url
        try:
            async with asyncio.timeout(SCRAPE_TIMEOUT_S), self._session.get(url) as response:
                if response.status != 200:
                    raise ProbeFailed(f"{url} answered {response.status}")
                check_declared(response, self._max_bytes)
                builder = self._builder()
                kept: list[str] = []
                async for line in lines(response.content, MAX_METRICS_LINE_BYTES, self._max_bytes):
                    text = _text(line)
                    builder.add(text)
                    if self._keep_text:
                        kept.append(text)
        except TooLarge as exc:
            raise ProbeFailed(f"{url}: {exc} (see --max-metrics-bytes)") from None
        except MalformedMetrics as exc:
            raise ProbeFailed(f"{url} is not Prometheus text: {exc}") from None
        except TimeoutError:
            raise ProbeFailed(f"{url} was not read within {SCRAPE_TIMEOUT_S:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ProbeFailed(f"cannot read {url}: {str(exc) or type(exc).__name__}") from None
        if self._keep_text:
            self.last_text = "".join(line + "\n" for line in kept)
        return builder.finish(time.monotonic())

    async def sample_gauges(self) -> None:
        """Scrape every second until cancelled; the gauges of a step are their mean."""
        self._during = []
        while True:
            await asyncio.sleep(GAUGE_INTERVAL_S)
            try:
                self._during.append(await self.snapshot())
            except ProbeFailed:
                continue  # one missed sample only thins the mean

    async def settle(self, before: Snapshot, answered: int, timeout_s: float = 10.0) -> Snapshot:
        """The first scrape that counts ``answered`` more requests than ``before``."""
        deadline = time.monotonic() + timeout_s
        while True:
            after = await self.snapshot()
            if after.requests - before.requests >= answered or time.monotonic() > deadline:
                return after
            if went_down(before, after):
                return after  # restarted: waiting would not make the difference right
            await asyncio.sleep(0.2)  # spans arrive in the worker's export batches

    def view(self, before: Snapshot, after: Snapshot) -> ServerStep:
        return step_view(before, after, self._during)


def _text(line: bytes) -> str:
    try:
        return line.decode()
    except UnicodeDecodeError:
        raise MalformedMetrics("a line is not UTF-8") from None
