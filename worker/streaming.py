"""Client disconnects and Server-Sent Events, as plain ASGI.

Starlette's ``StreamingResponse`` watches for disconnects only on older ASGI spec
versions; the worker needs to know at once on every server, to free the slot of a
sequence nobody reads, so it watches ``receive`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gpuscope.middleware import RequestTimeline

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ``ClientDisconnected``.

    Call only once the request body has been read: this consumes ``receive``.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
    # Decided by what finished first, not by the state of ``task`` after the cancel: a
    # cancelled ``gather`` does not end cancelled but done with a ``CancelledError`` as
    # its exception, so ``task.result()`` would raise it (a traceback per disconnect).
    if task in done:
        return task.result()
    raise ClientDisconnected()


class NoResponse(Response):
    """The client is gone: send nothing (the middleware records it as 499)."""

    def __init__(self) -> None:
        super().__init__(status_code=499)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None


def sse_event(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class EventStreamResponse(Response):
    """``text/event-stream`` from an async iterator of events, stopped by a disconnect.

    ``timeline.first_token()`` is marked once the first event has been handed to
    ``send``. ``on_disconnect`` runs when the client goes away mid-stream.
    """

    def __init__(
        self,
        events: AsyncIterator[bytes],
        timeline: RequestTimeline,
        on_disconnect: Callable[[], None],
    ) -> None:
        # Not ``Response.__init__``: it would declare a Content-Length for an empty body.
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self._events = events
        self._timeline = timeline
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.ensure_future(self._write(send))
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({writer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if not writer.done():  # the client went away first
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            self._on_disconnect()
            return
        if not writer.result():
            self._on_disconnect()

    async def _write(self, send: Send) -> bool:
        """Send every event; False if the connection broke under ``send``."""
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for event in self._events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
                self._timeline.first_token()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return False
        return True
