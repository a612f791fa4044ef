"""A real Prometheus and a real Alertmanager (Debian's binaries) on free loopback ports.

Neither binary can bind port 0 and report the port back, so a free port is picked
and handed over; when another process takes it in between, the daemon exits with
"address already in use" and is started again on a fresh port (a few tries).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from support.binaries import require_binary
from support.waiting import await_until

START_TRIES = 5
READY_TIMEOUT_S = 20.0


class PortTaken(Exception):
    """The daemon lost the race for its port; try another one."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


async def _wait_ready(process: asyncio.subprocess.Process, base: str, name: str, log: Path) -> None:
    """Poll ``/-/ready`` (another process: nothing else to wait on) until 200 or exit."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            if process.returncode is not None:
                text = _tail(log)
                if "address already in use" in text:
                    raise PortTaken(base)
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{text}")
            try:
                async with session.get(base + "/-/ready") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become ready within {READY_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.1)


@asynccontextmanager
async def run_daemon(
    name: str, args_for_port: Callable[[int], Sequence[str]], log: Path
) -> AsyncIterator[str]:
    """Run binary ``name`` with ``args_for_port(port)`` until ready; yields its base URL."""
    binary = require_binary(name)
    for _ in range(START_TRIES):
        port = _free_port()
        with log.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                binary, *args_for_port(port), stdout=log_file, stderr=log_file
            )
        base = f"http://127.0.0.1:{port}"
        try:
            await _wait_ready(process, base, name, log)
        except PortTaken:
            await process.wait()
            continue
        except BaseException:
            await _stop(process)
            raise
        try:
            yield base
        finally:
            await _stop(process)
        return
    raise RuntimeError(f"{name}: every port tried was taken ({START_TRIES} tries)")


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
    await asyncio.wait_for(process.wait(), 10)


def prometheus_config(
    targets: Sequence[str],
    *,
    scrape_interval: str = "500ms",
    evaluation_interval: str | None = None,
    rule_files: Sequence[Path] = (),
    alertmanager: str | None = None,
    job: str = "gpuscope",
    more_jobs: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The text of a prometheus.yml scraping ``targets`` (``host:port``) as ``job``, and
    each of ``more_jobs`` (job name -> targets) likewise."""
    lines = [
        f"global: {{scrape_interval: {scrape_interval}, scrape_timeout: {scrape_interval}, "
        f"evaluation_interval: {evaluation_interval or scrape_interval}}}",
        "scrape_configs:",
    ]
    for name, listed in {job: targets, **(more_jobs or {})}.items():
        quoted = ", ".join(f"'{target}'" for target in listed)
        lines += [f"  - job_name: {name}", f"    static_configs: [{{targets: [{quoted}]}}]"]
    if rule_files:
        lines += ["rule_files:", *(f"  - '{path}'" for path in rule_files)]
    if alertmanager is not None:
        host = alertmanager.removeprefix("http://")
        lines += [
            "alerting:",
            f"  alertmanagers: [{{static_configs: [{{targets: ['{host}']}}]}}]",
        ]
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def run_prometheus(
    targets: Sequence[str],
    workdir: Path,
    scrape_interval: str = "500ms",
    *,
    evaluation_interval: str | None = None,
    rule_files: Sequence[Path] = (),
    alertmanager: str | None = None,
    job: str = "gpuscope",
    more_jobs: Mapping[str, Sequence[str]] | None = None,
) -> AsyncIterator[str]:
    """Start Prometheus scraping ``targets`` (``host:port``) as ``job``, and ``more_jobs``
    (job name -> targets); yields its base URL.

    ``rule_files`` are loaded and evaluated every ``evaluation_interval`` (default:
    the scrape interval); alerts go to the Alertmanager at ``alertmanager`` (a URL).
    Exemplar storage is on.
    """
    config = workdir / "prometheus.yml"
    config.write_text(
        prometheus_config(
            targets,
            scrape_interval=scrape_interval,
            evaluation_interval=evaluation_interval,
            rule_files=rule_files,
            alertmanager=alertmanager,
            job=job,
            more_jobs=more_jobs,
        )
    )

    def args(port: int) -> list[str]:
        return [
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ]

    async with run_daemon("prometheus", args, workdir / "prometheus.log") as base:
        yield base


@asynccontextmanager
async def run_alertmanager(config: Path, workdir: Path) -> AsyncIterator[str]:
    """Start Alertmanager with ``config``, clustering off, storage in ``workdir``."""

    def args(port: int) -> list[str]:
        return [
            f"--config.file={config}",
            f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ]

    async with run_daemon("prometheus-alertmanager", args, workdir / "alertmanager.log") as base:
        yield base


async def instant_query(session: aiohttp.ClientSession, base: str, query: str) -> list[Any]:
    """The result vector of an instant query; fails the test on a query error."""
    async with session.get(base + "/api/v1/query", params={"query": query}) as response:
        body = await response.json()
    assert body["status"] == "success", f"{query}\n{body}"
    result: list[Any] = body["data"]["result"]
    return result


async def wait_for_result(
    session: aiohttp.ClientSession, base: str, query: str, timeout_s: float = 30
) -> list[Any]:
    """Poll an instant query until it returns a non-empty vector; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await instant_query(session, base, query)
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"no data after {timeout_s:.0f} s for:\n{query}")
        await asyncio.sleep(0.2)


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


async def rules_evaluated_since(session: aiohttp.ClientSession, base: str, since: float) -> bool:
    """Whether every rule group has been evaluated twice at or after the Unix time
    ``since``: its last evaluation is one interval or more past it (so the one before
    it is past it too)."""
    async with session.get(base + "/api/v1/rules") as response:
        body = await response.json()
    groups = body["data"]["groups"]
    return bool(groups) and all(
        datetime.fromisoformat(group["lastEvaluation"]).timestamp() >= since + group["interval"]
        for group in groups
    )


async def wait_for_evaluations(
    session: aiohttp.ClientSession, base: str, since: float, timeout_s: float = 30
) -> None:
    """Until every rule group has evaluated twice over what was scraped by ``since``
    (a Unix time), polling Prometheus' rules API."""
    await await_until(
        lambda: rules_evaluated_since(session, base, since),
        f"two evaluations of every rule group after {since:.1f}",
        timeout_s,
        0.1,
    )
