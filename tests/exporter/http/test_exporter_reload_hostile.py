"""Web-config reloads against files caught half-written or hostile, over real sockets.

Before: a file truncated in place (``cat new > web.yml``) or cut after
``basic_auth_users:`` was loaded as "no users" and ``/metrics`` answered 200 without
credentials; deep nesting raised ``RecursionError`` and killed the watcher, so a later
revocation was never applied; a FIFO in the file's place blocked the reload forever
and SIGTERM no longer stopped the exporter. Now each keeps the old users (401 without
credentials, 200 with them), is counted as refused, and the watcher still applies the
revocation that follows."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpuscope.exporter.http import reload
from gpuscope.exporter.http.security import MAX_FILE_BYTES
from gpuscope.exporter.service import RunningExporter, start_exporter
from support.exporter_fixtures import loopback_config
from support.raw_http import get_request, raw_exchange
from support.web_config import basic, metrics_status, until_reloaded, users

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

ALICE = users(alice="a-pass")
TLS_ONLY = "tls_server_config:\n"  # what is left of a file cut before its users


def write(text: str | bytes) -> Callable[[Path], None]:
    def replace(path: Path) -> None:
        data = text.encode() if isinstance(text, str) else text
        path.write_bytes(data)

    return replace


def swap(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def replace(path: Path) -> None:
        path.unlink()
        make(path)

    return replace


HOSTILE: dict[str, Callable[[Path], None]] = {
    "truncated": write(""),
    "cut_after_the_key": write("basic_auth_users:\n"),
    "cut_before_the_key": write(TLS_ONLY),
    "empty_users": write("basic_auth_users: {}\n"),
    "deep_nesting": write("basic_auth_users: " + "[" * 20_000),
    "binary": write(b"\xff\xfe\x00\x01" * 64),
    "huge": write("# " + "x" * MAX_FILE_BYTES + "\n" + ALICE),
    "directory": swap(Path.mkdir),
    "fifo": swap(os.mkfifo),
    "dev_zero": swap(lambda path: path.symlink_to("/dev/zero")),
}


@pytest.fixture
def fast_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reload, "CHECK_INTERVAL_S", 0.05)
    monkeypatch.setattr(reload, "SETTLE_S", 0.05)


@pytest.fixture
async def guarded(tmp_path: Path, fast_checks: None) -> AsyncIterator[RunningExporter]:
    path = tmp_path / "web.yml"
    path.write_text(ALICE)
    exporter = await start_exporter(loopback_config(web_config_file=path))
    try:
        yield exporter
    finally:
        await exporter.stop()


def web_config_of(exporter: RunningExporter) -> Path:
    path = exporter.credentials.state.config.web_config_file
    assert path is not None
    return path


def put_back(path: Path, text: str) -> None:
    """A regular file at ``path`` again, whatever is there now, swapped in atomically."""
    staged = path.with_name("staged.yml")
    staged.write_text(text)
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    os.replace(staged, path)


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_half_written_or_hostile_file_keeps_the_users_and_the_watcher(
    guarded: RunningExporter, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = web_config_of(guarded)
    with caplog.at_level(logging.INFO, logger="gpuscope.exporter.http.reload"):
        await asyncio.to_thread(HOSTILE[case], path)
        await asyncio.wait_for(until_reloaded(guarded, 1, applied=False), 10)
    assert await metrics_status(guarded, {}) == 401
    assert await metrics_status(guarded, basic("alice", "a-pass")) == 200
    assert guarded.credentials.state.metrics.web_config_reloads["refused"] == 1
    lines = [r.getMessage() for r in caplog.records if r.name == reload.__name__]
    assert len(lines) == 1 and "keeping the previous configuration" in lines[0], lines
    # the watcher lives on: a revocation written next is applied
    await asyncio.to_thread(put_back, path, users(bob="b-pass"))
    await asyncio.wait_for(until_reloaded(guarded, 1), 10)
    assert await metrics_status(guarded, basic("alice", "a-pass")) == 401
    assert await metrics_status(guarded, basic("bob", "b-pass")) == 200


async def test_sighup_survives_every_exception(guarded: RunningExporter) -> None:
    """The SIGHUP task calls ``reload`` in a loop: it must return, never raise."""
    path = web_config_of(guarded)
    guarded.watching.cancel()  # SIGHUP alone reads the file here
    for case, make in HOSTILE.items():
        await asyncio.to_thread(make, path)
        assert not await asyncio.wait_for(guarded.credentials.reload("SIGHUP"), 10), case
        await asyncio.to_thread(put_back, path, ALICE)
    assert await metrics_status(guarded, basic("alice", "a-pass")) == 200
    assert guarded.credentials.refusals == len(HOSTILE)


async def test_the_watcher_logs_a_problem_once_and_counts_each_refusal(
    guarded: RunningExporter, caplog: pytest.LogCaptureFixture
) -> None:
    path = web_config_of(guarded)
    with caplog.at_level(logging.INFO, logger=reload.__name__):
        for count in (1, 2, 3):  # the same bad file, written again each time
            await asyncio.to_thread(path.write_text, "basic_auth_users:\n")
            await asyncio.wait_for(until_reloaded(guarded, count, applied=False), 10)
    lines = [r.getMessage() for r in caplog.records if r.name == reload.__name__]
    assert len(lines) == 1 and "basic auth would be turned off" in lines[0], lines
    scrape = await scrape_text(guarded)
    assert 'gpuscope_web_config_reloads_total{result="refused"} 3.0' in scrape
    assert 'gpuscope_web_config_reloads_total{result="applied"} 0.0' in scrape


async def scrape_text(exporter: RunningExporter) -> str:
    answer = await raw_exchange(
        exporter.host, exporter.port, get_request("/metrics", basic("alice", "a-pass"))
    )
    return answer.decode()


async def test_a_file_written_in_place_slowly_is_read_once_settled(
    guarded: RunningExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Truncated, then written a line every 0.05 s: with a 0.3 s settle time the watcher
    (checking every 0.05 s) reads only the finished file, once."""
    monkeypatch.setattr(reload, "SETTLE_S", 0.3)
    path = web_config_of(guarded)
    final = users(bob="b-pass", carol="c-pass")
    with path.open("w") as file:
        for line in final.splitlines(keepends=True):
            file.write(line)
            file.flush()
            await asyncio.sleep(0.05)
    await asyncio.wait_for(until_reloaded(guarded, 1), 10)
    await asyncio.sleep(0.5)  # timed: ten more checks, in which nothing more may be read
    assert (guarded.credentials.reloads, guarded.credentials.refusals) == (1, 0)
    assert await metrics_status(guarded, basic("carol", "c-pass")) == 200


async def start_process(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscope", "exporter", "--listen", "127.0.0.1:0",
        "--gpu-source", "none", *args,
        stderr=asyncio.subprocess.PIPE,
        cwd="/",  # away from the repository's own folders
    )  # fmt: skip


async def test_sigterm_exits_promptly_with_a_fifo_in_the_files_place(tmp_path: Path) -> None:
    """Before, the SIGHUP reload waited forever in ``open()`` of the FIFO, and so did
    the exit after SIGTERM."""
    path = tmp_path / "web.yml"
    path.write_text(ALICE)
    process = await start_process("--web-config-file", str(path))
    assert process.stderr is not None
    try:
        log = ""
        while "serving on" not in log:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "exporter exited before serving"
            log += line
        path.unlink()
        os.mkfifo(path)
        process.send_signal(signal.SIGHUP)
        while "SIGHUP: not applied" not in log:
            line = (await asyncio.wait_for(process.stderr.readline(), 10)).decode()
            assert line, "exporter exited"
            log += line
        assert re.search(r"SIGHUP: not applied.*not a regular file \(a FIFO\)", log), log
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize("case", ["deep_nesting", "fifo", "huge"])
async def test_a_bad_file_at_start_stops_the_exporter_with_one_line(
    tmp_path: Path, case: str
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(ALICE)
    HOSTILE[case](path)
    process = await start_process("--web-config-file", str(path))
    assert process.stderr is not None
    code = await asyncio.wait_for(process.wait(), 30)
    errors = (await process.stderr.read()).decode()
    assert code == 2 and "--web-config-file" in errors, errors
    assert "Traceback" not in errors and len(errors.strip().splitlines()) == 1, errors
