"""vLLM's ``/metrics`` replayed for the pack's Prometheus: the text the real engine served
(``tests/fixtures/vllm-0.32.0/metrics.txt``, captured by the real-engine script), its
counters and histograms growing with time, so that rates are those of the capture's
totals per second and every ratio (a mean, a share) stays the capture's.

    async with run_vllm_replay() as url:   # http://127.0.0.1:PORT, serving /metrics
        ...
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from support.servers import serve_aiohttp

CAPTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0" / "metrics.txt"
TYPE = re.compile(r"^# TYPE (\S+) (\w+)$")
SAMPLE = re.compile(r"^(\S+?)(\{.*\})? (\S+)$")
GROWING = {"counter", "histogram"}


def scaled(text: str, factor: float) -> str:
    """``text`` (Prometheus text format) with every counter and histogram sample times
    ``factor``; gauges (``_created`` ones included) as they are."""
    lines, kind = [], ""
    for line in text.splitlines():
        if match := TYPE.match(line):
            kind = match.group(2)
        elif kind in GROWING and (sample := SAMPLE.match(line)):
            name, labels, value = sample.groups()
            line = f"{name}{labels or ''} {float(value) * factor!r}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def run_vllm_replay(capture: Path = CAPTURE) -> AsyncIterator[str]:
    """Serve ``capture`` on ``/metrics`` of a loopback port, counters times (1 + seconds
    since the start); yields the base URL."""
    text = await asyncio.to_thread(capture.read_text)
    started = time.monotonic()

    async def metrics(request: web.Request) -> web.Response:
        factor = 1.0 + (time.monotonic() - started)
        return web.Response(text=scaled(text, factor), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serve_aiohttp(app, access_log=None) as url:
        yield url
