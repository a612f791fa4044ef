"""Web-config files and requests for the reload tests: users with fast hashes, basic
auth headers, a scrape's status, and waiting for the watcher."""

from __future__ import annotations

import asyncio
import base64

import bcrypt

from gpuscope.exporter.service import RunningExporter
from support.raw_http import get_request, raw_exchange, status_of


def users(**passwords: str) -> str:
    """A web config's basic_auth_users section (cost 4, so checks are fast)."""
    lines = ["basic_auth_users:"]
    for user, password in passwords.items():
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        lines.append(f"  {user}: '{hashed}'")
    return "\n".join(lines) + "\n"


def basic(user: str, password: str) -> dict[str, bytes]:
    return {"Authorization": b"Basic " + base64.b64encode(f"{user}:{password}".encode())}


async def metrics_status(exporter: RunningExporter, headers: dict[str, bytes]) -> int:
    answer = await raw_exchange(exporter.host, exporter.port, get_request("/metrics", headers))
    return status_of(answer)


async def until_reloaded(exporter: RunningExporter, count: int, *, applied: bool = True) -> None:
    """Until the watcher has read a changed file ``count`` times, applied or not."""
    files = exporter.credentials
    for _ in range(3000):
        if (files.reloads if applied else files.refusals) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the changed file was never read again")
