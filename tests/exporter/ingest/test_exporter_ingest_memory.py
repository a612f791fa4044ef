"""Bodies waiting for the ingest thread hold memory: ``--max-ingest-bytes`` bounds it
across every request, each body counted at its declared length from before it is read.
Past it a sender is answered 429 with Retry-After (the OpenTelemetry SDK retries that),
and counted, while the exporter's memory stays where the Kubernetes limit expects it."""

from __future__ import annotations

import asyncio
import re

import aiohttp

from gpuscope.contract.http import TRACES_PATH
from gpuscope.exporter.service import start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import loopback_config
from support.waiting import await_until

MIB = 2**20


async def _slow_upload(host: str, port: int, size: int) -> asyncio.StreamWriter:
    """An upload that declares ``size`` bytes and sends a few of them: it holds its share."""
    _, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"POST {TRACES_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {size}\r\n\r\n".encode()
        + b"\x0a" * 16
    )
    await writer.drain()
    return writer


async def test_bodies_past_the_ingest_budget_are_answered_429_and_counted() -> None:
    exporter = await start_exporter(
        loopback_config(max_ingest_bytes=4 * MIB, max_body_bytes=2 * MIB, body_timeout_s=30)
    )
    held: list[asyncio.StreamWriter] = []
    try:
        # two slow uploads of 2 MiB each take the whole 4 MiB budget
        held = [await _slow_upload(exporter.host, exporter.port, 2 * MIB) for _ in range(2)]
        memory = exporter.app[STATE].ingest.memory
        await await_until(lambda: memory.held == 4 * MIB, "both slow uploads holding 2 MiB")
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{exporter.url}{TRACES_PATH}",
                data=b"\x00" * MIB,
                headers={"Content-Type": "application/x-protobuf"},
            ) as answer:
                status, retry_after = answer.status, answer.headers.get("Retry-After")
            async with session.get(f"{exporter.url}/metrics") as scrape:
                metrics = await scrape.text()
        assert (status, retry_after) == (429, "1")
        full = re.search(
            r'^gpuscope_otlp_requests_rejected_total\{reason="ingest_memory_full"\} (\S+)$',
            metrics,
            re.M,
        )
        assert full is not None and float(full.group(1)) == 1
        for writer in held:  # the budget comes back when the slow uploads go away
            writer.close()
        held = []
        await await_until(lambda: memory.held == 0, "the slow uploads' budget given back")
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{exporter.url}{TRACES_PATH}",
                data=b"",
                headers={"Content-Type": "application/x-protobuf"},
            ) as answer,
        ):
            assert answer.status == 200
    finally:
        for writer in held:
            writer.close()
        await exporter.stop()
