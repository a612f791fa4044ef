"""The web config and bearer token files read again while serving, over real sockets:
when a file changes and on SIGHUP, a revoked user or rotated token takes effect at once,
a file that does not load leaves the previous configuration in place with one log line,
and SIGHUP never stops the exporter (before, it killed it without a word)."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gpuscope.exporter.http import reload
from gpuscope.exporter.service import RunningExporter, start_exporter
from support.exporter_fixtures import SpanFactory, encode, loopback_config, make_self_signed
from support.raw_http import get_request, raw_exchange, status_of
from support.web_config import basic, metrics_status, until_reloaded, users

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

BODY = encode([SpanFactory().server(0.01)]).SerializeToString()


@pytest.fixture
async def web_config(tmp_path: Path) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(users(alice="a-pass"))
    return path


@pytest.fixture
def fast_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher checks the files every 50 ms instead of every second (each test that
    waits for it waited a second for nothing); only for the tests that wait on the
    watcher: the others reload by hand, which a watcher this fast would race."""
    monkeypatch.setattr(reload, "CHECK_INTERVAL_S", 0.05)


@pytest.fixture
async def guarded(web_config: Path) -> AsyncIterator[RunningExporter]:
    exporter = await start_exporter(loopback_config(web_config_file=web_config))
    try:
        yield exporter
    finally:
        await exporter.stop()


@pytest.mark.usefixtures("fast_checks")
async def test_a_revoked_user_is_refused_as_soon_as_the_file_changes(
    guarded: RunningExporter, web_config: Path
) -> None:
    assert await metrics_status(guarded, basic("alice", "a-pass")) == 200  # now cached
    await asyncio.to_thread(web_config.write_text, users(bob="b-pass"))
    await until_reloaded(guarded, 1)
    assert await metrics_status(guarded, basic("alice", "a-pass")) == 401
    assert await metrics_status(guarded, basic("bob", "b-pass")) == 200


@pytest.mark.usefixtures("fast_checks")
@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("basic_auth_users:\n  alice: '$2y$10$short'\n", "basic_auth_users.alice"),
        ("basic_auth_users: [\n", "cannot read"),
        ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n", "tls_server_config"),
    ],
)
async def test_a_file_that_does_not_load_keeps_the_previous_config_with_one_line(
    guarded: RunningExporter,
    web_config: Path,
    caplog: pytest.LogCaptureFixture,
    text: str,
    named: str,
) -> None:
    with caplog.at_level(logging.INFO, logger="gpuscope.exporter.http.reload"):
        await asyncio.to_thread(web_config.write_text, text)
        await until_reloaded(guarded, 1, applied=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuscope.exporter.http.reload"]
    assert len(lines) == 1 and "keeping the previous configuration" in lines[0], lines
    assert named in lines[0] and "\n" not in lines[0]
    assert await metrics_status(guarded, basic("alice", "a-pass")) == 200


@pytest.mark.usefixtures("fast_checks")
async def test_a_rotated_bearer_token_replaces_the_old_one(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    exporter = await start_exporter(loopback_config(bearer_token_file=token))
    try:
        async with aiohttp.ClientSession() as session:

            async def post(bearer: str) -> int:
                headers = {"Content-Type": "application/x-protobuf", "Authorization": bearer}
                async with session.post(
                    exporter.url + "/v1/traces", data=BODY, headers=headers
                ) as response:
                    return response.status

            assert await post("Bearer first") == 200
            token.write_text("second\n")
            await until_reloaded(exporter, 1)
            assert await post("Bearer first") == 401
            assert await post("Bearer second") == 200
    finally:
        await exporter.stop()


async def test_a_renewed_certificate_serves_the_next_connections(
    tmp_path: Path, self_signed: tuple[Path, Path], other_self_signed: tuple[Path, Path]
) -> None:
    cert, key = self_signed
    web_config = tmp_path / "web.yml"
    await asyncio.to_thread(
        web_config.write_text, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
    )
    exporter = await start_exporter(loopback_config(web_config_file=web_config))
    try:
        new_cert, new_key = other_self_signed
        trust_new = ssl.create_default_context(cafile=str(new_cert))
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(exporter.url + "/healthz", ssl=trust_new)
            shutil.copy(new_key, key)
            shutil.copy(new_cert, cert)
            assert await exporter.credentials.reload("renewed")
            async with session.get(exporter.url + "/healthz", ssl=trust_new) as response:
                assert response.status == 200
            # and TLS cannot be switched off under a running listener
            await asyncio.to_thread(web_config.write_text, users(alice="a-pass"))
            assert not await exporter.credentials.reload("changed")
    finally:
        await exporter.stop()


@pytest.fixture
async def other_self_signed(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "other"
    folder.mkdir()
    return await make_self_signed(folder)


async def line_about(stream: asyncio.StreamReader, prefix: str) -> str:
    """The next log line whose message starts with ``prefix``."""
    while True:
        line = (await asyncio.wait_for(stream.readline(), 30)).decode()
        assert line, "the exporter's log ended"
        if f": {prefix}" in line:
            return line


async def test_sighup_reads_the_files_again_and_never_stops_the_exporter(
    web_config: Path,
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscope", "exporter", "--listen", "127.0.0.1:0",
        "--gpu-source", "none", "--web-config-file", str(web_config),
        stderr=asyncio.subprocess.PIPE,
        cwd="/",  # away from the repository's own folders
    )  # fmt: skip
    assert process.stderr is not None
    try:
        log = ""
        while (found := re.search(r"serving on http://([\d.]+):(\d+)", log)) is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "exporter exited before serving"
            log += line
        host, port = found.group(1), int(found.group(2))

        async def status(user: str, password: str) -> int:
            request = get_request("/metrics", basic(user, password))
            return status_of(await raw_exchange(host, port, request))

        # an upload whose body is still coming when the signal arrives
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + basic("alice", "a-pass")["Authorization"].join((b"Authorization: ", b"\r\n"))
            + f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n".encode()
            + BODY[:10]
        )
        await writer.drain()
        await asyncio.to_thread(web_config.write_text, users(bob="b-pass"))
        process.send_signal(signal.SIGHUP)
        line = await line_about(process.stderr, "SIGHUP: ")  # the watcher may log first
        assert "SIGHUP: read" in line and "1 basic auth users" in line, line
        writer.write(BODY[10:])
        assert status_of(await asyncio.wait_for(reader.read(), 30)) == 200
        writer.close()
        assert await status("bob", "b-pass") == 200 and await status("alice", "a-pass") == 401
        await asyncio.to_thread(web_config.write_text, "basic_auth_users: 7\n")
        process.send_signal(signal.SIGHUP)
        line = await line_about(process.stderr, "SIGHUP: ")
        assert "keeping the previous configuration" in line, line
        assert await status("bob", "b-pass") == 200
        assert process.returncode is None
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert "Traceback" not in (await process.stderr.read()).decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
