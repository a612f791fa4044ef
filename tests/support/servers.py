"""Real servers on 127.0.0.1 port 0 for tests: uvicorn in a background thread, or an
aiohttp app on the test's own event loop."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn
from aiohttp import web


@contextmanager
def run_uvicorn(app: Any, **config: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields ``http://127.0.0.1:PORT``.

    The socket is bound here (port 0) and handed to uvicorn, so the port is known
    before the server starts and no other process can take it in between.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # asyncio's loop unless a test asks for another: uvicorn's "auto" would take uvloop
    # where it is installed (a dev dependency, for the test that runs on it)
    options: dict[str, Any] = {"log_level": "warning", "lifespan": "auto", "loop": "asyncio"}
    options |= config
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = 200
        while not server.started and thread.is_alive() and deadline:
            threading.Event().wait(0.025)
            deadline -= 1
        if not server.started:
            raise RuntimeError("uvicorn did not start within 5 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@asynccontextmanager
async def serve_aiohttp(app: web.Application, **runner_options: Any) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port until the block ends; yields its base URL."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serve_exposition(text: str) -> AsyncIterator[str]:
    """``text`` on ``/metrics`` of a loopback server, as an exporter serves its
    exposition; yields ``host:port``, a Prometheus scrape target."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serve_aiohttp(app) as url:
        yield url.removeprefix("http://")


def accept_queue(port: int) -> int | None:
    """The connections queued on the listening TCP socket of loopback ``port``: the
    handshakes the kernel completed that the server has not ``accept()``-ed yet (the rx
    queue ``/proc/net/tcp`` gives a LISTEN socket); None where the kernel does not say.
    Past a full queue (the ``listen()`` backlog) the kernel drops each new SYN and the
    client sends it again a second later: a test that opens many connections can wait
    for room here instead."""
    try:
        with open("/proc/net/tcp", encoding="ascii") as table:
            lines = table.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
            return int(queues.split(":")[1], 16)
    return None


def accept_queue_has_room(port: int, backlog: int = 8) -> bool:
    """Whether the listener on ``port`` takes one more handshake without a SYN dropped:
    fewer queued than ``backlog`` (by default 8, the least backlog gpuscope listens
    with: ``gpuscope.connections.listen_backlog``); or the kernel does not say (then the
    client's own retries wait)."""
    queued = accept_queue(port)
    return queued is None or queued < backlog
