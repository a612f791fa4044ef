"""Slow uploaders holding every connection slot: do scrapes still get /metrics?

Run it as a script::

    nice .venv/bin/python benchmarks/exporter_slow_uploads.py [--connections 20]
        [--uploaders 20] [--body-timeout-s 30] [--scrapes 5]

The exporter runs in this process with ``--max-connections`` = ``--connections``.
Each uploader sends a valid ``POST /v1/traces`` head announcing 1,000 bytes, then one
byte a second, and connects again as soon as it is answered (as a hostile client
would). After 3 s, ``--scrapes`` scrapes one second apart, each on a new connection.
Printed: the scrape statuses and latencies, and the uploads' answers by status.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter

import aiohttp

from gpuscope.contract.http import METRICS_PATH
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.source import GpuSourceKind
from gpuscope.exporter.service import start_exporter

HEAD = (
    b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
    b"Content-Length: 1000\r\n\r\n"
)


async def _trickle(writer: asyncio.StreamWriter) -> None:
    for _ in range(999):
        writer.write(b"x")
        await writer.drain()
        await asyncio.sleep(1.0)


async def _upload_once(host: str, port: int) -> int:
    """The status of one slow upload's answer (0: closed without one)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(HEAD)
    trickling = asyncio.ensure_future(_trickle(writer))
    try:
        line = await asyncio.wait_for(reader.readline(), 1200)
        return int(line.split()[1]) if line else 0
    finally:
        trickling.cancel()
        writer.close()


async def _uploader(host: str, port: int, answers: Counter[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            answers[await _upload_once(host, port)] += 1
        except (ConnectionError, TimeoutError):
            answers[-1] += 1


async def _scrapes(url: str, count: int) -> list[tuple[int, float]]:
    results = []
    for _ in range(count):
        started = time.perf_counter()
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            await response.read()
            results.append((response.status, (time.perf_counter() - started) * 1000))
        await asyncio.sleep(1.0)
    return results


async def run(args: argparse.Namespace) -> None:
    config = ExporterConfig(
        listen="127.0.0.1:0",
        gpu_source=GpuSourceKind.NONE,
        max_connections=args.connections,
        body_timeout_s=args.body_timeout_s,
    )
    exporter = await start_exporter(config)
    stop, answers = asyncio.Event(), Counter[int]()
    uploaders = [
        asyncio.ensure_future(_uploader(exporter.host, exporter.port, answers, stop))
        for _ in range(args.uploaders)
    ]
    try:
        await asyncio.sleep(3.0)
        scrapes = await _scrapes(exporter.url + METRICS_PATH, args.scrapes)
    finally:
        stop.set()
        for task in uploaders:
            task.cancel()
        await asyncio.gather(*uploaders, return_exceptions=True)
        await exporter.stop()
    latencies = [ms for _, ms in scrapes]
    print(f"scrape statuses: {[status for status, _ in scrapes]}")
    print(
        f"scrape ms: median {statistics.median(latencies):.1f}, "
        f"min {min(latencies):.1f}, max {max(latencies):.1f}"
    )
    print(f"upload answers by status: {dict(sorted(answers.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--uploaders", type=int, default=20)
    parser.add_argument("--body-timeout-s", type=float, default=30.0)
    parser.add_argument("--scrapes", type=int, default=5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
