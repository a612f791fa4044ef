"""``gpuscope.connections`` on its own: a real asyncio server on 127.0.0.1 whose
protocol is a few lines (a line ``busy`` starts a request, ``done`` finishes it), so
that each rule of the guard is seen without a web framework in between."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest

from gpuscope import connections
from gpuscope.connections import ConnectionGuard, ConnectionLimits, GuardedProtocol

REFUSAL = b"refused\n"


class LineProtocol(asyncio.Protocol):
    """``busy`` marks the connection busy (a request in flight), ``done`` ends it."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self.connection: GuardedProtocol | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        for line in data.split():
            if line == b"busy":
                self.connection = self.guard.request_started(self)
            elif line == b"done" and self.connection is not None:
                self.guard.request_finished(self.connection)
                self.connection = None
            self.transport.write(line + b"\n")


@asynccontextmanager
async def guarded_server(limits: ConnectionLimits) -> AsyncIterator[tuple[ConnectionGuard, int]]:
    guard = ConnectionGuard(limits, refusal=REFUSAL)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        guard.protocol_factory(lambda: LineProtocol(guard)), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield guard, port
    finally:
        server.close()
        guard.close_idle()
        await server.wait_closed()


async def say(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, line: bytes) -> None:
    writer.write(line + b"\n")
    assert await asyncio.wait_for(reader.readline(), 5) == line + b"\n"


async def closed(reader: asyncio.StreamReader, within_s: float) -> bytes:
    """What the server sent before it closed the connection (within ``within_s``)."""
    return await asyncio.wait_for(reader.read(), within_s)


async def hang_up(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        writer.close()
        with contextlib.suppress(ConnectionError):  # the server closed it first
            await writer.wait_closed()


async def until(condition: object, within_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_an_idle_connection_is_closed_after_the_idle_timeout_and_counted() -> None:
    async with guarded_server(ConnectionLimits(idle_timeout=0.2)) as (guard, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed(reader, 3) == b""  # never sent a byte
        assert guard.closed_by_reason["idle_timeout"] == 1
        assert len(guard) == 0
        await hang_up(writer)


async def test_after_a_request_the_connection_is_idle_again_with_its_timeout() -> None:
    async with guarded_server(ConnectionLimits(idle_timeout=0.2)) as (guard, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await say(writer, reader, b"busy")
        await say(writer, reader, b"done")
        assert await closed(reader, 3) == b""
        assert guard.closed_by_reason == {
            "idle_timeout": 1,
            "header_timeout": 0,
            "shed_at_cap": 0,
            "refused_at_cap": 0,
            "shutdown": 0,
        }
        await hang_up(writer)


async def test_a_request_head_that_never_completes_gets_the_header_timeout() -> None:
    limits = ConnectionLimits(header_timeout=0.2, idle_timeout=30)
    async with guarded_server(limits) as (guard, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hel")  # the first bytes of a head, never finished
        assert await closed(reader, 3) == b"hel\n"  # echoed, then cut
        assert guard.closed_by_reason["header_timeout"] == 1
        assert guard.closed_by_reason["idle_timeout"] == 0
        await hang_up(writer)


async def test_a_busy_connection_has_no_deadline_and_wait_until_idle_waits_for_it() -> None:
    async with guarded_server(ConnectionLimits(idle_timeout=0.1)) as (guard, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await say(writer, reader, b"busy")
        assert guard.busy == 1
        assert not await guard.wait_until_idle(0.3)  # past the idle timeout: still open
        assert len(guard) == 1
        await say(writer, reader, b"done")
        assert await guard.wait_until_idle(1)
        assert await closed(reader, 3) == b""  # idle again, so its timeout applies
        await hang_up(writer)


async def test_at_the_cap_the_oldest_idle_connection_makes_room() -> None:
    async with guarded_server(ConnectionLimits(max_connections=2)) as (guard, port):
        oldest = await asyncio.open_connection("127.0.0.1", port)
        busy = await asyncio.open_connection("127.0.0.1", port)
        await say(busy[1], busy[0], b"busy")
        await say(oldest[1], oldest[0], b"hello")
        newest = await asyncio.open_connection("127.0.0.1", port)
        await say(newest[1], newest[0], b"hello")
        assert await closed(oldest[0], 3) == b""
        assert guard.closed_by_reason["shed_at_cap"] == 1
        await say(busy[1], busy[0], b"still")  # the busy one was kept
        for _, writer in (oldest, busy, newest):
            await hang_up(writer)


async def test_when_every_connection_is_busy_a_new_one_is_refused() -> None:
    async with guarded_server(ConnectionLimits(max_connections=1)) as (guard, port):
        busy = await asyncio.open_connection("127.0.0.1", port)
        await say(busy[1], busy[0], b"busy")
        refused, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed(refused, 3) == REFUSAL
        assert guard.closed_by_reason["refused_at_cap"] == 1
        await say(busy[1], busy[0], b"still")
        await hang_up(writer, busy[1])


async def test_close_idle_closes_all_but_the_busy_ones() -> None:
    async with guarded_server(ConnectionLimits()) as (guard, port):
        idle = await asyncio.open_connection("127.0.0.1", port)
        busy = await asyncio.open_connection("127.0.0.1", port)
        await say(idle[1], idle[0], b"hello")
        await say(busy[1], busy[0], b"busy")
        guard.close_idle()
        assert await closed(idle[0], 3) == b""
        assert guard.closed_by_reason["shutdown"] == 1
        await say(busy[1], busy[0], b"still")
        await until(lambda: len(guard) == 1)
        for _, writer in (idle, busy):
            await hang_up(writer)


@contextmanager
def soft_descriptor_limit(soft: int) -> Iterator[None]:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_the_cap_and_backlog_fit_under_the_descriptor_limit() -> None:
    with soft_descriptor_limit(1024):
        assert connections.listen_backlog() == connections.LISTEN_BACKLOG
        # 64 own + 4 batches x 32 x 2 listeners = 320 reserved: 512 fits under 1,024
        assert connections.fit_to_descriptors(512, 32, 2) == 512
        assert connections.fit_to_descriptors(800, 32, 2) == 1024 - 320
    with soft_descriptor_limit(256):
        backlog = connections.listen_backlog()
        assert backlog == (256 - connections.OWN_FDS) // 16 == 12
        assert connections.fit_to_descriptors(512, backlog, 1) == 256 - 64 - 4 * 12


def test_a_guard_under_a_small_limit_lowers_its_cap_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with soft_descriptor_limit(256):
        guard = ConnectionGuard(ConnectionLimits(max_connections=512))
        guard.listening_on(2)
    assert guard.max_connections == 256 - 64 - 4 * 12 * 2
    assert "--max-connections 512 does not fit the file descriptor limit 256" in caplog.text
