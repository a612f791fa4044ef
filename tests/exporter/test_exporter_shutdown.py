"""SIGTERM to a real ``gpuscope exporter`` process: uploads in flight get an answer
(200 when their body arrives within --shutdown-timeout-s, else 503), and an exporter
with nothing in flight exits at once instead of waiting out the timeout."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import signal
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from support.exporter_fixtures import SpanFactory, encode
from support.raw_http import post_request, status_of

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

BODY = encode([SpanFactory().server(0.01)]).SerializeToString()


class ExporterProcess:
    def __init__(self, process: asyncio.subprocess.Process, host: str, port: int) -> None:
        self.process, self.host, self.port = process, host, port

    async def upload_head(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A POST whose headers and first half of the body are sent, the rest held back."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
            + BODY[: len(BODY) // 2]
        )
        await writer.drain()
        return reader, writer

    async def logged(self, text: str) -> None:
        """Read the exporter's log until a line holds ``text``."""
        assert self.process.stderr is not None
        while True:
            line = (await asyncio.wait_for(self.process.stderr.readline(), 30)).decode()
            assert line, f"the exporter exited before it logged {text!r}"
            if text in line:
                return

    async def terminate_and_time(self) -> float:
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(self.process.wait(), 60) == 0
        return time.monotonic() - started


@pytest.fixture
async def exporter_process(request: pytest.FixtureRequest) -> AsyncIterator[ExporterProcess]:
    shutdown_timeout = getattr(request, "param", "2")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscope", "exporter", "--listen", "127.0.0.1:0",
        "--gpu-source", "none", "--shutdown-timeout-s", shutdown_timeout,
        stderr=asyncio.subprocess.PIPE,
        cwd="/",  # away from the repository's own gpuscope/ folder
    )  # fmt: skip
    assert process.stderr is not None
    try:
        found = None
        while found is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "exporter exited before serving"
            found = re.search(r"serving on http://([\d.]+):(\d+)", line)
        yield ExporterProcess(process, found.group(1), int(found.group(2)))
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def wait_in_flight(exporter: ExporterProcess, count: int) -> None:
    """Until the exporter reports ``count`` requests being handled."""
    url = f"http://{exporter.host}:{exporter.port}/metrics"
    pattern = re.compile(r'^gpuscope_http_connections\{state="busy"\} (\S+)$', re.M)
    async with aiohttp.ClientSession() as session:
        for _ in range(3000):
            async with session.get(url) as response:
                found = pattern.search(await response.text())
            # the scrape itself is one of the busy requests
            if found and float(found.group(1)) >= count + 1:
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"{count} requests never got in flight")


async def test_sigterm_lets_an_upload_finish_and_answers_a_stalled_one_503(
    exporter_process: ExporterProcess,
) -> None:
    finishing = await exporter_process.upload_head()
    stalled = await exporter_process.upload_head()
    await wait_in_flight(exporter_process, 2)
    exporter_process.process.send_signal(signal.SIGTERM)
    await exporter_process.logged("shutting down")  # the rest of one body arrives now
    finishing[1].write(BODY[len(BODY) // 2 :])
    answers = [await asyncio.wait_for(reader.read(), 30) for reader, _ in (finishing, stalled)]
    for _, writer in (finishing, stalled):
        writer.close()
    assert status_of(answers[0]) == 200, answers[0]
    assert status_of(answers[1]) == 503 and b"Retry-After: 1" in answers[1], answers[1]
    assert await asyncio.wait_for(exporter_process.process.wait(), 30) == 0


@pytest.mark.parametrize("exporter_process", ["30"], indirect=True)
async def test_sigterm_with_nothing_in_flight_exits_without_waiting_the_timeout(
    exporter_process: ExporterProcess,
) -> None:
    url = f"http://{exporter_process.host}:{exporter_process.port}/healthz"
    async with aiohttp.ClientSession() as session:  # its connection stays open, idle
        async with session.get(url) as response:
            assert response.status == 200
        elapsed = await exporter_process.terminate_and_time()
    assert elapsed < 15  # far below the 30 s --shutdown-timeout


def slow_to_decode() -> bytes:
    """Gzipped OTLP/JSON of 30,000 spans (11 MiB, 900,000 JSON values, under the cap):
    about 2 s of protobuf's JSON mapping here, far more than the 0.3 s shutdown timeout
    of the test below."""
    span = {
        "traceId": "0" * 31 + "1",
        "spanId": "0" * 15 + "1",
        "name": "x",
        "kind": 2,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": [{"key": f"k{n}", "value": {"intValue": "1"}} for n in range(5)],
    }
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [span] * 30_000}]}]}
    return gzip.compress(json.dumps(document).encode(), compresslevel=1)


@pytest.mark.parametrize("exporter_process", ["0.3"], indirect=True)
async def test_sigterm_during_a_long_decode_answers_503_and_exits_within_the_timeout(
    exporter_process: ExporterProcess,
) -> None:
    """Before, decoding ran on the event loop: SIGTERM waited for it (9.5 s with a 2 s
    timeout) and the request was then answered 200."""
    body = slow_to_decode()
    head = post_request(
        "/v1/traces",
        body,
        {"Content-Type": b"application/json", "Content-Encoding": b"gzip"},
    )
    reader, writer = await asyncio.open_connection(exporter_process.host, exporter_process.port)
    writer.write(head)
    await wait_in_flight(exporter_process, 1)
    elapsed = await exporter_process.terminate_and_time()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert status_of(answer) == 503 and b"Retry-After: 1" in answer, answer[:200]
    assert elapsed < 15  # bounded by the 0.3 s timeout and the last answers, not the decode
