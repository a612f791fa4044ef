"""Driving an ASGI app in-process with hand-written messages."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gpuscope.middleware.types import ASGIApp, Message


def http_scope(
    path: str = "/", method: str = "GET", headers: Sequence[tuple[bytes, bytes]] = ()
) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": list(headers),
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def call(app: ASGIApp, scope: dict[str, Any], body: bytes = b"") -> list[Message]:
    """Send one request body; return every message the app sent."""
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # a client that stays connected: never disconnects
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent
