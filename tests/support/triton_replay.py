"""Triton's ``/metrics`` replayed for a real Prometheus: the expositions ``make
triton-check`` captured from the running server (``tests/fixtures/triton-2.51/
metrics-<n>.txt``: before, during and after the load), served one after the other,
each for a few scrapes, the last one from then on. Rates over a window that holds the
whole replay are then the capture's increases, so every ratio the rules record (a mean,
a share, a batch size) is the live run's.

    async with run_triton_replay() as url:   # http://127.0.0.1:PORT, serving /metrics
        ...
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from support.servers import serve_aiohttp

FIXTURES = Path(__file__).parents[1] / "fixtures" / "triton-2.51"
SCRAPES_EACH = 3


def captures(folder: Path = FIXTURES) -> list[str]:
    paths = sorted(folder.glob("metrics-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    return [path.read_text() for path in paths]


def truth(folder: Path = FIXTURES) -> dict[str, Any]:
    """What the models logged and the client saw in that run, per model."""
    loaded: dict[str, Any] = json.loads((folder / "truth.json").read_text())
    return loaded


@asynccontextmanager
async def run_triton_replay(folder: Path = FIXTURES) -> AsyncIterator[str]:
    """Serve the captures in order on ``/metrics`` of a loopback port; yields the base URL."""
    texts = await asyncio.to_thread(captures, folder)
    scrapes = 0

    async def metrics(request: web.Request) -> web.Response:
        nonlocal scrapes
        text = texts[min(scrapes // SCRAPES_EACH, len(texts) - 1)]
        scrapes += 1
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serve_aiohttp(app, access_log=None) as url:
        yield url
