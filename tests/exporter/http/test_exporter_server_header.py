"""The exporter names itself without versions: the probes answer without credentials,
and aiohttp's default ``Server: Python/3.x aiohttp/3.x`` would tell anyone which
known bugs apply."""

from __future__ import annotations

import pytest

from gpuscope.contract.http import TRACES_PATH
from gpuscope.exporter.service import RunningExporter
from support.raw_http import get_request, post_request, raw_exchange


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", TRACES_PATH, "/nothing-here"])
async def test_no_answer_names_the_python_or_aiohttp_version(
    running_exporter: RunningExporter, path: str
) -> None:
    request = post_request(path, b"{}") if path == TRACES_PATH else get_request(path)
    answer = await raw_exchange(running_exporter.host, running_exporter.port, request)
    head = answer.partition(b"\r\n\r\n")[0].decode().lower()
    servers = [line for line in head.splitlines() if line.startswith("server:")]
    assert servers == ["server: gpuscope"], head
