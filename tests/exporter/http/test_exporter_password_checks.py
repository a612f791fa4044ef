"""bcrypt under attack, over real sockets: wrong-password floods are refused with 503
past a small pool of their own instead of queueing in front of the /metrics render, and
an unknown user costs the same bcrypt work as a known one with a wrong password."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path

import bcrypt
import pytest

from gpuscope.exporter.http.auth import AUTH, PASSWORD_CHECKS_PENDING
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.threads import ThreadPool
from support.exporter_fixtures import loopback_config
from support.raw_http import get_request, raw_exchange, status_of


def basic(user: str, password: str) -> dict[str, bytes]:
    return {"Authorization": b"Basic " + base64.b64encode(f"{user}:{password}".encode())}


async def exporter_with_user(tmp_path: Path, cost: int) -> RunningExporter:
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=cost)).decode()
    web_config = tmp_path / "web.yml"
    web_config.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    return await start_exporter(loopback_config(web_config_file=web_config))


@pytest.fixture
async def costly(tmp_path: Path) -> AsyncIterator[RunningExporter]:
    """Cost 12: about 0.2 s per check here, so a full pool stays busy for seconds."""
    exporter = await exporter_with_user(tmp_path, 12)
    try:
        yield exporter
    finally:
        await exporter.stop()


async def get_metrics(exporter: RunningExporter, headers: dict[str, bytes]) -> bytes:
    request = get_request("/metrics", headers)
    return await raw_exchange(exporter.host, exporter.port, request, timeout_s=60)


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_a_wrong_password_flood_is_refused_past_the_pool_and_scrapes_go_on(
    costly: RunningExporter,
) -> None:
    exporter = costly
    assert status_of(await get_metrics(exporter, basic("prom", "right"))) == 200  # now cached
    pool = exporter.app[AUTH].password_checks
    flood = [
        asyncio.ensure_future(get_metrics(exporter, basic("prom", f"wrong-{n}")))
        for n in range(PASSWORD_CHECKS_PENDING + 10)
    ]
    try:
        for _ in range(3000):  # until the pool has taken all it takes
            if pool.pending == PASSWORD_CHECKS_PENDING:
                break
            await asyncio.sleep(0.01)
        assert pool.pending == PASSWORD_CHECKS_PENDING
        scrape = await get_metrics(exporter, basic("prom", "right"))
        assert status_of(scrape) == 200 and b"gpuscope_build_info" in scrape
        # Served while the flood's checks still run: it waited behind none of them.
        assert pool.pending > 0
        answers = await asyncio.gather(*flood)
    finally:
        for request in flood:
            request.cancel()
    statuses = sorted(status_of(answer) for answer in answers)
    assert statuses == [401] * PASSWORD_CHECKS_PENDING + [503] * 10
    refused = [answer for answer in answers if status_of(answer) == 503]
    assert all(b"\r\nRetry-After: 1\r\n" in answer for answer in refused)


def pool_cpu_s(pool: ThreadPool) -> float:
    """CPU time the pool's threads have used, read from outside them."""
    return sum(
        time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0)) for thread in pool.threads
    )


async def bcrypt_work_of(exporter: RunningExporter, user: str, requests: int) -> float:
    pool = exporter.app[AUTH].password_checks
    before = pool_cpu_s(pool)
    for n in range(requests):
        assert status_of(await get_metrics(exporter, basic(user, f"guess-{n}"))) == 401
    return pool_cpu_s(pool) - before


async def test_an_unknown_user_costs_the_bcrypt_work_of_a_known_one(tmp_path: Path) -> None:
    """Before, an unknown user was refused without a bcrypt check (2 ms against 169 ms),
    which told an attacker which users exist. Work is compared as CPU time, which the
    load on the machine does not change much; the two must be alike."""
    exporter = await exporter_with_user(tmp_path, 10)
    try:
        known = await bcrypt_work_of(exporter, "prom", 5)
        unknown = await bcrypt_work_of(exporter, "nobody", 5)
    finally:
        await exporter.stop()
    assert 0.5 < unknown / known < 2, (unknown, known)
