"""A real Prometheus (Debian's binary) on a free loopback port, scraping given targets."""

from __future__ import annotations

import asyncio
import socket
import time
from asyncio.subprocess import DEVNULL
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from support.binaries import require_binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def run_prometheus(
    targets: Sequence[str], workdir: Path, scrape_interval: str = "500ms"
) -> AsyncIterator[str]:
    """Start Prometheus scraping ``targets`` (``host:port``); yields its base URL."""
    prometheus = require_binary("prometheus")
    config = workdir / "prometheus.yml"
    listed = ", ".join(f"'{target}'" for target in targets)
    config.write_text(
        f"global: {{scrape_interval: {scrape_interval}, scrape_timeout: {scrape_interval}}}\n"
        "scrape_configs:\n"
        "  - job_name: gpuscope\n"
        f"    static_configs: [{{targets: [{listed}]}}]\n"
    )
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        prometheus,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--enable-feature=exemplar-storage",
        stdout=DEVNULL,
        stderr=DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 15
            while True:  # another process: nothing to wait on but its API
                try:
                    async with session.get(base + "/-/ready") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("Prometheus did not become ready within 15 s")
                await asyncio.sleep(0.1)
        yield base
    finally:
        process.kill()
        await asyncio.wait_for(process.wait(), 10)


async def instant_query(session: aiohttp.ClientSession, base: str, query: str) -> list[Any]:
    """The result vector of an instant query; fails the test on a query error."""
    async with session.get(base + "/api/v1/query", params={"query": query}) as response:
        body = await response.json()
    assert body["status"] == "success", f"{query}\n{body}"
    result: list[Any] = body["data"]["result"]
    return result


async def scrapes_done(session: aiohttp.ClientSession, base: str) -> int:
    """How many scrapes of the first target Prometheus has completed so far."""
    result = await instant_query(session, base, "count_over_time(up[10m])")
    return int(float(result[0]["value"][1])) if result else 0


async def wait_for_scrapes(
    session: aiohttp.ClientSession, base: str, count: int, timeout_s: float = 30
) -> None:
    """Until Prometheus has completed ``count`` scrapes (polling its API)."""
    for _ in range(int(timeout_s / 0.1)):
        if await scrapes_done(session, base) >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"Prometheus did not complete {count} scrapes in {timeout_s} s")
