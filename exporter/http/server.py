"""Listening: the exporter's app behind the connection guard, on TCP or TLS, and the
order in which it stops.

aiohttp's ``AppRunner.server`` is the protocol factory of the app (aiohttp's low-level
``web.Server``, documented as one for ``loop.create_server``); ``listen`` gives it to
``loop.create_server`` through ``ConnectionGuard.protocol_factory``, so that every
connection is on the guard's books from its ``accept()`` (its TLS handshake included),
without aiohttp's sites and their private members.

``Listener.stop``: ``/readyz`` turns 503 and the listener closes; connections without
a request in flight are closed; requests in flight (bodies still uploading included)
get up to ``--shutdown-timeout-s`` seconds, and a body not all in by then is answered
503; it goes on as soon as nothing is in flight, so an idle exporter stops at once.
Then the app's cleanup runs (the composition root's parts stop there).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from aiohttp import web

from gpuscope.connections import LINGER_S
from gpuscope.exporter.state import STATE

# After the shutdown timeout: how long the 503s to late uploads may take to go out.
LAST_ANSWERS_S = 1.0


@dataclass
class Listener:
    """The app's runner and the asyncio server accepting its connections."""

    app: web.Application
    runner: web.AppRunner
    server: asyncio.Server

    @property
    def address(self) -> tuple[str, int]:
        """The first bound address (host as bound, real port)."""
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def stop(self) -> None:
        """Stop in the documented order; returns as soon as nothing is in flight."""
        state = self.app[STATE]
        state.stopping = state.guard.stopping = True
        self.server.close()  # stop listening; open connections stay
        state.guard.close_idle()
        if not await state.guard.wait_until_idle(state.config.shutdown_timeout_s):
            state.drain_expired.set()  # late uploads are answered 503
            await state.guard.wait_until_idle(LAST_ANSWERS_S)
        await self.runner.cleanup()


async def listen(app: web.Application, tls: ssl.SSLContext | None) -> Listener:
    """Serve ``app`` on its config's ``--listen`` address; returns once it accepts."""
    state = app[STATE]
    config = state.config
    runner = web.AppRunner(
        app,
        auto_decompress=False,  # the handler inflates gzip itself, with a limit
        # ``Listener.stop`` has drained by the time aiohttp's own shutdown runs
        shutdown_timeout=LAST_ANSWERS_S,
        # a backstop only: the guard's idle and header timeouts close connections first
        keepalive_timeout=config.idle_timeout_s + config.header_timeout_s,
        lingering_time=LINGER_S,
        access_log=None,
    )
    await runner.setup()
    try:
        handlers = runner.server
        assert handlers is not None  # set by setup()
        host, port = config.listen_address()
        guard = state.guard
        guard.tls = tls
        server = await asyncio.get_running_loop().create_server(
            guard.protocol_factory(handlers), host, port, backlog=guard.backlog
        )
        # Nothing is accepted before this coroutine yields to the event loop.
        guard.listening_on(len(server.sockets))
    except BaseException:
        await runner.cleanup()
        raise
    return Listener(app, runner, server)
