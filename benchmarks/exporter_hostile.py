"""The exporter against hostile clients, as an outside attacker would try it.

Each case starts ``gpuscope exporter`` (no GPU) as a child process on 127.0.0.1 and
prints what it measured:

* ``slow-readers``: 2,000 request series, then 60 clients that ask for ``/metrics``
  and never read: the exporter's resident memory before, with them and after they
  leave; then 20 of them at ``--max-connections 20`` and five scrapes.
* ``big-requests``: small requests that decode into something large, each in a fresh
  process: status, peak resident memory over the idle process, and the slowest of the
  ``/healthz`` probes sent every 10 ms while the request was processed.
* ``shutdown``: SIGTERM 0.5 s into a request's 2-3 s decode, ``--shutdown-timeout-s 1``.
* ``auth-flood``: 50 and 150 clients sending wrong passwords (bcrypt cost 10) as fast
  as they are answered, while a scraper whose password is verified scrapes.
* ``enumeration``: 20 refusals of a known user's wrong password, 20 of an unknown user.
* ``forward``: a backend answering an endless body to the forwarder.
* ``accept``: 400 connections at once against 300 descriptors, plain and TLS (TLS
  clients that never begin their handshake); ``accept()`` failures logged, scrapes.
* ``span-scan`` (in-process, no exporter): the span count's walk of 20 MiB protobuf
  bodies of junk where the spans are listed, against protobuf's own decode of each.

    nice .venv/bin/python benchmarks/exporter_hostile.py [case ...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import json
import re
import signal
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import bcrypt
from aiohttp import web

from gpuscope.contract.exporter import FORWARD_SPANS_SENT
from gpuscope.contract.http import HEALTHZ_PATH, METRICS_PATH, TRACES_PATH

MIB = 1024 * 1024
SEC = 1.0


class Exporter:
    """A ``gpuscope exporter`` child process; its log is kept."""

    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process, self.url = process, url
        self.log: list[str] = []
        host_port = url.split("://", 1)[1]
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)

    def rss_mib(self, field: str = "VmRSS") -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None
        return int(found.group(1)) / 1024

    async def drain_log(self) -> None:
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            self.log.append(line.decode())


@contextlib.asynccontextmanager
async def exporter(*flags: str, fd_limit: int | None = None) -> AsyncIterator[Exporter]:
    argv = ["gpuscope", "exporter", "--listen", "127.0.0.1:0", "--gpu-source", "none", *flags]
    run = "runpy.run_module('gpuscope', run_name='__main__')"
    code = f"import sys, runpy; sys.argv = {argv!r}; {run}"
    if fd_limit is not None:
        limit = f"resource.setrlimit(resource.RLIMIT_NOFILE, ({fd_limit}, {fd_limit}))"
        code = f"import resource; {limit}; {code}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stderr=asyncio.subprocess.PIPE, cwd="/"
    )
    assert process.stderr is not None
    log: list[str] = []
    while True:
        line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
        if not line:
            raise RuntimeError("exporter exited:\n" + "".join(log))
        log.append(line)
        if found := re.search(r"serving on (\S+)", line):
            break
    running = Exporter(process, found.group(1))
    running.log = log
    draining = asyncio.create_task(running.drain_log())
    try:
        yield running
    finally:
        if process.returncode is None:
            process.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 30)
        if process.returncode is None:
            process.kill()
            await process.wait()
        draining.cancel()


def entry(field: int, payload: bytes = b"") -> bytes:
    length, size = bytearray(), len(payload)
    while True:
        length.append(size & 0x7F | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            return bytes([field << 3 | 2]) + bytes(length) + payload


def server_spans(models: int) -> bytes:
    """OTLP/JSON of one gpuscope server span per model, every phase, TTFT, TPOT."""
    phases = ("preprocess", "queue", "batch_wait", "compute", "postprocess")
    spans = []
    for number in range(models):
        attributes = [
            {"key": "gen_ai.request.model", "value": {"stringValue": f"model-{number}"}},
            {"key": "http.route", "value": {"stringValue": "/v1/completions"}},
            {"key": "http.response.status_code", "value": {"intValue": "200"}},
            {"key": "gpuscope.time_to_first_token", "value": {"doubleValue": 0.01}},
            {"key": "gpuscope.time_per_output_token", "value": {"doubleValue": 0.001}},
        ] + [
            {"key": f"gpuscope.{phase}.duration", "value": {"doubleValue": 0.001}}
            for phase in phases
        ]
        spans.append(
            {
                "traceId": f"{number + 1:032x}",
                "spanId": f"{number + 1:016x}",
                "name": "POST /v1/completions",
                "kind": 2,
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000000050000000",
                "attributes": attributes,
            }
        )
    document = {
        "resourceSpans": [{"scopeSpans": [{"scope": {"name": "gpuscope"}, "spans": spans}]}]
    }
    return json.dumps(document).encode()


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> int:
    async with session.post(url + TRACES_PATH, data=body, headers=headers) as response:
        await response.read()
        return response.status


async def never_reading(exporter: Exporter) -> socket.socket:
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, (exporter.host, exporter.port))
    client.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return client


async def timed_scrape(url: str, headers: dict[str, str] | None = None) -> tuple[int, float]:
    started = time.perf_counter()
    connector = aiohttp.TCPConnector(force_close=True)
    try:
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(url + METRICS_PATH, headers=headers or {}) as response,
        ):
            await response.read()
            return response.status, time.perf_counter() - started
    except aiohttp.ClientError as exc:
        return -1 if "Cannot connect" in str(exc) else -2, time.perf_counter() - started


async def slow_readers() -> None:
    print("== slow readers: clients that ask for /metrics and never read")
    body = server_spans(2000)
    json_headers = {"Content-Type": "application/json"}
    async with exporter() as running, aiohttp.ClientSession() as session:
        assert await post(session, running.url, body, json_headers) == 200
        async with session.get(running.url + METRICS_PATH) as response:
            size = len(await response.read())
        await asyncio.sleep(1)
        before = running.rss_mib()
        clients = [await never_reading(running) for _ in range(60)]
        await asyncio.sleep(5)
        held = running.rss_mib()
        for client in clients:
            client.close()
        await asyncio.sleep(3)
        after = running.rss_mib()
    each = (held - before) / 60
    print(f"  scrape {size / MIB:.1f} MiB; RSS before {before:.0f} MiB, with 60 such clients")
    print(f"    {held:.0f} MiB ({each:.2f} MiB each), after they left {after:.0f} MiB")
    async with exporter("--max-connections", "20") as running, aiohttp.ClientSession() as session:
        assert await post(session, running.url, body, json_headers) == 200
        clients = [await never_reading(running) for _ in range(20)]
        await asyncio.sleep(3)
        results = []
        for _ in range(5):
            results.append(await timed_scrape(running.url))
            await asyncio.sleep(1)
        for client in clients:
            client.close()
    statuses = Counter(status for status, _ in results)
    times = [t * 1000 for _, t in results]
    median, slowest = statistics.median(times), max(times)
    print(f"  --max-connections 20, 20 such clients: 5 scrapes {dict(statuses)},")
    print(f"    median {median:.0f} ms, max {slowest:.0f} ms")


async def probe_health(url: str, done: asyncio.Future[int]) -> float:
    """The slowest /healthz answer while ``done`` is pending (probes 10 ms apart)."""
    slowest = 0.0
    async with aiohttp.ClientSession() as session:
        while not done.done():
            started = time.perf_counter()
            async with session.get(url + HEALTHZ_PATH) as response:
                await response.read()
            slowest = max(slowest, time.perf_counter() - started)
            await asyncio.sleep(0.01)
    return slowest


def json_array_value(item: bytes, count: int) -> bytes:
    """OTLP/JSON of one span with one attribute whose array value holds ``count`` items."""
    head = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"k","value":'
    items = b",".join([item] * count)
    return head + b'{"arrayValue":{"values":[' + items + b"]}}}]}]}]}]}"


BIG: dict[str, tuple[Callable[[], bytes], str]] = {
    "a million empty JSON spans (2,982 B gzip)": (
        lambda: b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + b"{}," * 999_999 + b"{}]}]}]}",
        "application/json",
    ),
    "9 M empty protobuf spans (18 MB)": (
        lambda: entry(1, entry(2, entry(2) * 9_000_000)),
        "application/x-protobuf",
    ),
    "one span of 1 M empty attributes (protobuf)": (
        lambda: entry(1, entry(2, entry(2, entry(9) * 1_000_000))),
        "application/x-protobuf",
    ),
    "one span of 10 M empty events (protobuf, 20 MB)": (
        lambda: entry(1, entry(2, entry(2, entry(11) * 10_000_000))),
        "application/x-protobuf",
    ),
    "one attribute of 10 M empty array values (protobuf, 20 MB)": (
        lambda: entry(
            1,
            entry(
                2, entry(2, entry(9, entry(1, b"k") + entry(2, entry(5, entry(1) * 10_000_000))))
            ),
        ),
        "application/x-protobuf",
    ),
    "7 M empty JSON events in one span (20 MB)": (
        lambda: (
            b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"events":['
            + b"{}," * 6_900_000
            + b"{}]}]}]}]}"
        ),
        "application/json",
    ),
    "6.9 M empty JSON arrays in an attribute value (20 MB)": (
        lambda: json_array_value(b"[]", 6_900_000),
        "application/json",
    ),
    "a million JSON arrays in an attribute value (3 MB, the value cap)": (
        lambda: json_array_value(b"[]", 999_980),
        "application/json",
    ),
    "6.9 M empty JSON strings in an attribute value (20 MB)": (
        lambda: json_array_value(b'""', 6_900_000),
        "application/json",
    ),
    "4 M two-letter JSON strings in an attribute value (20 MB)": (
        lambda: json_array_value(b'"ab"', 4_000_000),
        "application/json",
    ),
    "5 M JSON numbers in an attribute value (20 MB)": (
        lambda: json_array_value(b"1.5", 5_000_000),
        "application/json",
    ),
    "15,000 spans in the contract (OTLP/JSON, 6 MB, 750,000 values)": (
        lambda: server_spans(15_000),
        "application/json",
    ),
}


async def big_requests() -> None:
    print("== big requests: each in a fresh exporter (defaults), sent gzipped")
    for name, (make, media) in BIG.items():
        raw = make()
        body = gzip.compress(raw, compresslevel=1)
        del raw
        async with exporter() as running, aiohttp.ClientSession() as session:
            await asyncio.sleep(0.5)
            idle_peak = running.rss_mib("VmHWM")
            started = time.perf_counter()
            headers = {"Content-Type": media, "Content-Encoding": "gzip"}
            sending = asyncio.ensure_future(post(session, running.url, body, headers))
            slowest = await probe_health(running.url, sending)
            status, took = await sending, time.perf_counter() - started
            peak = running.rss_mib("VmHWM") - idle_peak
        print(f"  {name}: {status} in {took:.2f} s, {len(body):,} B sent;")
        print(f"    peak RSS +{peak:.0f} MiB; slowest /healthz meanwhile {slowest * 1000:.0f} ms")


async def shutdown() -> None:
    print("== SIGTERM during a long decode (--shutdown-timeout-s 1)")
    body = gzip.compress(server_spans(15_000), compresslevel=1)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with exporter("--shutdown-timeout-s", "1") as running, aiohttp.ClientSession() as session:
        sending = asyncio.ensure_future(post(session, running.url, body, headers))
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        running.process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(running.process.wait(), 60)
        took = time.perf_counter() - started
        status = await sending
    print(f"  the request: {status}; exit {code} {took:.2f} s after SIGTERM")


async def with_users(cost: int, body: Callable[[Exporter, Path], Awaitable[None]]) -> None:
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=cost)).decode()
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "web.yml"
        config.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
        async with exporter("--web-config-file", str(config)) as running:
            await body(running, config)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def auth_flood() -> None:
    print("== wrong-password floods (bcrypt cost 10), an authenticated scraper")

    async def flood(running: Exporter, attackers: int) -> None:
        stop = asyncio.Event()
        answers: Counter[int] = Counter()

        async def attack(number: int) -> None:
            async with aiohttp.ClientSession() as session:
                while not stop.is_set():
                    headers = basic("prom", f"wrong-{number}")
                    async with session.get(running.url + METRICS_PATH, headers=headers) as answer:
                        await answer.read()
                        answers[answer.status] += 1

        assert (await timed_scrape(running.url, basic("prom", "right")))[0] == 200
        tasks = [asyncio.ensure_future(attack(n)) for n in range(attackers)]
        await asyncio.sleep(2)
        times = []
        for _ in range(10):
            status, took = await timed_scrape(running.url, basic("prom", "right"))
            assert status == 200, status
            times.append(took * 1000)
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        median, slowest = statistics.median(times), max(times)
        print(f"  {attackers} attackers: 10 scrapes median {median:.0f} ms, max {slowest:.0f} ms;")
        print(f"    attackers answered {dict(sorted(answers.items()))}")

    async def both(running: Exporter, _: Path) -> None:
        for attackers in (50, 150):
            await flood(running, attackers)

    await with_users(10, both)


async def enumeration() -> None:
    print("== user enumeration by timing (bcrypt cost 10), 20 refusals each, interleaved")

    async def measure(running: Exporter, _: Path) -> None:
        times: dict[str, list[float]] = {"known user": [], "unknown user": []}
        for number in range(20):
            for label, user in (("known user", "prom"), ("unknown user", "nobody")):
                status, took = await timed_scrape(running.url, basic(user, f"guess-{number}"))
                assert status == 401
                times[label].append(took * 1000)
        for label, values in times.items():
            median, low, high = statistics.median(values), min(values), max(values)
            print(f"  {label}: median {median:.0f} ms (min {low:.0f}, max {high:.0f})")
        known, unknown = times["known user"], times["unknown user"]
        faster = sum(t < min(known) for t in unknown)
        print(f"  unknown users refused faster than the fastest known one: {faster} of 20")

    await with_users(10, measure)


async def forward() -> None:
    print("== the forwarder against a backend answering an endless body")
    sent = [0]

    async def endless(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"\0" * MIB
        with contextlib.suppress(ConnectionError):
            while True:
                await response.write(chunk)
                sent[0] += len(chunk)
        return response

    app = web.Application()
    app.router.add_post(TRACES_PATH, endless)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    backend = f"http://127.0.0.1:{runner.addresses[0][1]}{TRACES_PATH}"
    try:
        async with (
            exporter("--forward-otlp", backend) as running,
            aiohttp.ClientSession() as session,
        ):
            await asyncio.sleep(0.5)
            idle = running.rss_mib("VmHWM")
            headers = {"Content-Type": "application/json"}
            assert await post(session, running.url, server_spans(10), headers) == 200
            await asyncio.sleep(5)
            text = await (await session.get(running.url + METRICS_PATH)).text()
            peak = running.rss_mib("VmHWM") - idle
        forwarded = re.search(rf"^{FORWARD_SPANS_SENT.sample_name} (\S+)", text, re.M)
        spans = forwarded and forwarded.group(1)
        print(f"  backend sent {sent[0] / MIB:.0f} MiB before the exporter hung up;")
        print(f"    exporter peak RSS +{peak:.0f} MiB; spans forwarded: {spans}")
    finally:
        await runner.cleanup()


async def accept() -> None:
    print("== 400 connections at once against 300 descriptors (--max-connections 1000)")
    with tempfile.TemporaryDirectory() as folder:
        cert, key = Path(folder) / "c.crt", Path(folder) / "c.key"
        openssl = await asyncio.create_subprocess_exec(
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert await openssl.wait() == 0
        config = Path(folder) / "web.yml"
        config.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
        for label, flags in (("plain", ()), ("TLS", ("--web-config-file", str(config)))):
            async with exporter(
                "--max-connections", "1000", "--header-timeout-s", "60", "--idle-timeout-s", "60",
                *flags, fd_limit=300,
            ) as running:  # fmt: skip
                held = await asyncio.gather(
                    *(asyncio.open_connection(running.host, running.port) for _ in range(400)),
                    return_exceptions=True,
                )
                trust = ssl.create_default_context(cafile=str(cert))
                results: list[int | str] = []
                for _ in range(5):
                    connector = aiohttp.TCPConnector(force_close=True, ssl=trust)
                    try:
                        async with (
                            aiohttp.ClientSession(connector=connector) as session,
                            session.get(running.url + METRICS_PATH) as response,
                        ):
                            await response.read()
                            results.append(response.status)
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        results.append(type(exc).__name__)
                for item in held:
                    if isinstance(item, tuple):
                        item[1].close()
                await asyncio.sleep(0.5)
                failures = [line for line in running.log if "accepting connections fails" in line]
                counted = sum(
                    1 + int(m.group(1))
                    for line in failures
                    if (m := re.search(r"\((\d+) more", line))
                )
            # each line counts itself and the failures it kept quiet before it
            print(f"  {label}: scrapes {results}; accept() failures logged: {len(failures)}")
            print(f"    lines, standing for at least {counted} failures")


def _length_delimited(field: int, payload: bytes) -> bytes:
    size, length = len(payload), bytearray()
    while size > 0x7F:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return bytes([field << 3 | 2]) + bytes(length) + payload


async def span_scan() -> None:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from gpuscope.exporter.ingest.otlp import OtlpError
    from gpuscope.exporter.ingest.otlp_counts import check_protobuf_spans

    half = 10 << 20  # 20 MiB bodies, the default --max-decompressed-bytes

    def in_a_scope(junk: bytes) -> bytes:
        return _length_delimited(1, _length_delimited(2, junk))

    bodies = {
        "nested groups": b"\x0b" * half + b"\x0c" * half,
        "flat empty groups": b"\x0b\x0c" * half,
        "one group of tiny varints": b"\x0b" + b"\x08\x00" * (half - 1) + b"\x0c",
        "tiny unknown varints": b"\x08\x00" * half,
        "tiny unknown fields in a scope": in_a_scope(b"\x1a\x00" * (half - 8)),
        "ten-byte varints": (b"\x08" + b"\xff" * 9 + b"\x01") * (2 * half // 11),
        "five-byte tags": b"\x88\x80\x80\x80\x00\x00" * (2 * half // 6),
        "empty spans over the cap": in_a_scope(b"\x12\x00" * (half - 8)),
    }
    print("span-scan: CPU s of the walk (default caps) and of protobuf's decode, 20 MiB each")
    for name, body in bodies.items():
        started = time.process_time()
        try:
            check_protobuf_spans(body, 100_000)
            verdict = "counted"
        except OtlpError as refused:
            verdict = f"{refused.status} {refused.reason}"
        walk_s = time.process_time() - started
        started = time.process_time()
        try:
            ExportTraceServiceRequest.FromString(body)
            decoded = "decoded"
        except DecodeError:
            decoded = "refused"
        decode_s = time.process_time() - started
        walk = f"walk {walk_s:6.3f} s ({verdict:24})"
        print(f"  {name:32} {walk} protobuf {decode_s:6.3f} s ({decoded})")


CASES = {
    "slow-readers": slow_readers,
    "big-requests": big_requests,
    "shutdown": shutdown,
    "auth-flood": auth_flood,
    "enumeration": enumeration,
    "forward": forward,
    "accept": accept,
    "span-scan": span_scan,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"some of {', '.join(CASES)} (default: all)")
    chosen = parser.parse_args().cases or list(CASES)
    unknown = set(chosen) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")
    for case in chosen:
        asyncio.run(CASES[case]())


if __name__ == "__main__":
    main()
